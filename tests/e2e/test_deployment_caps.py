"""One cap for a whole deployment: several worker processes on several "hosts", one store.

``CREATEOS_ADMISSION_STORE`` puts ``CREATEOS_MAX_LIVE_GUESTS`` in the deployment's Redis or
PostgreSQL, so it holds for every worker of every host. Here real worker processes (each its own
Python with the installed wheel, entered through lfx's ``lfx.sandbox_backends`` factory), in two
"host" process groups (``CREATEOS_HOST_ID``), run against one fake control plane, and the fake's
own peak of live guests is the judge. Also: a worker killed with SIGKILL gives its places back
within one lease, and the store stopped mid-run does what each ``..._ON_FAILURE`` setting says,
leaking nothing.

Redis is a ``redis-server`` this module starts (so a test can stop it); PostgreSQL is the one at
``CREATEOS_TEST_POSTGRES_URL`` (scripts/stores; scripts/test starts both). Without them a test
skips and says why, except under CI, where a missing server fails.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import Fake, backend_env, free_port, http_json, run_doctor

CAP = 8

WORKER = r"""
import json, sys, threading, time, os
from importlib.metadata import entry_points

(factory,) = [ep for ep in entry_points(group="lfx.sandbox_backends") if ep.name == "createos"]
backend = factory.load()()
n, code, flag = int(sys.argv[1]), sys.argv[2], sys.argv[3]
waves = [n] if flag == "-" else [n, int(sys.argv[4])]
second = sys.argv[5] if flag != "-" else ""
results = []

def one(code, out):
    t0 = time.monotonic()
    try:
        r = backend.run(code)
        out.append(("ok" if r.exit_code == 0 else f"exit {r.exit_code}: {r.stderr[-300:]}", time.monotonic() - t0))
    except Exception as e:
        out.append((f"{type(e).__name__}: {e}", time.monotonic() - t0))

for w, count in enumerate(waves):
    if w == 1:
        print("WAVE1", flush=True)
        while not os.path.exists(flag):
            time.sleep(0.05)
        code = second
    out = []
    threads = [threading.Thread(target=one, args=(code, out)) for _ in range(count)]
    for t in threads:
        t.start()
    print("STARTED", flush=True)
    for t in threads:
        t.join()
    results.append(out)
from langflow_sandbox_createos import _native
counters = {name: value for name, _, value in _native.counters() if name.startswith("createos_admission")}
backend.shutdown()
scrape = []
try:
    from prometheus_client import REGISTRY, generate_latest
    from langflow_sandbox_createos import metrics
    metrics.drain()
    scrape = [l for l in generate_latest(REGISTRY).decode().splitlines() if l.startswith("createos_admission_store")]
except ImportError:
    scrape = None
