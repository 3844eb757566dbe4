"""The backend object itself: the lfx protocol, threads, fork, Ctrl-C, shutdown, logging."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from importlib.metadata import entry_points

import pytest

from conftest import E2E, Fake, backend_env, lfx_run, run_doctor, run_python


@pytest.fixture
def backend(clean_fake: Fake, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """A backend built the way lfx builds it (entry point factory), aimed at the fake.

    The CREATEOS_* variables are read at run time; lfx's own settings are left at their
    defaults (30 s, deny-all egress).
    """
    for name in list(os.environ):
        if name.startswith(("CREATEOS_", "LANGFLOW_")):
            monkeypatch.delenv(name)
    for name, value in backend_env(clean_fake).items():
        if name.startswith(("CREATEOS_", "LANGFLOW_SANDBOX_CREATEOS_")):
            monkeypatch.setenv(name, value)
    (factory,) = [ep for ep in entry_points(group="lfx.sandbox_backends") if ep.name == "createos"]
    instance = factory.load()()
    try:
        yield instance
    finally:
        instance.shutdown()


def test_entry_point_factory_builds_the_lfx_protocol(backend: object) -> None:
    from lfx.utils.sandbox.base import Capabilities, SandboxBackend

    assert isinstance(backend, SandboxBackend)
    assert backend.name == "createos"
    caps = backend.capabilities()
    assert isinstance(caps, Capabilities)
    assert caps.isolation == "hardware-virtualized"
    assert caps.supports_deny_all_egress is True
    # Hostname rules are not enforced by CreateOS, so without an egress gateway configured (this
    # environment has none) the backend must not claim them.
    assert caps.supports_domain_allowlist is False


def test_run_returns_lfx_result(backend: object, clean_fake: Fake) -> None:
    from lfx.utils.sandbox.base import SandboxResult

    result = backend.run("import sys\nprint('out')\nprint('err', file=sys.stderr)")
    assert isinstance(result, SandboxResult)
    assert (result.stdout.strip(), result.stderr.strip(), result.exit_code) == ("out", "err", 0)
    assert result.execution_time_ms is not None
    assert clean_fake.wait_settled()["created"] == 1


def test_capped_output_keeps_the_tail_as_a_compact_str(
    backend: object, clean_fake: Fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CREATEOS_SANDBOX_MAX_OUTPUT_BYTES", str(256 * 1024))
    code = (
        "import sys\n"
        "for i in range(20000):\n    print(f'line {i:05d} ' + 'x' * 40)\n"
        "sys.stderr.write('é' * 10 + '\\n')\n"
        "print('the end')"
    )
    result = backend.run(code)
    assert result.exit_code == 0
    out = result.stdout
    assert out.startswith("[... ") and "bytes truncated ...]\n" in out[:80], out[:80]
    assert out.endswith("line 19999 " + "x" * 40 + "\nthe end\n")
    # The tail is whole lines, cut at a line start, and within the cap.
    body = out.split("\n", 1)[1]
    assert body.startswith("line ") and len(body.encode()) <= 256 * 1024
    assert sum(1 for line in body.splitlines() if line.startswith("line ")) > 4000
    # ASCII output stays one byte per character in Python: the marker must not widen it.
    assert sys.getsizeof(out) - sys.getsizeof("") < len(out) + 64
    assert result.stderr == "é" * 10 + "\n"


def test_native_output_comes_in_small_whole_character_pieces_taken_once(backend: object) -> None:
    from langflow_sandbox_createos.backend import output_text
    from lfx.utils.sandbox.base import _sandbox_settings

    run = backend._native.run("print('€' * 1000)", None, _sandbox_settings())
    assert run.stdout.nbytes == 3001
    assert "stdout_len=3001" in repr(run)
    pieces = list(run.stdout)
    # 448-byte steps cut back to a character start (448 is not a multiple of 3).
    assert len(pieces) > 5 and all(0 < len(p.encode()) <= 448 for p in pieces), [len(p) for p in pieces]
    assert "".join(pieces) == "€" * 1000 + "\n"
    assert output_text(run.stdout) == "", "an Output is taken once"
    assert "stdout_len=3001" in repr(run)


def test_env_reaches_the_guest(backend: object) -> None:
    result = backend.run("import os\nprint(os.environ['GREETING'])", env={"GREETING": "hello guest"})
    assert result.stdout.strip() == "hello guest"


def test_refusal_raises_lfx_unavailable(backend: object, clean_fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
    from lfx.utils.sandbox.base import SandboxUnavailableError

    monkeypatch.delenv("CREATEOS_SANDBOX_API_KEY")
    with pytest.raises(SandboxUnavailableError, match="CREATEOS_SANDBOX_API_KEY"):
        backend.run("print(1)")
    assert clean_fake.stats()["created"] == 0


def test_backend_refuses_domain_allowlist_itself(backend: object, clean_fake: Fake) -> None:
    # lfx's gate refuses this before calling the backend; called directly, the backend must
    # refuse it too rather than create a guest whose hostname rules would not be enforced.
    from lfx.utils.sandbox.base import _SandboxSettings

    from langflow_sandbox_createos.exceptions import CreateOSUnavailableError

    settings = _SandboxSettings(allow_network=True, allowed_domains=("pypi.org",))
    with pytest.raises(CreateOSUnavailableError, match="LANGFLOW_SANDBOX_ALLOWED_DOMAINS"):
        backend._native.run("print(1)", None, settings)
    assert clean_fake.stats()["created"] == 0


def test_a_configured_gateway_declares_and_honours_the_domain_allowlist(
    backend: object, clean_fake: Fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lfx.utils.sandbox.base import _SandboxSettings

    secret = "e2e-gateway-secret-0123456789abcdef0123"
    monkeypatch.setenv("CREATEOS_GATEWAY_URL", "http://10.0.0.5:3128")
    monkeypatch.setenv("CREATEOS_GATEWAY_SECRET", secret)
    assert backend.capabilities().supports_domain_allowlist is True
    settings = _SandboxSettings(allow_network=True, allowed_domains=("pypi.org",))
    result = backend._native.run("import os; print(os.environ['https_proxy'])", None, settings)
    proxy = "".join(result.stdout).strip()
    assert proxy.startswith("http://run:") and proxy.endswith("@10.0.0.5:3128"), proxy
    assert secret not in repr(result)
    # Gone again when the secret is.
    monkeypatch.delenv("CREATEOS_GATEWAY_SECRET")
    assert backend.capabilities().supports_domain_allowlist is False


def test_infrastructure_failure_raises_lfx_execution_error(
    backend: object, clean_fake: Fake, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lfx.utils.sandbox.base import SandboxExecutionError, SandboxUnavailableError

    # The create fails for good: the backend reads this at run time and gives up after 3 s.
    monkeypatch.setenv("CREATEOS_CONTROL_PLANE_RETRY_SECONDS", "3")
    clean_fake.set_faults("create=503")
    with pytest.raises(SandboxExecutionError) as info:
        backend.run("print(1)")
    assert not isinstance(info.value, SandboxUnavailableError)


def test_eight_concurrent_runs_from_threads(backend: object, clean_fake: Fake) -> None:
    results: dict[int, object] = {}
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            results[i] = backend.run(f"print({i} * 3)")
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert errors == []
    assert {i: r.stdout.strip() for i, r in results.items()} == {i: str(i * 3) for i in range(8)}
    assert all(r.exit_code == 0 for r in results.values())
    stats = clean_fake.wait_settled()
    assert stats["created"] == 8


def test_a_run_releases_the_gil(backend: object) -> None:
    """Python threads keep running while a run waits on the guest."""
    import time

    def spin(seconds: float) -> int:
        count, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            count += 1
        return count

    baseline = spin(0.3) / 0.3
    done = threading.Event()
    rate: list[float] = []

    def run() -> None:
        try:
            backend.run("import time\ntime.sleep(1.5)")
        finally:
            done.set()

    worker = threading.Thread(target=run)
    worker.start()
    time.sleep(0.3)  # the run is past its start and waiting on the guest
    rate.append(spin(0.8) / 0.8)
    worker.join(timeout=60)
    assert done.is_set()
    # Holding the GIL while blocked would starve this thread almost completely.
    assert rate[0] > 0.3 * baseline, (rate[0], baseline)


def test_timings_reach_python_logging(backend: object, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="langflow_sandbox_createos"):
        backend.run("print(1)")
    # Emitted in Rust on a runtime thread, delivered to Python's logging by the waiting thread.
    fields = ("create_ms=", "upload_ms=", "exec_ms=", "destroy_ms=", "total_ms=", "requests=")
    timed = [
        r
        for r in caplog.records
        if r.name == "langflow_sandbox_createos" and all(f in r.getMessage() for f in fields)
    ]
    assert len(timed) == 1, [r.getMessage() for r in caplog.records]
    assert timed[0].levelno == logging.INFO
    # The destroy runs off the critical path; the run line says so instead of "None".
    assert "destroy_ms=background" in timed[0].getMessage(), timed[0].getMessage()


def test_warm_pool_shows_in_the_run_line_and_doctor(
    backend: object, clean_fake: Fake, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("CREATEOS_SANDBOX_WARM_POOL", "2")
    with caplog.at_level(logging.INFO, logger="langflow_sandbox_createos"):
        assert backend.run("print(1)").stdout.strip() == "1"
        # The first run's guest is destroyed and the pool holds two idle guests.
        clean_fake.wait_for(lambda s: s["live"] == 2)
        assert backend.run("print(2)").stdout.strip() == "2"
    lines = [r.getMessage() for r in caplog.records if "sandbox run finished" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "pool=miss" in lines[0], lines[0]
    # A cold run is two: the create (whose response shows the egress) and the exec with the program.
    assert "requests=2" in lines[0] and "upload_ms=0" in lines[0], lines[0]
    assert all(f in lines[1] for f in ("pool=hit", "pool_size=2", "pool_hits=1", "pool_misses=1")), lines[1]
    # A warm run is one request: the exec, which carries the program (no create, no upload).
    assert "requests=1" in lines[1] and "upload_ms=0" in lines[1], lines[1]
    backend.shutdown()
    assert clean_fake.wait_settled()["live"] == 0
    env = backend_env(clean_fake, CREATEOS_SANDBOX_WARM_POOL="2")
    doctor = run_doctor(env)
    assert "warm pool: 2 guest(s)" in doctor.stdout, doctor.stdout


def test_shutdown_is_idempotent_and_the_backend_still_works(backend: object, clean_fake: Fake) -> None:
    backend.shutdown()
    backend.shutdown()
    assert backend.run("print('again')").stdout.strip() == "again"
    backend.shutdown()
    backend.shutdown()
    assert clean_fake.wait_settled()["live"] == 0


def test_shutdown_destroys_a_guest_still_running(backend: object, clean_fake: Fake) -> None:
    outcome: list[object] = []
    worker = threading.Thread(target=lambda: outcome.append(_capture(lambda: backend.run("import time\ntime.sleep(60)"))))
    worker.start()
    clean_fake.wait_for(lambda s: s["live"] == 1 and s["requests"].get("exec", 0) + s["requests"].get("exec_stream", 0) >= 1)
    backend.shutdown()
    assert clean_fake.stats()["live"] == 0
    worker.join(timeout=60)
    assert not worker.is_alive()
    # Whatever the interrupted run reports, it is not a success.
    assert not (hasattr(outcome[0], "exit_code") and outcome[0].exit_code == 0)


def _capture(fn):  # noqa: ANN001, ANN202
    try:
        return fn()
    except BaseException as exc:  # noqa: BLE001
        return exc


# --- behaviour that needs a process of its own ----------------------------------------------

IMPORT_SCRIPT = """
import os, sys
def tasks():
    return len(os.listdir("/proc/self/task"))
