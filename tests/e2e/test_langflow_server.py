"""The slow suite: a real Langflow 1.13.0 server with this wheel installed, against the fake.

What a Langflow operator sees, end to end: the server lists the CreateOS Sandbox component in
``/api/v1/all``, runs a flow that uses it through ``/api/v1/run``, runs a flow through the
whole-flow executor (``LANGFLOW_EXECUTOR_KIND=createos``) through ``/api/v1/run``, and its UI,
loaded in headless Chromium, finds "CreateOS Sandbox" in the component search. Flows that need
the server (a credential stored as a global variable, the session's chat history, an uploaded
file) give the executor server's answers and stored messages the in-process server's, and the
credential's value shows up nowhere it should not.

It needs a second virtual environment with ``langflow==1.13.0`` and the wheel (2 GB; Langflow
pulls in every provider bundle), named by ``LANGFLOW_SERVER_VENV``, and Debian's ``chromium``
and ``chromium-driver``. ``scripts/test`` prepares all of it and sets the variable, so CI runs
this suite; without the variable the tests are skipped and say why.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import E2E, REPO, Fake, backend_env, free_port, run_doctor, start_fake

SERVER_VENV = os.environ.get("LANGFLOW_SERVER_VENV", "")
CHROMIUM = shutil.which("chromium") or ""
CHROMEDRIVER = shutil.which("chromedriver") or ""
COMPONENT_KEY = "ext:createos:CreateOSSandboxComponent@official"
SCREENSHOTS = REPO / "target" / "slow-suite"

pytestmark = pytest.mark.skipif(
    not SERVER_VENV,
    reason="LANGFLOW_SERVER_VENV is not set: the slow suite needs a venv with langflow==1.13.0 "
    "and this wheel (scripts/test prepares one)",
)


@dataclass
class Server:
    """A running ``langflow run`` process and the credentials to call it."""

    proc: subprocess.Popen[bytes]
    url: str
    log: Path
    token: str = ""
    api_key: str = ""
    #: The environment it was started with (before the suite's own additions).
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    #: Langflow's Prometheus endpoint (``LANGFLOW_PROMETHEUS_PORT``).
    metrics_port: int = 0

    def call(self, method: str, path: str, body: Any = None, *, api_key: bool = False, timeout: float = 120) -> Any:
        status, answer = self.request(method, path, body, api_key=api_key, timeout=timeout)
        if status >= 400:
            pytest.fail(f"{method} {path} -> HTTP {status}: {answer}\nserver log tail:\n{self.tail()}")
        return answer

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        api_key: bool = False,
        timeout: float = 120,
        files: tuple[str, bytes] | None = None,
    ) -> tuple[int, Any]:
        """The status and the JSON answer (or the text of an error); ``files`` is one file sent
        as a multipart form field ``file``."""
        headers = {"Content-Type": "application/json"}
        data = None if body is None else json.dumps(body).encode()
        if files is not None:
            boundary = "slow-suite-boundary-7f3a"
            name, content = files
            data = (
                f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n'
                "Content-Type: text/plain\r\n\r\n"
            ).encode() + content + f"\r\n--{boundary}--\r\n".encode()
            headers["Content-Type"] = f"multipart/form-data; boundary={boundary}"
        if api_key:
            headers["x-api-key"] = self.api_key
        elif self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(f"{self.url}{path}", data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - loopback
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode(errors="replace")[-4000:]

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def start_server(env: dict[str, str], workdir: Path, *, workers: int = 1, fallback_to_env_var: bool = False) -> Server:
    """``langflow run`` (frontend included) on a free loopback port; waits for ``/health``.
    ``workers``: ``LANGFLOW_WORKERS``; ``fallback_to_env_var``: Langflow's default (true) instead
    of this suite's."""
    port = free_port()
    metrics_port = free_port()
    log = workdir / "langflow.log"
    env = {
        **env,
        # Langflow's own Prometheus endpoint, where our createos_* families must show.
        "LANGFLOW_PROMETHEUS_ENABLED": "true",
        "LANGFLOW_PROMETHEUS_PORT": str(metrics_port),
        "LANGFLOW_CONFIG_DIR": str(workdir / "config"),
        "LANGFLOW_AUTO_LOGIN": "true",
        "DO_NOT_TRACK": "true",
        "LANGFLOW_WORKERS": str(workers),
        # Each server its own database (by default it lives in the langflow package's
        # directory, shared by every server of the venv and kept from one run to the next).
        "LANGFLOW_SAVE_DB_IN_CONFIG_DIR": "true",
        # A variable that is not stored fails the run (rather than falling back to the server's
        # environment), so both servers show how that failure reads.
        "LANGFLOW_FALLBACK_TO_ENV_VAR": "true" if fallback_to_env_var else "false",
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(Path(SERVER_VENV) / "bin" / "langflow"), "run", "--host", "127.0.0.1", "--port", str(port)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=workdir,
        )
    server = Server(proc=proc, url=f"http://127.0.0.1:{port}", log=log, metrics_port=metrics_port)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"langflow exited with {proc.returncode}:\n{server.tail()}")
        try:
            with urllib.request.urlopen(f"{server.url}/health", timeout=5) as response:  # noqa: S310
                if response.status == 200:
                    break
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(1)
    else:
        server.stop()
        pytest.fail(f"langflow did not answer /health within 240 s:\n{server.tail()}")
    server.token = server.call("GET", "/api/v1/auto_login")["access_token"]
    server.api_key = server.call("POST", "/api/v1/api_key/", {"name": "slow-suite"})["api_key"]
    return server


def upload_flow(server: Server, file: Path, name: str) -> str:
    dump = json.loads(file.read_text())
    return str(server.call("POST", "/api/v1/flows/", {"name": name, "data": dump["data"]})["id"])


def run_flow(server: Server, flow_id: str, text: str) -> list[str]:
    """``/api/v1/run`` with a chat input; every chat message text in the answer."""
    answer = server.call(
        "POST",
        f"/api/v1/run/{flow_id}",
        {"input_value": text, "input_type": "chat", "output_type": "chat"},
        api_key=True,
        timeout=240,
    )
    texts = []
    for run in answer.get("outputs", []):
        for output in run.get("outputs", []) or []:
            message = ((output or {}).get("results") or {}).get("message") or {}
            texts.append(str(message.get("text", "")))
    return texts


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="lf-slow-") as d:
        yield Path(d)


@pytest.fixture(scope="module")
def slow_fake(workdir: Path) -> Iterator[Fake]:
    # Every request the fake receives is logged, bodies included, to show where values went.
    server = start_fake(request_log=workdir / "fake-requests.jsonl")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def plain_server(slow_fake: Fake, workdir: Path) -> Iterator[Server]:
    """Langflow with the sandbox backend enabled and the wheel's component installed."""
    (workdir / "plain").mkdir()
    server = start_server(backend_env(slow_fake), workdir / "plain")
    try:
        yield server
    finally:
        server.stop()


