"""The host builds no flow code when the executor is on: an opt-in hook (issue 46).

lfx's loaders (``lfx run``, ``lfx serve``) and Langflow's ``/api/v1/run`` and v2 sync mode build
the graph with ``Graph.from_payload(...)``, whose default ``instantiate_components=True``
evaluates every component's source (imports, class body, module-level assignments) and runs its
constructor in the Langflow process before lfx hands the graph to the executor. A graph built
with ``instantiate_components=False`` carries the same code (its ``dump()`` is the same job for
the guest, which builds the graph itself), and lfx's in-process build instantiates a vertex's
component lazily when it builds it; neither lfx nor Langflow lets a plugin choose that default.

With ``CREATEOS_EXECUTOR_HOST_BUILDS=none`` and ``LANGFLOW_EXECUTOR_KIND`` naming this package's
executor, :func:`install` wraps ``Graph.from_payload`` so that a call made *by one of the known
callers* (:data:`PATHS`: the function that builds the graph on that path, matched by its code's
file and name) gets ``instantiate_components=False`` unless it passed the argument itself.
Every other caller (Langflow's Playground build, Run Flow, the guest's runner) is left as it is.

Fingerprinted, never half-installed: a path is covered only when the installed lfx (and, for
Langflow's paths, langflow-base) is a version this package was checked against, the patched
function's signature (``inspect.signature``) is the one expected, and every caller of the path is
found in the installed source with the expected parameters and a ``from_payload`` call that does
not choose ``instantiate_components`` itself. Anything else installs nothing for that path and
logs one WARNING naming why; ``doctor`` reads the same checks (:func:`status`) and says the path
is not covered.

Seams: a Langflow worker installs it from the ``langflow.plugins`` entry point
(:func:`register`, run by every worker at start-up); ``lfx run`` and ``lfx serve`` give a plugin
no seam before they build the graph (lfx builds its executor service, and so imports this
package, only after the graph exists), so the wheel's start-up file ``langflow_sandbox_createos_hostbuild.pth``
calls :func:`boot` when ``CREATEOS_EXECUTOR_HOST_BUILDS=none`` is set, which installs the lfx path
right after ``lfx.graph.graph.base`` is imported, before any graph can be built.
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import logging
import os
import sys
import threading
import types
from dataclasses import dataclass
from typing import Any, cast

__all__ = ["PATHS", "SETTING", "boot", "install", "register", "setting", "status"]

_logger = logging.getLogger("langflow_sandbox_createos")

#: The opt-in: ``none`` (the host builds no component of a flow it hands to the executor) or
#: ``components`` (the default: lfx's and Langflow's own behaviour).
SETTING = "CREATEOS_EXECUTOR_HOST_BUILDS"
_VALUES = ("components", "none")
#: The executor kinds of this package (lfx's selector ``LANGFLOW_EXECUTOR_KIND``).
_KINDS = ("createos", "opensandbox")

#: The lfx versions whose ``Graph.from_payload`` was read and tested.
LFX_VERSIONS = frozenset({"1.13.0"})
#: The langflow-base versions whose routes were read and tested.
BASE_VERSIONS = frozenset({"1.13.0"})
#: ``Graph.from_payload``'s parameters (name:kind, ``cls`` first), as in lfx 1.13.0.
FROM_PAYLOAD_PARAMS = (
    "cls:POSITIONAL_OR_KEYWORD, payload:POSITIONAL_OR_KEYWORD, flow_id:POSITIONAL_OR_KEYWORD, "
    "flow_name:POSITIONAL_OR_KEYWORD, user_id:POSITIONAL_OR_KEYWORD, context:POSITIONAL_OR_KEYWORD, "
    "instantiate_components:KEYWORD_ONLY, emit_extension_events:KEYWORD_ONLY"
)


@dataclass(frozen=True)
class Caller:
    """A function that builds a path's graph with ``Graph.from_payload``."""

    #: The installed package (``lfx`` or ``langflow``) and the file inside it.
    package: str
    relative: str
    #: The module-level function's name.
    function: str
    #: Its parameters, ``name:KIND`` joined by ``, ``.
    params: str


@dataclass(frozen=True)
class HookPath:
    """One path the hook covers: its routes, the distribution it lives in, and its callers."""

    #: What the operator calls it (``doctor`` prints it).
    name: str
    #: ``lfx`` (installed by :func:`boot`) or ``langflow`` (installed by :func:`register`).
    seam: str
    callers: tuple[Caller, ...]


