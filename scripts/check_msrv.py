"""The minimum supported Rust version, checked without that toolchain.

    cargo metadata --format-version 1 | python scripts/check_msrv.py

Only one Rust toolchain can be installed on the build machines, so the MSRV cannot be proven by
building with it. This checks what can be checked from the manifests:

- every workspace crate states a ``rust-version``, and all state the workspace's one;
- no dependency in the resolved graph (``Cargo.lock``, every target and feature) declares a
  ``rust-version`` newer than ours. Cargo's resolver 3 (``resolver = "3"``) already prefers such
  versions when the lock is updated; this makes a newer one a CI failure instead of a surprise.

``cargo clippy`` does the other half on every change: its ``incompatible_msrv`` lint reads the
same ``rust-version`` and rejects calls to standard-library APIs stabilised after it. Neither
catches a language feature newer than the MSRV, nor a dependency that understates its own
``rust-version`` (RELEASING.md, "Minimum supported Rust version").
"""

from __future__ import annotations

import json
import sys


def version(text: str) -> tuple[int, ...]:
    parts = [int(part) for part in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def main() -> int:
    meta = json.load(sys.stdin)
    members = set(meta["workspace_members"])
    resolved = {node["id"] for node in meta["resolve"]["nodes"]}
    packages = {p["id"]: p for p in meta["packages"] if p["id"] in resolved}
    crates = [p for pid, p in packages.items() if pid in members]
    stated = {p["name"]: p.get("rust_version") for p in crates}
    problems = [f"{name} states no rust-version" for name, rv in stated.items() if not rv]
    versions = {rv for rv in stated.values() if rv}
    if len(versions) > 1:
        problems.append(f"workspace crates state different rust-versions: {stated}")
    if not versions:
        print("no rust-version stated anywhere")
        return 1
    msrv = max(versions, key=version)
    newer = sorted(
        (p["name"], p["version"], p["rust_version"])
        for pid, p in packages.items()
        if pid not in members and p.get("rust_version") and version(p["rust_version"]) > version(msrv)
    )
    problems += [f"dependency {n} {v} needs Rust {rv}, newer than the MSRV {msrv}" for n, v, rv in newer]
    deps = [p for pid, p in packages.items() if pid not in members]
    declared = [p for p in deps if p.get("rust_version")]
    newest = max(declared, key=lambda p: version(p["rust_version"]), default=None)
    for problem in problems:
        print(f"FAIL {problem}")
    if problems:
        return 1
    print(
        f"MSRV {msrv}: stated by all {len(crates)} workspace crates; {len(declared)} of {len(deps)} "
        f"dependencies declare a rust-version, the newest {newest['rust_version'] if newest else '-'} "
        f"({newest['name'] if newest else '-'}); none is newer than {msrv}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
