"""Guest runner of the CreateOS whole-flow executor (embedded in langflow-executor).

The host uploads this file and runs ``python3 -u lfx_runner.py --wait lfx_job.json`` under
``timeout(1)`` as soon as the guest exists: the runner imports lfx and warms its graph machinery
(the seconds a cold run spends before its first vertex) while the host is still resolving what
the flow needs and uploading the job document, then waits for the job (a file that parses whole),
rebuilds the flow with ``Graph.from_payload``, runs it, and writes one JSON frame per line to its
*original* standard output, which it keeps for itself: everything else the flow prints (its own
``print``s, subprocesses) goes to standard error, which the host turns into log lines. Frames, in
order:

- ``{"frame": "hello", ...}`` once lfx is importable and the job was read (versions, for the
  host's log, and how long the preload and the wait for the job took);
- ``{"frame": "graph", "rebuild_ms": ...}`` once the flow is rebuilt, before its first vertex;
- ``{"frame": "vertex", ...}`` each time a vertex finishes, flushed at once (live); in the
  Playground's walk (``options["playground"]``, ``_run_playground``) vertex frames carry a
  ``pg`` key: the sorted first layer, each component event, each built vertex;
- ``{"frame": "message", "op": ..., "id": ..., "message": ...}`` each time the flow stores,
  updates or deletes a chat message (the host stores it in its own message store);
- ``{"frame": "complete", "outputs": [...]}`` at the end, with the run's ``RunOutputs``
  harvested exactly as ``Graph._run`` does (legacy mode), or ``[]`` (stream mode, as the
  in-process streaming path);
- ``{"frame": "error", "kind": ..., "message": ...}`` instead of ``complete`` when the run
  cannot finish (``missing_lfx``: lfx is not installed; ``flow``: the flow raised).

A frame whose line would be longer than ``CHUNK_BYTES`` (a vertex that answers with megabytes
of text carries them several times) is sent as consecutive ``{"frame": "chunk", "index": i,
"total": <bytes of the frame's JSON text>, "data": <the next piece of that text>}`` frames, which
the host puts back together within its bound on a run's results
(``CREATEOS_EXECUTOR_MAX_RESULT_BYTES``), so no line is longer than the host takes in one line.

What the host resolved in its own process travels in the job, and the runner puts it where lfx
reads it in-process (``_install_host_context``): the values of fields that load from global
variables, the run's chat session, the session's history (served, with the messages the run
stores, by a stand-in for lfx's message store), and the uploaded files the flow's file inputs
read. The job file is deleted once read: it holds the variables' values.

Values that are lfx objects are tagged ``{"__lfx__": "Message" | "Data" | "DataFrame", "v": ...}``
so the host rebuilds them as the same types. This file speaks the protocol of the host crate it
is embedded in (``PROTOCOL``); both are versioned together.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import subprocess
import sys
import threading
import time
import traceback
import uuid
from typing import Any

PROTOCOL = 2
# The result of a vertex that is not one of the flow's outputs, of more JSON values than this
# (counted as the host counts them), is replaced by a note, so it stays well inside the host's
# bound on a frame's values (250,000), which refuses the whole run. An output vertex's result and
# the terminal frame are never cut: their callers read them. The host enforces its bounds itself:
# this is a courtesy. Bytes are not cut: a long frame is sent in chunks (``CHUNK_BYTES``).
MAX_VERTEX_RESULT_VALUES = 200_000
# The longest frame line written whole; a longer frame goes in pieces of this many bytes of its
# JSON text (at most twice that once escaped: well inside the host's 16 MiB line).
CHUNK_BYTES = 1024 * 1024
# What the host counts for an object tagged ``__lfx__`` on top of its own value.
TAGGED_VALUE_WEIGHT = 32

_frames: Any = None
_emit_lock = threading.Lock()


def _take_stdout() -> None:
    """Keep fd 1 for frames; point fd 1 (and sys.stdout) at stderr for everything else."""
    global _frames
    fd = os.dup(1)  # not inherited by subprocesses (O_CLOEXEC by default)
    _frames = os.fdopen(fd, "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr


def emit(frame: dict[str, Any]) -> None:
    # ASCII (``ensure_ascii``): its length in characters is its length in bytes.
    line = json.dumps(frame, default=_fallback, separators=(",", ":"))
    with _emit_lock:  # flow code may store messages from worker threads
        if len(line) <= CHUNK_BYTES:
            _frames.write(line + "\n")
        else:
            # One piece after another, nothing between them (the lock is held throughout).
            for index, start in enumerate(range(0, len(line), CHUNK_BYTES)):
                piece = {"frame": "chunk", "index": index, "total": len(line), "data": line[start : start + CHUNK_BYTES]}
                _frames.write(json.dumps(piece, separators=(",", ":")) + "\n")
        _frames.flush()


def _fallback(value: Any) -> Any:
    return repr(value)


def _encode(value: Any) -> Any:
    from lfx.schema.data import Data
    from lfx.schema.dataframe import DataFrame
    from lfx.schema.message import Message

    if isinstance(value, Message):
        return {"__lfx__": "Message", "v": json.loads(value.model_dump_json())}
    if isinstance(value, DataFrame):
        return {"__lfx__": "DataFrame", "v": json.loads(value.to_json(orient="records"))}
    if isinstance(value, Data):
        return {"__lfx__": "Data", "v": json.loads(value.model_dump_json())}
    if isinstance(value, dict):
        return {str(k): _encode(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_encode(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    from lfx.serialization import serialize

    try:
        return json.loads(json.dumps(serialize(value), default=_fallback))
    except Exception:  # noqa: BLE001 - a value we cannot encode is shown, not fatal
        return repr(value)


def _serialized(value: Any) -> Any:
    """What ``json`` cannot encode, through lfx's serializer (a DataFrame becomes its records)."""
    from lfx.serialization import serialize

    try:
        out = serialize(value)
    except Exception:  # noqa: BLE001 - a value we cannot encode is shown, not fatal
        return repr(value)
    return repr(value) if out is value else out


