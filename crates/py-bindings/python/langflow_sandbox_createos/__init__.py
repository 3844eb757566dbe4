"""Run Langflow work in disposable CreateOS Firecracker microVMs.

This package is the glue between lfx and the native extension ``_native``: it builds lfx's
own types from what the extension returns. Importing it is cheap on purpose (Langflow imports
plugins while building its settings): it imports neither lfx nor the extension, starts no
thread and does no I/O. The names below are resolved on first access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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

_EXCEPTIONS = (
    "CreateOSError",
    "CreateOSExecutionError",
    "CreateOSUnavailableError",
    "SandboxError",
    "SandboxFailedError",
    "SandboxRefusedError",
)


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