def test_the_server_lists_the_component(plain_server: Server) -> None:
    catalog = plain_server.call("GET", "/api/v1/all")
    found = {key: entry for category in catalog.values() if isinstance(category, dict) for key, entry in category.items()}
    assert COMPONENT_KEY in found, sorted(k for k in found if "createos" in k.lower())
    entry = found[COMPONENT_KEY]
    assert entry["display_name"] == "CreateOS Sandbox"
    assert entry.get("extension") == "langflow-sandbox-createos"
    # The drop-in identifiers a saved flow refers to.
    template = entry["template"]
    for field in ("python_code", "command", "session_mode", "collect_artifacts", "allow_network", "timeout_seconds", "shape"):
        assert field in template, field
    # A saved flow's stored Guest Reuse value stays one of the options.
    assert {"off", "flow"} <= set(template["session_mode"]["options"]), template["session_mode"]
    assert {o["name"] for o in entry["outputs"]} == {"results", "output_text", "files"}
    assert "accept_egress_exceptions" in template
    # The canvas text is static: it states no policy a run might not get.
    assert "After a run, the node's status shows the policy" in entry["description"], entry["description"]
    assert "Network: off" not in entry["description"]


def test_output_text_reaches_the_chat_as_plain_text(plain_server: Server, slow_fake: Fake) -> None:
    slow_fake.reset()
    flow_id = upload_flow(plain_server, E2E / "flows" / "component_text_flow.json", "slow: component text")
    texts = run_flow(plain_server, flow_id, "print('plain text, not JSON')")
    assert "plain text, not JSON" in texts, texts


def test_a_flow_using_the_component_runs_through_api_v1_run(plain_server: Server, slow_fake: Fake) -> None:
    slow_fake.reset()
    flow_id = upload_flow(plain_server, E2E / "flows" / "component_flow.json", "slow: component")
    texts = run_flow(plain_server, flow_id, "print(6 * 7)")
    assert any("42" in t for t in texts), texts
    # Reuse is off by default: one fresh guest, destroyed after the run (`destroyed` counts
    # guests past `destroying`, a moment after the delete).
    stats = slow_fake.wait_for(lambda s: s["live"] == 0 and s["destroyed"] >= 1)
    assert stats["created"] == 1 and stats["destroyed"] == 1, stats


NO_CHROMIUM = pytest.mark.skipif(
    not (CHROMIUM and CHROMEDRIVER),
    reason="chromium and chromedriver are not on PATH (Debian: apt-get install chromium chromium-driver)",
)


@contextlib.contextmanager
def chrome() -> Iterator[Any]:
    """Headless Chromium driven by selenium, as a user's browser on the Langflow UI; closed after."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def screenshot(driver: Any, name: str) -> None:
    """Keep what the browser showed under target/slow-suite, and check it is an image."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    shot = SCREENSHOTS / name
    assert driver.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@NO_CHROMIUM
def test_the_ui_finds_the_component_in_its_search(plain_server: Server) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    flow_id = plain_server.call("POST", "/api/v1/flows/", {"name": "slow: ui", "data": {"nodes": [], "edges": []}})["id"]
    with chrome() as driver:
        driver.get(f"{plain_server.url}/flow/{flow_id}")
        wait = WebDriverWait(driver, 90)
        search = wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, '[data-testid="sidebar-search-input"]')))
        search.send_keys("CreateOS Sandbox")
        hit = wait.until(
            ec.visibility_of_element_located(
                (By.XPATH, "//*[@data-testid='display-name' and normalize-space(text())='CreateOS Sandbox']")
            )
        )
        assert hit.text == "CreateOS Sandbox"
        screenshot(driver, "ui-component-search.png")


def executor_server_at(fake: Fake, workdir: Path, name: str, **settings: str) -> Iterator[Server]:
    """A Langflow server in ``workdir/name`` with ``LANGFLOW_EXECUTOR_KIND=createos``, nothing of
    the sandbox backend, and ``settings`` added to its environment; stopped when done."""
    (workdir / name).mkdir()
    env = backend_env(
        fake,
        LANGFLOW_SANDBOX_BACKEND=None,
        LANGFLOW_SANDBOX_BACKEND_PLUGINS=None,
        LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS=None,
        LANGFLOW_EXECUTOR_KIND="createos",
        **settings,
    )
    server = start_server(env, workdir / name)
    server.env = env
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def executor_server(slow_fake: Fake, workdir: Path) -> Iterator[Server]:
    """Langflow with ``LANGFLOW_EXECUTOR_KIND=createos`` and nothing of the sandbox backend."""
    yield from executor_server_at(slow_fake, workdir, "executor")


def test_a_flow_runs_in_a_guest_through_the_executor_and_api_v1_run(
    plain_server: Server, executor_server: Server, slow_fake: Fake
) -> None:
    """The same flow through both servers: the same answer, and only one of them used a guest."""
    shout = E2E / "flows" / "shout_flow.json"
    slow_fake.reset()
    local = run_flow(plain_server, upload_flow(plain_server, shout, "slow: shout in-process"), "hello server")
    assert local == ["HELLO SERVER!"], local
    assert slow_fake.stats()["created"] == 0
    remote = run_flow(executor_server, upload_flow(executor_server, shout, "slow: shout executor"), "hello server")
    assert remote == local
    stats = slow_fake.wait_for(lambda s: s["live"] == 0 and s["destroyed"] >= 1)
    assert stats["created"] == 1 and stats["destroyed"] == 1, stats


# --- The host builds no flow code (issue 46, CREATEOS_EXECUTOR_HOST_BUILDS=none) -----------------

MARKER = E2E / "flows" / "marker_flow.json"


@pytest.fixture(scope="module")
def hooked_server(slow_fake: Fake, workdir: Path) -> Iterator[Server]:
    """The executor server with ``CREATEOS_EXECUTOR_HOST_BUILDS=none``; the marker flow's
    component writes what the server process evaluates into ``hooked-markers`` (only the
    server's environment names it: a guest's is the executor's own)."""
    yield from executor_server_at(
        slow_fake,
        workdir,
        "hooked",
        CREATEOS_EXECUTOR_HOST_BUILDS="none",
        LFSC_MARKER_DIR=str(workdir / "hooked-markers"),
    )


#: A word of the executor's WARNING when the graph it received had components built on the
#: host (one word: the server's log wraps lines at spaces).
HOST_BUILT = "instantiate_components=True"


def marker_pids(answer: Any) -> set[str]:
    """The pids of the processes the answer says built the Marker (each names four markers)."""
    import re

    found = re.findall(r"module-(\d+) class-(\d+) init-(\d+) build-(\d+)", json.dumps(answer))
    assert found, answer
    assert all(len(set(marks)) == 1 for marks in found), found
    return {marks[0] for marks in found}