def encode_result_data(rd: Any) -> Any:
    """A ``ResultData`` as JSON, its ``results`` values tagged."""
    if rd is None:
        return None
    try:
        body = json.loads(rd.model_dump_json(exclude={"results"}))
    except Exception:  # noqa: BLE001 - pydantic cannot serialize a DataFrame in outputs or artifacts
        body = json.loads(json.dumps(rd.model_dump(exclude={"results"}), default=_serialized))
    results = rd.results
    body["results"] = _encode(results) if results is not None else None
    return body


def _values(value: Any, limit: int) -> int:
    """The JSON values of ``value`` as the host counts them, counted up to just past ``limit``."""
    count = 0
    stack = [value]
    while stack and count <= limit:
        node = stack.pop()
        count += 1
        if isinstance(node, dict):
            if "__lfx__" in node:
                count += TAGGED_VALUE_WEIGHT
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return count


def _vertex_frame(vertex: Any, result_dict: Any, valid: bool, seq: int) -> dict[str, Any]:
    component = getattr(vertex, "custom_component", None)
    encoded = encode_result_data(result_dict)
    is_output = bool(getattr(vertex, "is_output", False))
    truncated = not is_output and _values(encoded, MAX_VERTEX_RESULT_VALUES) > MAX_VERTEX_RESULT_VALUES
    size = len(json.dumps(encoded, default=_fallback)) if truncated else None
    if truncated:
        encoded = None
    return {
        "frame": "vertex",
        "seq": seq,
        "id": vertex.id,
        "display_name": getattr(vertex, "display_name", None),
        "component_display_name": getattr(component, "display_name", None) if component else None,
        "is_output": is_output,
        "valid": bool(valid),
        "result": encoded,
        "result_truncated_bytes": size,
        # Wall-clock time the vertex finished, so a consumer can measure delivery lag.
        "finished_at": time.time(),
    }


def _import_lfx(job: dict[str, Any]) -> str | None:
    """lfx's version, installing it first when the job asks for it; None when unavailable."""
    try:
        import lfx  # noqa: F401
    except ImportError:
        install = job.get("install")
        if not install:
            return None
        cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", *install]
        print(f"installing {' '.join(install)} (CREATEOS_EXECUTOR_INSTALL_LFX)", file=sys.stderr, flush=True)
        subprocess.run(cmd, check=False, stdout=sys.stderr, stderr=sys.stderr)
        try:
            import lfx  # noqa: F401
        except ImportError:
            return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lfx")
    except PackageNotFoundError:
        return "unknown"


def _initial_inputs(raw: Any) -> Any:
    if raw is None:
        return None
    if isinstance(raw, dict) and raw.get("__lfx__") == "InputValueRequest":
        from lfx.schema.schema import InputValueRequest

        return InputValueRequest.model_validate(raw["v"])
    return raw


async def _run_legacy(graph: Any, job: dict[str, Any], options: dict[str, Any]) -> list[Any]:
    """``Graph._arun_legacy`` (what ``Graph.arun`` runs in-process), one frame per built vertex."""
    seq = 0
    build_vertex = graph.build_vertex

    async def reporting_build_vertex(*args: Any, **kwargs: Any) -> Any:
        nonlocal seq
        built = await build_vertex(*args, **kwargs)
        vertex = getattr(built, "vertex", None)
        if vertex is not None:
            seq += 1
            emit(_vertex_frame(vertex, getattr(built, "result_dict", None), getattr(built, "valid", True), seq))
        return built

    graph.build_vertex = reporting_build_vertex
    allowed = {"inputs_components", "types", "outputs", "session_id", "stream", "fallback_to_env_vars"}
    kwargs = {k: v for k, v in options.items() if k in allowed}
    outputs = await graph._arun_legacy(inputs=job.get("inputs") or [], **kwargs)  # noqa: SLF001
    return [
        {"inputs": _encode(ro.inputs), "outputs": [encode_result_data(rd) for rd in ro.outputs]} for ro in outputs
    ]


async def _run_stream(graph: Any, options: dict[str, Any]) -> list[Any]:
    """``Graph.async_start`` (the in-process streaming path), one frame per step."""
    from lfx.graph.graph.constants import Finish

    seq = 0
    inner = graph.async_start(
        inputs=_initial_inputs(options.get("initial_inputs")),
        max_iterations=options.get("max_iterations"),
        config=options.get("config"),
        reset_output_values=options.get("reset_output_values", True),
        fallback_to_env_vars=options.get("fallback_to_env_vars", False),
    )
    try:
        async for step in inner:
            if isinstance(step, Finish):
                break
            vertex = getattr(step, "vertex", None)
            if vertex is None:
                continue
            # A streaming (generator) output is drained here, as an in-process consumer that
            # reads the result would: a generator cannot cross the process boundary.
            if not vertex.result and hasattr(vertex, "consume_async_generator"):
                try:
                    await vertex.consume_async_generator()
                except TypeError:
                    pass  # not a streaming vertex after all
            result_dict = vertex.result if vertex.result is not None else getattr(step, "result_dict", None)
            seq += 1
            emit(_vertex_frame(vertex, result_dict, getattr(step, "valid", True), seq))
    finally:
        await inner.aclose()
    return []