print("RESULT " + json.dumps({"waves": results, "counters": counters, "pid": os.getpid(), "scrape": scrape}), flush=True)
"""

NAP = "import time\ntime.sleep(0.2)\nprint('ok')"


def in_ci() -> bool:
    return os.environ.get("CI") == "true"


def need(what: str) -> None:
    if in_ci():
        pytest.fail(f"{what}: CI must provide it (scripts/test starts the admission stores)")
    pytest.skip(f"{what}; scripts/stores starts the servers (as root it installs them)")


@dataclass
class Redis:
    url: str
    port: int
    proc: subprocess.Popen[bytes]

    def command(self, *args: str) -> bytes:
        payload = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            s.sendall(payload.encode())
            return s.recv(65536)

    def zcard(self, key: str) -> int:
        reply = self.command("ZCARD", key)
        assert reply.startswith(b":"), reply
        return int(reply[1:].split(b"\r\n")[0])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[Redis]:
    binary = shutil.which("redis-server")
    if binary is None:
        need("redis-server is not installed")
    assert binary is not None
    port = free_port()
    proc = subprocess.Popen(
        [binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = Redis(url=f"redis://127.0.0.1:{port}/0", port=port, proc=proc)
    deadline = time.monotonic() + 20
    while True:
        try:
            if server.command("PING").startswith(b"+PONG"):
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, "redis-server did not start"
        time.sleep(0.05)
    try:
        yield server
    finally:
        server.stop()


def postgres_url() -> str:
    url = os.environ.get("CREATEOS_TEST_POSTGRES_URL", "")
    if not url:
        need("CREATEOS_TEST_POSTGRES_URL is unset")
    return url


@dataclass
class Worker:
    proc: subprocess.Popen[str]
    host: str

    def result(self, timeout: float = 300) -> dict[str, Any]:
        out, err = self.proc.communicate(timeout=timeout)
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        assert lines, (self.proc.returncode, out[-2000:], err[-4000:])
        return json.loads(lines[-1].removeprefix("RESULT "))

    def wait_line(self, marker: str, timeout: float = 60) -> None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.strip() == marker:
                return
            if not line and self.proc.poll() is not None:
                break
        raise AssertionError(f"the worker never printed {marker}")


def start_worker(env: dict[str, str], host: str, runs: int, code: str = NAP, *extra: str) -> Worker:
    args = [sys.executable, "-c", WORKER, str(runs), code, *(extra or ("-",))]
    proc = subprocess.Popen(
        args,
        env={**env, "CREATEOS_HOST_ID": host},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # each worker is its own process group: a "host" of its own
    )
    return Worker(proc=proc, host=host)


def deployment_env(fake: Fake, store: str, namespace: str, **extra: str) -> dict[str, str]:
    settings = {
        "CREATEOS_ADMISSION_STORE": store,
        "CREATEOS_ADMISSION_NAMESPACE": namespace,
        "CREATEOS_MAX_LIVE_GUESTS": str(CAP),
        "CREATEOS_ADMISSION_WAIT_SECONDS": "150",
        "LANGFLOW_SANDBOX_TIMEOUT_SECONDS": "180",
    }
    return backend_env(fake, **{**settings, **extra})


def outcomes(results: list[dict[str, Any]], wave: int = 0) -> list[tuple[str, float]]:
    return [tuple(o) for r in results for o in r["waves"][wave]]  # type: ignore[misc]


@pytest.mark.parametrize("kind", ["redis", "postgres"])
def test_three_workers_on_two_hosts_share_one_cap_of_8_over_200_runs(
    clean_fake: Fake, kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    store = request.getfixturevalue("redis_server").url if kind == "redis" else postgres_url()
    namespace = f"e2e-{uuid.uuid4().hex[:8]}"
    usage_log = tmp_path / "usage.jsonl"
    env = deployment_env(clean_fake, store, namespace, CREATEOS_USAGE_LOG=str(usage_log))
    # Two workers on host-a, one on host-b: 67 + 67 + 66 concurrent runs.
    workers = [
        start_worker(env, "host-a", 67),
        start_worker(env, "host-a", 67),
        start_worker(env, "host-b", 66),
    ]
    results = [w.result() for w in workers]
    runs = outcomes(results)
    assert len(runs) == 200
    bad = [o for o, _ in runs if o != "ok" and "CREATEOS_MAX_LIVE_GUESTS=8" not in o]
    assert not bad, bad[:5]
    served = sum(1 for o, _ in runs if o == "ok")
    stats = clean_fake.wait_for(lambda s: s["live"] == 0, timeout=60)
    assert stats["peak_live"] <= CAP, f"the account saw {stats['peak_live']} guests live at once under a deployment cap of {CAP}"
    assert stats["peak_live"] >= 2, stats  # the runs did contend
    assert stats["created"] == served, (stats, served)
    # Usage records add up across the deployment: three workers, two hosts.
    records = [json.loads(line) for line in usage_log.read_text().splitlines()]
    assert len(records) == served
    assert {r["worker"] for r in records} == {r["pid"] for r in results}
    assert {r["host"] for r in records} == {"host-a", "host-b"}
    if kind == "redis":
        server = request.getfixturevalue("redis_server")
        deadline = time.monotonic() + 10
        while server.zcard(f"{namespace}:guests") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.zcard(f"{namespace}:guests") == 0, "every lease was released"
    print(f"{kind}: {served} served, {200 - served} refused at the cap, peak live {stats['peak_live']}")


def test_a_worker_killed_with_sigkill_gives_its_places_back_within_one_lease(
    clean_fake: Fake, redis_server: Redis, tmp_path: Path
) -> None:
    lease = 3.0
    namespace = f"e2e-{uuid.uuid4().hex[:8]}"
    env = deployment_env(clean_fake, redis_server.url, namespace, CREATEOS_ADMISSION_LEASE_SECONDS=str(lease))
    # Another host's worker, warmed up by one run (a process's first run pays for its start-up),
    # then holding back its second wave until the doomed worker holds every place.
    flag = tmp_path / "go"
    waiting = start_worker(env, "host-b", 1, NAP, str(flag), "4", NAP)
    waiting.wait_line("WAVE1", timeout=120)
    doomed = start_worker(env, "host-a", CAP, "import time\ntime.sleep(120)")
    clean_fake.wait_for(lambda s: s["live"] == CAP and s["peak_concurrent_execs"] == CAP, timeout=60)
    assert redis_server.zcard(f"{namespace}:guests") == CAP
    flag.touch()
    waiting.wait_line("STARTED")
    time.sleep(1.5)
    assert clean_fake.stats()["created"] == CAP + 1, "nobody got past the cap while the doomed worker held it"
    os.killpg(doomed.proc.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    doomed.proc.wait(timeout=10)
    # The first place back: the waiting worker's first create.
    clean_fake.wait_for(lambda s: s["created"] > CAP + 1, timeout=lease + 10)
    slots_back = time.monotonic() - killed_at
    result = waiting.result(timeout=120)
    took = time.monotonic() - killed_at
    runs = [o for o, _ in result["waves"][1]]
    assert runs == ["ok"] * 4, runs
    # Back within one lease (its last renewal was at most a third of a lease before the kill),
    # plus the waiter's poll step (at most 250 ms) and this test's own 50 ms one.
    assert slots_back < lease + 0.5, f"the killed worker's places came back after {slots_back:.1f}s (lease {lease}s)"
    assert redis_server.zcard(f"{namespace}:guests") == 0
    print(f"SIGKILL: first place back {slots_back:.2f}s after the kill, all 4 runs served after {took:.1f}s (lease {lease}s)")


class LeaseView:
    """The leases one process holds in the store that still count (their expiry, by the store's
    own clock, is ahead): what an acquire of another worker counts against the cap."""

    def __init__(self, kind: str, store: str, namespace: str, request: pytest.FixtureRequest) -> None:
        self.kind, self.store, self.key = kind, store, f"{namespace}:guests"
        self.redis: Redis | None = request.getfixturevalue("redis_server") if kind == "redis" else None
        self.psql = shutil.which("psql")
        if kind == "postgres" and self.psql is None:
            need("psql is not installed (Debian's postgresql-client)")

    def live(self, holder: str) -> int:
        if self.redis is not None:
            script = (
                "local t = redis.call('TIME') "
                "local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) "
                "local n = 0 "
                "for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')) do "
                "if string.sub(id, 1, #ARGV[1]) == ARGV[1] then n = n + 1 end end "
                "return n"
            )
            reply = self.redis.command("EVAL", script, "1", self.key, holder + "/")
            assert reply.startswith(b":"), reply
            return int(reply[1:].split(b"\r\n")[0])
        assert self.psql is not None
        sql = (
            "SELECT count(*) FROM createos_admission_leases WHERE key = :'key' AND holder = :'holder' "
            "AND expires_at > clock_timestamp()"
        )
        out = subprocess.run(
            [self.psql, self.store, "-Atq", "-v", f"key={self.key}", "-v", f"holder={holder}"],
            input=sql,
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
        return int(out.stdout.strip())


def live_guests(fake: Fake) -> list[dict[str, Any]]:
    """The account's guests that no DELETE has reached, as the control plane lists them."""
    body = http_json("GET", f"{fake.url}/v1/sandboxes?limit=500", api_key=fake.key)["data"]
    rows = body["data"] if isinstance(body, dict) else body
    return [g for g in rows if g["status"] not in ("destroying", "destroyed")]


