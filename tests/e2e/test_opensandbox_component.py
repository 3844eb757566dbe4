"""The CreateOS Sandbox component with Provider = OpenSandbox, through lfx's component seam
(``lfx run`` of a flow whose node is the installed wheel's component) on the OpenSandbox fake.

The flow is built here with lfx's Graph API from the installed component (the committed
component flows predate the Provider input; they keep running on CreateOS, the default).
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from conftest import E2E, OS_KEY, Fake, OsFake
from test_component import COUNTER, FLOW_ID, component_env, reap, results, run_flow, served
from test_opensandbox_executor import os_executor_env, osfake  # noqa: F401 - a fixture

BUILD = """
import json, sys
from lfx.components.input_output import ChatInput, ChatOutput
from lfx.graph import Graph
from langflow_sandbox_createos.components.createos.createos_sandbox import CreateOSSandboxComponent

chat_in = ChatInput(_id="chat_in")
sandbox = CreateOSSandboxComponent(_id="createos_sandbox")
sandbox.set(python_code=chat_in.message_response)
if sys.argv[2]:
    sandbox.set(provider=sys.argv[2])
if len(sys.argv) > 3:
    sandbox.set(session_mode=sys.argv[3])
chat_out = ChatOutput(_id="chat_out_results")
chat_out.set(input_value=sandbox.run_sandbox)
flow = Graph(chat_in, chat_out).dump(name="provider", description="provider choice")
if len(sys.argv) > 4:
    flow["id"] = sys.argv[4]
open(sys.argv[1], "w").write(json.dumps(flow))
"""

PROGRAM = "import math\nprint(math.factorial(5) + 6*7)"


def flow_on(tmp_path: Path, provider: str) -> Path:
    out = tmp_path / f"flow-{provider or 'default'}.json"
    subprocess.run([sys.executable, "-c", BUILD, str(out), provider], check=True, timeout=120, cwd=E2E)
    return out


def kept_flow(tmp_path: Path, session_mode: str) -> Path:
    """The OpenSandbox flow with Guest Reuse ``session_mode``, saved under ``FLOW_ID``."""
    out = tmp_path / f"flow-kept-{session_mode}.json"
    args = [str(out), "OpenSandbox", session_mode, FLOW_ID]
    subprocess.run([sys.executable, "-c", BUILD, *args], check=True, timeout=120, cwd=E2E)
    return out


def delete_sandbox(osfake: OsFake, sandbox_id: str) -> None:
    """Delete a sandbox through the server's API, as an operator (or its expiry) would."""
    request = urllib.request.Request(
        f"{osfake.url}/v1/sandboxes/{sandbox_id}", method="DELETE", headers={"OPEN-SANDBOX-API-KEY": OS_KEY}
    )
    with urllib.request.urlopen(request, timeout=10):  # noqa: S310 - loopback
        pass


def os_component_env(osfake: OsFake, **overrides: str | None) -> dict[str, str]:
    return os_executor_env(osfake, LANGFLOW_EXECUTOR_KIND=None, **overrides)


def test_the_provider_choice_runs_the_node_on_opensandbox_with_the_createos_answer(
    osfake: OsFake, clean_fake: Fake, tmp_path: Path
) -> None:
    default = results(run_flow(component_env(clean_fake), flow_on(tmp_path, ""), PROGRAM))
    assert clean_fake.stats()["created"] == 1
    on_os = results(run_flow(os_component_env(osfake), flow_on(tmp_path, "OpenSandbox"), PROGRAM))
    assert default["result"] == on_os["result"] == "162"
    assert on_os["exit_code"] == 0
    # The Results say where the guest ran.
    assert (default["provider"], on_os["provider"]) == ("createos", "opensandbox")
    stats = osfake.wait_settled()
    assert stats["created"] == 1
    # Nothing of the OpenSandbox run reached CreateOS.
    assert clean_fake.wait_settled()["created"] == 1


def test_without_the_attestation_the_node_refuses_and_creates_nothing(osfake: OsFake, tmp_path: Path) -> None:
    env = os_component_env(osfake, OPEN_SANDBOX_ATTEST_ISOLATION=None, OPEN_SANDBOX_RUNTIME_CLASS=None)
    run = run_flow(env, flow_on(tmp_path, "OpenSandbox"), PROGRAM)
    out = run.stdout + run.stderr
    assert "OPEN_SANDBOX_ATTEST_ISOLATION" in out and "OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION" in out, out[-3000:]
    assert OS_KEY not in out
    assert osfake.stats()["created"] == 0


def test_reuse_flow_on_opensandbox_keeps_one_sandbox_with_its_files(osfake: OsFake, tmp_path: Path) -> None:
    with served(os_component_env(osfake), tmp_path, kept_flow(tmp_path, "flow")) as server:
        # Callers with sessions of their own: under `flow`, one sandbox serves them all.
        seen = [server.results(COUNTER, session_id=f"caller-{n}") for n in range(3)]
    assert [r["result"] for r in seen] == ["RUN_COUNT 1", "RUN_COUNT 2", "RUN_COUNT 3"]
    assert len({r["sandbox_id"] for r in seen}) == 1
    assert seen[0]["sandbox_name"].startswith("lf-c-")
    assert [r["reused_guest"] for r in seen] == [False, True, True]
    assert all(r["kept_guest"] for r in seen)
    stats = osfake.stats()
    # One create; kept when the server stopped.
    assert (stats["created"], stats["live"]) == (1, 1)