# --- The Playground's walk (the host's CREATEOS_EXECUTOR_PLAYGROUND=on) ------------------------
#
# Langflow's Playground driver (``langflow/api/build.py``) walks the vertices itself instead of
# running the graph: the first sorted layer, then, as each vertex is built, the next runnable
# vertices it unlocks, siblings concurrently. The host replaced that driver: it sends the job with
# ``options["playground"]`` and this runner walks the graph as the driver does, sending
#
# - ``{"frame": "vertex", "id": "", "pg": "sorted", "ids": [...], "to_run": [...]}`` once the
#   first layer is known (the host emits ``vertices_sorted`` and ``build_start``);
# - ``{"frame": "vertex", "id": <vertex>, "pg": "event", "name": "on_token", "data": {...}}`` for
#   each event a component sends through its event manager (tokens, messages, logs), live;
# - ``{"frame": "vertex", "id": <vertex>, "pg": "built", ...}`` each time a vertex is built: its
#   result, validity, the vertices it unlocked or inactivated, or the error it raised (the host
#   emits ``end_vertex`` and stores the build as the driver does).


def _top_level(graph: Any, vertex_ids: Any) -> list[str]:
    """Each vertex id, or its parent's when the parent is a top-level (group) vertex."""
    out = []
    for vertex_id in vertex_ids:
        vertex = graph.get_vertex(vertex_id)
        out.append(vertex.parent_node_id if vertex.parent_is_top_level else vertex_id)
    return out


class _GuestEvents:
    """The event manager the Playground's components get: every ``on_*`` call (from the event
    loop or from a worker thread, as lfx's components make them) is sent to the host at once."""

    def __init__(self, vertex_id: contextvars.ContextVar[str]) -> None:
        self._vertex_id = vertex_id

    def send_event(self, *, event_type: str, data: Any) -> None:
        self._send(f"send_event:{event_type}", data)

    def _send(self, name: str, data: Any) -> None:
        emit({"frame": "vertex", "id": self._vertex_id.get(), "pg": "event", "name": name, "data": _encode(data)})

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("on_"):
            raise AttributeError(name)

        def callback(*, data: Any = None, **_: Any) -> None:
            self._send(name, data)

        return callback


def _build_error(exc: BaseException) -> dict[str, Any]:
    """What Langflow's driver shows for a vertex that raised: the message and the traceback."""
    from lfx.exceptions.component import ComponentBuildError

    if isinstance(exc, ComponentBuildError):
        return {"type": type(exc).__name__, "message": exc.message, "traceback": exc.formatted_traceback}
    message = str(exc)
    cause = exc
    while cause.__cause__ is not None:
        cause = cause.__cause__
    if isinstance(cause, SyntaxError):
        message = f"Syntax error in code. Error on line {cause.lineno}: {(cause.text or '').strip()}"
    else:
        try:
            from lfx.utils.exceptions import module_not_found_hint

            message = module_not_found_hint(cause) or message
        except Exception:  # noqa: BLE001 - an older lfx: the plain message
            pass
    return {"type": type(exc).__name__, "message": message, "traceback": traceback.format_exc()}


async def _run_playground(graph: Any, job: dict[str, Any], pg: dict[str, Any]) -> list[Any]:
    """The Playground driver's vertex walk, one frame per built vertex."""
    from lfx.services.cache.utils import CacheMiss

    session_id = job.get("session_id")
    if session_id:  # as Langflow's build_graph_from_data does
        for vertex_id in graph.has_session_id_vertices:
            vertex = graph.get_vertex(vertex_id)
            if vertex is not None and not vertex.raw_params.get("session_id"):
                vertex.update_raw_params({"session_id": session_id}, overwrite=True)
    stop, start = pg.get("stop_component_id"), pg.get("start_component_id")
    try:
        first_layer = graph.sort_vertices(stop, start)
    except Exception:  # noqa: BLE001 - the driver falls back to the whole graph too
        first_layer = graph.sort_vertices()
    for vertex_id in first_layer:
        graph.run_manager.add_to_vertices_being_run(vertex_id)
    to_run = list(graph.vertices_to_run.union(_top_level(graph, graph.vertices_to_run)))
    emit({"frame": "vertex", "id": "", "pg": "sorted", "ids": list(first_layer), "to_run": to_run})

    current: contextvars.ContextVar[str] = contextvars.ContextVar("lfsc_pg_vertex", default="")
    events = _GuestEvents(current)
    lock = asyncio.Lock()
    inputs = pg.get("inputs") or {}
    user_id = pg.get("user_id")

    async def get_cache(*_args: Any, **_kwargs: Any) -> Any:
        return CacheMiss()

    async def set_cache(*_args: Any, **_kwargs: Any) -> None:
        return None

    async def build(vertex_id: str) -> None:
        current.set(vertex_id)
        began = time.perf_counter()
        vertex = graph.get_vertex(vertex_id)
        next_ids: list[str] = []
        top: list[str] = []
        frame: dict[str, Any] = {"frame": "vertex", "id": vertex_id, "pg": "built"}
        try:
            built = await graph.build_vertex(
                vertex_id=vertex_id,
                user_id=user_id,
                inputs_dict=inputs,
                files=None,
                get_cache=get_cache,
                set_cache=set_cache,
                event_manager=events,
            )
            next_ids = await graph.get_next_runnable_vertices(lock, vertex=vertex, cache=False)
            top = _top_level(graph, next_ids)
            frame.update(
                valid=bool(built.valid),
                params=built.params if isinstance(built.params, str) else repr(built.params),
                result=encode_result_data(built.result_dict),
                artifacts=_encode(built.artifacts),
            )
        except Exception as exc:  # noqa: BLE001 - the driver turns it into the vertex's error output
            traceback.print_exc(file=sys.stderr)
            frame.update(valid=False, error=_build_error(exc))
        inactivated = list(graph.inactivated_vertices.union(graph.conditionally_excluded_vertices))
        graph.reset_inactivated_vertices(vertex.id)
        graph.reset_activated_vertices()
        if graph.stop_vertex and graph.stop_vertex in next_ids:
            next_ids = [graph.stop_vertex]
        elapsed = time.perf_counter() - began
        vertex.add_build_time(elapsed)
        next_ids = list(set(next_ids))
        frame.update(
            inactivated_vertices=list(set(inactivated)),
            next_vertices_ids=next_ids,
            top_level_vertices=list(set(top)),
            will_stream=bool(getattr(vertex, "will_stream", False)),
            timedelta=elapsed,
            finished_at=time.time(),
        )
        emit(frame)
        if frame["valid"] and next_ids:
            await asyncio.gather(*(asyncio.create_task(build(n)) for n in next_ids))

    await asyncio.gather(*(asyncio.create_task(build(v)) for v in first_layer))
    return []


