"""The errors this package raises, as subclasses of lfx's sandbox errors.

lfx and Langflow catch ``SandboxExecutionError`` (an infrastructure failure) and
``SandboxUnavailableError`` (a configured sandbox that cannot be used: the caller must fail
closed, never fall back to running the code in-process). Every error raised here is one of
those, so callers keep catching lfx's classes; catch these to tell CreateOS apart:

- :class:`CreateOSError`: the base of both, itself an lfx ``SandboxExecutionError``.
- :class:`CreateOSUnavailableError`: nothing ran. A missing or rejected API key, a setting or
  policy that cannot be honoured (for example ``LANGFLOW_SANDBOX_ALLOWED_DOMAINS``), a pinned
  shape that does not fit. Also an lfx ``SandboxUnavailableError``.
- :class:`CreateOSExecutionError`: the infrastructure failed (the control plane refused or
  stopped answering after retries, the outcome of a dispatched program is unknown) or an
  internal error occurred. Not an lfx ``SandboxUnavailableError``.

Where they come from: ``CreateOSBackend.run`` (the lfx entry point) raises either;
``_native.reap`` raises :class:`CreateOSUnavailableError` for a missing, malformed or rejected
key or endpoint and :class:`CreateOSExecutionError` when the listing fails;
``_native.doctor`` reports every problem as a line of its report and raises only
:class:`CreateOSExecutionError`, for an internal failure. A guest program that exits non-zero,
times out or is killed is not an error: it is a result with its exit code.

Messages name the setting involved and the fix, and never contain the API key. Importing this
module imports lfx (its base classes live there); importing ``langflow_sandbox_createos``
alone does not, and resolves these names from there only on first access.
"""

from __future__ import annotations

from lfx.utils.sandbox.base import SandboxExecutionError, SandboxUnavailableError

__all__ = ["CreateOSError", "CreateOSExecutionError", "CreateOSUnavailableError"]


class CreateOSError(SandboxExecutionError):
    """Base of every error of the CreateOS sandbox; an lfx ``SandboxExecutionError``."""


class CreateOSUnavailableError(CreateOSError, SandboxUnavailableError):
    """The sandbox is configured but cannot be used, or the policy cannot be honoured.

    Nothing ran and no guest exists. An lfx ``SandboxUnavailableError``: fail closed.
    """


class CreateOSExecutionError(CreateOSError):
    """The infrastructure failed during the call, or the outcome is unknown.

    The message says whether the code may have run. An lfx ``SandboxExecutionError`` but not a
    ``SandboxUnavailableError``.
    """
