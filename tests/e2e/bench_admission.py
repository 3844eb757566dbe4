"""Benchmark of admission control through the installed wheel (not a test; run by hand).

    python tests/e2e/bench_admission.py [--runs 256] [--cap 16] [--rounds 6]
    python tests/e2e/bench_admission.py --store-ab [--threads 1] [--store-cap 64]

Starts ``createos-fake --latency-ms 20`` and, through the backend object lfx builds:

1. starts ``--runs`` threads at once, each calling ``run("print(1)")`` once, under
   ``CREATEOS_MAX_LIVE_GUESTS=--cap``: reports the fake's peak of live guests (must not exceed
   the cap), how many runs succeeded, how many were refused "at capacity" after their wait,
   any other error, the guests live after ``shutdown()``, and the admission counters
   (``_native.counters()``). FIFO order is proven by sandbox-core's admission tests, not here;
2. measures host CPU per run (this process, all threads: ``time.process_time``) in interleaved
   rounds of 16 threads x 4 runs with the cap set (on) and unset (off), and prints the medians.

    python tests/e2e/bench_admission.py --metrics-ab [--rounds 8] [--threads 16] [--runs 256]

measures host CPU per run with metrics on vs off instead: each round starts one fresh process
per arm, interleaved, and each process measures (``time.process_time``, all its threads)
``--runs`` runs from ``--threads`` threads, from their start until the fake has no live guest
and the last events were drained (``--threads 1``: one run at a time). Arms: ``on`` (the
default: Prometheus families, usage records), ``off`` (``CREATEOS_METRICS=off``: usage records
only) and ``none`` (events never enabled: the extension as it was before metrics). Prints the
medians, and the median of each round's on-vs-none difference.

    python tests/e2e/bench_admission.py --store-ab [--rounds 8] [--threads 1] [--runs 256]

measures, the same way, the host CPU per run with the live-guest cap held per process, in Redis
and in PostgreSQL (``CREATEOS_TEST_REDIS_URL`` / ``CREATEOS_TEST_POSTGRES_URL``, as
``eval "$(bash scripts/stores start)"`` sets them), and each store server's own CPU per run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import backend_env, start_fake  # noqa: E402

CAP_VAR = "CREATEOS_MAX_LIVE_GUESTS"


def _counter(name: str) -> float:
    from langflow_sandbox_createos import _native

    return sum(v for n, _, v in _native.counters() if n == name)


def burst(fake, backend, runs: int) -> dict:  # noqa: ANN001
    """`runs` threads released at once, one run each."""
    outcomes: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(runs + 1)

    def worker() -> None:
        barrier.wait()
        try:
            ok = backend.run("print(1)").exit_code == 0
            what = "ok" if ok else "nonzero"
        except BaseException as exc:  # noqa: BLE001
            what = "at capacity" if "at capacity" in str(exc) else f"error: {exc}"
        with lock:
            outcomes.append(what)

    threads = [threading.Thread(target=worker) for _ in range(runs)]
    for t in threads:
        t.start()
    barrier.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    stats = fake.wait_for(lambda s: s["live"] == 0, 120)
    return {
        "runs": runs,
        "ok": outcomes.count("ok"),
        "at_capacity": outcomes.count("at capacity"),
        "other": [o for o in outcomes if o not in ("ok", "at capacity")][:3],
        "seconds": seconds,
        "peak_live": stats["peak_live"],
        "created": stats["created"],
        "waits": _counter("createos_admission_waits_total"),
        "wait_seconds": _counter("createos_admission_wait_seconds_total"),
    }


def _round_cpu(backend, threads: int, per_thread: int, settle) -> float:  # noqa: ANN001
    """This process's CPU seconds for ``threads`` threads each running ``per_thread`` runs
    (started together), until every run has returned and ``settle()`` has."""
    barrier = threading.Barrier(threads + 1)

    def worker() -> None:
        barrier.wait()
        for _ in range(per_thread):
            backend.run("print(1)")

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    barrier.wait()
    cpu0 = time.process_time()
    for t in pool:
        t.join()
    settle()
    return time.process_time() - cpu0


def cpu_round(fake, backend, threads: int = 16, per_thread: int = 4) -> float:  # noqa: ANN001
    cpu = _round_cpu(backend, threads, per_thread, lambda: None)
    fake.wait_for(lambda s: s["live"] == 0, 120)
    return cpu * 1000 / (threads * per_thread)


ARMS = ("on", "off", "none")


def _fake_live(base: str) -> int:
    import json
    import urllib.request

    with urllib.request.urlopen(base + "/_fake/stats", timeout=10) as response:  # noqa: S310 - loopback
        return int(json.loads(response.read())["data"]["live"])


def metrics_child(arm: str, threads: int = 16, per_thread: int = 4) -> int:
    """One arm's process: warm up, then print the host CPU ms per run of one round."""
    from langflow_sandbox_createos import metrics

    if arm == "none":
        metrics.install = lambda: None  # events never enabled: nothing queued or drained
    # The exporter's own CPU, on the threads that drain (the daemon thread, the settling below):
    # a figure the other processes on the machine do not blur.
    drain_cpu = [0.0]
    real_drain = metrics.drain

    def timed_drain(*, wait: bool = True) -> None:
        t0 = time.thread_time()
        real_drain(wait=wait)
        drain_cpu[0] += time.thread_time() - t0

    metrics.drain = timed_drain
    from langflow_sandbox_createos.backend import create_backend

    backend = create_backend()
    backend.run("print(1)")
    base = os.environ["CREATEOS_SANDBOX_BASE_URL"]
    while _fake_live(base):
        time.sleep(0.02)
    metrics.drain()
    drain_cpu[0] = 0.0

    def settle() -> None:
        while _fake_live(base):
            time.sleep(0.02)
        metrics.drain()

    cpu = _round_cpu(backend, threads, per_thread, settle)
    print(f"CPU {cpu * 1000 / (threads * per_thread):.4f}", flush=True)
    print(f"DRAIN {drain_cpu[0] * 1000 / (threads * per_thread):.4f}", flush=True)
    backend.shutdown()
    return 0