# --- What the host resolved for the run, where lfx reads it in-process -------------------------

#: The display name of the component being built (for errors about what is not bridged).
_component: contextvars.ContextVar[str | None] = contextvars.ContextVar("lfsc_component", default=None)


def _install_host_context(graph: Any, job: dict[str, Any]) -> None:
    """Puts what the host resolved where lfx reads it while the flow runs (the uploaded files
    are placed before the graph is built: ``_place_files``)."""
    if job.get("session_id"):
        graph.session_id = job["session_id"]
    if job.get("run_id"):
        graph.set_run_id(job["run_id"])
    graph.persist_messages = bool(job.get("persist_messages", True))
    if job.get("end_user_id"):
        graph.end_user_id = job["end_user_id"]
    _bridge_variables(job.get("variables") or {})
    memory = job.get("memory")
    if memory is not None:
        # The host runs inside Langflow (it has a message store): its history and messages
        # are bridged, and what needs its database of flows fails naming the component.
        _bridge_memory(graph, memory)
        _track_components()
        _refuse_flow_database()


def _track_components() -> None:
    from lfx.interface.initialize import loading

    original = loading.get_instance_results

    async def tracking(custom_component: Any, custom_params: dict, vertex: Any, **kwargs: Any) -> Any:
        token = _component.set(str(getattr(vertex, "display_name", None) or getattr(vertex, "id", "")))
        try:
            return await original(custom_component, custom_params, vertex, **kwargs)
        finally:
            _component.reset(token)

    loading.get_instance_results = tracking


def _host_error(error: dict[str, Any]) -> Exception:
    """The exception the host's resolution raised, rebuilt with its type name and message."""
    import builtins

    base = getattr(builtins, str(error.get("base") or ""), None)
    if not (isinstance(base, type) and issubclass(base, Exception)):
        base = RuntimeError
    name = str(error.get("type") or base.__name__)
    cls = base if name == base.__name__ else type(name, (base,), {})
    return cls(str(error.get("message") or ""))


def _bridge_variables(variables: dict[str, Any]) -> None:
    """Fields that load from global variables get the values the host resolved (lfx's own
    resolution, run on the host), vertex by vertex, when the vertex builds, as in-process; a
    resolution that raised on the host raises the same error at that moment."""
    if not variables:
        return
    from lfx.interface.initialize import loading

    original = loading.update_params_with_load_from_db_fields

    async def from_host(custom_component: Any, params: dict, load_from_db_fields: Any, **kwargs: Any) -> dict:
        entry = variables.get(getattr(getattr(custom_component, "_vertex", None), "id", None))
        if not isinstance(entry, dict):
            return await original(custom_component, params, load_from_db_fields, **kwargs)
        if entry.get("error"):
            raise _host_error(entry["error"])
        for key in entry.get("drop") or []:
            params.pop(key, None)
        params.update(entry.get("params") or {})
        return params

    loading.update_params_with_load_from_db_fields = from_host


#: Where each uploaded file was put in the guest's storage, and the upload it came as (a message
#: that names the file names the upload, which the host maps back to its own file).
_file_uploads: dict[str, str] = {}


def _place_upload(item: Any) -> Any:
    """An uploaded file moved to its key in the guest's file storage (the host resolved the same
    key in Langflow's storage), as the path a file input gets; any other value as it is."""
    if not isinstance(item, dict):
        return item
    from pathlib import Path, PurePosixPath

    from lfx.services.deps import get_settings_service

    upload, key = str(item.get("upload") or ""), PurePosixPath(str(item.get("key") or ""))
    if not upload or key.is_absolute() or not key.parts or ".." in key.parts:
        msg = f"the host sent an uploaded file with a bad storage key: {key}"
        raise ValueError(msg)
    import shutil

    target = Path(get_settings_service().settings.config_dir).joinpath(*key.parts)
    # Uploads are written under /workspace, where this runner is (read it from here).
    local = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.path.relpath(upload, "/workspace"))
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(local, target)
    _file_uploads[str(target)] = upload
    return str(target)


