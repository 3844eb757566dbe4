"""Benchmark of admission control through the installed wheel (not a test; run by hand).

    python tests/e2e/bench_admission.py [--runs 256] [--cap 16] [--rounds 6]

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


def metrics_ab(rounds: int, threads: int, runs: int) -> int:
    import subprocess

    fake = start_fake(latency_ms=20)
    try:
        env = backend_env(fake)
        got: dict[str, list[float]] = {arm: [] for arm in ARMS}
        drained: dict[str, list[float]] = {arm: [] for arm in ARMS}
        for r in range(rounds):
            order = ARMS if r % 2 == 0 else tuple(reversed(ARMS))
            for arm in order:
                arm_env = dict(env)
                if arm == "off":
                    arm_env["CREATEOS_METRICS"] = "off"
                proc = subprocess.run(
                    [sys.executable, __file__, "--metrics-child", arm, "--threads", str(threads), "--runs", str(runs)],
                    capture_output=True, text=True, env=arm_env, timeout=600, check=False,
                )
                line = [x for x in proc.stdout.splitlines() if x.startswith("CPU ")]
                if proc.returncode != 0 or not line:
                    print(f"arm {arm} failed: {proc.stdout[-2000:]} {proc.stderr[-2000:]}", flush=True)
                    return 1
                got[arm].append(float(line[0].split()[1]))
                drained[arm] += [float(x.split()[1]) for x in proc.stdout.splitlines() if x.startswith("DRAIN ")]
                fake.wait_for(lambda s: s["live"] == 0, 60)
        for arm in ARMS:
            print(f"cpu ms/run, metrics {arm}: median {statistics.median(got[arm]):.3f} {[round(x, 3) for x in got[arm]]}")
        for arm in ("on", "off"):
            print(f"drain CPU ms/run, metrics {arm}: median {statistics.median(drained[arm]):.4f}")
        on, none = statistics.median(got["on"]), statistics.median(got["none"])
        print(f"on vs none: {100 * (on - none) / none:+.1f}%", flush=True)
        # Each round's two processes ran next to each other: their difference drifts less with
        # the machine's load than the arms' medians do.
        paired = [100 * (o - n) / n for o, n in zip(got["on"], got["none"])]
        print(f"on vs none, paired by round: median {statistics.median(paired):+.1f}% {[round(x, 1) for x in paired]}", flush=True)
    finally:
        fake.stop()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=256)
    parser.add_argument("--cap", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=6, help="interleaved CPU rounds per arm")
    parser.add_argument("--metrics-ab", action="store_true", help="CPU per run with metrics on vs off")
    parser.add_argument("--threads", type=int, default=16, help="--metrics-ab: threads per process (--runs runs in all)")
    parser.add_argument("--metrics-child", choices=ARMS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.metrics_child:
        return metrics_child(args.metrics_child, threads=args.threads, per_thread=max(1, args.runs // args.threads))
    if args.metrics_ab:
        return metrics_ab(args.rounds, args.threads, args.runs)
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
