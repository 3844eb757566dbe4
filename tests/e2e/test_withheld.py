"""The operator's secrets are not a flow's: no surface hands a guest what configures the plugin.

A flow can name a plugin setting in a field that loads from a global variable (bare lfx, and
Langflow with its default ``LANGFLOW_FALLBACK_TO_ENV_VAR=true``, resolve an unknown name from the
host's environment), or carry a secret's value some node resolved, into code a guest runs. Each
surface refuses both before anything of the run reaches a guest, naming the field and the
setting and never showing the value; the fake's request log shows no job and no secret.

The Langflow-server side of the same promise (``/api/v1/run`` with the fallback on) is in
``test_langflow_server.py``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import E2E, Fake, backend_env, backend_runs, script_result, start_fake, venv_bin

SECRET_FLOW = E2E / "flows" / "secret_flow.json"
COMPONENT_FLOW = E2E / "flows" / "component_flow.json"
GATEWAY_SECRET = "e2e-withheld-gateway-secret-0123456789abcdef"
STORE_PASSWORD = "e2e-store-passw0rd-5d1c"
STORE = f"redis://:{STORE_PASSWORD}@127.0.0.1:1/0"

# Every plugin secret a flow might ask for by name, each with a value in the host's environment.
NAMES = ["CREATEOS_SANDBOX_API_KEY", "CREATEOS_API_KEY", "CREATEOS_GATEWAY_SECRET", "CREATEOS_ADMISSION_STORE"]


def executor_env(fake: Fake, **extra: str | None) -> dict[str, str]:
    """The executor's environment, with the gateway secret and a store URL the flow must not get
    (the store is never reached: the refusal comes first)."""
    return backend_env(
        fake,
        LANGFLOW_SANDBOX_BACKEND=None,
        LANGFLOW_SANDBOX_BACKEND_PLUGINS=None,
        LANGFLOW_EXECUTOR_KIND="createos",
        CREATEOS_API_KEY=fake.key,
        CREATEOS_GATEWAY_SECRET=GATEWAY_SECRET,
        **extra,
    )


def asking_for(tmp_path: Path, name: str) -> Path:
    """A copy of the secret-probe flow whose credential field names ``name``."""
    data = json.loads(SECRET_FLOW.read_text())
    for node in data["data"]["nodes"]:
        field = node["data"]["node"]["template"].get("api_key")
        if field is not None:
            field["value"] = name
    out = tmp_path / f"asks-{name.lower()}.json"
    out.write_text(json.dumps(data))
    return out


# One interpreter runs the flow once per file given, and prints what each run raised.
ARUN_EACH = """
import asyncio, json, sys
from lfx.graph import Graph

async def main():
    seen = []
    for path in sys.argv[1:]:
        graph = Graph.from_payload(json.load(open(path)))
        try:
            outputs = await graph.arun([{"input_value": "probe"}])
            seen.append({"ok": [r.results["message"].text for run in outputs for r in run.outputs]})
        except Exception as exc:
            seen.append({"type": type(exc).__name__, "message": str(exc)})
    print("RESULT " + json.dumps(seen))