def _place_files(flow: dict[str, Any], files: dict[str, Any]) -> None:
    """File inputs read the uploaded files the host wrote into this guest, at the paths the
    guest's own storage gives their keys (so lfx's file-access checks hold as on the host): the
    flow's file fields name them before the graph is built, as the host's storage resolved them."""
    if not files:
        return
    data = flow.get("data") if isinstance(flow.get("data"), dict) else flow
    for node in data.get("nodes") or []:
        fields = files.get(node.get("id")) if isinstance(node, dict) else None
        if not fields:
            continue
        template = ((node.get("data") or {}).get("node") or {}).get("template") or {}
        for field, value in fields.items():
            if isinstance(template.get(field), dict):
                placed = [_place_upload(v) for v in value] if isinstance(value, list) else _place_upload(value)
                template[field]["file_path"] = placed


_FLOW_DATABASE = (
    "list_flows",
    "list_flows_by_flow_folder",
    "list_flows_by_folder_id",
    "list_a2a_agents_by_flow_folder",
    "get_flow_by_id_or_name",
    "load_flow",
)


def _refuse_flow_database() -> None:
    """What reads Langflow's database of flows (Run Flow, Sub Flow, flows as tools) fails
    naming the component, instead of finding no flows."""
    import lfx.helpers
    import lfx.helpers.flow

    def refusal(name: str) -> Any:
        async def refuse(*_args: Any, **_kwargs: Any) -> Any:
            raise RuntimeError(
                f"{_component.get() or 'a component'}: {name}() needs Langflow's database of flows, "
                "which a flow run by the CreateOS executor (LANGFLOW_EXECUTOR_KIND=createos) cannot "
                "reach from its guest; run this flow in-process"
            )

        return refuse

    for name in _FLOW_DATABASE:
        for module in (lfx.helpers, lfx.helpers.flow):
            if hasattr(module, name):
                setattr(module, name, refusal(name))


#: The fields lfx's message store orders by.
_ORDER_FIELDS = frozenset({"timestamp", "sender", "sender_name", "session_id", "text"})


class _Record:
    """A message in the guest's stand-in store, with the flow and owner it is stored under."""

    def __init__(self, body: dict[str, Any], flow: Any, owner: Any) -> None:
        self.body = body
        self.flow = flow
        self.owner = owner

    def message(self) -> Any:
        return _rebuild_message(self.body)

    def get(self, key: str) -> Any:
        return self.body.get(key)


def _rebuild_message(body: dict[str, Any]) -> Any:
    from lfx.schema.message import Message

    files = body.get("files")
    message = Message.model_validate({**body, "files": []})
    if files:
        message.files = list(files)
    return message


def _dump(message: Any, **kwargs: Any) -> dict[str, Any]:
    body = json.loads(message.model_dump_json(**kwargs))
    if isinstance(body.get("files"), list):
        body["files"] = [_file_uploads.get(f, f) if isinstance(f, str) else f for f in body["files"]]
    return body


