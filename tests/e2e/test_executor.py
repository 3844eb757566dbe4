"""The whole-flow executor (``LANGFLOW_EXECUTOR_KIND=createos``) with real lfx and the fake.

The flow (Chat Input -> Shout -> Chat Output, ``flows/shout_flow.json``) runs once in-process
and once through the executor, where the fake's guest ``python3`` is this venv's (lfx and the
wheel installed); each caller must get the same result both ways, and the fake's counters
prove the flow went through a guest that was destroyed afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import E2E, Fake, backend_env, http_json, lfx_serve, run_python, venv_bin

SHOUT = E2E / "flows" / "shout_flow.json"
SLOW = E2E / "flows" / "slow_flow.json"
SERVE_KEY = "e2e-executor-serve-key"


def executor_env(fake: Fake, **overrides: str | None) -> dict[str, str]:
    """The environment an operator sets for the executor (and nothing of the backend's)."""
    settings: dict[str, str | None] = {
        "LANGFLOW_SANDBOX_BACKEND": None,
        "LANGFLOW_SANDBOX_BACKEND_PLUGINS": None,
        "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS": None,
        "LANGFLOW_EXECUTOR_KIND": "createos",
    }
    settings.update(overrides)
    return backend_env(fake, **settings)


def in_process_env(fake: Fake) -> dict[str, str]:
    return executor_env(fake, LANGFLOW_EXECUTOR_KIND=None)


ARUN = """
import asyncio, json, sys
from lfx.graph import Graph

async def main():
    graph = Graph.from_payload(json.load(open(sys.argv[1])))
    outputs = await graph.arun([{"input_value": sys.argv[2]}])
    rows = []
    for run in outputs:
        for result in run.outputs:
            message = result.results["message"]
            rows.append({"type": type(message).__name__, "text": message.text,
                         "component_id": result.component_id})
    print("RESULT " + json.dumps({"runs": len(outputs), "inputs": outputs[0].inputs, "rows": rows}))

asyncio.run(main())
"""


def arun(env: dict[str, str], flow: Path, text: str) -> dict[str, Any]:
    proc = subprocess.run(
        [venv_bin("python"), "-c", ARUN, str(flow), text],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        cwd=E2E,
        check=False,
    )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line.removeprefix("RESULT "))
    pytest.fail(f"no result (rc={proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-3000:]}")


def lfx_run_json(env: dict[str, str], flow: Path, text: str) -> dict[str, Any]:
    proc = subprocess.run(
        [venv_bin("lfx"), "run", str(flow), text],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        cwd=E2E,
        check=False,
    )
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.strip().startswith("{"):
            return json.loads(line)
    pytest.fail(f"no JSON from lfx run (rc={proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-3000:]}")


def test_graph_arun_gives_the_in_process_result(clean_fake: Fake) -> None:
    local = arun(in_process_env(clean_fake), SHOUT, "hello there")
    assert clean_fake.stats()["created"] == 0
    remote = arun(executor_env(clean_fake), SHOUT, "hello there")
    assert remote == local
    assert remote["rows"] == [{"type": "Message", "text": "HELLO THERE!", "component_id": "chat_out"}]
    assert remote["inputs"] == {"input_value": "hello there"}
    stats = clean_fake.wait_settled()
    assert stats["created"] == 1
    assert stats["requests"]["exec_stream"] == 1


HOST_BUILT = """
import asyncio, json, logging, sys
from lfx.graph import Graph
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(message)s")

async def main():
    instantiate = sys.argv[2] == "instantiated"
    texts = []
    # Twice when instantiated (the warning is said once per process), once otherwise.
    for _ in range(2 if instantiate else 1):
        graph = Graph.from_payload(json.load(open(sys.argv[1])), instantiate_components=instantiate)
        outputs = await graph.arun([{"input_value": "hi"}])
        texts += [r.results["message"].text for run in outputs for r in run.outputs]
    print("RESULT " + json.dumps(texts))

asyncio.run(main())
"""


def test_a_graph_built_on_the_host_is_said_once_and_one_built_without_instances_is_not(clean_fake: Fake) -> None:
    """Issue 46: the executor tells the truth about what ran on the host before the hand-over:
    one WARNING per process when the graph's components were instantiated there (module-level
    code, class body, __init__), none for a graph built with instantiate_components=False, which
    runs all the same."""
    seen: dict[str, tuple[list[str], str]] = {}
    for how in ("instantiated", "not"):
        proc = subprocess.run(
            [venv_bin("python"), "-c", HOST_BUILT, str(SHOUT), how],
            capture_output=True,
            text=True,
            env=executor_env(clean_fake),
            timeout=180,
            cwd=E2E,
            check=False,
        )
        lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        assert lines, (proc.returncode, proc.stderr[-3000:])
        seen[how] = (json.loads(lines[-1].removeprefix("RESULT ")), proc.stderr)
    assert seen["instantiated"][0] == ["HI!", "HI!"] and seen["not"][0] == ["HI!"], seen
    warnings = [line for line in seen["instantiated"][1].splitlines() if "before handing the flow to the executor" in line]
    assert len(warnings) == 1 and warnings[0].startswith("WARNING executor: this process built 3 of the flow's 3"), seen["instantiated"][1][-3000:]
    assert "before handing the flow" not in seen["not"][1], seen["not"][1][-3000:]
    assert clean_fake.wait_settled()["created"] == 3


