"""Type stubs for the native extension ``langflow_sandbox_createos._native``.

Failures are raised as the classes of ``langflow_sandbox_createos.exceptions``
(``SandboxRefusedError`` / ``SandboxFailedError``), which this module does not define.
"""

from collections.abc import Awaitable, Sequence
from typing import Any, ClassVar, Final, Protocol, final

__all__ = [
    "__version__",
    "LOGGER_NAME",
    "OUTPUT_PIECE_BYTES",
    "NativeBackend",
    "NativeOpenSandboxBackend",
    "NativeCapabilities",
    "RunResult",
    "Output",
    "Timings",
    "ReapReport",
    "capabilities",
    "opensandbox_capabilities",
    "opensandbox_isolation_refusal",
    "opensandbox_reap",
    "counters",
    "forked",
    "enable_events",
    "drain_events",
    "metrics_enabled",
    "reap",
    "doctor",
    "_emit_log_records",
    "_hold_log_queue",
    "outside_line",
    "NativeComponent",
    "ComponentRun",
    "ReusedReapReport",
    "describe_component",
    "COMPONENT_DESCRIPTION",
    "reap_reused",
    "NativeExecutor",
    "FlowEvents",
    "FlowWake",
    "template_plan",
    "template_build",
    "gateway_main",
]

__version__: str
LOGGER_NAME: str
OUTPUT_PIECE_BYTES: Final = 448
"""Largest piece, in UTF-8 bytes, that iterating an :class:`Output` yields."""

class _SandboxSettings(Protocol):
    """The fields of lfx's ``_SandboxSettings`` that a run reads."""

    @property
    def timeout_seconds(self) -> int: ...
    @property
    def memory_mb(self) -> int: ...
    @property
    def allow_network(self) -> bool: ...
    @property
    def allowed_domains(self) -> tuple[str, ...]: ...

@final
class NativeCapabilities:
    """What the backend declares to lfx's policy gate."""

    @property
    def isolation(self) -> str: ...
    @property
    def supports_deny_all_egress(self) -> bool: ...
    @property
    def supports_domain_allowlist(self) -> bool: ...
    @property
    def max_timeout_seconds(self) -> int | None: ...

@final
class Timings:
    """Where the time of one run went, in milliseconds."""

    @property
    def create_ms(self) -> int: ...
    @property
    def upload_ms(self) -> int: ...
    @property
    def exec_ms(self) -> int: ...
    @property
    def destroy_ms(self) -> int | None: ...
    @property
    def total_ms(self) -> int: ...
    @property
    def requests(self) -> int: ...

@final
class Output:
    """One stream of a run's output, taken once as ``str`` pieces.

    Each piece is whole characters, at most ``OUTPUT_PIECE_BYTES`` bytes of UTF-8. Its
    native memory is released as it is taken; ``backend.output_text`` joins them without
    holding the stream twice.
    """

    def __iter__(self) -> Output: ...
    def __next__(self) -> str: ...
    @property
    def nbytes(self) -> int:
        """Bytes of text the stream held when the run finished."""

@final
class RunResult:
    """The outcome of one run."""

    @property
    def stdout(self) -> Output: ...
    @property
    def stderr(self) -> Output: ...
    @property
    def exit_code(self) -> int: ...
    @property
    def execution_time_ms(self) -> int: ...
    @property
    def stdout_truncated(self) -> bool: ...
    @property
    def stderr_truncated(self) -> bool: ...
    @property
    def guest(self) -> str: ...
    @property
    def outcome(self) -> str:
        """How the run went, as the metrics count it: ``ok``, ``program_failed`` or
        ``timed_out``."""
    @property
    def timings(self) -> Timings: ...

@final
class NativeBackend:
    """One backend per process; builds its runtime and connections on first use."""

    def __init__(self) -> None: ...
    def run(
        self,
        code: str,
        env: dict[str, str] | None,
        settings: _SandboxSettings,
    ) -> RunResult:
        """Run ``code`` in a fresh guest; blocks with the GIL released, Ctrl-C interrupts.

        Raises ``SandboxRefusedError`` (nothing ran) or ``SandboxFailedError``.
        """
    def shutdown(self) -> None:
        """Destroy this process's live guests. Idempotent."""
    def reset_after_fork(self) -> None:
        """Drop state inherited from a parent process."""

