"""Metrics and usage records (issue 20): what an operator's Prometheus scrape and usage log show.

Each test runs the surfaces in a fresh interpreter (the Prometheus registry is per process)
against the fake, then compares our ``createos_…`` families, read from
``prometheus_client.REGISTRY`` the way a scrape reads them, with the fake's own counters, and
checks the usage records (one per destroyed guest) for their fields and for the absence of the
key, the code and the output.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from conftest import E2E, Fake, backend_env, run_doctor, run_python

pytest.importorskip("prometheus_client", reason="prometheus_client is not installed (scripts/test installs it)")

SLOW = E2E / "flows" / "slow_flow.json"
SHOUT = E2E / "flows" / "shout_flow.json"
CODE_MARKER = "CODE-MARKER-7f3a"
OUTPUT_MARKER = "OUTPUT-MARKER-91c2"
SESSION_ID = "chat-session-5d1e"

# Read by every script: the families as a scrape sees them (collecting drains first), and the
# usage records the logger received (``record.usage``).
COMMON = """
import json, logging, os, sys
from prometheus_client import REGISTRY, generate_latest

usage_records = []

class Keep(logging.Handler):
    def emit(self, record):
        usage_records.append((record.getMessage(), getattr(record, "usage", None)))

_usage = logging.getLogger("langflow_sandbox_createos.usage")
_usage.setLevel(logging.INFO)
_usage.addHandler(Keep())

def families():
    out = {}
    for metric in REGISTRY.collect():
        for s in metric.samples:
            if s.name.startswith("createos_"):
                out.setdefault(s.name, []).append([s.labels, s.value])
    return out

def report():
    print("FAMILIES " + json.dumps(families()), flush=True)
    print("SCRAPE " + json.dumps(generate_latest().decode()), flush=True)
    print("USAGE " + json.dumps(usage_records), flush=True)
"""


def run_script(script: str, env: dict[str, str], timeout: float = 240) -> dict[str, Any]:
    proc = run_python(COMMON + script, env, timeout=timeout)
    out: dict[str, Any] = {"stdout": proc.stdout, "stderr": proc.stderr}
    for line in proc.stdout.splitlines():
        for tag in ("FAMILIES", "SCRAPE", "USAGE", "RESULT"):
            if line.startswith(tag + " "):
                out[tag] = json.loads(line.removeprefix(tag + " "))
    assert proc.returncode == 0 and "FAMILIES" in out, (proc.stdout[-3000:], proc.stderr[-3000:])
    return out


def value(families: dict[str, Any], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when none)."""
    return sum(v for got, v in families.get(name, []) if all(got.get(k) == x for k, x in labels.items()))


def usage_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


FIELDS = {
    "provider",
    "surface",
    "guest",
    "flow_id",
    "node_id",
    "session_hash",
    "shape",
    "rootfs",
    "egress",
    "created_at",
    "destroyed_at",
    "guest_seconds",
    "runs",
    "outcome",
    "bytes_returned",
    "reason",
    "worker",
    "host",
}


def assert_nothing_secret(text: str, key: str) -> None:
    for needle in (key, CODE_MARKER, OUTPUT_MARKER, SESSION_ID):
        assert needle not in text, needle


def assert_matches_fake(fam: dict[str, Any], stats: dict[str, Any], surface: str, *, kept_idle: int = 0) -> None:
    """Our families against the fake's counts: creates, deletes, live, control requests.
    ``kept_idle``: kept guests released alive, live on the account but held by no process (the
    live gauge counts the guests a process holds, so the workers' sum never double-counts)."""
    assert value(fam, "createos_guests_created_total", surface=surface) == stats["created"]
    assert value(fam, "createos_guests_destroyed_total", surface=surface) == stats["requests"].get("delete", 0)
    assert value(fam, "createos_guests_live", surface=surface) == stats["live"] - kept_idle
    for route in ("create", "delete", "exec_stream"):
        assert value(fam, "createos_control_requests_total", route=route) == stats["requests"].get(route, 0), route


