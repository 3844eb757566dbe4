"""Secrets given as files (``<NAME>_FILE``, the Docker and Kubernetes secrets convention), and
what ``doctor`` says of where each secret comes from.

A secret in a file is not in the Langflow process's environment at all. The surfaces read it
through the one lookup every reader shares (``sandbox_core::vars::process_env``): here the
sandbox backend runs with its key from a file, both ways at once is a refusal naming both, and
``doctor`` names each secret's source and warns where a flow field could read one.
"""

from __future__ import annotations

from pathlib import Path

import json

from conftest import OS_KEY, Fake, OsFake, backend_env, backend_runs, lfx_run, run_doctor, run_python, start_fake
from test_withheld import SECRET_FLOW, arun_each, executor_env

OPEN_SANDBOX_KEY = "e2e-files-opensandbox-key-5be1"
GATEWAY_SECRET = "e2e-files-gateway-secret-0123456789abcdef"


def secret_file(tmp_path: Path, name: str, value: str) -> Path:
    """A secret file as Docker and Kubernetes write them: the value and a line break."""
    path = tmp_path / name
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


def test_the_backend_reads_its_key_from_a_file(clean_fake: Fake, tmp_path: Path) -> None:
    key = secret_file(tmp_path, "createos-key", clean_fake.key)
    env = backend_env(clean_fake, CREATEOS_SANDBOX_API_KEY=None, CREATEOS_SANDBOX_API_KEY_FILE=str(key))
    run = lfx_run(env, "print(6*7)")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.result == {"result": "42"}
    assert clean_fake.wait_settled()["created"] == 1


def test_a_secret_set_both_ways_is_refused_naming_both(clean_fake: Fake, tmp_path: Path) -> None:
    key = secret_file(tmp_path, "createos-key", clean_fake.key)
    env = backend_env(clean_fake, CREATEOS_SANDBOX_API_KEY_FILE=str(key))
    run = lfx_run(env, "print(6*7)")
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-3000:]
    assert "CREATEOS_SANDBOX_API_KEY and CREATEOS_SANDBOX_API_KEY_FILE are both set" in out, out[-3000:]
    assert clean_fake.stats()["created"] == 0


def test_the_opensandbox_backend_reads_its_key_from_a_file(osfake_server: OsFake, tmp_path: Path) -> None:
    from test_opensandbox_backend import os_env

    osfake_server.reset()
    key = secret_file(tmp_path, "opensandbox-key", OS_KEY)
    env = os_env(osfake_server, OPEN_SANDBOX_API_KEY=None, OPEN_SANDBOX_API_KEY_FILE=str(key))
    run = lfx_run(env, "print(6*7)")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.result == {"result": "42"}
    assert osfake_server.wait_settled()["created"] == 1
    # Both ways: refused naming both, no sandbox.
    osfake_server.reset()
    both = lfx_run(os_env(osfake_server, OPEN_SANDBOX_API_KEY_FILE=str(key)), "print(6*7)")
    out = both.stdout + both.stderr
    assert both.returncode == 1, out[-3000:]
    assert "OPEN_SANDBOX_API_KEY and OPEN_SANDBOX_API_KEY_FILE are both set" in out, out[-3000:]
    assert osfake_server.stats()["created"] == 0


CAPABILITIES = """
from langflow_sandbox_createos import _native
print("RESULT", _native.capabilities().supports_domain_allowlist)
"""


def test_the_gateway_secret_from_a_file_makes_the_backend_declare_domain_allowlists(tmp_path: Path) -> None:
    gateway = secret_file(tmp_path, "gateway-secret", GATEWAY_SECRET)
    base = {"CREATEOS_GATEWAY_URL": "http://10.20.30.40:3128"}
    from_file = run_python(CAPABILITIES, {**base, "CREATEOS_GATEWAY_SECRET_FILE": str(gateway)})
    assert "RESULT True" in from_file.stdout, (from_file.stdout, from_file.stderr[-2000:])
    without = run_python(CAPABILITIES, base)
    assert "RESULT False" in without.stdout, (without.stdout, without.stderr[-2000:])


def test_the_backend_refuses_code_or_env_carrying_a_secret_read_from_a_file(clean_fake: Fake, tmp_path: Path) -> None:
    key = secret_file(tmp_path, "createos-key", clean_fake.key)
    gateway = secret_file(tmp_path, "gateway-secret", GATEWAY_SECRET)
    env = backend_env(
        clean_fake,
        CREATEOS_SANDBOX_API_KEY=None,
        CREATEOS_SANDBOX_API_KEY_FILE=str(key),
        CREATEOS_GATEWAY_SECRET_FILE=str(gateway),
    )
    cases = [
        (f"print('{clean_fake.key}')", None),
        ("print('hi')", {"TOKEN": f"Bearer {GATEWAY_SECRET}"}),
        ("print('hi')", None),
    ]
    seen, proc = backend_runs(env, cases)
    assert seen[0].startswith("SandboxRefusedError: the code to run holds the value of CREATEOS_SANDBOX_API_KEY"), seen
    assert "`TOKEN`" in seen[1] and "CREATEOS_GATEWAY_SECRET" in seen[1], seen
    assert seen[2] == "ran", seen
    for value in (clean_fake.key, GATEWAY_SECRET):
        assert value not in "\n".join(seen) + proc.stderr
    assert clean_fake.wait_settled()["created"] == 1


