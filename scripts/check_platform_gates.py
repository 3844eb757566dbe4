"""Per-commit guard for the cross-built wheels: platform-only APIs and macOS frameworks.

    python scripts/check_platform_gates.py            # runs `cargo metadata --offline` itself
    python scripts/check_platform_gates.py --metadata FILE

CI builds only the Linux x86_64 wheel per commit; the macOS and Windows wheels are built by
``scripts/build-wheels`` (an hour and more on two cores) and the release workflow. Two breaks
of those wheels can be seen from the sources in a second, and this fails on them:

``gates``
    In the crates compiled into the wheel (``py-bindings`` and every workspace crate it depends
    on, their library modules as ``mod`` declarations reach them), a use of an API that exists
    only on some platforms (``std::os::unix``, ``std::os::fd``, ``std::os::windows``, ``nix``,
    ``libc``, ``tokio::signal::unix``, ``as_raw_fd()``, …: ``PLATFORM_APIS``) in code that is
    compiled for a wheel target lacking it. The ``#[cfg(...)]`` attributes on the enclosing
    items, statements, fields, arms and module declarations (and a file's ``#![cfg(...)]``) are
    evaluated for each wheel target, with the crate's resolved features; ``cfg(test)`` code is
    never in a wheel.

``frameworks``
    The macOS frameworks the dependency graph links for the two macOS targets (every
    ``#[link(name = "X", kind = "framework")]`` whose enclosing cfg can hold there, with each
    crate's resolved features, and every ``rustc-link-lib=framework=X`` a build script prints),
    against the stubs ``scripts/build-wheels`` writes (``MACOS_FRAMEWORKS``) and the libraries
    ``scripts/check_wheel.py`` allows a macOS module to load. A missing stub is a link failure
    of both macOS wheels.

What it does not catch (a full ``scripts/build-wheels`` does): a platform-only API reached
through a name imported under a cfg and used elsewhere (only paths and the methods listed are
seen), such an API in a third-party crate, a type that differs per platform, a cfg attribute
on an expression or a generic argument (a comma there ends what this reads as the statement,
which can only report too much), a Windows import library zig lacks, a framework a build
script names through a variable, and anything else only a compiler or a linker would see.
"""

from __future__ import annotations

import argparse
import bisect
import functools
import json
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WHEEL_CRATE = "py-bindings"
MACOS_TARGETS = ("x86_64-apple-darwin", "aarch64-apple-darwin")

# --- targets and cfg -----------------------------------------------------------------------

Facts = dict[str, set[str]]


def _facts(arch: str, os: str, family: str, env: str, vendor: str) -> Facts:
    """The cfg values rustc sets for one target (64-bit, little-endian)."""
    return {
        family: {""},
        "target_arch": {arch},
        "target_os": {os},
        "target_family": {family},
        "target_env": {env},
        "target_vendor": {vendor},
        "target_pointer_width": {"64"},
        "target_endian": {"little"},
    }


# The wheel matrix of scripts/build-wheels, and the MSVC Windows target release.yml builds.
TARGETS: dict[str, Facts] = {
    "x86_64-unknown-linux-gnu": _facts("x86_64", "linux", "unix", "gnu", "unknown"),
    "aarch64-unknown-linux-gnu": _facts("aarch64", "linux", "unix", "gnu", "unknown"),
    "x86_64-unknown-linux-musl": _facts("x86_64", "linux", "unix", "musl", "unknown"),
    "aarch64-unknown-linux-musl": _facts("aarch64", "linux", "unix", "musl", "unknown"),
    "x86_64-apple-darwin": _facts("x86_64", "macos", "unix", "", "apple"),
    "aarch64-apple-darwin": _facts("aarch64", "macos", "unix", "", "apple"),
    "x86_64-pc-windows-gnu": _facts("x86_64", "windows", "windows", "gnu", "pc"),
    "x86_64-pc-windows-msvc": _facts("x86_64", "windows", "windows", "msvc", "pc"),
}
_TARGET_FLAGS = {"unix", "windows"}
# Never set in a wheel's build.
_FALSE_FLAGS = {"test", "doc", "docsrs", "miri", "rustfmt", "clippy"}