BACKEND_RUNS = f"""
from langflow_sandbox_createos.backend import create_backend
backend = create_backend()
ok = backend.run("print('{OUTPUT_MARKER}')  # {CODE_MARKER}")
failed = backend.run("import sys\\nsys.exit(3)")
print("RESULT " + json.dumps([ok.stdout.strip(), failed.exit_code]), flush=True)
backend.shutdown()
report()
"""


def test_backend_runs_show_in_prometheus_as_the_fake_counted_them(clean_fake: Fake, tmp_path: Path) -> None:
    usage_log = tmp_path / "usage.jsonl"
    out = run_script(BACKEND_RUNS, backend_env(clean_fake, CREATEOS_USAGE_LOG=str(usage_log)))
    assert out["RESULT"] == [OUTPUT_MARKER, 3]
    stats = clean_fake.wait_settled()
    fam = out["FAMILIES"]
    assert stats["created"] == 2
    assert_matches_fake(fam, stats, "backend")
    assert value(fam, "createos_runs_total", surface="backend", outcome="ok") == 1
    assert value(fam, "createos_runs_total", surface="backend", outcome="program_failed") == 1
    assert value(fam, "createos_run_seconds_count", surface="backend") == 2
    assert value(fam, "createos_guest_seconds_total", surface="backend") > 0
    scrape = out["SCRAPE"]
    assert 'createos_guests_live{surface="backend"} 0.0' in scrape
    assert_nothing_secret(scrape, clean_fake.key)

    # One record per destroyed guest, in the log file and on the logger, the same records.
    records = usage_lines(usage_log)
    assert len(records) == 2, records
    assert sorted(r["outcome"] for r in records) == ["ok", "program_failed"]
    for r in records:
        assert set(r) == FIELDS
        assert r["surface"] == "backend" and r["reason"] == "run-end" and r["runs"] == 1
        assert r["guest"].startswith("lf-") and r["shape"] and r["rootfs"] and r["egress"] == "none"
        assert r["created_at"].endswith("+00:00") and r["created_at"] <= r["destroyed_at"]
        assert r["guest_seconds"] >= 0 and r["flow_id"] is None and r["session_hash"] is None
    ok = next(r for r in records if r["outcome"] == "ok")
    assert ok["bytes_returned"] >= len(OUTPUT_MARKER)
    logged = out["USAGE"]
    assert [json.loads(message) for message, _ in logged] == records
    assert [extra for _, extra in logged] == records
    assert_nothing_secret(usage_log.read_text() + json.dumps(logged), clean_fake.key)


def test_warm_pool_guests_are_counted_and_recorded_too(clean_fake: Fake, tmp_path: Path) -> None:
    usage_log = tmp_path / "usage.jsonl"
    env = backend_env(clean_fake, CREATEOS_SANDBOX_WARM_POOL="1", CREATEOS_USAGE_LOG=str(usage_log))
    script = """
import time
from langflow_sandbox_createos.backend import create_backend
backend = create_backend()
for _ in range(3):
    backend.run("print(1)")
    time.sleep(1.0)  # the pool refills between runs
backend.shutdown()
report()
"""
    out = run_script(script, env)
    stats = clean_fake.wait_settled()
    fam = out["FAMILIES"]
    assert_matches_fake(fam, stats, "backend")
    hits = value(fam, "createos_pool_hits_total", surface="backend")
    misses = value(fam, "createos_pool_misses_total", surface="backend")
    assert hits >= 1 and hits + misses == 3, (hits, misses)
    # Every guest the fake created has a record, the idle pooled one's included (it served no
    # run: no outcome).
    records = usage_lines(usage_log)
    assert len(records) == stats["created"], (records, stats)
    assert sorted({r["guest"] for r in records}) == sorted(r["guest"] for r in records)
    idle = [r for r in records if r["runs"] == 0]
    assert idle and all(r["outcome"] is None and r["reason"] in ("shutdown", "pool-retire") for r in idle), idle
    assert sum(r["runs"] for r in records) == 3


def component_inputs(**overrides: Any) -> dict[str, Any]:
    inputs: dict[str, Any] = {
        "flow_id": "flow-metrics-1",
        "session_id": SESSION_ID,
        "component_id": "createos_sandbox-abc12",
        "python_code": f"print('{OUTPUT_MARKER}')  # {CODE_MARKER}",
        "command": "",
        "session_mode": "off",
        "collect_artifacts": False,
        "allow_network": False,
        "allowed_domains": "",
        "timeout_seconds": 30,
        "shape": "",
    }
    inputs.update(overrides)
    return inputs