def _server_cpu(comm: str) -> float:
    """CPU seconds of every process named ``comm`` (a store server's, on this machine)."""
    ticks = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as f:
                if f.read().strip() != comm:
                    continue
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def ab(arms: dict[str, tuple[str, dict[str, str], str | None]], rounds: int, threads: int, runs: int) -> dict[str, list[float]]:
    """Interleaved rounds of one fresh process per arm: ``arms`` maps a label to the child's
    metrics arm, its extra environment and the name of a server process whose CPU is counted
    too (or None). Prints and returns each arm's host CPU ms per run. A server's CPU is read
    in every arm, and what it spends in the arms that do not use it (its own housekeeping:
    Redis's cron, PostgreSQL's background workers) is taken off the arm that does."""
    import subprocess

    fake = start_fake(latency_ms=20)
    try:
        env = backend_env(fake)
        got: dict[str, list[float]] = {arm: [] for arm in arms}
        drained: dict[str, list[float]] = {arm: [] for arm in arms}
        comms = sorted({c for _, _, c in arms.values() if c})
        server: dict[str, dict[str, list[float]]] = {arm: {c: [] for c in comms} for arm in arms}
        labels = tuple(arms)
        for r in range(rounds):
            for label in labels if r % 2 == 0 else tuple(reversed(labels)):
                child_arm, extra, comm = arms[label]
                before = {c: _server_cpu(c) for c in comms}
                proc = subprocess.run(
                    [sys.executable, __file__, "--metrics-child", child_arm, "--threads", str(threads), "--runs", str(runs)],
                    capture_output=True, text=True, env={**env, **extra}, timeout=600, check=False,
                )
                line = [x for x in proc.stdout.splitlines() if x.startswith("CPU ")]
                if proc.returncode != 0 or not line:
                    raise SystemExit(f"arm {label} failed: {proc.stdout[-2000:]} {proc.stderr[-2000:]}")
                got[label].append(float(line[0].split()[1]))
                drained[label] += [float(x.split()[1]) for x in proc.stdout.splitlines() if x.startswith("DRAIN ")]
                for c in comms:  # the child's warm-up (and a store's schema) included: an overcount
                    server[label][c].append((_server_cpu(c) - before[c]) * 1000 / (runs + 1))
                fake.wait_for(lambda s: s["live"] == 0, 60)
        for label in labels:
            print(f"cpu ms/run, {label}: median {statistics.median(got[label]):.3f} {[round(x, 3) for x in got[label]]}")
            comm = arms[label][2]
            if comm:
                idle = [statistics.median(server[other][comm]) for other in labels if arms[other][2] != comm]
                used = statistics.median(server[label][comm])
                print(
                    f"  its store server's cpu ms/run: median {used:.3f}, {used - statistics.median(idle):.3f} "
                    f"above its housekeeping in the other arms ({statistics.median(idle):.3f})"
                )
            print(f"  drain cpu ms/run: median {statistics.median(drained[label]):.4f}", flush=True)
        return got
    finally:
        fake.stop()