def test_a_domains_run_gives_the_same_result_and_is_refused_without_a_gateway(clean_fake: Fake) -> None:
    # The runner takes the proxy variables from the job before the flow; the flow itself is
    # unchanged (the fake does not enforce egress: the enforced proof is the gateway crate's).
    domains = {
        "CREATEOS_EXECUTOR_ALLOWED_DOMAINS": "pypi.org",
        "CREATEOS_EXECUTOR_ACCEPT_EGRESS_EXCEPTIONS": "true",
    }
    gateway = {"CREATEOS_GATEWAY_URL": "http://10.0.0.5:3128", "CREATEOS_GATEWAY_SECRET": "e2e-gateway-secret-0123456789abcdef0123"}
    remote = arun(executor_env(clean_fake, **domains, **gateway), SHOUT, "hello there")
    assert remote["rows"] == [{"type": "Message", "text": "HELLO THERE!", "component_id": "chat_out"}]
    assert clean_fake.wait_settled()["created"] == 1
    with pytest.raises(pytest.fail.Exception, match="CREATEOS_GATEWAY_URL"):
        arun(executor_env(clean_fake, **domains), SHOUT, "hello there")
    assert clean_fake.wait_settled()["created"] == 1


POOLED_ARUN = """
import asyncio, json, sys, time
from lfx.graph import Graph
from langflow_sandbox_createos import _native

async def one(text):
    graph = Graph.from_payload(json.load(open(sys.argv[1])))
    outputs = await graph.arun([{"input_value": text}])
    return [r.results["message"].text for run in outputs for r in run.outputs]

async def main():
    texts = [await one("first")]
    deadline = time.monotonic() + 240
    while _native.NativeExecutor().pool_stats()["ready"] < 1 and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    texts.append(await one("second"))
    print("RESULT " + json.dumps({"texts": texts, "pool": _native.NativeExecutor().pool_stats()}))

asyncio.run(main())
"""