# A cfg predicate: ("all", [...]), ("any", [...]), ("not", p), ("flag", name), ("kv", key, value).
Cfg = tuple


class CfgSyntaxError(ValueError):
    """A cfg predicate this reader cannot parse."""


def parse_cfg(text: str) -> Cfg:
    """Parses the inside of ``cfg(...)``."""
    tokens = re.findall(r'"(?:\\.|[^"\\])*"|[A-Za-z_][A-Za-z0-9_]*|[(),=]|\S', text)
    pos = 0

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise CfgSyntaxError(f"cfg({text}) ends early")
        pos += 1
        return tokens[pos - 1]

    def predicate() -> Cfg:
        name = take()
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise CfgSyntaxError(f"cfg({text}): unexpected {name!r}")
        if pos < len(tokens) and tokens[pos] == "(" and name in ("all", "any", "not"):
            take()
            items: list[Cfg] = []
            while tokens[pos] != ")":
                items.append(predicate())
                if tokens[pos] == ",":
                    take()
            take()
            if name == "not":
                if len(items) != 1:
                    raise CfgSyntaxError(f"cfg({text}): not() takes one predicate")
                return ("not", items[0])
            return (name, items)
        if pos < len(tokens) and tokens[pos] == "=":
            take()
            value = take()
            if not value.startswith('"'):
                raise CfgSyntaxError(f"cfg({text}): {name} = needs a string")
            return ("kv", name, value[1:-1])
        return ("flag", name)

    try:
        result = predicate()
    except IndexError as exc:
        raise CfgSyntaxError(f"cfg({text}) ends early") from exc
    if pos != len(tokens):
        raise CfgSyntaxError(f"cfg({text}): trailing {tokens[pos]!r}")
    return result


def evaluate(cfg: Cfg, facts: Facts, features: set[str] | None) -> bool | None:
    """True, False, or None (cannot be known here: a feature of a crate whose features are not
    given, ``debug_assertions``, ``panic``, ...)."""
    kind = cfg[0]
    if kind == "flag":
        name = cfg[1]
        if name in _TARGET_FLAGS:
            return name in facts
        if name in _FALSE_FLAGS:
            return False
        return None
    if kind == "kv":
        key, value = cfg[1], cfg[2]
        if key in facts and key.startswith("target_"):
            return value in facts[key]
        if key == "feature":
            return None if features is None else value in features
        return None
    if kind == "not":
        inner = evaluate(cfg[1], facts, features)
        return None if inner is None else not inner
    results = [evaluate(item, facts, features) for item in cfg[1]]
    if kind == "all":
        if False in results:
            return False
        return None if None in results else True
    if True in results:
        return True
    return None if None in results else False


# --- reading Rust source ---------------------------------------------------------------------

_LITERAL_START = re.compile(r"""//|/\*|(?<![A-Za-z0-9_])b?r#*"|(?<![A-Za-z0-9_])b?"|(?<![A-Za-z0-9_])b?'""")
_CHAR = re.compile(r"""b?'(?:\\u\{[0-9a-fA-F]+\}|\\x[0-9a-fA-F]{2}|\\.|[^'\\\n])'""")


def _blanked(segment: str) -> str:
    """The segment with every character but line breaks turned into a space."""
    return re.sub(r"[^\n]", " ", segment)


