"""Domain allowlists on OpenSandbox for the executor and the component, against the fake.

``CREATEOS_EXECUTOR_ALLOWED_DOMAINS`` (``LANGFLOW_EXECUTOR_KIND=opensandbox``) and the
component's Allowed Domains (Provider = OpenSandbox) become the sandbox's own egress rules,
as the backend's list does: ``defaultAction: deny`` plus one ``allow`` rule per name, read back
before any code, with no egress gateway. The fake keeps the policy each sandbox's sidecar took
(``policies`` in its stats), so a test checks what a run asked for after the run deleted its
sandbox. A ``dns``-mode sidecar or none at all refuses the run and leaves no sandbox; an address
entry is refused before any sandbox exists.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import OS_KEY, Fake, OsFake
from test_component import run_flow
from test_opensandbox_component import PROGRAM, flow_on, os_component_env
from test_opensandbox_executor import os_executor_env, osfake, run_refused  # noqa: F401 - a fixture

DOMAINS = "PyPI.org, *.pythonhosted.org"
# As the sidecar must hold them: normalised, each an allow rule, nothing else.
RULES = [{"action": "allow", "target": "*.pythonhosted.org"}, {"action": "allow", "target": "pypi.org"}]


def held_policies(osfake: OsFake) -> list[Any]:
    """The policy each sandbox's sidecar took at create, rules sorted by target."""
    out: list[Any] = []
    for policy in osfake.stats()["policies"]:
        if isinstance(policy, dict):
            policy = {**policy, "egress": sorted(policy["egress"], key=lambda r: r["target"])}
        out.append(policy)
    return out


def node_flow(tmp_path: Path, **values: Any) -> Path:
    """A flow whose CreateOS Sandbox node has Provider = OpenSandbox and these inputs."""
    path = flow_on(tmp_path, "OpenSandbox")
    data = json.loads(path.read_text())
    for node in data["data"]["nodes"]:
        if node["id"] == "createos_sandbox":
            template = node["data"]["node"]["template"]
            for name, value in values.items():
                template[name]["value"] = value
    out = tmp_path / f"domains-{len(list(tmp_path.iterdir()))}.json"
    out.write_text(json.dumps(data))
    return out


def executor_run(osfake: OsFake, **overrides: str | None) -> tuple[str, int]:
    """``lfx run`` of the SHOUT flow on the OpenSandbox executor: its output and return code."""
    proc = run_refused(os_executor_env(osfake, **overrides))
    return proc.stdout + proc.stderr, proc.returncode


# ---- the executor ----------------------------------------------------------------------------


def test_executor_sends_the_domains_as_the_sandboxs_own_rules(osfake: OsFake, tmp_path: Path) -> None:
    usage = tmp_path / "usage.jsonl"
    out, rc = executor_run(osfake, CREATEOS_EXECUTOR_ALLOWED_DOMAINS=DOMAINS, CREATEOS_USAGE_LOG=str(usage))
    assert rc == 0 and "FROM THE CLI!" in out, out[-3000:]
    stats = osfake.wait_settled()
    assert stats["created"] == 1
    assert held_policies(osfake) == [{"defaultAction": "deny", "egress": RULES}]
    # The sidecar's policy was read back (through the server's route), and no gateway was asked for.
    assert stats["requests"].get("networkpolicy_get", 0) >= 1, stats["requests"]
    assert "CREATEOS_GATEWAY" not in out
    records = [json.loads(line) for line in usage.read_text().splitlines()]
    assert [(r["provider"], r["surface"], r["egress"]) for r in records] == [("opensandbox", "executor", "allowlist")]