before = tasks()
import langflow_sandbox_createos
after_import = tasks()
# Of lfx, only the module of its env-fallback deny-list (env_fallback extends it on import).
lfx_loaded = sorted(m for m in sys.modules if m == "lfx" or m.startswith("lfx."))
assert lfx_loaded == ["lfx", "lfx.utils", "lfx.utils.env_var_security"], lfx_loaded
assert "langflow_sandbox_createos._native" not in sys.modules, "importing the package loaded the extension"
from langflow_sandbox_createos import backend as glue  # what lfx's entry point loads (imports lfx)
threads_with_lfx = tasks()
instance = glue.create_backend()
instance.capabilities()
after_factory = tasks()
print(before, after_import, threads_with_lfx, after_factory)
"""


def test_import_and_factory_start_no_thread(clean_fake: Fake) -> None:
    proc = run_python(IMPORT_SCRIPT, backend_env(clean_fake))
    assert proc.returncode == 0, proc.stderr
    before, after_import, with_lfx, after_factory = map(int, proc.stdout.split())
    assert after_import == before
    assert after_factory == with_lfx
    # Nothing touched the control plane.
    assert sum(clean_fake.stats()["requests"].values()) == 0


FORK_SCRIPT = """
import os, sys, time
from langflow_sandbox_createos.backend import create_backend
backend = create_backend()
print("parent", backend.run("print('p1')").stdout.strip(), flush=True)
pid = os.fork()
if pid == 0:
    code = 1
    try:
        if sys.argv[1] == "reset":
            backend.reset_after_fork()
        print("child", backend.run("print('c1')").stdout.strip(), flush=True)
        code = 0
    finally:
        os._exit(code)