def test_the_executor_withholds_a_key_read_from_a_file(tmp_path: Path) -> None:
    # The flow's own variable holds, on this host, the value of the key the executor read from
    # its file: refused by value, and the guest gets no job.
    log = tmp_path / "requests.jsonl"
    fake = start_fake(request_log=log)
    try:
        key = secret_file(tmp_path, "createos-key", fake.key)
        env = executor_env(fake, EXEC_TEST_CREDENTIAL=fake.key)
        del env["CREATEOS_SANDBOX_API_KEY"], env["CREATEOS_API_KEY"]
        env["CREATEOS_SANDBOX_API_KEY_FILE"] = str(key)
        seen, _ = arun_each(env, [SECRET_FLOW])
        assert seen[0].get("type") == "SandboxRefusedError", seen
        assert "the value the host resolved for the field `api_key` of vertex `secret`" in seen[0]["message"], seen
        assert "CREATEOS_SANDBOX_API_KEY" in seen[0]["message"], seen
        assert fake.wait_settled()["live"] == 0
        # The key from the file opened the session (the fake accepted it), and no job went out.
        requests = [json.loads(line) for line in log.read_text().splitlines()]
        assert any(r["route"] == "create" for r in requests), requests
        assert not [r for r in requests if r["route"] == "upload" and "lfx_job.json" in json.dumps(r["query"])]
    finally:
        fake.stop()


def test_doctor_says_where_each_secret_comes_from(clean_fake: Fake, tmp_path: Path) -> None:
    key = secret_file(tmp_path, "createos-key", clean_fake.key)
    gateway = secret_file(tmp_path, "gateway-secret", GATEWAY_SECRET)
    env = backend_env(
        clean_fake,
        CREATEOS_SANDBOX_API_KEY=None,
        CREATEOS_SANDBOX_API_KEY_FILE=str(key),
        CREATEOS_GATEWAY_SECRET_FILE=str(gateway),
        OPEN_SANDBOX_API_KEY=OPEN_SANDBOX_KEY,
    )
    proc = run_doctor(env)
    out = proc.stdout
    assert proc.returncode == 0, (out[-3000:], proc.stderr[-2000:])
    assert f"CREATEOS_SANDBOX_API_KEY: read from the file CREATEOS_SANDBOX_API_KEY_FILE names ({key})" in out, out
    assert "CREATEOS_GATEWAY_SECRET: read from the file CREATEOS_GATEWAY_SECRET_FILE names" in out, out
    assert "OPEN_SANDBOX_API_KEY: from the environment; no flow field can name it" in out, out
    assert "are on lfx's deny-list in every process that imports the package" in out, out
    # The key from the file is the one the control plane accepted.
    assert clean_fake.stats()["requests"].get("whoami", 0) >= 1
    for value in (clean_fake.key, GATEWAY_SECRET, OPEN_SANDBOX_KEY):
        assert value not in out + proc.stderr


def test_doctor_refuses_a_secret_set_both_ways_or_an_unreadable_file(clean_fake: Fake, tmp_path: Path) -> None:
    gateway = secret_file(tmp_path, "gateway-secret", GATEWAY_SECRET)
    env = backend_env(
        clean_fake,
        CREATEOS_GATEWAY_SECRET=GATEWAY_SECRET,
        CREATEOS_GATEWAY_SECRET_FILE=str(gateway),
        OPEN_SANDBOX_API_KEY_FILE=str(tmp_path / "absent"),
    )
    proc = run_doctor(env)
    out = proc.stdout
    assert proc.returncode == 1, (out[-3000:], proc.stderr[-2000:])
    assert "CREATEOS_GATEWAY_SECRET and CREATEOS_GATEWAY_SECRET_FILE are both set" in out, out
    assert "OPEN_SANDBOX_API_KEY_FILE=" in out and "cannot be opened" in out, out
    assert GATEWAY_SECRET not in out + proc.stderr


# doctor in a process where lfx's deny-list has an unknown shape: nothing covers the names.
DOCTOR_UNKNOWN_SHAPE = """
import sys, types
fake = types.ModuleType("lfx.utils.env_var_security")
fake._RESERVED_ENV_PREFIXES = ("LANGFLOW_",)
fake._RESERVED_ENV_NAMES = frozenset()
fake.is_protected_env_var = lambda name: name.upper().startswith(fake._RESERVED_ENV_PREFIXES)
fake.safe_getenv = lambda name: None
import lfx.utils
sys.modules["lfx.utils.env_var_security"] = fake
from langflow_sandbox_createos.__main__ import main
sys.exit(main(["doctor", "--surface", "component"]))
"""


def test_doctor_warns_of_a_secret_in_the_environment_nothing_covers(clean_fake: Fake) -> None:
    env = backend_env(clean_fake, OPEN_SANDBOX_API_KEY=OPEN_SANDBOX_KEY)
    proc = run_python(DOCTOR_UNKNOWN_SHAPE, env)
    out = proc.stdout
    assert "this package's names could not be put on lfx's deny-list" in out, (out[-3000:], proc.stderr[-2000:])
    assert "CREATEOS_SANDBOX_API_KEY sits in the environment and lfx's env-var fallback is on" in out, out
    assert "OPEN_SANDBOX_API_KEY sits in the environment" in out, out
    assert OPEN_SANDBOX_KEY not in out + proc.stderr


def test_doctor_refuses_langflow_copying_a_plugin_secret_into_users_variables(clean_fake: Fake) -> None:
    env = backend_env(clean_fake, LANGFLOW_VARIABLES_TO_GET_FROM_ENVIRONMENT="OPENAI_API_KEY,CREATEOS_SANDBOX_API_KEY")
    proc = run_doctor(env)
    assert proc.returncode == 1, (proc.stdout[-3000:], proc.stderr[-2000:])
    assert "LANGFLOW_VARIABLES_TO_GET_FROM_ENVIRONMENT lists CREATEOS_SANDBOX_API_KEY" in proc.stdout, proc.stdout
    assert clean_fake.key not in proc.stdout + proc.stderr