def test_session_reuse_on_opensandbox_keeps_one_sandbox_per_session(osfake: OsFake, tmp_path: Path) -> None:
    with served(os_component_env(osfake), tmp_path, kept_flow(tmp_path, "session")) as server:
        a1 = server.results(COUNTER, session_id="chat-of-ann")
        b1 = server.results(COUNTER, session_id="chat-of-bob")
        a2 = server.results(COUNTER, session_id="chat-of-ann")
    assert (a1["result"], a2["result"], b1["result"]) == ("RUN_COUNT 1", "RUN_COUNT 2", "RUN_COUNT 1")
    assert a1["sandbox_id"] == a2["sandbox_id"] != b1["sandbox_id"]
    stats = osfake.stats()
    assert (stats["created"], stats["live"]) == (2, 2)


def test_a_kept_sandbox_deleted_between_runs_is_replaced_and_reap_deletes_old_ones(
    osfake: OsFake, tmp_path: Path
) -> None:
    env = os_component_env(osfake)
    with served(env, tmp_path, kept_flow(tmp_path, "flow")) as server:
        first = server.results(COUNTER)
        delete_sandbox(osfake, first["sandbox_id"])
        second = server.results(COUNTER)
        third = server.results(COUNTER)
    # Created again, without the old file, then reused.
    assert (first["result"], second["result"], third["result"]) == ("RUN_COUNT 1", "RUN_COUNT 1", "RUN_COUNT 2")
    assert second["sandbox_id"] != first["sandbox_id"] and not second["reused_guest"]
    assert third["sandbox_id"] == second["sandbox_id"] and third["reused_guest"]
    assert second["sandbox_name"] == first["sandbox_name"]
    assert osfake.stats()["live"] == 1
    # The orphan sweep alone leaves a kept sandbox; --older-than lists or deletes it by age.
    plain = reap(env, "--provider", "opensandbox", "--older-than", "1h")
    assert plain.returncode == 0, plain.stderr
    assert f"kept reused guest {second['sandbox_name']} ({second['sandbox_id']})" in plain.stdout
    assert "0 reused guest(s) older than 1h deleted, 1 kept" in plain.stdout
    swept = reap(env, "--provider", "opensandbox", "--older-than", "0s", "--dry-run")
    assert f"would delete reused guest {second['sandbox_name']}" in swept.stdout, swept.stdout
    assert osfake.stats()["live"] == 1
    default = reap(env, "--provider", "opensandbox")
    assert default.returncode == 0, default.stderr
    assert osfake.stats()["live"] == 1
    gone = reap(env, "--provider", "opensandbox", "--older-than", "0s")
    assert gone.returncode == 0, gone.stderr
    assert f"deleted reused guest {second['sandbox_name']} ({second['sandbox_id']})" in gone.stdout
    assert OS_KEY not in gone.stdout + gone.stderr
    osfake.wait_settled()


def test_reuse_off_on_opensandbox_leaves_nothing_beside_a_kept_sandbox(osfake: OsFake, tmp_path: Path) -> None:
    env = os_component_env(osfake)
    with served(env, tmp_path, kept_flow(tmp_path, "flow")) as server:
        kept = server.results(COUNTER)
    off = results(run_flow(env, flow_on(tmp_path, "OpenSandbox"), PROGRAM))
    assert off["result"] == "162" and not off["kept_guest"]
    stats = osfake.stats()
    assert stats["created"] == 2
    deadline = time.monotonic() + 15
    while osfake.stats()["live"] != 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert osfake.stats()["live"] == 1
    delete_sandbox(osfake, kept["sandbox_id"])
    osfake.wait_settled()


def test_the_status_and_tool_description_name_the_opensandbox_server_not_a_microvm() -> None:
    from langflow_sandbox_createos import node

    ran = {"sandbox_name": "lf-x", "exit_code": 0, "provider": "opensandbox"}
    policy = {"allow_network": False, "session_mode": "off", "accept_egress_exceptions": False}
    # From the run's Results (a flow saved before the node passed its Provider), or given.
    for status in (node.status_text(ran, **policy), node.status_text(ran, **policy, provider="opensandbox")):
        assert "a sandbox on the OpenSandbox server" in status, status
        assert "microVM" not in status and "CreateOS" not in status, status
    tool = node.describe(True, "flow", False, "opensandbox")
    assert "OpenSandbox server" in tool and "microVM" not in tool, tool
    # CreateOS, and a source that passes no provider at all, keep the CreateOS wording.
    status = node.status_text({"sandbox_name": "lf-y", "exit_code": 0}, **policy)
    assert "CreateOS Firecracker microVM" in status, status