def strip(text: str) -> tuple[str, str]:
    """Returns (no_comments, no_literals): the text with comments blanked, and with string and
    character literals blanked too. Both keep every offset and line break of the original."""
    no_comments: list[str] = []
    no_literals: list[str] = []
    i = 0
    while True:
        m = _LITERAL_START.search(text, i)
        if not m:
            break
        start, token = m.start(), m.group()
        kept = text[i:start]
        no_comments.append(kept)
        no_literals.append(kept)
        if token == "//":
            end = text.find("\n", start)
            end = len(text) if end < 0 else end
            blank = _blanked(text[start:end])
            no_comments.append(blank)
            no_literals.append(blank)
        elif token == "/*":
            depth, end = 1, start + 2
            for nest in re.finditer(r"/\*|\*/", text[start + 2 :]):
                depth += 1 if nest.group() == "/*" else -1
                if depth == 0:
                    end = start + 2 + nest.end()
                    break
            else:
                end = len(text)
            blank = _blanked(text[start:end])
            no_comments.append(blank)
            no_literals.append(blank)
        else:
            if token.endswith("'"):
                char = _CHAR.match(text, start)
                if not char:  # a lifetime or a label
                    no_comments.append(token)
                    no_literals.append(token)
                    i = m.end()
                    continue
                end, body_end = char.end(), char.end() - 1
            elif "r" in token:
                hashes = token.count("#")
                close = text.find('"' + "#" * hashes, m.end())
                end = len(text) if close < 0 else close + 1 + hashes
                body_end = end - 1 - hashes
            else:
                j = m.end()
                while j < len(text) and text[j] != '"':
                    j += 2 if text[j] == "\\" else 1
                end = min(j + 1, len(text))
                body_end = end - 1
            no_comments.append(text[start:end])
            no_literals.append(text[start : m.end()] + _blanked(text[m.end() : body_end]) + text[body_end:end])
        i = end
    no_comments.append(text[i:])
    no_literals.append(text[i:])
    return "".join(no_comments), "".join(no_literals)


@dataclass(eq=False)
class Source:
    """One Rust file, read once: its text, its stripped forms and its bracket structure."""

    path: Path
    text: str
    no_comments: str = field(init=False)
    code: str = field(init=False)
    brackets: list[int] = field(init=False)  # offsets of every bracket, in order
    parent: dict[int, int] = field(init=False)  # opening bracket -> the one enclosing it (-1)
    match: dict[int, int] = field(init=False)  # closing bracket -> its opening bracket
    closer: dict[int, int] = field(init=False)  # opening bracket -> its closing bracket

    def __post_init__(self) -> None:
        """Strips the text and records its brackets and their pairs."""
        self.no_comments, self.code = strip(self.text)
        self.brackets, self.parent, self.match = [], {}, {}
        stack: list[int] = []
        pairs = {")": "(", "]": "[", "}": "{"}
        for m in re.finditer(r"[()\[\]{}]", self.code):
            i, c = m.start(), m.group()
            self.brackets.append(i)
            if c in "([{":
                self.parent[i] = stack[-1] if stack else -1
                stack.append(i)
            elif stack and self.code[stack[-1]] == pairs[c]:
                self.match[i] = stack.pop()
        self.closer = {o: c for c, o in self.match.items()}

    def opener(self, pos: int) -> int:
        """The innermost bracket still open just before `pos`, or -1."""
        k = bisect.bisect_left(self.brackets, pos) - 1
        while k >= 0:
            i = self.brackets[k]
            if i in self.parent:
                return i
            if i in self.match:
                return self.parent[self.match[i]]
            k -= 1  # an unmatched closer: look further back
        return -1

    def line(self, offset: int) -> int:
        """The 1-based line of an offset."""
        return self.text.count("\n", 0, offset) + 1

    def _segment_start(self, pos: int, commas: bool = True) -> int:
        """Where the item, statement, field, variant or arm that holds `pos` begins (its
        attributes included): after the nearest `;`, `{` or `}` at its level, or after a `,`
        directly in the braces of a struct, enum, union or match (elsewhere a comma at brace
        level is one of generics or closure parameters)."""
        code = self.code
        i = pos - 1
        opener = self.opener(pos)
        in_list = commas and self._is_list_brace(opener)
        while i >= 0:
            c = code[i]
            if c in ")]" and i in self.match:
                i = self.match[i] - 1
                continue
            if c in ";{}":
                return i + 1
            if c in "([":
                in_list = commas and self._is_list_brace(self.opener(i))
            elif c == "," and in_list:
                return i + 1
            i -= 1
        return 0

    @functools.cache  # noqa: B019 (one Source per file, kept for the run)
    def _is_list_brace(self, brace: int) -> bool:
        """Whether the `{` at `brace` opens a struct, enum, union or match body, whose items are
        separated by commas."""
        if brace < 0 or self.code[brace] != "{":
            return False
        header = self.code[self._segment_start(brace, commas=False) : brace]
        return re.search(r"(?<![A-Za-z0-9_])(struct|enum|union|match)(?![A-Za-z0-9_])", header) is not None

    def cfgs_in(self, start: int, end: int) -> list[str]:
        """The predicates of the `#[cfg(...)]` (and `#![cfg(...)]`) attributes in [start, end)."""
        found = []
        for m in re.finditer(r"#!?\s*\[\s*cfg\s*\(", self.code[start:end]):
            open_paren = start + m.end() - 1
            j = self.closer.get(open_paren, len(self.code))
            found.append(self.no_comments[open_paren + 1 : j])
        return found

    def gates_at(self, pos: int) -> list[str]:
        """Every cfg predicate that decides whether the code at `pos` is compiled: the file's
        inner `#![cfg]`, and the attributes of the statement or item at `pos` and of each item
        whose block encloses it."""
        gates = list(self.file_gates)
        gates += self.cfgs_in(self._segment_start(pos), pos)
        block = self.opener(pos)
        while block >= 0:
            if self.code[block] == "{":
                gates += self.cfgs_in(self._segment_start(block), block)
            block = self.opener(block)
        return gates

    @functools.cached_property
    def file_gates(self) -> list[str]:
        """The file's own `#![cfg(...)]` predicates (outside every block)."""
        return [
            self.cfgs_in(m.start(), m.end() + 1)[0]
            for m in re.finditer(r"#!\s*\[\s*cfg\s*\(", self.code)
            if self.opener(m.start()) < 0
        ]


