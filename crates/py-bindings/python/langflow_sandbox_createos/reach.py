"""Which Langflow paths reach the whole-flow executor, read from the installed lfx and Langflow.

``LANGFLOW_EXECUTOR_KIND=createos`` sandboxes only the runs lfx hands to its executor seam (the
``Coordinator`` behind ``lfx.execution``). Whether a path goes through that seam is decided here
from the installed code itself, not from a version table: the source of the function that drives
the path is parsed (never imported, never run) and searched for a use of the seam. When a path's
code cannot be found or read, its answer is ``None``: not known, and to be treated as not
sandboxed. ``doctor`` and the executor's first-run log line print these answers.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from dataclasses import dataclass

__all__ = ["Route", "routes"]

#: Names through which code hands a run to lfx's executor seam.
_SEAM_NAMES = frozenset(
    {"aget_default_coordinator", "get_default_coordinator", "Coordinator", "EXECUTOR_SERVICE", "_get_executor_service"}
)
#: Modules whose import means the same.
_SEAM_MODULES = ("lfx.execution", "lfx.services.executor")


@dataclass(frozen=True)
class Route:
    """One way Langflow or lfx runs a flow, and whether it reaches the executor."""

    #: What the operator calls it.
    name: str
    #: ``True``: through the executor seam; ``False``: built in the Langflow process; ``None``:
    #: its code could not be found or read (not known).
    reaches: bool | None
    #: Where that was read (``package/path.py:function``), or why it could not be.
    evidence: str


def _source(package: str, relative: str) -> tuple[str | None, str]:
    """The text of ``relative`` inside the installed ``package`` (located without importing it)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None, f"{package} is not installed"
    for root in spec.submodule_search_locations:
        path = os.path.join(root, relative)
        try:
            with open(path, encoding="utf-8") as f:
                return f.read(), path
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as exc:  # unreadable, or not UTF-8
            return None, f"{package}/{relative} could not be read ({type(exc).__name__})"
    return None, f"{package}/{relative} was not found"


def _function(tree: ast.AST, qualname: str) -> ast.AST | None:
    """The (async) function ``qualname`` (``Class.method`` or ``function``) in ``tree``."""
    node: ast.AST | None = tree
    for part in qualname.split("."):
        found = None
        for child in ast.iter_child_nodes(node) if node is not None else ():
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and child.name == part:
                found = child
                break
        node = found
    return node


def _uses_seam(node: ast.AST) -> bool:
    for child in ast.walk(node):
        if isinstance(child, ast.ImportFrom) and child.module is not None:
            if child.module.startswith(_SEAM_MODULES) or any(a.name in _SEAM_NAMES for a in child.names):
                return True
        elif isinstance(child, ast.Import):
            if any(a.name.startswith(_SEAM_MODULES) for a in child.names):
                return True
        elif (isinstance(child, ast.Name) and child.id in _SEAM_NAMES) or (
            isinstance(child, ast.Attribute) and child.attr in _SEAM_NAMES
        ):
            return True
    return False


def _route(name: str, package: str, relative: str, functions: tuple[str, ...]) -> Route:
    """Whether the first of ``functions`` found in ``package/relative`` uses the seam."""
    text, where = _source(package, relative)
    if text is None:
        return Route(name, None, where)
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError) as exc:
        return Route(name, None, f"{where} could not be parsed ({type(exc).__name__})")
    for qualname in functions:
        node = _function(tree, qualname)
        if node is not None:
            return Route(name, _uses_seam(node), f"{package}/{relative}:{qualname}")
    return Route(name, None, f"{package}/{relative} has no {' or '.join(functions)}")


#: The Playground's path, by name (what the slow suite checks against a real server).
PLAYGROUND = "the Playground's streaming build (/api/v1/build/{flow_id}/flow, generate_flow_events)"


