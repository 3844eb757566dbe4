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
from typing import Any

from . import _native, metrics

__all__ = ["describe", "run"]

_NATIVE = _native.NativeComponent()
# Before the shutdown below (exit handlers run last-registered first): the guests it destroys
# still reach the metrics and usage records.
metrics.install()
# lfx run / lfx serve never shut plugins down: destroy this process's fresh guests at exit.
# Reused guests are kept for the next process (that is what reuse means).
atexit.register(_NATIVE.shutdown)


def describe(allow_network: bool, session_mode: str) -> str:
    """The node's description for these inputs: effective network policy and reuse mode."""
    return _native.describe_component(allow_network, session_mode)


def run(**inputs: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run one execution of the node; returns the Results dict and the Files rows.

    ``inputs`` are :meth:`~langflow_sandbox_createos._native.NativeComponent.run`'s keyword
    arguments, gathered by the component. Raises
    :class:`~langflow_sandbox_createos.exceptions.CreateOSUnavailableError` (nothing ran) or
    :class:`~langflow_sandbox_createos.exceptions.CreateOSExecutionError`. A program that
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
