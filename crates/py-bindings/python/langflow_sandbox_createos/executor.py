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

Failures raise ``CreateOSUnavailableError`` (nothing ran; for example lfx missing in the guest
image) or ``CreateOSExecutionError`` (infrastructure, timeout, unknown outcome); a flow that
fails in the guest raises the built-in exception it raised there.

What the guest sends is hostile. The native side admits a frame only within the host's bounds
(size, nesting, count of values) and hands it over as Python objects it built itself; this
module rebuilds the tagged lfx values in place, bounds the one conversion that could grow
beyond its input (a ``DataFrame``'s cells), opens no host file a guest ``Message`` names, and
escapes control characters in the names lfx logs. A frame it cannot read fails the run with
``CreateOSExecutionError``.
"""

from __future__ import annotations

import atexit
import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, ClassVar, NamedTuple, TypeVar, cast

from lfx.execution.executor import Executor
from lfx.execution.types import RunComplete, StepResult, Unit

__all__ = ["CreateOSExecutor", "RemoteComponent", "RemoteVertex", "RemoteVertexResult"]

_logger = logging.getLogger("langflow_sandbox_createos")
_shutdown_registered = False
_T = TypeVar("_T")

#: The most cells (rows times the union of their columns) of a ``DataFrame`` rebuilt from a
#: guest: a frame's own bound on values (``MAX_FRAME_VALUES``), so a table of records with
#: disjoint columns cannot grow quadratically on the host.
MAX_DATAFRAME_CELLS = 250_000
#: The longest name (vertex id, display name) kept from a guest frame.
_MAX_NAME_CHARS = 256
#: How much of a conversion failure's text an error quotes.
_MAX_REASON_CHARS = 500
# C0 controls but tab and newline, DEL and C1 controls, shown as ``\xNN`` (the native rule).
_CONTROLS = {c: f"\\x{c:02x}" for c in (*range(0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0))}


def _safe(text: Any, limit: int = _MAX_NAME_CHARS) -> str | None:
    """Guest text fit for a log record or an exception: cut, control characters escaped."""
    if text is None:
        return None
    if not isinstance(text, str):
        text = repr(text)[: limit + 1]
    if len(text) > limit:
        text = text[:limit] + "..."
    return text.translate(_CONTROLS)


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


def _message(body: Any) -> Any:
    from lfx.schema.message import Message

    if not isinstance(body, dict):
        raise TypeError("a tagged Message whose value is not an object")
    body = cast("dict[str, Any]", body)
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


def _tagged(value: Any) -> Any:
    """The lfx object a tagged value stands for, or ``_UNKNOWN_TAG`` for anything else."""
    if not isinstance(value, dict) or "__lfx__" not in value:
        return _UNKNOWN_TAG
    value = cast("dict[str, Any]", value)
    tag = value.get("__lfx__")
    if tag == "Message":
        return _message(value.get("v"))
    if tag == "Data":
        from lfx.schema.data import Data

        return Data.model_validate(value.get("v"))
    if tag == "DataFrame":
        return _dataframe(value.get("v"))
    return _UNKNOWN_TAG


def _decode(value: Any) -> Any:
    """JSON from the guest with its tagged lfx values rebuilt as lfx objects.

    In place (the containers are the native side's fresh objects, so no second tree is built)
    and without recursion.
    """
    rebuilt = _tagged(value)
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
            rebuilt = _tagged(item)
            if rebuilt is not _UNKNOWN_TAG:
                node[key] = rebuilt  # replaces a value: the container keeps its size
            elif isinstance(item, (dict, list)):
                stack.append(item)
    return value


def _result_data(body: dict[str, Any] | None) -> Any:
    from lfx.graph.schema import ResultData

    if body is None:
        return None
    return ResultData.model_validate({**body, "results": _decode(body.get("results"))})


def _vertex_payload(frame: dict[str, Any]) -> RemoteVertexResult:
    result = _result_data(frame.get("result"))
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


def _run_outputs(outputs: list[dict[str, Any]]) -> list[Any]:
    from lfx.graph.schema import RunOutputs

    runs: list[Any] = []
    for ro in outputs:
        results: list[dict[str, Any] | None] = ro.get("outputs") or []
        runs.append(RunOutputs(inputs=_decode(ro.get("inputs") or {}), outputs=[_result_data(rd) for rd in results]))
    return runs


def _rebuilt(kind: str, rebuild: Callable[[Any], _T], data: Any) -> _T:
    """``rebuild(data)``; a failure (the guest sent what the host cannot rebuild) is raised as
    ``CreateOSExecutionError``, not chained: the original text may quote the guest's raw bytes."""
    try:
        return rebuild(data)
    except Exception as exc:  # noqa: BLE001 - anything a hostile frame makes the rebuild raise
        from .exceptions import CreateOSExecutionError

        reason = _safe(f"{type(exc).__name__}: {exc}", _MAX_REASON_CHARS)
        raise CreateOSExecutionError(
            f"the guest sent a {kind} event the host could not read ({reason}); the run was stopped "
            "and the guest destroyed, and the flow may have run"
        ) from None


def _lfx_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lfx")
    except PackageNotFoundError:
        return None


def _register_shutdown() -> None:
    global _shutdown_registered
    if not _shutdown_registered:
        from . import _native

        _shutdown_registered = True
        # lfx run / lfx serve never shut executors down; destroy what is left at exit.
        atexit.register(_native.NativeExecutor().shutdown)


class CreateOSExecutor(Executor):
    """Runs each flow in a fresh CreateOS microVM and streams its vertices back live.

    Stateless: the constructor does nothing (lfx builds one in every process), and all per-run
    state lives in the run's own event stream, so concurrent runs share the instance safely.
    The guest is destroyed when the run completes, fails, or its consumer stops early.
    """

    kind: ClassVar[str] = "createos"

    async def execute(self, unit: Unit) -> AsyncIterator[StepResult | RunComplete]:  # pyright: ignore[reportIncompatibleMethodOverride]
        """Run ``unit`` in a guest: one ``StepResult`` per vertex, then one ``RunComplete``."""
        from lfx.graph.graph.constants import Finish

        from . import _native

        events = _native.NativeExecutor().start(json.dumps(_request(unit)), _lfx_version())
        _register_shutdown()
        try:
            async for kind, data in events:
                if kind == "vertex":
                    yield StepResult(payload=_rebuilt(kind, _vertex_payload, data))
                    continue
                outputs = _rebuilt(kind, _run_outputs, data)
                if events.mode == "stream":
                    yield StepResult(payload=Finish())
                yield RunComplete(outputs=outputs)
                return
        finally:
            await events.aclose()

    def __repr__(self) -> str:
        return "<CreateOSExecutor kind='createos'>"