@pytest.mark.parametrize("kind", ["redis", "postgres"])
def test_200_runs_with_one_worker_killed_mid_run_get_its_places_back_within_one_lease(
    clean_fake: Fake, kind: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """The 200-run proof with one of its three workers SIGKILLed while it holds places.

    The killed worker's leases stop counting within one lease time (measured in the store), the
    survivors' runs are all served or refused with the cap named, the account never holds more
    than the cap plus the guests the dead worker left behind (once its leases expired those are
    outside every worker's count, as the lease time says), and those orphans, paused as the
    idle backstop pauses them, are deleted by ``reap``: 0 live after."""
    lease = 3.0
    store = request.getfixturevalue("redis_server").url if kind == "redis" else postgres_url()
    namespace = f"e2e-{uuid.uuid4().hex[:8]}"
    view = LeaseView(kind, store, namespace, request)
    env = deployment_env(clean_fake, store, namespace, CREATEOS_ADMISSION_LEASE_SECONDS=str(lease))
    survivors = [start_worker(env, "host-a", 67), start_worker(env, "host-b", 66)]
    doomed = start_worker(env, "host-a", 67)
    holder = f"host-a/{doomed.proc.pid}"
    try:
        # Mid-run: the survivors are contending and the doomed worker holds places.
        deadline = time.monotonic() + 120
        while not (clean_fake.stats()["created"] >= 3 * CAP and view.live(holder) >= 1):
            assert time.monotonic() < deadline, ("the runs never got going", clean_fake.stats())
            assert doomed.proc.poll() is None, "the doomed worker finished before it was killed"
            time.sleep(0.02)
        os.killpg(doomed.proc.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        doomed.proc.wait(timeout=10)
        held = view.live(holder)
        # Its places stop counting within one lease of the kill (its last renewal was at most a
        # third of a lease before it). Meanwhile the account holds at most the cap plus one orphan
        # per place already expired (leases taken after its last renewal expire later than the
        # rest, and the survivors may take each place as it comes back).
        while (still := view.live(holder)) > 0:
            assert clean_fake.stats()["live"] <= CAP + (held - still), (still, held, clean_fake.stats())
            assert time.monotonic() - killed_at < lease + 2, f"{still} places still held {lease + 2}s after the kill"
            time.sleep(0.05)
        back = time.monotonic() - killed_at
        assert back <= lease + 0.5, f"the killed worker's places came back after {back:.2f}s (lease {lease}s)"
        results = [w.result() for w in survivors]
        runs = outcomes(results)
        assert len(runs) == 133
        bad = [o for o, _ in runs if o != "ok" and "CREATEOS_MAX_LIVE_GUESTS=8" not in o]
        assert not bad, bad[:5]
        served = sum(1 for o, _ in runs if o == "ok")
        assert served >= CAP, served
        # What is left on the account is the dead worker's: at most one guest per place it held.
        clean_fake.wait_for(lambda s: s["live"] <= held, timeout=60)
        time.sleep(0.5)
        orphans = live_guests(clean_fake)
        assert len(orphans) <= held, (orphans, held)
        stats = clean_fake.stats()
        assert stats["peak_live"] <= CAP + len(orphans), stats
        # The operator's path for a dead process's guests: the idle backstop pauses them, and the
        # orphan sweep deletes paused one-shot guests.
        for guest in orphans:
            http_json("POST", f"{clean_fake.url}/v1/sandboxes/{guest['id']}/pause", api_key=clean_fake.key)
        reap = subprocess.run(
            [sys.executable, "-m", "langflow_sandbox_createos", "reap"], env=env, capture_output=True, text=True, timeout=120
        )
        assert reap.returncode == 0, reap.stderr[-2000:]
        clean_fake.wait_for(lambda s: s["live"] == 0, timeout=30)
    finally:
        # A failed assertion must not leave workers running into the next test.
        for w in [*survivors, doomed]:
            if w.proc.poll() is None:
                os.killpg(w.proc.pid, signal.SIGKILL)
                w.proc.wait(timeout=10)
    print(
        f"{kind}: killed holding {held} places, back after {back:.2f}s (lease {lease}s); {served} of 133 "
        f"survivors' runs served, the rest refused at the cap; {len(orphans)} orphans reaped; peak live {stats['peak_live']}"
    )


@pytest.mark.parametrize("on_failure", ["refuse", "local"])
def test_the_store_stopped_mid_run(clean_fake: Fake, redis_server: Redis, tmp_path: Path, on_failure: str) -> None:
    namespace = f"e2e-{uuid.uuid4().hex[:8]}"
    env = deployment_env(
        clean_fake,
        redis_server.url,
        namespace,
        CREATEOS_ADMISSION_STORE_ON_FAILURE=on_failure,
        CREATEOS_ADMISSION_LEASE_SECONDS="3",
        CREATEOS_ADMISSION_WAIT_SECONDS="20",
    )
    flag = tmp_path / "second-wave"
    worker = start_worker(env, "host-a", 4, "import time\ntime.sleep(4)\nprint('ok')", str(flag), "4", NAP)
    worker.wait_line("STARTED")
    clean_fake.wait_for(lambda s: s["peak_concurrent_execs"] == 4, timeout=60)
    # The store goes away while the first four run (their renewals fail from now on).
    redis_server.stop()
    flag.touch()
    result = worker.result(timeout=120)
    first = [o for o, _ in result["waves"][0]]
    second = result["waves"][1]
    # Runs already admitted finish whatever the setting.
    assert first == ["ok"] * 4, first
    if on_failure == "refuse":
        for outcome, seconds in second:
            assert "CREATEOS_ADMISSION_STORE_ON_FAILURE" in outcome and "nothing ran" in outcome, outcome
            assert redis_server.url.split("@")[-1].split("/")[0] in outcome, outcome
            assert seconds < 5, f"a refused run waited {seconds:.1f}s on a dead store"
        assert result["counters"]["createos_admission_store_fallbacks_total"] == 0
    else:
        assert [o for o, _ in second] == ["ok"] * 4, second
        assert result["counters"]["createos_admission_store_fallbacks_total"] == 4
        # The same count on Langflow's Prometheus endpoint (where prometheus_client is installed).
        if result["scrape"] is not None:
            assert "createos_admission_store_fallbacks_total 4.0" in result["scrape"], result["scrape"]
    assert result["counters"]["createos_admission_store_errors_total"] >= 4
    stats = clean_fake.wait_for(lambda s: s["live"] == 0, timeout=30)
    assert stats["created"] == (4 if on_failure == "refuse" else 8), stats


def test_doctor_reports_the_store_its_reachability_and_the_deployments_count(clean_fake: Fake, redis_server: Redis) -> None:
    namespace = f"e2e-{uuid.uuid4().hex[:8]}"
    # Two places held by "another worker" (leases added straight into the store).
    far = int(time.time() * 1000) + 60_000
    for i in range(2):
        redis_server.command("ZADD", f"{namespace}:guests", str(far), f"other/1/{i}")
    with_password = redis_server.url.replace("redis://", "redis://:pw-secret-123@")
    redis_server.command("CONFIG", "SET", "requirepass", "pw-secret-123")
    env = deployment_env(clean_fake, with_password, namespace)
    proc = run_doctor(env)
    out = proc.stdout + proc.stderr
    assert "pw-secret-123" not in out
    section = out.split("the deployment's admission store", 1)[1]
    assert f"admission store: redis redis://***@127.0.0.1:{redis_server.port}/0" in section, section
    # What was negotiated is said: this server speaks plain TCP.
    assert "admission store: reachable over plain TCP (not encrypted), answered in" in section, section
    assert "deployment: 2 guest(s) live of the deployment-wide cap CREATEOS_MAX_LIVE_GUESTS=8" in section, section
    # The store gone: doctor says so, and fails under the default (runs would be refused).
    redis_server.stop()
    proc = run_doctor(env)
    out = proc.stdout + proc.stderr
    assert "pw-secret-123" not in out
    assert "[refused] admission store: cannot be used (redis: cannot connect" in out, out[-3000:]
    assert "CREATEOS_ADMISSION_STORE_ON_FAILURE=refuse" in out
    assert proc.returncode == 1


def tls_store(kind: str, ca: str) -> str:
    """The TLS URL of ``kind``'s test server, its certificate checked against ``ca``."""
    if kind == "redis":
        url = os.environ.get("CREATEOS_TEST_REDISS_URL", "")
        if not url:
            need("CREATEOS_TEST_REDISS_URL is unset (Redis without its TLS port)")
        return f"{url}?ssl_ca_certs={ca}"
    if not os.environ.get("CREATEOS_TEST_POSTGRES_TLS"):
        need("CREATEOS_TEST_POSTGRES_TLS is unset (PostgreSQL without ssl=on)")
    return f"{postgres_url()}?sslmode=verify-full&sslrootcert={ca}"


@pytest.mark.parametrize("kind", ["redis", "postgres"])
def test_over_tls_the_cap_holds_and_a_certificate_that_does_not_check_out_refuses(
    clean_fake: Fake, kind: str
) -> None:
    """A managed store that requires TLS: the URL Langflow uses works, checked end to end."""
    ca = os.environ.get("CREATEOS_TEST_STORE_CA", "")
    if not ca:
        need("CREATEOS_TEST_STORE_CA is unset (scripts/stores makes the test CA)")
    store = tls_store(kind, ca)
    namespace = f"e2e-{uuid.uuid4().hex[:8]}"
    env = deployment_env(clean_fake, store, namespace)
    proc = run_doctor(env)
    section = (proc.stdout + proc.stderr).split("the deployment's admission store", 1)[1]
    assert f"TLS, certificate and host name checked (roots: {ca})" in section, section
    # What was negotiated is said: a TLS version, never plain TCP.
    assert re.search(r"admission store: reachable over TLS ?1\.[23]", section), section
    assert "plain TCP (not encrypted)" not in section, section
    # Two workers, 24 runs at once, cap 8: the cap holds over TLS as over TCP.
    workers = [start_worker(env, "host-a", 12), start_worker(env, "host-b", 12)]
    runs = outcomes([w.result() for w in workers])
    bad = [o for o, _ in runs if o != "ok" and "CREATEOS_MAX_LIVE_GUESTS=8" not in o]
    assert not bad, bad[:5]
    served = sum(1 for o, _ in runs if o == "ok")
    stats = clean_fake.wait_for(lambda s: s["live"] == 0, timeout=60)
    assert served >= 1 and stats["peak_live"] <= CAP, (served, stats)
    # The system's roots do not hold the test CA: every run is refused before anything is
    # created, naming the store, the certificate and the parameter to set.
    if kind == "redis":
        wrong = store.split("?", 1)[0]
        param = "ssl_ca_certs"
    else:
        wrong = store.replace(f"sslrootcert={ca}", "sslrootcert=system")
        param = "sslrootcert"
    created = clean_fake.stats()["created"]
    (result,) = [start_worker(deployment_env(clean_fake, wrong, namespace), "host-a", 2).result()]
    refusals = [o for o, _ in outcomes([result])]
    assert all("certificate" in o and param in o and "CREATEOS_ADMISSION_STORE" in o for o in refusals), refusals
    assert clean_fake.stats()["created"] == created, "nothing ran"


@pytest.mark.skipif(
    not os.environ.get("LANGFLOW_SERVER_VENV"),
    reason="LANGFLOW_SERVER_VENV is not set: a real Langflow server needs the slow suite's venv "
    "(scripts/test prepares one)",
)
def test_a_langflow_server_with_two_workers_holds_one_cap_in_redis(
    clean_fake: Fake, redis_server: Redis, tmp_path: Path
) -> None:
    """``LANGFLOW_WORKERS=2``: the server's two worker processes, each its own session, share
    ``CREATEOS_MAX_LIVE_GUESTS=2`` through Redis (per process they would admit 4)."""
    import concurrent.futures

    from test_langflow_server import run_flow, start_server, upload_flow

    namespace = f"e2e-{uuid.uuid4().hex[:8]}"
    usage_log = tmp_path / "usage.jsonl"
    # Langflow's own Redis holds the caps (`langflow-redis`); its job queue, which two workers
    # need, uses another database of the same server.
    env = deployment_env(
        clean_fake,
        "langflow-redis",
        namespace,
        LANGFLOW_REDIS_URL=redis_server.url,
        LANGFLOW_JOB_QUEUE_TYPE="redis",
        LANGFLOW_REDIS_QUEUE_URL=redis_server.url.replace("/0", "/1"),
        CREATEOS_USAGE_LOG=str(usage_log),
        CREATEOS_MAX_LIVE_GUESTS="2",
    )
    # Two workers migrate a fresh database at once and one of them fails to boot: one worker
    # creates it first, then the two-worker server starts on it.
    start_server(env, tmp_path).stop()
    server = start_server(env, tmp_path, workers=2)
    try:
        flow_id = upload_flow(server, Path(__file__).parent / "flows" / "component_flow.json", "deployment cap")
        code = "import time\ntime.sleep(1.5)\nprint(6 * 7)"
        # Which worker accepts a request is the kernel's choice, and the second worker may still
        # be importing Langflow when the first answers the health check: rounds of 12 at once go
        # on until both workers have run guests in one round, each round under the same cap.
        workers: set[str] = set()
        for round_no in range(1, 5):
            with concurrent.futures.ThreadPoolExecutor(12) as pool:
                answers = list(pool.map(lambda _: run_flow(server, flow_id, code), range(12)))
            assert all(any("42" in t for t in texts) for texts in answers), answers
            stats = clean_fake.wait_for(lambda s: s["live"] == 0, timeout=60)
            assert stats["created"] == 12 * round_no, stats
            assert stats["peak_live"] <= 2, (
                f"the account saw {stats['peak_live']} guests live under a deployment cap of 2"
            )
            deadline = time.monotonic() + 10
            while len(records := usage_log.read_text().splitlines()) < 12 * round_no:
                assert time.monotonic() < deadline, f"{len(records)} usage records for {12 * round_no} guests"
                time.sleep(0.05)
            workers = {json.loads(line)["worker"] for line in records[12 * (round_no - 1) :]}
            if len(workers) == 2:
                break
    finally:
        server.stop()
    assert len(workers) == 2, f"both of the server's workers ran guests in one round of 12: {workers}"


KEPT = r"""
import json, os, sys, time
from langflow_sandbox_createos import node
inputs, flag = json.loads(sys.argv[1]), sys.argv[2]
print("READY", flush=True)
while not os.path.exists(flag):
    time.sleep(0.01)
try:
    results, _ = node.run(**inputs)
    print("RESULT " + json.dumps(str(results.get("stdout", results))), flush=True)
except Exception as e:
    print("RESULT " + json.dumps(f"{type(e).__name__}: {e}"), flush=True)
"""


def kept_inputs(code: str) -> dict[str, Any]:
    return {
        "flow_id": "flow-deployment-1",
        "session_id": "session-deployment-1",
        "component_id": "createos_sandbox-dep01",
        "python_code": code,
        "command": "",
        "session_mode": "session",
        "collect_artifacts": False,
        "allow_network": False,
        "allowed_domains": "",
        "timeout_seconds": 60,
        "shape": "",
    }


def run_kept_together(env: dict[str, str], tmp_path: Path, hosts: list[str], code: str) -> list[str]:
    """Every worker runs the same kept guest's node at the same moment; their outputs."""
    flag = tmp_path / f"go-{uuid.uuid4().hex[:6]}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", KEPT, json.dumps(kept_inputs(code)), str(flag)],
            env={**env, "CREATEOS_HOST_ID": host},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for host in hosts
    ]
    for p in procs:
        assert p.stdout is not None
        assert p.stdout.readline().strip() == "READY"
    flag.touch()
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=180)
        lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
        assert lines, (out[-2000:], err[-3000:])
        outs.append(json.loads(lines[-1].removeprefix("RESULT ")))
    return outs


