"""Glue between the CreateOS Sandbox component and the native extension.

The component class (``components/createos/createos_sandbox.py``) is loaded by lfx from the
source embedded in each flow, so it may be evaluated many times per process; what must exist
once per process lives here: the native handle (which holds nothing until the first run) and
its ``atexit`` shutdown. Nothing here decides anything: :func:`run` hands the node's inputs to
Rust, which refuses, runs, reuses or destroys guests and shapes the outputs.
"""

from __future__ import annotations

import atexit
import sys
from typing import Any, cast

from . import _native, metrics

__all__ = ["DESCRIPTION", "describe", "run", "status_text"]

#: The node's static description on the canvas: what it does, never a policy.
DESCRIPTION: str = _native.COMPONENT_DESCRIPTION

_NATIVE = _native.NativeComponent()
# Before the shutdown below (exit handlers run last-registered first): the guests it destroys
# still reach the metrics and usage records.
metrics.install()
# lfx run / lfx serve never shut plugins down: destroy this process's fresh guests at exit.
# Reused guests are kept for the next process (that is what reuse means).
atexit.register(_NATIVE.shutdown)


def describe(
    allow_network: bool, session_mode: str, accept_egress_exceptions: bool = False, provider: str = "createos"
) -> str:
    """The policy a run with these inputs gets on ``provider``: where it runs (a CreateOS
    microVM, or a sandbox on the OpenSandbox server and its isolation), effective network policy
    and reuse mode.

    Flows saved before the node had Accept Link-Local Egress embed a source that calls this
    with two arguments; flows saved before it passed the Provider, with three (CreateOS).
    """
    return _native.describe_component(allow_network, session_mode, accept_egress_exceptions, provider)


def status_text(
    results: dict[str, Any],
    *,
    allow_network: bool,
    session_mode: str,
    accept_egress_exceptions: bool,
    provider: str | None = None,
) -> str:
    """The node's status after a run: its guest, exit code and time, then the policy it got.

    The provider is the run's own (its Results' ``provider``) unless given: a flow saved before
    the node passed it still gets the right one.
    """
    guest = str(results.get("sandbox_name") or "?")
    kept = "kept for the next run" if results.get("kept_guest") else "destroyed"
    timings = results.get("timings")
    total = cast("dict[str, Any]", timings).get("total_ms") if isinstance(timings, dict) else None
    took = f" in {total} ms" if isinstance(total, int) else ""
    head = f"Ran in guest {guest} ({kept}), exit code {results.get('exit_code')}{took}."
    ran_on = provider or str(results.get("provider") or "createos")
    return f"{head}\n{describe(allow_network, session_mode, accept_egress_exceptions, ran_on)}"


def run(**inputs: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run one execution of the node; returns the Results dict and the Files rows.

    ``inputs`` are :meth:`~langflow_sandbox_createos._native.NativeComponent.run`'s keyword
    arguments, gathered by the component. Raises
    :class:`~langflow_sandbox_createos.exceptions.SandboxRefusedError` (nothing ran) or
    :class:`~langflow_sandbox_createos.exceptions.SandboxFailedError`. A program that
    fails is a result (``exit_code`` and ``error``), not an exception.
    """
    with metrics.run_scope("component") as span:
        # The command line, where Rust finds the exported flow `lfx run` was given when the
        # graph carries no flow id (lfx keeps only the file's graph, not its id).
        out = _NATIVE.run(invocation=list(getattr(sys, "argv", None) or ()), **inputs)
        results = dict(out.results)
        span.set_attribute("createos.guest", str(results.get("sandbox_name") or ""))
        span.set_attribute("createos.outcome", out.outcome)
    return results, [dict(row) for row in out.files]
