"""The Python Interpreter flow through ``lfx run``, with the createos backend against the fake."""

from __future__ import annotations

import pytest

from conftest import Fake, backend_env, lfx_run


def test_flow_prints_guest_output_and_destroys_the_guest(clean_fake: Fake) -> None:
    run = lfx_run(backend_env(clean_fake), "print(6*7)")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.json["success"] is True
    assert run.result == {"result": "42"}
    stats = clean_fake.wait_settled()
    # The code really went through the control plane: one guest, created and destroyed.
    assert stats["created"] == 1
    assert stats["requests"].get("create", 0) == 1
    assert stats["live"] == 0


def test_warm_pool_gives_the_same_result_and_leaves_no_guest_at_exit(clean_fake: Fake) -> None:
    off = lfx_run(backend_env(clean_fake), "print(6*7)")
    on = lfx_run(backend_env(clean_fake, CREATEOS_SANDBOX_WARM_POOL="2"), "print(6*7)")
    assert off.returncode == 0, off.stderr[-3000:]
    assert on.returncode == 0, on.stderr[-3000:]
    assert on.json["success"] is True
    assert on.result == off.result == {"result": "42"}
    # The pool's idle guests (refilled in the background after the run) were destroyed when
    # the process exited.
    stats = clean_fake.wait_settled()
    assert stats["live"] == 0
    assert stats["created"] <= 4


def test_global_imports_preamble_runs_in_the_guest(clean_fake: Fake) -> None:
    # The flow's Global Imports is "math": lfx prepends `import math`, the guest executes it.
    run = lfx_run(backend_env(clean_fake), "print(math.sqrt(16))")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.result == {"result": "4.0"}


def test_user_code_failure_is_a_result_not_an_error(clean_fake: Fake) -> None:
    code = "import sys\nsys.stderr.write('guest says no')\nsys.exit(3)"
    run = lfx_run(backend_env(clean_fake), code)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.json["success"] is True
    assert run.result == {"error": "guest says no"}
    assert clean_fake.wait_settled()["created"] == 1


def test_timeout_reads_timed_out_and_destroys_the_guest(clean_fake: Fake) -> None:
    env = backend_env(clean_fake, LANGFLOW_SANDBOX_TIMEOUT_SECONDS="2")
    run = lfx_run(env, "import time\nprint('started', flush=True)\ntime.sleep(120)")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "timed out" in run.result["error"]
    stats = clean_fake.wait_settled()
    assert stats["created"] == 1
    assert stats["live"] == 0


# Each configuration below must fail closed: lfx reports a build error of the Python
# Interpreter with the refusal's reason, nothing runs in the Langflow process, and no guest is
# created. `names` are words the reason must contain so an operator knows what to fix.
REFUSALS = [
    pytest.param({"CREATEOS_SANDBOX_API_KEY": None}, ["CREATEOS_SANDBOX_API_KEY"], id="no-key"),
    pytest.param(
        {"LANGFLOW_SANDBOX_ALLOW_NETWORK": "true", "LANGFLOW_SANDBOX_ALLOWED_DOMAINS": "pypi.org"},
        ["LANGFLOW_SANDBOX_ALLOWED_DOMAINS"],
        id="domain-allowlist",
    ),
    pytest.param(
        {"LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS": None},
        ["LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS"],
        id="egress-off-without-link-local-opt-in",
    ),
    pytest.param({"CREATEOS_SANDBOX_SHAPE": "s-9vcpu-nope"}, ["CREATEOS_SANDBOX_SHAPE"], id="unknown-shape"),
    pytest.param(
        {"CREATEOS_SANDBOX_SHAPE": "s-1vcpu-256mb", "LANGFLOW_SANDBOX_MEMORY_MB": "1024"},
        ["CREATEOS_SANDBOX_SHAPE"],
        id="shape-below-memory-floor",
    ),
    pytest.param(
        # No shape has max(memory, 4096) MiB: never round down to a smaller guest.
        {"LANGFLOW_SANDBOX_MEMORY_MB": "20000"},
        ["LANGFLOW_SANDBOX_MEMORY_MB"],
        id="no-shape-large-enough",
    ),
    pytest.param({"CREATEOS_SANDBOX_BASE_URL": "not a url"}, ["CREATEOS_SANDBOX_BASE_URL"], id="bad-base-url"),
    pytest.param({"CREATEOS_SANDBOX_WARM_POOL": "-1"}, ["CREATEOS_SANDBOX_WARM_POOL"], id="negative-warm-pool"),
    pytest.param({"CREATEOS_SANDBOX_WARM_POOL": "65"}, ["CREATEOS_SANDBOX_WARM_POOL"], id="too-large-warm-pool"),
    pytest.param(
        {"LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS": "perhaps"},
        ["LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS"],
        id="bad-boolean",
    ),
]


@pytest.mark.parametrize(("overrides", "names"), REFUSALS)
def test_refusals_fail_closed_with_lfx_error(clean_fake: Fake, overrides: dict[str, str | None], names: list[str]) -> None:
    run = lfx_run(backend_env(clean_fake, **overrides), "print('must not run')")
    assert run.returncode == 1, (run.stdout[-2000:], run.stderr[-2000:])
    outcome = run.json
    assert outcome["success"] is False
    assert outcome["exception_type"] == "ComponentBuildError"
    message = outcome["exception_message"]
    assert "Python Interpreter" in message
    for name in names:
        assert name in message
    stats = clean_fake.stats()
    assert stats["created"] == 0, stats


def test_out_of_range_lfx_setting_fails_closed(clean_fake: Fake) -> None:
    # lfx validates its own settings (1..300 s); the flow must not run at all.
    run = lfx_run(backend_env(clean_fake, LANGFLOW_SANDBOX_TIMEOUT_SECONDS="0"), "print('must not run')")
    assert run.returncode == 1
    assert run.json["success"] is False
    assert clean_fake.stats()["created"] == 0
    # lfx itself says only "Settings service not found"; the backend, imported while lfx builds
    # its settings, names the variable and lfx's own reason, once.
    assert run.json["exception_message"] == "Settings service not found", run.json
    named = [line for line in run.stderr.splitlines() if "LANGFLOW_SANDBOX_TIMEOUT_SECONDS='0' refused" in line]
    assert len(named) == 1, run.stderr[-3000:]
    assert "greater than or equal to 1" in named[0] and "fix or unset" in named[0], named[0]
