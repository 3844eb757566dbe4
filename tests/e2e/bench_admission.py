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


def cpu_round(fake, backend, threads: int = 16, per_thread: int = 4) -> float:  # noqa: ANN001
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
    cpu = time.process_time() - cpu0
    fake.wait_for(lambda s: s["live"] == 0, 120)
    return cpu * 1000 / (threads * per_thread)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=256)
    parser.add_argument("--cap", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=6, help="interleaved CPU rounds per arm")
    args = parser.parse_args()
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