def routes() -> list[Route]:
    """Every path this package knows, read from the installed lfx and Langflow."""
    return [
        _route(
            "Graph.arun (Langflow's /api/v1/run, the v2 workflow sync mode)",
            "lfx",
            "graph/graph/base.py",
            ("Graph.arun",),
        ),
        _route("lfx run and lfx serve", "lfx", "run/base.py", ("run_flow",)),
        _route("Loop subgraphs", "lfx", "base/flow_controls/loop_utils.py", ("execute_loop_body",)),
        _route(PLAYGROUND, "langflow", "api/build.py", ("_generate_flow_events", "generate_flow_events")),
    ]


#: lfx's selector of the executor, and this package's kinds (one per provider).
_ENV_KIND = "LANGFLOW_EXECUTOR_KIND"
_KIND = "createos"
_KINDS = ("createos", "opensandbox")


def _kind() -> str:
    """The executor kind lfx's selector names (``in-process`` when unset)."""
    return os.environ.get(_ENV_KIND, "").strip() or "in-process"


def _backend_switches(name: str) -> str:
    """The two lfx settings that select backend ``name``."""
    return f"LANGFLOW_SANDBOX_BACKEND_PLUGINS={name} and LANGFLOW_SANDBOX_BACKEND={name}"


def _backend_selected() -> bool:
    """Whether lfx trusts and selects one of this package's backends (either provider)."""
    selected = os.environ.get("LANGFLOW_SANDBOX_BACKEND", "").strip().lower()
    trusted = {n.strip().lower() for n in os.environ.get("LANGFLOW_SANDBOX_BACKEND_PLUGINS", "").split(",")}
    return selected in _KINDS and selected in trusted


def executor_selected() -> bool:
    """Whether lfx's selector names this package's executor (``createos`` or ``opensandbox``)."""
    return _kind() in _KINDS


def findings(found: list[Route] | None = None) -> list[tuple[str, str]]:
    """``doctor``'s lines (level, text) on what the executor sandboxes in this installation."""
    found = routes() if found is None else found
    out: list[tuple[str, str]] = []
    kind = _kind()
    if not executor_selected():
        out.append(("info", f"{_ENV_KIND} is {kind!r}: no flow run reaches this executor; set {_ENV_KIND}={_KIND}"))
        kind = _KIND
    for route in found:
        if route.reaches is True:
            out.append(("ok", f"{route.name}: reaches the executor, each run in a guest (read from {route.evidence})"))
        elif route.reaches is False:
            out.append(
                (
                    "warn",
                    f"{route.name}: does NOT reach the executor; it builds every vertex in the Langflow process, "
                    f"so {_ENV_KIND}={kind} does not sandbox it (read from {route.evidence})",
                )
            )
        else:
            out.append(
                ("info", f"{route.name}: cannot tell whether it reaches the executor ({route.evidence}); treat it as not sandboxed by it")
            )
    if any(route.reaches is not True for route in found):
        if _backend_selected():
            out.append(
                (
                    "ok",
                    "on the paths the executor does not cover, the Python Interpreter's code still runs in a guest "
                    "(the sandbox backend is selected); every other component there runs in the Langflow process",
                )
            )
        else:
            out.append(
                (
                    "warn",
                    "on the paths the executor does not cover, sandbox the Python Interpreter with the sandbox backend: "
                    f"set {_backend_switches(kind)} (every other component there runs in the Langflow process)",
                )
            )
    return out


def first_run_message(found: list[Route] | None = None) -> tuple[bool, str]:
    """The executor's first-run log line: (every known path covered, the text)."""
    found = routes() if found is None else found
    covered = [r.name for r in found if r.reaches is True]
    missed = [r.name for r in found if r.reaches is False]
    unknown = [r.name for r in found if r.reaches is None]
    kind = _kind() if executor_selected() else _KIND
    parts = [f"{kind} executor: runs of " + ("; ".join(covered) or "no known path") + " go to a guest"]
    if missed:
        parts.append(
            "NOT sandboxed by the executor (built in the Langflow process): "
            + "; ".join(missed)
            + f"; for the Python Interpreter there, set {_backend_switches(kind)}"
        )
    if unknown:
        parts.append("not known (treat as not sandboxed): " + "; ".join(unknown))
    return not missed, ". ".join(parts)