def gate_of(predicates: Iterable[str], where: str) -> Cfg:
    """The conjunction of cfg predicates; `where` names the place in a parse error."""
    items = []
    for predicate in predicates:
        try:
            items.append(parse_cfg(predicate))
        except CfgSyntaxError as exc:
            raise CfgSyntaxError(f"{where}: {exc}") from exc
    return ("all", items)


@functools.cache
def read_source(path: Path) -> Source:
    """A file read and parsed once per run (the two macOS targets share most crates)."""
    return Source(path, path.read_text(encoding="utf-8", errors="replace"))


_MOD_DECL = re.compile(r"(?<![A-Za-z0-9_])mod\s+(r#)?([A-Za-z_][A-Za-z0-9_]*)\s*;")
_PATH_ATTR = re.compile(r'#\s*\[\s*path\s*=\s*"([^"]+)"\s*\]')


def module_files(root: Path) -> Iterator[tuple[Source, list[str]]]:
    """Each file of a crate's module tree from its root (lib.rs), with the cfg predicates of
    the `mod` declarations that lead to it. A module declared twice under different cfgs (one
    file per platform) is read once per declaration."""
    seen: set[tuple[Path, tuple[str, ...]]] = set()
    queue: list[tuple[Path, list[str]]] = [(root, [])]
    while queue:
        path, gates = queue.pop()
        key = (path, tuple(gates))
        if key in seen or not path.is_file():
            continue
        seen.add(key)
        source = read_source(path)
        yield source, gates
        owns_dir = path.name in ("lib.rs", "main.rs", "mod.rs") or path == root
        base = path.parent if owns_dir else path.parent / path.stem
        for m in _MOD_DECL.finditer(source.code):
            start = source._segment_start(m.start())
            attrs = source.no_comments[start : m.start()]
            explicit = _PATH_ATTR.search(attrs)
            if explicit:
                child = path.parent / explicit.group(1)
            else:
                name = m.group(2)
                child = base / f"{name}.rs"
                if not child.is_file():
                    child = base / name / "mod.rs"
            queue.append((child, gates + source.gates_at(m.start())))


