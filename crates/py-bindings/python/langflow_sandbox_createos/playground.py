"""The Playground's build runs in the guest: an opt-in driver for Langflow's streaming routes (issue 46).

Every streaming route of Langflow 1.13 (v1 build, v1 public, v2 stream, which the 1.13 UI's
Playground sends, v2 public, v2 background, voice) ends in one driver, ``langflow/api/build.py``'s
``_generate_flow_events``, reached through the module attribute ``generate_flow_events``, whose
body looks ``_generate_flow_events`` up in the module's globals at call time. That driver builds
the graph with every component instantiated (the flow's module-level code, class bodies and
constructors run in the Langflow process) and builds each vertex in process; it never reaches
an executor.

With ``CREATEOS_EXECUTOR_PLAYGROUND=on`` and ``LANGFLOW_EXECUTOR_KIND`` naming this package's
executor, :func:`install` (called by the ``langflow.plugins`` entry point, in every Langflow
worker at start-up) replaces ``langflow.api.build._generate_flow_events`` with :func:`drive`, so
Langflow's own ``generate_flow_events`` keeps its provider-policy scope and calls ours:

- the host builds its graph with ``instantiate_components=False`` (no flow code is evaluated in
  the Langflow process) and refuses, with an error event naming the component, what cannot be
  carried to a guest (Human Input, Run Flow, Sub Flow, a frozen vertex, chat attachments, a
  resumed run);
- the flow goes to a guest through the executor's own machinery (warm pool, the host's
  variables, history and uploaded files, the message store), where the runner walks the graph as
  Langflow's driver does (sorted layers, ``build_vertex``, the next runnable vertices,
  inactivated and excluded branches, start and stop component) and sends one frame per built
  vertex and one per event a component sends (tokens as an LLM produces them, messages, logs);
- the host re-emits what Langflow's driver emits through the request's event manager
  (``vertices_sorted``, ``build_start``, the components' own events, ``end_vertex`` with
  Langflow's own serialization, ``end``/``error``), stores the vertex builds as the driver does,
  and the chat messages are stored by the executor's message sink.

Fingerprinted, never half-installed: only when langflow-base is a version this was checked
against (:data:`BASE_VERSIONS`), ``_generate_flow_events`` has the expected parameters, and
``generate_flow_events`` and the helpers used here are found as expected. Anything else installs
nothing, logs one WARNING naming why, and ``doctor`` says the streaming routes are not covered.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import logging
import os
import threading
import time
import uuid
from typing import Any, cast

__all__ = ["SETTING", "drive", "install", "setting", "status"]

_logger = logging.getLogger("langflow_sandbox_createos")

#: The opt-in: ``on`` (the streaming routes build in a guest) or ``off`` (the default).
SETTING = "CREATEOS_EXECUTOR_PLAYGROUND"
_VALUES = ("off", "on")
_KINDS = ("createos", "opensandbox")
#: The langflow-base versions whose driver was read and tested.
BASE_VERSIONS = frozenset({"1.13.0"})
#: ``_generate_flow_events``'s parameters (name:kind), as in langflow-base 1.13.0.
DRIVER_PARAMS = (
    "flow_id:KEYWORD_ONLY, background_tasks:KEYWORD_ONLY, event_manager:KEYWORD_ONLY, inputs:KEYWORD_ONLY, "
    "data:KEYWORD_ONLY, files:KEYWORD_ONLY, stop_component_id:KEYWORD_ONLY, start_component_id:KEYWORD_ONLY, "
    "log_builds:KEYWORD_ONLY, current_user:KEYWORD_ONLY, flow_name:KEYWORD_ONLY, source_flow_id:KEYWORD_ONLY, "
    "source_flow_owner_id:KEYWORD_ONLY, job_id:KEYWORD_ONLY, resume:KEYWORD_ONLY, run_id:KEYWORD_ONLY, "
    "track_job_status:KEYWORD_ONLY, tweaks:KEYWORD_ONLY, expose_error_details:KEYWORD_ONLY, "
    "redact_build_params:KEYWORD_ONLY, persist_messages:KEYWORD_ONLY, end_user_id:KEYWORD_ONLY, "
    "execution_family:KEYWORD_ONLY"
)
#: The helpers of ``langflow/api/build.py`` the driver uses (Langflow's own serialization).
_HELPERS = ("_vertex_build_data_for_event", "_output_meta_for_vertex")
#: Components whose build needs the Langflow process (its database of flows, a paused run's
#: checkpoint and a human's answer): refused, never built in process.
_UNCARRIED = {
    "HumanInput": "Human Input pauses the run for a person's answer, which a guest run cannot resume",
    "RunFlow": "Run Flow runs another flow from Langflow's database, which the guest cannot reach",
    "SubFlow": "Sub Flow runs another flow from Langflow's database, which the guest cannot reach",
}

_lock = threading.Lock()
_installed: str | None = None
_refused: str | None = None
_original: Any = None


def setting() -> tuple[str, str | None]:
    """``CREATEOS_EXECUTOR_PLAYGROUND``'s value (``off`` when unset), and what is wrong with it
    (``None`` when it is one of the accepted values)."""
    raw = os.environ.get(SETTING, "")
    value = raw.strip().lower() or "off"
    if value not in _VALUES:
        return value, f"{SETTING}={raw.strip()[:40]!r} is not one of {', '.join(_VALUES)}"
    return value, None


def _module(name: str) -> Any:
    """A Langflow module, untyped (this package does not depend on Langflow; the driver is
    installed only inside a Langflow server)."""
    import importlib

    return importlib.import_module(name)


def _kind() -> str:
    return os.environ.get("LANGFLOW_EXECUTOR_KIND", "").strip().lower()


def enabled() -> bool:
    """Whether the driver is asked for: the executor is this package's, and the setting is
    ``on`` (or not one of the accepted values: then every Playground build is refused)."""
    value, problem = setting()
    return _kind() in _KINDS and (value == "on" or problem is not None)


def _params_of_ast(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    from .hostbuild import _params_of_ast as params  # pyright: ignore[reportPrivateUsage]

    return params(node)


def _source_problem() -> str | None:
    """Why the installed ``langflow/api/build.py`` is not the one this driver replaces (read,
    not imported: ``doctor`` and the start-up check share it); ``None`` when it is."""
    from .hostbuild import _version  # pyright: ignore[reportPrivateUsage]
    from .sources import source

    found = _version("langflow-base")
    if found is None:
        return "langflow-base is not installed here"
    if found not in BASE_VERSIONS:
        return f"langflow-base {found} is not a version this driver was checked against ({', '.join(sorted(BASE_VERSIONS))})"
    text, where = source("langflow", "api/build.py")
    if text is None:
        return where
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError) as exc:
        return f"{where} could not be parsed ({type(exc).__name__})"
    functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    driver = functions.get("_generate_flow_events")
    if driver is None:
        return "langflow/api/build.py:_generate_flow_events was not found"
    params = _params_of_ast(driver)
    if params != DRIVER_PARAMS:
        return f"langflow/api/build.py:_generate_flow_events has the parameters ({params}), not the expected ({DRIVER_PARAMS})"
    public = functions.get("generate_flow_events")
    nodes: list[ast.AST] = list(ast.walk(public)) if public is not None else []
    calls = [
        c
        for c in nodes
        if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == "_generate_flow_events"
    ]
    if len(calls) != 1:
        return "langflow/api/build.py:generate_flow_events does not call _generate_flow_events by its module name"
    missing = [name for name in _HELPERS if name not in functions]
    if missing:
        return f"langflow/api/build.py has no {', '.join(missing)}"
    return None


def _module_problem(module: Any) -> str | None:
    """Why the loaded ``langflow.api.build`` is not the one this driver replaces."""
    driver = getattr(module, "_generate_flow_events", None)
    if getattr(driver, "__lfsc_playground__", False):
        return None
    if not inspect.iscoroutinefunction(driver):
        return "langflow.api.build._generate_flow_events is not a coroutine function"
    from .hostbuild import _params_of  # pyright: ignore[reportPrivateUsage]

    params = _params_of(driver)
    if params != DRIVER_PARAMS:
        return f"langflow.api.build._generate_flow_events has the parameters ({params}), not the expected ({DRIVER_PARAMS})"
    if any(not callable(getattr(module, name, None)) for name in _HELPERS):
        return f"langflow.api.build has no {' or '.join(_HELPERS)}"
    return None


def install() -> str | None:
    """Install the driver when :func:`enabled` and the fingerprint matches; one WARNING names
    why not otherwise. Returns ``None`` (installed, or not asked for) or why not. Idempotent."""
    global _installed, _refused, _original
    if not enabled():
        return None
    with _lock:
        if _installed is not None:
            return None
        problem = _source_problem()
        module: Any = None
        if problem is None:
            try:
                module = _module("langflow.api.build")
            except Exception as exc:  # noqa: BLE001 - never a reason for Langflow's start-up to fail
                problem = f"langflow.api.build could not be imported ({type(exc).__name__})"
        if problem is None:
            problem = _module_problem(module)
        if problem is not None:
            if _refused is None:
                _refused = problem
                _logger.warning(
                    "%s=on: the Playground's streaming routes still build the flow in the Langflow process "
                    "(%s); nothing was changed (doctor says the same)",
                    SETTING,
                    problem,
                )
            return problem
        _original = module._generate_flow_events  # noqa: SLF001
        module._generate_flow_events = drive  # noqa: SLF001
        _installed = "langflow/api/build.py:_generate_flow_events"
        return None


def status() -> tuple[bool, str]:
    """For ``doctor``, of every streaming route (they share the driver): (covered, why)."""
    value, problem = setting()
    kind = _kind()
    if kind not in _KINDS:
        why: tuple[bool, str] = (False, "the executor is off (LANGFLOW_EXECUTOR_KIND), so the Playground builds in process")
    elif problem is not None:
        why = (False, f"{problem}: every Playground build is refused")
    elif value != "on":
        why = (
            False,
            "Langflow's streaming driver (langflow/api/build.py) builds every vertex in process and never "
            f"reaches the executor; set {SETTING}=on to build it in a guest",
        )
    else:
        source = _source_problem()
        why = (False, f"the driver does not install here: {source}") if source else (True, f"{SETTING}=on, fingerprint matched")
    return why


# --- The driver -------------------------------------------------------------------------------


class _Refused(Exception):  # noqa: N818 - shown to the client as the run's error
    """What cannot be carried to a guest; never built in process."""


class GuestBuildError(Exception):
    """A vertex that raised in the guest, as Langflow's driver reports it."""


