"""Run Langflow work in disposable CreateOS Firecracker microVMs.

This package is the glue between lfx and the native extension ``_native``: it builds lfx's
own types from what the extension returns. Importing it is cheap on purpose (Langflow imports
plugins while building its settings): it imports neither the extension nor lfx beyond one small
module, starts no thread and does no I/O. The names below are resolved on first access.

Importing it puts this package's setting names (``CREATEOS_*``, ``OPEN_SANDBOX_*``) on lfx's
deny-list for the env-var fallback of this process (:mod:`.env_fallback`), so that whichever
way lfx or Langflow imports it (an executor entry point, the component bundle, the sandbox
backend), no flow field resolves them from this process's environment.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import env_fallback as _env_fallback

if TYPE_CHECKING:
    from .backend import CreateOSBackend, create_backend
    from .exceptions import (
        CreateOSError,
        CreateOSExecutionError,
        CreateOSUnavailableError,
        SandboxError,
        SandboxFailedError,
        SandboxRefusedError,
    )

    __version__: str

__all__ = [
    "CreateOSBackend",
    "CreateOSError",
    "CreateOSExecutionError",
    "CreateOSUnavailableError",
    "SandboxError",
    "SandboxFailedError",
    "SandboxRefusedError",
    "__version__",
    "create_backend",
]

_EXCEPTIONS = tuple(name for name in __all__ if name.endswith("Error"))


def __getattr__(name: str) -> Any:
    if name in ("CreateOSBackend", "create_backend"):
        from . import backend

        return getattr(backend, name)
    if name in _EXCEPTIONS:
        from . import exceptions

        return getattr(exceptions, name)
    if name == "__version__":
        from ._native import __version__

        return __version__
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)


# Before anything else of the package runs: see the module docstring.
_env_fallback.install()