def capabilities() -> NativeCapabilities:
    """The backend's capabilities (a secret given as a file is read from it). No network I/O."""

@final
class NativeOpenSandboxBackend:
    """The OpenSandbox backend of one process; builds its runtime and client on first use."""

    def __init__(self) -> None: ...
    def run(
        self,
        code: str,
        env: dict[str, str] | None,
        settings: _SandboxSettings,
    ) -> RunResult:
        """Run ``code`` in a fresh OpenSandbox sandbox; blocks with the GIL released.

        Raises ``SandboxRefusedError`` (nothing ran) or ``SandboxFailedError``.
        """
    def shutdown(self) -> None:
        """Delete the sandboxes of runs still in flight and forget the backend. Idempotent."""
    def reset_after_fork(self) -> None:
        """Drop state inherited from a parent process."""

def opensandbox_capabilities() -> NativeCapabilities:
    """The OpenSandbox backend's capabilities under the environment (a secret given as a file is
    read from it). No network I/O."""

def opensandbox_isolation_refusal() -> str | None:
    """Why lfx's backend seam would refuse the OpenSandbox backend (its isolation is not
    attested), naming the settings; ``None`` when it is attested. No network I/O."""

def opensandbox_reap(older_than_seconds: float = 1800.0, dry_run: bool = False) -> list[str]:
    """Delete (or with ``dry_run`` list) this deployment's OpenSandbox sandboxes older than
    ``older_than_seconds``; returns their ids. Blocks with the GIL released.

    Raises ``SandboxRefusedError`` (settings) or ``SandboxFailedError`` (listing).
    """

def counters() -> list[tuple[str, dict[str, str], float]]:
    """This process's native totals: ``(family, labels, value)`` for every ``createos_*``
    figure (guests created, destroyed and live by surface; runs by outcome; control-plane
    requests; pool hits and misses; admission waits and refusals; orphans reaped;
    guest-seconds by surface and shape) of CreateOS's guests; the same figures of another
    provider's guests as ``langflow_sandbox_*`` with a ``provider`` label (e.g.
    ``langflow_sandbox_runs_total``, ``provider="opensandbox"``); plus ``createos_admission_live`` and
    ``createos_admission_waiting``; the admission store's ``createos_admission_store_errors_total``,
    ``createos_admission_store_fallbacks_total`` and ``createos_admission_store_leases_lost_total``;
    and once a run named a store ``createos_admission_store_leases_held`` and
    ``createos_admission_deployment_refusals_total``. A forked child's are its own. No I/O."""

def forked() -> bool:
    """Whether this process was forked from the one that imported the extension (such a
    process commonly ends with ``os._exit``, which skips exit handlers). No I/O."""

def doctor(
    lfx: _SandboxSettings | None,
    lfx_problems: list[tuple[str | None, str]],
    surfaces: list[str],
    paths: list[tuple[str, str]],
    exports: list[tuple[str, str]],
    env_guard: tuple[bool, str] | None = None,
) -> tuple[int, str, str]:
    """Check the deployment without creating a guest: ``(exit_code, report, report_as_json)``.

    ``lfx`` is lfx's ``_SandboxSettings``, or ``None`` when lfx could not build its settings
    service, and ``lfx_problems`` then says why as ``(setting, message)`` pairs. ``surfaces``
    names the surfaces to check (``backend``, ``component``, ``executor``, ``opensandbox``; empty: the enabled
    ones). ``paths`` and ``exports`` are ``(level, text)`` findings (which Langflow paths reach
    the executor; metrics and usage records). ``env_guard`` is ``env_fallback.status()``:
    whether lfx's env-var deny-list covers this package's names in this process, and how; each
    secret setting's source (its variable or its ``_FILE``) is reported, and one in the
    environment warns unless that deny-list covers it. Progress goes to stderr; every wait is bounded
    and the GIL is released. Raises ``ValueError`` for an unknown surface and
    ``SandboxFailedError`` for an internal failure only.
    """

def enable_events() -> None:
    """Start queueing this process's observation events (and its forked children's) for
    ``drain_events()``. Idempotent; no thread, no I/O."""

