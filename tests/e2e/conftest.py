"""Fixtures for the end-to-end tests: the fake control plane, lfx's environment, helpers.

The tests run against the *installed* wheel (the package must not be imported from the source
tree) and a real ``createos-fake`` process on 127.0.0.1. Build and install first:

    cargo build -p createos-fake
    maturin build --out dist -m crates/py-bindings/Cargo.toml
    pip install --force-reinstall dist/*.whl  # plus lfx==1.13.0 and pytest
    python -m pytest -q tests/e2e

``CREATEOS_FAKE_BIN`` points at the fake's binary; by default ``target/debug/createos-fake``
(or ``$CARGO_TARGET_DIR/debug/createos-fake``) is used.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
E2E = Path(__file__).resolve().parent
FLOW = E2E / "flows" / "pyrepl_flow.json"
# Shaped like a generated key (long, varied): a guessable one would be looked for in an
# author's text only as the whole text (sandbox_core::withheld::is_guessable).
FAKE_KEY = "fake-key-7c41e9a2b5d8"
# Every variable that could change what a run does; scrubbed from the inherited environment.
_PREFIXES = ("CREATEOS_", "LANGFLOW_")


def _check_installed_package() -> None:
    import langflow_sandbox_createos

    where = Path(langflow_sandbox_createos.__file__).resolve()
    if (REPO / "crates") in where.parents:
        pytest.exit(
            f"langflow_sandbox_createos is imported from the source tree ({where}); the tests must "
            "run against the installed wheel. Run pytest without crates/py-bindings/python on sys.path.",
            returncode=4,
        )


def pytest_configure(config: pytest.Config) -> None:
    _check_installed_package()


def built_binary(env_var: str, relative: str, build: str) -> Path:
    """A binary of this workspace's build: ``$env_var`` when set, else ``relative`` under
    ``$CARGO_TARGET_DIR`` or the repository's ``target/``; a failure that says how to build it."""
    candidates = []
    if os.environ.get(env_var):
        candidates.append(Path(os.environ[env_var]))
    else:
        if os.environ.get("CARGO_TARGET_DIR"):
            candidates.append(Path(os.environ["CARGO_TARGET_DIR"]) / relative)
        candidates.append(REPO / "target" / relative)
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    name = Path(relative).name
    pytest.fail(f"{name} not found (looked at {', '.join(map(str, candidates))}); build it with `{build}` or set {env_var}")


def fake_binary() -> Path:
    """The fake's executable, or a failure that says how to build it."""
    return built_binary("CREATEOS_FAKE_BIN", "debug/createos-fake", "cargo build -p createos-fake")


