"""The CreateOS Sandbox component with Provider = OpenSandbox, through lfx's component seam
(``lfx run`` of a flow whose node is the installed wheel's component) on the OpenSandbox fake.

The flow is built here with lfx's Graph API from the installed component (the committed
component flows predate the Provider input; they keep running on CreateOS, the default).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from conftest import E2E, Fake
from test_component import component_env, results, run_flow
from test_opensandbox_backend import OS_KEY, OsFake
from test_opensandbox_executor import os_executor_env, osfake, osfake_guests  # noqa: F401 - fixtures

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
chat_out = ChatOutput(_id="chat_out_results")
chat_out.set(input_value=sandbox.run_sandbox)
flow = Graph(chat_in, chat_out).dump(name="provider", description="provider choice")
open(sys.argv[1], "w").write(json.dumps(flow))
"""

PROGRAM = "import math\nprint(math.factorial(5) + 6*7)"


def flow_on(tmp_path: Path, provider: str) -> Path:
    out = tmp_path / f"flow-{provider or 'default'}.json"
    subprocess.run([sys.executable, "-c", BUILD, str(out), provider], check=True, timeout=120, cwd=E2E)
    return out


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