class _MemoryBridge:
    """lfx's message store in the guest (``lfx.memory`` dispatches here): it serves the
    session's history the host sent together with the messages stored during the run, with
    the scoping, filters and order of Langflow's store, and sends every write to the host,
    which stores it in Langflow's database."""

    def __init__(self, graph: Any, history: list[dict[str, Any]], note: str | None) -> None:
        from lfx.memory.flow_context import coerce_flow_id, resolve_message_owner_id

        # The host read the history for this flow and this run's message owner.
        flow, owner = coerce_flow_id(graph.flow_id), resolve_message_owner_id(graph)
        self.records: list[_Record] = [_Record(body, flow, owner) for body in history]
        self.note = note
        if note:
            print(f"note: {note}", file=sys.stderr, flush=True)

    # Scoping: Langflow's ``_message_scope``, ``_write_message_scope`` and
    # ``_bound_message_scope``, over the same flow-context variables.
    @staticmethod
    def _scope(flow_id: Any, user_id: Any) -> tuple[Any, Any]:
        from lfx.memory.flow_context import (
            coerce_flow_id,
            get_current_flow_id,
            get_current_message_executor_id,
            get_current_message_owner_id,
            has_current_flow_scope,
        )

        requested_flow = coerce_flow_id(flow_id)
        requested_owner = coerce_flow_id(user_id)
        if has_current_flow_scope():
            graph_flow = coerce_flow_id(get_current_flow_id())
            graph_owner = get_current_message_owner_id()
            if graph_flow is None or graph_owner is None:
                return None, None
            legacy_executor = get_current_message_executor_id()
            owner_matches = (
                user_id is None
                or requested_owner == graph_owner
                or (requested_owner is not None and requested_owner == legacy_executor)
            )
            if (flow_id is not None and requested_flow != graph_flow) or not owner_matches:
                return None, None
            return graph_flow, graph_owner
        return requested_flow, requested_owner

    def _write_scope(self, flow_id: Any, user_id: Any) -> tuple[Any, Any]:
        from lfx.memory.flow_context import coerce_flow_id, has_current_flow_scope

        if not has_current_flow_scope():
            return coerce_flow_id(flow_id), coerce_flow_id(user_id)
        flow, owner = self._scope(flow_id, user_id)
        if flow is None or owner is None:
            msg = "A valid matching flow and message owner are required to store chat history."
            raise ValueError(msg)
        return flow, owner

    def _bound_scope(self) -> tuple[Any, Any] | None:
        from lfx.memory.flow_context import has_current_flow_scope

        if not has_current_flow_scope():
            return None
        flow, owner = self._scope(None, None)
        if flow is None or owner is None:
            msg = "A valid flow and message owner are required for graph message operations."
            raise ValueError(msg)
        return flow, owner

    def _find(self, message_id: Any, scope: tuple[Any, Any] | None) -> _Record | None:
        for record in self.records:
            if str(record.get("id")) == str(message_id) and (
                scope is None or (record.flow, record.owner) == scope
            ):
                return record
        return None

    async def aget_messages(
        self,
        sender: str | None = None,
        sender_name: str | None = None,
        session_id: Any = None,
        context_id: str | None = None,
        order_by: str | None = "timestamp",
        order: str | None = "DESC",
        flow_id: Any = None,
        limit: int | None = None,
        user_id: Any = None,
    ) -> list[Any]:
        flow, owner = self._scope(flow_id, user_id)
        if flow is None or owner is None:
            return []
        rows = [
            r
            for r in self.records
            if not r.get("error")
            and r.flow == flow
            and r.owner == owner
            and (not sender or r.get("sender") == sender)
            and (not sender_name or r.get("sender_name") == sender_name)
            and (not session_id or str(r.get("session_id")) == str(session_id))
            and (not context_id or str(r.get("context_id")) == str(context_id))
        ]
        if order_by:
            if order_by not in _ORDER_FIELDS:
                msg = f"Invalid order_by field: {order_by}"
                raise ValueError(msg)
            rows.sort(key=lambda r: str(r.get(order_by) or ""), reverse=order == "DESC")
        if limit:
            rows = rows[:limit]
        return [r.message() for r in rows]

    async def aadd_messages(
        self, messages: Any, flow_id: Any = None, run_id: Any = None, user_id: Any = None
    ) -> list[Any]:
        if not isinstance(messages, list):
            messages = [messages]
        for message in messages:
            if type(message).__name__ not in ("Message", "ErrorMessage"):
                types = ", ".join(str(type(m)) for m in messages)
                msg = f"The messages must be instances of Message. Found: {types}"
                raise ValueError(msg)
        flow, owner = self._write_scope(flow_id, user_id)
        stored = []
        for message in messages:
            no_content = (
                message.data.get("text") is None and message.text_stream is None and not message.content_blocks
            )
            if no_content or not message.sender or not message.sender_name:
                msg = "The message does not have the required fields (text, sender, sender_name)."
                raise ValueError(msg)
            body = _dump(message)
            body["id"] = str(uuid.uuid4())
            body["flow_id"] = str(flow) if flow else body.get("flow_id")
            if run_id or body.get("run_id"):
                body["run_id"] = str(run_id or body.get("run_id"))
            if not isinstance(body.get("text"), str):
                body["text"] = ""
            self.records.append(_Record(body, flow, owner))
            emit({"frame": "message", "op": "store", "id": body["id"], "message": body})
            stored.append(_rebuild_message(body))
        return stored

    async def aadd_messagetables(self, messages: Any, *_args: Any) -> list[Any]:
        return await self.aadd_messages(messages)

    async def astore_message(
        self, message: Any, flow_id: Any = None, run_id: Any = None, user_id: Any = None
    ) -> list[Any]:
        from lfx.memory.flow_context import has_current_flow_scope, should_persist_messages

        if not message:
            return []
        if not should_persist_messages():
            return [message]
        if not message.session_id or not message.sender or not message.sender_name:
            msg = (
                f"All of session_id, sender, and sender_name must be provided. Session ID: {message.session_id},"
                f" Sender: {message.sender}, Sender Name: {message.sender_name}"
            )
            raise ValueError(msg)
        flow, owner = self._write_scope(flow_id, user_id)
        if getattr(message, "id", None):
            in_graph = has_current_flow_scope()
            original = self._find(message.id, None) if in_graph else None
            copy_from_child = (
                original is not None
                and original.flow is not None
                and original.flow != flow
                and original.owner == owner
            )
            if not copy_from_child:
                try:
                    return await self.aupdate_messages([message])
                except ValueError:
                    if in_graph:
                        raise
        return await self.aadd_messages([message], flow_id=flow, run_id=run_id, user_id=owner)

    async def aupdate_messages(self, messages: Any) -> list[Any]:
        if not isinstance(messages, list):
            messages = [messages]
        scope = self._bound_scope()
        updated = []
        for message in messages:
            record = self._find(getattr(message, "id", None), scope)
            if record is None:
                msg = f"Message with id {getattr(message, 'id', None)} not found"
                raise ValueError(msg)
            updates = _dump(message, exclude_unset=True, exclude_none=True)
            if scope is not None:
                if self._scope(updates.get("flow_id"), updates.get("user_id")) != scope:
                    msg = "Message scope does not match the executing graph."
                    raise ValueError(msg)
                updates.pop("flow_id", None)
                updates.pop("user_id", None)
            updates.pop("id", None)
            record.body = {**record.body, **updates}
            emit({"frame": "message", "op": "update", "id": str(record.get("id")), "message": updates})
            updated.append(record.message())
        return updated

    async def delete_message(self, id_: Any) -> None:
        from lfx.memory.flow_context import should_persist_messages

        if not should_persist_messages():
            return
        record = self._find(id_, self._bound_scope())
        if record is not None:
            self.records.remove(record)
            emit({"frame": "message", "op": "delete", "id": str(id_)})

    async def adelete_messages(
        self, session_id: str | None = None, context_id: str | None = None, *, flow_id: Any = None, user_id: Any = None
    ) -> None:
        if not session_id and not context_id:
            msg = "Either session_id or context_id must be provided to delete messages."
            raise ValueError(msg)
        flow, owner = self._scope(flow_id, user_id)
        if flow is None or owner is None:
            msg = "A valid flow and message owner are required to delete chat history."
            raise ValueError(msg)
        key, value = ("context_id", context_id) if context_id else ("session_id", session_id)
        self.records = [
            r for r in self.records if not (str(r.get(key)) == str(value) and r.flow == flow and r.owner == owner)
        ]
        emit({"frame": "message", "op": "delete_session", "id": "", key: str(value)})

    # The deprecated synchronous spellings.
    def _sync(self, coro: Any) -> Any:
        from lfx.utils.async_helpers import run_until_complete

        return run_until_complete(coro)

    def get_messages(self, *args: Any, **kwargs: Any) -> list[Any]:
        return self._sync(self.aget_messages(*args, **kwargs))

    def store_message(self, *args: Any, **kwargs: Any) -> list[Any]:
        return self._sync(self.astore_message(*args, **kwargs))

    def add_messages(self, *args: Any, **kwargs: Any) -> list[Any]:
        return self._sync(self.aadd_messages(*args, **kwargs))

    def delete_messages(self, *args: Any, **kwargs: Any) -> None:
        return self._sync(self.adelete_messages(*args, **kwargs))