# --- gates -----------------------------------------------------------------------------------

# (pattern in code without comments and literals, what it is, where it exists)
PLATFORM_APIS: list[tuple[re.Pattern[str], str, str]] = [
    (re.compile(r"(?<![A-Za-z0-9_])os::unix(?![A-Za-z0-9_])"), "std::os::unix", "unix"),
    (re.compile(r"(?<![A-Za-z0-9_])os::fd(?![A-Za-z0-9_])"), "std::os::fd", "unix"),
    (re.compile(r"(?<![A-Za-z0-9_])os::linux(?![A-Za-z0-9_])"), "std::os::linux", 'target_os = "linux"'),
    (re.compile(r"(?<![A-Za-z0-9_])os::(macos|darwin)(?![A-Za-z0-9_])"), "std::os::macos", 'target_os = "macos"'),
    (re.compile(r"(?<![A-Za-z0-9_])os::windows(?![A-Za-z0-9_])"), "std::os::windows", "windows"),
    (re.compile(r"(?<![A-Za-z0-9_:])nix::"), "the nix crate", "unix"),
    (re.compile(r"(?<![A-Za-z0-9_:])libc::"), "the libc crate (its Unix API; std::ffi has the C types)", "unix"),
    (re.compile(r"(?<![A-Za-z0-9_:])rustix::"), "the rustix crate", "unix"),
    (re.compile(r"(?<![A-Za-z0-9_])signal::unix(?![A-Za-z0-9_])"), "tokio::signal::unix", "unix"),
    (re.compile(r"(?<![A-Za-z0-9_])signal::windows(?![A-Za-z0-9_])"), "tokio::signal::windows", "windows"),
    (re.compile(r"(?<![A-Za-z0-9_])net::(Unix\w+|unix)(?![A-Za-z0-9_])"), "a Unix-domain socket", "unix"),
    (re.compile(r"(?<![A-Za-z0-9_])Unix(Stream|Listener|Datagram)::(pair|bind|connect|unbound)\b"), "a Unix-domain socket", "unix"),
    (re.compile(r"(?<![A-Za-z0-9_])signal_hook::(iterator|low_level::pipe)(?![A-Za-z0-9_])"), "signal-hook's Unix-only API", "unix"),
    (
        re.compile(r"(?<![A-Za-z0-9_])consts::(signal::)?SIG(?!INT\b|TERM\b|ILL\b|FPE\b|SEGV\b|ABRT\b)[A-Z0-9]+\b"),
        "a signal Windows does not have",
        "unix",
    ),
    (re.compile(r"\.(as_raw_fd|into_raw_fd|as_fd)\s*\(|(?<![A-Za-z0-9_])from_raw_fd\s*\("), "a file descriptor (std::os::fd)", "unix"),
    (re.compile(r"(?<![A-Za-z0-9_])(set_mode|from_mode)\s*\("), "Unix permissions (PermissionsExt)", "unix"),
    (re.compile(r"\.(as_raw_socket|as_raw_handle|into_raw_handle)\s*\("), "a Windows handle", "windows"),
]


@dataclass
class Finding:
    """One use of a platform-only API in code compiled for a target that lacks it."""

    path: Path
    line: int
    api: str
    targets: list[str]

    def __str__(self) -> str:
        """The FAIL line: where, what, for which targets, and the fix."""
        return (
            f"{self.path}:{self.line}: {self.api} is used in code compiled for "
            f"{', '.join(self.targets)}, which lack it: gate it with #[cfg(...)] and give those "
            f"platforms their own behaviour or a refusal that says why"
        )


_ENUM = re.compile(r"(?<![A-Za-z0-9_])enum\s+([A-Za-z_][A-Za-z0-9_]*)")
_ATTRIBUTE = re.compile(r"#\s*\[[^\]]*\]")