asyncio.run(main())
"""


def arun_each(env: dict[str, str], flows: list[Path]) -> tuple[list[dict[str, Any]], str]:
    seen, proc = script_result(ARUN_EACH, [str(f) for f in flows], env)
    return seen, proc.stdout + proc.stderr


def assert_nothing_secret(text: str, fake: Fake) -> None:
    for secret in (fake.key, GATEWAY_SECRET, STORE_PASSWORD):
        assert secret not in text, f"a secret appeared in: {text[-2000:]}"


def test_the_executor_refuses_a_flow_asking_for_a_plugin_setting_before_any_guest(
    clean_fake: Fake, tmp_path: Path
) -> None:
    flows = [asking_for(tmp_path, name) for name in NAMES]
    seen, output = arun_each(executor_env(clean_fake, CREATEOS_ADMISSION_STORE=STORE), flows)
    for name, run in zip(NAMES, seen, strict=True):
        assert run.get("type") == "SandboxRefusedError", (name, run)
        assert f"`{name}`" in run["message"] and "configures the sandbox itself" in run["message"], run
        assert "the field `api_key` of Secret Probe (vertex `secret`)" in run["message"], run
    assert_nothing_secret(output, clean_fake)
    stats = clean_fake.stats()
    assert stats["created"] == 0 and not stats["requests"], stats


def test_lfx_run_names_the_refused_variable(clean_fake: Fake, tmp_path: Path) -> None:
    proc = subprocess.run(
        [venv_bin("lfx"), "run", str(asking_for(tmp_path, "CREATEOS_SANDBOX_API_KEY")), "probe"],
        capture_output=True,
        text=True,
        env=executor_env(clean_fake),
        timeout=240,
        cwd=E2E,
        check=False,
    )
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "`CREATEOS_SANDBOX_API_KEY`" in proc.stdout + proc.stderr, (proc.stdout[-2000:], proc.stderr[-2000:])
    assert_nothing_secret(proc.stdout + proc.stderr, clean_fake)
    assert clean_fake.stats()["created"] == 0


def test_the_executor_refuses_the_keys_value_under_another_name_and_sends_no_job(tmp_path: Path) -> None:
    # The flow's own variable name, whose value on this host happens to be the sandbox's key
    # (lfx resolves it from the environment): refused by value; the guest gets no job.
    log = tmp_path / "requests.jsonl"
    fake = start_fake(request_log=log)
    try:
        env = executor_env(fake, EXEC_TEST_CREDENTIAL=fake.key)
        seen, output = arun_each(env, [SECRET_FLOW])
        assert seen[0].get("type") == "SandboxRefusedError", seen
        message = seen[0]["message"]
        assert "the value the host resolved for the field `api_key` of vertex `secret`" in message, message
        assert "CREATEOS_SANDBOX_API_KEY" in message, message
        assert_nothing_secret(output, fake)
        assert fake.wait_settled()["live"] == 0
        requests = [json.loads(line) for line in log.read_text().splitlines()]
        jobs = [r for r in requests if r["route"] == "upload" and "lfx_job.json" in json.dumps(r["query"])]
        assert jobs == []
        assert fake.key not in log.read_text()
    finally:
        fake.stop()


def test_the_component_refuses_code_carrying_the_key(clean_fake: Fake) -> None:
    env = backend_env(clean_fake, LANGFLOW_SANDBOX_BACKEND=None, LANGFLOW_SANDBOX_BACKEND_PLUGINS=None)
    code = f"print('{clean_fake.key}')"
    proc = subprocess.run(
        [venv_bin("lfx"), "run", str(COMPONENT_FLOW), code],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        cwd=E2E,
        check=False,
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, proc.stdout[-2000:]
    assert "Python Code (python_code) holds the value of CREATEOS_SANDBOX_API_KEY" in text, text[-3000:]
    assert_nothing_secret(text.replace(code, ""), clean_fake)
    assert clean_fake.stats()["created"] == 0


def test_the_backend_refuses_code_or_env_carrying_a_plugin_secret(clean_fake: Fake) -> None:
    env = backend_env(clean_fake, CREATEOS_GATEWAY_SECRET=GATEWAY_SECRET)
    cases = [
        (f"print('{clean_fake.key}')", None),
        ("print('hi')", {"CREATEOS_GATEWAY_SECRET": "x"}),
        ("print('hi')", {"TOKEN": f"Bearer {GATEWAY_SECRET}"}),
        ("print('hi')", {"OPENAI_API_KEY": "sk-the-flows-own-0000"}),
    ]
    seen, proc = backend_runs(env, cases)
    assert seen[0].startswith("SandboxRefusedError: the code to run holds the value of CREATEOS_SANDBOX_API_KEY"), seen
    assert "`CREATEOS_GATEWAY_SECRET`" in seen[1] and "configures the sandbox itself" in seen[1], seen
    assert "`TOKEN`" in seen[2] and "CREATEOS_GATEWAY_SECRET" in seen[2], seen
    assert seen[3] == "ran", seen
    assert_nothing_secret("\n".join(seen) + proc.stderr, clean_fake)
    assert clean_fake.wait_settled()["created"] == 1


@pytest.mark.parametrize("name", ["LANGFLOW_DATABASE_URL", "LANGFLOW_REDIS_URL"])
def test_langflows_own_store_urls_are_withheld_too(clean_fake: Fake, tmp_path: Path, name: str) -> None:
    seen, _ = arun_each(executor_env(clean_fake, **{name: f"postgresql://lf:{STORE_PASSWORD}@db/lf"}), [asking_for(tmp_path, name)])
    assert seen[0].get("type") == "SandboxRefusedError" and f"`{name}`" in seen[0]["message"], seen
    assert clean_fake.stats()["created"] == 0


COMPOSE_URL = "postgresql://langflow:langflow@127.0.0.1:1/langflow"


def test_a_word_like_store_password_refuses_no_chat_flow_and_answers_no_word_list(clean_fake: Fake) -> None:
    """Issue 45 item 3: under Langflow's own docker-compose URL (password ``langflow``), a Chat
    flow (whose components' code names docs.langflow.org) runs through the executor, and code
    carrying a word list with the password in it runs through the backend: the author's text
    is not an oracle for the password. The password given whole is still refused."""
    env = executor_env(clean_fake, LANGFLOW_DATABASE_URL=COMPOSE_URL, CREATEOS_ADMISSION_STORE_ON_FAILURE="local")
    seen, output = arun_each(env, [E2E / "flows" / "shout_flow.json"])
    assert seen == [{"ok": ["PROBE!"]}], (seen, output[-3000:])
    words = " ".join(["alpha", "postgres", "langflow", "secret", "admin", "changeme"] * 40)
    backend = backend_env(clean_fake, LANGFLOW_DATABASE_URL=COMPOSE_URL, CREATEOS_ADMISSION_STORE_ON_FAILURE="local")
    cases = [
        (f"words = '{words}'\nprint(len(words.split()))", None),
        ("langflow", None),
        ("print('hi')", {"DSN": COMPOSE_URL}),
    ]
    seen, _ = backend_runs(backend, cases)
    assert seen[0] == "ran", seen
    assert "the password in LANGFLOW_DATABASE_URL" in seen[1], seen
    assert "`DSN`" in seen[2] and "LANGFLOW_DATABASE_URL" in seen[2], seen
    assert clean_fake.wait_settled()["created"] == 2
