"""The test rig's own floor for warm runs, measured without this project's client (not a test).

    python tests/e2e/bench_rig_floor.py [--latency-ms 20] [--runs 14]

Drives ``createos-fake`` with nothing but ``http.client``: four guests are created up front;
each run is one streaming exec of a ``print`` on the oldest, after which a background thread
deletes that guest and creates its replacement, which is what the backend's warm pool of 4 does.
Runs go back to back, then 300 ms apart. Each run reports the time from the request to the
guest's print and from the print to the end of the response.

If back-to-back runs here are as slow as the backend's (``bench_backend.py --warm-pool 4``),
the difference between back-to-back and spaced runs belongs to the fake and the machine, not to
the client.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import FAKE_KEY, start_fake  # noqa: E402

PROGRAM = "import time; print('%.6f' % time.time())"


def floor_runs(url: str, runs: int, space: float) -> list[tuple[float, float]]:
    """``runs`` warm runs against the fake at ``url``, ``space`` seconds apart: for each, the
    milliseconds from the request to the guest's print and from the print to the response's end."""
    hostport = url.split("//", 1)[1].split("/", 1)[0]
    headers = {"x-api-key": FAKE_KEY, "content-type": "application/json"}
    local = threading.local()

    def call(method: str, path: str, body: dict | None = None) -> bytes:
        if not hasattr(local, "conn"):
            local.conn = http.client.HTTPConnection(hostport, timeout=60)
        local.conn.request(method, path, json.dumps(body) if body is not None else None, headers)
        resp = local.conn.getresponse()
        data = resp.read()
        if resp.status >= 300:
            raise SystemExit(f"{method} {path}: HTTP {resp.status}: {data[:300]!r}")
        return data

    def create() -> str:
        return json.loads(call("POST", "/v1/sandboxes", {"shape": "s-1vcpu-256mb"}))["data"]["id"]

    pool = collections.deque(create() for _ in range(4))
    lock = threading.Lock()

    def replace(old: str) -> None:
        call("DELETE", f"/v1/sandboxes/{old}")
        new = create()
        with lock:
            pool.append(new)

    background: list[threading.Thread] = []
    rows = []
    try:
        for _ in range(runs):
            time.sleep(space)
            while True:
                with lock:
                    if pool:
                        sid = pool.popleft()
                        break
                time.sleep(0.001)
            start = time.time()
            body = call("POST", f"/v1/sandboxes/{sid}/exec", {"cmd": "python3", "args": ["-c", PROGRAM], "stream": True})
            end = time.time()
            printed = float(json.loads(body.decode().splitlines()[0])["stdout"])
            rows.append(((printed - start) * 1000, (end - printed) * 1000))
            t = threading.Thread(target=replace, args=(sid,))
            t.start()
            background.append(t)
    finally:
        for t in background:
            t.join(timeout=60)
        for sid in pool:
            call("DELETE", f"/v1/sandboxes/{sid}")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=int, default=20)
    parser.add_argument("--runs", type=int, default=14, help="runs per spacing (the first 2 are not counted)")
    args = parser.parse_args()
    fake = start_fake(latency_ms=args.latency_ms)
    try:
        for space in (0.0, 0.3):
            kept = floor_runs(fake.url, args.runs, space)[2:]
            print(
                f"{'back to back' if not space else f'{space * 1000:.0f} ms apart'}: "
                f"median {statistics.median(a + b for a, b in kept):.1f} ms; "
                f"request to print {statistics.median(a for a, _ in kept):.0f} ms, "
                f"print to end {statistics.median(b for _, b in kept):.0f} ms"
            )
    finally:
        fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
