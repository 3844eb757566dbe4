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
"""

from __future__ import annotations

import atexit
import json
import logging
from collections.abc import AsyncIterator
from typing import Any, ClassVar, NamedTuple, cast

from lfx.execution.executor import Executor
from lfx.execution.types import RunComplete, StepResult, Unit

__all__ = ["CreateOSExecutor", "RemoteComponent", "RemoteVertex", "RemoteVertexResult"]

_logger = logging.getLogger("langflow_sandbox_createos")
_shutdown_registered = False


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


def _decode(value: Any) -> Any:
    """JSON from the guest with its tagged lfx values rebuilt as lfx objects."""
    if isinstance(value, list):
        return [_decode(v) for v in cast("list[Any]", value)]
    if not isinstance(value, dict):
        return value
    value = cast("dict[str, Any]", value)
    tag = value.get("__lfx__")
    if tag == "Message":
        from lfx.schema.message import Message

        return Message.model_validate(value["v"])
    if tag == "Data":
        from lfx.schema.data import Data

        return Data.model_validate(value["v"])
    if tag == "DataFrame":
        from lfx.schema.dataframe import DataFrame

        return DataFrame(value["v"])
    return {k: _decode(v) for k, v in value.items()}


def _result_data(body: dict[str, Any] | None) -> Any:
    from lfx.graph.schema import ResultData

    if body is None:
        return None
    return ResultData.model_validate({**body, "results": _decode(body.get("results"))})


def _vertex_payload(frame: dict[str, Any]) -> RemoteVertexResult:
    result = _result_data(frame.get("result"))
    vertex = RemoteVertex(
        frame["id"],
        frame.get("display_name"),
        frame.get("component_display_name"),
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
            async for kind, body in events:
                data = json.loads(body)
                if kind == "vertex":
                    yield StepResult(payload=_vertex_payload(data))
                    continue
                if events.mode == "stream":
                    yield StepResult(payload=Finish())
                yield RunComplete(outputs=_run_outputs(data))
                return
        finally:
            await events.aclose()

    def __repr__(self) -> str:
        return "<CreateOSExecutor kind='createos'>"