def _refusal(graph: Any, files: Any, resume: Any) -> str | None:
    """Why this run cannot be carried to a guest (``None`` when it can)."""
    if resume is not None:
        return "a resumed (Human Input) run cannot be carried to a guest; run this flow in process"
    if files:
        return "files attached to the chat cannot be carried to a guest yet; run this flow in process"
    for vertex in list(getattr(graph, "vertices", None) or []):
        name = str(getattr(vertex, "display_name", None) or vertex.id)
        why = _UNCARRIED.get(str(getattr(vertex, "vertex_type", "")))
        if why is not None:
            return f"{name}: {why}; run this flow in process ({SETTING}=off)"
        loop = getattr(vertex, "is_loop", False) or getattr(vertex, "display_name", None) == "Loop"
        if getattr(vertex, "frozen", False) and not loop:
            return (
                f"{name}: a frozen component reuses the result cached in the Langflow process, which a guest "
                f"cannot read; unfreeze it or run this flow in process ({SETTING}=off)"
            )
    return None


def _executor() -> Any:
    from .executor import CreateOSExecutor, OpenSandboxExecutor

    return OpenSandboxExecutor() if _kind() == "opensandbox" else CreateOSExecutor()


def _mapped(data: Any, ids: dict[str, str]) -> Any:
    """An event's data with the guest's message ids replaced by the host's."""
    if isinstance(data, dict):
        out: dict[str, Any] = dict(data)  # pyright: ignore[reportUnknownArgumentType]
        for key in ("id", "message_id"):
            value = out.get(key)
            if isinstance(value, str) and value in ids:
                out[key] = ids[value]
        inner = out.get("data")
        if isinstance(inner, dict) and isinstance(inner.get("id"), str) and inner["id"] in ids:  # pyright: ignore[reportUnknownMemberType]
            out["data"] = {**inner, "id": ids[inner["id"]]}  # pyright: ignore[reportUnknownMemberType]
        return out
    return data