def _bridge_memory(graph: Any, memory: dict[str, Any]) -> None:
    import lfx.memory

    bridge = _MemoryBridge(graph, list(memory.get("history") or []), memory.get("note"))
    lfx.memory._impl = lambda: bridge  # noqa: SLF001 - lfx.memory dispatches through it at each call


async def _main(job: dict[str, Any]) -> int:
    from lfx.graph import Graph

    began = time.monotonic()
    _place_files(job["flow"], job.get("files") or {})
    graph = Graph.from_payload(
        job["flow"],
        flow_id=job.get("flow_id"),
        flow_name=job.get("flow_name"),
        user_id=job.get("user_id"),
    )
    _install_host_context(graph, job)
    emit({"frame": "graph", "rebuild_ms": _ms(time.monotonic() - began)})
    options = job.get("options") or {}
    if isinstance(options.get("playground"), dict):
        outputs = await _run_playground(graph, job, options["playground"])
    elif job.get("mode") == "legacy":
        outputs = await _run_legacy(graph, job, options)
    else:
        outputs = await _run_stream(graph, options)
    emit({"frame": "complete", "outputs": outputs})
    return 0


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


def _run_job(job: dict[str, Any], lfx_version: str, timings: dict[str, int] | None = None) -> int:
    """Runs one job whose lfx is importable: the ``hello`` frame, then the run's frames."""
    hello = {"frame": "hello", "protocol": PROTOCOL, "lfx": lfx_version, "python": sys.version.split()[0]}
    emit({**hello, **(timings or {})})
    try:
        return asyncio.run(_main(job))
    except Exception as exc:  # noqa: BLE001 - reported to the host, which raises it
        traceback.print_exc(file=sys.stderr)
        emit({"frame": "error", "kind": "flow", "type": type(exc).__name__, "message": str(exc)})
        return 1


#: How long a job file that exists but does not parse is waited for before the runner gives
#: up (the host writes it in one upload; a partial file is one still being written).
JOB_PARSE_GRACE = 60.0


