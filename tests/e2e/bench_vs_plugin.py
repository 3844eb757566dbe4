"""Side by side with the Python plugin 0.2.0, in one run on one fake (a benchmark, not a test).

    python tests/e2e/bench_vs_plugin.py [--rounds 3] [--plugin-venv .venv-plugin-0.2.0]

Starts one ``createos-fake --latency-ms 20`` (every API request waits 20 ms; guests are local
processes whose ``python3`` is this venv's, which has lfx 1.13.0) and measures, with the rounds
interleaved so that both sides see the same machine:

- **executor, cold**: ``flows/slow_flow.json`` (Chat Input -> Shout -> Slow, which sleeps 2 s ->
  Chat Output) through each side's ``CreateOSExecutor.execute`` as ``Graph.arun`` calls it, in a
  fresh process per side per round, two runs each (the process's first run, and a second cold
  run in the same process). Time to the first event and total; this project's phase timings
  from its log. The plugin streams nothing: its first event comes when its guest has exited.
- **backend, warm**: this project's backend with a warm pool of 4 (``print(1)``, runs back to
  back) against the rig's floor (``bench_rig_floor.floor_runs``: ``http.client`` doing the one
  streaming exec a warm run needs, and the pool's background delete and create).
- **backend, host CPU per run**: this project's cold backend against the plugin's, sequential.

The plugin's venv (lfx 1.13.0 and ``langflow-sandbox-createos==0.2.0`` from PyPI) is created on
first use. ``--before-venv DIR`` adds a third side to the executor rounds: another build of this
project (an older commit's wheel in a venv with lfx 1.13.0), whose phases are printed beside
this one's. Prints a table; ``--write FILE`` replaces the section of ``BENCHMARKS.md`` it owns.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_rig_floor import floor_runs  # noqa: E402
from conftest import backend_env, start_fake  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CHILD = HERE / "bench_child.py"
LATENCY_MS = 20
SECTION = "## Side by side with the Python plugin 0.2.0"


def plugin_venv(path: Path) -> Path:
    """The plugin's venv, created (lfx 1.13.0 + the plugin 0.2.0) when missing."""
    python = path / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "lfx==1.13.0",
             "langflow-sandbox-createos==0.2.0"],
            check=True,
        )
    return python