async def _graph_for(
    *,
    flow_id: Any,
    data: Any,
    flow_name: str | None,
    current_user: Any,
    source_flow_id: Any,
    session_id: str,
    run_id: str,
    tweaks: Any,
    principal: Any,
) -> Any:
    """The run's graph, built as Langflow's driver builds it but with no component instantiated:
    the flow from the request or the database, the request's tweaks (lfx's ``process_tweaks``,
    the sync mode's enforcement), the execution principal, the session and the run id."""
    graph_class = _module("lfx.graph.graph.base").Graph
    process_tweaks = _module("lfx.processing.process").process_tweaks
    stamp_execution_principal = _module("langflow.api.utils.execution_principal").stamp_execution_principal
    flow_model = _module("langflow.services.database.models.flow.model").Flow
    session_scope = _module("langflow.services.deps").session_scope
    select = _module("sqlmodel").select

    user_id = str(current_user.id)
    async with session_scope() as db:
        if not data:
            flow = await db.get(flow_model, source_flow_id if source_flow_id is not None else flow_id)
            if not flow or not flow.data:
                msg = "Invalid flow ID"
                raise ValueError(msg)
            payload, flow_name = flow.data, flow.name
        else:
            payload = data.model_dump()
            if not flow_name:
                lookup = source_flow_id if source_flow_id is not None else flow_id
                flow_name = (await db.exec(select(flow_model.name).where(flow_model.id == lookup))).first()
    if tweaks:
        payload = process_tweaks(payload, tweaks)
    build_id = str(source_flow_id) if (source_flow_id is not None and data) else str(flow_id)
    graph: Any = graph_class.from_payload(payload, build_id, flow_name, user_id, instantiate_components=False)
    stamp_execution_principal(graph, principal)
    graph.session_id = session_id
    graph.set_run_id(run_id)
    if source_flow_id is not None:
        graph.source_flow_id = str(source_flow_id)
        graph.flow_id = str(flow_id)
    return graph