def metrics_enabled() -> bool:
    """Whether ``CREATEOS_METRICS`` leaves metrics and spans on: ``off``, ``0``, ``false``,
    ``no`` or ``disabled`` (any case) turn them off, anything else (unset included) leaves
    them on. Read from the environment now; no I/O."""

def drain_events(
    usage: bool = True,
) -> tuple[list[tuple[str, str, str, float, str]], list[tuple[str, float, str]], list[dict[str, Any]], int]:
    """What this process observed since the last call, added up: ``(tallies, run_seconds,
    usages, dropped)``. ``tallies``: one ``(kind, label, label, value, provider)`` per family,
    labels and provider (``createos``, ``opensandbox``) that changed: ``("guest_created", surface, "", n)``, ``("guest_destroyed", surface,
    reason, n)``, ``("guest_adopted", surface, "", n)`` and ``("guest_let_go", surface, "",
    n)`` (a kept guest of another process held here, and one released alive: with created
    and destroyed they make the live gauge), ``("guest_seconds", surface, shape, seconds)``, ``("run_finished", surface,
    outcome, n)``, ``("control_request", route, status_class, n)``, ``("pool", surface,
    "hit" | "miss", n)``, ``("admission_wait", surface, "", n)``,
    ``("admission_wait_seconds", surface, "", seconds)``, ``("admission_refused", surface,
    "", n)``, ``("orphans_reaped", "", "", n)``, ``("admission_store", "error" | "fallback" |
    "lease_lost", "", n)``. ``run_seconds``: ``(surface, seconds, provider)`` per
    run, oldest first. ``usages``: with ``usage=True``, a dict per destroyed guest, oldest
    first (``surface``, ``guest``, ``flow_id``, ``node_id``, ``session_hash``, ``shape``,
    ``rootfs``, ``egress``, ``created_at`` and ``destroyed_at`` (Unix seconds),
    ``guest_seconds``, ``runs``, ``outcome``, ``bytes_returned``, ``reason``, ``worker``
    (the pid that held it), ``host`` and ``provider``); with
    ``usage=False`` they are discarded. ``dropped``: run durations and usage records dropped
    meanwhile (each list holds 65 536; counts never drop). Empty before ``enable_events()``;
    a forked child starts empty. Never a key, code or output."""

@final
class ReapReport:
    """What ``reap()`` did."""

    @property
    def dry_run(self) -> bool:
        """Nothing was deleted; ``deleted`` lists what would have been."""
    @property
    def examined(self) -> int:
        """``lf-`` guests the listing returned, in any status."""
    @property
    def deleted(self) -> list[tuple[str, str]]:
        """``(name, id)`` of each orphan deleted (or, in a dry run, that would be)."""
    @property
    def failed(self) -> list[tuple[str, str, str]]:
        """``(name, id, error)`` of each orphan that could not be deleted."""

def reap(dry_run: bool = False) -> ReapReport:
    """Delete orphaned guests (one-shot ``lf-`` guests found paused), or only list them.

    Reads the ``CREATEOS_*`` settings; blocks with the GIL released; Ctrl-C interrupts. Raises
    ``SandboxRefusedError`` when the key is missing or rejected and
    ``SandboxFailedError`` when the listing fails.
    """

def _emit_log_records(count: int, message: str) -> None:
    """Diagnostic: emit ``count`` INFO records from this thread (GIL released), then forward them.

    The fork-safety test logs heavily with it from one thread while another forks.
    """

def _hold_log_queue(seconds: float) -> None:
    """Diagnostic: hold the log queue for ``seconds`` (at most 60) on this thread, GIL released.

    The fork-safety test forks meanwhile, so that the child inherits the queue locked.
    """

def outside_line(text: str, limit: int) -> str:
    """Outside text (a guest's names and messages, a store's reply) as the host shows it: at most
    ``limit`` bytes, on one line, with every control, line-break (LF, CR, NEL, U+2028, U+2029) and
    bidirectional character written as a visible escape."""
    ...

