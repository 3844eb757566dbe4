"""Benchmark of the Playground in a guest against the in-process Playground (not a test; run by hand).

    LANGFLOW_SERVER_VENV=DIR python tests/e2e/bench_playground.py [--rounds 3]

Starts ``createos-fake --latency-ms 20`` (every API request waits 20 ms) and three Langflow 1.13
servers from ``LANGFLOW_SERVER_VENV`` against it: in-process (no executor), the executor with
``CREATEOS_EXECUTOR_PLAYGROUND=on`` (cold: a guest created per run), and the same with
``CREATEOS_EXECUTOR_WARM_POOL=1``. Each round sends ``flows/slow_flow.json`` (Chat Input ->
Shout -> Slow, 2 s -> Chat Output) to each server as the 1.13 UI's Playground does
(``POST /api/v2/workflows``, stream mode) and records, from the request:

- first result: the first streamed ``end_vertex`` event (Chat Input's result);
- total: the end of the stream.

Before a warm run the script waits until the pool has a ready guest again (a server between
messages). Rounds are interleaved, so the three sides share the machine's state; the medians
and the executor's differences from in-process are printed as a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from conftest import E2E, backend_env, start_fake  # noqa: E402
from test_langflow_server import Server, start_server, upload_flow  # noqa: E402

SLOW = E2E / "flows" / "slow_flow.json"


def stream_timed(server: Server, flow_id: str, text: str) -> tuple[float, float, list[str]]:
    """One v2 stream run: seconds to the first vertex's result (its ``end_vertex`` event, Chat
    Input's), seconds to the end, and the event types seen."""
    request = urllib.request.Request(
        f"{server.url}/api/v2/workflows",
        data=json.dumps({"flow_id": flow_id, "input_value": text, "mode": "stream"}).encode(),
        headers={"Content-Type": "application/json", "x-api-key": server.api_key},
        method="POST",
    )
    began = time.perf_counter()
    first: float | None = None
    kinds: list[str] = []
    with urllib.request.urlopen(request, timeout=240) as response:  # noqa: S310 - loopback
        for raw in response:
            line = raw.decode(errors="replace").strip()
            if not line.startswith("data:"):
                continue
            try:
                event: Any = json.loads(line.removeprefix("data:").strip())
            except ValueError:
                continue
            kind = str(event.get("type") or event.get("event") or "?") if isinstance(event, dict) else "?"
            kinds.append(kind)
            if first is None and kind in ("end_vertex", "STEP_FINISHED"):
                first = time.perf_counter() - began
    total = time.perf_counter() - began
    return (first if first is not None else total), total, kinds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    fake = start_fake(latency_ms=20)
    servers: dict[str, Server] = {}
    with tempfile.TemporaryDirectory(prefix="bench-playground-") as tmp:
        try:
            common = {
                "LANGFLOW_SANDBOX_BACKEND": None,
                "LANGFLOW_SANDBOX_BACKEND_PLUGINS": None,
                "LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS": None,
            }
            executor = {
                **common,
                "LANGFLOW_EXECUTOR_KIND": "createos",
                "CREATEOS_EXECUTOR_HOST_BUILDS": "none",
                "CREATEOS_EXECUTOR_PLAYGROUND": "on",
            }
            sides = {
                "in-process": backend_env(fake, **common),
                "executor, cold": backend_env(fake, **executor),
                "executor, warm pool": backend_env(fake, **executor, CREATEOS_EXECUTOR_WARM_POOL="1"),
            }
            flows: dict[str, str] = {}
            for name, env in sides.items():
                workdir = Path(tmp) / name.replace(" ", "").replace(",", "-")
                workdir.mkdir()
                servers[name] = start_server(env, workdir)
                flows[name] = upload_flow(servers[name], SLOW, f"bench: {name}")
                stream_timed(servers[name], flows[name], "warm up")  # the server's own first-run costs
            results: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
            for round_ in range(args.rounds):
                for name, server in servers.items():
                    if name == "executor, warm pool":
                        deadline = time.monotonic() + 120
                        while fake.stats()["live"] < 1 and time.monotonic() < deadline:
                            time.sleep(0.2)
                        time.sleep(3)  # the pool guest's preloaded runner imports lfx
                    first, total, kinds = stream_timed(server, flows[name], f"round {round_}")
                    results[name].append((first, total))
                    if round_ == 0:
                        print(f"# {name}: {len(kinds)} events: {' '.join(kinds[:12])} ...", file=sys.stderr)
            base_first = statistics.median(f for f, _ in results["in-process"])
            base_total = statistics.median(t for _, t in results["in-process"])
            print(f"rounds: {args.rounds}; createos-fake --latency-ms 20; flow: slow_flow.json; v2 stream\n")
            print("| side | first result (median) | vs in-process | total (median) | vs in-process | each first result |")
            print("|---|---|---|---|---|---|")
            for name, runs in results.items():
                first = statistics.median(f for f, _ in runs)
                total = statistics.median(t for _, t in runs)
                each = ", ".join(f"{f:.2f}" for f, _ in runs)
                print(
                    f"| {name} | {first:.2f} s | {first - base_first:+.2f} s | {total:.2f} s | "
                    f"{total - base_total:+.2f} s | {each} |"
                )
        finally:
            for server in servers.values():
                server.stop()
            fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
