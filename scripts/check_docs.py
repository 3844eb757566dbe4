"""The documentation loses nothing and links nowhere dead.

    python scripts/check_docs.py              # the repository this script is in
    python scripts/check_docs.py --root DIR   # another tree laid out the same way

Three checks, all offline and from the files alone:

1. **Every setting is documented.** Each environment-variable name of this project's families
   (``CREATEOS_*``, ``LANGFLOW_*``, ``PROMETHEUS_*``) that the sources read or mention (the Rust
   crates, the Python package, the test tools' Rust sources) appears in at least one page of the
   docs set: the README, RELEASING.md, CONTRIBUTING.md, ``docs/*.md`` and the crates' and test
   tools' READMEs. A few names are internal on purpose; they are listed in ``INTERNAL`` below,
   each with the reason.
2. **Every relative link resolves.** Each Markdown link ``[text](path)``, ``[text](path#anchor)``
   or ``[text](#anchor)`` in the docs set points at a file or folder that exists, relative to the
   page that links, and an anchor names a heading of the target page under GitHub's rules
   (lowercase; spaces become ``-``; punctuation other than ``-`` and ``_`` is dropped; a repeated
   heading gets ``-1``, ``-2``, ...). ``http(s)`` and ``mailto`` links are not followed.
3. **The README stays an entry point:** at most ``README_MAX_LINES`` lines, with a
   ``## Contents`` section.

Exit status 0 prints one summary line; 1 lists every problem found.
"""

from __future__ import annotations

import argparse
import re
import sys
import unicodedata
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

ENV_NAME = re.compile(r"\b(?:CREATEOS|LANGFLOW|PROMETHEUS)_[A-Z0-9_]*[A-Z0-9]\b")

# Where settings are read: every file these patterns match, relative to the root.
SOURCES = (
    "crates/*/src/**/*.rs",
    "crates/py-bindings/python/**/*.py",
    "tests/*/src/**/*.rs",
)

# The docs set: what an operator or a contributor reads.
DOCS = (
    "README.md",
    "RELEASING.md",
    "CONTRIBUTING.md",
    "CHANGELOG.md",
    "docs/*.md",
    "crates/*/README.md",
    "tests/*/README.md",
)

README_MAX_LINES = 340

# Names the sources contain that are not settings anyone sets. Keep this short: a real setting
# that is undocumented gets documented, never listed here.
INTERNAL: dict[str, str] = {
    # Not a variable: the common prefix of the backend's settings, in a test of
    # crates/langflow-executor/src/settings.rs asserting that the executor's messages never
    # name a `LANGFLOW_SANDBOX_*` setting.
    "LANGFLOW_SANDBOX": "a prefix in a test assertion, not a setting",
}

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
# [text](target) and ![alt](target), with an optional title; the text may hold code spans.
INLINE_LINK = re.compile(r"!?\[(?P<text>[^\]]*)\]\((?P<target><[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+(?P<target>\S+)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(?P<text>.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.IGNORECASE)
LINE_ANCHOR = re.compile(r"^L\d+(-L\d+)?$")


@dataclass(frozen=True)
class Link:
    page: Path
    line: int
    target: str


def files(root: Path, patterns: Iterable[str]) -> list[Path]:
    """Every file under ``root`` that one of ``patterns`` matches, once, in a stable order."""
    found: set[Path] = set()
    for pattern in patterns:
        found.update(path for path in root.glob(pattern) if path.is_file())
    return sorted(found)


def prose_lines(text: str) -> Iterator[tuple[int, str]]:
    """The lines of a Markdown page outside fenced code blocks, numbered from 1."""
    fenced = False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading (before the ``-1`` of a repeated one)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link counts by its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    kept = []
    for char in text:
        if char in "-_ " or unicodedata.category(char)[0] in "LN":
            kept.append(char)
    return "".join(kept).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every anchor a page offers: its headings' slugs, numbered when repeated, and HTML anchors."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for _, line in prose_lines(text):
        heading = HEADING.match(line)
        if heading:
            slug = github_slug(heading["text"])
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
        found.update(HTML_ANCHOR.findall(line))
    return found


def links(page: Path, text: str) -> Iterator[Link]:
    """Every link of a page's prose (not in code blocks or code spans)."""
    for number, line in prose_lines(text):
        # Blank out code spans, keeping their length, so `[x](y)` inside one is not a link but
        # a link whose text is a code span still is.
        line = CODE_SPAN.sub(lambda m: "`" * len(m[1]) + "x" * len(m[2]) + "`" * len(m[1]), line)
        for match in INLINE_LINK.finditer(line):
            yield Link(page, number, match["target"].strip("<>"))
        definition = REFERENCE_DEF.match(line)
        if definition:
            yield Link(page, number, definition["target"].strip("<>"))


def is_external(target: str) -> bool:
    return re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) is not None  # http:, https:, mailto:, ...