PATHS: tuple[HookPath, ...] = (
    HookPath(
        "lfx run and lfx serve",
        "lfx",
        (
            Caller(
                "lfx",
                "load/load.py",
                "aload_flow_from_json",
                "flow:POSITIONAL_OR_KEYWORD, tweaks:KEYWORD_ONLY, log_level:KEYWORD_ONLY, log_file:KEYWORD_ONLY, "
                "log_rotation:KEYWORD_ONLY, env_file:KEYWORD_ONLY, cache:KEYWORD_ONLY, disable_logs:KEYWORD_ONLY",
            ),
        ),
    ),
    HookPath(
        "v1 run (/api/v1/run)",
        "langflow",
        (
            Caller(
                "langflow",
                "api/v1/endpoints.py",
                "simple_run_flow",
                "flow:POSITIONAL_OR_KEYWORD, input_request:POSITIONAL_OR_KEYWORD, stream:KEYWORD_ONLY, "
                "api_key_user:KEYWORD_ONLY, event_manager:KEYWORD_ONLY, context:KEYWORD_ONLY, run_id:KEYWORD_ONLY, "
                "expose_error_details:KEYWORD_ONLY, http_request:KEYWORD_ONLY, execution_family:KEYWORD_ONLY, "
                "interactive:KEYWORD_ONLY",
            ),
        ),
    ),
    HookPath(
        "v2 sync (/api/v2/workflows, sync mode)",
        "langflow",
        (
            Caller(
                "langflow",
                "api/v2/workflow_execution.py",
                "execute_sync_workflow",
                "parsed:POSITIONAL_OR_KEYWORD, flow:POSITIONAL_OR_KEYWORD, job_id:POSITIONAL_OR_KEYWORD, "
                "current_user:POSITIONAL_OR_KEYWORD, background_tasks:POSITIONAL_OR_KEYWORD, "
                "http_request:POSITIONAL_OR_KEYWORD, checkpoint_store:POSITIONAL_OR_KEYWORD, "
                "expose_error_details:KEYWORD_ONLY, execution_family:KEYWORD_ONLY",
            ),
        ),
    ),
)

_lock = threading.RLock()
#: ``(file, function name)`` of every caller whose ``from_payload`` call is deferred.
_deferred: set[tuple[str, str]] = set()
#: What this process installed (path name -> where it was read) and refused (name -> why).
_installed: dict[str, str] = {}
_refused: dict[str, str] = {}
_original: Any = None


def setting() -> tuple[str, str | None]:
    """``CREATEOS_EXECUTOR_HOST_BUILDS``'s value (``components`` when unset), and what is wrong
    with it (``None`` when it is one of the accepted values)."""
    raw = os.environ.get(SETTING, "")
    value = raw.strip().lower() or "components"
    if value not in _VALUES:
        return value, f"{SETTING}={raw.strip()[:40]!r} is not one of {', '.join(_VALUES)}"
    return value, None


def _kind() -> str:
    return os.environ.get("LANGFLOW_EXECUTOR_KIND", "").strip().lower()


def enabled() -> bool:
    """Whether the hook is asked for: the setting is ``none`` and lfx's selector names this
    package's executor."""
    return setting()[0] == "none" and _kind() in _KINDS