def test_no_flow_code_runs_in_the_server_through_api_v1_run_and_v2_sync(hooked_server: Server, slow_fake: Fake) -> None:
    """The marker flow through /api/v1/run and the v2 sync mode: every marker from a guest, none
    from the Langflow process; and doctor, with the server's settings, says both are covered."""
    flow_id = upload_flow(hooked_server, MARKER, "slow: marker")
    slow_fake.reset()
    v1 = hooked_server.call(
        "POST",
        f"/api/v1/run/{flow_id}",
        {"input_value": "hi", "input_type": "chat", "output_type": "chat"},
        api_key=True,
        timeout=240,
    )
    v2 = hooked_server.call(
        "POST", "/api/v2/workflows", {"flow_id": flow_id, "input_value": "hi", "mode": "sync"}, api_key=True, timeout=240
    )
    guests = marker_pids(v1) | marker_pids(v2)
    assert len(guests) == 2, (v1, v2)
    markers = Path(hooked_server.env["LFSC_MARKER_DIR"])
    written = sorted(p.name for p in markers.iterdir()) if markers.exists() else []
    assert written == [], f"the Langflow process evaluated flow code: {written}\n{hooked_server.tail()}"
    assert HOST_BUILT not in hooked_server.log.read_text(errors="replace"), hooked_server.tail()
    stats = slow_fake.wait_for(lambda s: s["live"] == 0 and s["destroyed"] >= 2)
    assert stats["created"] == 2, stats
    proc = run_doctor(hooked_server.env, timeout=180, python=str(Path(SERVER_VENV) / "bin" / "python"))
    for route in ("v1 run (/api/v1/run): covered", "v2 sync (/api/v2/workflows, sync mode): covered"):
        assert route in proc.stdout, proc.stdout[-4000:]
    assert "v2 stream (/api/v2/workflows, stream mode): not covered" in proc.stdout, proc.stdout


def v2_stream(server: Server, flow_id: str, text: str) -> str:
    """A run as the 1.13 Playground sends it: ``POST /api/v2/workflows`` in stream mode; the
    whole event stream, as text."""
    request = urllib.request.Request(
        f"{server.url}/api/v2/workflows",
        data=json.dumps({"flow_id": flow_id, "input_value": text, "mode": "stream"}).encode(),
        headers={"Content-Type": "application/json", "x-api-key": server.api_key},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=240) as response:  # noqa: S310 - loopback
        return response.read().decode(errors="replace")


def test_the_v2_stream_is_not_covered_and_builds_in_the_server_as_doctor_says(hooked_server: Server, slow_fake: Fake) -> None:
    """What doctor says of the v2 stream mode (the 1.13 Playground's route), checked against the
    server: it reaches no executor (no guest) and the server process builds the marker itself, so
    "not covered" is the truth. This test turns red when Langflow or this package changes that."""
    flow_id = upload_flow(hooked_server, MARKER, "slow: marker, v2 stream")
    slow_fake.reset()
    events = v2_stream(hooked_server, flow_id, "hi")
    markers = Path(hooked_server.env["LFSC_MARKER_DIR"])
    written = sorted(p.name.split("-")[0] for p in markers.iterdir()) if markers.exists() else []
    assert "build" in written and "module" in written, (written, events[-3000:])
    assert slow_fake.stats()["created"] == 0
    for path in markers.iterdir():  # the next test of this server starts from no host marker
        path.unlink()
    proc = run_doctor(hooked_server.env, timeout=180, python=str(Path(SERVER_VENV) / "bin" / "python"))
    said = [line for line in proc.stdout.splitlines() if "v2 stream (/api/v2/workflows, stream mode)" in line]
    assert len(said) == 1 and "not covered" in said[0] and "never reaches the executor" in said[0], proc.stdout[-4000:]


UNKNOWN_LANGFLOW = """
import json, logging, os, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
from lfx.graph.graph.base import Graph
from langflow_sandbox_createos import hostbuild, reach
before = Graph.__dict__["from_payload"]
hostbuild.BASE_VERSIONS = frozenset({"0.0.1"})  # the fingerprint: a Langflow the hook does not know
results = [hostbuild.register(None), hostbuild.install("langflow", Graph)]
print("RESULT " + json.dumps({
    "unchanged": Graph.__dict__["from_payload"] is before,
    "results": results[1],
    "deferred": sorted(name for _, name in hostbuild._deferred),
    "doctor": [text for _, text in reach.findings() if text.startswith(("v1 run (", "v2 sync ("))],
}))
"""


def test_an_unknown_langflow_installs_nothing_warns_once_and_doctor_says_not_covered(workdir: Path) -> None:
    """The fingerprint against the server's Langflow, its known versions monkeypatched: the
    plugin's register() (what every worker runs) wraps nothing, one WARNING names both routes and
    why, and doctor's lines say v1 run and v2 sync are not covered."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CREATEOS_", "LANGFLOW_"))}
    env.update(LANGFLOW_EXECUTOR_KIND="createos", CREATEOS_EXECUTOR_HOST_BUILDS="none")
    proc = subprocess.run(
        [str(Path(SERVER_VENV) / "bin" / "python"), "-c", UNKNOWN_LANGFLOW],
        capture_output=True, text=True, env=env, timeout=300, cwd=workdir, check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, (proc.stdout[-2000:], proc.stderr[-3000:])
    result = json.loads(lines[-1].removeprefix("RESULT "))
    # The start-up file installed lfx's own path (lfx is known); nothing of Langflow's was added.
    assert result["unchanged"] is True and result["deferred"] == ["aload_flow_from_json"], result
    assert all("langflow-base 1.13.0 is not a version this hook was checked against" in why for why in result["results"].values())
    assert sorted(result["results"]) == ["v1 run (/api/v1/run)", "v2 sync (/api/v2/workflows, sync mode)"], result
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("WARNING") and "0.0.1" in line]
    assert len(warnings) == 1 and "v1 run" in warnings[0] and "v2 sync" in warnings[0], proc.stderr[-3000:]
    assert len(result["doctor"]) == 2 and all("not covered" in line for line in result["doctor"]), result


def test_without_the_hook_the_server_builds_the_marker_before_the_hand_over(
    executor_server: Server, slow_fake: Fake
) -> None:
    """The control: the same flow on the executor server without the setting still builds in a
    guest, and the server says it built the components first; doctor says v1 run is not covered."""
    flow_id = upload_flow(executor_server, MARKER, "slow: marker, no hook")
    answer = executor_server.call(
        "POST",
        f"/api/v1/run/{flow_id}",
        {"input_value": "hi", "input_type": "chat", "output_type": "chat"},
        api_key=True,
        timeout=240,
    )
    assert len(marker_pids(answer)) == 1, answer
    deadline = time.monotonic() + 30
    while HOST_BUILT not in executor_server.log.read_text(errors="replace") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert HOST_BUILT in executor_server.log.read_text(errors="replace"), executor_server.tail()
    slow_fake.wait_for(lambda s: s["live"] == 0)
    proc = run_doctor(executor_server.env, timeout=180, python=str(Path(SERVER_VENV) / "bin" / "python"))
    assert "v1 run (/api/v1/run): not covered" in proc.stdout and "CREATEOS_EXECUTOR_HOST_BUILDS=none" in proc.stdout, proc.stdout


def scrape(server: Server) -> tuple[str, dict[str, list[tuple[dict[str, str], float]]]]:
    """Langflow's metrics endpoint: its text and our ``createos_`` samples by name."""
    from prometheus_client.parser import text_string_to_metric_families

    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as response:  # noqa: S310 - loopback
        text = response.read().decode()
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("createos_"):
                samples.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return text, samples