def gated_variants(source: Source) -> list[tuple[str, str, list[str]]]:
    """The file's enum variants that carry `#[cfg(...)]` attributes: (enum, variant, cfgs).
    A use of one (`Enum::Variant`) compiles only where those cfgs hold."""
    found = []
    for m in _ENUM.finditer(source.code):
        brace = source.code.find("{", m.end())
        if brace < 0 or brace not in source.closer or ";" in source.code[m.end() : brace]:
            continue
        end = source.closer[brace]
        for v in re.finditer(r"(?<![A-Za-z0-9_])([A-Z][A-Za-z0-9_]*)", source.code[brace + 1 : end]):
            pos = brace + 1 + v.start()
            if source.opener(pos) != brace:
                continue  # a type inside a variant's fields
            start = source._segment_start(pos)
            if _ATTRIBUTE.sub("", source.code[start:pos]).strip():
                continue  # not the first word of the variant
            cfgs = source.cfgs_in(start, pos)
            if cfgs:
                found.append((m.group(1), v.group(1), cfgs))
    return found


def find_ungated(source: Source, module_gates: list[str], features: set[str] | None) -> list[Finding]:
    """Each line of `source` using a platform-only API in code compiled for a target without
    it, given the cfgs of the module declarations leading to the file and the crate's
    features (None: unknown, so a feature may be on or off). A variant of this file's enums
    that exists only under a cfg (`#[cfg(unix)] Unix(UnixStream)`) counts as such an API
    where it is named (`Socket::Unix`)."""
    findings: list[Finding] = []
    reported: set[int] = set()  # one finding per line
    for enum, variant, cfgs in gated_variants(source):
        has_it = gate_of(cfgs + module_gates, f"{source.path}: variant {enum}::{variant}")
        for m in re.finditer(rf"(?<![A-Za-z0-9_]){enum}\s*::\s*{variant}(?![A-Za-z0-9_])", source.code):
            where = f"{source.path}:{source.line(m.start())}"
            gate = gate_of(module_gates + source.gates_at(m.start()), where)
            lacking = [
                name
                for name, facts in TARGETS.items()
                if evaluate(gate, facts, features) is not False and evaluate(has_it, facts, features) is False
            ]
            line = source.line(m.start())
            if lacking and line not in reported:
                reported.add(line)
                findings.append(Finding(source.path, line, f"{enum}::{variant} (declared under a cfg)", lacking))
    for pattern, api, available in PLATFORM_APIS:
        has_it = parse_cfg(available)
        for m in pattern.finditer(source.code):
            where = f"{source.path}:{source.line(m.start())}"
            gate = gate_of(module_gates + source.gates_at(m.start()), where)
            lacking = [
                name
                for name, facts in TARGETS.items()
                if evaluate(gate, facts, features) is not False and not evaluate(has_it, facts, None)
            ]
            line = source.line(m.start())
            if lacking and line not in reported:
                reported.add(line)
                findings.append(Finding(source.path, line, api, lacking))
    return sorted(findings, key=lambda f: f.line)


# --- cargo metadata --------------------------------------------------------------------------