def _await_job(job_path: str) -> dict[str, Any] | None:
    """The job document once the host has written it whole: the file parses as one JSON object
    (a prefix of an object never does), or None after reporting a protocol error."""
    delay = 0.002
    unreadable_since: float | None = None
    while True:
        try:
            with open(job_path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        if data:
            try:
                job = json.loads(data)
            except ValueError:
                now = time.monotonic()
                unreadable_since = unreadable_since or now
                if now - unreadable_since > JOB_PARSE_GRACE:
                    emit({"frame": "error", "kind": "protocol", "message": "the job document never parsed"})
                    return None
            else:
                if isinstance(job, dict):
                    return job
                emit({"frame": "error", "kind": "protocol", "message": "the job document is not an object"})
                return None
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


def _read_job(job_path: str, *, wait: bool = False) -> dict[str, Any] | None:
    """The job document (waited for, with ``wait``), or None after reporting a protocol error."""
    if wait:
        job = _await_job(job_path)
        if job is None:
            return None
    else:
        with open(job_path, encoding="utf-8") as f:
            job = json.load(f)
    # It holds the values of the flow's variables: gone before any flow code runs.
    try:
        os.unlink(job_path)
    except OSError:
        pass
    if job.get("protocol") != PROTOCOL:
        emit({"frame": "error", "kind": "protocol", "message": f"runner speaks protocol {PROTOCOL}"})
        return None
    # A domain allowlist's proxy variables (with this run's gateway token): set before anything
    # of the run (an install, the flow) can open a connection, and inherited by subprocesses.
    for key, value in (job.get("env") or {}).items():
        if isinstance(key, str) and isinstance(value, str):
            os.environ[key] = value
    return job


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        return serve(sys.argv[2])
    _take_stdout()
    wait = len(sys.argv) > 2 and sys.argv[1] == "--wait"
    default_job = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lfx_job.json")
    job_path = sys.argv[2] if wait else (sys.argv[1] if len(sys.argv) > 1 else default_job)
    # lfx and the graph machinery first: the host uploads the job meanwhile.
    began = time.monotonic()
    lfx_version = _preloaded()
    preloaded = time.monotonic()
    job = _read_job(job_path, wait=wait)
    if job is None:
        return 2
    timings = {"preload_ms": _ms(preloaded - began), "wait_ms": _ms(time.monotonic() - preloaded)}
    if lfx_version is None:
        # Not in the image: the job says whether to install it (CREATEOS_EXECUTOR_INSTALL_LFX).
        lfx_version = _import_lfx(job)
    if lfx_version is None:
        emit({"frame": "error", "kind": "missing_lfx", "message": "lfx is not installed in the guest"})
        return 3
    return _run_job(job, lfx_version, timings)


# --- Preloaded mode (the executor's warm pool) -----------------------------------------------
#
# ``lfx_runner.py --serve NAME`` is started in a pool guest as a long-lived process, before any
# flow is known. It listens on the abstract Unix socket NAME at once, then imports lfx and the
# graph machinery (the seconds a cold run spends before its first vertex), then answers:
#
# - ``PING``: ``READY <lfx version>`` (or ``NOLFX``, after which it exits), so the pool knows the
#   guest is ready before it hands it out;
# - ``JOB <path>`` with two file descriptors (SCM_RIGHTS): the standard output and error of the
#   exec that ``lfx_handoff.py`` runs for the flow. The runner adopts them as its own and runs the
#   job exactly as a cold runner would, so the host reads the same frames from the same exec
#   stream, under the same guest clock. It then sends ``EXIT <status>`` and exits: one job per
#   guest, as every pool guest is one-shot. If the hand-off process goes away first (its clock
#   expired, or the host stopped the run), the runner exits at once.

EXIT_CLIENT_GONE = 125


def _preloaded(*, strict: bool = False) -> str | None:
    """lfx's version once it and the graph machinery are imported (None when lfx is missing,
    and with ``strict`` when the preload failed: the warm pool then does not use the guest).

    The cyclic garbage collector is paused meanwhile: importing lfx creates hundreds of
    thousands of long-lived objects (modules, classes, pydantic models), and collecting among
    them is most of a second of the import's CPU for nothing. What was built is then moved to
    the permanent generation (``gc.freeze``), so the flow's own collections do not walk it
    either, and the collector runs as usual for the flow.
    """
    import gc

    gc.disable()
    try:
        lfx_version = _import_lfx({})
        if lfx_version is not None:
            try:
                _preload()
            except Exception:  # noqa: BLE001 - the flow's own build (or the pool) reports it
                traceback.print_exc(file=sys.stderr)
                if strict:
                    lfx_version = None
        gc.freeze()
    finally:
        gc.enable()
    return lfx_version


def _preload() -> None:
    """Imports what every flow run needs, off the run's critical path."""
    from lfx.graph import Graph  # noqa: F401
    from lfx.schema.data import Data  # noqa: F401
    from lfx.schema.dataframe import DataFrame  # noqa: F401
    from lfx.schema.message import Message  # noqa: F401

    try:  # the components nearly every flow starts and ends with
        import lfx.components.input_output  # noqa: F401
    except Exception:  # noqa: BLE001 - a template without them still serves
        pass
    # lfx initializes its services and builds some models lazily, at the first graph and the
    # first message: do both once here (nothing runs), so the flow's run does not pay for them.
    Graph.from_payload({"nodes": [], "edges": []})
    _ = Message(text="").text


def _adopt(fds: list[int]) -> None:
    """Makes the hand-off exec's stdout and stderr this process's, and stdin empty."""
    sys.stdout.flush()
    sys.stderr.flush()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(fds[0], 1)
    os.dup2(fds[1], 2)
    for fd in fds:
        os.close(fd)


def _watch(conn: Any) -> None:
    """Exits the process when the hand-off side of ``conn`` closes before the job ended."""
    import threading

    def watch() -> None:
        try:
            data = conn.recv(1)
        except OSError:
            data = b""
        if not data:
            os._exit(EXIT_CLIENT_GONE)

    threading.Thread(target=watch, name="lfx-handoff-watch", daemon=True).start()


def serve(name: str) -> int:
    import socket

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0" + name)
    listener.listen(8)
    lfx_version = _preloaded(strict=True)
    print(f"preloaded runner: lfx {lfx_version or 'missing'}; listening", file=sys.stderr, flush=True)
    while True:
        conn, _ = listener.accept()
        try:
            msg, fds, _flags, _addr = socket.recv_fds(conn, 4096, 2)
        except OSError:
            conn.close()
            continue
        if msg.startswith(b"PING"):
            for fd in fds:
                os.close(fd)
            reply = f"READY {lfx_version}\n" if lfx_version else "NOLFX\n"
            try:
                conn.sendall(reply.encode())
            finally:
                conn.close()
            if lfx_version is None:
                return 3
            continue
        if not msg.startswith(b"JOB ") or len(fds) != 2 or lfx_version is None:
            for fd in fds:
                os.close(fd)
            conn.close()
            continue
        listener.close()
        _adopt(fds)
        _watch(conn)
        _take_stdout()
        job = _read_job(msg[4:].decode("utf-8"))
        code = 2 if job is None else _run_job(job, lfx_version)
        sys.stderr.flush()
        try:
            conn.sendall(f"EXIT {code}\n".encode())
        except OSError:
            pass
        return code


if __name__ == "__main__":
    sys.exit(main())