@final
class ComponentRun:
    """One execution of the CreateOS Sandbox node, as plain values."""

    @property
    def results(self) -> dict[str, Any]:
        """The Results output: ``result``, ``stderr``, ``exit_code``, ``timed_out``,
        ``sandbox_id``, ``sandbox_name``, ``provider`` (``createos`` or ``opensandbox``: where the
        guest ran), ``reused_guest``, ``kept_guest``, ``artifact_count``, ``stdout_truncated``,
        ``stderr_truncated``, ``timings``, ``notes``, and ``error`` when the program failed."""
    @property
    def files(self) -> list[dict[str, Any]]:
        """The Files output: one ``{path, size, text, base64}`` dict per returned file."""
    @property
    def outcome(self) -> str:
        """How the run went, as the metrics count it: ``ok``, ``program_failed`` or
        ``timed_out``."""

@final
class NativeComponent:
    """The CreateOS Sandbox node's native half; the component belongs to the calling process."""

    def __init__(self) -> None: ...
    def run(
        self,
        *,
        flow_id: str,
        component_id: str,
        python_code: str,
        command: str,
        session_mode: str,
        collect_artifacts: bool,
        allow_network: bool,
        timeout_seconds: int,
        shape: str,
        session_id: str | None = None,
        allowed_domains: str = ...,
        invocation: Sequence[str] = ...,
        accept_egress_exceptions: bool = False,
        provider: str = "createos",
    ) -> ComponentRun:
        """Run one execution; blocks with the GIL released, Ctrl-C interrupts.

        ``invocation`` is the process's command line (``sys.argv``): under ``lfx run`` of a flow
        exported from Langflow, Guest Reuse takes the flow's id from the file it names.
        ``accept_egress_exceptions`` is the node's Accept Link-Local Egress: with Allow Network
        off, the run accepts that 169.254.0.0/16 stays reachable (as the operator's
        ``LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS=true`` does for every node).
        ``provider`` is the node's Provider (``createos`` or ``opensandbox``, any case).

        Raises ``SandboxRefusedError`` (nothing ran) or ``SandboxFailedError``.
        """
    def shutdown(self) -> None:
        """Destroy this process's fresh guests (reused guests are kept). Idempotent."""

def describe_component(
    allow_network: bool, session_mode: str, accept_egress_exceptions: bool = False, provider: str = "createos"
) -> str:
    """The policy a run with these inputs gets on ``provider`` (``createos`` or ``opensandbox``):
    where it runs, the effective network policy and the reuse mode."""

#: The node's static description on the canvas (never a policy: the status shows the run's).
COMPONENT_DESCRIPTION: str

@final
class ReusedReapReport:
    """What ``reap_reused()`` did."""

    @property
    def dry_run(self) -> bool:
        """Nothing was deleted; ``deleted`` lists what would have been."""
    @property
    def older_than_seconds(self) -> float:
        """The age limit."""
    @property
    def deleted(self) -> list[tuple[str, str, float]]:
        """``(name, id, age_seconds)`` of each reused guest deleted (or that would be)."""
    @property
    def kept(self) -> list[tuple[str, str, float | None]]:
        """``(name, id, age_seconds or None)`` of each reused guest left alone."""
    @property
    def failed(self) -> list[tuple[str, str, str]]:
        """``(name, id, error)`` of each reused guest that could not be deleted."""

def reap_reused(older_than: str, dry_run: bool = False, provider: str = "createos") -> ReusedReapReport:
    """Delete reused component guests (``lf-c-``) at least ``older_than`` old, or list them.

    ``older_than`` is an age such as ``90s``, ``30m``, ``1h``, ``2d`` or a number of seconds.
    ``provider`` is ``createos`` (the ``CREATEOS_*`` settings) or ``opensandbox`` (the
    ``OPEN_SANDBOX_*`` settings; the kept sandboxes are found by their ``lf-name`` label).

    Raises ``SandboxRefusedError`` when the key is missing or rejected and
    ``SandboxFailedError`` when the listing fails.
    """