@dataclass
class Graph:
    """The resolved graph of `cargo metadata` (every platform)."""

    packages: dict[str, dict]
    nodes: dict[str, dict]
    members: set[str]

    @classmethod
    def load(cls, meta: dict) -> Graph:
        """From the parsed `cargo metadata` JSON."""
        return cls(
            packages={p["id"]: p for p in meta["packages"]},
            nodes={n["id"]: n for n in meta["resolve"]["nodes"]},
            members=set(meta["workspace_members"]),
        )

    def by_name(self, name: str) -> str:
        """The package id of a workspace crate."""
        ids = [pid for pid in self.members if self.packages[pid]["name"] == name]
        if len(ids) != 1:
            raise SystemExit(f"no single workspace crate named {name}")
        return ids[0]

    def closure(self, root: str, target: str | None) -> list[str]:
        """The packages `root` links for `target` (None: any target): normal dependencies only
        (build scripts and proc macros run on the build machine)."""
        order, seen, queue = [], {root}, [root]
        while queue:
            pid = queue.pop(0)
            order.append(pid)
            for dep in self.nodes[pid]["deps"]:
                for kind in dep["dep_kinds"]:
                    if kind["kind"] is not None:
                        continue
                    if target is not None and kind["target"] is not None and not _platform_matches(kind["target"], target):
                        continue
                    if dep["pkg"] not in seen:
                        seen.add(dep["pkg"])
                        queue.append(dep["pkg"])
                    break
        return order

    def features(self, pid: str) -> set[str]:
        """The package's resolved features (the union over every platform)."""
        return set(self.nodes[pid].get("features", []))

    def lib_root(self, pid: str) -> Path | None:
        """The root file of the package's library, if it has one."""
        for target in self.packages[pid]["targets"]:
            if {"lib", "rlib", "cdylib", "dylib", "staticlib"} & set(target["kind"]):
                return Path(target["src_path"])
        return None

    def build_script(self, pid: str) -> Path | None:
        """The package's build script, if it has one."""
        for target in self.packages[pid]["targets"]:
            if "custom-build" in target["kind"]:
                return Path(target["src_path"])
        return None


def _platform_matches(spec: str, target: str) -> bool:
    """Whether a dependency's platform (`cfg(...)` or a target triple) can hold on `target`."""
    if spec.startswith("cfg(") and spec.endswith(")"):
        return evaluate(parse_cfg(spec[4:-1]), TARGETS[target], None) is not False
    return spec == target


def check_gates(graph: Graph) -> tuple[list[str], str]:
    """The `gates` check over the wheel's workspace crates: (problems, summary)."""
    crates = [pid for pid in graph.closure(graph.by_name(WHEEL_CRATE), None) if pid in graph.members]
    problems: list[str] = []
    files = 0
    for pid in crates:
        root = graph.lib_root(pid)
        if root is None:
            continue
        for source, gates in module_files(root):
            files += 1
            try:
                found = find_ungated(source, gates, graph.features(pid))
            except CfgSyntaxError as exc:
                problems.append(f"cannot read a cfg: {exc}")
                continue
            problems += [str(f) for f in found]
    names = ", ".join(sorted(graph.packages[pid]["name"] for pid in crates))
    return problems, f"platform-only APIs gated in {files} files of the wheel's crates ({names})"


# --- frameworks ------------------------------------------------------------------------------

_LINK_FRAMEWORK = re.compile(r'(?<![A-Za-z0-9_])link\s*\(\s*name\s*=\s*"([^"]+)"\s*,\s*kind\s*=\s*"framework"')
_FRAMEWORK_BYTES = re.compile(rb'kind\s*=\s*"framework"')
_BUILD_FRAMEWORK = re.compile(r"rustc-link-lib=framework=([A-Za-z0-9_]+)")


def linked_frameworks(graph: Graph, pid: str, target: str) -> set[str]:
    """The frameworks one package links on `target`."""
    found: set[str] = set()
    features = graph.features(pid)
    root = graph.lib_root(pid)
    if root is not None and not any(_FRAMEWORK_BYTES.search(p.read_bytes()) for p in root.parent.rglob("*.rs")):
        root = None  # nothing to read: most crates
    reached: set[Path] = set()
    if root is not None:
        for source, gates in module_files(root):
            reached.add(source.path)
            if "framework" not in source.text:
                continue
            for m in _LINK_FRAMEWORK.finditer(source.no_comments):
                try:
                    gate = gate_of(gates + source.gates_at(m.start()), f"{source.path}:{source.line(m.start())}")
                except CfgSyntaxError:
                    gate = ("all", [])  # unreadable: count it
                if evaluate(gate, TARGETS[target], features) is not False:
                    found.add(m.group(1))
        # Files the module walk did not reach (a module made by a macro, say): counted as if
        # compiled, which can only report too much.
        for path in root.parent.rglob("*.rs"):
            if path not in reached:
                text = path.read_text(encoding="utf-8", errors="replace")
                if "framework" in text:
                    found.update(_LINK_FRAMEWORK.findall(strip(text)[0]))
    script = graph.build_script(pid)
    if script is not None and script.is_file():
        found.update(_BUILD_FRAMEWORK.findall(strip(script.read_text(encoding="utf-8", errors="replace"))[0]))
    return found