def test_component_runs_fresh_and_kept_guests_are_counted_and_recorded(clean_fake: Fake, tmp_path: Path) -> None:
    usage_log = tmp_path / "usage.jsonl"
    env = backend_env(
        clean_fake, LANGFLOW_SANDBOX_BACKEND=None, LANGFLOW_SANDBOX_BACKEND_PLUGINS=None, CREATEOS_USAGE_LOG=str(usage_log)
    )
    kept = component_inputs(session_mode="session")
    script = f"""
from langflow_sandbox_createos import node
node.run(**{component_inputs()!r})
node.run(**{kept!r})
node.run(**{kept!r})
print("RESULT " + json.dumps(os.getpid()), flush=True)
report()
"""
    out = run_script(script, env)
    stats = clean_fake.wait_for(lambda s: s["live"] == 1)
    fam = out["FAMILIES"]
    # One fresh guest (destroyed) and one kept guest (created, alive, reused once).
    assert stats["created"] == 2
    assert_matches_fake(fam, stats, "component", kept_idle=1)
    assert value(fam, "createos_runs_total", surface="component", outcome="ok") == 3
    records = usage_lines(usage_log)
    assert len(records) == 1, records
    (fresh,) = records
    assert set(fresh) == FIELDS
    assert fresh["worker"] == out["RESULT"] and fresh["host"], fresh
    assert fresh["surface"] == "component" and fresh["flow_id"] == "flow-metrics-1"
    assert fresh["node_id"] == "createos_sandbox-abc12"
    expected = hashlib.sha256(b"langflow-sandbox-createos/session\0" + SESSION_ID.encode()).hexdigest()[:16]
    assert fresh["session_hash"] == expected
    assert_nothing_secret(usage_log.read_text() + out["SCRAPE"], clean_fake.key)

    # A later process destroys the kept guest (its exec's outcome is unknown: a broken
    # stream): the destroy is counted and recorded by the process that destroyed it.
    clean_fake.set_faults("exec_stream=reset-after#1")
    script = f"""
from langflow_sandbox_createos import node
from langflow_sandbox_createos.exceptions import CreateOSError
try:
    node.run(**{kept!r})
except CreateOSError as exc:
    print("RESULT " + json.dumps(type(exc).__name__), flush=True)
report()
"""
    out = run_script(script, env)
    assert "RESULT" in out, out["stdout"][-2000:]
    stats = clean_fake.wait_for(lambda s: s["live"] == 0)
    fam = out["FAMILIES"]
    assert value(fam, "createos_guests_destroyed_total", surface="component") == 1
    assert value(fam, "createos_runs_total", surface="component", outcome="may_have_run") == 1
    records = usage_lines(usage_log)
    assert len(records) == 2, records
    kept_record = records[1]
    assert kept_record["guest"].startswith("lf-c-") and not fresh["guest"].startswith("lf-c-")
    assert kept_record["outcome"] == "may_have_run" and kept_record["reason"] == "error"
    assert kept_record["session_hash"] == expected


def executor_env(fake: Fake, **extra: str) -> dict[str, str]:
    """The whole-flow executor selected alone: the backend and its egress opt-in unset."""
    return backend_env(
        fake,
        LANGFLOW_SANDBOX_BACKEND=None,
        LANGFLOW_SANDBOX_BACKEND_PLUGINS=None,
        LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS=None,
        LANGFLOW_EXECUTOR_KIND="createos",
        **extra,
    )