def test_two_workers_running_one_kept_guest_create_it_once_and_see_its_destroy(
    clean_fake: Fake, redis_server: Redis, tmp_path: Path
) -> None:
    namespace = f"e2e-{uuid.uuid4().hex[:8]}"
    env = deployment_env(clean_fake, redis_server.url, namespace)
    # Four workers at once (without the store, two or more of them send a create now and then,
    # the losers answered 409).
    outs = run_kept_together(env, tmp_path, ["host-a", "host-a", "host-b", "host-b"], "print('kept')")
    assert all("kept" in o for o in outs), outs
    stats = clean_fake.stats()
    # One create sent: the others waited for the create lock, then found the guest.
    assert stats["requests"].get("create", 0) == 1 and stats["created"] == 1, stats
    assert stats["live"] == 1, stats
    # One worker destroys it (its exec's outcome unknown: a broken stream)...
    clean_fake.set_faults("exec_stream=reset-after#1")
    (broken,) = run_kept_together(env, tmp_path, ["host-a"], "print('kept')")
    assert "CreateOS" in broken, broken
    clean_fake.wait_for(lambda s: s["live"] == 0)
    clean_fake.set_faults("")
    # ...and the other finds it gone and gets a fresh one.
    (again,) = run_kept_together(env, tmp_path, ["host-b"], "print('fresh')")
    assert "fresh" in again, again
    stats = clean_fake.stats()
    assert stats["created"] == 2 and stats["live"] == 1, stats
