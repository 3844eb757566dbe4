"""The host builds no flow code when the executor is on (issue 46, ``CREATEOS_EXECUTOR_HOST_BUILDS``).

The marker flow (``flows/marker_flow.json``: Chat Input -> Marker -> Chat Output) writes a marker
file, named after the writing process's pid, at module level, in its component's class body, in
``__init__`` and in its build method, and answers with the four markers of the process it built
in. ``LFSC_MARKER_DIR`` is set for the host process only (a guest's environment is the executor's
own), so every file in it was written by the Langflow process: with the hook, none; without it,
the host's module, class and ``__init__`` markers. The answer names the guest's markers, which the
guest wrote in its own temporary directory.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from conftest import E2E, Fake, OsFake, backend_env, http_json, lfx_serve, run_bounded, run_doctor, script_result, venv_bin

MARKER = E2E / "flows" / "marker_flow.json"
SERVE_KEY = "e2e-hostbuild-serve-key"


def hook_env(fake: Fake, markers: Path, **overrides: str | None) -> dict[str, str]:
    """The executor on against the fake, the hook asked for, the host's markers in ``markers``."""
    settings: dict[str, str | None] = {
        "LANGFLOW_SANDBOX_BACKEND": None,
        "LANGFLOW_SANDBOX_BACKEND_PLUGINS": None,
        "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS": None,
        "LANGFLOW_EXECUTOR_KIND": "createos",
        "CREATEOS_EXECUTOR_HOST_BUILDS": "none",
        "LFSC_MARKER_DIR": str(markers),
    }
    settings.update(overrides)
    return backend_env(fake, **settings)


def guest_markers(answer: str) -> str:
    """The pid of the one process the answer says wrote all four markers (the guest's runner)."""
    marks = re.findall(r"\b(module|class|init|build)-(\d+)\b", answer)
    assert [where for where, _ in marks] == ["module", "class", "init", "build"], answer
    pids = {pid for _, pid in marks}
    assert len(pids) == 1, answer
    return pids.pop()


def host_markers(host: Path) -> list[str]:
    """The markers the host process wrote (only it has ``LFSC_MARKER_DIR``)."""
    return sorted(p.name for p in host.iterdir()) if host.exists() else []


def lfx_run_marker(env: dict[str, str]) -> dict[str, Any]:
    proc = run_bounded([venv_bin("lfx"), "run", str(MARKER), "hi"], env, timeout=180)
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.strip().startswith("{"):
            return json.loads(line)
    pytest.fail(f"no JSON from lfx run (rc={proc.returncode}): {proc.stdout[-2000:]} {proc.stderr[-3000:]}")


def test_lfx_run_evaluates_no_flow_code_on_the_host(clean_fake: Fake, tmp_path: Path) -> None:
    host = tmp_path / "host"
    out = lfx_run_marker(hook_env(clean_fake, host))
    assert out.get("success") is True, out
    guest_markers(out["result"])
    assert host_markers(host) == []
    assert clean_fake.wait_settled()["created"] == 1


def test_lfx_run_on_opensandbox_evaluates_no_flow_code_on_the_host(osfake_guests: OsFake, tmp_path: Path) -> None:
    """The second provider: the same hook, the same answer from a sandbox of the OpenSandbox fake."""
    from test_opensandbox_executor import os_executor_env

    osfake_guests.reset()
    host = tmp_path / "host"
    env = os_executor_env(osfake_guests, CREATEOS_EXECUTOR_HOST_BUILDS="none", LFSC_MARKER_DIR=str(host))
    out = lfx_run_marker(env)
    assert out.get("success") is True, out
    guest_markers(out["result"])
    assert host_markers(host) == []
    assert osfake_guests.wait_settled()["created"] == 1


def test_without_the_hook_the_host_evaluates_the_code_and_the_guest_builds(clean_fake: Fake, tmp_path: Path) -> None:
    """What the hook changes: without it, the host writes the module, class and __init__ markers
    (never the build's), and the answer is the same guest's."""
    host = tmp_path / "host"
    out = lfx_run_marker(hook_env(clean_fake, host, CREATEOS_EXECUTOR_HOST_BUILDS=None))
    assert out.get("success") is True, out
    guest = guest_markers(out["result"])
    written = host_markers(host)
    assert sorted(name.split("-")[0] for name in written) == ["class", "init", "module"], written
    assert guest not in {name.split("-")[1] for name in written}


def test_lfx_serve_evaluates_no_flow_code_on_the_host(clean_fake: Fake, tmp_path: Path) -> None:
    host = tmp_path / "host"
    env = hook_env(clean_fake, host, LANGFLOW_API_KEY=SERVE_KEY)
    with lfx_serve(MARKER, env, tmp_path / "serve.log") as base:
        flows = http_json("GET", f"{base}/flows", api_key=SERVE_KEY)
        flow_id = flows[0]["id"]
        answers = [
            http_json("POST", f"{base}/flows/{flow_id}/run", {"input_value": "hi"}, api_key=SERVE_KEY) for _ in range(2)
        ]
    for answer in answers:
        assert answer.get("success") is True, answer
        guest_markers(answer["result"])
    assert host_markers(host) == []
    assert clean_fake.wait_settled()["created"] == 2


