"""The ``opensandbox`` sandbox backend for lfx (entry point ``lfx.sandbox_backends``).

``LANGFLOW_SANDBOX_BACKEND=opensandbox`` runs the Python Interpreter component's code in a
fresh sandbox of a self-hosted OpenSandbox server per execution. Glue only, as
:mod:`langflow_sandbox_createos.backend`: every decision (isolation declared only under the
operator's ``OPEN_SANDBOX_ATTEST_ISOLATION``, the egress read-back, the host-network canary,
the isolation probe, timeouts, caps, deletion) is made in Rust.
"""

from __future__ import annotations

import atexit

from lfx.utils.sandbox.base import Capabilities, SandboxResult, _sandbox_settings  # pyright: ignore[reportPrivateUsage]

from . import _native, metrics
from .backend import output_text
from .exceptions import SandboxRefusedError

__all__ = ["OpenSandboxBackend", "create_backend"]


class OpenSandboxBackend:
    """Runs each ``run()`` in a fresh OpenSandbox sandbox that is deleted afterwards.

    Thread-safe (the GIL is released while a run blocks) and safe across ``fork()``.
    """

    name = "opensandbox"

    def __init__(self) -> None:
        self._native = _native.NativeOpenSandboxBackend()
        metrics.install()
        atexit.register(self.shutdown)

    def capabilities(self) -> Capabilities:
        """What lfx's policy gate may rely on: ``hardware-virtualized`` when the operator attests
        it (then lfx's dispatcher accepts it). No I/O.

        Unattested, the backend is a container, which lfx's dispatcher refuses with a message
        that names no setting; it raises
        :class:`~langflow_sandbox_createos.exceptions.SandboxRefusedError` (an lfx
        ``SandboxUnavailableError``: nothing ran) naming ``OPEN_SANDBOX_ATTEST_ISOLATION``
        instead. lfx asks for the capabilities only to decide, right before a run."""
        refusal = _native.opensandbox_isolation_refusal()
        if refusal is not None:
            raise SandboxRefusedError(refusal)
        caps = _native.opensandbox_capabilities()
        return Capabilities(
            isolation=caps.isolation,
            supports_deny_all_egress=caps.supports_deny_all_egress,
            supports_domain_allowlist=caps.supports_domain_allowlist,
            max_timeout_seconds=caps.max_timeout_seconds,
        )

    def run(self, code: str, *, env: dict[str, str] | None = None) -> SandboxResult:
        """Run ``code`` with ``python3`` in a fresh sandbox under lfx's sandbox settings.

        Raises :class:`~langflow_sandbox_createos.exceptions.SandboxRefusedError` (an lfx
        ``SandboxUnavailableError``: nothing ran) or
        :class:`~langflow_sandbox_createos.exceptions.SandboxFailedError`.
        """
        with metrics.run_scope("backend") as span:
            out = self._native.run(code, env, _sandbox_settings())
            span.set_attribute("createos.guest", out.guest)
            span.set_attribute("createos.outcome", out.outcome)
        return SandboxResult(
            stdout=output_text(out.stdout),
            stderr=output_text(out.stderr),
            exit_code=out.exit_code,
            execution_time_ms=out.execution_time_ms,
        )

    def shutdown(self) -> None:
        """Delete the sandboxes of runs still in flight and forget the backend. Idempotent."""
        self._native.shutdown()

    def reset_after_fork(self) -> None:
        """Forget the parent's runtime and connections; the child builds its own."""
        self._native.reset_after_fork()

    def __repr__(self) -> str:
        return f"<OpenSandboxBackend {self._native!r}>"


def create_backend() -> OpenSandboxBackend:
    """Entry-point factory: builds the backend without any I/O or thread."""
    return OpenSandboxBackend()
