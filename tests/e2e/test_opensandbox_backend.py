"""``LANGFLOW_SANDBOX_BACKEND=opensandbox`` through lfx's seam against the OpenSandbox fake.

The fake (``cargo build -p opensandbox-fake``) runs as a Kubernetes server with a Kata
runtime; the backend is selected and trusted with lfx's own variables, and the operator's
attestation is ``OPEN_SANDBOX_ATTEST_ISOLATION``. ``OPENSANDBOX_FAKE_BIN`` overrides the
binary's path.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from typing import Any

import pytest

from conftest import (
    OS_KEY,
    Fake,
    OsFake,
    backend_env,
    backend_runs,
    lfx_run,
    run_python,
    signal_lfx_run,
    with_overrides,
)


@pytest.fixture
def osfake(osfake_server: OsFake) -> OsFake:
    osfake_server.reset()
    return osfake_server


def os_env(osfake: OsFake, **overrides: str | None) -> dict[str, str]:
    """What an operator sets for the OpenSandbox backend, pointed at the fake."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CREATEOS_", "LANGFLOW_", "OPEN_SANDBOX_"))}
    env.update(
        {
            "LANGFLOW_SANDBOX_BACKEND_PLUGINS": "opensandbox",
            "LANGFLOW_SANDBOX_BACKEND": "opensandbox",
            "OPEN_SANDBOX_DOMAIN": osfake.url,
            "OPEN_SANDBOX_API_KEY": OS_KEY,
            "OPEN_SANDBOX_SERVER_UNREACHABLE": "true",
            "OPEN_SANDBOX_ATTEST_ISOLATION": "hardware-virtualized",
            "OPEN_SANDBOX_RUNTIME_CLASS": "kata-qemu",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return with_overrides(env, overrides)


def test_the_same_flow_gives_the_same_answer_as_createos_and_leaves_no_sandbox(osfake: OsFake, clean_fake: Fake) -> None:
    code = "print(math.factorial(5) + 6*7)"
    on_createos = lfx_run(backend_env(clean_fake), code)
    on_opensandbox = lfx_run(os_env(osfake), code)
    assert on_opensandbox.returncode == 0, on_opensandbox.stderr[-3000:]
    assert on_opensandbox.json["success"] is True
    assert on_opensandbox.result == on_createos.result == {"result": "162"}
    stats = osfake.wait_settled()
    assert stats["created"] == 1
    # The program ran in the sandbox: the probe's command and the program's.
    assert stats["commands"] >= 2


def test_a_failing_program_is_a_result(osfake: OsFake) -> None:
    run = lfx_run(os_env(osfake), "import sys\nsys.stderr.write('guest says no')\nsys.exit(3)")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.result == {"error": "guest says no"}
    osfake.wait_settled()


def test_lfx_refuses_without_the_attestation_naming_the_setting(osfake: OsFake) -> None:
    # lfx's own refusal ("reports 'container' isolation, not a hardware-virtualized boundary")
    # names no setting; the backend refuses first, naming OPEN_SANDBOX_ATTEST_ISOLATION.
    run = lfx_run(os_env(osfake, OPEN_SANDBOX_ATTEST_ISOLATION=None), "print(1)")
    assert run.returncode != 0
    assert run.json["success"] is False
    message = run.json["exception_message"]
    assert "OPEN_SANDBOX_ATTEST_ISOLATION=hardware-virtualized" in message, message
    assert "OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION" not in message, message
    # The component's and executor's opt-in does not move lfx's seam, and the refusal says so.
    run = lfx_run(os_env(osfake, OPEN_SANDBOX_ATTEST_ISOLATION=None, OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION="true"), "print(1)")
    message = run.json["exception_message"]
    assert "OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION=true is set, but" in message, message
    assert "OPEN_SANDBOX_ATTEST_ISOLATION=hardware-virtualized" in message, message
    assert osfake.stats()["created"] == 0


def test_dns_only_egress_is_refused_and_the_sandbox_deleted(osfake: OsFake) -> None:
    osfake.configure(egress_mode="dns")
    run = lfx_run(os_env(osfake), "print(1)")
    assert run.returncode != 0
    assert 'mode = \\"dns+nft\\"' in run.stdout or 'mode = "dns+nft"' in run.stdout, run.stdout[-2000:]
    assert OS_KEY not in run.stdout + run.stderr
    stats = osfake.wait_settled()
    assert stats["created"] == 1


def test_reap_deletes_only_this_deployments_old_sandboxes(osfake: OsFake, monkeypatch: pytest.MonkeyPatch) -> None:
    from langflow_sandbox_createos import _native

    def create(created_by: str) -> str:
        body = json.dumps(
            {
                "image": {"uri": "python:3.12-slim"},
                "entrypoint": ["tail", "-f", "/dev/null"],
                "resourceLimits": {"cpu": "1", "memory": "256Mi"},
                "timeout": 600,
                "metadata": {"created-by": created_by},
            }
        ).encode()
        request = urllib.request.Request(
            f"{osfake.url}/v1/sandboxes",
            data=body,
            method="POST",
            headers={"OPEN-SANDBOX-API-KEY": OS_KEY, "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback
            return json.loads(response.read())["id"]

    ours = create("langflow")
    theirs = create("someone-else")
    for name, value in os_env(osfake).items():
        if name.startswith("OPEN_SANDBOX_"):
            monkeypatch.setenv(name, value)
    assert _native.opensandbox_reap(older_than_seconds=3600) == []
    assert _native.opensandbox_reap(older_than_seconds=0, dry_run=True) == [ours]
    assert osfake.stats()["live"] == 2
    assert _native.opensandbox_reap(older_than_seconds=0) == [ours]
    stats = osfake.stats()
    assert stats["live"] == 1
    assert theirs


def test_reap_command_for_opensandbox(osfake: OsFake) -> None:
    import sys

    env = os_env(osfake)
    dry = subprocess.run(
        [sys.executable, "-m", "langflow_sandbox_createos", "reap", "--provider", "opensandbox", "--older-than", "0s", "--dry-run"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert dry.returncode == 0, dry.stderr
    assert "0 OpenSandbox sandbox(es) older than 0s would be deleted (dry run)" in dry.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "langflow_sandbox_createos", "reap", "--provider", "opensandbox", "--older-than", "soon"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2
    assert "--older-than" in bad.stderr


def test_an_opensandbox_run_writes_a_usage_record_naming_its_provider(osfake: OsFake, tmp_path: Any) -> None:
    usage = tmp_path / "usage.jsonl"
    ran = lfx_run(os_env(osfake, CREATEOS_USAGE_LOG=str(usage)), "print(6*7)")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.result == {"result": "42"}
    osfake.wait_settled()
    records = [json.loads(line) for line in usage.read_text().splitlines()]
    assert len(records) == 1, records
    r = records[0]
    assert r["provider"] == "opensandbox"
    assert (r["surface"], r["egress"], r["runs"], r["outcome"], r["reason"]) == ("backend", "none", 1, "ok", "run-end")
    assert r["worker"] > 0 and r["host"]
    assert OS_KEY not in usage.read_text()


def test_an_opensandbox_run_is_counted_under_its_provider_and_createos_series_stay_as_they_are(osfake: OsFake) -> None:
    pytest.importorskip("prometheus_client", reason="prometheus_client is not installed (scripts/test installs it)")
    script = """
import json
from prometheus_client import REGISTRY
from langflow_sandbox_createos import metrics
from langflow_sandbox_createos.opensandbox import create_backend
b = create_backend()
b.run("print(1)")
metrics.drain()
out = []
for m in REGISTRY.collect():
    for s in m.samples:
        if s.name.startswith(("createos_runs_total", "langflow_sandbox_runs_total", "langflow_sandbox_guests_live", "createos_guests_live")) and s.value:
            out.append([s.name, s.labels, s.value])
print("SAMPLES " + json.dumps(out))
"""
    proc = run_python(script, os_env(osfake))
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("SAMPLES "))
    samples = json.loads(line.removeprefix("SAMPLES "))
    runs = [s for s in samples if s[0] == "langflow_sandbox_runs_total"]
    assert runs == [["langflow_sandbox_runs_total", {"provider": "opensandbox", "surface": "backend", "outcome": "ok"}, 1.0]], samples
    assert not [s for s in samples if s[0].startswith("createos_")], samples
    osfake.wait_settled()


def _program_started(osfake: OsFake) -> bool:
    stats = osfake.stats()
    # The isolation probe's command, then the program's.
    return stats["live"] == 1 and stats["commands"] >= 2


def test_sigterm_to_lfx_run_deletes_the_running_sandbox(osfake: OsFake) -> None:
    env = os_env(osfake, LANGFLOW_SANDBOX_TIMEOUT_SECONDS="120")
    run = signal_lfx_run(env, "import time\ntime.sleep(100)\nprint('late')", signal.SIGTERM, lambda: _program_started(osfake))
    # It dies of SIGTERM, as it would have without the backend, reports no result, and its
    # sandbox is gone (not left to the server-side timeout).
    assert run.returncode == -signal.SIGTERM, (run.returncode, run.stdout[-2000:], run.stderr[-3000:])
    assert '"success"' not in run.stdout
    stats = osfake.wait_settled(timeout=5)
    assert stats["created"] == 1 and stats["deleted"] == 1, stats



def test_code_or_env_holding_a_plugin_secret_is_refused_before_any_sandbox(osfake: OsFake) -> None:
    """Issue 45 item 4: the OpenSandbox backend makes the same withheld check as CreateOS's:
    either API key, the gateway secret or a store password, in the code or in an env value (or
    a withheld name in the env), refuses the run before any sandbox exists."""
    createos_key = "skp_e2e_0f3a9c7d2b81e6"
    gateway = "e2e-os-gateway-secret-4b7e19d2c0"
    password = "e2e-os-store-passw0rd-8c2a"
    env = os_env(
        osfake,
        CREATEOS_API_KEY=createos_key,
        CREATEOS_GATEWAY_SECRET=gateway,
        CREATEOS_ADMISSION_STORE=f"redis://:{password}@127.0.0.1:1/0",
        CREATEOS_ADMISSION_STORE_ON_FAILURE="local",
    )
    secrets = {
        "OPEN_SANDBOX_API_KEY": OS_KEY,
        "CREATEOS_API_KEY": createos_key,
        "CREATEOS_GATEWAY_SECRET": gateway,
        "CREATEOS_ADMISSION_STORE": password,
    }
    cases: list[tuple[str, dict[str, str] | None]] = []
    for value in secrets.values():
        cases.append((f"print('{value}')", None))
        cases.append(("print('hi')", {"TOKEN": f"Bearer {value}"}))
    cases.append(("print('hi')", {"OPEN_SANDBOX_DOMAIN": "x"}))
    cases.append(("print('the flow mentions langflow and its own key sk-own-0000')", {"OPENAI_API_KEY": "sk-own-0000"}))
    seen, proc = backend_runs(env, cases, module="langflow_sandbox_createos.opensandbox")
    for i, setting in enumerate(secrets):
        in_code, in_env = seen[2 * i], seen[2 * i + 1]
        assert in_code.startswith(("SandboxRefusedError: ", "CreateOSUnavailableError: ")), (setting, in_code)
        assert "the code to run holds" in in_code and setting in in_code, (setting, in_code)
        assert "`TOKEN`" in in_env and setting in in_env, (setting, in_env)
    assert "`OPEN_SANDBOX_DOMAIN`" in seen[-2] and "configures the sandbox itself" in seen[-2], seen
    assert seen[-1] == "ran", seen
    shown = "\n".join(seen) + proc.stderr
    for value in (*secrets.values(), f"redis://:{password}"):
        assert value not in shown, value
    stats = osfake.wait_settled()
    assert stats["created"] == 1, stats


def test_ctrl_c_of_lfx_run_deletes_the_sandbox_and_exits_at_once(osfake: OsFake) -> None:
    # lfx runs the sandbox call on a worker thread (asyncio.to_thread under anyio.run); only
    # the main thread sees Python's KeyboardInterrupt. The run must still be cancelled: its
    # sandbox deleted and the process gone well before the program's 90 s.
    env = os_env(osfake, LANGFLOW_SANDBOX_TIMEOUT_SECONDS="120")
    run = signal_lfx_run(env, "import time\ntime.sleep(90)", signal.SIGINT, lambda: _program_started(osfake), settle=0.5)
    assert run.returncode != 0
    assert run.took < 15, run.took
    stats = osfake.wait_settled(timeout=5)
    assert stats["created"] == 1 and stats["live"] == 0, stats