deadline = time.monotonic() + 60
while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    if time.monotonic() > deadline:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        print("child hung", flush=True)
        sys.exit(3)
    time.sleep(0.05)
print("child-exit", os.waitstatus_to_exitcode(status), flush=True)
print("parent", backend.run("print('p2')").stdout.strip(), flush=True)
backend.shutdown()
"""


@pytest.mark.parametrize("mode", ["reset", "pid-detection"])
def test_forked_child_runs_and_parent_keeps_working(clean_fake: Fake, mode: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT, mode],
        capture_output=True,
        text=True,
        env=backend_env(clean_fake),
        timeout=120,
        cwd=E2E,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout, proc.stderr[-3000:])
    lines = proc.stdout.split("\n")
    assert "parent p1" in lines
    assert "child c1" in lines
    assert "child-exit 0" in lines
    assert "parent p2" in lines
    stats = clean_fake.wait_settled()
    assert stats["created"] == 3


def test_forked_child_keeps_no_warm_pool_and_the_parent_keeps_its_own(clean_fake: Fake) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", FORK_SCRIPT, "pid-detection"],
        capture_output=True,
        text=True,
        env=backend_env(clean_fake, CREATEOS_SANDBOX_WARM_POOL="2"),
        timeout=120,
        cwd=E2E,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout, proc.stderr[-3000:])
    lines = proc.stdout.split("\n")
    assert "child c1" in lines
    assert "child-exit 0" in lines
    assert "parent p2" in lines
    # The child ended with os._exit: had it kept idle pool guests, they would still be live.
    # The parent's pool was destroyed by its shutdown.
    stats = clean_fake.wait_settled()
    assert stats["live"] == 0


SIGINT_SCRIPT = """
import signal
# A launcher without job control (`nohup`, `cmd &` in a script) starts its children with SIGINT
# ignored, and Python keeps it ignored; Ctrl-C in a terminal, which this models, is not.
signal.signal(signal.SIGINT, signal.default_int_handler)
from langflow_sandbox_createos.backend import create_backend
backend = create_backend()
print("ready", flush=True)
result = backend.run("import time\\ntime.sleep(120)")
print("finished without interruption", result.exit_code, flush=True)
"""


# Every native record is forwarded to Python logging, so a Ctrl-C is likely to land while
# Python code of the logging module runs: it must still interrupt the run.
SIGINT_WHILE_LOGGING_SCRIPT = """
import logging, os
logging.basicConfig(level=logging.DEBUG, stream=open(os.devnull, "w"))
""" + SIGINT_SCRIPT


@pytest.mark.parametrize("script", [SIGINT_SCRIPT, SIGINT_WHILE_LOGGING_SCRIPT], ids=["quiet", "debug-logging"])
def test_ctrl_c_interrupts_a_run_and_destroys_its_guest(clean_fake: Fake, script: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=backend_env(clean_fake),
        cwd=E2E,
    )
    try:
        clean_fake.wait_for(
            lambda s: s["live"] == 1 and s["requests"].get("exec", 0) + s["requests"].get("exec_stream", 0) >= 1,
            timeout=60,
        )
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert "KeyboardInterrupt" in stderr, (proc.returncode, stdout, stderr[-3000:])
    assert "finished without interruption" not in stdout
    stats = clean_fake.wait_settled()
    assert stats["created"] == 1
    assert stats["live"] == 0



ATEXIT_SCRIPT = """
import json, threading, time, urllib.request, os
from langflow_sandbox_createos.backend import create_backend
backend = create_backend()
threading.Thread(target=lambda: backend.run("import time\\ntime.sleep(120)"), daemon=True).start()
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    with urllib.request.urlopen(os.environ["CREATEOS_SANDBOX_BASE_URL"] + "/_fake/stats", timeout=5) as r:
        stats = json.loads(r.read())["data"]
    if stats["live"] == 1 and stats["requests"].get("exec", 0) + stats["requests"].get("exec_stream", 0):
        break
    time.sleep(0.05)