@dataclass
class Fake:
    """A running ``createos-fake`` process."""

    proc: subprocess.Popen[str]
    url: str
    key: str
    output: list[str] = field(default_factory=list)

    def _call(self, method: str, path: str, body: bytes | None = None) -> Any:
        request = urllib.request.Request(f"{self.url}{path}", data=body, method=method)
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback
            return json.loads(response.read())["data"]

    def stats(self) -> dict[str, Any]:
        """Counters: created, destroyed, live, requests per route, peak concurrent execs."""
        return self._call("GET", "/_fake/stats")

    def reset(self) -> None:
        """Drop every guest, clear the faults and zero the counters."""
        self._call("PUT", "/_fake/faults", b"")
        self._call("POST", "/_fake/reset")

    def set_faults(self, spec: str) -> None:
        """Install fault rules, ``ROUTE=ACTION[@PROB][#COUNT]`` separated by ``;``."""
        self._call("PUT", "/_fake/faults", spec.encode())

    def wait_for(self, predicate: Any, timeout: float = 15.0) -> dict[str, Any]:
        """Poll the stats until ``predicate(stats)`` holds; fail after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        stats = self.stats()
        while not predicate(stats):
            if time.monotonic() > deadline:
                pytest.fail(f"fake stats never satisfied the condition: {stats}")
            time.sleep(0.05)
            stats = self.stats()
        return stats

    def wait_settled(self, timeout: float = 15.0) -> dict[str, Any]:
        """Wait until no guest is live (destroys can finish just after a run returns)."""
        return self.wait_for(lambda s: s["live"] == 0, timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


def start_fake(*, key: str = FAKE_KEY, latency_ms: int = 0, faults: str = "", request_log: Path | None = None) -> Fake:
    """Start the fake on a free port and wait for its ``listening on`` line (bounded).
    ``request_log``: the fake appends every API request there (route, path, query, body)."""
    guest_path = str(Path(sys.executable).parent)  # the guest's python3 is this venv's
    cmd = [str(fake_binary()), "--port", "0", "--guest-path", guest_path, "--latency-ms", str(latency_ms)]
    if faults:
        cmd += ["--faults", faults]
    if request_log is not None:
        cmd += ["--request-log", str(request_log)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(_PREFIXES)}
    env["CREATEOS_FAKE_API_KEY"] = key  # not on the command line, where `ps` would show it
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    first = ""
    if selector.select(timeout=20):
        first = proc.stdout.readline()
    selector.close()
    if not first.startswith("listening on "):
        proc.kill()
        rest = proc.communicate(timeout=10)[0]
        pytest.fail(f"createos-fake did not start: {first!r} {rest[-2000:]!r}")
    fake = Fake(proc=proc, url=first.split("listening on ", 1)[1].strip(), key=key)
    fake.output.append(first)

    def pump() -> None:  # keep the pipe drained so the fake never blocks on a full pipe
        assert proc.stdout is not None
        for line in proc.stdout:
            fake.output.append(line)

    threading.Thread(target=pump, name="fake-output", daemon=True).start()
    return fake


@pytest.fixture(scope="session")
def fake() -> Iterator[Fake]:
    """One fake for the session, reset before each test that uses it."""
    server = start_fake()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def clean_fake(fake: Fake) -> Fake:
    """The session fake, with no guests, no faults and zeroed counters."""
    fake.reset()
    return fake


def backend_env(fake: Fake, **overrides: str | None) -> dict[str, str]:
    """The environment a Langflow operator would set, pointed at ``fake``.

    ``overrides`` set (or, with ``None``, remove) variables on top of the defaults.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(_PREFIXES)}
    env.update(
        {
            "LANGFLOW_SANDBOX_BACKEND_PLUGINS": "createos",
            "LANGFLOW_SANDBOX_BACKEND": "createos",
            "CREATEOS_SANDBOX_API_KEY": fake.key,
            "CREATEOS_SANDBOX_BASE_URL": fake.url,
            # Langflow's default is deny-all egress, which on CreateOS still reaches link-local.
            "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS": "true",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return with_overrides(env, overrides)


def with_overrides(env: dict[str, str], overrides: dict[str, str | None]) -> dict[str, str]:
    """``env`` with each of ``overrides`` set, or removed where its value is ``None``."""
    for name, value in overrides.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def venv_bin(name: str) -> str:
    """A console script installed next to this interpreter (``lfx``)."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        pytest.fail(f"{name} is not installed in this environment ({path})")
    return str(path)


@dataclass
class LfxRun:
    """What one ``lfx run`` printed."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def json(self) -> dict[str, Any]:
        """The JSON object lfx prints as its result (the last JSON line of stdout)."""
        for line in reversed(self.stdout.strip().splitlines()):
            line = line.strip()
            if line.startswith("{"):
                return json.loads(line)
        msg = f"no JSON result in lfx output: stdout={self.stdout[-2000:]!r} stderr={self.stderr[-2000:]!r}"
        raise AssertionError(msg)

    @property
    def result(self) -> dict[str, Any]:
        """The Python Interpreter's output (``{"result": ...}`` or ``{"error": ...}``)."""
        text = self.json["result"]
        body = text.strip().removeprefix("```json").removesuffix("```")
        return json.loads(body)


def lfx_run(env: dict[str, str], code: str, *, timeout: float = 240) -> LfxRun:
    """Run the Python Interpreter flow with ``lfx run`` (bounded)."""
    proc = run_bounded([venv_bin("lfx"), "run", str(FLOW), code], env, timeout=timeout)
    return LfxRun(proc.returncode, proc.stdout, proc.stderr)


def run_bounded(argv: list[str], env: dict[str, str], *, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in the e2e folder with ``env``, its output captured as text (bounded)."""
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, cwd=E2E, check=False)


def run_python(
    script: str, env: dict[str, str], *, timeout: float = 120, args: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """Run a Python snippet (with ``args``) in a fresh interpreter of this venv (bounded)."""
    return run_bounded([sys.executable, "-c", script, *args], env, timeout=timeout)


_BACKEND_RUNS = """
import json, sys
from importlib import import_module
backend = import_module(sys.argv[1]).create_backend()
seen = []
for code, env in json.loads(sys.argv[2]):
    try:
        backend.run(code, env=env)
        seen.append("ran")
    except Exception as exc:
        seen.append(f"{type(exc).__name__}: {exc}")
print("RESULT " + json.dumps(seen))
"""


def script_result(
    script: str, args: list[str], env: dict[str, str], *, timeout: float = 240
) -> tuple[Any, subprocess.CompletedProcess[str]]:
    """Run ``script`` with ``args`` in a fresh interpreter of this venv (bounded): the JSON of the
    last line it printed starting ``RESULT ``, and the process (a failure when there is none)."""
    proc = run_python(script, env, timeout=timeout, args=tuple(args))
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    return json.loads(lines[-1].removeprefix("RESULT ")), proc


def backend_runs(
    env: dict[str, str],
    cases: list[tuple[str, dict[str, str] | None]],
    *,
    module: str = "langflow_sandbox_createos.backend",
) -> tuple[list[str], subprocess.CompletedProcess[str]]:
    """Each ``(code, env)`` case through one backend (``module``'s ``create_backend``) in a fresh
    interpreter: ``"ran"``, or ``"<ExceptionType>: <message>"`` for each, and the process."""
    return script_result(_BACKEND_RUNS, [module, json.dumps(cases)], env, timeout=180)


@dataclass
class Signalled:
    """How an ``lfx run`` sent a signal mid-run ended."""

    returncode: int
    stdout: str
    stderr: str
    #: Seconds from the signal to the process's exit.
    took: float


def signal_lfx_run(
    env: dict[str, str], code: str, signum: int, started: Callable[[], bool], *, settle: float = 0.0
) -> Signalled:
    """``lfx run`` of the backend flow running ``code``, sent ``signum`` ``settle`` seconds after
    ``started()`` holds (polled for at most 120 s while the process runs), then waited for (60 s). SIGINT is
    left at its default in the child, as in a terminal (a shell starts background jobs with it
    ignored)."""
    proc = subprocess.Popen(
        [venv_bin("lfx"), "run", str(FLOW), code],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=E2E,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while not started():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the run never started"
            time.sleep(0.1)
        time.sleep(settle)
        sent = time.monotonic()
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=60)
        return Signalled(proc.returncode, stdout, stderr, time.monotonic() - sent)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)


def run_doctor(
    env: dict[str, str], *, timeout: float = 120, python: str = sys.executable, args: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    """``python -m langflow_sandbox_createos doctor [args]`` (bounded), by default in this venv."""
    return subprocess.run(
        [python, "-m", "langflow_sandbox_createos", "doctor", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=E2E,
        check=False,
    )


def make_template(fake: Fake, name: str) -> str:
    """A ready template ``name`` on ``fake``, with a Dockerfile like the one `template build`
    writes; its id. The fake builds it in a moment (bounded wait)."""
    dockerfile = "FROM nodeops/sandbox:debian\nRUN python3 -m pip install 'lfx==1.13.0'\nRUN python3 -c 'from lfx.graph import Graph'\n"
    created = http_json("POST", f"{fake.url}/v1/templates", {"name": name, "dockerfile": dockerfile}, api_key=fake.key)
    deadline = time.monotonic() + 15
    while http_json("GET", f"{fake.url}/v1/templates/{name}", api_key=fake.key)["data"]["status"] != "ready":
        if time.monotonic() > deadline:
            pytest.fail(f"the fake never built template {name}")
        time.sleep(0.05)
    return str(created["data"]["id"])


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_json(method: str, url: str, body: Any = None, *, api_key: str, timeout: float = 120) -> Any:
    """One JSON request with an ``x-api-key`` header; the decoded answer."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("x-api-key", api_key)
    if data is not None:
        request.add_header("content-type", "application/json")
    with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - loopback
        return json.loads(response.read())


@contextlib.contextmanager
def lfx_serve(flow: Path, env: dict[str, str], log_path: Path) -> Iterator[str]:
    """``lfx serve FLOW`` on a free loopback port until ``/health`` answers; yields its URL.

    The server is stopped (terminate, then kill) when the block ends; its output is in
    ``log_path``, quoted when it exits early or never gets ready (180 s).
    """
    port = free_port()
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [venv_bin("lfx"), "serve", str(flow), "--host", "127.0.0.1", "--port", str(port)],
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
                pytest.fail(f"lfx serve exited with {proc.returncode}: {log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2):  # noqa: S310 - loopback
                    break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    pytest.fail(f"lfx serve not ready: {log_path.read_text()[-3000:]}")
                time.sleep(0.5)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)


# ---- The OpenSandbox fake (tests/opensandbox-fake), for the second provider's tests ----------

#: The key the OpenSandbox fake accepts in these tests.
OS_KEY = "os-e2e-key-2f81c9d0"


@dataclass
class OsFake:
    """A running ``opensandbox-fake`` process."""

    proc: subprocess.Popen[str]
    url: str

    def _call(self, method: str, path: str, body: bytes | None = None) -> Any:
        request = urllib.request.Request(f"{self.url}{path}", data=body, method=method)
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback
            return json.loads(response.read() or b"null")

    def stats(self) -> dict[str, Any]:
        """Counters: created, deleted, live, requests per route."""
        return self._call("GET", "/_fake/stats")

    def configure(self, **modes: Any) -> None:
        """Change the server's modes (``egress_mode``, ``network_mode`` ...)."""
        self._call("POST", "/_fake/config", json.dumps(modes).encode())

    def reset(self) -> None:
        """Drop every sandbox and restore the start-up modes."""
        self._call("POST", "/_fake/reset")

    def wait_settled(self, timeout: float = 15.0) -> dict[str, Any]:
        """Wait until no sandbox is live."""
        deadline = time.monotonic() + timeout
        stats = self.stats()
        while stats["live"] != 0:
            if time.monotonic() > deadline:
                pytest.fail(f"sandboxes left: {stats}")
            time.sleep(0.05)
            stats = self.stats()
        return stats


@contextlib.contextmanager
def running_osfake(*extra: str) -> Iterator[OsFake]:
    """An ``opensandbox-fake`` on loopback as a Kubernetes server with a Kata runtime (short
    Pending and execd start-up), with ``extra`` options; stopped on exit."""
    binary = built_binary("OPENSANDBOX_FAKE_BIN", "debug/opensandbox-fake", "cargo build -p opensandbox-fake")
    proc = subprocess.Popen(
        [
            str(binary),
            "--port=0",
            f"--api-key={OS_KEY}",
            "--runtime=kubernetes",
            "--secure-runtime=kata",
            "--pending-ms=200",
            "--ping-ms=500",
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline().strip()
    assert first.startswith("listening on "), first
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    try:
        yield OsFake(proc=proc, url=first.split("listening on ", 1)[1])
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def osfake_server() -> Iterator[OsFake]:
    """An OpenSandbox fake for a module's tests."""
    with running_osfake() as fake:
        yield fake


@pytest.fixture(scope="module")
def osfake_guests() -> Iterator[OsFake]:
    """An OpenSandbox fake whose guests run this venv's ``python3`` (lfx is there)."""
    with running_osfake(f"--guest-path={Path(sys.executable).parent}") as fake:
        yield fake