@pytest.mark.parametrize(
    ("mode", "needle", "held"),
    [
        ({"egress_mode": "dns"}, 'mode = "dns+nft"', {"defaultAction": "deny", "egress": RULES}),
        ({"sidecar_absent": True}, "no egress sidecar", None),
    ],
    ids=["dns-mode", "no-sidecar"],
)
def test_executor_refuses_a_server_that_cannot_enforce_the_names(
    osfake: OsFake, mode: dict[str, Any], needle: str, held: Any
) -> None:
    osfake.configure(**mode)
    out, rc = executor_run(osfake, CREATEOS_EXECUTOR_ALLOWED_DOMAINS=DOMAINS)
    assert rc != 0 and "FROM THE CLI!" not in out
    assert needle in out or needle.replace('"', '\\"') in out, out[-3000:]
    assert "[egress]" in out, out[-3000:]
    assert OS_KEY not in out
    stats = osfake.wait_settled()
    assert stats["created"] == 1
    # The names were sent; the read-back refused them (dns mode), or nothing held them.
    assert held_policies(osfake) == [held]
    # Nothing of the run reached the sandbox: no upload, and no command but the identity probe.
    assert stats["requests"].get("files_upload", 0) == 0, stats["requests"]
    assert stats["commands"] == 1, stats


def test_executor_refuses_an_address_entry_before_any_sandbox(osfake: OsFake) -> None:
    out, rc = executor_run(osfake, CREATEOS_EXECUTOR_ALLOWED_DOMAINS="pypi.org, 10.0.0.0/8")
    assert rc != 0 and "FROM THE CLI!" not in out
    assert "CREATEOS_EXECUTOR_ALLOWED_DOMAINS holds the address rule 10.0.0.0/8" in out, out[-3000:]
    assert osfake.stats()["created"] == 0


# ---- the component ---------------------------------------------------------------------------


def test_component_sends_the_domains_as_the_sandboxs_own_rules(osfake: OsFake, clean_fake: Fake, tmp_path: Path) -> None:
    usage = tmp_path / "usage.jsonl"
    flow = node_flow(tmp_path, allow_network=True, allowed_domains=DOMAINS)
    run = run_flow(os_component_env(osfake, CREATEOS_USAGE_LOG=str(usage)), flow, PROGRAM)
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-3000:])
    assert run.result["result"] == "162", run.result
    assert osfake.wait_settled()["created"] == 1
    assert held_policies(osfake) == [{"defaultAction": "deny", "egress": RULES}]
    records = [json.loads(line) for line in usage.read_text().splitlines()]
    assert [(r["provider"], r["surface"], r["egress"]) for r in records] == [("opensandbox", "component", "allowlist")]
    # Nothing reached CreateOS, whose gateway the run did not need.
    assert clean_fake.stats()["created"] == 0


@pytest.mark.parametrize(
    "mode",
    [{"egress_mode": "dns"}, {"sidecar_absent": True}],
    ids=["dns-mode", "no-sidecar"],
)
def test_component_refuses_a_server_that_cannot_enforce_the_names(osfake: OsFake, tmp_path: Path, mode: dict[str, Any]) -> None:
    osfake.configure(**mode)
    flow = node_flow(tmp_path, allow_network=True, allowed_domains=DOMAINS)
    run = run_flow(os_component_env(osfake), flow, PROGRAM)
    out = run.stdout + run.stderr
    assert "[egress]" in out, out[-3000:]
    assert '"162"' not in run.stdout
    assert OS_KEY not in out
    stats = osfake.wait_settled()
    assert stats["created"] == 1
    # The program was not uploaded: nothing reaches a sandbox whose read-back failed.
    assert stats["requests"].get("files_upload", 0) == 0, stats["requests"]
    assert stats["commands"] == 1, stats


def test_component_refuses_an_address_entry_before_any_sandbox(osfake: OsFake, tmp_path: Path) -> None:
    flow = node_flow(tmp_path, allow_network=True, allowed_domains="pypi.org, 192.0.2.7")
    run = run_flow(os_component_env(osfake), flow, PROGRAM)
    out = run.stdout + run.stderr
    assert "Allowed Domains" in out and "address rule 192.0.2.7" in out, out[-3000:]
    assert osfake.stats()["created"] == 0
