"""Process lifecycle: forked children, SIGTERM, orphans. No guest outlives its process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from conftest import E2E, FAKE_KEY, Fake, backend_env, signal_lfx_run

# The parent runs once, waits until its guest is gone, then installs `argv[1]` as the fake's
# faults and forks. The child's run must fail; the child then ends with os._exit at once,
# the way multiprocessing and pre-fork servers end their workers.
FORK_FAILURE_SCRIPT = """
import json, os, sys, time, urllib.request
from langflow_sandbox_createos.backend import create_backend

base = os.environ["CREATEOS_SANDBOX_BASE_URL"]

def fake(method, path, body=None):
    request = urllib.request.Request(base + path, data=body, method=method)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["data"]

backend = create_backend()
print("parent", backend.run("print('p1')").stdout.strip(), flush=True)
deadline = time.monotonic() + 30
while fake("GET", "/_fake/stats")["live"] and time.monotonic() < deadline:
    time.sleep(0.05)
fake("PUT", "/_fake/faults", sys.argv[1].encode())
pid = os.fork()
if pid == 0:
    try:
        backend.run("print('c1')")
        print("child run succeeded", flush=True)
    except BaseException as exc:
        from lfx.utils.sandbox.base import SandboxExecutionError
        print("child raised", type(exc).__name__, isinstance(exc, SandboxExecutionError), flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child-exit", os.waitstatus_to_exitcode(status), flush=True)
"""


@pytest.mark.parametrize(
    "faults",
    [
        # The exec is answered 500 (the code may have run); the first DELETE is refused, so
        # the guest's destroy cannot finish before the child would have exited.
        pytest.param("exec_stream=500;delete=503#1", id="exec-500"),
        # The egress read-back (made because the create response showed no egress) is
        # answered 404: the run is refused after create.
        pytest.param("create=drop-egress;egress_get=404;delete=503#1", id="egress-404"),
    ],
)
def test_forked_child_whose_run_fails_leaves_no_guest(clean_fake: Fake, faults: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", FORK_FAILURE_SCRIPT, faults],
        capture_output=True,
        text=True,
        env=backend_env(clean_fake),
        timeout=120,
        cwd=E2E,
        check=False,
    )
    assert proc.returncode == 0, (proc.stdout, proc.stderr[-3000:])
    lines = proc.stdout.splitlines()
    assert "parent p1" in lines
    # One of the package's public errors, which lfx catches as its SandboxExecutionError.
    assert any(line.startswith("child raised Sandbox") and line.endswith("Error True") for line in lines), lines
    assert "child-exit 0" in lines
    # The child is gone; nothing else knows its guest. It must already be deleted.
    stats = clean_fake.wait_for(lambda s: s["live"] == 0, timeout=10)
    assert stats["created"] == 2


SLEEPING_CODE = "import time\nprint('started', flush=True)\ntime.sleep(120)"


def _exec_started(stats: dict) -> bool:
    return stats["live"] == 1 and stats["requests"].get("exec", 0) + stats["requests"].get("exec_stream", 0) >= 1


def test_sigterm_to_lfx_run_destroys_the_guest(clean_fake: Fake) -> None:
    env = backend_env(clean_fake, LANGFLOW_SANDBOX_TIMEOUT_SECONDS="120")
    run = signal_lfx_run(env, SLEEPING_CODE, signal.SIGTERM, lambda: _exec_started(clean_fake.stats()))
    # It dies of SIGTERM, as it would have without the backend, and reports no result.
    assert run.returncode == -signal.SIGTERM, (run.returncode, run.stdout[-2000:], run.stderr[-3000:])
    assert '"success"' not in run.stdout
    stats = clean_fake.wait_for(lambda s: s["live"] == 0, timeout=15)
    assert stats["created"] == 1


def test_ctrl_c_of_lfx_run_destroys_the_guest_and_exits_at_once(clean_fake: Fake) -> None:
    # lfx runs the sandbox call on a worker thread, which Python's KeyboardInterrupt never
    # reaches: the run must still be cancelled, not waited for (120 s here).
    env = backend_env(clean_fake, LANGFLOW_SANDBOX_TIMEOUT_SECONDS="120")
    run = signal_lfx_run(env, SLEEPING_CODE, signal.SIGINT, lambda: _exec_started(clean_fake.stats()))
    assert run.returncode != 0 and '"success": true' not in run.stdout, (run.returncode, run.stderr[-3000:])
    assert run.took < 15, run.took
    stats = clean_fake.wait_for(lambda s: s["live"] == 0, timeout=5)
    assert stats["created"] == 1


SIGTERM_IN_THREAD_SCRIPT = """
import threading
from langflow_sandbox_createos.backend import create_backend
backend = create_backend()
# A worker thread runs, as lfx does (asyncio.to_thread); the main thread just waits.
threading.Thread(target=lambda: backend.run("import time\\ntime.sleep(120)"), daemon=True).start()
print("ready", flush=True)
threading.Event().wait(120)
print("not terminated", flush=True)
"""


def test_sigterm_during_a_run_in_a_worker_thread(clean_fake: Fake) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGTERM_IN_THREAD_SCRIPT],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=backend_env(clean_fake, LANGFLOW_SANDBOX_TIMEOUT_SECONDS="120"),
        cwd=E2E,
    )
    try:
        clean_fake.wait_for(_exec_started, timeout=60)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, stdout, stderr[-3000:])
    assert "not terminated" not in stdout
    assert clean_fake.wait_for(lambda s: s["live"] == 0, timeout=15)["created"] == 1


KEEP_HANDLER_SCRIPT = """
import os, signal, time
got = []

def mine(signum, frame):
    got.append(signum)

signal.signal(signal.SIGTERM, mine)
from langflow_sandbox_createos.backend import create_backend
backend = create_backend()
print("ran", backend.run("print(1)").stdout.strip(), flush=True)
print("same handler", signal.getsignal(signal.SIGTERM) is mine, flush=True)
os.kill(os.getpid(), signal.SIGTERM)
deadline = time.monotonic() + 10
while not got and time.monotonic() < deadline:
    time.sleep(0.01)
print("handler ran", got == [signal.SIGTERM], flush=True)
# Had the backend taken SIGTERM over, it would end the process well within this second.
time.sleep(1)
print("still alive", flush=True)
backend.shutdown()
"""


def test_a_sigterm_handler_installed_by_the_host_is_left_in_place(clean_fake: Fake) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", KEEP_HANDLER_SCRIPT],
        capture_output=True,
        text=True,
        env=backend_env(clean_fake),
        timeout=120,
        cwd=E2E,
        check=False,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    lines = proc.stdout.splitlines()
    assert lines == ["ran 1", "same handler True", "handler ran True", "still alive"], lines
    clean_fake.wait_settled()


def _api(fake: Fake, method: str, path: str, body: dict | None = None) -> dict:
    request = urllib.request.Request(
        f"{fake.url}{path}",
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"X-Api-Key": fake.key, "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback
        return json.loads(response.read())["data"]


def _guest(fake: Fake, name: str, *, paused: bool) -> str:
    sandbox_id = _api(fake, "POST", "/v1/sandboxes", {"shape": "s-1vcpu-1gb", "name": name})["id"]
    if paused:
        _api(fake, "POST", f"/v1/sandboxes/{sandbox_id}/pause")
    return sandbox_id


def _status(fake: Fake, sandbox_id: str) -> str:
    try:
        return _api(fake, "GET", f"/v1/sandboxes/{sandbox_id}")["status"]
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return "gone"
        raise


def _reap(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "langflow_sandbox_createos", "reap", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=E2E,
        check=False,
    )


ORPHAN = "lf-0rphan0000000000000"


def test_reap_deletes_only_paused_one_shot_guests_and_dry_run_deletes_nothing(clean_fake: Fake) -> None:
    orphan = _guest(clean_fake, ORPHAN, paused=True)
    others = {
        "running one-shot": _guest(clean_fake, "lf-runn1ng000000000000", paused=False),
        "reused (lf-c-)": _guest(clean_fake, "lf-c-reused00000000000", paused=True),
        "not ours": _guest(clean_fake, "build-cache", paused=True),
    }
    env = backend_env(clean_fake)

    dry = _reap(env, "--dry-run")
    assert dry.returncode == 0, (dry.stdout, dry.stderr[-3000:])
    assert f"would delete {ORPHAN} ({orphan})" in dry.stdout.splitlines()
    assert "1 orphaned guest(s) would be deleted (dry run)" in dry.stdout
    assert _status(clean_fake, orphan) == "paused"
    assert clean_fake.stats()["requests"].get("delete", 0) == 0

    done = _reap(env)
    assert done.returncode == 0, (done.stdout, done.stderr[-3000:])
    assert f"deleted {ORPHAN} ({orphan})" in done.stdout.splitlines()
    assert _status(clean_fake, orphan) in ("destroying", "destroyed", "gone")
    for what, sandbox_id in others.items():
        assert _status(clean_fake, sandbox_id) in ("running", "paused"), what
    # Nothing of any other name was mentioned.
    assert done.stdout.count("deleted lf-") == 1
    assert "1 orphaned guest(s) deleted" in done.stdout


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        pytest.param({"CREATEOS_SANDBOX_API_KEY": None}, "CREATEOS_SANDBOX_API_KEY", id="no-key"),
        pytest.param({"CREATEOS_SANDBOX_API_KEY": "wrong-key"}, "401", id="wrong-key"),
    ],
)
def test_reap_fails_clearly(clean_fake: Fake, overrides: dict[str, str | None], needle: str) -> None:
    orphan = _guest(clean_fake, ORPHAN, paused=True)
    proc = _reap(backend_env(clean_fake, **overrides))
    assert proc.returncode != 0
    assert proc.stderr.startswith("reap failed: "), proc.stderr[-3000:]
    assert needle in proc.stderr
    assert "wrong-key" not in proc.stdout + proc.stderr
    assert _status(clean_fake, orphan) == "paused"


# Threads log through the native bridge without pause while the main thread forks again and
# again; each child logs one record and must see it arrive in Python's logging. About one child
# in twenty inherits the queue's mutex locked (measured): it hung once, and later dropped its
# records; now it moves on to a fresh queue.
# A before-fork hook sleeps, so the forking thread lets go of the GIL during os.fork, as any
# library's Python hook may. When the bridge held its queue across the fork in a hook of its
# own, a logging thread then took the GIL and waited for the queue: the parent deadlocked in
# os.fork within a few forks. The bridge now holds nothing across a fork.
FORK_WHILE_LOGGING_SCRIPT = """
import logging, os, sys, threading, time, warnings
warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded, use of fork()"
os.register_at_fork(before=lambda: time.sleep(0.002))
from langflow_sandbox_createos import _native

logging.basicConfig(level=logging.INFO, stream=sys.stderr)
logging.getLogger(_native.LOGGER_NAME).propagate = False  # keep the spam off stderr
stop = threading.Event()

def spam():
    while not stop.is_set():
        _native._emit_log_records(5000, "spam")

spammers = [threading.Thread(target=spam, daemon=True) for _ in range(3)]
for thread in spammers:
    thread.start()
time.sleep(0.3)
ok = hung = failed = 0
for i in range(100):
    pid = os.fork()
    if pid == 0:
        seen = []
        handler = logging.Handler()
        handler.emit = lambda record: seen.append(record.getMessage())
        logging.getLogger(_native.LOGGER_NAME).addHandler(handler)
        _native._emit_log_records(1, f"child {i}")
        os._exit(0 if any(m.startswith(f"child {i}") for m in seen) else 2)
    deadline = time.monotonic() + 20
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            ok += code == 0
            failed += code != 0
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            hung += 1
            break
        time.sleep(0.01)
stop.set()
for thread in spammers:
    thread.join(60)
print("ok", ok, "failed", failed, "hung", hung, flush=True)
"""


def test_a_child_forked_while_another_thread_logs_can_log(clean_fake: Fake) -> None:
    try:
        proc = subprocess.run(
            [sys.executable, "-c", FORK_WHILE_LOGGING_SCRIPT],
            capture_output=True,
            text=True,
            env=backend_env(clean_fake),
            timeout=300,  # 100 forks take a few seconds; each hung child costs 20 s
            cwd=E2E,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the forking process hung: a thread waited for the log queue holding the GIL")
    assert proc.returncode == 0, (proc.stdout, proc.stderr[-3000:])
    assert proc.stdout.split() == ["ok", "100", "failed", "0", "hung", "0"], (proc.stdout, proc.stderr[-3000:])


# A thread holds the log queue while the process forks, so the child inherits it locked by a
# thread it does not have; the child does the same to a grandchild, three deep. Each must log
# (on a fresh queue), and the parent logs once the holder lets go.
FORK_WHILE_QUEUE_HELD_SCRIPT = """
import logging, os, threading, time
from langflow_sandbox_createos import _native

seen = []
handler = logging.Handler()
handler.emit = lambda record: seen.append(record.getMessage())
log = logging.getLogger(_native.LOGGER_NAME)
log.addHandler(handler)
log.setLevel(logging.INFO)
log.propagate = False

def logs(message):
    seen.clear()
    _native._emit_log_records(1, message)
    return any(m.startswith(message) for m in seen)

def fork_while_held(depth):
    holder = threading.Thread(target=_native._hold_log_queue, args=(1.5,))
    holder.start()
    time.sleep(0.3)
    pid = os.fork()
    if pid == 0:
        ok = logs(f"depth {depth}") and (depth == 3 or fork_while_held(depth + 1))
        os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    holder.join()
    return os.waitstatus_to_exitcode(status) == 0

children = fork_while_held(1)
print("children", children, "parent", logs("parent"), flush=True)
"""


def test_a_child_forked_while_the_log_queue_is_held_logs_on_a_fresh_queue() -> None:
    try:
        proc = subprocess.run(
            [sys.executable, "-c", FORK_WHILE_QUEUE_HELD_SCRIPT],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=E2E,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("a child that inherited the log queue locked hung")
    assert proc.returncode == 0, (proc.stdout, proc.stderr[-3000:])
    assert proc.stdout.split() == ["children", "True", "parent", "True"], (proc.stdout, proc.stderr[-3000:])


def _run_bounded(script: str, env: dict[str, str], timeout: float, *args: str) -> subprocess.CompletedProcess[str]:
    """Runs `script` in its own session; on timeout every process of that session is killed
    (forked children included), so a hung child cannot outlive the test."""
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=E2E,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=10)
        pytest.fail(f"the script hung for {timeout} s: {stdout[-2000:]!r} {stderr[-3000:]!r}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


# Fake helpers the scripts below share: the fake's control routes, and waiting on its stats.
FAKE_HELPERS = """
import json, os, time, urllib.request

def fake(method, path, body=None):
    request = urllib.request.Request(os.environ["CREATEOS_SANDBOX_BASE_URL"] + path, data=body, method=method)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["data"]

def wait_fake(predicate, what, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        stats = fake("GET", "/_fake/stats")
        if predicate(stats):
            return stats
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}: {stats}")
        time.sleep(0.05)

def execs(stats):
    return stats["requests"].get("exec", 0) + stats["requests"].get("exec_stream", 0)

def exit_of(status):
    if os.WIFSIGNALED(status):
        return f"signal {os.WTERMSIG(status)}"
    return f"exit {os.WEXITSTATUS(status)}"

def wait_child(pid, timeout):
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return exit_of(status)
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return f"alive after {timeout} s"
        time.sleep(0.02)
"""

# After one run in the parent (which arms its SIGTERM handling), the parent forks a child that
# runs nothing and sends it one SIGTERM. With `early`, a fork hook registered before the
# parent's first run (so it runs in the child before the plugin's own) sends the child its
# SIGTERM at once, as a `Pool.terminate()` right after the fork would.
FORKED_IDLE_CHILD_SCRIPT = (
    FAKE_HELPERS
    + """
import signal, sys, warnings
warnings.simplefilter("ignore", DeprecationWarning)  # "multi-threaded, use of fork()"
from langflow_sandbox_createos.backend import create_backend

early = sys.argv[1] == "early"
if early:
    os.register_at_fork(after_in_child=lambda: os.kill(os.getpid(), signal.SIGTERM))
backend = create_backend()
print("parent", backend.run("print('p1')").stdout.strip(), flush=True)
print("handler reported", signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, flush=True)
ready_r, ready_w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(ready_r)
    os.write(ready_w, b"r")
    time.sleep(60)
    os._exit(0)
os.close(ready_w)
os.read(ready_r, 1)  # the child is up (or, with `early`, already gone)
if not early:
    os.kill(pid, signal.SIGTERM)
print("child", wait_child(pid, 10), flush=True)
print("parent", backend.run("print('p2')").stdout.strip(), flush=True)
"""
)


@pytest.mark.parametrize("when", ["idle", "early"])
def test_a_forked_child_that_ran_nothing_dies_of_the_first_sigterm(clean_fake: Fake, when: str) -> None:
    proc = _run_bounded(FORKED_IDLE_CHILD_SCRIPT, backend_env(clean_fake), 120, when)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    lines = proc.stdout.splitlines()
    # As it would without the plugin: killed by that one SIGTERM, promptly.
    assert lines == ["parent p1", "handler reported True", f"child signal {signal.SIGTERM}", "parent p2"], (
        lines,
        proc.stderr[-3000:],
    )
    clean_fake.wait_settled()


# A `multiprocessing.Pool` (fork) made after a parent run; two workers sleep in a task, the
# third sleeps inside a sandbox run. terminate() + join() must return (bounded here at 20 s,
# after which the script kills the workers itself and says so).
POOL_TERMINATE_SCRIPT = (
    FAKE_HELPERS
    + """
import multiprocessing, threading, warnings
warnings.simplefilter("ignore", DeprecationWarning)
from langflow_sandbox_createos.backend import create_backend

def nap(seconds):
    time.sleep(seconds)

def sandbox_nap(seconds):
    return create_backend().run(f"import time\\ntime.sleep({seconds})").stdout

backend = create_backend()
print("parent", backend.run("print('p1')").stdout.strip(), flush=True)
wait_fake(lambda s: s["live"] == 0, "the parent's guest to go")
pool = multiprocessing.get_context("fork").Pool(3)
pending = [pool.apply_async(nap, (120,)), pool.apply_async(nap, (120,)), pool.apply_async(sandbox_nap, (120,))]
wait_fake(lambda s: s["live"] == 1 and execs(s) >= 2, "the worker's guest to run")
time.sleep(0.5)
started = time.monotonic()
stopper = threading.Thread(target=lambda: (pool.terminate(), pool.join()), daemon=True)
stopper.start()
stopper.join(20)
if stopper.is_alive():
    print("terminate+join still blocked after 20 s", flush=True)
    for child in multiprocessing.active_children():
        child.kill()
    stopper.join(30)
else:
    print("terminate+join returned", flush=True)
print("parent", backend.run("print('p2')").stdout.strip(), flush=True)
"""
)


def test_pool_terminate_after_a_parent_run_ends_busy_workers(clean_fake: Fake) -> None:
    env = backend_env(clean_fake, LANGFLOW_SANDBOX_TIMEOUT_SECONDS="180")
    proc = _run_bounded(POOL_TERMINATE_SCRIPT, env, 180)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    lines = proc.stdout.splitlines()
    assert lines == ["parent p1", "terminate+join returned", "parent p2"], (lines, proc.stderr[-3000:])
    # The busy worker's guest is gone with it (the parent's runs destroyed theirs).
    stats = clean_fake.wait_settled()
    assert stats["created"] == 3, stats


# The parent holds a guest (a run in a thread, whose guest waits for a byte from the parent),
# then forks a child that runs code of its own; the child is sent SIGTERM mid-run. The child
# must destroy its guest and die of SIGTERM; the parent's guest must still be running, and the
# parent still able to run.
FORKED_RUNNING_CHILD_SCRIPT = (
    FAKE_HELPERS
    + """
import signal, socket, threading, warnings
warnings.simplefilter("ignore", DeprecationWarning)
from langflow_sandbox_createos.backend import create_backend

backend = create_backend()
print("parent", backend.run("print('p1')").stdout.strip(), flush=True)
wait_fake(lambda s: s["live"] == 0 and s["destroyed"] == 1, "the parent's first guest to go")
# The fake's guests are local processes: the held guest connects back and waits for a byte.
listener = socket.create_server(("127.0.0.1", 0))
port = listener.getsockname()[1]
code = f"import socket\\ns = socket.create_connection(('127.0.0.1', {port}))\\ns.recv(1)\\nprint('held')"
held = []
holder = threading.Thread(target=lambda: held.append(backend.run(code).stdout.strip()))
holder.start()
listener.settimeout(60)
guest, _ = listener.accept()
pid = os.fork()
if pid == 0:
    backend.run("import time\\ntime.sleep(120)")
    os._exit(0)
wait_fake(lambda s: s["live"] == 2 and execs(s) >= 3, "the child's guest to run")
os.kill(pid, signal.SIGTERM)
print("child", wait_child(pid, 30), flush=True)
stats = wait_fake(lambda s: s["live"] == 1 and s["destroyed"] == 2, "the child's guest to go")
print("live", stats["live"], "created", stats["created"], flush=True)
print("parent", backend.run("print('p3')").stdout.strip(), flush=True)
guest.sendall(b"x")
holder.join(60)
print("held run", held, flush=True)
"""
)


def test_a_forked_child_sigtermed_mid_run_destroys_only_its_own_guest(clean_fake: Fake) -> None:
    env = backend_env(clean_fake, LANGFLOW_SANDBOX_TIMEOUT_SECONDS="180")
    proc = _run_bounded(FORKED_RUNNING_CHILD_SCRIPT, env, 180)
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    lines = proc.stdout.splitlines()
    assert lines == [
        "parent p1",
        f"child signal {signal.SIGTERM}",
        # p1's guest and the child's are destroyed; the parent's held guest still runs.
        "live 1 created 3",
        "parent p3",
        "held run ['held']",
    ], (lines, proc.stderr[-3000:])
    assert clean_fake.wait_settled()["created"] == 4


# One run returns while the fake refuses every DELETE, so its guest is still registered when
# SIGTERM arrives; the cleanup then fails for the whole shutdown budget, with no thread left
# that would hand its records to Python's logging. A child forked during that cleanup (the
# parent already has the SIGTERM) must not die of it.
SIGTERM_CLEANUP_LOGS_SCRIPT = (
    FAKE_HELPERS
    + """
import logging, signal, threading, warnings
warnings.simplefilter("ignore", DeprecationWarning)
from langflow_sandbox_createos import _native
from langflow_sandbox_createos.backend import create_backend

logging.getLogger(_native.LOGGER_NAME).setLevel(logging.INFO)
fake("PUT", "/_fake/faults", b"delete=503")
backend = create_backend()
print("ran", backend.run("print(1)").stdout.strip(), flush=True)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(1)
pid = os.fork()
if pid == 0:
    time.sleep(0.5)
    os._exit(7)
print("child", wait_child(pid, 15), flush=True)
threading.Event().wait(120)
print("not terminated", flush=True)
"""
)


def test_sigterm_cleanup_records_reach_stderr_before_the_process_dies(clean_fake: Fake) -> None:
    proc = _run_bounded(SIGTERM_CLEANUP_LOGS_SCRIPT, backend_env(clean_fake), 120)
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, proc.stdout, proc.stderr[-3000:])
    assert proc.stdout.splitlines() == ["ran 1", "child exit 7"], (proc.stdout, proc.stderr[-3000:])
    lines = proc.stderr.splitlines()
    prefix = "INFO:langflow_sandbox_createos:"
    assert f"{prefix}SIGTERM: destroying this process's guests, then exiting" in lines, proc.stderr[-3000:]
    # Whether the reaper or the shutdown held the guest at the deadline, the failure is said.
    failures = [line for line in lines if line.startswith("ERROR:langflow_sandbox_createos:")]
    assert any("guest" in line and "auto-pause bounds its cost" in line for line in failures), proc.stderr[-3000:]
    summary = [line for line in lines if line.startswith(f"{prefix}sandbox backend shut down")]
    assert len(summary) == 1, proc.stderr[-3000:]
    assert "failed=1" in summary[0]
    assert FAKE_KEY not in proc.stderr


# Under a cap of one live guest, the parent holds its one guest in a thread and forks. The
# child's run is admitted at once (with no wait allowed): its counts are its own, not the
# parent's. Each process's native counters show only its own runs.
FORK_COUNTS_SCRIPT = """
import json, os, threading, time, urllib.request
from langflow_sandbox_createos import _native
from langflow_sandbox_createos.backend import create_backend

base = os.environ["CREATEOS_SANDBOX_BASE_URL"]

def live():
    with urllib.request.urlopen(base + "/_fake/stats", timeout=10) as response:
        return json.loads(response.read())["data"]["live"]

def total(name, **labels):
    return sum(v for n, l, v in _native.counters() if n == name and all(l.get(k) == x for k, x in labels.items()))

backend = create_backend()
held = threading.Thread(target=lambda: backend.run("import time\\ntime.sleep(3)\\nprint('held')"))
held.start()
deadline = time.monotonic() + 30
while not live() and time.monotonic() < deadline:
    time.sleep(0.02)
print("parent admitted", total("createos_admission_live"), flush=True)
pid = os.fork()
if pid == 0:
    os.environ["CREATEOS_ADMISSION_WAIT_SECONDS"] = "0"  # refused at once if it were counted
    try:
        out = backend.run("print('c1')").stdout.strip()
        print("child", out, total("createos_runs_total", surface="backend", outcome="ok"), flush=True)
    except BaseException as exc:
        print("child raised", type(exc).__name__, exc, flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
held.join()
print("parent runs", total("createos_runs_total", surface="backend", outcome="ok"), flush=True)
try:
    backend.run("print('p2')")
except BaseException as exc:
    print("unexpected", exc, flush=True)
print("parent runs", total("createos_runs_total", surface="backend", outcome="ok"), flush=True)
"""


def test_a_forked_child_counts_its_own_guests(clean_fake: Fake) -> None:
    env = backend_env(clean_fake, CREATEOS_MAX_LIVE_GUESTS="1")
    proc = _run_bounded(FORK_COUNTS_SCRIPT, env, 120)
    assert proc.returncode == 0, (proc.stdout, proc.stderr[-3000:])
    lines = proc.stdout.splitlines()
    assert "parent admitted 1.0" in lines, lines
    # At the parent's cap, yet the child's run was admitted: its count started at zero.
    assert "child c1 1.0" in lines, lines
    assert lines.count("parent runs 1.0") == 1 and "parent runs 2.0" in lines, lines
    stats = clean_fake.wait_for(lambda s: s["live"] == 0, timeout=10)
    assert stats["created"] == 3
