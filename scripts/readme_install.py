"""The README's install commands, read from the README itself, so that CI runs what it says.

    python scripts/readme_install.py build    # the line that builds the wheel
    python scripts/readme_install.py wheel    # the line that installs the built wheel
    python scripts/readme_install.py source   # the line that builds and installs from the source

The first fenced ``bash`` block of the README's ``## Install`` section holds exactly these three
commands (comment lines aside), recognised by what they run: ``scripts/build-wheels``, ``pip
install dist/...``, and ``pip install`` of a folder. ``scripts/test`` runs the ``wheel`` line in
a fresh virtual environment after building the same wheel; ``tests/packaging/test_readme_install.py``
checks the other two without a build. Exit status 1, with the reason on stderr, when the block
is missing or does not hold one command of each kind.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("build", "wheel", "source")


def install_block(readme: str) -> list[str]:
    """The commands of the first ``bash`` block under ``## Install``, without comments."""
    lines = readme.splitlines()
    try:
        start = lines.index("## Install")
    except ValueError:
        raise SystemExit("README.md has no '## Install' section") from None
    commands: list[str] = []
    inside = False
    for line in lines[start + 1 :]:
        if line.startswith("## "):
            break
        if not inside:
            inside = line.strip() == "```bash"
            continue
        if line.strip() == "```":
            return commands
        text = line.strip()
        if text and not text.startswith("#"):
            commands.append(text)
    raise SystemExit("README.md's Install section has no closed ```bash block")


def kind_of(command: str) -> str | None:
    """Which of :data:`KINDS` a command is, or ``None``."""
    words = command.split()
    if words[:1] == ["scripts/build-wheels"]:
        return "build"
    if words[:2] == ["pip", "install"] and len(words) == 3:
        target = words[2]
        if target.startswith("dist/") and target.endswith(".whl"):
            return "wheel"
        if target.startswith("./"):
            return "source"
    return None


def commands(readme: str) -> dict[str, str]:
    """One command of each kind, or ``SystemExit`` naming what is wrong."""
    found: dict[str, str] = {}
    for command in install_block(readme):
        kind = kind_of(command)
        if kind is None:
            raise SystemExit(f"README.md's install block has a command this script does not know: {command!r}")
        if kind in found:
            raise SystemExit(f"README.md's install block has two {kind} commands")
        found[kind] = command
    missing = [k for k in KINDS if k not in found]
    if missing:
        raise SystemExit(f"README.md's install block lacks the {', '.join(missing)} command(s)")
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in KINDS:
        print(f"usage: python scripts/readme_install.py {{{','.join(KINDS)}}}", file=sys.stderr)
        return 2
    print(commands((ROOT / "README.md").read_text(encoding="utf-8"))[argv[0]])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
