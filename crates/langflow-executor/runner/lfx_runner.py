"""Guest runner of the CreateOS whole-flow executor (embedded in langflow-executor).

The host uploads this file next to its job document (``lfx_job.json``) and runs
``python3 -u lfx_runner.py`` under ``timeout(1)``. The runner rebuilds the flow with ``Graph.from_payload``, runs it, and
writes one JSON frame per line to its *original* standard output, which it keeps for itself:
everything else the flow prints (its own ``print``s, subprocesses) goes to standard error, which
the host turns into log lines. Frames, in order:

- ``{"frame": "hello", ...}`` once lfx is importable (versions, for the host's log);
- ``{"frame": "vertex", ...}`` each time a vertex finishes, flushed at once (live);
- ``{"frame": "complete", "outputs": [...]}`` at the end, with the run's ``RunOutputs``
  harvested exactly as ``Graph._run`` does (legacy mode), or ``[]`` (stream mode, as the
  in-process streaming path);
- ``{"frame": "error", "kind": ..., "message": ...}`` instead of ``complete`` when the run
  cannot finish (``missing_lfx``: lfx is not installed; ``flow``: the flow raised).

Values that are lfx objects are tagged ``{"__lfx__": "Message" | "Data" | "DataFrame", "v": ...}``
so the host rebuilds them as the same types. This file speaks the protocol of the host crate it
is embedded in (``PROTOCOL``); both are versioned together.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import traceback
from typing import Any

PROTOCOL = 1
# A vertex result larger than this (serialized), or of more JSON values than this (counted as
# the host counts them), is replaced by a note, so a flow's own vertex frames stay well inside
# the host's bounds on a frame (16 MiB, 250,000 values), which refuse the whole run; the
# terminal frame is never cut. The host enforces its bounds itself: these are a courtesy.
MAX_VERTEX_RESULT_BYTES = 4 * 1024 * 1024
MAX_VERTEX_RESULT_VALUES = 200_000
# What the host counts for an object tagged ``__lfx__`` on top of its own value.
TAGGED_VALUE_WEIGHT = 32

_frames: Any = None


def _take_stdout() -> None:
    """Keep fd 1 for frames; point fd 1 (and sys.stdout) at stderr for everything else."""
    global _frames
    fd = os.dup(1)  # not inherited by subprocesses (O_CLOEXEC by default)
    _frames = os.fdopen(fd, "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr


def emit(frame: dict[str, Any]) -> None:
    line = json.dumps(frame, default=_fallback, separators=(",", ":"))
    _frames.write(line + "\n")
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
    size = len(json.dumps(encoded, default=_fallback))
    truncated = size > MAX_VERTEX_RESULT_BYTES or _values(encoded, MAX_VERTEX_RESULT_VALUES) > MAX_VERTEX_RESULT_VALUES
    if truncated:
        encoded = None
    return {
        "frame": "vertex",
        "seq": seq,
        "id": vertex.id,
        "display_name": getattr(vertex, "display_name", None),
        "component_display_name": getattr(component, "display_name", None) if component else None,
        "is_output": bool(getattr(vertex, "is_output", False)),
        "valid": bool(valid),
        "result": encoded,
        "result_truncated_bytes": size if truncated else None,
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


async def _main(job: dict[str, Any]) -> int:
    from lfx.graph import Graph

    graph = Graph.from_payload(
        job["flow"],
        flow_id=job.get("flow_id"),
        flow_name=job.get("flow_name"),
        user_id=job.get("user_id"),
    )
    options = job.get("options") or {}
    if job.get("mode") == "legacy":
        outputs = await _run_legacy(graph, job, options)
    else:
        outputs = await _run_stream(graph, options)
    emit({"frame": "complete", "outputs": outputs})
    return 0


def _run_job(job: dict[str, Any], lfx_version: str) -> int:
    """Runs one job whose lfx is importable: the ``hello`` frame, then the run's frames."""
    emit({"frame": "hello", "protocol": PROTOCOL, "lfx": lfx_version, "python": sys.version.split()[0]})
    try:
        return asyncio.run(_main(job))
    except Exception as exc:  # noqa: BLE001 - reported to the host, which raises it
        traceback.print_exc(file=sys.stderr)
        emit({"frame": "error", "kind": "flow", "type": type(exc).__name__, "message": str(exc)})
        return 1


def _read_job(job_path: str) -> dict[str, Any] | None:
    """The job document, or None after reporting a protocol mismatch."""
    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    if job.get("protocol") != PROTOCOL:
        emit({"frame": "error", "kind": "protocol", "message": f"runner speaks protocol {PROTOCOL}"})
        return None
    return job


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--serve":
        return serve(sys.argv[2])
    _take_stdout()
    job_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "lfx_job.json")
    job = _read_job(job_path)
    if job is None:
        return 2
    lfx_version = _import_lfx(job)
    if lfx_version is None:
        emit({"frame": "error", "kind": "missing_lfx", "message": "lfx is not installed in the guest"})
        return 3
    return _run_job(job, lfx_version)


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
    lfx_version = _import_lfx({})
    if lfx_version is not None:
        try:
            _preload()
        except Exception:  # noqa: BLE001 - reported to the pool, which does not use this guest
            traceback.print_exc(file=sys.stderr)
            lfx_version = None
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
