"""The import picture of a crate's modules, and whether it has a circle.

    python scripts/module_graph.py crates/sandbox-core           # edges, then any circle; exit 1 on one
    python scripts/module_graph.py crates/py-bindings --dot      # the graph in Graphviz's dot
    python scripts/module_graph.py --all                         # every crate under crates/ and tests/

With ``--all`` (what CI runs) it finds every Rust crate under ``crates/`` and ``tests/`` of the
repository (a ``Cargo.toml`` with a ``[package]`` and a ``src/``; build output and hidden
directories skipped), prints one line per crate, the edges of any crate with a circle, and exits
1 when any crate has one.

A module is a top-level module of the crate (``src/guest.rs`` or ``src/guest/``, whatever its
submodules); module A depends on module B when any file of A names ``crate::B`` (in a ``use``
or a path). ``lib.rs`` re-exports are the crate root's, not a module's, and are left out. A
circle is a strongly connected set of two or more modules (Tarjan's algorithm): each of them
reaches each other one, so none of them is below the others. The crate's README or the issue
that asked for it says which module is meant to be at the bottom.

Standard library only; it reads the sources, it does not build them.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

# `crate::name` in a path or a `use`; `use crate::{a, b::c}` groups too.
PATH = re.compile(r"\bcrate::([a-z_][a-z0-9_]*)")
GROUP = re.compile(r"\bcrate::\{([^}]*)\}", re.S)
COMMENT = re.compile(r"//[^\n]*")


def module_of(src: Path, file: Path) -> str | None:
    """The top-level module ``file`` belongs to (None for the crate root)."""
    rel = file.relative_to(src)
    if rel.parts[0] in ("lib.rs", "main.rs"):
        return None
    return rel.parts[0].removesuffix(".rs")


def graph(crate: Path) -> dict[str, set[str]]:
    """Each top-level module of ``crate`` and the modules it names."""
    src = crate / "src"
    edges: dict[str, set[str]] = {}
    for file in sorted(src.rglob("*.rs")):
        module = module_of(src, file)
        if module is None:
            continue
        text = COMMENT.sub("", file.read_text(encoding="utf-8"))
        # Unit tests may reach anywhere; they are not part of the import picture.
        text = text.split("#[cfg(test)]\nmod tests", 1)[0]
        named = set(PATH.findall(text))
        for group in GROUP.findall(text):
            named.update(m.group(1) for m in re.finditer(r"(?:^|,)\s*([a-z_][a-z0-9_]*)", group))
        edges.setdefault(module, set()).update(n for n in named if n != module)
    modules = set(edges)
    return {m: {n for n in deps if n in modules} for m, deps in edges.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of two or more modules (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def layers(edges: dict[str, set[str]]) -> list[list[str]]:
    """Modules by depth when there is no circle: layer 0 names no other module."""
    depth: dict[str, int] = {}

    def of(v: str, seen: frozenset[str]) -> int:
        if v in depth:
            return depth[v]
        if v in seen:
            return 0
        d = 1 + max((of(w, seen | {v}) for w in edges[v]), default=-1)
        depth[v] = d
        return d

    for v in edges:
        of(v, frozenset())
    out: dict[int, list[str]] = {}
    for v, d in depth.items():
        out.setdefault(d, []).append(v)
    return [sorted(out[d]) for d in sorted(out)]


def all_crates(root: Path) -> list[Path]:
    """Every Rust crate under ``root``'s ``crates/`` and ``tests/``, sorted."""
    found = []
    for top in ("crates", "tests"):
        for manifest in sorted((root / top).rglob("Cargo.toml")):
            rel = manifest.relative_to(root).parts
            if any(p == "target" or p.startswith(".") for p in rel):
                continue
            text = manifest.read_text(encoding="utf-8")
            if re.search(r"^\[package\]", text, re.M) and (manifest.parent / "src").is_dir():
                found.append(manifest.parent)
    return found


def check_all(root: Path) -> int:
    """One line per crate; the edges and circles of a crate that has any; 1 on any circle."""
    crates = all_crates(root)
    if not crates:
        print(f"{root}: no Rust crate under crates/ or tests/", file=sys.stderr)
        return 1
    bad = 0
    for crate in crates:
        edges = graph(crate)
        found = circles(edges)
        shown = crate.relative_to(root)
        if not found:
            print(f"{shown}: no circle among {len(edges)} modules")
            continue
        bad += 1
        for m in sorted(edges):
            print(f"  {m} -> {', '.join(sorted(edges[m])) or '(nothing)'}")
        for c in found:
            print(f"  circle: {' <-> '.join(c)}")
        print(f"{shown}: {len(found)} circle(s) among {len(edges)} modules")
    print(f"{len(crates)} crates, {bad} with a circle")
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("crate", type=Path, nargs="?")
    parser.add_argument("--dot", action="store_true", help="print the graph in dot and exit")
    parser.add_argument(
        "--all", action="store_true", help="check every crate under crates/ and tests/"
    )
    args = parser.parse_args()
    if args.all:
        if args.crate is not None or args.dot:
            parser.error("--all takes no crate and no --dot")
        return check_all(Path(__file__).resolve().parent.parent)
    if args.crate is None:
        parser.error("name a crate directory, or pass --all")
    edges = graph(args.crate)
    if args.dot:
        print("digraph modules {")
        for m in sorted(edges):
            for n in sorted(edges[m]):
                print(f'  "{m}" -> "{n}";')
        print("}")
        return 0
    for m in sorted(edges):
        print(f"{m} -> {', '.join(sorted(edges[m])) or '(nothing)'}")
    found = circles(edges)
    if found:
        for c in found:
            print(f"circle: {' <-> '.join(c)}")
        print(f"{args.crate}: {len(found)} circle(s) among {len(edges)} modules")
        return 1
    for depth, mods in enumerate(layers(edges)):
        print(f"layer {depth}: {', '.join(mods)}")
    print(f"{args.crate}: no circle among {len(edges)} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