def test_an_executor_flow_that_times_out_is_counted_timed_out(clean_fake: Fake, tmp_path: Path) -> None:
    usage_log = tmp_path / "usage.jsonl"
    env = executor_env(clean_fake, CREATEOS_EXECUTOR_TIMEOUT_SECONDS="20", CREATEOS_USAGE_LOG=str(usage_log))
    # The slow flow's Slow node, made to sleep past the flow's 20 s timeout.
    slower = tmp_path / "slower_flow.json"
    text = SLOW.read_text()
    assert text.count("time.sleep(2)") == 1
    slower.write_text(text.replace("time.sleep(2)", "time.sleep(120)"))
    script = f"""
import asyncio
from lfx.graph import Graph

async def main(path, text):
    graph = Graph.from_payload(json.load(open(path)))
    try:
        await graph.arun([{{"input_value": text}}])
        return "finished"
    except Exception as exc:
        return type(exc).__name__

print("RESULT " + json.dumps(asyncio.run(main({str(SHOUT)!r}, "fine"))), flush=True)
print("RESULT " + json.dumps(asyncio.run(main({str(slower)!r}, "too slow"))), flush=True)
report()
"""
    out = run_script(script, env, timeout=300)
    stats = clean_fake.wait_settled()
    fam = out["FAMILIES"]
    assert stats["created"] == 2
    assert_matches_fake(fam, stats, "executor")
    assert value(fam, "createos_runs_total", surface="executor", outcome="ok") == 1
    assert value(fam, "createos_runs_total", surface="executor", outcome="timed_out") == 1, fam.get("createos_runs_total")
    assert value(fam, "createos_runs_total", surface="executor", outcome="program_failed") == 0
    records = sorted(usage_lines(usage_log), key=lambda r: r["outcome"])
    assert [(r["outcome"], r["reason"]) for r in records] == [("ok", "run-end"), ("timed_out", "timeout")]
    assert all(r["surface"] == "executor" for r in records)


FORKED_WORKERS = """
from langflow_sandbox_createos.backend import create_backend
backend = create_backend()
pids = []
for n in range(2):
    pid = os.fork()
    if pid == 0:
        try:
            for _ in range(n + 1):
                backend.run("print('w')")
        finally:
            os._exit(0)
    pids.append(pid)
for pid in pids:
    os.waitpid(pid, 0)
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
registry = CollectorRegistry()
MultiProcessCollector(registry)
summed = {}
for metric in registry.collect():
    for s in metric.samples:
        if s.name.startswith("createos_"):
            summed.setdefault(s.name, []).append([s.labels, s.value])
print("RESULT " + json.dumps(summed), flush=True)
report()
"""


def test_two_forked_workers_sum_in_the_multiprocess_collector(clean_fake: Fake, tmp_path: Path) -> None:
    multiproc = tmp_path / "prom"
    multiproc.mkdir()
    env = backend_env(clean_fake, PROMETHEUS_MULTIPROC_DIR=str(multiproc))
    out = run_script(FORKED_WORKERS, env)
    stats = clean_fake.wait_settled()
    summed = out["RESULT"]
    # Worker 0 ran once, worker 1 twice: the multiprocess view is their sum.
    assert stats["created"] == 3
    assert value(summed, "createos_guests_created_total", surface="backend") == 3
    assert value(summed, "createos_runs_total", surface="backend", outcome="ok") == 3
    assert value(summed, "createos_guests_live", surface="backend") == 0
    assert value(summed, "createos_guests_destroyed_total", surface="backend") == stats["requests"]["delete"]
    # Each worker wrote its own files.
    assert len(list(multiproc.glob("counter_*.db"))) >= 2


def test_metrics_off_registers_nothing_and_still_records_usage(clean_fake: Fake, tmp_path: Path) -> None:
    usage_log = tmp_path / "usage.jsonl"
    env = backend_env(clean_fake, CREATEOS_METRICS="off", CREATEOS_USAGE_LOG=str(usage_log))
    out = run_script(BACKEND_RUNS, env)
    assert out["FAMILIES"] == {}
    assert "createos_" not in out["SCRAPE"]
    assert len(usage_lines(usage_log)) == 2


def test_usage_records_reach_the_logger_without_a_usage_log(clean_fake: Fake) -> None:
    env = backend_env(clean_fake)
    env.pop("CREATEOS_USAGE_LOG", None)
    out = run_script(BACKEND_RUNS, env)
    # Without the file, the records still reach the logger, one per guest.
    assert [json.loads(message)["surface"] for message, _ in out["USAGE"]] == ["backend", "backend"]


