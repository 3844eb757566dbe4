"""Which Langflow paths reach the whole-flow executor, read from the installed lfx and Langflow.

``LANGFLOW_EXECUTOR_KIND=createos`` sandboxes only the runs lfx hands to its executor seam (the
``Coordinator`` behind ``lfx.execution``). Whether a path goes through that seam is decided here
from the installed code itself, not from a version table: the source of the function that drives
the path is parsed (never imported, never run) and searched for a use of the seam. When a path's
code cannot be found or read, its answer is ``None``: not known, and to be treated as not
sandboxed. ``doctor`` and the executor's first-run log line print these answers.

Reaching the executor is half of it: before the hand-over, the path may build the graph's
components in the Langflow process (their source, class body and constructor). :func:`coverage`
says, per route an operator can call, whether it is *covered*: its run reaches the executor and
the host evaluates none of the flow's code (``CREATEOS_EXECUTOR_HOST_BUILDS=none`` with the
hook's fingerprint matched, :mod:`.hostbuild`), or not, and why.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass

from .sources import function as _function
from .sources import source as _source

__all__ = ["Route", "coverage", "routes"]

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


#: The routes that drive Langflow's streaming build (``_generate_flow_events``), by name.
STREAMING_ROUTES = (
    "v1 build (/api/v1/build/{flow_id}/flow)",
    "v1 public (/api/v1/build_public_tmp/{flow_id}/flow)",
    "v2 stream (/api/v2/workflows, stream mode)",
    "v2 public (public v2 workflow runs)",
    "v2 background (/api/v2/workflows, background mode)",
    "voice (the voice mode's builds)",
)


def coverage(
    found: list[Route] | None = None,
    hooks: dict[str, tuple[bool, str]] | None = None,
    driver_status: tuple[bool, str] | None = None,
) -> list[tuple[str, bool, str]]:
    """Per route an operator can call: (route, covered, why). Covered means every vertex builds
    in a guest and the Langflow process evaluates none of the flow's code (for the streaming
    routes: :mod:`.playground`'s driver, whose status ``driver_status`` stands in for)."""
    from . import hostbuild

    found = routes() if found is None else found
    hooks = hostbuild.status() if hooks is None else hooks
    by_name = {route.name: route for route in found}
    arun = by_name.get("Graph.arun (Langflow's /api/v1/run, the v2 workflow sync mode)")
    cli = by_name.get("lfx run and lfx serve")
    playground = by_name.get(PLAYGROUND)
    out: list[tuple[str, bool, str]] = []

    def hooked(route: str, reach_route: Route | None, hook: str) -> None:
        if reach_route is None or reach_route.reaches is not True:
            evidence = reach_route.evidence if reach_route is not None else "not read"
            out.append((route, False, f"cannot tell that it reaches the executor ({evidence})"))
            return
        covered, why = hooks.get(hook, (False, "the hook does not know this path"))
        if covered:
            out.append((route, True, f"every vertex builds in a guest; the host builds no component first ({why})"))
        else:
            out.append(
                (
                    route,
                    False,
                    "its vertices build in a guest, but the Langflow process evaluates each component's source, "
                    f"class body and constructor before the hand-over ({why})",
                )
            )

    hooked("v1 run (/api/v1/run)", arun, "v1 run (/api/v1/run)")
    hooked("v2 sync (/api/v2/workflows, sync mode)", arun, "v2 sync (/api/v2/workflows, sync mode)")
    hooked("lfx run and lfx serve", cli, "lfx run and lfx serve")
    from . import playground as driver

    replaced, replaced_why = driver.status() if driver_status is None else driver_status
    for route in STREAMING_ROUTES:
        if replaced:
            out.append(
                (
                    route,
                    True,
                    "every vertex builds in a guest: Langflow's streaming driver is replaced by this package's, "
                    f"and the host builds no component ({replaced_why})",
                )
            )
            continue
        if playground is None or playground.reaches is None:
            evidence = playground.evidence if playground is not None else "not read"
            why = f"cannot tell whether Langflow's streaming build reaches the executor ({evidence})"
        elif playground.reaches:
            why = f"Langflow's streaming build reaches the executor, but the hook does not cover it (read from {playground.evidence})"
        else:
            why = (
                "Langflow's streaming build never reaches the executor: it builds every vertex in the Langflow "
                f"process (read from {playground.evidence})"
            )
        out.append((route, False, f"{why}; {replaced_why}"))
    return out


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
    from . import playground as driver

    replaced, replaced_why = driver.status()
    for route in found:
        if route.name == PLAYGROUND and replaced:
            out.append(("ok", f"{route.name}: reaches the executor through this package's driver, each run in a guest ({replaced_why})"))
        elif route.reaches is True:
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
    selected = executor_selected()
    from . import hostbuild

    bad = hostbuild.setting()[1]
    if bad is not None:
        out.append(("refused", f"{bad}: the executor refuses every run until it is fixed"))
    bad = driver.setting()[1]
    if bad is not None:
        out.append(("refused", f"{bad}: the executor refuses every run, the Playground's included, until it is fixed"))
    for route, covered, why in coverage(found):
        level = "ok" if covered else ("warn" if selected else "info")
        out.append((level, f"{route}: {'covered' if covered else 'not covered'}: {why}"))
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


def _short(route: str) -> str:
    """A route's name without its parenthesis (``v1 run``)."""
    return route.split(" (", 1)[0]


def first_run_message(found: list[Route] | None = None) -> tuple[bool, str]:
    """The executor's first-run log line: (every known path covered, the text)."""
    from . import playground as driver

    found = routes() if found is None else found
    if driver.status()[0]:  # the streaming build goes to a guest through this package's driver
        found = [Route(r.name, True, r.evidence) if r.name == PLAYGROUND else r for r in found]
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
    per_route = coverage(found)
    covered_routes = [route for route, covered, _ in per_route if covered]
    parts.append(
        "covered (every vertex in a guest, no flow code evaluated in this process): "
        + ("; ".join(_short(route) for route in covered_routes) or "none")
        + "; not covered (doctor says why): "
        + "; ".join(_short(route) for route, covered, _ in per_route if not covered)
    )
    return not missed, ". ".join(parts)
