"""What `cargo package --list -p CRATE` ships for a published crate (createos-api, outside-text),
checked: the library, its examples, the README and the licence, and nothing else (no tests that
need the unpublished fake, no stray files).

    cargo package --list -p createos-api | python scripts/check_package_list.py createos-api
"""

from __future__ import annotations

import sys

ALWAYS = {"Cargo.toml", "Cargo.toml.orig", "Cargo.lock", ".cargo_vcs_info.json"}
REQUIRED = {"Cargo.toml", "README.md", "LICENSE", "src/lib.rs"}


def main() -> int:
    crate = sys.argv[1] if len(sys.argv) > 1 else "createos-api"
    files = sys.stdin.read().split()
    unexpected = [
        f for f in files if f not in ALWAYS | REQUIRED and not f.startswith(("src/", "examples/"))
    ]
    missing = sorted(REQUIRED - set(files))
    if unexpected or missing:
        print(f"{crate} package: unexpected {unexpected}, missing {missing}")
        return 1
    print(f"{crate} package: {len(files)} files (src/, examples/, README.md, LICENSE)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
