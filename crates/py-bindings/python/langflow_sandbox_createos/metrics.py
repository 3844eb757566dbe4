"""Metrics and usage records: the native events of this process, exported where Langflow looks.

The extension observes every guest created or destroyed, run finished, control-plane
request, pool hit or miss, admission wait or refusal and orphan sweep (bounded; never a key,
code or output). This module drains what it observed on a thread that holds the GIL and
hands each batch to three sinks, and wraps each run in a span for a fourth:

- **Prometheus**, when ``prometheus_client`` imports (Langflow ships it): ``createos_…``
  families for CreateOS's guests (unchanged) and ``langflow_sandbox_…`` families with a
  ``provider`` label for every other provider's (``provider="opensandbox"``), in its default
  registry, so Langflow's ``LANGFLOW_PROMETHEUS_ENABLED`` endpoint
  shows them. Fed from events, each process counts only its own, so the values are correct
  under ``PROMETHEUS_MULTIPROC_DIR`` (each forked worker writes its own files and the
  multiprocess collector sums them; guests live is a ``livesum`` gauge).
- **OpenTelemetry**, when lfx's observability installed an SDK meter provider: the same
  figures on its ``langflow`` meter (the only scope lfx exports), another provider's points
  with a ``provider`` attribute. Skipped while the Prometheus
  families above are registered and that provider also feeds the Prometheus registry (its
  Prometheus reader), which would show every family twice on one scrape.
- **Usage records**: one per destroyed guest of any provider (its ``provider`` field says
  which) on logger ``langflow_sandbox_createos.usage``
  (INFO, a JSON message, the dict as ``record.usage``) and, when ``CREATEOS_USAGE_LOG=PATH``
  is set, one JSON line appended to that file per guest (one ``write`` with ``O_APPEND``).

- **Spans**, when lfx's observability installed an SDK tracer provider: one span per run
  of every surface (:func:`run_scope`), through lfx's outbound-call span helper, so under
  its ``langflow.observability`` tracer (the only span scope lfx exports besides its web
  and database ones) and with its rules: identifiers only (the surface, the guest's name,
  the outcome), an error's type and never its message.

The extension adds events up by label as they happen (counts and sums), keeping only each
run's duration and each destroyed guest's usage record one by one. A drain takes all of it:
at each Prometheus scrape (a collector registered before the families, which drains and
yields nothing), every :data:`PUMP_SECONDS` from a daemon thread that the first run of a
process starts, at exit, and, in a process forked from the one that imported the extension
(which may end with ``os._exit``, skipping exit handlers), when a run ends with no other run
in flight. A drain costs one step per label set that changed, however many runs it covers,
so the cost per run falls as runs get more frequent instead of growing.
``CREATEOS_METRICS=off`` registers no family and emits nothing through OpenTelemetry (no
metric, no span); usage records are still written.

Fork: a child starts with an empty event queue of its own (the extension's rule), a fresh
drain lock, and restarts the daemon thread lazily on its first drain.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import json
import logging
import os
import threading
import sys
from collections.abc import Callable, Generator, Sequence
from typing import Any, Protocol

from . import _native, logs

__all__ = [
    "ENV_METRICS",
    "ENV_USAGE_LOG",
    "PUMP_SECONDS",
    "RunSpan",
    "SPAN_NAME",
    "USAGE_LOGGER",
    "drain",
    "findings",
    "install",
    "metrics_on",
    "run_scope",
]

ENV_METRICS = "CREATEOS_METRICS"
ENV_USAGE_LOG = "CREATEOS_USAGE_LOG"
USAGE_LOGGER = "langflow_sandbox_createos.usage"
PUMP_SECONDS = 1.0
SPAN_NAME = "createos.sandbox.run"

_RUN_SECONDS_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0)
_OTEL_METER = "langflow"  # lfx.observability.APPLICATION_METER_NAME: the only scope lfx exports

_logger = logging.getLogger("langflow_sandbox_createos")
_usage_logger = logging.getLogger(USAGE_LOGGER)

Tallies = Sequence[tuple[str, str, str, float, str]]
RunSeconds = Sequence[tuple[str, float, str]]
Usages = Sequence[dict[str, Any]]


def metrics_on() -> bool:
    """Whether ``CREATEOS_METRICS`` leaves metrics on (the extension's rule: anything but
    off/0/false/no/disabled)."""
    return _native.metrics_enabled()


def _iso(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, tz=datetime.timezone.utc).isoformat(timespec="milliseconds")


class _Usage:
    """Usage records: the logger and the optional JSON-lines file."""

    def __init__(self) -> None:
        self._warned = False

    @staticmethod
    def wanted() -> bool:
        """Whether a record has anywhere to go (the file, or an enabled logger)."""
        return bool(os.environ.get(ENV_USAGE_LOG)) or _usage_logger.isEnabledFor(logging.INFO)

    def handle(self, usages: Usages) -> None:
        for usage in usages:
            self.record(usage)

    def record(self, usage: dict[str, Any]) -> None:
        path = os.environ.get(ENV_USAGE_LOG)
        if not path and not _usage_logger.isEnabledFor(logging.INFO):
            return
        rec = dict(usage)
        rec["created_at"] = _iso(float(usage["created_at"]))
        rec["destroyed_at"] = _iso(float(usage["destroyed_at"]))
        rec["guest_seconds"] = round(float(usage["guest_seconds"]), 3)
        line = json.dumps(rec, sort_keys=True, separators=(",", ":"))
        _usage_logger.info("%s", line, extra={"usage": rec})
        if path:
            self._append(path, line)

    def _append(self, path: str, line: str) -> None:
        data = (line + "\n").encode()
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                _logger.warning("createos: cannot append usage records to %s=%s (%s)", ENV_USAGE_LOG, path, exc.strerror)


class _DrainOnScrape:
    """Registered before the families: a scrape drains first, so it sees every event."""

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> list[Any]:
        drain()
        return []


class _Families:
    """One set of families: CreateOS's ``createos_…`` (no provider label, as they always were),
    or every other provider's ``langflow_sandbox_…`` with a leading ``provider`` label."""

    def __init__(self, prefix: str, what: str, provider_label: bool) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        p = ["provider"] if provider_label else []
        s = [*p, "surface"]
        self.provider_label = provider_label
        self.live = Gauge(f"{prefix}_guests_live", f"{what} guests alive now.", s, multiprocess_mode="livesum")
        self.created = Counter(f"{prefix}_guests_created", f"{what} guests created.", s)
        self.destroyed = Counter(f"{prefix}_guests_destroyed", f"{what} guests destroyed, by reason.", [*s, "reason"])
        self.runs = Counter(f"{prefix}_runs", "Runs, by outcome.", [*s, "outcome"])
        self.run_seconds = Histogram(
            f"{prefix}_run_seconds", "Seconds from a run's admission to its end.", s, buckets=_RUN_SECONDS_BUCKETS
        )
        self.requests = Counter(
            f"{prefix}_control_requests", f"{what} control-plane requests, by route and status class.", [*p, "route", "status_class"]
        )
        self.pool_hits = Counter(f"{prefix}_pool_hits", "Runs served by a warm-pool guest.", s)
        self.pool_misses = Counter(f"{prefix}_pool_misses", "Runs with a warm pool that got no pooled guest.", s)
        self.waits = Counter(f"{prefix}_admission_waits", "Runs that waited for admission.", s)
        self.wait_seconds = Counter(f"{prefix}_admission_wait_seconds", "Seconds runs waited for admission.", s)
        self.refusals = Counter(f"{prefix}_admission_refusals", "Runs refused at capacity.", s)
        self.orphans = Counter(f"{prefix}_orphans_reaped", "Guests of earlier processes deleted by the orphan sweep.", p)
        self.guest_seconds = Counter(f"{prefix}_guest_seconds", f"Seconds {what} guests lived (the cost figure).", [*s, "shape"])
        if not provider_label:
            for surface in ("backend", "component", "executor"):
                self.live.labels(surface)
        # Labelled children by (family, labels): `labels()` validates and locks on every call,
        # which is most of an event's cost. A child stays valid across fork (its value notices
        # the new pid under PROMETHEUS_MULTIPROC_DIR).
        self._children: dict[tuple[Any, ...], Any] = {}

    def _child(self, family: Any, *labels: str) -> Any:
        key = (family, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = family.labels(*labels)
        return child

    def add(self, kind: str, a: str, b: str, n: float, provider: str) -> bool:
        """Adds one tally; false for a kind these families do not hold."""
        child = self._child
        p = (provider,) if self.provider_label else ()
        if kind == "control_request":
            child(self.requests, *p, a, b).inc(n)
        elif kind == "guest_created":
            child(self.created, *p, a).inc(n)
            child(self.live, *p, a).inc(n)
        elif kind == "guest_destroyed":
            child(self.destroyed, *p, a, b).inc(n)
            child(self.live, *p, a).dec(n)
        elif kind == "guest_adopted":
            child(self.live, *p, a).inc(n)
        elif kind == "guest_let_go":
            child(self.live, *p, a).dec(n)
        elif kind == "guest_seconds":
            child(self.guest_seconds, *p, a, b).inc(n)
        elif kind == "run_finished":
            child(self.runs, *p, a, b).inc(n)
        elif kind == "pool":
            child(self.pool_hits if b == "hit" else self.pool_misses, *p, a).inc(n)
        elif kind == "admission_wait":
            child(self.waits, *p, a).inc(n)
        elif kind == "admission_wait_seconds":
            child(self.wait_seconds, *p, a).inc(n)
        elif kind == "admission_refused":
            child(self.refusals, *p, a).inc(n)
        elif kind == "orphans_reaped":
            (child(self.orphans, *p) if p else self.orphans).inc(n)
        else:
            return False
        return True

    def observe_run(self, surface: str, seconds: float, provider: str) -> None:
        p = (provider,) if self.provider_label else ()
        self._child(self.run_seconds, *p, surface).observe(seconds)


class _Prometheus:
    """The families in ``prometheus_client``'s default registry: CreateOS's ``createos_…``
    (unchanged), every other provider's ``langflow_sandbox_…{provider=…}``, and the
    process-wide ones (the admission store, dropped events)."""

    def __init__(self) -> None:
        from prometheus_client import REGISTRY, Counter

        REGISTRY.register(_DrainOnScrape())  # pyright: ignore[reportArgumentType]
        self.createos = _Families("createos", "CreateOS", provider_label=False)
        self.others = _Families("langflow_sandbox", "Sandbox", provider_label=True)
        self.store = {
            "error": Counter("createos_admission_store_errors", "Admission store calls that failed or timed out."),
            "fallback": Counter(
                "createos_admission_store_fallbacks", "Runs admitted under the per-process cap because the store failed."
            ),
            "lease_lost": Counter(
                "createos_admission_store_leases_lost", "Leases found expired at renewal (the store was away too long)."
            ),
        }
        self.dropped = Counter("createos_events_dropped", "Events the native queue dropped before they were drained.")

    def handle(self, tallies: Tallies, run_seconds: RunSeconds, dropped: int) -> None:
        if dropped:
            self.dropped.inc(dropped)
        for kind, a, b, n, provider in tallies:
            if kind == "admission_store":
                if a in self.store:
                    self.store[a].inc(n)
                continue
            (self.createos if provider == "createos" else self.others).add(kind, a, b, n, provider)
        for surface, seconds, provider in run_seconds:
            (self.createos if provider == "createos" else self.others).observe_run(surface, seconds, provider)


def _sdk_meter_provider() -> Any:
    """lfx's SDK meter provider when one is installed globally, else ``None`` (no import of
    OpenTelemetry when lfx's observability never imported it)."""
    import sys

    if "opentelemetry.sdk.metrics" not in sys.modules:
        return None
    try:
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
    except ImportError:
        return None
    provider = metrics.get_meter_provider()
    return provider if isinstance(provider, MeterProvider) else None


def _feeds_prometheus(provider: Any) -> bool:
    """Whether ``provider`` may have a Prometheus reader (unknown counts as yes)."""
    readers = getattr(provider, "_metric_readers", None)  # the SDK keeps no public list
    if readers is None:
        readers = getattr(getattr(provider, "_sdk_config", None), "metric_readers", None)
    if readers is None:
        return True
    return any(type(r).__name__ == "PrometheusMetricReader" for r in readers)


class _OTel:
    """The same figures on lfx's ``langflow`` meter, once lfx configured a meter provider."""

    def __init__(self, prometheus_registered: bool) -> None:
        self._prometheus = prometheus_registered
        self._provider: Any = None
        self._i: dict[str, Any] = {}
        self._live: dict[str, int] = {}

    def _instruments(self) -> dict[str, Any] | None:
        provider = _sdk_meter_provider()
        if provider is None:
            return None
        if provider is not self._provider:
            self._provider = provider
            self._i = {}
            if self._prometheus and _feeds_prometheus(provider):
                _logger.debug("createos: lfx's meter provider feeds Prometheus, where our families already are; not emitting through OpenTelemetry")
                return None
            m = provider.get_meter(_OTEL_METER)
            self._i = {
                "live": m.create_up_down_counter("createos.guests.live", unit="{guest}", description="CreateOS guests alive now."),
                "created": m.create_counter("createos.guests.created", unit="{guest}", description="CreateOS guests created."),
                "destroyed": m.create_counter("createos.guests.destroyed", unit="{guest}", description="CreateOS guests destroyed, by reason."),
                "runs": m.create_counter("createos.runs", unit="{run}", description="Runs, by outcome."),
                "run_seconds": m.create_histogram(
                    "createos.run.duration",
                    unit="s",
                    description="Seconds from a run's admission to its end.",
                    explicit_bucket_boundaries_advisory=list(_RUN_SECONDS_BUCKETS),
                ),
                "requests": m.create_counter("createos.control.requests", unit="{request}", description="CreateOS control-plane requests."),
                "pool": m.create_counter("createos.pool.uses", unit="{run}", description="Runs with a warm pool, hit or miss."),
                "waits": m.create_counter("createos.admission.waits", unit="{run}", description="Runs that waited for admission."),
                "wait_seconds": m.create_counter("createos.admission.wait_time", unit="s", description="Seconds runs waited for admission."),
                "refusals": m.create_counter("createos.admission.refusals", unit="{run}", description="Runs refused at capacity."),
                "orphans": m.create_counter("createos.orphans.reaped", unit="{guest}", description="Orphaned guests deleted."),
                "store": m.create_counter(
                    "createos.admission.store.events",
                    unit="{event}",
                    description="Admission store errors, fallbacks to the per-process cap and lost leases.",
                ),
                "guest_seconds": m.create_counter("createos.guest.time", unit="s", description="Seconds CreateOS guests lived (the cost figure)."),
            }
        return self._i or None

    def handle(self, tallies: Tallies, run_seconds: RunSeconds) -> None:
        i = self._instruments()
        if i is None:
            return
        for kind, a, b, n, provider in tallies:
            # CreateOS's points as they always were; another provider's carry its name.
            x = {} if provider == "createos" else {"provider": provider}
            if kind == "control_request":
                i["requests"].add(n, {**x, "route": a, "status_class": b})
            elif kind == "guest_created":
                i["created"].add(n, {**x, "surface": a})
                i["live"].add(n, {**x, "surface": a})
            elif kind == "guest_destroyed":
                i["destroyed"].add(n, {**x, "surface": a, "reason": b})
                i["live"].add(-n, {**x, "surface": a})
            elif kind == "guest_adopted":
                i["live"].add(n, {**x, "surface": a})
            elif kind == "guest_let_go":
                i["live"].add(-n, {**x, "surface": a})
            elif kind == "guest_seconds":
                i["guest_seconds"].add(n, {**x, "surface": a, "shape": b})
            elif kind == "run_finished":
                i["runs"].add(n, {**x, "surface": a, "outcome": b})
            elif kind == "pool":
                i["pool"].add(n, {**x, "surface": a, "result": b})
            elif kind == "admission_wait":
                i["waits"].add(n, {**x, "surface": a})
            elif kind == "admission_wait_seconds":
                i["wait_seconds"].add(n, {**x, "surface": a})
            elif kind == "admission_refused":
                i["refusals"].add(n, {**x, "surface": a})
            elif kind == "orphans_reaped":
                i["orphans"].add(n, x)
            elif kind == "admission_store":
                i["store"].add(n, {"event": a})
        for surface, seconds, provider in run_seconds:
            x = {} if provider == "createos" else {"provider": provider}
            i["run_seconds"].record(seconds, {**x, "surface": surface})


class _State:
    """What this interpreter installed; the lock and the pump are per process."""

    def __init__(self) -> None:
        self.installed = False
        self.prometheus: _Prometheus | None = None
        self.otel: _OTel | None = None
        self.spans = False
        self.usage = _Usage()
        self.lock = threading.Lock()
        self.pump_pid: int | None = None
        self.stop = threading.Event()
        self.failed: set[str] = set()
        self.flight_lock = threading.Lock()
        self.in_flight = 0


_state = _State()
_install_lock = threading.Lock()


def _after_fork_in_child() -> None:
    # The parent's locks may have been held by another thread at the fork; its pump thread
    # does not exist here. The events the parent queued are not this process's (the
    # extension gives the child an empty queue).
    global _install_lock
    _install_lock = threading.Lock()
    _state.lock = threading.Lock()
    _state.stop = threading.Event()
    _state.pump_pid = None
    _state.flight_lock = threading.Lock()
    _state.in_flight = 0  # the parent's runs in flight are not this process's


def install() -> None:
    """Start exporting this process's events (idempotent; no thread, no network I/O).

    Registers the Prometheus families (metrics on and ``prometheus_client`` importable) and
    the OpenTelemetry sink (metrics on), asks the extension for events, and drains at exit.
    A failure to register (another copy of these families already there) is logged once and
    leaves Prometheus out; it never fails a run.
    """
    if _state.installed:
        return
    with _install_lock:
        if _state.installed:
            return
        if metrics_on():
            try:
                _state.prometheus = _Prometheus()
            except ImportError:
                _state.prometheus = None
            except ValueError as exc:  # duplicated timeseries: registered by someone else
                _logger.warning("createos: Prometheus metrics not registered (%s)", exc)
            _state.otel = _OTel(prometheus_registered=_state.prometheus is not None)
            _state.spans = True
        _native.enable_events()
        os.register_at_fork(after_in_child=_after_fork_in_child)
        atexit.register(_at_exit)
        _state.installed = True


def findings() -> list[tuple[str, str]]:
    """What the surfaces of a process with this environment export, for ``doctor``: whether
    metrics are on, where Prometheus shows them, OpenTelemetry, the usage records. No I/O."""
    import importlib.util

    lines: list[tuple[str, str]] = []
    if not metrics_on():
        lines.append(("info", f"metrics are off ({ENV_METRICS}={os.environ.get(ENV_METRICS, '')}): no Prometheus family, nothing through OpenTelemetry"))
    elif importlib.util.find_spec("prometheus_client") is None:
        lines.append(("info", "metrics: prometheus_client is not installed, so no Prometheus families (Langflow ships it)"))
    else:
        where = "prometheus_client's default registry: Langflow's endpoint shows them with LANGFLOW_PROMETHEUS_ENABLED=true (port LANGFLOW_PROMETHEUS_PORT, default 9090)"
        multiproc = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        if multiproc:
            where += f"; per-worker files in PROMETHEUS_MULTIPROC_DIR={multiproc}, summed by the multiprocess collector"
        lines.append(("ok", f"metrics: createos_* families exported to {where}"))
    if metrics_on():
        lines.append(("info", "OpenTelemetry: the same figures on lfx's 'langflow' meter when lfx configures a meter provider (OTEL_EXPORTER_OTLP_*), unless that provider feeds the Prometheus registry that already shows them"))
        lines.append(("info", f"spans: one '{SPAN_NAME}' span per run, through lfx's outbound-call span helper, when lfx configures a tracer provider"))
    usage_log = os.environ.get(ENV_USAGE_LOG)
    target = f" and appended as JSON lines to {ENV_USAGE_LOG}={usage_log}" if usage_log else f" ({ENV_USAGE_LOG}=PATH also appends them as JSON lines)"
    lines.append(("info", f"usage records: one per destroyed guest on logger {USAGE_LOGGER} (INFO){target}"))
    return lines


def _guarded(name: str, fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - a sink's failure never fails a run
        if name not in _state.failed:
            _state.failed.add(name)
            _logger.warning("createos: the %s export failed (%s); later failures are not logged", name, type(exc).__name__)


def drain(*, wait: bool = True) -> None:
    """Hand every event queued so far to the sinks. Cheap when nothing is queued. With
    ``wait=False``, returns at once when another thread is draining (it, or the daemon
    thread within a second, takes this caller's events too)."""
    if not _state.installed:
        return
    if not _state.lock.acquire(blocking=wait):
        return
    try:
        _drain_locked()
    finally:
        _state.lock.release()


def _drain_locked() -> None:
    usage = _state.usage
    tallies, run_seconds, usages, dropped = _native.drain_events(usage=usage.wanted())
    if not tallies and not run_seconds and not usages and not dropped:
        return
    prometheus, otel = _state.prometheus, _state.otel
    if prometheus is not None:
        _guarded("Prometheus", lambda: prometheus.handle(tallies, run_seconds, dropped))
    if otel is not None:
        _guarded("OpenTelemetry", lambda: otel.handle(tallies, run_seconds))
    if usages:
        _guarded("usage record", lambda: usage.handle(usages))
    if dropped:
        _logger.warning("createos: %d run durations or usage records were dropped before they were drained", dropped)


def _pump(stop: threading.Event) -> None:
    while not stop.wait(PUMP_SECONDS):
        drain()


def _ensure_pump() -> None:
    pid = os.getpid()
    if _state.pump_pid == pid:
        return
    with _install_lock:
        if _state.pump_pid == pid:
            return
        _state.pump_pid = pid
        thread = threading.Thread(target=_pump, args=(_state.stop,), name="createos-metrics", daemon=True)
        thread.start()


class RunSpan(Protocol):
    """What :func:`run_scope` yields: lfx's span scope, or a stand-in that records nothing."""

    def set_attribute(self, key: str, value: str | int) -> None:
        """Records an identifier or a phase's milliseconds on the span (never code, output or a
        message)."""
        ...

    def record_error(self, error_type: str) -> None:
        """Marks the span failed with ``error_type``, a type name."""
        ...


class _NoSpan:
    """What :func:`run_scope` yields when no span is emitted: takes the same calls, does nothing."""

    __slots__ = ()

    def set_attribute(self, key: str, value: str | int) -> None:
        """Nothing to record on."""

    def record_error(self, error_type: str) -> None:
        """Nothing to record on."""


_NO_SPAN = _NoSpan()


def _span_helper() -> Callable[[str, dict[str, str]], Any] | None:
    """lfx's ``outbound_call_span`` when a span would go somewhere: lfx's observability
    installed an SDK tracer provider (it does when OTLP traces are configured). ``None``
    otherwise, without importing OpenTelemetry."""
    if "opentelemetry.sdk.trace" not in sys.modules:
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from lfx.observability import outbound_call_span
    except ImportError:
        return None
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        return None
    return outbound_call_span


@contextlib.contextmanager
def run_scope(surface: str) -> Generator[RunSpan, None, None]:
    """One run of ``surface``: its span, and in a forked process a drain when it is the last
    run in flight.

    Yields the span's scope: ``set_attribute`` for what the run learns (``createos.guest``,
    ``createos.outcome``), ``record_error`` for a failure reported as a result. The span goes
    through lfx's outbound-call span helper when lfx installed a tracer provider (a stand-in
    that records nothing otherwise, or with metrics off); an exception marks it failed with
    the exception's type, never its message (the helper's rule).

    A process forked from the one that imported the extension (``_native.forked()``: a
    ``multiprocessing`` worker, a pre-fork server's child) commonly ends with ``os._exit``,
    where no exit handler runs: there, a run that ends with no other run in flight drains
    what was observed, so nothing is lost to an exit right after it. Elsewhere the exit
    handler takes the last figures, and a run drains nothing itself: a scrape, the daemon
    thread this starts (within :data:`PUMP_SECONDS`) and the exit do, each covering many
    runs for about the cost of one.
    """
    # Each run's INFO line must reach `lfx run -v` (see logs.py).
    logs.route_to_lfx()
    if not _state.installed:
        yield _NO_SPAN
        return
    with _state.flight_lock:
        _state.in_flight += 1
    try:
        with _span(surface) as scope:
            yield scope
    finally:
        with _state.flight_lock:
            _state.in_flight = max(0, _state.in_flight - 1)
            idle = _state.in_flight == 0
        _ensure_pump()
        if idle and _native.forked():
            drain()


@contextlib.contextmanager
def _span(surface: str) -> Generator[RunSpan, None, None]:
    helper = _span_helper() if _state.spans else None
    if helper is None:
        yield _NO_SPAN
        return
    stopped: GeneratorExit | None = None
    with helper(SPAN_NAME, {"createos.surface": surface}) as scope:
        span = _SpanScope(scope)
        try:
            yield span
        except GeneratorExit as exc:
            # The executor's consumer stopped reading (after the end, or early: its guest is
            # destroyed all the same, and the native side reports `stopped`): not a failed call.
            stopped = exc
    if stopped is not None:
        raise stopped


class _SpanScope:
    """lfx's span scope, as a run's code sees it."""

    __slots__ = ("scope",)

    def __init__(self, scope: Any) -> None:
        self.scope = scope

    def set_attribute(self, key: str, value: str | int) -> None:
        """Records an identifier (or a phase's milliseconds) on the span."""
        self.scope.set_attribute(key, value)

    def record_error(self, error_type: str) -> None:
        """Marks the span failed with ``error_type`` (a type name, never a message)."""
        self.scope.record_error(error_type)


def _at_exit() -> None:
    _state.stop.set()
    drain()