def metric(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float:
    return sum(v for got, v in samples.get(name, []) if all(got.get(k) == x for k, x in labels.items()))


def counted(server: Server, before: dict[str, Any], fake: Fake, surface: str) -> dict[str, Any]:
    """Waits (bounded) until the scrape shows every guest the fake saw created and deleted
    since ``before``; returns the scrape's text and its samples' growth by family."""
    stats = fake.wait_for(lambda s: s["live"] == 0 and s["destroyed"] >= 1)
    deadline = time.monotonic() + 20
    while True:
        text, now = scrape(server)

        def grew(name: str, **labels: str) -> float:
            return metric(now, name, **labels) - metric(before, name, **labels)  # noqa: B023

        if grew("createos_guests_destroyed_total", surface=surface) >= stats["requests"].get("delete", 0):
            break
        if time.monotonic() > deadline:
            pytest.fail(f"the scrape never showed the fake's deletes: {stats} {now}")
        time.sleep(0.5)
    return {
        "text": text,
        "stats": stats,
        "created": grew("createos_guests_created_total", surface=surface),
        "destroyed": grew("createos_guests_destroyed_total", surface=surface),
        "live": metric(now, "createos_guests_live", surface=surface),
        "ok": grew("createos_runs_total", surface=surface, outcome="ok"),
        "creates": grew("createos_control_requests_total", route="create"),
        "deletes": grew("createos_control_requests_total", route="delete"),
        "execs": grew("createos_control_requests_total", route="exec_stream"),
    }


def assert_one_guest_as_the_fake_counted_it(got: dict[str, Any]) -> None:
    """One run, one guest: our families grew by exactly what the fake itself counted."""
    stats = got["stats"]
    assert stats["created"] == 1
    assert (got["created"], got["destroyed"], got["live"], got["ok"]) == (1, 1, 0, 1), got
    assert (got["creates"], got["deletes"], got["execs"]) == (
        stats["requests"]["create"],
        stats["requests"]["delete"],
        stats["requests"]["exec_stream"],
    ), got


def test_langflows_metrics_port_shows_our_counters_as_the_fake_counted_them(
    plain_server: Server, executor_server: Server, slow_fake: Fake
) -> None:
    """After a component run and an executor run, Langflow's own Prometheus endpoint shows our
    families, equal to the fake's own counts, each family once (lfx's OpenTelemetry, which also
    feeds that registry, does not repeat them)."""
    pytest.importorskip("prometheus_client", reason="prometheus_client is not installed in the test venv")
    _, before = scrape(plain_server)
    slow_fake.reset()
    flow_id = upload_flow(plain_server, E2E / "flows" / "component_flow.json", "slow: metrics component")
    assert any("42" in t for t in run_flow(plain_server, flow_id, "print(6 * 7)"))
    got = counted(plain_server, before, slow_fake, "component")
    assert_one_guest_as_the_fake_counted_it(got)

    _, before = scrape(executor_server)
    slow_fake.reset()
    flow_id = upload_flow(executor_server, E2E / "flows" / "shout_flow.json", "slow: metrics executor")
    assert run_flow(executor_server, flow_id, "hello metrics") == ["HELLO METRICS!"]
    got = counted(executor_server, before, slow_fake, "executor")
    assert_one_guest_as_the_fake_counted_it(got)
    for text in (scrape(plain_server)[0], got["text"]):
        types = [line for line in text.splitlines() if line.startswith("# TYPE createos_")]
        assert types and len(types) == len(set(types)), types
        assert slow_fake.key not in text


def playground_build(server: Server, flow_id: str, text: str) -> list[dict[str, Any]]:
    """A Playground run: ``POST /api/v1/build/{id}/flow`` (as the editor sends it), then its
    events, streamed to the end."""
    job = server.call("POST", f"/api/v1/build/{flow_id}/flow", {"inputs": {"input_value": text}})
    request = urllib.request.Request(
        f"{server.url}/api/v1/build/{job['job_id']}/events?event_delivery=streaming",
        headers={"Authorization": f"Bearer {server.token}"},
    )
    events = []
    with urllib.request.urlopen(request, timeout=240) as response:  # noqa: S310 - loopback
        for raw in response:
            if raw.strip():
                events.append(json.loads(raw))
    return events


def doctor_on_the_playground(env: dict[str, str]) -> str:
    """What ``doctor`` run in the server's venv, with the server's settings, says about the
    Playground's path: its finding line."""
    proc = run_doctor(env, timeout=180, python=str(Path(SERVER_VENV) / "bin" / "python"))
    lines = [line for line in proc.stdout.splitlines() if "Playground" in line and "reach" in line]
    assert len(lines) == 1, (proc.stdout, proc.stderr[-2000:])
    return lines[0]


def test_doctor_says_what_the_server_does_with_a_playground_build(executor_server: Server, slow_fake: Fake) -> None:
    """The statement about the Playground is read from the installed Langflow; this checks it
    against what the server does, so it turns red when Langflow changes either way."""
    said = doctor_on_the_playground(executor_server.env)
    assert "cannot tell" not in said, f"doctor could not read this Langflow's build path: {said}"
    sandboxed = "reaches the executor" in said and "does NOT" not in said
    flow_id = upload_flow(executor_server, E2E / "flows" / "shout_flow.json", "slow: playground build")
    slow_fake.reset()
    events = playground_build(executor_server, flow_id, "hello playground")
    kinds = [event.get("event") for event in events]
    assert kinds and kinds[-1] == "end", kinds
    assert "HELLO PLAYGROUND!" in json.dumps(events), events[-3:]
    stats = slow_fake.wait_for(lambda s: s["live"] == 0)
    assert (stats["created"] >= 1) == sandboxed, (said, stats)


# --- Flows that need the server: a credential, the chat history, an uploaded file ----------

SECRET = E2E / "flows" / "secret_flow.json"
HISTORY = E2E / "flows" / "history_flow.json"
FILE = E2E / "flows" / "file_flow.json"
#: A credential as Langflow stores an LLM API key: a global variable of type Credential.
CREDENTIAL = "sk-slow-suite-credential-e3a91f07c2"


def upload_dump(server: Server, dump: dict[str, Any], name: str) -> str:
    return str(server.call("POST", "/api/v1/flows/", {"name": name, "data": dump["data"]})["id"])


def run_session(server: Server, flow_id: str, text: str, session: str) -> tuple[int, Any]:
    """``/api/v1/run`` with a chat input in ``session``: the status and the chat texts (or the
    error's text)."""
    status, answer = server.request(
        "POST",
        f"/api/v1/run/{flow_id}",
        {"input_value": text, "input_type": "chat", "output_type": "chat", "session_id": session},
        api_key=True,
        timeout=240,
    )
    if status >= 400:
        return status, answer
    texts = []
    for run in answer.get("outputs", []):
        for output in run.get("outputs", []) or []:
            message = ((output or {}).get("results") or {}).get("message") or {}
            texts.append(str(message.get("text", "")))
    return status, texts


def stored_messages(server: Server, flow_id: str) -> list[tuple[str, str, str, str]]:
    """The flow's messages as ``/api/v1/monitor/messages`` lists them, oldest first."""
    messages = server.call("GET", f"/api/v1/monitor/messages?flow_id={flow_id}")
    ordered = sorted(messages, key=lambda m: m["timestamp"])
    return [(m["sender"], m["sender_name"], m["session_id"], m["text"]) for m in ordered]


def both(plain: Server, executor: Server, fake: Fake, run: Any) -> tuple[Any, Any]:
    """``run(server)`` in-process, then through the executor: the first creates no guest, the
    second one guest per run (``runs`` in its answer), none live after."""
    fake.reset()
    local = run(plain)
    assert fake.stats()["created"] == 0
    remote = run(executor)
    stats = fake.wait_for(lambda s: s["live"] == 0 and s["destroyed"] >= remote["runs"], timeout=30)
    assert stats["created"] == remote["runs"] == stats["destroyed"], stats
    return local, remote


def with_variable(dump: dict[str, Any], name: str) -> dict[str, Any]:
    """The secret flow with its credential field loading the global variable ``name``."""
    dump = json.loads(json.dumps(dump))
    for node in dump["data"]["nodes"]:
        field = node["data"]["node"]["template"].get("api_key")
        if field:
            field["value"] = name
    return dump


def test_a_credential_variable_reaches_the_guest_and_its_value_goes_nowhere_else(
    plain_server: Server, executor_server: Server, slow_fake: Fake, workdir: Path
) -> None:
    dump = json.loads(SECRET.read_text())
    for server in (plain_server, executor_server):
        server.call("POST", "/api/v1/variables/", {"name": "EXEC_TEST_CREDENTIAL", "value": CREDENTIAL,
                                                    "type": "Credential", "default_fields": []})

    def run(server: Server) -> dict[str, Any]:
        flow_id = upload_dump(server, dump, f"slow: secret {server.url}")
        status, texts = run_session(server, flow_id, "probe", "slow-secret")
        assert status == 200, texts
        return {"texts": texts, "messages": stored_messages(server, flow_id), "runs": 1}

    local, remote = both(plain_server, executor_server, slow_fake, run)
    assert remote == local
    assert local["texts"][0].startswith("probe: key sha256:") and "(35 chars)" in local["texts"][0], local
    # The value: in the job's upload, and nowhere else the executor server or the fake wrote.
    requests = [json.loads(line) for line in (workdir / "fake-requests.jsonl").read_text().splitlines()]
    carrying = [(r["route"], r["query"]) for r in requests if CREDENTIAL in r["body"]]
    assert carrying == [("upload", [["path", "/workspace/lfx_job.json"]])], carrying
    assert all(CREDENTIAL not in json.dumps(r["query"]) + r["path"] for r in requests)
    server_log = executor_server.log.read_text(errors="replace")
    assert CREDENTIAL not in server_log
    # What the flow printed in its guest was relayed to the server's log, the value masked (the
    # log's console wraps lines, so the two halves are looked for apart).
    assert "guest: secret probe got the key" in server_log and "[REDACTED]" in server_log
    assert CREDENTIAL not in json.dumps(slow_fake.stats())
    assert CREDENTIAL not in "".join(slow_fake.output)
    for table in ("messages", "transactions"):
        status, rows = executor_server.request("GET", f"/api/v1/monitor/{table}")
        assert CREDENTIAL not in json.dumps(rows), table
    # Langflow's database stores the credential encrypted: never in the clear.
    for db in (workdir / "executor" / "config").glob("*.db*"):
        assert CREDENTIAL.encode() not in db.read_bytes(), db


def decoded(answer: Any) -> Any:
    """``answer`` with every text that holds a JSON object decoded, at any depth (Langflow's
    error answer is a JSON text whose ``detail`` is a JSON text again)."""
    if isinstance(answer, str) and answer.startswith("{"):
        try:
            return decoded(json.loads(answer))
        except ValueError:
            return answer
    if isinstance(answer, dict):
        return {k: decoded(v) for k, v in answer.items()}
    if isinstance(answer, list):
        return [decoded(v) for v in answer]
    return answer


def as_guest_failure(answer: Any) -> Any:
    """``answer`` with each text as the host raises a message a guest sent: trailing newlines
    dropped, every line after the first prefixed with ``"  | "`` (outside-text's ``block``)."""
    if isinstance(answer, str):
        return "\n  | ".join(answer.rstrip("\n").split("\n"))
    if isinstance(answer, dict):
        return {k: as_guest_failure(v) for k, v in answer.items()}
    if isinstance(answer, list):
        return [as_guest_failure(v) for v in answer]
    return answer


def test_a_variable_that_cannot_be_resolved_fails_as_in_process(
    plain_server: Server, executor_server: Server, slow_fake: Fake
) -> None:
    dump = with_variable(json.loads(SECRET.read_text()), "EXEC_TEST_NOT_STORED")

    def run(server: Server) -> dict[str, Any]:
        flow_id = upload_dump(server, dump, f"slow: missing variable {server.url}")
        status, answer = run_session(server, flow_id, "probe", "slow-missing")
        return {"status": status, "answer": answer, "runs": 1}

    local, remote = both(plain_server, executor_server, slow_fake, run)
    assert local["status"] >= 400 and "EXEC_TEST_NOT_STORED variable not found" in str(local["answer"]), local
    # The one documented difference: the guest's message keeps its lines, and each line after
    # the first starts with "  | ", so no text a guest chose starts a line of the host's log.
    local_answer, remote_answer = decoded(local["answer"]), decoded(remote["answer"])
    assert "\n  | " in remote_answer["detail"]["message"], remote
    assert {**remote, "answer": remote_answer} == {**local, "answer": as_guest_failure(local_answer)}


def test_a_flow_asking_for_the_sandboxs_own_key_is_refused_and_no_guest_sees_it(
    executor_server: Server, slow_fake: Fake
) -> None:
    # Langflow's default LANGFLOW_FALLBACK_TO_ENV_VAR=true resolves a name no global variable has
    # from the server's environment, which holds the sandbox's key: the executor refuses the
    # flow by the name it asks for, before any guest exists.
    slow_fake.reset()
    for name in ("CREATEOS_SANDBOX_API_KEY", "CREATEOS_GATEWAY_SECRET"):
        dump = with_variable(json.loads(SECRET.read_text()), name)
        flow_id = upload_dump(executor_server, dump, f"slow: asks for {name}")
        status, answer = run_session(executor_server, flow_id, "probe", "slow-withheld")
        text = json.dumps(answer)
        assert status >= 400, (status, text[-2000:])
        assert f"`{name}`" in text and "configures the sandbox itself" in text, text[-2000:]
        assert slow_fake.key not in text
    assert slow_fake.stats()["created"] == 0


def test_the_second_run_of_a_session_reads_the_first_from_the_history(
    plain_server: Server, executor_server: Server, slow_fake: Fake
) -> None:
    dump = json.loads(HISTORY.read_text())

    def run(server: Server) -> dict[str, Any]:
        flow_id = upload_dump(server, dump, f"slow: history {server.url}")
        answers = [run_session(server, flow_id, text, "slow-history") for text in ("first", "second")]
        return {"answers": answers, "messages": stored_messages(server, flow_id), "runs": 2}

    local, remote = both(plain_server, executor_server, slow_fake, run)
    assert local["answers"] == [
        (200, ["1 messages: User:first"]),
        (200, ["3 messages: User:first | Machine:1 messages: User:first | User:second"]),
    ], local
    assert [m[0] for m in local["messages"]] == ["User", "Machine"] * 2, local
    assert remote == local


def test_an_uploaded_file_is_read_by_the_file_component_as_in_process(
    plain_server: Server, executor_server: Server, slow_fake: Fake
) -> None:
    content = b"slow suite notes: 17 pears\n"

    def run(server: Server) -> dict[str, Any]:
        status, uploaded = server.request("POST", "/api/v2/files", files=("notes.txt", content))
        assert status == 201, uploaded
        dump = json.loads(FILE.read_text())
        for node in dump["data"]["nodes"]:
            field = node["data"]["node"]["template"].get("path")
            if field:
                field["value"], field["file_path"] = [uploaded["name"]], [uploaded["path"]]
        flow_id = upload_dump(server, dump, f"slow: file {server.url}")
        answer = run_session(server, flow_id, "", "slow-file")
        return {"answer": answer, "messages": stored_messages(server, flow_id), "runs": 1}

    local, remote = both(plain_server, executor_server, slow_fake, run)
    assert local["answer"] == (200, ["slow suite notes: 17 pears\n"]), local
    assert remote == local


# --- In the Langflow process itself: no field resolves the plugin's names (issue 45) ----------

#: A variable on no deny-list, in the server's environment.
PLAIN = ("E2E_SLOW_PLAIN_VARIABLE", "e2e-slow-plain-value-2c9d")
OPEN_SANDBOX_KEY = "e2e-slow-opensandbox-key-81f4"


@pytest.fixture(scope="module")
def fallback_server(slow_fake: Fake, workdir: Path) -> Iterator[Server]:
    """Langflow as an operator who installed the wheel for its component runs it: Langflow's
    default env-var fallback, custom components off, the keys in its environment, and nothing
    selecting the backend or the executor."""
    (workdir / "fallback").mkdir()
    env = backend_env(
        slow_fake,
        LANGFLOW_SANDBOX_BACKEND=None,
        LANGFLOW_SANDBOX_BACKEND_PLUGINS=None,
        LANGFLOW_ALLOW_CUSTOM_COMPONENTS="false",
        OPEN_SANDBOX_API_KEY=OPEN_SANDBOX_KEY,
        **dict([PLAIN]),
    )
    server = start_server(env, workdir / "fallback", fallback_to_env_var=True)
    server.env = env
    try:
        yield server
    finally:
        server.stop()


def text_input_flow(name: str) -> dict[str, Any]:
    """Text Input (its text loading the global variable ``name``) -> Chat Output, as a dump."""
    from lfx.components.input_output import ChatOutput, TextInputComponent
    from lfx.graph import Graph

    text_in = TextInputComponent(_id="text_in")
    text_in.set(input_value=name)
    chat_out = ChatOutput(_id="chat_out")
    chat_out.set(input_value=text_in.text_response)
    dump = json.loads(json.dumps(Graph(text_in, chat_out).dump()))
    for node in dump["data"]["nodes"]:
        if node["id"] == "text_in":
            node["data"]["node"]["template"]["input_value"]["load_from_db"] = True
    return dump


def test_an_in_process_playground_run_of_a_text_input_naming_the_key_answers_without_it(
    fallback_server: Server, slow_fake: Fake
) -> None:
    """Measured on Langflow 1.13.0: the Playground's build does not fall back to the
    environment at all (it builds vertices with lfx's default ``fallback_to_env_vars=False``;
    Langflow passes its ``LANGFLOW_FALLBACK_TO_ENV_VAR`` only to subflows, ``helpers.flow``), so
    a name no stored variable has fails as "variable not found", ours like any other. The
    fallback paths themselves (bare lfx, subflows) are covered in-process by
    test_in_process_secrets.py, through the same lfx function."""
    flow_id = upload_dump(fallback_server, text_input_flow(PLAIN[0]), "slow: in-process plain")
    plain = json.dumps(playground_build(fallback_server, flow_id, ""))
    assert f"{PLAIN[0]} variable not found" in plain and PLAIN[1] not in plain, plain[-2000:]
    for name, value in (("CREATEOS_SANDBOX_API_KEY", slow_fake.key), ("OPEN_SANDBOX_API_KEY", OPEN_SANDBOX_KEY)):
        flow_id = upload_dump(fallback_server, text_input_flow(name), f"slow: in-process {name}")
        events = json.dumps(playground_build(fallback_server, flow_id, ""))
        assert f"{name} variable not found" in events, (name, events[-2000:])
        assert value not in events, (name, events[-2000:])
    assert OPEN_SANDBOX_KEY not in fallback_server.log.read_text(errors="replace")


# --- The Playground's build runs in the guest (issue 46, CREATEOS_EXECUTOR_PLAYGROUND=on) --------


@pytest.fixture(scope="module")
def playground_server(slow_fake: Fake, workdir: Path) -> Iterator[Server]:
    """The hooked server with ``CREATEOS_EXECUTOR_PLAYGROUND=on`` too: every route covered, and
    the marker flow's host markers in ``playground-markers``."""
    yield from executor_server_at(
        slow_fake,
        workdir,
        "playground",
        CREATEOS_EXECUTOR_HOST_BUILDS="none",
        CREATEOS_EXECUTOR_PLAYGROUND="on",
        LFSC_MARKER_DIR=str(workdir / "playground-markers"),
    )


def test_with_the_playground_on_no_flow_code_runs_in_the_server_through_v1_build_and_v2_stream(
    playground_server: Server, slow_fake: Fake
) -> None:
    """The marker flow through the Playground's routes (v1 build, and v2 stream as the 1.13 UI
    sends it): every marker from a guest, none from the Langflow process; doctor says covered."""
    flow_id = upload_flow(playground_server, MARKER, "slow: marker, playground")
    slow_fake.reset()
    v1 = playground_build(playground_server, flow_id, "hi")
    kinds = [event.get("event") for event in v1]
    assert kinds[:2] == ["vertices_sorted", "build_start"] and kinds[-1] == "end", kinds
    v2 = v2_stream(playground_server, flow_id, "hi")
    guests = marker_pids(v1) | marker_pids(v2)
    assert len(guests) == 2, (v1, v2[-3000:])
    markers = Path(playground_server.env["LFSC_MARKER_DIR"])
    written = sorted(p.name for p in markers.iterdir()) if markers.exists() else []
    assert written == [], f"the Langflow process evaluated flow code: {written}\n{playground_server.tail()}"
    stats = slow_fake.wait_for(lambda s: s["live"] == 0 and s["destroyed"] >= 2)
    assert stats["created"] == 2, stats
    proc = run_doctor(playground_server.env, timeout=180, python=str(Path(SERVER_VENV) / "bin" / "python"))
    for route in ("v1 build (/api/v1/build/{flow_id}/flow): covered", "v2 stream (/api/v2/workflows, stream mode): covered"):
        assert route in proc.stdout, proc.stdout[-4000:]


@NO_CHROMIUM
def test_the_canvas_playground_builds_in_a_guest_with_the_playground_on(playground_server: Server, slow_fake: Fake) -> None:
    """The Playground as a user drives it in the 1.13 UI (headless Chromium: the canvas, the
    Playground button, a chat message): the answer shows in the chat, built by a guest, and the
    Langflow process wrote no marker."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    flow_id = upload_flow(playground_server, MARKER, "slow: marker, canvas")
    slow_fake.reset()
    with chrome() as driver:
        driver.get(f"{playground_server.url}/flow/{flow_id}")
        wait = WebDriverWait(driver, 120)
        wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, '[data-testid="playground-btn-flow-io"]'))).click()
        box = wait.until(ec.element_to_be_clickable((By.CSS_SELECTOR, '[data-testid="input-chat-playground"]')))
        box.send_keys("hi from the canvas")
        box.send_keys(Keys.ENTER)
        answer = wait.until(
            ec.visibility_of_element_located(
                (By.XPATH, "//*[@data-testid='div-chat-message'][contains(., 'build-')]")
            )
        )
        screenshot(driver, "ui-playground-in-a-guest.png")
        text = answer.text
    assert len(marker_pids(text)) == 1, text
    markers = Path(playground_server.env["LFSC_MARKER_DIR"])
    written = sorted(p.name for p in markers.iterdir()) if markers.exists() else []
    assert written == [], f"the Langflow process evaluated flow code: {written}\n{playground_server.tail()}"
    stats = slow_fake.wait_for(lambda s: s["live"] == 0 and s["destroyed"] >= 1)
    assert stats["created"] == 1, stats


def test_a_cancelled_playground_build_leaves_no_guest(playground_server: Server, slow_fake: Fake) -> None:
    """The Playground's Stop (``/api/v1/build/{job_id}/cancel``) while the slow flow's 2 s vertex
    runs in a guest: Langflow says the build was cancelled, the guest is destroyed, and the flow's
    answer never comes (a run that went on would have stored it before its guest was destroyed)."""
    flow_id = upload_flow(playground_server, E2E / "flows" / "slow_flow.json", "slow: slow, cancelled")
    slow_fake.reset()
    job = playground_server.call("POST", f"/api/v1/build/{flow_id}/flow", {"inputs": {"input_value": "stop me"}})
    slow_fake.wait_for(lambda s: s["live"] == 1)
    cancelled = playground_server.call("POST", f"/api/v1/build/{job['job_id']}/cancel", {})
    assert cancelled.get("success") is True, cancelled
    stats = slow_fake.wait_for(lambda s: s["live"] == 0 and s["destroyed"] == s["created"])
    assert stats["created"] == 1, stats
    time.sleep(3)  # longer than the Slow vertex: a build that was not stopped would answer now
    answers = [m for m in stored_messages(playground_server, flow_id) if m[0] != "User"]
    assert answers == [], answers


def playground_session(server: Server, flow_id: str, text: str, session: str) -> list[dict[str, Any]]:
    """A v1 build (as the editor sends it) in ``session``: its events, to the end."""
    job = server.call("POST", f"/api/v1/build/{flow_id}/flow", {"inputs": {"input_value": text, "session": session}})
    request = urllib.request.Request(
        f"{server.url}/api/v1/build/{job['job_id']}/events?event_delivery=streaming",
        headers={"Authorization": f"Bearer {server.token}"},
    )
    with urllib.request.urlopen(request, timeout=240) as response:  # noqa: S310 - loopback
        return [json.loads(raw) for raw in response if raw.strip()]


def _shown(value: Any) -> Any:
    """An output's value as the Playground shows it: a message's text, an error's message."""
    message = value.get("message") if isinstance(value, dict) else value
    if isinstance(message, dict):
        for key in ("errorMessage", "text"):
            if key in message:
                return message[key]
    return message


def playground_shape(events: list[dict[str, Any]]) -> dict[str, Any]:
    """What parity compares of a build's events: their types in order, each built vertex (id,
    validity, the vertices it unlocked and inactivated, its outputs as shown, its output
    metadata), the chat messages sent, and the tokens streamed."""
    vertices = []
    for event in events:
        if event.get("event") != "end_vertex":
            continue
        build = event["data"]["build_data"]
        outputs = build["data"].get("outputs") or {}
        vertices.append(
            {
                "id": build["id"],
                "valid": build["valid"],
                "next": sorted(build.get("next_vertices_ids") or []),
                "inactivated": sorted(build.get("inactivated_vertices") or []),
                "outputs": {name: (value.get("type"), _shown(value)) for name, value in sorted(outputs.items())},
                "meta": event["data"].get("output_meta"),
            }
        )
    messages = [
        (e["data"].get("sender"), e["data"].get("sender_name"), e["data"].get("text"), e["data"].get("category"))
        for e in events
        if e.get("event") in ("add_message", "error") and isinstance(e.get("data"), dict)
    ]
    return {
        "kinds": [e.get("event") for e in events],
        "vertices": vertices,
        "messages": messages,
        "tokens": "".join(str(e["data"].get("chunk")) for e in events if e.get("event") == "token"),
    }


PARITY = [
    ("shout", ["hello playground"]),
    ("slow", ["slow one"]),
    ("history", ["first", "second"]),
    ("branch", ["yes"]),
    ("branch", ["no"]),
    ("loop", ["a b c"]),
    ("stream", ["three streamed words"]),
    ("tokens", ["four words as tokens"]),
    ("fail", ["boom"]),
]


@pytest.mark.parametrize(("flow", "texts"), PARITY, ids=[f"{f}-{t[0].split()[0]}" for f, t in PARITY])
def test_the_playground_in_a_guest_emits_what_the_in_process_playground_emits(
    plain_server: Server, playground_server: Server, slow_fake: Fake, flow: str, texts: list[str]
) -> None:
    """Event parity through v1 build: the same event types in the same order, the same built
    vertices (results, unlocked and inactivated vertices, output metadata), the same chat
    messages and tokens, and the same stored messages. In-process is the server without the
    executor (with it, a Loop's body reaches the executor even in the in-process Playground):
    it creates no guest; the Playground in a guest creates one per run."""
    dump = json.loads((E2E / "flows" / f"{flow}_flow.json").read_text())

    def run(server: Server) -> dict[str, Any]:
        flow_id = upload_dump(server, dump, f"slow: parity {flow} {texts[0]} {server.url}")
        shapes = [playground_shape(playground_session(server, flow_id, text, f"parity-{flow}")) for text in texts]
        return {"shapes": shapes, "stored": stored_messages(server, flow_id)}

    slow_fake.reset()
    local = run(plain_server)
    assert slow_fake.stats()["created"] == 0
    remote = run(playground_server)
    stats = slow_fake.wait_for(lambda s: s["live"] == 0 and s["destroyed"] >= len(texts), timeout=30)
    assert stats["created"] == len(texts), stats
    for mine, theirs in zip(remote["shapes"], local["shapes"], strict=True):
        assert mine["kinds"][:2] == ["vertices_sorted", "build_start"] and mine["kinds"][-1] == "end", mine["kinds"]
        assert mine == theirs
    assert remote["stored"] == local["stored"]
    if flow == "tokens":  # the Chat Output streamed the chunks as token events, live, in both
        kinds = remote["shapes"][0]["kinds"]
        assert remote["shapes"][0]["tokens"] == "FOUR WORDS AS TOKENS", remote
        assert kinds.count("token") == 4 and kinds.index("token") < len(kinds) - 2, kinds


def test_a_component_the_guest_cannot_carry_is_refused_with_an_error_naming_it(
    playground_server: Server, slow_fake: Fake
) -> None:
    """A frozen component (its cached result lives in the Langflow process) is refused with an
    error event naming it and the setting: no guest, nothing built in the server."""
    dump = json.loads(MARKER.read_text())
    for node in dump["data"]["nodes"]:
        if node["id"] == "marker":
            node["data"]["node"]["frozen"] = True
    flow_id = upload_dump(playground_server, dump, "slow: marker, frozen")
    slow_fake.reset()
    events = playground_build(playground_server, flow_id, "hi")
    # The driver's error event, and the job queue's own for the build it raised, as in-process.
    errors = [json.dumps(e) for e in events if e.get("event") == "error"]
    assert errors and all("Marker: a frozen component" in e and "CREATEOS_EXECUTOR_PLAYGROUND" in e for e in errors), events
    assert "end_vertex" not in [e.get("event") for e in events], events
    assert slow_fake.stats()["created"] == 0
    markers = Path(playground_server.env["LFSC_MARKER_DIR"])
    assert not markers.exists() or list(markers.iterdir()) == [], list(markers.iterdir())


UNKNOWN_DRIVER = """
import json, logging, os, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s %(message)s")
import langflow.main  # the server's import order (langflow.api.build alone is a circular import)
import langflow.api.build as build
from langflow_sandbox_createos import hostbuild, playground, reach
before = build._generate_flow_events
playground.BASE_VERSIONS = frozenset({"0.0.1"})  # the fingerprint: a Langflow the driver does not know
hostbuild.register(None)
hostbuild.register(None)
print("RESULT " + json.dumps({
    "unchanged": build._generate_flow_events is before,
    "doctor": [text for _, text in reach.findings() if text.startswith(("v1 build (", "v2 stream ("))],
}))
"""


def test_an_unknown_langflow_replaces_no_driver_warns_once_and_doctor_says_not_covered(workdir: Path) -> None:
    """The driver's fingerprint against the server's Langflow, its known versions monkeypatched:
    register() (what every worker runs, twice here) replaces nothing, one WARNING says why, and
    doctor's lines say the Playground's routes are not covered, and why."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CREATEOS_", "LANGFLOW_"))}
    env.update(LANGFLOW_EXECUTOR_KIND="createos", CREATEOS_EXECUTOR_PLAYGROUND="on")
    proc = subprocess.run(
        [str(Path(SERVER_VENV) / "bin" / "python"), "-c", UNKNOWN_DRIVER],
        capture_output=True, text=True, env=env, timeout=300, cwd=workdir, check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, (proc.stdout[-2000:], proc.stderr[-3000:])
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["unchanged"] is True, result
    why = "langflow-base 1.13.0 is not a version this driver was checked against (0.0.1)"
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("WARNING") and "CREATEOS_EXECUTOR_PLAYGROUND" in line]
    assert len(warnings) == 1 and why in warnings[0], proc.stderr[-3000:]
    assert len(result["doctor"]) == 2 and all("not covered" in line and why in line for line in result["doctor"]), result


def test_the_playground_on_opensandbox_builds_in_a_sandbox_and_no_flow_code_in_the_server(
    osfake_guests: Any, workdir: Path
) -> None:
    """The second provider: with ``LANGFLOW_EXECUTOR_KIND=opensandbox``, the marker flow through
    v2 stream and v1 build runs in sandboxes of the OpenSandbox fake, none of its code in the
    server, and no sandbox is left."""
    from test_opensandbox_executor import os_executor_env

    (workdir / "playground-os").mkdir()
    markers = workdir / "playground-os-markers"
    env = os_executor_env(
        osfake_guests,
        CREATEOS_EXECUTOR_HOST_BUILDS="none",
        CREATEOS_EXECUTOR_PLAYGROUND="on",
        LFSC_MARKER_DIR=str(markers),
    )
    server = start_server(env, workdir / "playground-os")
    try:
        flow_id = upload_flow(server, MARKER, "slow: marker, playground, opensandbox")
        osfake_guests.reset()
        v2 = v2_stream(server, flow_id, "hi")
        v1 = playground_build(server, flow_id, "hi")
    finally:
        server.stop()
    assert len(marker_pids(v1) | marker_pids(v2)) == 2, (v1, v2[-3000:])
    assert not markers.exists() or list(markers.iterdir()) == [], list(markers.iterdir())
    assert osfake_guests.wait_settled()["created"] == 2


def v2_events(server: Server, flow_id: str, text: str, session: str) -> list[dict[str, Any]]:
    """A v2 stream run (as the 1.13 UI's Playground sends it) in ``session``: its events."""
    request = urllib.request.Request(
        f"{server.url}/api/v2/workflows",
        data=json.dumps({"flow_id": flow_id, "input_value": text, "mode": "stream", "session_id": session}).encode(),
        headers={"Content-Type": "application/json", "x-api-key": server.api_key},
        method="POST",
    )
    events = []
    with urllib.request.urlopen(request, timeout=240) as response:  # noqa: S310 - loopback
        for raw in response:
            line = raw.decode(errors="replace").strip()
            if line.startswith("data:"):
                line = line.removeprefix("data:").strip()
            if line.startswith("{"):
                events.append(json.loads(line))
    return events


V2_PARITY = [("shout", "hello v2"), ("tokens", "four words as tokens"), ("branch", "no"), ("fail", "boom")]


@pytest.mark.parametrize(("flow", "text"), V2_PARITY, ids=[f for f, _ in V2_PARITY])
def test_the_v2_stream_in_a_guest_emits_what_the_in_process_v2_stream_emits(
    plain_server: Server, playground_server: Server, slow_fake: Fake, flow: str, text: str
) -> None:
    """Event parity through the v2 stream mode (the 1.13 UI's Playground): the same events in
    the same order, the same vertex results, messages, tokens and stored messages."""
    dump = json.loads((E2E / "flows" / f"{flow}_flow.json").read_text())

    def run(server: Server) -> dict[str, Any]:
        flow_id = upload_dump(server, dump, f"slow: v2 parity {flow} {server.url}")
        events = v2_events(server, flow_id, text, f"v2-parity-{flow}")
        return {"shape": playground_shape(events), "stored": stored_messages(server, flow_id)}

    slow_fake.reset()
    local = run(plain_server)
    assert slow_fake.stats()["created"] == 0
    remote = run(playground_server)
    assert slow_fake.wait_for(lambda s: s["live"] == 0 and s["destroyed"] >= 1, timeout=30)["created"] == 1
    assert remote["shape"]["vertices"], remote
    assert remote == local


def test_with_the_playground_on_the_v2_background_mode_builds_in_a_guest(playground_server: Server, slow_fake: Fake) -> None:
    """The v2 background mode ends in the same driver: the marker flow's run, polled to its end,
    was built in a guest, and the Langflow process wrote no marker."""
    flow_id = upload_flow(playground_server, MARKER, "slow: marker, v2 background")
    slow_fake.reset()
    job = playground_server.call(
        "POST", "/api/v2/workflows", {"flow_id": flow_id, "input_value": "hi", "mode": "background"}, api_key=True
    )
    job_id = job.get("job_id") or job.get("id")
    assert job_id, job
    deadline = time.monotonic() + 180
    while True:
        status = playground_server.call("GET", f"/api/v2/workflows?job_id={job_id}", api_key=True)
        if str(status.get("status", "")).lower() in ("completed", "failed", "error", "cancelled"):
            break
        assert time.monotonic() < deadline, status
        time.sleep(1)
    assert str(status.get("status")).lower() == "completed", status
    assert len(marker_pids(status)) == 1, status
    markers = Path(playground_server.env["LFSC_MARKER_DIR"])
    assert not markers.exists() or list(markers.iterdir()) == [], list(markers.iterdir())
    assert slow_fake.wait_for(lambda s: s["live"] == 0 and s["destroyed"] >= 1)["created"] == 1