OTEL = """
from opentelemetry import metrics as otel_metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
reader = InMemoryMetricReader()
otel_metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
from langflow_sandbox_createos.backend import create_backend
backend = create_backend()
backend.run("print('x')")
backend.shutdown()
from langflow_sandbox_createos import metrics
metrics.drain()
seen = {}
for rm in reader.get_metrics_data().resource_metrics:
    for sm in rm.scope_metrics:
        for m in sm.metrics:
            for p in m.data.data_points:
                key = sm.scope.name + " " + m.name
                seen[key] = seen.get(key, 0) + (getattr(p, "value", None) or getattr(p, "count", 0))
print("RESULT " + json.dumps(seen), flush=True)
report()
"""


def test_opentelemetry_gets_the_figures_on_lfxs_langflow_meter(clean_fake: Fake) -> None:
    pytest.importorskip("opentelemetry.sdk.metrics", reason="opentelemetry-sdk is not installed")
    out = run_script(OTEL, backend_env(clean_fake))
    seen = out["RESULT"]
    assert seen["langflow createos.guests.created"] == 1
    assert seen["langflow createos.guests.destroyed"] == 1
    assert seen["langflow createos.runs"] == 1
    assert seen.get("langflow createos.guests.live", 0) == 0
    assert all(key.startswith("langflow ") for key in seen), seen


# An SDK tracer provider as lfx's observability installs one, with an in-memory exporter.
SPANS = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

def spans():
    return [
        {"name": s.name, "scope": s.instrumentation_scope.name, "status": s.status.status_code.name,
         "attributes": dict(s.attributes)}
        for s in exporter.get_finished_spans()
    ]
"""

SPAN_RUNS = SPANS + f"""
from langflow_sandbox_createos import node
from langflow_sandbox_createos.backend import create_backend
from langflow_sandbox_createos.exceptions import CreateOSError
backend = create_backend()
backend.run("print('{OUTPUT_MARKER}')  # {CODE_MARKER}")
backend.run("import sys; sys.exit(3)")
os.environ["CREATEOS_CONTROL_PLANE_RETRY_SECONDS"] = "0"  # out of range: the run is refused
try:
    backend.run("print(1)")
except CreateOSError as exc:
    print("REFUSED " + type(exc).__name__, flush=True)
del os.environ["CREATEOS_CONTROL_PLANE_RETRY_SECONDS"]
node.run(**COMPONENT_INPUTS)
backend.shutdown()
print("RESULT " + json.dumps(spans()), flush=True)
report()
"""


def test_each_run_is_a_span_through_lfxs_outbound_call_helper(clean_fake: Fake) -> None:
    pytest.importorskip("opentelemetry.sdk.trace", reason="opentelemetry-sdk is not installed")
    from lfx import observability

    env = backend_env(clean_fake, LANGFLOW_SANDBOX_BACKEND_PLUGINS=None)
    out = run_script(f"COMPONENT_INPUTS = {component_inputs()!r}\n" + SPAN_RUNS, env)
    assert "REFUSED SandboxRefusedError" in out["stdout"], out["stdout"][-2000:]
    spans = out["RESULT"]
    assert [s["name"] for s in spans] == ["createos.sandbox.run"] * 4, spans
    # The tracer lfx's helper uses, the one span scope lfx's export filter lets through.
    assert {s["scope"] for s in spans} == {observability.APPLICATION_TRACER_NAME}
    assert observability.APPLICATION_TRACER_NAME in observability.exported_span_scopes()
    ok, failed, refused, component = (s["attributes"] for s in spans)
    assert ok["createos.surface"] == "backend" and ok["createos.outcome"] == "ok"
    assert ok["createos.guest"].startswith("lf-")
    assert failed["createos.outcome"] == "program_failed"
    assert [s["status"] for s in spans] == ["UNSET", "UNSET", "ERROR", "UNSET"]
    assert refused["error.type"] == "SandboxRefusedError" and "createos.outcome" not in refused
    assert component["createos.surface"] == "component" and component["createos.outcome"] == "ok"
    assert component["createos.guest"].startswith("lf-")
    assert_nothing_secret(json.dumps(spans), clean_fake.key)


def test_an_executor_run_is_a_span_and_metrics_off_emits_none(clean_fake: Fake) -> None:
    pytest.importorskip("opentelemetry.sdk.trace", reason="opentelemetry-sdk is not installed")
    script = SPANS + f"""
