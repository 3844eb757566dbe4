"""Create + first exec on one real OpenSandbox server: this plugin against the official SDK
(a benchmark, not a test).

    eval "$(scripts/opensandbox-server env)"
    python tests/e2e/bench_opensandbox_sdk.py --sdk-python /path/to/sdk-venv/bin/python [--rounds 5]

Two long-lived worker processes, one per side, each doing one sandbox per round on the server
that ``OPEN_SANDBOX_DOMAIN`` / ``OPEN_SANDBOX_API_KEY_FILE`` / ``OPEN_SANDBOX_IMAGE`` name
(``scripts/opensandbox-server env`` prints them):

- **plugin**: this venv's ``langflow_sandbox_createos.opensandbox`` backend, ``run("print(1)")``:
  create, ready (``Running`` and execd's ``/ping``), the identity canary, the program's upload,
  the exec, and the delete, as every backend run does. Container isolation is accepted for the
  measurement (``OPEN_SANDBOX_ATTEST_ISOLATION`` is set in the worker only: the in-guest probe
  then runs too, as on an attested server).
- **sdk**: ``opensandbox.SandboxSync.create`` (its default health check: execd's ``/ping``),
  ``commands.run("python3 -c 'print(1)'")``, ``kill()``, in the SDK's own venv
  (``--sdk-python``; ``pip install opensandbox==1.1.1``). It talks to execd directly at the
  endpoint the server publishes (its default), unless ``--sdk-server-proxy``.

One warm-up round per side (not counted: imports, connection pools), then ``--rounds`` rounds,
the two sides alternating and the order swapped every round so both see the same machine.
Prints each side's times, the medians and the ratio; ``--json`` prints them as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PLUGIN_WORKER = r"""
import os, sys, time, json
os.environ["OPEN_SANDBOX_ATTEST_ISOLATION"] = "hardware-virtualized"
from langflow_sandbox_createos.opensandbox import create_backend
backend = create_backend()
for line in sys.stdin:
    t = time.perf_counter()
    result = backend.run("print(1)")
    took = time.perf_counter() - t
    assert result.exit_code == 0 and result.stdout.strip() == "1", result
    print(json.dumps({"total": took}), flush=True)
backend.shutdown()
"""

SDK_WORKER = r"""
import os, sys, time, json
from datetime import timedelta
from opensandbox import SandboxSync
from opensandbox.config.connection_sync import ConnectionConfigSync
key = open(os.environ["OPEN_SANDBOX_API_KEY_FILE"]).read().strip()
config = ConnectionConfigSync(domain=os.environ["OPEN_SANDBOX_DOMAIN"], api_key=key,
                              use_server_proxy=sys.argv[1] == "proxy")
for line in sys.stdin:
    t = time.perf_counter()
    sandbox = SandboxSync.create(os.environ["OPEN_SANDBOX_IMAGE"], connection_config=config,
                                 timeout=timedelta(minutes=10), resource={"cpu": "1", "memory": "256Mi"})
    execution = sandbox.commands.run("python3 -c 'print(1)'")
    first = time.perf_counter() - t
    out = "".join(m.text for m in execution.logs.stdout)
    assert out.strip() == "1", execution
    sandbox.kill()
    sandbox.close()
    took = time.perf_counter() - t
    print(json.dumps({"total": took, "to_exec_end": first}), flush=True)
"""


class Worker:
    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def once(self) -> dict[str, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"the {self.name} worker died (exit {self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sdk-python", required=True, help="python of a venv with opensandbox==1.1.1")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sdk-server-proxy", action="store_true", help="the SDK talks to execd through the server's proxy too")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    for name in ("OPEN_SANDBOX_DOMAIN", "OPEN_SANDBOX_API_KEY_FILE", "OPEN_SANDBOX_IMAGE"):
        if not os.environ.get(name):
            raise SystemExit(f"{name} is not set: eval \"$(scripts/opensandbox-server env)\" first")
    env = dict(os.environ)
    env["LANGFLOW_SANDBOX_ALLOW_NETWORK"] = "true"  # no egress sidecar on this server
    env.pop("OPEN_SANDBOX_API_KEY", None)
    plugin = Worker("plugin", [sys.executable, "-c", PLUGIN_WORKER], env)
    sdk = Worker("sdk", [args.sdk_python, "-c", SDK_WORKER, "proxy" if args.sdk_server_proxy else "direct"], env)
    times: dict[str, list[float]] = {"plugin": [], "sdk": [], "sdk_to_exec_end": []}
    try:
        plugin.once()
        sdk.once()
        for i in range(args.rounds):
            order = (plugin, sdk) if i % 2 == 0 else (sdk, plugin)
            for w in order:
                got = w.once()
                times[w.name].append(got["total"])
                if "to_exec_end" in got:
                    times["sdk_to_exec_end"].append(got["to_exec_end"])
    finally:
        plugin.close()
        sdk.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {
        "rounds": args.rounds,
        "sdk_execd": "server proxy" if args.sdk_server_proxy else "direct",
        "times": {k: [round(x, 3) for x in v] for k, v in times.items()},
        "median": {k: round(v, 3) for k, v in med.items()},
        "ratio_plugin_to_sdk": round(med["plugin"] / med["sdk"], 3),
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if args.json:
        print(json.dumps(out))
        return
    for k, v in out["times"].items():
        print(f"{k:16} {' '.join(f'{x:.3f}' for x in v)}  median {out['median'][k]:.3f} s")
    print(f"plugin / sdk (create, first exec, delete): {out['ratio_plugin_to_sdk']:.2f}x")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