def child(python: Path, what: str, runs: int, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run(
        [str(python), str(CHILD), what, str(runs)],
        capture_output=True, text=True, env=env, cwd=HERE, timeout=900, check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"{python} {what} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def command(args: argparse.Namespace) -> str:
    """The options that shaped the figures, as a reader would type them (``--write`` left out)."""
    words = [f"--rounds {args.rounds}"]
    if args.ours_venv:
        words.append(f"--ours-venv {args.ours_venv.name}")
    if args.backend_runs != 50:
        words.append(f"--backend-runs {args.backend_runs}")
    if args.before_venv:
        words.append(f"--before-venv {args.before_venv.name} --before-label {args.before_label!r}")
    return " ".join(words)


def med(values: list[float]) -> float:
    return statistics.median(values)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--plugin-venv", type=Path, default=ROOT / ".venv-plugin-0.2.0")
    parser.add_argument("--backend-runs", type=int, default=50)
    parser.add_argument("--write", type=Path, default=None)
    parser.add_argument("--before-venv", type=Path, default=None)
    # A venv like a user's (lfx 1.13.0 and this wheel only). The CI venv's extra packages (the
    # stub checkers, selenium, the release tools) made each backend run cost ~25% more host CPU
    # in one measurement, which says nothing about this project.
    parser.add_argument("--ours-venv", type=Path, default=None)
    parser.add_argument("--before-label", default="before")
    args = parser.parse_args()
    ours = args.ours_venv / "bin" / "python" if args.ours_venv else Path(sys.executable)
    plugin = plugin_venv(args.plugin_venv)
    fake = start_fake(latency_ms=LATENCY_MS)
    try:
        env = backend_env(fake)
        ex: dict[str, list[dict[str, Any]]] = {"ours": [], "plugin": [], "before": []}
        sides = [("ours", ours), ("plugin", plugin)]
        if args.before_venv:
            sides.append(("before", args.before_venv / "bin" / "python"))
        for r in range(args.rounds):
            order = sides
            for name, python in order if r % 2 == 0 else order[::-1]:
                ex[name].append(child(python, "executor", 2, env))
        be_cpu = {"ours": [], "plugin": []}
        warm, floor = [], []
        for r in range(args.rounds):
            for name, python in (("ours", ours), ("plugin", plugin)):
                be_cpu[name].append(child(python, "backend", args.backend_runs, env)["cpu_ms_per_run"])
            pooled = {**env, "CREATEOS_SANDBOX_WARM_POOL": "4"}
            warm.append(child(ours, "backend", args.backend_runs, pooled)["median_ms"])
            kept = floor_runs(fake.url, args.backend_runs, 0.0)[2:]
            floor.append(med([a + b for a, b in kept]))
        stats = fake.stats()
    finally:
        fake.stop()

    def column(name: str, run: int, key: str) -> list[float]:
        return [round_[run][key] for round_ in (x["runs"] for x in ex[name])]

    lines = [
        SECTION,
        "",
        f"Measured with `python tests/e2e/bench_vs_plugin.py {command(args)}`: {os.cpu_count()} cores, "
        f"{platform.python_implementation()} {platform.python_version()}, lfx 1.13.0 in both venvs, one "
        f"`createos-fake --latency-ms {LATENCY_MS}` for both sides, rounds interleaved. The flow is "
        "`tests/e2e/flows/slow_flow.json` (a 2 s vertex); each executor figure is the median over the "
        "rounds of a fresh process's first run (run 1) and its second (run 2).",
        "",
        "| measure | this project | plugin 0.2.0 | ratio |",
        "|---|---|---|---|",
    ]
    for run, label in ((0, "run 1"), (1, "run 2")):
        for key, what in (("first", "first event"), ("total", "total")):
            a, b = med(column("ours", run, key)), med(column("plugin", run, key))
            lines.append(f"| executor cold, {label}: {what} | {a:.2f} s | {b:.2f} s | {a / b:.2f}× |")
    a, b = med(be_cpu["ours"]), med(be_cpu["plugin"])
    lines.append(f"| backend host CPU per run (sequential, cold) | {a:.2f} ms | {b:.2f} ms | {a / b:.2f}× |")
    a, f = med(warm), med(floor)
    lines.append(f"| backend warm run (pool of 4, back to back) vs the rig's floor | {a:.1f} ms | floor {f:.1f} ms | {a / f:.2f}× |")
    if ex["before"]:
        for run, label in ((0, "run 1"), (1, "run 2")):
            a, b = med(column("before", run, "first")), med(column("plugin", run, "first"))
            lines.append(f"| executor cold, {label}: first event, {args.before_label} | {a:.2f} s | {b:.2f} s | {a / b:.2f}× |")
    sides_shown = ["ours", "before"] if ex["before"] else ["ours"]
    lines += ["", "This project's executor phases (median of the rounds, ms"
              + (f"; *{args.before_label}* is the other build measured in the same rounds" if ex["before"] else "")
              + "):", ""]
    phases = [k for k in ex["ours"][0]["runs"][0].get("timings", {})]
    heads = [f"{'' if side == 'ours' else args.before_label + ', '}run {run + 1}" for side in sides_shown for run in (0, 1)]
    lines.append("| phase | " + " | ".join(heads) + " |")
    lines.append("|---" * (1 + len(heads)) + "|")
    for phase in phases:
        cells = []
        for side in sides_shown:
            for run in (0, 1):
                vals = [x["runs"][run].get("timings", {}).get(phase) for x in ex[side]]
                vals = [v for v in vals if v is not None]
                cells.append(f"{med(vals):.0f}" if vals else "—")
        lines.append(f"| `{phase}` | " + " | ".join(cells) + " |")
    lines += ["", f"The fake saw {stats['created']} guests created and {stats['live']} live at the end."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        from bench_backend import write_section

        write_section(args.write, text, SECTION)
    return 0 if stats["live"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