UNKNOWN = """
import dataclasses, json, logging, os, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
from lfx.graph.graph.base import Graph
from langflow_sandbox_createos import hostbuild, reach
before = Graph.__dict__["from_payload"]
os.environ["CREATEOS_EXECUTOR_HOST_BUILDS"] = "none"  # asked for only now: the process started unhooked
what = sys.argv[1]
if what == "version":  # an lfx the hook does not know
    hostbuild.LFX_VERSIONS = frozenset({"0.0.1"})
elif what == "signature":  # a Graph.from_payload whose parameters are not the expected ones
    hostbuild.FROM_PAYLOAD_PARAMS = hostbuild.FROM_PAYLOAD_PARAMS + ", flavour:KEYWORD_ONLY"
else:  # a caller whose parameters changed
    path = hostbuild.PATHS[0]
    caller = dataclasses.replace(path.callers[0], params="flow:POSITIONAL_OR_KEYWORD")
    hostbuild.PATHS = (dataclasses.replace(path, callers=(caller,)), *hostbuild.PATHS[1:])
results = [hostbuild.install("lfx", Graph), hostbuild.install("lfx", Graph)]
print("RESULT " + json.dumps({
    "unchanged": Graph.__dict__["from_payload"] is before,
    "results": results,
    "doctor": [text for _, text in reach.findings() if text.startswith("lfx run and lfx serve: ") and "covered" in text],
}))
"""


@pytest.mark.parametrize(
    ("what", "why"),
    [
        ("version", "lfx 1.13.0 is not a version this hook was checked against (0.0.1)"),
        ("signature", "lfx's Graph.from_payload has the parameters"),
        ("caller", "lfx/load/load.py:aload_flow_from_json has the parameters"),
    ],
)
def test_an_unknown_fingerprint_installs_nothing_warns_once_and_doctor_says_not_covered(
    clean_fake: Fake, tmp_path: Path, what: str, why: str
) -> None:
    """The fingerprint: with an lfx version the hook does not know, a ``Graph.from_payload`` of
    other parameters, or a caller of other parameters (each monkeypatched in the process), nothing
    is wrapped, one WARNING names the path and why however often it is asked, and what doctor
    prints says the path is not covered, and why."""
    env = hook_env(clean_fake, tmp_path / "host", CREATEOS_EXECUTOR_HOST_BUILDS=None)
    result, proc = script_result(UNKNOWN, [what], env)
    assert result["unchanged"] is True, result
    assert why in result["results"][0]["lfx run and lfx serve"], result
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "lfx run and lfx serve" in warnings[0] and why in warnings[0], proc.stderr[-3000:]
    assert len(result["doctor"]) == 1 and "not covered" in result["doctor"][0], result
    assert why in result["doctor"][0], result


def test_doctor_says_per_route_what_is_covered(clean_fake: Fake, tmp_path: Path) -> None:
    on = run_doctor(hook_env(clean_fake, tmp_path / "host"), args=("--surface", "executor"))
    assert re.search(r"lfx run and lfx serve: covered", on.stdout), on.stdout[-4000:]
    off = run_doctor(hook_env(clean_fake, tmp_path / "host", CREATEOS_EXECUTOR_HOST_BUILDS=None), args=("--surface", "executor"))
    assert re.search(r"lfx run and lfx serve: not covered", off.stdout), off.stdout[-4000:]
    assert "CREATEOS_EXECUTOR_HOST_BUILDS=none" in off.stdout


SAME_JOB = """
import json, sys
from lfx.execution.types import Unit
from lfx.graph import Graph
from langflow_sandbox_createos import executor

payload = json.load(open(sys.argv[1]))
jobs = []
for instantiate in (True, False):
    graph = Graph.from_payload(json.loads(json.dumps(payload)), flow_id="f-1", instantiate_components=instantiate)
    unit = Unit(graph=graph, inputs=[{"input_value": "hi"}], runtime_options={"session_id": "s-1"})
    request = executor._request(unit)
    head = executor._head(unit, [])
    built = sum(v.custom_component is not None for v in graph.vertices)
    jobs.append({"request": request, "head": head, "files": executor._files(graph)[:2], "built": built})
print("RESULT " + json.dumps({"same": jobs[0]["request"] == jobs[1]["request"] and jobs[0]["head"] == jobs[1]["head"]
    and jobs[0]["files"] == jobs[1]["files"], "built": [j["built"] for j in jobs],
    "code": "_MODULE_MARK = _mark" in json.dumps(jobs[1]["request"]["flow"])}))
"""


def test_a_graph_built_without_instances_is_the_same_job_for_the_guest(clean_fake: Fake, tmp_path: Path) -> None:
    """What the executor sends (the flow's dump, the head, the files) is the same for a graph
    built with and without component instances, and the dump still carries the component's code."""
    env = hook_env(clean_fake, tmp_path / "host", CREATEOS_EXECUTOR_HOST_BUILDS=None)
    result, _ = script_result(SAME_JOB, [str(MARKER)], env)
    assert result == {"same": True, "built": [3, 0], "code": True}, result