import asyncio
from lfx.graph import Graph

async def main():
    graph = Graph.from_payload(json.load(open({str(SHOUT)!r})))
    await graph.arun([{{"input_value": "fine"}}])

asyncio.run(main())
print("RESULT " + json.dumps(spans()), flush=True)
report()
"""
    env = executor_env(clean_fake)
    ours = [s for s in run_script(script, env)["RESULT"] if s["name"] == "createos.sandbox.run"]
    assert [(s["attributes"]["createos.surface"], s["attributes"].get("createos.outcome"), s["status"]) for s in ours] == [
        ("executor", "ok", "UNSET")
    ], ours
    off = [s for s in run_script(script, {**env, "CREATEOS_METRICS": "off"})["RESULT"] if s["name"] == "createos.sandbox.run"]
    assert off == []
    assert clean_fake.wait_settled()["created"] == 2


def test_no_family_is_registered_twice_in_a_process(clean_fake: Fake) -> None:
    script = """
from langflow_sandbox_createos import metrics
metrics.install(); metrics.install()
import langflow_sandbox_createos.node
from langflow_sandbox_createos.backend import create_backend
create_backend(); create_backend()
report()
"""
    out = run_script(script, backend_env(clean_fake))
    assert "not registered" not in out["stderr"], out["stderr"][-2000:]
    assert value(out["FAMILIES"], "createos_guests_live") == 0


def test_doctor_says_whether_and_where_metrics_are_exported(clean_fake: Fake, tmp_path: Path) -> None:
    multiproc = tmp_path / "prom"
    on = run_doctor(backend_env(clean_fake, PROMETHEUS_MULTIPROC_DIR=str(multiproc), CREATEOS_USAGE_LOG=str(tmp_path / "u.jsonl")))
    assert "Metrics and usage records" in on.stdout, on.stdout[-3000:]
    assert "createos_* families exported to prometheus_client's default registry" in on.stdout
    assert f"PROMETHEUS_MULTIPROC_DIR={multiproc}" in on.stdout
    assert f"CREATEOS_USAGE_LOG={tmp_path / 'u.jsonl'}" in on.stdout
    assert "one 'createos.sandbox.run' span per run" in on.stdout
    off = run_doctor(backend_env(clean_fake, CREATEOS_METRICS="off"))
    assert "metrics are off (CREATEOS_METRICS=off)" in off.stdout, off.stdout[-3000:]
    assert "families exported" not in off.stdout


FORK_QUEUE = """
from lfx.utils.sandbox.base import _sandbox_settings
from langflow_sandbox_createos import _native
_native.enable_events()
native = _native.NativeBackend()
native.run("print(1)", None, _sandbox_settings())  # queued, not drained
r, w = os.pipe()
pid = os.fork()
def created(tallies):
    return sum(n for kind, _, _, n, _ in tallies if kind == "guest_created")
if pid == 0:
    inherited = _native.drain_events()
    native.run("print(2)", None, _sandbox_settings())
    own = _native.drain_events()
    os.write(w, json.dumps([sum(map(len, inherited[:3])) + inherited[3], created(own[0]), len(own[1])]).encode())
    os._exit(0)
os.waitpid(pid, 0)
child = json.loads(os.read(r, 1000))
parent = _native.drain_events()
print("RESULT " + json.dumps({"child": child, "parent_created": created(parent[0]), "parent_runs": len(parent[1])}), flush=True)
native.shutdown()
report()
"""


def test_a_forked_child_starts_with_an_empty_event_queue_of_its_own(clean_fake: Fake) -> None:
    out = run_script(FORK_QUEUE, backend_env(clean_fake))
    # The parent's undrained events stay the parent's; the child sees only its own guest.
    assert out["RESULT"] == {"child": [0, 1, 1], "parent_created": 1, "parent_runs": 1}, out["RESULT"]
    assert clean_fake.wait_settled()["created"] == 2