def link_problem(root: Path, link: Link, cache: dict[Path, set[str]]) -> str | None:
    """Why ``link`` does not resolve, or None when it does."""
    path_part, _, anchor = link.target.partition("#")
    path_part, anchor = unquote(path_part), unquote(anchor)
    if path_part:
        target = (link.page.parent / path_part).resolve()
        if path_part.startswith("/"):
            target = (root / path_part.lstrip("/")).resolve()
        if not target.exists():
            return f"{path_part} does not exist"
    else:
        target = link.page
    if not anchor:
        return None
    if target.is_dir():
        return f"#{anchor} points into a folder"
    if target.suffix.lower() != ".md":
        return None if LINE_ANCHOR.match(anchor) else f"#{anchor} points into a file that is not Markdown"
    if target not in cache:
        cache[target] = anchors(target.read_text(encoding="utf-8"))
    if anchor not in cache[target]:
        where = "this page" if target == link.page else relative(root, target)
        return f"no heading of {where} gives #{anchor}"
    return None


def relative(root: Path, path: Path) -> str:
    try:
        return str(path.resolve().relative_to(root.resolve()))
    except ValueError:
        return str(path)


def check(root: Path) -> tuple[list[str], str]:
    """All problems under ``root``, and the summary line for when there are none."""
    problems: list[str] = []
    root = root.resolve()

    sources = files(root, SOURCES)
    named: dict[str, Path] = {}
    for source in sources:
        for name in ENV_NAME.findall(source.read_text(encoding="utf-8", errors="replace")):
            named.setdefault(name, source)

    docs = files(root, DOCS)
    texts = {page: page.read_text(encoding="utf-8") for page in docs}
    documented: set[str] = set()
    for text in texts.values():
        documented.update(ENV_NAME.findall(text))
    undocumented = sorted(set(named) - documented - set(INTERNAL))
    for name in undocumented:
        problems.append(
            f"undocumented setting {name} (first seen in {relative(root, named[name])}): "
            "document it in the README or a page under docs/, or, if it is internal, add it to "
            "INTERNAL in scripts/check_docs.py with the reason"
        )
    for name in sorted(set(INTERNAL) & documented):
        problems.append(f"{name} is in INTERNAL but the docs mention it: drop it from INTERNAL")

    cache: dict[Path, set[str]] = {}
    checked = 0
    for page, text in texts.items():
        for link in links(page, text):
            if is_external(link.target):
                continue
            checked += 1
            why = link_problem(root, link, cache)
            if why:
                problems.append(f"dead link in {relative(root, page)}:{link.line}: ({link.target}): {why}")

    readme = root / "README.md"
    readme_lines = 0
    if not readme.is_file():
        problems.append("README.md is missing")
    else:
        text = texts.get(readme.resolve(), readme.read_text(encoding="utf-8"))
        readme_lines = len(text.splitlines())
        if readme_lines > README_MAX_LINES:
            problems.append(
                f"README.md has {readme_lines} lines, more than {README_MAX_LINES}: move detail to docs/"
            )
        if not any(re.fullmatch(r"##\s+Contents\s*", line) for _, line in prose_lines(text)):
            problems.append("README.md has no '## Contents' section")

    settings = len(set(named) - set(INTERNAL))
    summary = (
        f"docs ok: {settings} settings named in {len(sources)} source files are documented, "
        f"{checked} relative links in {len(docs)} pages resolve, "
        f"README.md has {readme_lines} lines (at most {README_MAX_LINES})"
    )
    return problems, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Checks that the docs lose nothing and link nowhere dead.")
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parent.parent,
        help="the tree to check (default: this repository)",
    )
    args = parser.parse_args(argv)
    if not args.root.is_dir():
        print(f"check_docs: --root {args.root} is not a folder", file=sys.stderr)
        return 2
    problems, summary = check(args.root)
    if problems:
        print(f"check_docs: {len(problems)} problem(s):", file=sys.stderr)
        for problem in problems:
            print(f"  - {problem}", file=sys.stderr)
        return 1
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