def test_a_warm_pool_runs_the_next_flow_in_a_preloaded_guest_with_the_same_result(clean_fake: Fake) -> None:
    # One process (as a server is): the first run warms the pool, the second takes its guest,
    # whose runner imported lfx before the run; the answers are the in-process ones.
    proc = run_python(
        POOLED_ARUN.replace("sys.argv[1]", repr(str(SHOUT))),
        executor_env(clean_fake, CREATEOS_EXECUTOR_WARM_POOL="1"),
        timeout=300,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["texts"] == [["FIRST!"], ["SECOND!"]]
    pool = result["pool"]
    assert (pool["hits"], pool["misses"]) == (1, 1), pool
    stats = clean_fake.wait_settled()
    # Runs: one cold guest, one pooled guest; the refill after the warm run was destroyed at
    # exit with the rest of the pool.
    assert stats["live"] == 0, stats
    assert stats["requests"]["process_create"] >= 2, stats
    assert stats["requests"]["exec_stream"] >= 3, stats


def test_lfx_run_prints_the_in_process_result(clean_fake: Fake) -> None:
    local = lfx_run_json(in_process_env(clean_fake), SHOUT, "from the cli")
    remote = lfx_run_json(executor_env(clean_fake), SHOUT, "from the cli")
    assert local["result"] == "FROM THE CLI!"
    for key in ("result", "type", "component", "component_id", "success"):
        assert remote[key] == local[key], (key, remote, local)
    stats = clean_fake.wait_settled()
    assert stats["created"] == 1


BIG = E2E / "flows" / "big_flow.json"
#: The answer of the large-answer tests: its Chat Output's vertex frame is 20 MB, past the host's
#: 16 MiB frame line, so the runner sends it in pieces.
BIG_ANSWER = 5_000_000


def test_lfx_run_of_a_5_mb_answer_prints_the_in_process_text(clean_fake: Fake) -> None:
    local = lfx_run_json(in_process_env(clean_fake), BIG, str(BIG_ANSWER))
    assert local["result"] == "x" * BIG_ANSWER, {k: v for k, v in local.items() if k != "result"}
    remote = lfx_run_json(executor_env(clean_fake), BIG, str(BIG_ANSWER))
    assert remote.get("success") is True, {k: v for k, v in remote.items() if k != "result"}
    for key in ("result", "type", "component", "component_id", "success"):
        assert remote[key] == local[key], key
    stats = clean_fake.wait_settled()
    assert stats["created"] == 1 and stats["live"] == 0, stats


def test_graph_arun_of_a_5_mb_answer_gives_the_in_process_result(clean_fake: Fake) -> None:
    # The legacy path: the outputs come in the terminal frame too (20 MB of it, in pieces).
    local = arun(in_process_env(clean_fake), BIG, str(BIG_ANSWER))
    remote = arun(executor_env(clean_fake), BIG, str(BIG_ANSWER))
    assert remote == local
    assert [(row["type"], len(row["text"])) for row in remote["rows"]] == [("Message", BIG_ANSWER)]
    stats = clean_fake.wait_settled()
    assert stats["created"] == 1 and stats["live"] == 0, stats


def test_an_answer_over_the_result_bound_is_refused_naming_the_setting(clean_fake: Fake) -> None:
    env = executor_env(clean_fake, CREATEOS_EXECUTOR_MAX_RESULT_BYTES="4194304")
    proc = subprocess.run(
        [venv_bin("lfx"), "run", str(BIG), str(BIG_ANSWER)],
        capture_output=True, text=True, env=env, timeout=180, cwd=E2E, check=False,
    )
    out = proc.stdout + proc.stderr
    assert "KeyError" not in out, out[-3000:]
    reply = json.loads(next(line for line in reversed(proc.stdout.splitlines()) if line.strip().startswith("{")))
    assert reply["success"] is False, reply
    text = json.dumps(reply)
    for part in ("SandboxFailedError", "CREATEOS_EXECUTOR_MAX_RESULT_BYTES=4194304",
                 "Raise CREATEOS_EXECUTOR_MAX_RESULT_BYTES", "guest destroyed"):
        assert part in text, (part, reply)
    stats = clean_fake.wait_settled()
    assert stats["created"] == 1 and stats["live"] == 0, stats


def _http(method: str, url: str, body: dict[str, Any] | None = None) -> Any:
    return http_json(method, url, body, api_key=SERVE_KEY)


@pytest.fixture
def served(clean_fake: Fake, tmp_path: Path) -> Iterator[str]:
    env = executor_env(clean_fake, LANGFLOW_API_KEY=SERVE_KEY)
    with lfx_serve(SHOUT, env, tmp_path / "serve.log") as base:
        yield base


def test_lfx_serve_answers_with_the_flow_result(served: str, clean_fake: Fake) -> None:
    flows = _http("GET", f"{served}/flows")
    flow_id = flows[0]["id"]
    for text in ("first request", "second one"):
        reply = _http("POST", f"{served}/flows/{flow_id}/run", {"input_value": text})
        assert reply["success"] is True, reply
        assert reply["result"] == text.upper() + "!", reply
        assert reply["component"] == "Chat Output"
    stats = clean_fake.wait_settled()
    # One guest per request, each destroyed.
    assert stats["created"] == 2
    assert stats["live"] == 0


STOP_EARLY = """
import asyncio, gc, json, sys
from lfx.execution.types import Unit
from lfx.graph import Graph
from langflow_sandbox_createos.executor import CreateOSExecutor

async def main():
    graph = Graph.from_payload(json.load(open(sys.argv[1])))
    stream = CreateOSExecutor().execute(Unit(graph=graph, inputs=[{"input_value": "x"}]))
    first = await stream.__anext__()
    print("FIRST", type(first).__name__, first.payload.vertex.id, flush=True)
    if sys.argv[2] == "aclose":
        await stream.aclose()
    else:
        del stream
        gc.collect()
        await asyncio.sleep(0.5)
    print("STOPPED", flush=True)

asyncio.run(main())
"""


@pytest.mark.parametrize("how", ["aclose", "drop"])
def test_a_consumer_that_stops_after_the_first_event_leaves_no_guest(clean_fake: Fake, how: str) -> None:
    # The slow flow: its last vertex is still sleeping when the first event arrives.
    proc = run_python(STOP_EARLY.replace("sys.argv[1]", repr(str(SLOW))).replace("sys.argv[2]", repr(how)),
                      executor_env(clean_fake), timeout=120)
    assert "FIRST StepResult chat_in" in proc.stdout, proc.stderr[-3000:]
    assert "STOPPED" in proc.stdout, proc.stderr[-3000:]
    stats = clean_fake.wait_settled()
    assert stats["created"] == 1
    assert stats["live"] == 0
    if how == "aclose":
        # Destroyed before aclose() returned: the DELETE was accepted while the process ran.
        assert stats["requests"]["delete"] == 1


FAULTY_ARUN = """
import asyncio, json, sys
from lfx.graph import Graph
from lfx.utils.sandbox.base import SandboxExecutionError, SandboxUnavailableError

async def main():
    graph = Graph.from_payload(json.load(open(sys.argv[1])))
    try:
        await graph.arun([{"input_value": "x"}])
    except SandboxUnavailableError as exc:
        print("UNAVAILABLE " + type(exc).__name__ + " " + str(exc))
    except SandboxExecutionError as exc:
        print("EXECUTION " + type(exc).__name__ + " " + str(exc))
    else:
        print("RAN")

asyncio.run(main())
"""


@pytest.mark.parametrize(
    ("faults", "verdict", "words"),
    [
        ("whoami=401", "UNAVAILABLE", "CREATEOS_SANDBOX_API_KEY"),
        ("create=503", "EXECUTION", "not started"),
        ("create=500", "EXECUTION", "not started"),
        ("upload=500", "EXECUTION", "not started"),
        ("create=drop-egress;egress_get=503", "EXECUTION", "not started"),
        ("exec_stream=reset", "EXECUTION", "may have run"),
        ("exec_stream=500", "EXECUTION", "may have run"),
        ("create=429#1;upload=503#1;exec_stream=429#1", "RAN", ""),
    ],
)
def test_faults_at_each_call_destroy_the_guest_and_raise_lfx_errors(
    clean_fake: Fake, faults: str, verdict: str, words: str
) -> None:
    clean_fake.set_faults(faults)
    # A fault without a count is there for good: the run gives up after 3 s of retries instead
    # of the default 30. A counted one must be retried through, at the default budget.
    retry = None if "#" in faults else "3"
    env = executor_env(clean_fake, CREATEOS_CONTROL_PLANE_RETRY_SECONDS=retry)
    proc = run_python(FAULTY_ARUN.replace("sys.argv[1]", repr(str(SHOUT))), env, timeout=120)
    line = next((l for l in proc.stdout.splitlines() if l.split(" ")[0] in ("RAN", "UNAVAILABLE", "EXECUTION")), "")
    assert line.startswith(verdict), (line, proc.stderr[-3000:])
    if verdict == "UNAVAILABLE":
        assert "SandboxRefusedError" in line
    if verdict == "EXECUTION":
        assert "SandboxFailedError" in line
    assert words in line
    assert clean_fake.key not in proc.stdout + proc.stderr
    clean_fake.set_faults("")
    stats = clean_fake.wait_settled()
    assert stats["live"] == 0


def test_refusals_name_the_executor_settings_and_create_nothing(clean_fake: Fake) -> None:
    env = executor_env(clean_fake, CREATEOS_EXECUTOR_EGRESS="pypi.org")
    proc = run_python(FAULTY_ARUN.replace("sys.argv[1]", repr(str(SHOUT))), env, timeout=120)
    assert "UNAVAILABLE" in proc.stdout, proc.stderr[-3000:]
    assert "CREATEOS_EXECUTOR_EGRESS" in proc.stdout
    assert "LANGFLOW_SANDBOX" not in proc.stdout
    assert clean_fake.stats()["created"] == 0


def test_template_build_bakes_a_rootfs_that_runs_the_flow(clean_fake: Fake) -> None:
    env = executor_env(clean_fake)
    dry = subprocess.run(
        [venv_bin("python"), "-m", "langflow_sandbox_createos", "template", "build", str(SHOUT), "--dry-run"],
        capture_output=True, text=True, env=env, timeout=120, cwd=E2E, check=False,
    )
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert dry.stdout.startswith("# Built by"), dry.stdout
    assert "'lfx==1.13.0'" in dry.stdout
    build = subprocess.run(
        [venv_bin("python"), "-m", "langflow_sandbox_createos", "template", "build", str(SHOUT), "--name", "e2e-shout"],
        capture_output=True, text=True, env=env, timeout=120, cwd=E2E, check=False,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    assert "build: build complete" in build.stderr, build.stderr
    value = build.stdout.strip().splitlines()[-1]
    assert value.startswith("CREATEOS_EXECUTOR_ROOTFS=tpl_"), build.stdout
    rootfs = value.split("=", 1)[1]
    # The template's id is the guest's rootfs: the flow runs in it...
    remote = lfx_run_json(executor_env(clean_fake, CREATEOS_EXECUTOR_ROOTFS=rootfs), SHOUT, "baked")
    assert remote["result"] == "BAKED!", remote
    # ...and a rootfs that is not a ready template is refused by the control plane.
    bogus = lfx_run_json(executor_env(clean_fake, CREATEOS_EXECUTOR_ROOTFS="tpl_missing"), SHOUT, "baked")
    assert bogus["success"] is False, bogus
    assert "tpl_missing" in json.dumps(bogus)
    assert clean_fake.wait_settled()["created"] == 1


def test_sigterm_to_lfx_run_mid_flow_destroys_the_guest(clean_fake: Fake) -> None:
    """`docker stop` / Ctrl-C of `lfx run` while the flow runs in its guest: the guest goes too."""
    proc = subprocess.Popen(
        [venv_bin("lfx"), "run", str(SLOW), "stop me"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=executor_env(clean_fake),
        cwd=E2E,
    )
    try:
        clean_fake.wait_for(lambda s: s["live"] == 1 and s["requests"].get("exec_stream", 0) >= 1, timeout=120)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    # It dies of SIGTERM as it would have in-process, with no result printed.
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, stdout[-2000:], stderr[-3000:])
    assert '"success"' not in stdout
    # `destroyed` counts guests past `destroying`, a moment after the delete.
    stats = clean_fake.wait_for(lambda s: s["live"] == 0 and s["destroyed"] >= 1, timeout=15)
    assert stats["created"] == 1 and stats["destroyed"] == 1, stats


# --- Hostile frames: what flow code writes past the runner's caps -----------------------------

HOSTILE = E2E / "flows" / "hostile_flow.json"
BULK = E2E / "flows" / "bulk_flow.json"
#: The host's bound on one frame line (``MAX_FRAME_BYTES``).
FRAME_CAP = 16 * 1024 * 1024
#: The most the host process's peak RSS may grow in one run of a hostile flow, whatever its
#: guest writes, as a multiple of FRAME_CAP (docs/executor.md, "Bounds on what the guest sends", states it too).
RSS_MULTIPLE = 8

MEASURE = """
import asyncio, json, sys
from lfx.execution.types import Unit
from lfx.graph import Graph
from langflow_sandbox_createos.executor import CreateOSExecutor

def peak_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))

async def run(mode):
    graph = Graph.from_payload(json.load(open(FLOW)))
    kept = []  # every event held to the end, as `lfx run` holds them
    try:
        async for item in CreateOSExecutor().execute(Unit(graph=graph, inputs=[{"input_value": mode}])):
            kept.append(item)
    except Exception as exc:
        return {"error": type(exc).__name__, "message": str(exc), "events": len(kept)}
    vertices = [getattr(item.payload, "vertex", None) for item in kept if hasattr(item, "payload")]
    return {"events": len(kept), "names": [v.display_name for v in vertices if v is not None],
            "ids": [v.id for v in vertices if v is not None]}

async def main():
    await run("none")  # imports, the runtime and its connections are warm before measuring
    before = peak_kib()
    outcome = await run(MODE)
    outcome["growth_kib"] = peak_kib() - before
    print("RESULT " + json.dumps(outcome))

asyncio.run(main())
"""


def measure(fake: Fake, mode: str) -> dict[str, Any]:
    """One run of the hostile flow with ``mode``, after a warm-up run, in a fresh process."""
    script = MEASURE.replace("FLOW", repr(str(HOSTILE))).replace("MODE", repr(mode))
    proc = run_python(script, executor_env(fake), timeout=400)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    assert "\x1b" not in proc.stderr, proc.stderr[-3000:]
    return result


@pytest.mark.parametrize(
    ("mode", "bound"),
    [
        # The reproduction: 15 MB of `{},{},...` (5 million objects).
        ("values:5000000", "MAX_FRAME_VALUES"),
        # A line past the frame bound: refused before its end is buffered.
        ("string:17000000", "MAX_FRAME_BYTES"),
        # 20,000 records that share no column: a 400-million-cell table if it were rebuilt.
        ("diagonal:20000", "MAX_DATAFRAME_CELLS"),
        # A chunked frame claiming a terabyte: refused at its first piece, nothing buffered.
        ("claim:1000000000000", "CREATEOS_EXECUTOR_MAX_RESULT_BYTES=67108864"),
    ],
)
def test_a_hostile_frame_fails_the_run_and_the_host_stays_bounded(clean_fake: Fake, mode: str, bound: str) -> None:
    result = measure(clean_fake, mode)
    print(f"{mode}: host peak RSS grew by {result['growth_kib'] / 1024:.1f} MiB")
    assert result.get("error") == "SandboxFailedError", result
    assert bound in result["message"], result
    assert "guest destroyed" in result["message"], result
    assert result["growth_kib"] * 1024 <= RSS_MULTIPLE * FRAME_CAP, result
    stats = clean_fake.wait_settled()
    assert stats["live"] == 0, stats


@pytest.mark.parametrize(
    "mode",
    [
        # The most objects one frame may carry (249,992 `{}` and the frame's own 8 values).
        "values:249992",
        # The most tagged objects (35 values each as the host counts them), rebuilt as Messages.
        "tagged:7142",
        # The most chat messages of a result (3 values each), validated as pydantic models.
        "chat:83330",
        # The longest string one frame may carry, 4 bytes per character on the host (UCS-4).
        "string:16777000",
    ],
)
def test_the_worst_admitted_frame_arrives_and_the_host_stays_bounded(clean_fake: Fake, mode: str) -> None:
    result = measure(clean_fake, mode)
    assert "error" not in result, result
    assert "raw" in result["ids"], result
    print(f"{mode}: host peak RSS grew by {result['growth_kib'] / 1024:.1f} MiB")
    assert result["growth_kib"] * 1024 <= RSS_MULTIPLE * FRAME_CAP, result
    assert clean_fake.wait_settled()["live"] == 0


def test_vertex_names_from_the_guest_are_escaped(clean_fake: Fake) -> None:
    result = measure(clean_fake, "name")
    raw = result["names"][result["ids"].index("raw")]
    assert raw == "\\x1b]0;pwned\\x07\\x1b[2Jraw", result


# One line (it travels as the flow's chat input): every JSON type, escapes, raw UTF-8, the
# integer extremes serde reads exactly, and a duplicate key (the last wins, as in Python).
PARITY = (
    r'{"ints": [0, -1, 9223372036854775807, -9223372036854775808, 18446744073709551615],'
    r' "floats": [0.1, -0.0, 1e300, 2.5e-308, 1.0, 3.141592653589793],'
    r' "text": ["", "\u00e9\u4e2d\ud83d\ude00", "raw é 中 😀", "tab\t nl\n nul\u0000 esc\u001b", "\"q\" \\ /"],'
    r' "nested": [[], {}, [null, true, false], {"": "empty key", "k": {"k": {"k": []}}}],'
    r' "dup": {"a": 1, "a": 2}}'
)

ROUND_TRIP = """
import asyncio, json, sys
from lfx.execution.types import Unit
from lfx.graph import Graph
from langflow_sandbox_createos.executor import CreateOSExecutor

async def main():
    graph = Graph.from_payload(json.load(open(FLOW)))
    async for item in CreateOSExecutor().execute(Unit(graph=graph, inputs=[{"input_value": "parity:" + TEXT}])):
        payload = getattr(item, "payload", None)
        if getattr(getattr(payload, "vertex", None), "id", None) == "raw":
            built = payload.result_dict.results["r"]
            print("RESULT " + json.dumps({"same": repr(built) == repr(json.loads(TEXT)), "built": repr(built)}))

asyncio.run(main())
"""


def test_guest_json_is_built_on_the_host_as_json_loads_builds_it(clean_fake: Fake) -> None:
    script = ROUND_TRIP.replace("FLOW", repr(str(HOSTILE))).replace("TEXT", repr(PARITY))
    proc = run_python(script, executor_env(clean_fake), timeout=180)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["same"], result["built"]


FILES = """
import asyncio, json, sys
from lfx.execution.types import Unit
from lfx.graph import Graph
from langflow_sandbox_createos.executor import CreateOSExecutor

async def main():
    graph = Graph.from_payload(json.load(open(FLOW)))
    async for item in CreateOSExecutor().execute(Unit(graph=graph, inputs=[{"input_value": MODE}])):
        payload = getattr(item, "payload", None)
        if getattr(getattr(payload, "vertex", None), "id", None) == "raw":
            message = payload.result_dict.results["r"]
            print("RESULT " + json.dumps({"type": type(message).__name__, "files": message.files}))

asyncio.run(main())
"""


def test_a_guest_message_naming_a_host_path_opens_nothing_on_the_host(clean_fake: Fake, tmp_path: Path) -> None:
    # A FIFO: opening it (as validating a Message's files does, to tell images) would block.
    fifo = tmp_path / "no-writer"
    os.mkfifo(fifo)
    script = FILES.replace("FLOW", repr(str(HOSTILE))).replace("MODE", repr(f"files:{fifo}"))
    proc = run_python(script, executor_env(clean_fake), timeout=180)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    assert json.loads(lines[-1].removeprefix("RESULT ")) == {"type": "Message", "files": [str(fifo)]}
    assert clean_fake.wait_settled()["live"] == 0


LEGACY_EVENTS = """
import asyncio, json, sys
from lfx.execution.types import RunComplete, Unit
from lfx.graph import Graph
from langflow_sandbox_createos.executor import CreateOSExecutor

async def main():
    graph = Graph.from_payload(json.load(open(FLOW)))
    unit = Unit(graph=graph, inputs=[{"input_value": "bulk"}], runtime_options={"_use_arun_legacy": True})
    out = {}
    async for item in CreateOSExecutor().execute(unit):
        if isinstance(item, RunComplete):
            out["outputs"] = {r.component_id: r.results["message"].text for run in item.outputs for r in run.outputs}
            continue
        if item.payload.vertex.id == "bulk":
            outputs = item.payload.result_dict.outputs
            table, text = outputs["table"]["message"], outputs["long_text"]["message"]
            out["bulk"] = {"rows": len(table), "row_1234": table[1234], "text": text}
    print("RESULT " + json.dumps(out))

asyncio.run(main())
"""


def test_a_large_legitimate_payload_is_not_refused(clean_fake: Fake) -> None:
    # A vertex with 300 KB of text and a 3,000-row table (its frame is about 2 MB and 60,000
    # values: the text and the table each travel more than once), well inside the host's bounds.
    proc = run_python(LEGACY_EVENTS.replace("FLOW", repr(str(BULK))), executor_env(clean_fake), timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    out = json.loads(lines[-1].removeprefix("RESULT "))
    bulk = out["bulk"]
    assert bulk["rows"] == 3000, bulk["rows"]
    assert bulk["row_1234"] == {"row": 1234, "name": "item 1234", "score": 1234 / 7, "even": True,
                                "note": "The quick brown fox jumps over the lazy dog, and"[: 1234 % 40]}
    assert len(bulk["text"]) == 300 * 1024
    assert bulk["text"].startswith("bulk: The quick brown fox")
    assert out["outputs"]["text_out"] == bulk["text"]
    assert out["outputs"]["table_out"] == "3000 rows, the last: item 2999"
    assert clean_fake.wait_settled()["live"] == 0


# --- What the host resolves: variables, chat history and messages, uploaded files ------------

SECRET = E2E / "flows" / "secret_flow.json"
HISTORY = E2E / "flows" / "history_flow.json"
FILE = E2E / "flows" / "file_flow.json"
#: The credential the secret flow's variable resolves to (from the host's environment: bare lfx).
CREDENTIAL = "sk-e2e-credential-4b7d19c2e8"
FLOW_ID = "5b0a1a52-34c1-4f73-9a53-0c1c2e9f6a11"
USER_ID = "0f6f7f5e-1c2d-4a4b-8e9f-2b3c4d5e6f70"


def _result(proc: subprocess.CompletedProcess[str]) -> Any:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    return json.loads(lines[-1].removeprefix("RESULT "))


def test_a_credential_variable_reaches_the_guest_only_in_the_job(clean_fake: Fake) -> None:
    # Bare lfx resolves the variable from the host's environment; the guest's environment does
    # not have it (the fake's guests inherit the fake's, started without it).
    local = arun({**in_process_env(clean_fake), "EXEC_TEST_CREDENTIAL": CREDENTIAL}, SECRET, "probe")
    logged = "import logging, sys\nlogging.basicConfig(level=logging.DEBUG, stream=sys.stderr)\n" + ARUN
    script = logged.replace("sys.argv[1]", repr(str(SECRET))).replace("sys.argv[2]", repr("probe"))
    proc = run_python(script, {**executor_env(clean_fake), "EXEC_TEST_CREDENTIAL": CREDENTIAL}, timeout=180)
    remote = _result(proc)
    assert remote == local
    text = remote["rows"][0]["text"]
    assert text.startswith("probe: key sha256:") and text.endswith("(28 chars); no job file"), text
    # What the guest printed reached the host's log with the value masked; the value itself
    # appears nowhere in what the host process wrote.
    assert "guest: secret probe got the key [REDACTED]" in proc.stderr, proc.stderr[-3000:]
    assert CREDENTIAL not in proc.stdout + proc.stderr
    assert clean_fake.wait_settled()["created"] == 1


def test_a_variable_that_cannot_be_resolved_behaves_as_in_process(clean_fake: Fake) -> None:
    # Bare lfx: a variable that is neither in a database nor in the environment is None.
    local = arun(in_process_env(clean_fake), SECRET, "probe")
    remote = arun(executor_env(clean_fake), SECRET, "probe")
    assert local["rows"][0]["text"] == "probe: no key; no job file"
    assert remote == local


# The host's message store, as Langflow's database is inside a server (bare lfx has none):
# lfx.memory dispatches to it, and the glue finds a store to read history from and write to.
STORE = """
import asyncio, json, logging, sys, uuid
logging.basicConfig(level=logging.INFO, stream=sys.stderr)
import lfx.memory
import lfx.utils.langflow_utils
from lfx.graph import Graph
from lfx.schema.message import Message

class Store:
    def __init__(self):
        self.rows = []

    async def astore_message(self, message, flow_id=None, run_id=None, user_id=None):
        from lfx.memory.flow_context import get_current_flow_id, should_persist_messages
        if not should_persist_messages():
            return [message]
        row = Message.model_validate_json(message.model_dump_json())
        row.id, row.flow_id = str(uuid.uuid4()), str(flow_id)
        self.rows.append({"row": row, "owner": str(user_id), "scope": str(get_current_flow_id())})
        return [row]

    async def aupdate_messages(self, messages):
        return messages if isinstance(messages, list) else [messages]

    async def aget_messages(self, session_id=None, flow_id=None, user_id=None, order="DESC", limit=None, **_):
        rows = [r["row"] for r in self.rows if r["row"].session_id == session_id and r["owner"] == str(user_id)]
        rows.sort(key=lambda r: r.timestamp, reverse=order == "DESC")
        return rows[:limit] if limit else rows

store = Store()
lfx.memory._impl = lambda: store
lfx.utils.langflow_utils.has_langflow_db_backend = lambda: True

async def run(text, session):
    graph = Graph.from_payload(json.load(open(FLOW)), flow_id=FLOW_ID, user_id=USER_ID)
    outputs = await graph.arun([{"input_value": text}], session_id=session)
    return [r.results["message"].text for run in outputs for r in run.outputs]

async def main():
    for i in range(PRELOAD):
        store.rows.append({"owner": USER_ID, "scope": FLOW_ID, "row": Message(
            text=f"old {i}", sender="User", sender_name="User", session_id="s-big", flow_id=FLOW_ID,
            timestamp=f"2024-01-01 00:{i // 60:02d}:{i % 60:02d}.000000 UTC")})
    answers = [await run(text, SESSION) for text in TEXTS]
    stored = [{"sender": r["row"].sender, "sender_name": r["row"].sender_name, "session_id": r["row"].session_id,
               "text": r["row"].text, "owner": r["owner"], "scope": r["scope"]}
              for r in store.rows[PRELOAD:]]
    print("RESULT " + json.dumps({"answers": answers, "stored": stored}))

asyncio.run(main())
"""


def run_with_store(env: dict[str, str], texts: list[str], session: str, preload: int = 0) -> tuple[Any, str]:
    script = (
        STORE.replace("FLOW_ID", repr(FLOW_ID))
        .replace("USER_ID", repr(USER_ID))
        .replace("FLOW)", repr(str(HISTORY)) + ")")
        .replace("PRELOAD", str(preload))
        .replace("SESSION", repr(session))
        .replace("TEXTS", repr(texts))
    )
    proc = run_python(script, env, timeout=300)
    return _result(proc), proc.stderr


def test_messages_are_stored_on_the_host_and_the_history_reads_them_as_in_process(clean_fake: Fake) -> None:
    local, _ = run_with_store(in_process_env(clean_fake), ["first", "second"], "s-1")
    assert clean_fake.stats()["created"] == 0
    remote, _ = run_with_store(executor_env(clean_fake), ["first", "second"], "s-1")
    # The second run of the session reads the first run's two messages and its own input.
    assert local["answers"] == [
        ["1 messages: User:first"],
        ["3 messages: User:first | Machine:1 messages: User:first | User:second"],
    ], local
    assert remote == local
    # Every message the flow stored went to the host's store, in the flow's scope, with the
    # session, sender and text of the in-process ones.
    assert [(m["sender"], m["session_id"], m["scope"], m["owner"]) for m in remote["stored"]] == [
        ("User", "s-1", FLOW_ID, USER_ID),
        ("Machine", "s-1", FLOW_ID, USER_ID),
    ] * 2
    stats = clean_fake.wait_settled()
    assert stats["created"] == 2


def test_history_above_the_bound_is_cut_to_the_newest_with_a_note(clean_fake: Fake) -> None:
    from langflow_sandbox_createos import _native

    bound = _native.NativeExecutor.HISTORY_MESSAGES
    remote, stderr = run_with_store(executor_env(clean_fake), ["now"], "s-big", preload=bound + 100)
    answer = remote["answers"][0][0]
    # The guest saw the newest `bound` messages of the session and the run's own input.
    assert answer.startswith(f"{bound + 1} messages: User:old 100 | User:old 101 | "), answer[:200]
    assert answer.endswith(f"User:old {bound + 99} | User:now"), answer[-200:]
    assert "MAX_HISTORY_MESSAGES=500" in stderr and "was cut" in stderr, stderr[-3000:]
    assert "guest: note: the chat history of session \"s-big\" was cut" in stderr, stderr[-3000:]


# A host with a local file storage (Langflow's, inside a server; bare lfx registers none): the
# File component's storage key resolves to a file under the configuration directory.
FILE_RUN = """
import asyncio, json, sys
from pathlib import Path
from lfx.services.deps import get_settings_service
from lfx.services.manager import get_service_manager
from lfx.services.schema import ServiceType
from lfx.graph import Graph

class Storage:
    name = "storage_service"

    def __init__(self):
        self.data_dir = Path(get_settings_service().settings.config_dir)

    def resolve_component_path(self, key):
        return str(self.data_dir / key)

get_service_manager().register_service_class(ServiceType.STORAGE_SERVICE, Storage)

async def main():
    flow = json.load(open(FLOW))
    for node in flow["data"]["nodes"]:
        field = node["data"]["node"]["template"].get("path")
        if field:
            field["value"], field["file_path"] = [NAME], [KEY]
    graph = Graph.from_payload(flow, flow_id=FLOW_ID, user_id=USER_ID)
    try:
        outputs = await graph.arun([{"input_value": ""}])
    except Exception as exc:
        print("RESULT " + json.dumps({"error": type(exc).__name__, "message": str(exc)}))
        return
    print("RESULT " + json.dumps({"texts": [r.results["message"].text for run in outputs for r in run.outputs]}))

asyncio.run(main())
"""


def run_file_flow(env: dict[str, str], config: Path, name: str) -> Any:
    script = (
        FILE_RUN.replace("FLOW)", repr(str(FILE)) + ")")
        .replace("NAME", repr(name))
        .replace("KEY", repr(f"{USER_ID}/{name}"))
        .replace("FLOW_ID", repr(FLOW_ID))
        .replace("USER_ID", repr(USER_ID))
    )
    return _result(run_python(script, {**env, "LANGFLOW_CONFIG_DIR": str(config)}, timeout=300))


def test_an_uploaded_file_is_sent_to_the_guest_and_read_as_in_process(clean_fake: Fake, tmp_path: Path) -> None:
    (tmp_path / USER_ID).mkdir()
    (tmp_path / USER_ID / "notes.txt").write_text("the uploaded notes: 42 apples\n")
    local = run_file_flow(in_process_env(clean_fake), tmp_path, "notes.txt")
    assert local == {"texts": ["the uploaded notes: 42 apples\n"]}, local
    remote = run_file_flow(executor_env(clean_fake), tmp_path, "notes.txt")
    assert remote == local
    stats = clean_fake.wait_settled()
    assert stats["created"] == 1
    # The runner, the job and the file.
    assert stats["requests"]["upload"] == 3, stats


def test_a_file_above_the_bound_is_refused_before_any_guest_is_created(clean_fake: Fake, tmp_path: Path) -> None:
    (tmp_path / USER_ID).mkdir()
    with (tmp_path / USER_ID / "huge.txt").open("wb") as f:
        f.truncate(64 * 1024 * 1024 + 1)
    remote = run_file_flow(executor_env(clean_fake), tmp_path, "huge.txt")
    assert remote["error"] == "SandboxRefusedError", remote
    assert "MAX_FILE_BYTES=67108864" in remote["message"] and '"huge.txt"' in remote["message"], remote
    assert "Nothing was created" in remote["message"], remote
    stats = clean_fake.stats()
    assert stats["created"] == 0 and stats["requests"].get("create", 0) == 0, stats


TWO_RUNS_LOGGED = """
import asyncio, json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="LOG %(levelname)s %(message)s")
from lfx.graph import Graph

async def main():
    for _ in range(2):
        graph = Graph.from_payload(json.load(open(FLOW)))
        await graph.arun([{"input_value": "hi"}])
    print("RESULT done")

asyncio.run(main())
"""


def test_the_first_run_logs_once_which_paths_reach_the_executor(clean_fake: Fake) -> None:
    proc = run_python(TWO_RUNS_LOGGED.replace("FLOW", repr(str(SHOUT))), executor_env(clean_fake), timeout=240)
    assert "RESULT done" in proc.stdout, (proc.stdout[-2000:], proc.stderr[-3000:])
    said = [line for line in proc.stderr.splitlines() if line.startswith("LOG ") and "createos executor:" in line]
    assert len(said) == 1, said
    # lfx's own paths are read from the installed lfx; this venv has no Langflow server, so
    # whether its Playground reaches the executor is not known, and the line says so.
    assert "Graph.arun (Langflow's /api/v1/run" in said[0] and "go to a guest" in said[0], said
    assert "not known (treat as not sandboxed): the Playground's streaming build" in said[0], said
    assert clean_fake.wait_settled()["created"] == 2


FORGE = """
import asyncio, json, logging, sys
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
from lfx.graph import Graph

async def main():
    graph = Graph.from_payload(json.load(open(FLOW)))
    try:
        await graph.arun([{"input_value": "forge"}])
    except Exception as exc:
        logging.getLogger("host").error("the flow failed: %s", exc)
        print("RESULT " + json.dumps({"type": type(exc).__name__, "message": str(exc)}))

asyncio.run(main())
"""


def test_guest_text_cannot_start_a_line_of_the_hosts_log(clean_fake: Fake) -> None:
    # The flow prints Unicode line separators, NEL, CR LF and a bidi override, then fails with a
    # message of several lines; the host logs the guest's output and then the exception.
    proc = run_python(FORGE.replace("FLOW", repr(str(HOSTILE))), executor_env(clean_fake), timeout=180)
    result = _result(proc)
    assert result["type"] == "ValueError", result
    # lfx's own words first ("Error building Component Hostile: "), then the guest's lines.
    lines = result["message"].split("\n")
    assert lines[1:] and all(line.startswith("  | ") for line in lines[1:]), result
    assert "  | boom" in lines, result
    assert "  | CRITICAL root: forged-by-exception\\r" in lines, result
    relayed = [line for line in proc.stderr.splitlines() if "guest: ok" in line]
    assert relayed, proc.stderr[-3000:]
    assert "\\u{2028}CRITICAL forged-by-separator\\u{2029}x\\x85y\\u{202e}live" in relayed[0], relayed
    # The guest's CR LF ends a record: the next line is a record of its own, prefixed as one.
    assert any(line.endswith("guest: CRITICAL forged-by-crlf") for line in proc.stderr.splitlines()), proc.stderr[-3000:]
    # No line of what the host wrote starts with the guest's words, and none carries a raw
    # separator, NEL or bidi control.
    for line in proc.stderr.splitlines():
        assert not line.startswith("CRITICAL"), line
        assert not any(c in line for c in "\u2028\u2029\u0085\u202e\r"), repr(line)
    assert clean_fake.wait_settled()["live"] == 0
