"""The ``createos`` sandbox backend for lfx (entry point ``lfx.sandbox_backends``).

Glue only: lfx's settings are read with lfx's own reader, handed to the native extension,
and its answers come back as lfx's own ``Capabilities`` / ``SandboxResult``. Failures are
raised by the extension as the classes of :mod:`langflow_sandbox_createos.exceptions`, which
are lfx's ``SandboxUnavailableError`` / ``SandboxExecutionError``. Every decision (refusals,
shape, egress, guest lifecycle, timeouts) is made in Rust.
"""

from __future__ import annotations

import atexit

# lfx's own reader of its sandbox settings, the one its built-in backend uses.
from lfx.utils.sandbox.base import Capabilities, SandboxResult, _sandbox_settings  # pyright: ignore[reportPrivateUsage]

from . import _native, lfx_settings, metrics

__all__ = ["CreateOSBackend", "create_backend", "output_text"]


def output_text(output: _native.Output) -> str:
    """Join one stream of a run's output into a ``str``.

    The pieces come from Rust one at a time, each releasing its memory as it is taken, and
    ``+=`` on a local ``str`` that nothing else references grows it in place in CPython (the
    optimisation PEP 8 mentions). So the capped stream is held about once while it is joined,
    where ``"".join`` would hold every piece and the result together.
    """
    text = ""
    for piece in output:
        text += piece
    return text


class CreateOSBackend:
    """Runs each ``run()`` in a fresh CreateOS microVM that is destroyed afterwards.

    Thread-safe: lfx calls ``run()`` from worker threads, possibly concurrently, and the
    call blocks with the GIL released. Safe across ``fork()``: a child process builds its own
    runtime and connections on first use.
    """

    name = "createos"

    def __init__(self) -> None:
        self._native = _native.NativeBackend()
        # Before the shutdown below: exit handlers run last-registered first, so the guests
        # the shutdown destroys still reach the metrics and usage records.
        metrics.install()
        # lfx run / lfx serve never call shutdown(); Langflow does on a graceful exit.
        atexit.register(self.shutdown)

    def capabilities(self) -> Capabilities:
        """What lfx's policy gate may rely on. No I/O."""
        caps = _native.capabilities()
        return Capabilities(
            isolation=caps.isolation,
            supports_deny_all_egress=caps.supports_deny_all_egress,
            supports_domain_allowlist=caps.supports_domain_allowlist,
            max_timeout_seconds=caps.max_timeout_seconds,
        )

    def run(self, code: str, *, env: dict[str, str] | None = None) -> SandboxResult:
        """Run ``code`` with ``python3`` in a fresh guest under lfx's sandbox settings.

        Raises :class:`~langflow_sandbox_createos.exceptions.SandboxRefusedError` (an lfx
        ``SandboxUnavailableError``: nothing ran) or
        :class:`~langflow_sandbox_createos.exceptions.SandboxFailedError` (an lfx
        ``SandboxExecutionError``). A program that fails is a result, not an error.
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
        """Destroy every guest this process still has. Idempotent."""
        self._native.shutdown()

    def reset_after_fork(self) -> None:
        """Forget the parent's runtime and connections; the child builds its own."""
        self._native.reset_after_fork()

    def __repr__(self) -> str:
        return f"<CreateOSBackend {self._native!r}>"


def create_backend() -> CreateOSBackend:
    """Entry-point factory: builds the backend without any I/O or thread."""
    return CreateOSBackend()


# lfx imports this module while it builds its settings (its backend validator loads the
# plugins): a LANGFLOW_SANDBOX_* value lfx is about to refuse is named here, once, with lfx's
# own reason, where `lfx run` would otherwise say only "Settings service not found".
lfx_settings.warn_once_about_sandbox_settings()
