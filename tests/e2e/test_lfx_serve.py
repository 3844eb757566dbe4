"""The same flow served over HTTP by ``lfx serve``, with the createos backend."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import FLOW, Fake, backend_env, http_json, lfx_serve

SERVE_KEY = "e2e-serve-key"


def _request(method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 120) -> Any:
    return http_json(method, url, body, api_key=SERVE_KEY, timeout=timeout)


@pytest.fixture
def served(clean_fake: Fake, tmp_path: Path) -> Iterator[str]:
    env = backend_env(clean_fake, LANGFLOW_API_KEY=SERVE_KEY)
    with lfx_serve(FLOW, env, tmp_path / "serve.log") as base:
        yield base


def test_flow_runs_over_http(served: str, clean_fake: Fake) -> None:
    flows = _request("GET", f"{served}/flows")
    assert len(flows) == 1, flows
    flow_id = flows[0]["id"]
    for expression, expected in (("print(6*7)", "42"), ("print(sum(range(10)))", "45")):
        reply = _request("POST", f"{served}/flows/{flow_id}/run", {"input_value": expression})
        assert reply["success"] is True, reply
        body = reply["result"].strip().removeprefix("```json").removesuffix("```")
        assert json.loads(body) == {"result": expected}
    # One guest per execution, each destroyed.
    stats = clean_fake.wait_settled()
    assert stats["created"] == 2
    assert stats["live"] == 0