def paired(got: dict[str, list[float]], arm: str, base: str) -> None:
    """``arm`` against ``base``: the medians, and the median of each round's difference (the
    two processes of a round ran next to each other, so it drifts less with the load)."""
    a, b = statistics.median(got[arm]), statistics.median(got[base])
    pairs = [100 * (x - y) / y for x, y in zip(got[arm], got[base])]
    print(
        f"{arm} vs {base}: {100 * (a - b) / b:+.1f}% ({(a - b) * 1000:+.0f} us/run); paired by round: median "
        f"{statistics.median(pairs):+.1f}% {[round(x, 1) for x in pairs]}",
        flush=True,
    )


def metrics_ab(rounds: int, threads: int, runs: int) -> int:
    arms = {"metrics on": ("on", {}, None), "metrics off": ("off", {"CREATEOS_METRICS": "off"}, None), "metrics none": ("none", {}, None)}
    got = ab(arms, rounds, threads, runs)
    paired(got, "metrics on", "metrics none")
    return 0


def store_ab(rounds: int, threads: int, runs: int, store_cap: int = 64) -> int:
    """Host CPU per run with the caps held per process, in Redis and in PostgreSQL (the URLs of
    ``CREATEOS_TEST_REDIS_URL`` / ``CREATEOS_TEST_POSTGRES_URL``, as ``scripts/stores start``
    exports them); the same cap in every arm (``store_cap``: 64 leaves room, ``--threads`` or
    fewer keeps the deployment near or at its cap), metrics on."""
    import uuid

    cap = {"CREATEOS_MAX_LIVE_GUESTS": str(store_cap), "CREATEOS_ADMISSION_NAMESPACE": f"bench-{uuid.uuid4().hex[:8]}"}
    arms: dict[str, tuple[str, dict[str, str], str | None]] = {"per process": ("on", cap, None)}
    for label, var, comm in (("redis", "CREATEOS_TEST_REDIS_URL", "redis-server"), ("postgres", "CREATEOS_TEST_POSTGRES_URL", "postgres")):
        if os.environ.get(var):
            arms[label] = ("on", {**cap, "CREATEOS_ADMISSION_STORE": os.environ[var]}, comm)
        else:
            print(f"({var} is unset: no {label} arm; eval \"$(bash scripts/stores start)\" sets it)")
    got = ab(arms, rounds, threads, runs)
    for label in arms:
        if label != "per process":
            paired(got, label, "per process")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=256)
    parser.add_argument("--cap", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=6, help="interleaved CPU rounds per arm")
    parser.add_argument("--metrics-ab", action="store_true", help="CPU per run with metrics on vs off")
    parser.add_argument("--threads", type=int, default=16, help="--metrics-ab: threads per process (--runs runs in all)")
    parser.add_argument("--store-ab", action="store_true", help="CPU per run with the caps per process vs in Redis and PostgreSQL")
    parser.add_argument("--store-cap", type=int, default=64, help="--store-ab: the cap (64 leaves room; --threads or fewer is near the cap)")
    parser.add_argument("--metrics-child", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.metrics_child:
        return metrics_child(args.metrics_child, threads=args.threads, per_thread=max(1, args.runs // args.threads))
    if args.metrics_ab:
        return metrics_ab(args.rounds, args.threads, args.runs)
    if args.store_ab:
        return store_ab(args.rounds, args.threads, args.runs, args.store_cap)
    fake = start_fake(latency_ms=20)
    try:
        env = backend_env(fake)
        os.environ.update({k: v for k, v in env.items() if k.startswith(("CREATEOS_", "LANGFLOW_SANDBOX_CREATEOS_"))})
        os.environ[CAP_VAR] = str(args.cap)
        from langflow_sandbox_createos.backend import create_backend

        backend = create_backend()
        backend.run("print(1)")  # runtime, session and caches exist before the figures
        fake.reset()
        b = burst(fake, backend, args.runs)
        print(f"burst: {b}", flush=True)
        on: list[float] = []
        off: list[float] = []
        for _ in range(args.rounds):
            os.environ[CAP_VAR] = str(args.cap)
            on.append(cpu_round(fake, backend))
            os.environ.pop(CAP_VAR, None)
            off.append(cpu_round(fake, backend))
        backend.shutdown()
        live_after = fake.wait_for(lambda s: s["live"] == 0, 30)["live"]
        print(
            f"cpu ms/run: on {statistics.median(on):.2f} {[round(x, 2) for x in on]}; "
            f"off {statistics.median(off):.2f} {[round(x, 2) for x in off]}; live after shutdown {live_after}",
            flush=True,
        )
    finally:
        fake.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