print("exiting with a live guest", flush=True)
"""


def test_interpreter_exit_destroys_live_guests_via_atexit(clean_fake: Fake) -> None:
    proc = run_python(ATEXIT_SCRIPT, backend_env(clean_fake), timeout=120)
    assert "exiting with a live guest" in proc.stdout, proc.stderr[-3000:]
    stats = clean_fake.wait_settled()
    assert stats["created"] == 1
    assert stats["live"] == 0


SECRET = "sk-e2e-DO-NOT-PRINT-7f3a91c2"

LEAK_SCRIPT = """
import logging, sys
logging.basicConfig(level=logging.DEBUG, stream=sys.stderr)
from langflow_sandbox_createos.backend import create_backend
backend = create_backend()
print(repr(backend), repr(backend._native))
try:
    backend.run("print(1)")
except Exception as exc:
    print("raised", type(exc).__name__, exc, repr(exc))
backend.shutdown()
"""


def test_key_never_appears_even_when_the_server_echoes_headers(tmp_path: object) -> None:
    from conftest import start_fake

    leaky = start_fake(key=SECRET, faults="*=echo-headers")
    try:
        # Every answer fails for good: give up after 3 s of retries instead of the default 30.
        env = backend_env(leaky, CREATEOS_CONTROL_PLANE_RETRY_SECONDS="3")
        proc = run_python(LEAK_SCRIPT, env, timeout=120)
        # The run failed because every answer was a 500 carrying the request headers.
        assert "raised" in proc.stdout, (proc.stdout, proc.stderr[-2000:])
        assert SECRET not in proc.stdout + proc.stderr
        # The same through lfx: its error JSON and its log.
        run = lfx_run(env, "print(1)")
        assert run.json["success"] is False
        assert SECRET not in run.stdout + run.stderr
        doctor = run_doctor(env)
        assert SECRET not in doctor.stdout + doctor.stderr
        # The server really does send the key back in its error bodies, so the absence above
        # is the backend's redaction at work, not a quiet server.
        request = urllib.request.Request(f"{leaky.url}/v1/sandboxes", headers={"X-Api-Key": SECRET})
        with pytest.raises(urllib.error.HTTPError) as echoed:
            urllib.request.urlopen(request, timeout=10)  # noqa: S310 - loopback
        assert SECRET in echoed.value.read().decode()
    finally:
        leaky.stop()
