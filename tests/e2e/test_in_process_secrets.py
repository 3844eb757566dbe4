"""In the Langflow process itself, a flow reads none of this package's settings by name.

A field that loads a global variable Langflow does not have is resolved from the process
environment (``LANGFLOW_FALLBACK_TO_ENV_VAR``, default true; bare lfx always), through lfx's
``safe_getenv`` and its deny-list. This package puts its own names (``CREATEOS_*``,
``OPEN_SANDBOX_*``) on that list in every process that imports it (``env_fallback``), so a Text
Input naming ``CREATEOS_SANDBOX_API_KEY`` gets what lfx gives a name on its own list
(``LANGFLOW_SECRET_KEY``), in an in-process run with the component templates loaded as a server
loads them, with custom components on or off. The issue-45 reproduction, held.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest

from conftest import REPO, http_json, lfx_serve, run_python, script_result

SECRETS = {
    "CREATEOS_SANDBOX_API_KEY": "e2e-inproc-createos-key-7f3a9c",
    "CREATEOS_API_KEY": "e2e-inproc-sdk-key-41b2d8",
    "OPEN_SANDBOX_API_KEY": "e2e-inproc-opensandbox-key-c05e11",
    "CREATEOS_GATEWAY_SECRET": "e2e-inproc-gateway-secret-0123456789abcdef",
}
PLAIN = ("E2E_INPROC_PLAIN", "e2e-inproc-plain-value")

# Loads the component templates as Langflow's start-up does, then runs, in-process, one flow per
# name: Text Input (its text loading the global variable NAME) -> Chat Output.
IN_PROCESS = """
import asyncio, json, sys

async def main():
    from lfx.interface.components import get_and_cache_all_types_dict
    from lfx.services.deps import get_settings_service

    await get_and_cache_all_types_dict(get_settings_service())
    # What the template load alone did, before any run builds lfx's executor service.
    from lfx.utils.env_var_security import safe_getenv
    loaded = "langflow_sandbox_createos" in sys.modules
    guarded = safe_getenv("CREATEOS_SANDBOX_API_KEY") is None

    from lfx.components.input_output import ChatOutput, TextInputComponent
    from lfx.graph import Graph

    seen = {}
    for name in sys.argv[1:]:
        text_in = TextInputComponent(_id="text_in")
        text_in.set(input_value=name)
        chat_out = ChatOutput(_id="chat_out")
        chat_out.set(input_value=text_in.text_response)
        payload = json.loads(json.dumps(Graph(text_in, chat_out).dump()))
        for node in payload["data"]["nodes"]:
            if node["id"] == "text_in":
                node["data"]["node"]["template"]["input_value"]["load_from_db"] = True
        graph = Graph.from_payload(payload)
        try:
            outputs = await graph.arun([{"input_value": ""}], fallback_to_env_vars=True)
            seen[name] = {"ok": [r.results["message"].text for run in outputs for r in run.outputs]}
        except Exception as exc:
            seen[name] = {"error": type(exc).__name__, "message": str(exc)}
    print("RESULT " + json.dumps({"loaded": loaded, "guarded": guarded, "seen": seen}))

asyncio.run(main())
"""


def clean_env(**extra: str) -> dict[str, str]:
    """The inherited environment without any variable that configures lfx or this package."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CREATEOS_", "LANGFLOW_", "OPEN_SANDBOX_"))}
    env.update(extra)
    return env


def run_in_process(env: dict[str, str], names: list[str]) -> tuple[dict[str, Any], str]:
    seen, proc = script_result(IN_PROCESS, names, env, timeout=300)
    return seen, proc.stdout + proc.stderr


@pytest.mark.parametrize("custom_components", [None, "false"], ids=["custom-components-default", "custom-components-off"])
def test_an_in_process_text_input_gets_no_plugin_secret_from_the_environment(custom_components: str | None) -> None:
    env = clean_env(**SECRETS, **dict([PLAIN]))
    if custom_components is not None:
        env["LANGFLOW_ALLOW_CUSTOM_COMPONENTS"] = custom_components
    names = [*SECRETS, "open_sandbox_api_key", PLAIN[0], "LANGFLOW_SECRET_KEY"]
    result, output = run_in_process(env, names)
    # The template load imported the package (its bundle), and that alone installed the list.
    assert result["loaded"] and result["guarded"], result
    seen = result["seen"]
    # The fallback is live in this run: a name on no list resolves from the environment.
    assert seen[PLAIN[0]] == {"ok": [PLAIN[1]]}, seen
    # lfx's own deny-list answer (a Text Input whose variable resolves to nothing fails to build).
    denied = seen["LANGFLOW_SECRET_KEY"]
    assert "error" in denied, denied
    for name in [*SECRETS, "open_sandbox_api_key"]:
        assert seen[name] == denied, (name, seen[name])
    for value in SECRETS.values():
        assert value not in output, f"{value} leaked: {output[-3000:]}"


def text_input_flow(name: str) -> dict[str, Any]:
    """Text Input (its text loading the global variable ``name``) -> Chat Output, as a dump."""
    from lfx.components.input_output import ChatOutput, TextInputComponent
    from lfx.graph import Graph

    text_in = TextInputComponent(_id="text_in")
    text_in.set(input_value=name)
    chat_out = ChatOutput(_id="chat_out")
    chat_out.set(input_value=text_in.text_response)
    dump = json.loads(json.dumps(Graph(text_in, chat_out).dump(name=name)))
    for node in dump["data"]["nodes"]:
        if node["id"] == "text_in":
            node["data"]["node"]["template"]["input_value"]["load_from_db"] = True
    return dump


SERVE_KEY = "e2e-inproc-serve-key"