def test_a_value_that_is_not_none_or_components_refuses_every_run(clean_fake: Fake, tmp_path: Path) -> None:
    """Fail closed: the operator asked for something the executor cannot tell, so no run goes
    ahead, the refusal names the setting, and doctor counts it as a problem."""
    env = hook_env(clean_fake, tmp_path / "host", CREATEOS_EXECUTOR_HOST_BUILDS="nnone")
    out = lfx_run_marker(env)
    assert out.get("success") is False and out.get("exception_type") == "SandboxRefusedError", out
    assert "CREATEOS_EXECUTOR_HOST_BUILDS='nnone' is not one of components, none" in out["exception_message"], out
    assert clean_fake.stats()["created"] == 0
    doctor = run_doctor(env, args=("--surface", "executor"))
    assert doctor.returncode == 1, doctor.stdout[-3000:]
    assert "CREATEOS_EXECUTOR_HOST_BUILDS='nnone' is not one of components, none" in doctor.stdout, doctor.stdout[-3000:]


def test_the_first_run_log_line_says_which_routes_are_covered(clean_fake: Fake, tmp_path: Path) -> None:
    """The executor's first log line in the process (``lfx run -v`` prints it) lists the covered
    routes and the others, as doctor does."""
    env = hook_env(clean_fake, tmp_path / "host")
    proc = run_bounded([venv_bin("lfx"), "run", "-v", str(MARKER), "hi"], env, timeout=180)
    said = [line for line in (proc.stderr + proc.stdout).splitlines() if "no flow code evaluated in this process" in line]
    assert len(said) == 1, (proc.stdout[-2000:], proc.stderr[-3000:])
    assert "no flow code evaluated in this process): lfx run and lfx serve; not covered (doctor says why): v1 run; v2 sync; v1 build" in said[0], said


def test_a_playground_value_that_is_not_on_or_off_refuses_every_run(clean_fake: Fake, tmp_path: Path) -> None:
    """``CREATEOS_EXECUTOR_PLAYGROUND`` fails closed as ``CREATEOS_EXECUTOR_HOST_BUILDS`` does:
    every executor run is refused naming the setting, nothing is created, and doctor counts it
    as a problem."""
    env = hook_env(clean_fake, tmp_path / "host", CREATEOS_EXECUTOR_PLAYGROUND="yes")
    out = lfx_run_marker(env)
    assert out.get("success") is False and out.get("exception_type") == "SandboxRefusedError", out
    assert "CREATEOS_EXECUTOR_PLAYGROUND='yes' is not one of off, on" in out["exception_message"], out
    assert clean_fake.stats()["created"] == 0
    doctor = run_doctor(env, args=("--surface", "executor"))
    assert doctor.returncode == 1, doctor.stdout[-3000:]
    assert "CREATEOS_EXECUTOR_PLAYGROUND='yes' is not one of off, on" in doctor.stdout, doctor.stdout[-3000:]


REFUSALS = """
import copy, json, sys
from lfx.graph import Graph
from langflow_sandbox_createos import playground

flow = json.loads(open(sys.argv[1]).read())
out = {}
for kind, shown in (("RunFlow", "Run Flow"), ("SubFlow", "Sub Flow"), ("HumanInput", "Human Input")):
    payload = copy.deepcopy(flow)
    for node in payload["data"]["nodes"]:
        if node["id"] == "marker":  # a node of that component (its type and name; never built)
            node["data"]["type"] = kind
            node["data"]["node"]["display_name"] = shown
    graph = Graph.from_payload(payload, flow_id="f-1", instantiate_components=False)
    out[kind] = playground._refusal(graph, None, None)
plain = Graph.from_payload(copy.deepcopy(flow), flow_id="f-2", instantiate_components=False)
out["plain"] = playground._refusal(plain, None, None)
out["files"] = playground._refusal(plain, ["f/x.png"], None)
out["resume"] = playground._refusal(plain, None, {"request_id": "r"})
print("RESULT " + json.dumps(out))
"""


def test_the_playground_refuses_what_a_guest_cannot_carry(clean_fake: Fake, tmp_path: Path) -> None:
    """Run Flow, Sub Flow and Human Input (and chat attachments, a resumed run) are refused by
    the Playground's driver, naming the component, from a graph whose components were never
    built; a plain flow is not."""
    result, _ = script_result(REFUSALS, [str(MARKER)], hook_env(clean_fake, tmp_path / "host"))
    assert result["RunFlow"].startswith("Run Flow: Run Flow runs another flow"), result
    assert result["SubFlow"].startswith("Sub Flow: Sub Flow runs another flow"), result
    assert result["HumanInput"].startswith("Human Input: Human Input pauses the run"), result
    assert result["plain"] is None, result
    assert "files attached to the chat" in result["files"] and "resumed" in result["resume"], result
