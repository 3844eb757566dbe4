"""Admission across all three surfaces in one process, through their real Python entry points.

A Langflow server hosts the sandbox backend, CreateOS Sandbox nodes and the whole-flow executor
in one process, and ``CREATEOS_MAX_LIVE_GUESTS`` is a promise about that process: however the
runs arrive, the account never sees more guests live at once than the cap. The Rust suites prove
the cap for the backend, its warm pool and the component; this proves it with the executor
included, each surface entered the way lfx enters it (the ``lfx.sandbox_backends`` factory, the
node's output method, ``Graph.arun`` with ``LANGFLOW_EXECUTOR_KIND=createos``). The fake's own
peak of live guests is the judge, not our counters.
"""

from __future__ import annotations

import json

from conftest import E2E, Fake, backend_env, run_python

SHOUT = E2E / "flows" / "shout_flow.json"

CAP = 2

ALL_SURFACES = """
import asyncio, json, sys, threading
from importlib.metadata import entry_points
from lfx.graph import Graph
from langflow_sandbox_createos.components.createos.createos_sandbox import CreateOSSandboxComponent

NAP = "import time\\ntime.sleep(0.5)\\nprint('napped')"
(factory,) = [ep for ep in entry_points(group="lfx.sandbox_backends") if ep.name == "createos"]
backend = factory.load()()
results = {}

def run_backend(i):
    try:
        r = backend.run(NAP)
        results[f"backend {i}"] = r.stdout.strip()
    except Exception as e:
        results[f"backend {i}"] = f"{type(e).__name__}: {e}"

def run_component(i):
    try:
        node = CreateOSSandboxComponent(_id=f"CreateOSSandbox-cap{i}")
        node.set(python_code=NAP, timeout_seconds=120)
        data = node.run_sandbox()
        results[f"component {i}"] = str(data.data.get("result", data.data)).strip()
    except Exception as e:
        results[f"component {i}"] = f"{type(e).__name__}: {e}"

async def run_executor(i):
    try:
        graph = Graph.from_payload(json.load(open(SHOUT)))
        outputs = await graph.arun([{"input_value": f"flow {i}"}])
        results[f"executor {i}"] = [r.results["message"].text for run in outputs for r in run.outputs]
    except Exception as e:
        results[f"executor {i}"] = f"{type(e).__name__}: {e}"

async def main():
    threads = [threading.Thread(target=f, args=(i,)) for i in range(3) for f in (run_backend, run_component)]
    for t in threads:
        t.start()
    await asyncio.gather(*(run_executor(i) for i in range(2)))
    for t in threads:
        await asyncio.to_thread(t.join)
    backend.shutdown()
    print("RESULT " + json.dumps(results, sort_keys=True))

asyncio.run(main())
"""


def test_the_cap_holds_across_backend_component_and_executor(clean_fake: Fake) -> None:
    env = backend_env(
        clean_fake,
        LANGFLOW_EXECUTOR_KIND="createos",
        CREATEOS_MAX_LIVE_GUESTS=str(CAP),
        # Eight runs through two slots: a generous wait, within every run's own budget.
        CREATEOS_ADMISSION_WAIT_SECONDS="100",
        LANGFLOW_SANDBOX_TIMEOUT_SECONDS="120",
        CREATEOS_EXECUTOR_TIMEOUT_SECONDS="180",
    )
    proc = run_python(ALL_SURFACES.replace("open(SHOUT)", f"open({str(SHOUT)!r})"), env, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    results = json.loads(lines[-1].removeprefix("RESULT "))
    # Every run was served (waiting for a slot, never refused), each with its own answer.
    assert results == {
        **{f"backend {i}": "napped" for i in range(3)},
        **{f"component {i}": "napped" for i in range(3)},
        **{f"executor {i}": [f"FLOW {i}!"] for i in range(2)},
    }, proc.stderr[-3000:]
    stats = clean_fake.wait_for(lambda s: s["live"] == 0, timeout=30)
    assert stats["created"] == 8, stats
    assert stats["peak_live"] <= CAP, f"the account saw {stats['peak_live']} guests live at once under a cap of {CAP}"
    # The runs did contend: more than one guest was live at some point.
    assert stats["peak_live"] == CAP, stats