@final
class FlowEvents:
    """The events of one flow run: ``(kind, value)`` pairs, ``kind`` ``"vertex"`` (the vertex
    frame, a ``dict``), ``"message"`` (a chat message the flow stored, updated or deleted: the
    message frame, a ``dict``) or ``"complete"`` (the run's outputs, a ``list``), built from the
    JSON the guest sent once it passed the host's bounds.

    An async iterator whose awaitables complete on the running asyncio loop. Raises the run's
    failure (``SandboxRefusedError``, ``SandboxFailedError``, or the flow's own
    exception) from ``__anext__``.
    """

    def __aiter__(self) -> FlowEvents: ...
    def __anext__(self) -> Awaitable[tuple[str, Any]]: ...
    def aclose(self) -> Awaitable[None]:
        """Stop the run; the awaitable completes once its guest is destroyed. Idempotent."""
    @property
    def mode(self) -> str:
        """``"legacy"`` (``Graph.arun``) or ``"stream"`` (``lfx run``, ``lfx serve``, Loop)."""
    def supply(self, request: str) -> None:
        """Hand the run the rest of its JSON request (the flow, inputs, options and what the
        host resolved); its job is uploaded once it is there. Raises ``SandboxFailedError``
        for a malformed request (the run then ends, its guest destroyed) or a second call."""
    @property
    def outcome(self) -> str | None:
        """How the run ended, as its span reports it (``ok``, ``program_failed``,
        ``timed_out``, ``refused``, ``may_have_run``, or ``stopped`` when the consumer stopped
        reading before the end), decided by the native side; ``None`` until it ended."""
    @property
    def timings(self) -> dict[str, int | None]:
        """Milliseconds per phase of the run so far (``None``: not reached); complete once the
        run ended: ``plan_ms``, ``files_ms``, ``open_ms``, ``acquire_ms``, ``dispatch_ms``,
        ``host_context_ms``, ``job_ms``, ``runner_ready_ms``, ``guest_preload_ms``,
        ``guest_wait_ms``, ``rebuild_ms``, ``first_event_ms``, ``total_ms`` (and, always ``None``
        for a flow run, the other phases every surface's timings share: ``upload_ms``,
        ``exec_ms``, ``destroy_ms``, ``requests``)."""

@final
class FlowWake:
    """Internal: the event-loop callback that completes a ``FlowEvents`` awaitable."""

    def __call__(self, *args: object, **kwargs: object) -> None: ...

@final
class NativeExecutor:
    """The whole-flow executor of this process; builds its runtime and connections on first use."""

    HISTORY_MESSAGES: ClassVar[int]
    """The most chat-history messages of the run's session a run sends to its guest."""

    def __new__(cls, provider: str = "createos") -> NativeExecutor:
        """The executor on ``provider`` (``createos`` or ``opensandbox``); any other name raises
        ``ValueError``."""
    def start(self, head: str, lfx_version: str | None = None) -> FlowEvents:
        """Start a flow run from its JSON head (``flow_id``, ``session_id``, ``options``,
        ``files``); its guest is created, and its runner starts importing lfx, in the
        background, and :meth:`FlowEvents.supply` hands it the rest of the request.

        Raises ``SandboxFailedError`` for a malformed head; every other failure is raised
        by the events.
        """
    def shutdown(self) -> None:
        """Destroy the guests of this process's flow runs and its warm pool (bounded)."""
    def pool_stats(self) -> dict[str, int]:
        """The warm pool's counters (``size``, ``ready``, ``filling``, ``hits``, ``misses``,
        ``discarded``, ``refill_failures``); all 0 before the first run."""

def template_plan(requirements: list[str], lfx_version: str, name: str | None = None) -> tuple[str, str]:
    """``(name, dockerfile)`` of a template with ``lfx==lfx_version`` and ``requirements``. No I/O.

    Raises ``SandboxRefusedError`` for a requirement that is not a plain specifier.
    """

def template_build(name: str, dockerfile: str) -> str:
    """Build the template, printing its build log to stderr; return its id once ready.

    Blocks with the GIL released; Ctrl-C interrupts. Raises ``SandboxRefusedError``
    (missing or rejected key) or ``SandboxFailedError`` (the build failed).
    """

def gateway_main(argv: list[str]) -> int:
    """Run the egress gateway with the command-line arguments ``argv`` (those after ``gateway``).

    Blocks with the GIL released until a signal handler raises (Ctrl-C: ``KeyboardInterrupt``,
    which propagates after the gateway stops accepting) or the gateway fails to start. Returns the
    exit status: 0 after ``--help`` or ``--version``, 2 for a usage or start-up error (printed to
    stderr). The shared secret comes from ``CREATEOS_GATEWAY_SECRET`` and is never printed.
    """
