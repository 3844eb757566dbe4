"""``LANGFLOW_EXECUTOR_KIND=opensandbox`` through ``lfx run`` against the OpenSandbox fake.

The fake (``cargo build -p opensandbox-fake``) runs as a Kubernetes server with a Kata runtime
whose guests' ``python3`` is this venv's (lfx is there); the executor is the package's second
``lfx.executors`` entry point. The same flow gives the same answer as on the CreateOS fake and
leaves no sandbox; without the operator's attestation (or the container opt-in) the run is
refused before any sandbox exists.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import E2E, OS_KEY, Fake, OsFake, run_python, venv_bin, with_overrides
from test_executor import POOLED_ARUN, SHOUT, executor_env, lfx_run_json


@pytest.fixture
def osfake(osfake_guests: OsFake) -> OsFake:
    osfake_guests.reset()
    return osfake_guests


def os_executor_env(osfake: OsFake, **overrides: str | None) -> dict[str, str]:
    """What an operator sets for the OpenSandbox executor (no CreateOS setting at all)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CREATEOS_", "LANGFLOW_", "OPEN_SANDBOX_"))}
    env.update(
        {
            "LANGFLOW_EXECUTOR_KIND": "opensandbox",
            "OPEN_SANDBOX_DOMAIN": osfake.url,
            "OPEN_SANDBOX_API_KEY": OS_KEY,
            "OPEN_SANDBOX_SERVER_UNREACHABLE": "true",
            "OPEN_SANDBOX_ATTEST_ISOLATION": "hardware-virtualized",
            "OPEN_SANDBOX_RUNTIME_CLASS": "kata-qemu",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return with_overrides(env, overrides)


def test_lfx_run_gives_the_createos_answer_and_leaves_no_sandbox(osfake: OsFake, clean_fake: Fake) -> None:
    on_createos = lfx_run_json(executor_env(clean_fake), SHOUT, "from the cli")
    on_opensandbox = lfx_run_json(os_executor_env(osfake), SHOUT, "from the cli")
    assert on_createos["result"] == "FROM THE CLI!"
    for key in ("result", "type", "component", "component_id", "success"):
        assert on_opensandbox[key] == on_createos[key], (key, on_opensandbox, on_createos)
    stats = osfake.wait_settled()
    assert stats["created"] == 1
    # The probe, then the runner: the flow ran in the sandbox.
    assert stats["commands"] >= 2
    # Nothing reached CreateOS for the OpenSandbox run.
    assert clean_fake.wait_settled()["created"] == 1


def run_refused(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [venv_bin("lfx"), "run", str(SHOUT), "from the cli"],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        cwd=E2E,
        check=False,
    )


def test_without_the_attestation_the_run_is_refused_and_creates_nothing(osfake: OsFake) -> None:
    proc = run_refused(os_executor_env(osfake, OPEN_SANDBOX_ATTEST_ISOLATION=None, OPEN_SANDBOX_RUNTIME_CLASS=None))
    out = proc.stdout + proc.stderr
    assert "FROM THE CLI!" not in proc.stdout
    assert "OPEN_SANDBOX_ATTEST_ISOLATION" in out, out[-3000:]
    assert "OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION" in out, out[-3000:]
    # The provider-neutral class, not a CreateOS-named one.
    assert '"exception_type": "SandboxRefusedError"' in out, out[-3000:]
    assert OS_KEY not in out
    assert osfake.stats()["created"] == 0


def test_open_egress_on_a_loopback_server_needs_the_operators_word_or_a_policy(osfake: OsFake) -> None:
    """Issue 45: the executor's default (unrestricted egress) would let a guest reach the server.

    Reached over loopback, no egress rule can name the address a guest would use, so the run is
    refused before any sandbox exists, naming ``OPEN_SANDBOX_SERVER_UNREACHABLE``; deny-all
    egress (read back from the sidecar) runs the same flow.
    """
    proc = run_refused(os_executor_env(osfake, OPEN_SANDBOX_SERVER_UNREACHABLE=None))
    out = proc.stdout + proc.stderr
    assert "FROM THE CLI!" not in proc.stdout
    assert "OPEN_SANDBOX_SERVER_UNREACHABLE=true" in out, out[-3000:]
    assert '"exception_type": "SandboxRefusedError"' in out, out[-3000:]
    assert osfake.stats()["created"] == 0
    env = os_executor_env(osfake, OPEN_SANDBOX_SERVER_UNREACHABLE=None, CREATEOS_EXECUTOR_EGRESS="none")
    assert lfx_run_json(env, SHOUT, "denied")["result"] == "DENIED!"
    stats = osfake.wait_settled()
    assert stats["created"] == 1
    assert stats["policies"][-1] == {"defaultAction": "deny", "egress": []}, stats["policies"]


def test_the_container_opt_in_runs_the_flow_without_the_attestation(osfake: OsFake) -> None:
    env = os_executor_env(
        osfake,
        OPEN_SANDBOX_ATTEST_ISOLATION=None,
        OPEN_SANDBOX_RUNTIME_CLASS=None,
        OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION="true",
    )
    assert lfx_run_json(env, SHOUT, "opted in")["result"] == "OPTED IN!"
    assert osfake.wait_settled()["created"] == 1


def test_a_warm_pool_on_opensandbox_serves_the_next_flow_and_leaves_nothing(osfake: OsFake) -> None:
    # One process (as a server is): the first run warms the pool, the second takes its sandbox,
    # whose runner (an execd background command) imported lfx before the run.
    script = POOLED_ARUN.replace("sys.argv[1]", repr(str(SHOUT))).replace(
        "_native.NativeExecutor()", '_native.NativeExecutor("opensandbox")'
    )
    proc = run_python(script, os_executor_env(osfake, CREATEOS_EXECUTOR_WARM_POOL="1"), timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["texts"] == [["FIRST!"], ["SECOND!"]]
    pool = result["pool"]
    assert (pool["hits"], pool["misses"]) == (1, 1), pool
    # A cold sandbox, the pooled one, and the refill after it; all deleted at exit.
    stats = osfake.wait_settled()
    assert stats["created"] >= 2, stats
    assert OS_KEY not in proc.stdout + proc.stderr


def test_the_sandbox_is_created_from_open_sandbox_image_and_waits_ready_seconds(osfake: OsFake) -> None:
    # The server holds one image only; the executor must ask for OPEN_SANDBOX_IMAGE (never
    # CreateOS's rootfs, whether CREATEOS_EXECUTOR_ROOTFS is set or not).
    image = "registry.internal/lf-flows:1"
    osfake.configure(images=[image])
    env = os_executor_env(osfake, OPEN_SANDBOX_IMAGE=image, CREATEOS_EXECUTOR_ROOTFS="tpl_abc123")
    assert lfx_run_json(env, SHOUT, "from the cli")["result"] == "FROM THE CLI!"
    assert osfake.wait_settled()["created"] == 1
    # Another image: this Kubernetes server's pod cannot pull it. The 1.1.1 create answers 500
    # KUBERNETES::POD_FAILED ("... primary reason=ErrImagePull ..."): refused at once, naming
    # OPEN_SANDBOX_IMAGE, not retried as a transient failure, and nothing is left.
    proc = run_refused(os_executor_env(osfake, OPEN_SANDBOX_IMAGE="registry.internal/other:2"))
    out = proc.stdout + proc.stderr
    assert "FROM THE CLI!" not in proc.stdout
    assert "OPEN_SANDBOX_IMAGE" in out and "ErrImagePull" in out, out[-3000:]
    assert "retrying later" not in out.lower(), out[-3000:]
    assert '"exception_type": "SandboxRefusedError"' in out, out[-3000:]
    # A pod that stays Pending (a busy cluster): the run waits OPEN_SANDBOX_READY_SECONDS (not
    # CREATEOS_CONTROL_PLANE_RETRY_SECONDS), then fails naming OpenSandbox and that setting,
    # and leaves no sandbox.
    osfake.configure(pending_ms=60_000)
    env = os_executor_env(
        osfake, OPEN_SANDBOX_IMAGE=image, OPEN_SANDBOX_READY_SECONDS="2", CREATEOS_CONTROL_PLANE_RETRY_SECONDS="60"
    )
    proc = run_refused(env)
    out = proc.stdout + proc.stderr
    assert "FROM THE CLI!" not in proc.stdout
    assert "OPEN_SANDBOX_READY_SECONDS=2" in out and "OpenSandbox" in out, out[-3000:]
    assert '"exception_type": "SandboxFailedError"' in out, out[-3000:]
    stats = osfake.wait_settled()
    assert stats["created"] == 2 and stats["commands"] >= 2, stats
