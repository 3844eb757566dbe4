"""The same flow served over HTTP by ``lfx serve``, with the createos backend."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from conftest import E2E, FLOW, Fake, backend_env, venv_bin

SERVE_KEY = "e2e-serve-key"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _request(method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 120) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("x-api-key", SERVE_KEY)
    if data is not None:
        request.add_header("content-type", "application/json")
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - loopback
        return json.loads(response.read())


@pytest.fixture
def served(clean_fake: Fake, tmp_path: Any) -> Iterator[str]:
    port = _free_port()
    env = backend_env(clean_fake, LANGFLOW_API_KEY=SERVE_KEY)
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [venv_bin("lfx"), "serve", str(FLOW), "--host", "127.0.0.1", "--port", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=E2E,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                pytest.fail(f"lfx serve exited with {proc.returncode}: {(tmp_path / 'serve.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2):  # noqa: S310 - loopback
                    break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    pytest.fail(f"lfx serve not ready: {(tmp_path / 'serve.log').read_text()[-3000:]}")
                time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)
        log.close()


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
