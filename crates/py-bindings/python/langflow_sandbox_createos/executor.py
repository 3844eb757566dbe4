"""The ``createos`` whole-flow executor for lfx (entry point ``lfx.executors``).

``LANGFLOW_EXECUTOR_KIND=createos`` makes lfx's Coordinator hand every flow run here: the flow
is serialized, rebuilt inside one CreateOS guest with ``Graph.from_payload``, run there, and its
per-vertex events come back live. Glue only: this module converts lfx objects to JSON on the
way in and rebuilds lfx objects from JSON on the way out; the native extension decides
everything else (settings, refusals, the guest's lifecycle, what crosses the boundary).

Every caller gets what it would get in-process:

- ``Graph.arun`` and Langflow's ``/api/v1/run`` (the ``_use_arun_legacy`` passthrough, inputs in
  ``unit.inputs``) get ``RunComplete.outputs`` as ``list[RunOutputs]``, harvested in the guest
  the way ``Graph._run`` does;
- ``lfx run``, ``lfx serve`` and Loop subgraphs (the streaming path, inputs in
  ``runtime_options["initial_inputs"]``) get one ``StepResult`` per vertex whose payload reads
  like an in-process ``VertexBuildResult`` (``.vertex.custom_component.display_name``,
  ``.result_dict.results["message"]``, ``.valid``), then ``Finish``, then ``RunComplete([])``.

What a flow needs from the process it runs for is resolved here, on the host, with lfx's and
Langflow's own functions, and sent in the job (``_host_context``): the values of fields that load
from global variables (credentials among them), resolved as the in-process build resolves them
and only for the fields the flow has; the run's chat session and the session's history (bounded
by the native side); and the uploaded files the flow's file inputs read from Langflow's storage.
No component of the flow is instantiated or evaluated on the host. The chat messages the flow
stores in its guest come back as ``message`` events and are stored here, in Langflow's message
store, under the same flow and owner scope as in-process (``_MessageSink``).

Failures raise ``SandboxRefusedError`` (nothing ran; for example lfx missing in the guest
image) or ``SandboxFailedError`` (infrastructure, timeout, unknown outcome); a flow that
fails in the guest raises the built-in exception it raised there.

What the guest sends is hostile. The native side admits a frame only within the host's bounds
(size, nesting, count of values) and hands it over as Python objects it built itself; this
module rebuilds the tagged lfx values in place, bounds the one conversion that could grow
beyond its input (a ``DataFrame``'s cells), opens no host file a guest ``Message`` names, and
escapes control characters in the names lfx logs. A frame it cannot read fails the run with
``SandboxFailedError``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import json
import logging
import os
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator
from typing import Any, ClassVar, NamedTuple, TypeVar, cast

from lfx.execution.executor import Executor
from lfx.execution.types import RunComplete, StepResult, Unit

__all__ = ["CreateOSExecutor", "OpenSandboxExecutor", "RemoteComponent", "RemoteVertex", "RemoteVertexResult"]

_logger = logging.getLogger("langflow_sandbox_createos")
_shutdown_registered: set[str] = set()
_said_what_is_sandboxed = False
_warned_host_built = False
#: Background tasks of this module still running (the event loop holds only weak references).
_background: set[Any] = set()
_T = TypeVar("_T")

#: The most cells (rows times the union of their columns) of a ``DataFrame`` rebuilt from a
#: guest: a frame's own bound on values (``MAX_FRAME_VALUES``), so a table of records with
#: disjoint columns cannot grow quadratically on the host.
MAX_DATAFRAME_CELLS = 250_000
#: The longest name (vertex id, display name) kept from a guest frame.
_MAX_NAME_CHARS = 256
#: Where the guest finds the uploaded files (the native side refuses any other place).
_GUEST_FILES = "/workspace/lfx_files/"
#: How much of a conversion failure's text an error quotes.
_MAX_REASON_CHARS = 500


def _safe(text: Any, limit: int = _MAX_NAME_CHARS) -> str | None:
    """Guest text fit for a log record or an exception: cut to ``limit`` bytes, on one line, its
    control, line-break and bidirectional characters escaped (the native ``outside_line``, the
    workspace's one escaping)."""
    from . import _native

    if text is None:
        return None
    if not isinstance(text, str):
        text = repr(text)[: limit + 1]
    return _native.outside_line(text, limit)


class RemoteComponent:
    """The part of a guest vertex's component that callers read: its display name."""

    def __init__(self, display_name: str | None) -> None:
        self.display_name = display_name

    def __repr__(self) -> str:
        return f"RemoteComponent(display_name={self.display_name!r})"


class RemoteVertex:
    """A vertex that ran in the guest, as seen from the host."""

    def __init__(self, vertex_id: str, display_name: str | None, component: str | None, *, is_output: bool) -> None:
        self.id = vertex_id
        self.display_name = display_name
        self.is_output = is_output
        self.custom_component = RemoteComponent(component)

    def __repr__(self) -> str:
        return f"RemoteVertex(id={self.id!r}, display_name={self.display_name!r})"


class RemoteVertexResult(NamedTuple):
    """A finished guest vertex, shaped like lfx's in-process ``VertexBuildResult``."""

    result_dict: Any
    params: str
    valid: bool
    artifacts: dict[str, Any]
    vertex: RemoteVertex
    #: When the vertex finished in the guest (seconds since the epoch), for latency checks.
    finished_at: float | None = None


def _encode_input(value: Any) -> Any:
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        return {"__lfx__": type(value).__name__, "v": value.model_dump(mode="json")}
    return value


def _request(unit: Unit) -> dict[str, Any]:
    """The request document for the native executor: the flow, inputs and JSON-able options."""
    graph: Any = unit.graph
    flow = graph.dump() if hasattr(graph, "dump") else graph
    options: dict[str, Any] = {}
    unserializable: list[str] = []
    for key, value in unit.runtime_options.items():
        encoded = _encode_input(value) if key == "initial_inputs" else value
        try:
            json.dumps(encoded)
        except (TypeError, ValueError):
            unserializable.append(key)
            _logger.debug("runtime option %r is not JSON-serializable; it stays on the host", key)
            continue
        options[key] = encoded
    return {
        "flow": flow,
        "flow_id": _text(getattr(graph, "flow_id", None)),
        "flow_name": _text(getattr(graph, "flow_name", None)),
        "user_id": _text(getattr(graph, "user_id", None)),
        "inputs": [dict(i) for i in unit.inputs],
        "options": options,
        "unserializable": unserializable,
    }


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


_UNKNOWN_TAG = object()


def _message(body: Any, ids: dict[str, str] | None = None) -> Any:
    from lfx.schema.message import Message

    if not isinstance(body, dict):
        raise TypeError("a tagged Message whose value is not an object")
    body = cast("dict[str, Any]", body)
    guest_id = body.get("id")
    if ids and isinstance(guest_id, str) and guest_id in ids:
        # The message the flow stored: it has the id the host's store gave it.
        body = {**body, "id": ids[guest_id]}
    files = body.get("files")
    if not files:
        return Message.model_validate(body)
    # The guest's file names are paths in the guest: validating them would open each one on the
    # host (to tell images apart). They are kept as they are, unopened.
    message = Message.model_validate({**body, "files": []})
    message.files = files
    return message


def _dataframe(body: Any) -> Any:
    from lfx.schema.dataframe import DataFrame

    if not isinstance(body, list) or not all(isinstance(row, dict) for row in cast("list[Any]", body)):
        raise TypeError("a tagged DataFrame whose value is not a list of records")
    rows = cast("list[dict[str, Any]]", body)
    columns: set[str] = set()
    for row in rows:
        columns.update(row)
    cells = len(rows) * len(columns)
    if cells > MAX_DATAFRAME_CELLS:
        raise ValueError(
            f"a DataFrame of {len(rows)} rows and {len(columns)} columns ({cells} cells) is over the host's "
            f"bound MAX_DATAFRAME_CELLS ({MAX_DATAFRAME_CELLS} cells)"
        )
    return DataFrame(rows)


def _tagged(value: Any, ids: dict[str, str] | None = None) -> Any:
    """The lfx object a tagged value stands for, or ``_UNKNOWN_TAG`` for anything else."""
    if not isinstance(value, dict) or "__lfx__" not in value:
        return _UNKNOWN_TAG
    value = cast("dict[str, Any]", value)
    tag = value.get("__lfx__")
    if tag == "Message":
        return _message(value.get("v"), ids)
    if tag == "Data":
        from lfx.schema.data import Data

        return Data.model_validate(value.get("v"))
    if tag == "DataFrame":
        return _dataframe(value.get("v"))
    return _UNKNOWN_TAG


def _decode(value: Any, ids: dict[str, str] | None = None) -> Any:
    """JSON from the guest with its tagged lfx values rebuilt as lfx objects (a message the
    flow stored gets the id the host's store gave it, from ``ids``).

    In place (the containers are the native side's fresh objects, so no second tree is built)
    and without recursion.
    """
    rebuilt = _tagged(value, ids)
    if rebuilt is not _UNKNOWN_TAG:
        return rebuilt
    stack: list[Any] = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            entries: Any = enumerate(cast("list[Any]", node))
        elif isinstance(node, dict):
            entries = cast("dict[Any, Any]", node).items()
        else:
            continue
        for key, item in entries:
            rebuilt = _tagged(item, ids)
            if rebuilt is not _UNKNOWN_TAG:
                node[key] = rebuilt  # replaces a value: the container keeps its size
            elif isinstance(item, (dict, list)):
                stack.append(item)
    return value


def _result_data(body: dict[str, Any] | None, ids: dict[str, str] | None = None) -> Any:
    from lfx.graph.schema import ResultData

    if body is None:
        return None
    return ResultData.model_validate({**body, "results": _decode(body.get("results"), ids)})


def _vertex_payload(frame: dict[str, Any], ids: dict[str, str] | None = None) -> RemoteVertexResult:
    result = _result_data(frame.get("result"), ids)
    # lfx logs these names (``lfx run`` prints each vertex's display name): escaped.
    vertex = RemoteVertex(
        _safe(frame["id"]) or "",
        _safe(frame.get("display_name")),
        _safe(frame.get("component_display_name")),
        is_output=bool(frame.get("is_output")),
    )
    if result is None:
        from lfx.graph.schema import ResultData

        result = ResultData(component_id=frame["id"])
    raw: Any = result.artifacts
    artifacts = cast("dict[str, Any]", raw) if isinstance(raw, dict) else {}
    finished = frame.get("finished_at")
    return RemoteVertexResult(
        result,
        "",
        bool(frame.get("valid", True)),
        artifacts,
        vertex,
        float(finished) if isinstance(finished, (int, float)) else None,
    )


def _run_outputs(outputs: list[dict[str, Any]], ids: dict[str, str] | None = None) -> list[Any]:
    from lfx.graph.schema import RunOutputs

    runs: list[Any] = []
    for ro in outputs:
        results: list[dict[str, Any] | None] = ro.get("outputs") or []
        runs.append(
            RunOutputs(inputs=_decode(ro.get("inputs") or {}), outputs=[_result_data(rd, ids) for rd in results])
        )
    return runs


def _rebuilt(kind: str, rebuild: Callable[[Any], _T], data: Any) -> _T:
    """``rebuild(data)``; a failure (the guest sent what the host cannot rebuild) is raised as
    ``SandboxFailedError``, not chained: the original text may quote the guest's raw bytes."""
    try:
        return rebuild(data)
    except Exception as exc:  # noqa: BLE001 - anything a hostile frame makes the rebuild raise
        from .exceptions import SandboxFailedError

        reason = _safe(f"{type(exc).__name__}: {exc}", _MAX_REASON_CHARS)
        raise SandboxFailedError(
            f"the guest sent a {kind} event the host could not read ({reason}); the run was stopped "
            "and the guest destroyed, and the flow may have run"
        ) from None


# --- What the host resolves for the run ---------------------------------------------------------


class _Unbridged(Exception):  # noqa: N818 - raised as SandboxRefusedError
    """A component needs something of the host the executor cannot send to the guest."""


def _lfx(module: str) -> Any:
    """An lfx module, untyped: its graph and component APIs are only partly annotated."""
    return importlib.import_module(module)


def _vertices(graph: Any) -> list[Any]:
    return list(getattr(graph, "vertices", None) or [])


def _item(obj: Any, key: str) -> Any:
    """``obj[key]`` of a ``dict``, else None."""
    return cast("dict[str, Any]", obj).get(key) if isinstance(obj, dict) else None


def _builtin_base(exc: BaseException) -> str:
    """The first built-in exception class of ``exc``'s type (what the guest can rebuild)."""
    import builtins

    for cls in type(exc).__mro__:
        if getattr(builtins, cls.__name__, None) is cls:
            return cls.__name__
    return "RuntimeError"


def _jsonable(value: Any) -> Any:
    from pydantic import SecretStr

    if isinstance(value, SecretStr):
        return value.get_secret_value()
    json.dumps(value)
    return value


def _stand_in(vertex: Any, graph: Any) -> Any:
    """What lfx's ``CustomComponent.get_variable`` reads of a component, without the component:
    its class name (as the flow names it), the graph, and the user the build runs for. The
    flow's own code is never evaluated on the host."""
    custom: Any = _lfx("lfx.custom.custom_component.custom_component")
    loading: Any = _lfx("lfx.interface.initialize.loading")

    def user_id(self: Any) -> Any:
        return self._user_id or graph.user_id  # noqa: SLF001

    cls: Any = type(
        str(loading._component_class_name(vertex)),  # noqa: SLF001 - the class name lfx instantiates
        (),
        {"get_variable": custom.CustomComponent.get_variable, "user_id": property(user_id)},
    )
    component = cls()
    component.graph = graph
    component._user_id = getattr(graph, "user_id", None)  # noqa: SLF001 - what instantiate_class gives it
    component._vertex = vertex  # noqa: SLF001
    return component


async def _variables(graph: Any, fallback_to_env_vars: bool) -> dict[str, Any]:
    """The values of the fields that load from global variables, vertex by vertex, resolved by
    lfx's own ``update_params_with_load_from_db_fields`` exactly as the in-process build calls
    it (Langflow's variable service inside a server, the environment under lfx's rules
    otherwise). A resolution that raises is sent as its error, for the guest to raise when the
    vertex builds, as in-process."""
    loading: Any = _lfx("lfx.interface.initialize.loading")

    resolved: dict[str, Any] = {}
    for vertex in _vertices(graph):
        fields: list[Any] = list(getattr(vertex, "load_from_db_fields", None) or [])
        if not fields:
            continue
        params: dict[str, Any] = loading.get_params(dict(vertex.params))
        before = dict(params)
        try:
            after: dict[str, Any] = await loading.update_params_with_load_from_db_fields(
                _stand_in(vertex, graph), params, fields, fallback_to_env_vars=fallback_to_env_vars
            )
            changed = {k: _jsonable(v) for k, v in after.items() if k not in before or v is not before[k]}
            entry: dict[str, Any] = {"params": changed, "drop": [k for k in before if k not in after]}
        except Exception as exc:  # noqa: BLE001 - raised in the guest when the vertex builds
            entry = {"error": {"type": type(exc).__name__, "base": _builtin_base(exc), "message": str(exc)}}
        resolved[str(vertex.id)] = entry
    return resolved


@contextlib.contextmanager
def _message_scope(graph: Any) -> Generator[tuple[Any, Any], None, None]:
    """The flow and message owner a component of ``graph`` stores and reads messages under, bound
    as lfx binds them around each component's build; yields ``(flow_id, owner_id)``."""
    fc: Any = _lfx("lfx.memory.flow_context")

    flow_id = getattr(graph, "flow_id", None)
    owner = fc.resolve_message_owner_id(graph)
    flow_token = fc.set_current_flow_id(flow_id)
    owner_token = fc.set_current_message_owner_id(owner)
    executor_token = fc.set_current_message_executor_id(fc.coerce_flow_id(getattr(graph, "user_id", None)))
    persist_token = fc.set_messages_persist(
        fc.should_persist_messages()
        and bool(getattr(graph, "persist_messages", True))
        and fc.coerce_flow_id(flow_id) is not None
        and owner is not None
    )
    try:
        yield flow_id, owner
    finally:
        fc.reset_current_flow_id(flow_token)
        fc.reset_current_message_owner_id(owner_token)
        fc.reset_current_message_executor_id(executor_token)
        fc.reset_messages_persist(persist_token)


def _has_message_store() -> bool:
    from lfx.utils.langflow_utils import has_langflow_db_backend

    return bool(has_langflow_db_backend())


async def _history(graph: Any, session_id: str | None, limit: int) -> dict[str, Any] | None:
    """The session's chat history from the host's message store, newest first (``limit``
    messages; the native side cuts it to its bounds and says so), or ``None`` when the host has
    no message store (bare lfx: the guest keeps lfx's own, as the host does)."""
    if not _has_message_store():
        return None
    if not session_id:
        return {"history": []}
    memory: Any = _lfx("lfx.memory")
    fc: Any = _lfx("lfx.memory.flow_context")

    with _message_scope(graph) as (flow_id, owner):
        messages: list[Any] = await memory.aget_messages(
            session_id=session_id, flow_id=fc.coerce_flow_id(flow_id), user_id=owner, order="DESC", limit=limit
        )
    return {"history": [json.loads(m.model_dump_json()) for m in messages]}


def _is_file_field(field: Any) -> bool:
    return _item(field, "type") == "file" or _item(field, "_input_type") == "FileInput"


def _storage_root() -> str | None:
    """The local directory of Langflow's (or lfx's) file storage, or None without one; a
    storage that is not local refuses the run when a file input uses it."""
    from lfx.services.deps import get_storage_service

    storage = get_storage_service()
    if storage is None:
        return None
    settings = getattr(getattr(getattr(storage, "settings_service", None), "settings", None), "storage_type", "local")
    if str(settings).lower() != "local":
        return "s3"
    data_dir = getattr(storage, "data_dir", None)
    return None if data_dir is None else os.path.realpath(str(data_dir))


def _files(graph: Any) -> tuple[list[dict[str, str]], dict[str, Any], dict[str, str]]:
    """The uploaded files the flow's file inputs read: what the native side uploads, the guest's
    values of those inputs (an upload and its key in the storage, which the runner puts at the
    same key in the guest's storage, or a path left as it is), and the way back from an upload to
    the host's value. Only files inside Langflow's storage are sent; any other path is left for
    the guest's own filesystem."""
    uploads: list[dict[str, str]] = []
    params: dict[str, Any] = {}
    back: dict[str, str] = {}
    root: str | None = None
    looked = False
    for vertex in _vertices(graph):
        template: dict[str, Any] = _item(_item(getattr(vertex, "data", None), "node"), "template") or {}
        for name, field in template.items():
            value: Any = vertex.params.get(name) if _is_file_field(field) else None
            paths: Any = [value] if isinstance(value, str) else value
            if not paths or not isinstance(paths, list):
                continue
            paths = cast("list[Any]", paths)
            if not all(isinstance(p, str) and p for p in paths):
                continue
            if not looked:
                root, looked = _storage_root(), True
            vertex_id = str(vertex.id)
            component = _safe(getattr(vertex, "display_name", None) or vertex_id) or "a component"
            if root == "s3":
                raise _Unbridged(
                    f"{component}: its file input reads from Langflow's S3 file storage, which the CreateOS "
                    "executor does not send to the guest; run this flow in-process (unset LANGFLOW_EXECUTOR_KIND)"
                )
            if root is None:
                continue
            items: list[Any] = []
            for path in cast("list[str]", paths):
                real = os.path.realpath(path)
                if os.path.commonpath([real, root]) != root or real == root:
                    items.append(path)  # not an upload: the guest's own file
                    continue
                key = os.path.relpath(real, root)
                guest = f"{_GUEST_FILES}{len(uploads)}/{os.path.basename(real).replace(chr(92), '_')}"
                uploads.append({"host_path": real, "guest_path": guest, "component": component})
                back[guest] = path
                items.append({"upload": guest, "key": key})
            params.setdefault(vertex_id, {})[name] = items if isinstance(value, list) else items[0]
    return uploads, params, back


def _session_id(unit: Unit) -> str | None:
    """The run's chat session: the caller's ``session_id`` option, else the graph's."""
    return _text(unit.runtime_options.get("session_id") or getattr(unit.graph, "session_id", None) or None)


def _table_cells(table: str, values: dict[str, Any]) -> list[tuple[str, str]]:
    """The cells of the table field ``table`` that load from a global variable, as lfx's
    loading resolves them: ``(field, name)`` per cell of a ``load_from_db`` column, unless the
    row's own ``__load_from_db_fields`` turns that cell off."""
    rows: Any = values.get(table)
    columns: Any = values.get(f"{table}_load_from_db_columns") or []
    if not isinstance(rows, list) or not isinstance(columns, list):
        return []
    cells: list[tuple[str, str]] = []
    for i, row in enumerate(cast("list[Any]", rows)):
        if not isinstance(row, dict):
            continue
        cell_row = cast("dict[str, Any]", row)
        switches: Any = cell_row.get("__load_from_db_fields")
        for column in cast("list[Any]", columns):
            column = str(column)
            if isinstance(switches, dict) and column in switches and not switches[column]:
                continue
            if isinstance(switches, list) and column not in switches:
                continue
            name: Any = cell_row.get(column)
            if isinstance(name, str) and name.strip():
                cells.append((f"{table}[{i}].{column}", name))
    return cells


def _asked_variables(graph: Any) -> list[dict[str, str | None]]:
    """The variables the flow's fields ask for (each field that loads from a global variable,
    and each table cell of a column that does, with the name it holds), read from the built
    graph without resolving anything: the native side refuses a run that asks for what
    configures the sandbox before any guest exists."""
    asked: list[dict[str, str | None]] = []
    for vertex in _vertices(graph):
        params: Any = getattr(vertex, "params", None) or {}
        values: dict[str, Any] = cast("dict[str, Any]", params) if isinstance(params, dict) else {}
        component = _text(getattr(vertex, "display_name", None))
        for field in list(getattr(vertex, "load_from_db_fields", None) or []):
            field = str(field)
            if field.startswith("table:"):
                pairs = _table_cells(field.removeprefix("table:"), values)
            else:
                name: Any = values.get(field)
                pairs = [(field, name)] if isinstance(name, str) and name.strip() else []
            for shown, name in pairs:
                asked.append({"vertex": str(vertex.id), "component": component, "field": shown, "name": name})
    return asked


def _head(unit: Unit, uploads: list[dict[str, str]]) -> dict[str, Any]:
    """The head document for the native executor: what admits the run, refuses it and creates
    its guest (the flow's id, the session, the mode flag, the uploaded files, the variables its
    fields ask for), so the rest of the request is prepared while the guest is created and
    imports lfx."""
    legacy = unit.runtime_options.get("_use_arun_legacy")
    return {
        "flow_id": _text(getattr(unit.graph, "flow_id", None)),
        "session_id": _session_id(unit),
        "options": {"_use_arun_legacy": legacy} if isinstance(legacy, bool) else {},
        "files": uploads,
        "variables": _asked_variables(unit.graph),
    }


async def _host_context(unit: Unit, history_limit: int) -> dict[str, Any]:
    """What the host resolves for the run (added to the request): the run's ids, the values of
    the fields that load from global variables, and the session's history."""
    graph: Any = unit.graph
    options = unit.runtime_options
    session_id = _session_id(unit)
    end_user = getattr(graph, "end_user_id", None)
    if not getattr(graph, "_run_id", None) and hasattr(graph, "set_run_id"):
        graph.set_run_id()  # as the in-process run's initialize_run does: messages carry it
    return {
        "session_id": session_id,
        "run_id": _text(getattr(graph, "_run_id", None) or None),
        "end_user_id": _text(end_user),
        "persist_messages": bool(getattr(graph, "persist_messages", True)),
        "variables": await _variables(graph, bool(options.get("fallback_to_env_vars", False))),
        "memory": await _history(graph, session_id, history_limit),
    }


class _MessageSink:
    """Stores the chat messages the flow writes in its guest in the host's message store
    (``lfx.memory``, Langflow's database inside a server) with the graph's flow, run and owner,
    and keeps the guest's message ids mapped to the host's for later updates and deletes."""

    def __init__(self, graph: Any, files_back: dict[str, str]) -> None:
        self.graph = graph
        self.files_back = files_back
        self.ids: dict[str, str] = {}

    def _build(self, body: Any) -> Any:
        from lfx.schema.message import Message

        if not isinstance(body, dict):
            raise TypeError("a message frame without a message object")
        body = {k: v for k, v in cast("dict[str, Any]", body).items() if k not in ("id", "flow_id", "user_id")}
        files: Any = body.pop("files", None)
        message: Any = Message.model_validate(body)
        if files is not None:
            # Only the uploads sent to the guest map back to host files; anything else the guest
            # names is a guest path, unopened and not stored.
            named: list[Any] = cast("list[Any]", files) if isinstance(files, list) else []
            message.files = [self.files_back[f] for f in named if isinstance(f, str) and f in self.files_back]
        return message

    async def apply(self, frame: dict[str, Any]) -> None:
        memory: Any = _lfx("lfx.memory")

        op, guest_id = frame.get("op"), str(frame.get("id"))
        with _message_scope(self.graph) as (flow_id, owner):
            if op == "store":
                run_id = getattr(self.graph, "_run_id", None)
                stored: list[Any] = await memory.astore_message(
                    self._build(frame.get("message")),
                    flow_id=_text(flow_id),
                    run_id=_text(run_id or None),
                    user_id=_text(owner),
                )
                host_id = getattr(stored[0], "id", None) if stored else None
                if host_id:
                    self.ids[guest_id] = str(host_id)
                return
            host_id = self.ids.get(guest_id)
            if op == "update" and host_id:
                message = self._build(frame.get("message"))
                message.id = host_id
                await memory.aupdate_messages(message)
            elif op == "delete" and host_id:
                await memory.delete_message(host_id)
                self.ids.pop(guest_id, None)
            elif op == "delete_session":
                session_id, context_id = frame.get("session_id"), frame.get("context_id")
                await memory.adelete_messages(
                    session_id=_text(session_id), context_id=_text(context_id), flow_id=flow_id, user_id=owner
                )


def _lfx_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lfx")
    except PackageNotFoundError:
        return None


def _register_shutdown(provider: str) -> None:
    if provider not in _shutdown_registered:
        from . import _native

        _shutdown_registered.add(provider)
        # lfx run / lfx serve never shut executors down; destroy what is left at exit.
        atexit.register(_native.NativeExecutor(provider).shutdown)


def _say_what_is_sandboxed_soon() -> None:
    """Once per process, at the first run's first event: which Langflow paths reach this
    executor and which do not, logged from a background task. Reading that parses Langflow's
    sources (a few hundred ms of CPU), so it waits until the guest has imported lfx rather
    than competing with that import, on the run's critical path, for the host's cores (on the
    fake the guest's cores are the host's)."""
    global _said_what_is_sandboxed
    if _said_what_is_sandboxed:
        return
    _said_what_is_sandboxed = True
    import asyncio

    task = asyncio.get_running_loop().create_task(_say_what_is_sandboxed())
    _background.add(task)  # held until done: the loop keeps only a weak reference
    task.add_done_callback(_background.discard)


async def _say_what_is_sandboxed() -> None:
    """Which Langflow paths reach this executor (read from the installed lfx and Langflow, off
    the event loop), as one log line."""
    import asyncio

    from . import reach

    try:
        covered, text = await asyncio.to_thread(reach.first_run_message)
    except Exception as exc:  # noqa: BLE001 - a statement, never a reason to fail the run
        _logger.warning("createos executor: could not tell which Langflow paths reach it (%s)", type(exc).__name__)
        return
    _logger.log(logging.INFO if covered else logging.WARNING, "%s", text)


def _warn_if_host_built(graph: Any) -> None:
    """Once per process: a WARNING when the graph handed to the executor has components the
    Langflow process already built (lfx's loaders and Langflow's run routes build the graph
    with ``instantiate_components=True``, which runs each component's module-level code, class
    body and constructor on the host). The vertex builds still run only in the guest; this
    says, truthfully, what ran on the host before the hand-over (issue 46)."""
    global _warned_host_built
    if _warned_host_built:
        return
    built = [v for v in _vertices(graph) if getattr(v, "custom_component", None) is not None]
    if not built:
        return
    _warned_host_built = True
    _logger.warning(
        "executor: this process built %d of the flow's %d components before handing the flow to "
        "the executor (the graph was loaded with instantiate_components=True): each one's module-level "
        "code, class body and __init__ ran in the Langflow process; their builds run only in the guest. "
        "See the README's 'what is and is not sandboxed'. Said once per process",
        len(built),
        len(_vertices(graph)),
    )


def _report(span: Any, events: Any) -> None:
    """The run's outcome and phase timings on its span, as the native side decided them (the
    outcome only once the run ended; ``stopped`` when the reader stopped before the end)."""
    if events.outcome is not None:
        span.set_attribute("createos.outcome", events.outcome)
    for phase, value in events.timings.items():
        if value is not None:
            span.set_attribute(f"createos.timings.{phase}", value)


class CreateOSExecutor(Executor):
    """Runs each flow in a fresh CreateOS microVM and streams its vertices back live.

    Stateless: the constructor does nothing (lfx builds one in every process), and all per-run
    state lives in the run's own event stream, so concurrent runs share the instance safely.
    The guest is destroyed when the run completes, fails, or its consumer stops early.
    """

    kind: ClassVar[str] = "createos"
    #: The provider the native executor runs the guest on.
    provider: ClassVar[str] = "createos"

    async def execute(self, unit: Unit) -> AsyncIterator[StepResult | RunComplete]:  # pyright: ignore[reportIncompatibleMethodOverride]
        """Run ``unit`` in a guest: one ``StepResult`` per vertex, then one ``RunComplete``."""
        from lfx.graph.graph.constants import Finish

        async with contextlib.aclosing(self.frames(unit)) as frames:
            async for kind, data, ids, mode in frames:
                if kind == "vertex":
                    yield StepResult(payload=_rebuilt(kind, functools.partial(_vertex_payload, ids=ids), data))
                    continue
                outputs = _rebuilt(kind, functools.partial(_run_outputs, ids=ids), data)
                if mode == "stream":
                    yield StepResult(payload=Finish())
                yield RunComplete(outputs=outputs)
                return

    async def frames(self, unit: Unit) -> AsyncGenerator[tuple[str, Any, dict[str, str], str | None], None]:
        """Run ``unit`` in a guest and yield its frames as the native side admitted them:
        ``("vertex", frame, ids, mode)`` for each vertex frame, then ``("complete", outputs, ids,
        mode)``; the chat messages the flow stores are stored on the host on the way (``ids``
        maps the guest's message ids to the host's). The Playground's driver reads these."""
        import asyncio

        from . import _native
        from .exceptions import SandboxFailedError, SandboxRefusedError

        from . import metrics

        # Before the shutdown _register_shutdown adds (exit handlers run last-registered
        # first): the guests it destroys still reach the metrics and usage records.
        metrics.install()
        with metrics.run_scope("executor") as span:
            from .hostbuild import setting
            from .playground import setting as playground_setting

            bad = setting()[1] or playground_setting()[1]
            if bad is not None:  # fail closed: the operator asked for something this cannot tell
                raise SandboxRefusedError(f"{bad}; nothing was created")
            _warn_if_host_built(unit.graph)
            try:
                uploads, file_params, files_back = _files(unit.graph)
            except _Unbridged as exc:
                raise SandboxRefusedError(str(exc)) from None
            # The guest is created, and starts importing lfx, while the rest is prepared here.
            events = _native.NativeExecutor(self.provider).start(json.dumps(_head(unit, uploads)), _lfx_version())
            _register_shutdown(self.provider)
            sink = _MessageSink(unit.graph, files_back)
            try:
                began = time.perf_counter()
                request = _request(unit)
                request.update(await _host_context(unit, _native.NativeExecutor.HISTORY_MESSAGES + 1))
                request.update(files=uploads, file_params=file_params)
                request["host_context_ms"] = round((time.perf_counter() - began) * 1000)
                events.supply(json.dumps(request))
                del request  # the variables' values: not kept past the hand-over
                async for kind, data in events:
                    _say_what_is_sandboxed_soon()
                    if kind == "vertex":
                        yield kind, data, sink.ids, events.mode
                        continue
                    if kind == "message":
                        try:
                            await sink.apply(data)
                        except Exception as exc:  # noqa: BLE001 - what the host store raised for a guest's message
                            reason = _safe(f"{type(exc).__name__}: {exc}", _MAX_REASON_CHARS)
                            raise SandboxFailedError(
                                f"a chat message the flow stored in its guest could not be stored on the host ({reason}); "
                                "the run was stopped and the guest destroyed, and the flow may have run"
                            ) from None
                        continue
                    _report(span, events)
                    yield kind, data, sink.ids, events.mode
                    return
            finally:
                await events.aclose()
                _report(span, events)
                if _background:  # the first run's log line, before a one-run process exits
                    await asyncio.wait(set(_background), timeout=10)

    def __repr__(self) -> str:
        return "<CreateOSExecutor kind='createos'>"


class OpenSandboxExecutor(CreateOSExecutor):
    """Runs each flow in a fresh sandbox of a self-hosted OpenSandbox server
    (``LANGFLOW_EXECUTOR_KIND=opensandbox``), exactly as :class:`CreateOSExecutor` does on
    CreateOS. The server is read from ``OPEN_SANDBOX_DOMAIN``/``OPEN_SANDBOX_API_KEY``; a run
    is refused (``SandboxRefusedError``, nothing created) unless the server's isolation is
    attested (``OPEN_SANDBOX_ATTEST_ISOLATION=hardware-virtualized``) or container isolation is
    accepted (``OPEN_SANDBOX_ALLOW_CONTAINER_ISOLATION=true``)."""

    kind: ClassVar[str] = "opensandbox"
    provider: ClassVar[str] = "opensandbox"

    def __repr__(self) -> str:
        return "<OpenSandboxExecutor kind='opensandbox'>"