def _version(distribution: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def _versions_problem(seam: str) -> str | None:
    """Why the installed versions are not ones this hook knows (``None`` when they are)."""
    checks = [("lfx", LFX_VERSIONS)] + ([("langflow-base", BASE_VERSIONS)] if seam == "langflow" else [])
    for distribution, known in checks:
        found = _version(distribution)
        if found is None:
            return f"{distribution} is not installed here"
        if found not in known:
            return f"{distribution} {found} is not a version this hook was checked against ({', '.join(sorted(known))})"
    return None


def _params_of_ast(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    a = node.args
    parts = [f"{p.arg}:POSITIONAL_ONLY" for p in a.posonlyargs]
    parts += [f"{p.arg}:POSITIONAL_OR_KEYWORD" for p in a.args]
    if a.vararg is not None:
        parts.append(f"{a.vararg.arg}:VAR_POSITIONAL")
    parts += [f"{p.arg}:KEYWORD_ONLY" for p in a.kwonlyargs]
    if a.kwarg is not None:
        parts.append(f"{a.kwarg.arg}:VAR_KEYWORD")
    return ", ".join(parts)


def _params_of(function: Any) -> str:
    return ", ".join(f"{p.name}:{p.kind.name}" for p in inspect.signature(function).parameters.values())


def _calls_from_payload(node: ast.AST) -> tuple[int, int]:
    """How many ``*.from_payload(...)`` calls ``node`` makes, and how many of them choose
    ``instantiate_components`` themselves."""
    calls = chosen = 0
    for child in ast.walk(node):
        if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr == "from_payload":
            calls += 1
            if any(k.arg == "instantiate_components" or k.arg is None for k in child.keywords):
                chosen += 1
    return calls, chosen


def _caller_problem(caller: Caller) -> tuple[str | None, str | None]:
    """``(file, None)`` when ``caller`` is found as expected in the installed source (read, not
    imported), else ``(None, why)``."""
    from .sources import source

    text, where = source(caller.package, caller.relative)
    shown = f"{caller.package}/{caller.relative}:{caller.function}"
    if text is None:
        return None, where
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError) as exc:
        return None, f"{where} could not be parsed ({type(exc).__name__})"
    found = [
        n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == caller.function
    ]
    if len(found) != 1:
        return None, f"{shown} was not found"
    params = _params_of_ast(found[0])
    if params != caller.params:
        return None, f"{shown} has the parameters ({params}), not the expected ({caller.params})"
    calls, chosen = _calls_from_payload(found[0])
    if calls != 1 or chosen:
        return None, f"{shown} does not make exactly one Graph.from_payload call that leaves instantiate_components to its default"
    return os.path.realpath(where), None


def _patched_problem(graph_class: Any) -> str | None:
    """Why ``Graph.from_payload`` is not the function this hook wraps (``None`` when it is)."""
    raw = graph_class.__dict__.get("from_payload")
    if not isinstance(raw, classmethod):
        return "lfx's Graph.from_payload is not a classmethod"
    function: Any = cast("Any", raw).__func__
    if getattr(function, "__lfsc_hostbuild__", False):
        return None
    params = _params_of(function)
    if params != FROM_PAYLOAD_PARAMS:
        return f"lfx's Graph.from_payload has the parameters ({params}), not the expected ({FROM_PAYLOAD_PARAMS})"
    return None


def plan(seam: str, graph_class: Any = None) -> dict[str, tuple[list[str] | None, str | None]]:
    """For each path of ``seam``: the caller files the hook would defer, or why it cannot. With
    ``graph_class`` (the loaded ``Graph``), its ``from_payload`` signature is checked too;
    without it (``doctor``), the installed source is read instead."""
    common = _versions_problem(seam)
    if common is None and graph_class is not None:
        common = _patched_problem(graph_class)
    if common is None and graph_class is None:
        common = _patched_source_problem()
    out: dict[str, tuple[list[str] | None, str | None]] = {}
    for path in (p for p in PATHS if p.seam == seam):
        if common is not None:
            out[path.name] = (None, common)
            continue
        files: list[str] = []
        why: str | None = None
        for caller in path.callers:
            found, why = _caller_problem(caller)
            if found is None:
                break
            files.append(found)
        out[path.name] = (None, why) if why is not None else (files, None)
    return out


def _patched_source_problem() -> str | None:
    """``_patched_problem`` read from the installed source (for ``doctor``, which does not build
    lfx's graph machinery)."""
    from .sources import function, source

    text, where = source("lfx", "graph/graph/base.py")
    if text is None:
        return where
    try:
        node = function(ast.parse(text), "Graph.from_payload")
    except (SyntaxError, ValueError) as exc:
        return f"{where} could not be parsed ({type(exc).__name__})"
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return "lfx's Graph.from_payload was not found"
    params = _params_of_ast(node)
    if params != FROM_PAYLOAD_PARAMS:
        return f"lfx's Graph.from_payload has the parameters ({params}), not the expected ({FROM_PAYLOAD_PARAMS})"
    return None


def _wrap(original: Any) -> Any:
    def from_payload(cls: Any, payload: Any, *args: Any, **kwargs: Any) -> Any:
        caller = sys._getframe(1).f_code  # noqa: SLF001  # pyright: ignore[reportPrivateUsage] - which function builds this graph
        if (
            "instantiate_components" not in kwargs
            and (os.path.realpath(caller.co_filename), caller.co_name) in _deferred
            and enabled()
        ):
            kwargs["instantiate_components"] = False
        return original(cls, payload, *args, **kwargs)

    from_payload.__lfsc_hostbuild__ = True  # type: ignore[attr-defined]
    from_payload.__wrapped__ = original  # type: ignore[attr-defined]
    from_payload.__doc__ = original.__doc__
    return from_payload


def install(seam: str, graph_class: Any = None) -> dict[str, str | None]:
    """Install the hook for every path of ``seam`` (``lfx`` or ``langflow``) that passes its
    fingerprint; one WARNING names the paths that do not. Does nothing unless :func:`enabled`.
    Returns, per path, ``None`` (covered) or why not. Idempotent and thread-safe."""
    global _original
    if not enabled():
        return {}
    with _lock:
        if graph_class is None:
            from lfx.graph.graph.base import Graph

            graph_class = Graph
        planned = plan(seam, graph_class)
        ready = {name: files for name, (files, _) in planned.items() if files is not None}
        refused = {name: why for name, (_, why) in planned.items() if why is not None}
        if ready and _original is None and _patched_problem(graph_class) is None:
            raw: Any = graph_class.__dict__["from_payload"]
            if not getattr(raw.__func__, "__lfsc_hostbuild__", False):
                _original = raw.__func__
                graph_class.from_payload = classmethod(_wrap(_original))
        for name, files in ready.items():
            for caller, found in zip(next(p for p in PATHS if p.name == name).callers, files, strict=True):
                _deferred.add((found, caller.function))
            _installed[name] = ", ".join(f"{c.package}/{c.relative}:{c.function}" for p in PATHS if p.name == name for c in p.callers)
        new = {name: why for name, why in refused.items() if name not in _refused}
        _refused.update(refused)
        if new:
            _logger.warning(
                "%s=none: the host still builds the flow's components (module-level code, class body, "
                "__init__) before the hand-over on %s; nothing was changed on those paths (doctor says the same)",
                SETTING,
                "; ".join(f"{name} ({why})" for name, why in new.items()),
            )
        return {**dict.fromkeys(ready), **refused}


def register(app: Any) -> None:
    """The ``langflow.plugins`` entry point: run by every Langflow worker at start-up. Installs
    the hook for Langflow's paths, and the Playground's driver (``playground.install``), when
    they are asked for; registers no route."""
    del app  # no route: only the start-up seam is used
    install("langflow")
    from . import playground

    playground.install()


class _AfterGraphImport(importlib.abc.MetaPathFinder):
    """Installs the lfx path right after ``lfx.graph.graph.base`` is imported (once)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        del path, target
        if fullname != "lfx.graph.graph.base":
            return None
        with _lock:
            if self in sys.meta_path:
                sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        loader: Any = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_then_install(module: types.ModuleType) -> None:
            exec_module(module)
            try:
                install("lfx", getattr(module, "Graph", None))
            except Exception as exc:  # noqa: BLE001 - never a reason for lfx's import to fail
                _logger.warning("%s=none: the hook could not be installed (%s); nothing was changed", SETTING, type(exc).__name__)

        loader.exec_module = exec_then_install
        return spec


def boot() -> None:
    """Called by the wheel's start-up file when ``CREATEOS_EXECUTOR_HOST_BUILDS=none`` is set:
    when the executor is selected too, installs the lfx path as soon as lfx's graph module is
    imported (at once when it already is)."""
    if not enabled():
        return
    module = sys.modules.get("lfx.graph.graph.base")
    if module is not None:
        install("lfx", getattr(module, "Graph", None))
        return
    sys.meta_path.insert(0, _AfterGraphImport())


#: The wheel's start-up file, in site-packages (installs the lfx path: :func:`boot`).
START_UP_FILE = "langflow_sandbox_createos_hostbuild.pth"


def _start_up_file_installed() -> bool:
    """Whether Python reads the start-up file when this environment starts."""
    import site

    folders = [*site.getsitepackages(), site.getusersitepackages()]
    return any(os.path.exists(os.path.join(folder, START_UP_FILE)) for folder in folders)


def _warm_registry() -> bool:
    """Whether Langflow's opt-in warm graph registry is on (``LANGFLOW_WARM_REGISTRY_ENABLED``)."""
    return os.environ.get("LANGFLOW_WARM_REGISTRY_ENABLED", "").strip().lower() in ("1", "true", "yes", "on", "t", "y")


def status() -> dict[str, tuple[bool, str]]:
    """For ``doctor``, per path: (covered, why). Read from the installed sources, as the hook's
    own fingerprint reads them; ``covered`` needs the setting too."""
    value, problem = setting()
    out: dict[str, tuple[bool, str]] = {}
    for seam in ("lfx", "langflow"):
        for name, (files, why) in plan(seam).items():
            if why is not None:
                out[name] = (False, f"the hook does not install here: {why}")
            elif seam == "lfx" and not _start_up_file_installed():
                out[name] = (False, f"the hook's start-up file {START_UP_FILE} is not in this environment's site-packages")
            elif problem is not None:
                out[name] = (False, problem)
            elif seam == "langflow" and _warm_registry():
                out[name] = (
                    False,
                    "LANGFLOW_WARM_REGISTRY_ENABLED is on: a warm hit copies a prepared graph and builds its "
                    "components (Graph.copy_for_run), which the hook does not change; turn the warm registry off",
                )
            elif value != "none":
                out[name] = (False, f"{SETTING} is {value!r}: set {SETTING}=none to build the graph without them")
            else:
                del files
                out[name] = (True, f"{SETTING}=none, fingerprint matched")
    return out
