"""The checks behind ``scripts/demo``: each step's ``lfx run`` output read, shown and verified.

The demo is the README's first command and CI runs it, so every claim it prints is checked
here, and a step that does not show what it says exits 1 with the output that was seen:

    demo_steps.py backend                  < lfx run output   # the Python Interpreter's answer
    demo_steps.py component STATE          < lfx run output   # one Guest Reuse run (STATE: a file)
    demo_steps.py executor                 < lfx run output   # the flow's answer
    demo_steps.py guests URL [--since FILE] [--expect-live N] # what the fake control plane saw

Standard library only: it runs with the demo's venv Python before anything else is known to work.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, NoReturn


def fail(message: str, seen: str = "") -> NoReturn:
    """Stop the demo: what went wrong, then what was seen (bounded)."""
    print(f"demo step failed: {message}", file=sys.stderr)
    if seen:
        print(seen[-4000:], file=sys.stderr)
    sys.exit(1)


def lfx_result(text: str) -> dict[str, Any]:
    """The JSON object ``lfx run`` printed last; fails the step unless the run succeeded."""
    lines = [line for line in text.strip().splitlines() if line.strip().startswith("{")]
    if not lines:
        fail("lfx run printed no JSON result", text)
    try:
        out = json.loads(lines[-1])
    except json.JSONDecodeError:
        fail("lfx run's last line is not JSON", text)
    if not isinstance(out, dict) or not out.get("success"):
        fail("the flow did not succeed", json.dumps(out, indent=2))
    return out


def chat_json(out: dict[str, Any]) -> dict[str, Any]:
    """The Data the flow's Chat Output rendered as a fenced JSON block."""
    body = str(out.get("result", "")).strip().removeprefix("```json").removesuffix("```")
    try:
        data = json.loads(body)
    except json.JSONDecodeError:
        fail("the flow's answer is not the component's JSON", body)
    if not isinstance(data, dict):
        fail("the flow's answer is not a JSON object", body)
    return data


def backend(text: str) -> None:
    """The Python Interpreter's output, which ran in a guest."""
    data = chat_json(lfx_result(text))
    if "error" in data:
        fail("the program failed in the guest", json.dumps(data, indent=2))
    print("guest output:", data.get("result", data))


def component(text: str, state: Path) -> None:
    """One run of the CreateOS Sandbox node with Guest Reuse on; the second checks the first."""
    data = chat_json(lfx_result(text))
    runs = json.loads(state.read_text()) if state.exists() else []
    runs.append({k: data.get(k) for k in ("sandbox_name", "reused_guest", "kept_guest", "result")})
    state.write_text(json.dumps(runs))
    run = runs[-1]
    how = "found again by name" if run["reused_guest"] else "created"
    print(f"run {len(runs)}: guest {run['sandbox_name']} ({how}, kept: {run['kept_guest']}) -> {run['result']}")
    if not run["kept_guest"]:
        fail("Guest Reuse is on but the guest was not kept", json.dumps(data, indent=2))
    if len(runs) == 2:
        first, second = runs
        if not (second["reused_guest"] and second["sandbox_name"] == first["sandbox_name"]):
            fail("the second run did not get the first run's guest", json.dumps(runs, indent=2))
        if (first["result"], second["result"]) != ("RUN_COUNT 1", "RUN_COUNT 2"):
            fail("the second run did not see the file the first run wrote", json.dumps(runs, indent=2))
        print(
            "shown: both runs used one guest, named after the flow id the exported JSON carries;"
            " the second read the file the first wrote"
        )


def executor(text: str) -> None:
    """The flow's answer; every vertex ran in one guest."""
    out = lfx_result(text)
    answer = str(out.get("result", ""))
    if not answer:
        fail("the flow gave no answer", json.dumps(out, indent=2))
    print("flow answer:", answer)


def settled(url: str, expect_live: int) -> dict[str, Any]:
    """The fake's counts once its destroys completed (a destroy lands a moment after the delete)."""
    stats: dict[str, Any] = {}
    for _ in range(100):
        with urllib.request.urlopen(url + "/_fake/stats", timeout=5) as reply:
            stats = json.loads(reply.read())["data"]
        if stats["live"] == expect_live and stats["created"] - stats["destroyed"] == expect_live:
            break
        time.sleep(0.1)
    return stats


def guests(url: str, since: Path | None, expect_live: int) -> None:
    """What the control plane saw since ``since`` recorded its counts (then records them)."""
    stats = settled(url, expect_live)
    before = json.loads(since.read_text()) if since and since.exists() else {"created": 0, "destroyed": 0}
    created = stats["created"] - before["created"]
    destroyed = stats["destroyed"] - before["destroyed"]
    print(f"guests created {created}, destroyed {destroyed}, live now {stats['live']}")
    print("requests so far:", ", ".join(f"{k} {v}" for k, v in sorted(stats["requests"].items())))
    if since:
        since.write_text(json.dumps({"created": stats["created"], "destroyed": stats["destroyed"]}))
    if stats["live"] != expect_live:
        fail(f"expected {expect_live} live guest(s), the fake has {stats['live']}", json.dumps(stats))


def sandboxes(url: str, since: Path | None) -> None:
    """What the OpenSandbox fake saw since ``since`` recorded its counts (then records them):
    every sandbox created is deleted."""
    stats: dict[str, Any] = {}
    for _ in range(100):
        with urllib.request.urlopen(url + "/_fake/stats", timeout=5) as reply:
            stats = json.loads(reply.read())
        if stats["live"] == 0:
            break
        time.sleep(0.1)
    before = json.loads(since.read_text()) if since and since.exists() else {"created": 0, "deleted": 0}
    created = stats["created"] - before["created"]
    deleted = stats["deleted"] - before["deleted"]
    print(f"sandboxes created {created}, deleted {deleted}, live now {stats['live']}")
    if since:
        since.write_text(json.dumps({"created": stats["created"], "deleted": stats["deleted"]}))
    if stats["live"] != 0 or created < 1 or created != deleted:
        fail("expected every sandbox created to be deleted", json.dumps(stats))


def main() -> None:
    """Dispatch one step."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    steps = parser.add_subparsers(dest="step", required=True)
    steps.add_parser("backend")
    steps.add_parser("component").add_argument("state", type=Path)
    steps.add_parser("executor")
    g = steps.add_parser("guests")
    g.add_argument("url")
    g.add_argument("--since", type=Path)
    g.add_argument("--expect-live", type=int, default=0)
    o = steps.add_parser("sandboxes")
    o.add_argument("url")
    o.add_argument("--since", type=Path)
    args = parser.parse_args()
    if args.step == "backend":
        backend(sys.stdin.read())
    elif args.step == "component":
        component(sys.stdin.read(), args.state)
    elif args.step == "executor":
        executor(sys.stdin.read())
    elif args.step == "sandboxes":
        sandboxes(args.url, args.since)
    else:
        guests(args.url, args.since, args.expect_live)


if __name__ == "__main__":
    main()