async def drive(  # noqa: C901, PLR0915 - one driver, as Langflow's
    *,
    flow_id: Any,
    background_tasks: Any,
    event_manager: Any,
    inputs: Any,
    data: Any,
    files: Any,
    stop_component_id: str | None,
    start_component_id: str | None,
    log_builds: bool,
    current_user: Any,
    flow_name: str | None = None,
    source_flow_id: Any = None,
    source_flow_owner_id: Any = None,
    job_id: Any = None,
    resume: dict[str, Any] | None = None,
    run_id: str | None = None,
    track_job_status: bool = True,
    tweaks: dict[str, Any] | None = None,
    expose_error_details: bool = False,
    redact_build_params: bool = False,
    persist_messages: bool = True,
    end_user_id: str | None = None,
    execution_family: str = "interactive_chat",
) -> None:
    """Langflow's streaming driver, with the vertex walk in a guest (see the module's text)."""
    del track_job_status  # the job row and memory-base hook of the in-process driver: not kept
    from lfx.execution.types import Unit

    log_vertex_build = _module("lfx.graph.utils").log_vertex_build
    ErrorMessage = _module("lfx.schema.message").ErrorMessage  # noqa: N806
    InputValueRequest = _module("lfx.schema.schema").InputValueRequest  # noqa: N806

    from .executor import _decode, _result_data  # pyright: ignore[reportPrivateUsage]

    build = _module("langflow.api.build")
    errors = _module("langflow.api.utils.execution_errors")
    error_details_for_client, error_for_client = errors.error_details_for_client, errors.error_for_client
    execution_principal_for = _module("langflow.api.utils.execution_principal").execution_principal_for
    schemas = _module("langflow.api.v1.schemas")
    ResultDataResponse, VertexBuildResponse = schemas.ResultDataResponse, schemas.VertexBuildResponse  # noqa: N806
    OutputValue = _module("langflow.schema.schema").OutputValue  # noqa: N806

    if not inputs:
        inputs = InputValueRequest(session=str(flow_id))
    session_id = inputs.session if getattr(inputs, "session", None) is not None else str(flow_id)

    def fail(exc: BaseException, session: Any) -> BaseException:
        """The error event Langflow's driver sends, and the exception it raises after it."""
        # A refusal names the component and the setting, never a secret: shown as it is.
        client_error = exc if isinstance(exc, _Refused) else error_for_client(exc, expose_details=expose_error_details)  # pyright: ignore[reportArgumentType]
        message = ErrorMessage(
            flow_id=flow_id, exception=client_error, session_id=session, include_traceback=expose_error_details
        )
        event_manager.on_error(data=message.data)
        return exc if expose_error_details or isinstance(exc, _Refused) else client_error

    problem = setting()[1]
    if problem is not None:
        raise fail(_Refused(f"{problem}; nothing was built"), session_id)
    try:
        principal = execution_principal_for(
            execution_family,
            user=current_user,
            flow_owner_id=source_flow_owner_id,
            job_owner_id=getattr(current_user, "id", None),
            end_user_id=end_user_id,
        )
        build_run_id = str(job_id) if job_id is not None else (run_id or str(uuid.uuid4()))
        graph = await _graph_for(
            flow_id=flow_id,
            data=data,
            flow_name=flow_name,
            current_user=current_user,
            source_flow_id=source_flow_id,
            session_id=session_id,
            run_id=build_run_id,
            tweaks=tweaks,
            principal=principal,
        )
        graph.expose_error_details = expose_error_details
        graph.persist_messages = persist_messages
        graph.end_user_id = end_user_id
        refused = _refusal(graph, files, resume)
        if refused is not None:
            raise _Refused(refused)
    except Exception as exc:
        raise fail(exc, session_id) from exc

    flow_id_str = str(flow_id)
    unit = Unit(
        graph=graph,
        inputs=[],
        runtime_options={
            "session_id": session_id,
            "playground": {
                "inputs": inputs.model_dump(mode="json"),
                "user_id": str(current_user.id),
                "stop_component_id": stop_component_id,
                "start_component_id": start_component_id,
            },
        },
    )
    timedeltas: list[float] = []
    try:
        async with contextlib.aclosing(_executor().frames(unit)) as frames:
            async for kind, frame, ids, _mode in frames:
                if kind != "vertex":
                    break
                pg = frame.get("pg")
                if pg == "sorted":
                    event_manager.on_vertices_sorted(data={"ids": frame.get("ids") or [], "to_run": frame.get("to_run") or []})
                    event_manager.on_build_start(data={})
                elif pg == "event":
                    name, body = str(frame.get("name") or ""), _mapped(_decode(frame.get("data"), ids), ids)
                    if name.startswith("send_event:"):
                        event_manager.send_event(event_type=name.removeprefix("send_event:"), data=body)
                    elif name.startswith("on_"):
                        getattr(event_manager, name)(data=body)
                elif pg == "built":
                    vertex_id = str(frame["id"])
                    vertex = graph.get_vertex(vertex_id)
                    valid = bool(frame.get("valid"))
                    raw_error = frame.get("error")
                    if isinstance(raw_error, dict):
                        error = cast("dict[str, Any]", raw_error)
                        params = str(error.get("message") or "")
                        details = error_details_for_client(
                            GuestBuildError(params),
                            expose_details=expose_error_details,
                            message=params,
                            stack_trace=str(error.get("traceback") or ""),
                        )
                        params = details.message
                        label = vertex.outputs[0]["name"] if vertex.outputs else "output"
                        message = {"errorMessage": params, "stackTrace": details.stack_trace}
                        response_data = ResultDataResponse(
                            results={}, outputs={label: OutputValue(message=message, type="error")}
                        )
                        artifacts: Any = {}
                    else:
                        params = frame.get("params") or ""
                        result = _result_data(frame.get("result"), ids)
                        response_data = ResultDataResponse.model_validate(result, from_attributes=True)
                        artifacts = _decode(frame.get("artifacts"), ids) or {}
                    response_data.message = artifacts
                    if log_builds and graph.persist_messages and (run_id is not None or not frame.get("will_stream")):
                        background_tasks.add_task(
                            log_vertex_build,
                            flow_id=flow_id_str,
                            vertex_id=vertex_id,
                            valid=valid,
                            params=None if redact_build_params else params,
                            data=response_data,
                            artifacts=artifacts,
                            job_id=graph.run_id,
                        )
                    elapsed = float(frame.get("timedelta") or 0.0)
                    timedeltas.append(elapsed)
                    response_data.duration = build.format_elapsed_time(elapsed)
                    response_data.timedelta = elapsed
                    response = VertexBuildResponse(
                        inactivated_vertices=list(frame.get("inactivated_vertices") or []),
                        next_vertices_ids=list(frame.get("next_vertices_ids") or []),
                        top_level_vertices=list(frame.get("top_level_vertices") or []),
                        valid=valid,
                        params=params,
                        id=vertex_id,
                        data=response_data,
                    )
                    build_data = build._vertex_build_data_for_event(response, redact_build_params=redact_build_params)  # noqa: SLF001
                    event_manager.on_end_vertex(
                        data={"build_data": build_data, "output_meta": build._output_meta_for_vertex(graph, vertex_id)}  # noqa: SLF001
                    )
    except Exception as exc:
        _logger.warning("playground build in a guest failed: %s", type(exc).__name__)
        raise fail(exc, graph.session_id) from exc

    event_manager.on_end(data={"build_duration": sum(timedeltas)})
    await event_manager.queue.put((None, None, time.time()))
