"""The errors this package raises, as subclasses of lfx's sandbox errors.

lfx and Langflow catch ``SandboxExecutionError`` (an infrastructure failure) and
``SandboxUnavailableError`` (a configured sandbox that cannot be used: the caller must fail
closed, never fall back to running the code in-process). Every error raised here is one of
those, so callers keep catching lfx's classes; catch these to tell this package's errors apart.
The names are the same whichever provider ran the work (CreateOS or OpenSandbox); the message
names the provider:

- :class:`SandboxError`: the base of both, itself an lfx ``SandboxExecutionError``.
- :class:`SandboxRefusedError`: nothing ran. A missing or rejected API key, a setting or
  policy that cannot be honoured (for example ``LANGFLOW_SANDBOX_ALLOWED_DOMAINS``), a pinned
  shape that does not fit, an image the server cannot pull. Also an lfx
  ``SandboxUnavailableError``.
- :class:`SandboxFailedError`: the infrastructure failed (the control plane or server refused
  or stopped answering after retries, the outcome of a dispatched program is unknown) or an
  internal error occurred. Not an lfx ``SandboxUnavailableError``.

The names of release 0.2.0 stay, as the same class objects: :class:`CreateOSError` is
:class:`SandboxError`, :class:`CreateOSUnavailableError` is :class:`SandboxRefusedError` and
:class:`CreateOSExecutionError` is :class:`SandboxFailedError`, so code that catches them keeps
working (a raised error's ``type(exc).__name__`` is the new name).

Where they come from: ``CreateOSBackend.run`` (the lfx entry point) raises either;
``_native.reap`` raises :class:`SandboxRefusedError` for a missing, malformed or rejected
key or endpoint and :class:`SandboxFailedError` when the listing fails;
``_native.doctor`` reports every problem as a line of its report and raises only
:class:`SandboxFailedError`, for an internal failure. A guest program that exits non-zero,
times out or is killed is not an error: it is a result with its exit code.

Messages name the setting involved and the fix, and never contain the API key. Importing this
module imports lfx (its base classes live there); importing ``langflow_sandbox_createos``
alone does not, and resolves these names from there only on first access.
"""

from __future__ import annotations

from lfx.utils.sandbox.base import SandboxExecutionError, SandboxUnavailableError

__all__ = [
    "CreateOSError",
    "CreateOSExecutionError",
    "CreateOSUnavailableError",
    "SandboxError",
    "SandboxFailedError",
    "SandboxRefusedError",
]


class SandboxError(SandboxExecutionError):
    """Base of every error of this package, on any provider; an lfx ``SandboxExecutionError``."""


class SandboxRefusedError(SandboxError, SandboxUnavailableError):
    """The sandbox is configured but cannot be used, or the policy cannot be honoured.

    Nothing ran and no guest exists. An lfx ``SandboxUnavailableError``: fail closed.
    """


class SandboxFailedError(SandboxError):
    """The infrastructure failed during the call, or the outcome is unknown.

    The message says whether the code may have run. An lfx ``SandboxExecutionError`` but not a
    ``SandboxUnavailableError``.
    """


#: The 0.2.0 name of :class:`SandboxError` (the same class).
CreateOSError = SandboxError
#: The 0.2.0 name of :class:`SandboxRefusedError` (the same class).
CreateOSUnavailableError = SandboxRefusedError
#: The 0.2.0 name of :class:`SandboxFailedError` (the same class).
CreateOSExecutionError = SandboxFailedError