def post_run(url: str) -> tuple[int, str]:
    """``POST url`` with an empty input; the status and the body as text (an error included)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, data=b'{"input_value": ""}', method="POST")
    request.add_header("x-api-key", SERVE_KEY)
    request.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 - loopback
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_lfx_serve_answers_a_text_input_naming_the_key_without_it(tmp_path: Path) -> None:
    """``lfx serve`` (no variable store: every unknown name falls back to the environment), with
    nothing of this package selected: lfx imports it for its executor entry points."""
    flows = tmp_path / "flows"
    flows.mkdir()
    names = ["CREATEOS_SANDBOX_API_KEY", "OPEN_SANDBOX_API_KEY", PLAIN[0]]
    for name in names:
        (flows / f"{name.lower()}.json").write_text(json.dumps(text_input_flow(name)))
    env = clean_env(**SECRETS, **dict([PLAIN]), LANGFLOW_API_KEY=SERVE_KEY)
    log = tmp_path / "serve.log"
    with lfx_serve(flows, env, log) as base:
        listed = http_json("GET", f"{base}/flows", api_key=SERVE_KEY)
        replies = {}
        for flow in listed:
            name = next(n for n in names if n.lower() in json.dumps(flow).lower())
            replies[name] = post_run(f"{base}/flows/{flow['id']}/run")
    assert set(replies) == set(names), listed
    # The fallback is live: a name on no list answers with its value.
    assert replies[PLAIN[0]][0] == 200 and PLAIN[1] in replies[PLAIN[0]][1], replies[PLAIN[0]]
    # Ours: what lfx serve answers for a name on lfx's own list (the Text Input fails to build).
    for name in names[:2]:
        status, body = replies[name]
        assert status >= 400 and "Text Input" in body, (name, status, body[-2000:])
        assert SECRETS[name] not in body, (name, body[-2000:])
    for value in SECRETS.values():
        assert value not in log.read_text(errors="replace")


# Each entry point lfx loads (the executors always, the backends when trusted), in a fresh
# interpreter: loading it puts the names on the list.
ENTRY_POINT = """
import sys
from importlib.metadata import entry_points
group, name = sys.argv[1], sys.argv[2]
(ep,) = [e for e in entry_points(group=group) if e.name == name and e.value.startswith("langflow_sandbox_createos")]
from lfx.utils.env_var_security import safe_getenv
before = safe_getenv("OPEN_SANDBOX_API_KEY")
ep.load()
print("RESULT", before is not None, safe_getenv("OPEN_SANDBOX_API_KEY") is None, safe_getenv("CREATEOS_SANDBOX_API_KEY") is None)
"""


@pytest.mark.parametrize(
    ("group", "name"),
    [
        ("lfx.executors", "createos"),
        ("lfx.executors", "opensandbox"),
        ("lfx.sandbox_backends", "createos"),
        ("lfx.sandbox_backends", "opensandbox"),
    ],
)
def test_every_entry_point_lfx_loads_puts_the_names_on_the_list(group: str, name: str) -> None:
    proc = run_python(ENTRY_POINT.replace("sys.argv[1], sys.argv[2]", f"{group!r}, {name!r}"), clean_env(**SECRETS))
    assert "RESULT True True True" in proc.stdout, (proc.stdout[-2000:], proc.stderr[-2000:])


# lfx's module replaced by one of another shape before the package is imported.
UNKNOWN_SHAPE = """
import logging, sys, types
logging.basicConfig(level=logging.WARNING, format="LOG %(levelname)s %(name)s %(message)s")
fake = types.ModuleType("lfx.utils.env_var_security")
fake._RESERVED_ENV_PREFIXES = ("LANGFLOW_",)
fake._RESERVED_ENV_NAMES = frozenset()
def is_protected_env_var(name, tenant=None):
    return name.upper().startswith(fake._RESERVED_ENV_PREFIXES)
def safe_getenv(name):
    return None if is_protected_env_var(name) else "value"
fake.is_protected_env_var = is_protected_env_var
fake.safe_getenv = safe_getenv
import lfx.utils
sys.modules["lfx.utils.env_var_security"] = fake
import langflow_sandbox_createos
from langflow_sandbox_createos import env_fallback
env_fallback.install()
print("RESULT", env_fallback.status()[0], fake._RESERVED_ENV_PREFIXES, sorted(fake._RESERVED_ENV_NAMES))
print("STATUS", env_fallback.status()[1])
"""


def test_an_unknown_shape_of_lfx_installs_nothing_and_warns_once() -> None:
    proc = run_python(UNKNOWN_SHAPE, clean_env())
    out = proc.stdout + proc.stderr
    assert "RESULT False ('LANGFLOW_',) []" in proc.stdout, out[-2000:]
    assert "takes ['name', 'tenant'], not ['name']" in proc.stdout, out[-2000:]
    warnings = [line for line in out.splitlines() if line.startswith("LOG WARNING langflow_sandbox_createos")]
    assert len(warnings) == 1, out[-2000:]
    assert "CREATEOS_SANDBOX_API_KEY_FILE" in warnings[0], warnings


def _rust_list(source: str, const: str) -> list[str]:
    body = re.search(rf"pub const {const}: &\[&str\] = &\[(.*?)\];", source, re.S)
    assert body, const
    return re.findall(r'"([^"]+)"', body.group(1))


def test_the_python_lists_are_the_rust_ones() -> None:
    from langflow_sandbox_createos import env_fallback

    source = (REPO / "crates" / "sandbox-core" / "src" / "withheld.rs").read_text()
    assert list(env_fallback.WITHHELD_PREFIXES) == _rust_list(source, "WITHHELD_PREFIXES")
    assert list(env_fallback.WITHHELD_NAMES) == _rust_list(source, "WITHHELD_NAMES")