def stubbed_frameworks(build_wheels: str) -> set[str]:
    """The frameworks scripts/build-wheels stubs (its MACOS_FRAMEWORKS=(NAME:COMPAT:CURRENT ...))."""
    m = re.search(r"^MACOS_FRAMEWORKS=\(([^)]*)\)", build_wheels, re.MULTILINE)
    if not m:
        raise SystemExit("scripts/build-wheels has no MACOS_FRAMEWORKS=(...) line")
    return {entry.split(":")[0] for entry in m.group(1).split()}


def allowed_frameworks(libraries: Iterable[str]) -> set[str]:
    """The frameworks among check_wheel.py's allowed macOS libraries."""
    return {m.group(1) for lib in libraries if (m := re.fullmatch(r"/System/Library/Frameworks/(\w+)\.framework/Versions/A/\1", lib))}


def check_frameworks(graph: Graph, stubbed: set[str], allowed: set[str], prefixed: set[str]) -> tuple[list[str], str]:
    """The `frameworks` check: every framework the macOS graph links must be stubbed (`stubbed`),
    allowed by check_wheel.py (`allowed`) and have its symbol prefixes there (`prefixed`)."""
    needed: dict[str, set[str]] = {}
    for target in MACOS_TARGETS:
        for pid in graph.closure(graph.by_name(WHEEL_CRATE), target):
            for name in linked_frameworks(graph, pid, target):
                needed.setdefault(name, set()).add(graph.packages[pid]["name"])
    problems = []
    for name, crates in sorted(needed.items()):
        by = ", ".join(sorted(crates))
        if name not in stubbed:
            problems.append(
                f"the macOS link needs the {name} framework ({by}), which scripts/build-wheels does not "
                f"stub: add it to MACOS_FRAMEWORKS there, or drop what pulls it in"
            )
        if name not in allowed or name not in prefixed:
            problems.append(
                f"the {name} framework ({by}) is not in scripts/check_wheel.py's macOS "
                f"ALLOWED_LIBRARIES and FRAMEWORK_PREFIXES: the built wheel's check would fail"
            )
    shown = "; ".join(f"{n} ({', '.join(sorted(c))})" for n, c in sorted(needed.items()))
    return problems, f"macOS frameworks linked: {shown or 'none'}; stubbed: {', '.join(sorted(stubbed))}"


# --- main ------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Runs both checks; 0 when both pass, 1 with a FAIL line per problem."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--metadata", type=Path, help="`cargo metadata --format-version 1` output (default: run it)")
    args = parser.parse_args(argv)
    if args.metadata:
        meta = json.loads(args.metadata.read_text())
    else:
        out = subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--offline", "--locked"],
            cwd=ROOT, check=True, capture_output=True, text=True,
        ).stdout
        meta = json.loads(out)
    graph = Graph.load(meta)

    sys.path.insert(0, str(ROOT / "scripts"))
    import check_wheel

    macos = check_wheel.ALLOWED_LIBRARIES["macos"]
    results = [
        check_gates(graph),
        check_frameworks(
            graph,
            stubbed_frameworks((ROOT / "scripts" / "build-wheels").read_text()),
            allowed_frameworks(macos),
            allowed_frameworks(check_wheel.FRAMEWORK_PREFIXES),
        ),
    ]
    failed = False
    for problems, summary in results:
        for problem in problems:
            print(f"FAIL {problem}")
        failed |= bool(problems)
        if not problems:
            print(f"ok   {summary}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
