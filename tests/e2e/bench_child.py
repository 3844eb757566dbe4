"""One side of ``bench_vs_plugin.py``, run in the venv of the implementation it measures (not a test).

    python bench_child.py executor RUNS     # RUNS cold flow runs through the createos executor
    python bench_child.py backend RUNS      # RUNS sequential backend runs of print(1)

Whatever ``langflow_sandbox_createos`` the venv has (this project's wheel, or the Python plugin
0.2.0) is driven the way lfx drives it, against the fake control plane named by
``CREATEOS_SANDBOX_BASE_URL`` (the caller starts it). Prints one JSON object on its last line.
Standard library and lfx only: the plugin's venv has nothing else of this project's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

FLOW = Path(__file__).resolve().parent / "flows" / "slow_flow.json"
TIMINGS = re.compile(r"(\w+_ms)=(\d+)")


class _Timings(logging.Handler):
    """Collects the phase timings this project's executor logs when a run ends."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.runs: list[dict[str, int]] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text.startswith("flow run finished"):
            self.runs.append({k: int(v) for k, v in TIMINGS.findall(text)})


def _fit_plugin_to_the_fake() -> None:
    """The plugin 0.2.0's runner opens its spec by its guest path (``/workspace/run/...``)
    inside the program's text, which the fake cannot map (it maps paths in requests, and runs
    guest programs in the guest's directory): the runner opens it relative to that directory
    instead. Nothing else of the plugin changes; this project's runner needs no such change."""
    import langflow_sandbox_createos.executor as plugin

    runner = getattr(plugin, "_GUEST_RUNNER", None)
    if isinstance(runner, str):
        plugin._GUEST_RUNNER = runner.replace('open("SPEC_PATH")', 'open("SPEC_PATH".replace("/workspace/", "", 1))')  # type: ignore[attr-defined]


async def _one_executor_run() -> dict[str, float]:
    from lfx.execution.types import RunComplete, Unit
    from lfx.graph import Graph

    from langflow_sandbox_createos.executor import CreateOSExecutor

    graph = Graph.from_payload(json.loads(FLOW.read_text()))
    unit = Unit(graph=graph, inputs=[{"input_value": "bench"}], runtime_options={"_use_arun_legacy": True})
    t0 = time.perf_counter()
    first = None
    async for item in CreateOSExecutor().execute(unit):
        if first is None:
            first = time.perf_counter() - t0
        if isinstance(item, RunComplete):
            break
    total = time.perf_counter() - t0
    assert first is not None
    return {"first": first, "total": total}


def executor(runs: int) -> dict[str, Any]:
    """``runs`` cold runs in one process: the first pays the process's own start-up."""
    _fit_plugin_to_the_fake()
    handler = _Timings()
    logger = logging.getLogger("langflow_sandbox_createos")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    rows = [asyncio.run(_one_executor_run()) for _ in range(runs)]
    for row, timings in zip(rows, handler.runs, strict=False):
        row["timings"] = timings
    return {"runs": rows}


def backend(runs: int) -> dict[str, Any]:
    """Sequential ``run("print(1)")`` through the backend lfx builds from the entry point: the
    median latency and the host CPU per run (this process, every thread)."""
    from importlib.metadata import entry_points

    factory = next(ep for ep in entry_points(group="lfx.sandbox_backends") if ep.name == "createos").load()
    be = factory()
    out = be.run("print(1)")  # the process's first run: connections, caches
    assert out.stdout.strip() == "1", out
    lat = []
    cpu0 = time.process_time()
    for _ in range(runs):
        t = time.perf_counter()
        out = be.run("print(1)")
        lat.append(time.perf_counter() - t)
        assert out.stdout.strip() == "1", out
    cpu = time.process_time() - cpu0
    be.shutdown()
    return {"median_ms": statistics.median(lat) * 1000, "cpu_ms_per_run": cpu * 1000 / runs}


def main() -> int:
    what, runs = sys.argv[1], int(sys.argv[2])
    result = executor(runs) if what == "executor" else backend(runs)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
