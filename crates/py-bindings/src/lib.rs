//! `langflow_sandbox_createos._native`: the `PyO3` extension behind the wheel.
//!
//! The Python package is glue: it builds lfx's own dataclasses and exceptions from what this
//! module returns. Everything else happens here or below, in `langflow-backend`:
//!
//! - one tokio runtime per process, built lazily and rebuilt after `fork()` ([`runtime`]);
//! - a [`NativeBackend`] that owns one `langflow_backend::Backend` per process id, so a forked
//!   child gets a fresh backend (and connection pool) while the parent's is untouched;
//! - blocking calls that release the GIL and stay interruptible by Ctrl-C ([`wait`]), which
//!   still destroy the guest of an interrupted run;
//! - `tracing` events forwarded to Python's `logging` from the waiting thread only
//!   ([`logbridge`]).
//!
//! Importing the module starts no thread and does no I/O.

mod logbridge;
mod runtime;
mod sigterm;
mod wait;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use langflow_backend::{
    Backend, BackendError, BackendOptions, DoctorLevel, DoctorLine, DoctorReport, LfxPolicy, Piece,
    RunOutput, SweepReport, Text,
};
use pyo3::create_exception;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::wait::{Task, Waited, block_bounded, wait};

create_exception!(
    _native,
    CreateOSError,
    PyRuntimeError,
    "Base class of the errors raised by the native extension."
);
create_exception!(
    _native,
    Unavailable,
    CreateOSError,
    "The backend is configured but cannot be used, or the policy cannot be honoured. \
     Nothing ran. The package turns it into lfx's `SandboxUnavailableError`."
);
create_exception!(
    _native,
    ExecutionFailed,
    CreateOSError,
    "The infrastructure failed during a run. The package turns it into lfx's \
     `SandboxExecutionError`."
);

/// Time allowed, after Ctrl-C, for the interrupted run's guest to be destroyed.
const INTERRUPT_CLEANUP: Duration = Duration::from_secs(15);
/// Time allowed, in a forked child, for a run's guest to be destroyed before `run()`
/// returns, whatever the run's outcome.
const FORKED_CLEANUP: Duration = Duration::from_secs(15);
/// Time allowed for `shutdown()` to destroy every live guest.
const SHUTDOWN_BUDGET: Duration = Duration::from_secs(30);
/// Id of the process that imported the extension. A process with another id was forked
/// from it: such children commonly end with `os._exit` (multiprocessing, pre-fork servers),
/// which skips `atexit`, so they destroy each guest before `run()` returns instead of in the
/// background.
static IMPORTED_BY: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

/// Public module path, used as `__module__` of the classes and exceptions.
const MODULE: &str = "langflow_sandbox_createos._native";

/// What the backend declares to lfx's policy gate. Built without I/O.
#[pyclass(frozen, get_all, module = "langflow_sandbox_createos._native")]
pub struct NativeCapabilities {
    /// Isolation class; lfx accepts only `"hardware-virtualized"`.
    isolation: String,
    /// Whether `LANGFLOW_SANDBOX_ALLOW_NETWORK=false` can be honoured.
    supports_deny_all_egress: bool,
    /// Whether `LANGFLOW_SANDBOX_ALLOWED_DOMAINS` can be honoured.
    supports_domain_allowlist: bool,
    /// Largest timeout the backend accepts, or `None` for no cap.
    max_timeout_seconds: Option<u32>,
}

#[pymethods]
impl NativeCapabilities {
    fn __repr__(&self) -> String {
        format!(
            "NativeCapabilities(isolation={:?}, supports_deny_all_egress={}, \
             supports_domain_allowlist={}, max_timeout_seconds={:?})",
            self.isolation,
            py_bool(self.supports_deny_all_egress),
            py_bool(self.supports_domain_allowlist),
            self.max_timeout_seconds
        )
    }
}

fn py_bool(value: bool) -> &'static str {
    if value { "True" } else { "False" }
}

/// Returns the backend's capabilities. No I/O, no thread.
#[pyfunction]
fn capabilities() -> NativeCapabilities {
    let caps = langflow_backend::capabilities();
    NativeCapabilities {
        isolation: caps.isolation.to_owned(),
        supports_deny_all_egress: caps.supports_deny_all_egress,
        supports_domain_allowlist: caps.supports_domain_allowlist,
        max_timeout_seconds: caps.max_timeout_seconds,
    }
}

/// Where the time of one run went, in milliseconds.
#[pyclass(frozen, get_all, module = "langflow_sandbox_createos._native")]
#[derive(Clone)]
pub struct Timings {
    /// Creating the guest (until it runs).
    create_ms: u64,
    /// Uploading the program.
    upload_ms: u64,
    /// Executing it.
    exec_ms: u64,
    /// Destroying the guest; `None` when the destroy was handed to the background reaper.
    destroy_ms: Option<u64>,
    /// The whole run.
    total_ms: u64,
    /// Control-plane requests made on the run's critical path.
    requests: u32,
}

#[pymethods]
impl Timings {
    fn __repr__(&self) -> String {
        format!(
            "Timings(create_ms={}, upload_ms={}, exec_ms={}, destroy_ms={}, total_ms={}, requests={})",
            self.create_ms,
            self.upload_ms,
            self.exec_ms,
            self.destroy_ms
                .map_or_else(|| "None".to_owned(), |ms| ms.to_string()),
            self.total_ms,
            self.requests
        )
    }
}

/// Largest `str` handed to Python per step when an [`Output`] is taken apart: small enough
/// that the step's temporary `str` costs little, large enough that there are few steps.
const STEP_BYTES: usize = 448;

/// One stream of a run's output, handed to Python as an iterator of `str` pieces.
///
/// The pieces' Rust memory is released as each one is taken, and the package joins them with
/// `+=`, which CPython performs in place on a `str` nobody else holds. So a capped stream
/// (1 MiB by default) exists about once in memory while it becomes one Python `str`, never
/// twice as a copy from one whole buffer to another would need.
#[pyclass(frozen, module = "langflow_sandbox_createos._native")]
pub struct Output {
    /// What is left to hand over: the text, and the piece being handed over with how many of
    /// its bytes already were. Locked only for one step, always with the GIL held.
    rest: Mutex<(Text, Option<(Piece, usize)>)>,
    /// Bytes of text at the start.
    len: usize,
}

impl Output {
    fn new(text: Text) -> Self {
        Self {
            len: text.len(),
            rest: Mutex::new((text, None)),
        }
    }
}

#[pymethods]
impl Output {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// The next piece: at most `STEP_BYTES` bytes, always whole characters.
    fn __next__<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyString>> {
        let mut rest = self.rest.lock().unwrap_or_else(PoisonError::into_inner);
        let (text, current) = &mut *rest;
        loop {
            if current.is_none() {
                *current = Some((text.next()?, 0));
            }
            let (piece, offset) = current.as_mut()?;
            let bytes = piece.as_bytes();
            if *offset < bytes.len() {
                let mut end = (*offset + STEP_BYTES).min(bytes.len());
                // Back off to a character start (a piece is whole UTF-8 characters).
                while end < bytes.len() && (bytes[end] & 0b1100_0000) == 0b1000_0000 {
                    end -= 1;
                }
                let step = PyString::new(py, &String::from_utf8_lossy(&bytes[*offset..end]));
                *offset = end;
                return Some(step);
            }
            // This piece is done: dropping it returns its memory.
            *current = None;
        }
    }

    /// Bytes of text the stream held when the run finished.
    #[getter]
    fn nbytes(&self) -> usize {
        self.len
    }

    fn __repr__(&self) -> String {
        format!("Output(nbytes={})", self.len)
    }
}

/// The outcome of one run: what the guest printed and how it exited.
#[pyclass(frozen, get_all, module = "langflow_sandbox_createos._native")]
pub struct RunResult {
    /// Standard output (capped; see `stdout_truncated`), to be taken once piece by piece.
    stdout: Py<Output>,
    /// Standard error (capped; see `stderr_truncated`), likewise.
    stderr: Py<Output>,
    /// Exit code; `-1` means timed out, `137` killed (usually out of memory).
    exit_code: i32,
    /// Wall time of the run as lfx reports it.
    execution_time_ms: u64,
    /// Whether stdout went over the per-stream cap.
    stdout_truncated: bool,
    /// Whether stderr went over the per-stream cap.
    stderr_truncated: bool,
    /// Name of the guest that ran the code (already destroyed).
    guest: String,
    /// Where the time went.
    timings: Timings,
}

#[pymethods]
impl RunResult {
    fn __repr__(&self) -> String {
        format!(
            "RunResult(exit_code={}, stdout_len={}, stderr_len={}, guest={:?}, timings={})",
            self.exit_code,
            self.stdout.get().len,
            self.stderr.get().len,
            self.guest,
            self.timings.__repr__()
        )
    }
}

impl RunResult {
    fn new(py: Python<'_>, out: RunOutput) -> PyResult<Self> {
        Ok(Self {
            stdout: Py::new(py, Output::new(out.stdout))?,
            stderr: Py::new(py, Output::new(out.stderr))?,
            exit_code: out.exit_code,
            execution_time_ms: out.execution_time_ms,
            stdout_truncated: out.stdout_truncated,
            stderr_truncated: out.stderr_truncated,
            guest: out.guest,
            timings: Timings {
                create_ms: out.timings.create_ms,
                upload_ms: out.timings.upload_ms,
                exec_ms: out.timings.exec_ms,
                destroy_ms: out.timings.destroy_ms,
                total_ms: out.timings.total_ms,
                requests: out.timings.requests,
            },
        })
    }
}

fn to_py_err(err: BackendError) -> PyErr {
    match err {
        BackendError::Unavailable(message) => Unavailable::new_err(message),
        BackendError::Execution(message) => ExecutionFailed::new_err(message),
    }
}

/// Reads lfx's `_SandboxSettings` into the policy the backend enforces. A value that does not
/// fit is a configuration the backend cannot honour, so it refuses (fail closed).
fn policy_from(settings: &Bound<'_, PyAny>) -> PyResult<LfxPolicy> {
    fn field<'py>(
        settings: &Bound<'py, PyAny>,
        attr: &str,
        var: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        settings
            .getattr(attr)
            .map_err(|_| Unavailable::new_err(format!("{var}: the lfx settings have no `{attr}`")))
    }
    fn whole(settings: &Bound<'_, PyAny>, attr: &str, var: &str) -> PyResult<u32> {
        let value = field(settings, attr, var)?;
        value.extract::<u32>().map_err(|_| {
            Unavailable::new_err(format!(
                "{var}: expected a whole number of at least 0, got {value}"
            ))
        })
    }
    fn flag(settings: &Bound<'_, PyAny>, attr: &str, var: &str) -> PyResult<bool> {
        let value = field(settings, attr, var)?;
        value.extract::<bool>().map_err(|_| {
            Unavailable::new_err(format!("{var}: expected true or false, got {value}"))
        })
    }
    const DOMAINS: &str = "LANGFLOW_SANDBOX_ALLOWED_DOMAINS";
    let domains = field(settings, "allowed_domains", DOMAINS)?;
    let allowed_domains = domains
        .try_iter()
        .and_then(|items| {
            items
                .map(|item| item?.extract::<String>())
                .collect::<PyResult<Vec<_>>>()
        })
        .map_err(|_| Unavailable::new_err(format!("{DOMAINS}: expected a list of domain names")))?;
    Ok(LfxPolicy {
        timeout_seconds: whole(
            settings,
            "timeout_seconds",
            "LANGFLOW_SANDBOX_TIMEOUT_SECONDS",
        )?,
        memory_mb: whole(settings, "memory_mb", "LANGFLOW_SANDBOX_MEMORY_MB")?,
        allow_network: flag(settings, "allow_network", "LANGFLOW_SANDBOX_ALLOW_NETWORK")?,
        allowed_domains,
    })
}

fn runtime_or_err() -> PyResult<&'static tokio::runtime::Runtime> {
    runtime::get()
        .map_err(|err| ExecutionFailed::new_err(format!("cannot start the async runtime: {err}")))
}

/// One process's backend and the number of its runs in flight.
struct Live {
    backend: Backend,
    inflight: AtomicUsize,
    /// Built in a process forked from the one that imported the extension. Such a process
    /// commonly ends with `os._exit` (multiprocessing, pre-fork servers), which skips `atexit`
    /// and kills background work, so every run settles its guest before `run()` returns.
    forked: bool,
}

impl Live {
    /// Waits until this process holds no more guests than other runs in flight can account
    /// for: the interrupted run's guest, handed to the reaper when its future was dropped, is
    /// then destroyed (or the reaper is still retrying when the caller's bound expires).
    async fn settle_interrupted(&self) {
        loop {
            if self.backend.registered_guests() <= self.inflight.load(Ordering::SeqCst) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Every backend built in this process image, with the id of the process that built it, so
/// SIGTERM can shut down the current process's backends without any Python object.
static LIVES: Mutex<Vec<(u32, Weak<Live>)>> = Mutex::new(Vec::new());

fn remember(live: &Arc<Live>) {
    let pid = std::process::id();
    let mut lives = LIVES.lock().unwrap_or_else(PoisonError::into_inner);
    // Entries of other processes (a parent) and of dropped backends are dead weight here.
    lives.retain(|(owner, weak)| *owner == pid && weak.strong_count() > 0);
    lives.push((pid, Arc::downgrade(live)));
}

/// Shuts down every backend of this process, concurrently, within [`SHUTDOWN_BUDGET`].
async fn shutdown_all() {
    let pid = std::process::id();
    let lives: Vec<Arc<Live>> = LIVES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter(|(owner, _)| *owner == pid)
        .filter_map(|(_, weak)| weak.upgrade())
        .collect();
    let all = futures::future::join_all(lives.iter().map(|live| live.backend.shutdown()));
    if tokio::time::timeout(SHUTDOWN_BUDGET, all).await.is_err() {
        tracing::warn!(
            target: "langflow_sandbox_createos",
            "shutdown did not finish within {}s; remaining guests are bounded by auto-pause",
            SHUTDOWN_BUDGET.as_secs()
        );
    }
}

/// Counts a run as in flight for as long as it lives.
struct InFlight(Arc<Live>);

impl InFlight {
    fn new(live: Arc<Live>) -> Self {
        live.inflight.fetch_add(1, Ordering::SeqCst);
        Self(live)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The sandbox backend's native half: one `langflow_backend::Backend` per process.
///
/// Constructing it does nothing: no thread, no I/O, no environment read. The runtime and the
/// backend are built by the first call that needs them, in whichever process makes it.
#[pyclass(frozen, module = "langflow_sandbox_createos._native")]
pub struct NativeBackend {
    /// The backend of the process that built it, with that process's id.
    slot: Mutex<Option<(u32, Arc<Live>)>>,
}

type Slot = Option<(u32, Arc<Live>)>;

impl NativeBackend {
    fn lock(&self) -> std::sync::MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// This process's backend, built on first use (in a new process, too).
    fn current(&self) -> Arc<Live> {
        let pid = std::process::id();
        let mut slot = self.lock();
        if let Some((owner, backend)) = slot.as_ref()
            && *owner == pid
        {
            return Arc::clone(backend);
        }
        forget_foreign(&mut slot);
        let forked = IMPORTED_BY.get().is_some_and(|&origin| origin != pid);
        let live = Arc::new(Live {
            backend: Backend::with_options(BackendOptions {
                background_destroy: !forked,
                ..BackendOptions::default()
            }),
            inflight: AtomicUsize::new(0),
            forked,
        });
        *slot = Some((pid, Arc::clone(&live)));
        remember(&live);
        live
    }
}

/// Leaks a backend that a parent process built: dropping it here would release connections
/// and tasks that belong to the parent's runtime.
fn forget_foreign(slot: &mut Slot) {
    if matches!(slot, Some((owner, _)) if *owner != std::process::id())
        && let Some((_, inherited)) = slot.take()
    {
        std::mem::forget(inherited);
    }
}

#[pymethods]
impl NativeBackend {
    #[new]
    fn new() -> Self {
        Self {
            slot: Mutex::new(None),
        }
    }

    /// Runs `code` in a fresh guest and destroys it. Blocks with the GIL released.
    ///
    /// `settings` is lfx's `_SandboxSettings`. The guest's output and exit code come back as a
    /// [`RunResult`]; a refusal raises `Unavailable`, an infrastructure failure
    /// `ExecutionFailed`. Ctrl-C raises `KeyboardInterrupt` after the guest is destroyed.
    #[pyo3(signature = (code, env, settings))]
    fn run(
        &self,
        py: Python<'_>,
        code: String,
        env: Option<BTreeMap<String, String>>,
        settings: &Bound<'_, PyAny>,
    ) -> PyResult<RunResult> {
        logbridge::install();
        logbridge::sync_level(py);
        let policy = policy_from(settings)?;
        let rt = runtime_or_err()?;
        sigterm::arm(py, rt, shutdown_all);
        let live = self.current();
        let in_flight = InFlight::new(Arc::clone(&live));
        let mut task = Task::start(rt, move || async move {
            let outcome = in_flight.0.backend.run(&code, env, &policy).await;
            drop(in_flight);
            outcome
        });
        let outcome = wait(py, rt, &mut task.handle);
        if sigterm::terminating() {
            // The process is about to die of SIGTERM and this run's guest was destroyed under
            // it: no verdict (a failure would be a false one). Bounded, in case the exit fails.
            py.detach(|| std::thread::sleep(SHUTDOWN_BUDGET + Duration::from_secs(5)));
        }
        let settle_here = live.forked && matches!(outcome, Waited::Finished(_));
        let result = match outcome {
            Waited::Finished(Ok(None)) => {
                Err(ExecutionFailed::new_err("the sandbox run was cancelled"))
            }
            // langflow-backend logs each run's timings (`sandbox run finished`); the drain
            // below hands that record to Python's logging.
            Waited::Finished(Ok(Some(Ok(out)))) => RunResult::new(py, out),
            Waited::Finished(Ok(Some(Err(err)))) => Err(to_py_err(err)),
            Waited::Finished(Err(join)) => Err(ExecutionFailed::new_err(if join.is_panic() {
                "the sandbox run failed with an internal error (panic); its guest is destroyed by the reaper"
            } else {
                "the sandbox run was cancelled"
            })),
            Waited::Interrupted(interrupt) => {
                // Dropping the run's future destroys its guest (langflow-backend's guarantee);
                // wait, bounded, for that destroy to reach the control plane before re-raising.
                task.cancel();
                let handle = task.handle;
                let live = Arc::clone(&live);
                let settled = block_bounded(py, rt, INTERRUPT_CLEANUP, async move {
                    let _ = handle.await;
                    live.settle_interrupted().await;
                });
                if settled.is_none() {
                    tracing::warn!(
                        target: "langflow_sandbox_createos",
                        "the interrupted run's guest was not confirmed destroyed within {}s; \
                         its auto-pause backstop bounds the cost",
                        INTERRUPT_CLEANUP.as_secs()
                    );
                }
                Err(interrupt)
            }
        };
        if settle_here {
            // A forked child may `os._exit` the moment this returns: whatever the outcome
            // (a failed run hands its guest to the reaper in the background), wait, bounded,
            // until this process holds no guest that a run still in flight cannot account for.
            let settled = block_bounded(py, rt, FORKED_CLEANUP, async move {
                live.settle_interrupted().await;
            });
            if settled.is_none() {
                tracing::warn!(
                    target: "langflow_sandbox_createos",
                    "a guest of this forked process was not confirmed destroyed within {}s; \
                     its auto-pause backstop bounds the cost",
                    FORKED_CLEANUP.as_secs()
                );
            }
        }
        logbridge::drain(py);
        result
    }

    /// Destroys every guest still alive in this process and forgets the backend. Idempotent;
    /// a later `run()` starts a fresh backend.
    fn shutdown(&self, py: Python<'_>) {
        let pid = std::process::id();
        let taken = {
            let mut slot = self.lock();
            forget_foreign(&mut slot);
            slot.take()
        };
        let Some((built_by, live)) = taken else {
            return;
        };
        debug_assert_eq!(built_by, pid);
        // No runtime means no run ever started here, so there is nothing to destroy.
        let Some(rt) = runtime::existing() else {
            return;
        };
        logbridge::install();
        if block_bounded(py, rt, SHUTDOWN_BUDGET, async move {
            live.backend.shutdown().await;
        })
        .is_none()
        {
            tracing::warn!(
                target: "langflow_sandbox_createos",
                "shutdown did not finish within {}s; remaining guests are bounded by auto-pause",
                SHUTDOWN_BUDGET.as_secs()
            );
        }
        logbridge::drain(py);
    }

    /// Drops state inherited from a parent process (backend, connection pool, runtime), so
    /// this process builds its own on next use. State built by this process is kept.
    fn reset_after_fork(&self) {
        forget_foreign(&mut self.lock());
        runtime::forget_inherited();
    }

    /// Checks configuration and credential without creating a guest. Returns `(ok, report)`.
    ///
    /// `settings` is lfx's `_SandboxSettings`, or `None` when lfx could not build its settings
    /// service (lfx then refuses to run any flow, so the report fails).
    fn doctor(
        &self,
        py: Python<'_>,
        settings: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(bool, String)> {
        logbridge::install();
        logbridge::sync_level(py);
        let Some(settings) = settings else {
            let mut report = DoctorReport {
                ok: false,
                lines: vec![DoctorLine {
                    level: DoctorLevel::Refused,
                    text: "lfx settings: the settings service could not be built (see the log \
                           above); lfx would refuse to run any flow"
                        .to_owned(),
                }],
            };
            add_trust_gate(&mut report, &|name| std::env::var(name).ok());
            return Ok((report.ok, report.to_string()));
        };
        let policy = policy_from(settings)?;
        let rt = runtime_or_err()?;
        let live = self.current();
        let mut task = Task::start(
            rt,
            move || async move { live.backend.doctor(&policy).await },
        );
        let mut report = match wait(py, rt, &mut task.handle) {
            Waited::Finished(Ok(Some(report))) => report,
            Waited::Finished(_) => {
                return Err(ExecutionFailed::new_err(
                    "doctor failed with an internal error",
                ));
            }
            Waited::Interrupted(interrupt) => {
                task.cancel();
                return Err(interrupt);
            }
        };
        logbridge::drain(py);
        add_trust_gate(&mut report, &|name| std::env::var(name).ok());
        Ok((report.ok, report.to_string()))
    }

    fn __repr__(&self) -> String {
        let pid = std::process::id();
        let state = match self.lock().as_ref() {
            Some((owner, _)) if *owner == pid => "active",
            Some(_) => "inherited",
            None => "idle",
        };
        format!("<NativeBackend pid={pid} state={state}>")
    }
}

/// What `reap()` did: the orphaned guests deleted (or, in a dry run, that would be).
#[pyclass(frozen, get_all, module = "langflow_sandbox_createos._native")]
pub struct ReapReport {
    /// Nothing was deleted; `deleted` lists what would have been.
    dry_run: bool,
    /// `lf-` guests the listing returned, in any status.
    examined: usize,
    /// `(name, id)` of each orphan deleted (or that would be).
    deleted: Vec<(String, String)>,
    /// `(name, id, error)` of each orphan that could not be deleted.
    failed: Vec<(String, String, String)>,
}

#[pymethods]
impl ReapReport {
    fn __repr__(&self) -> String {
        format!(
            "ReapReport(dry_run={}, examined={}, deleted={}, failed={})",
            py_bool(self.dry_run),
            self.examined,
            self.deleted.len(),
            self.failed.len()
        )
    }
}

impl From<SweepReport> for ReapReport {
    fn from(report: SweepReport) -> Self {
        Self {
            dry_run: report.dry_run,
            examined: report.examined,
            deleted: report
                .deleted
                .into_iter()
                .map(|orphan| (orphan.name, orphan.id))
                .collect(),
            failed: report
                .failed
                .into_iter()
                .map(|(orphan, error)| (orphan.name, orphan.id, error))
                .collect(),
        }
    }
}

/// Deletes this account's orphaned guests (one-shot `lf-` guests found paused), or with
/// `dry_run` only lists them. Reads the `CREATEOS_*` settings; blocks with the GIL released;
/// Ctrl-C interrupts. A missing key or a failed listing raises `Unavailable` or
/// `ExecutionFailed`; a delete that fails is in the report's `failed`.
#[pyfunction]
#[pyo3(signature = (dry_run = false))]
fn reap(py: Python<'_>, dry_run: bool) -> PyResult<ReapReport> {
    logbridge::install();
    logbridge::sync_level(py);
    let rt = runtime_or_err()?;
    let mut task = Task::start(rt, move || async move {
        // This sweep is the whole job: no second one in the background.
        let backend = Backend::with_options(BackendOptions {
            orphan_sweep: false,
            ..BackendOptions::default()
        });
        backend.sweep_orphans(dry_run).await
    });
    let result = match wait(py, rt, &mut task.handle) {
        Waited::Finished(Ok(Some(Ok(report)))) => Ok(ReapReport::from(report)),
        Waited::Finished(Ok(Some(Err(err)))) => Err(to_py_err(err)),
        Waited::Finished(_) => Err(ExecutionFailed::new_err(
            "the orphan sweep failed with an internal error",
        )),
        Waited::Interrupted(interrupt) => {
            task.cancel();
            Err(interrupt)
        }
    };
    logbridge::drain(py);
    result
}

/// The entry-point name lfx must be told to trust and select.
const PLUGIN_NAME: &str = "createos";

/// Adds lfx's own switches to a doctor report: without `createos` in
/// `LANGFLOW_SANDBOX_BACKEND_PLUGINS` lfx never loads this backend (and fails to start when it
/// is selected); without `LANGFLOW_SANDBOX_BACKEND=createos` it is simply not used.
fn add_trust_gate(report: &mut DoctorReport, env: &dyn Fn(&str) -> Option<String>) {
    const PLUGINS: &str = "LANGFLOW_SANDBOX_BACKEND_PLUGINS";
    const SELECTED: &str = "LANGFLOW_SANDBOX_BACKEND";
    let trusted = env(PLUGINS)
        .unwrap_or_default()
        .split(',')
        .any(|name| name.trim().eq_ignore_ascii_case(PLUGIN_NAME));
    let selected = env(SELECTED).map(|v| v.trim().to_ascii_lowercase());
    let mut lines = Vec::with_capacity(2);
    if trusted {
        lines.push(DoctorLine {
            level: DoctorLevel::Ok,
            text: format!("lfx trusts the plugin ({PLUGINS} lists {PLUGIN_NAME})"),
        });
    } else {
        lines.push(DoctorLine {
            level: DoctorLevel::Refused,
            text: format!(
                "{PLUGINS} does not list {PLUGIN_NAME}: lfx will not load this backend \
                 (and refuses to start if {SELECTED}={PLUGIN_NAME}); set {PLUGINS}={PLUGIN_NAME}"
            ),
        });
    }
    match selected.as_deref() {
        Some(PLUGIN_NAME) => lines.push(DoctorLine {
            level: DoctorLevel::Ok,
            text: format!("lfx selects this backend ({SELECTED}={PLUGIN_NAME})"),
        }),
        other => lines.push(DoctorLine {
            level: DoctorLevel::Warn,
            text: format!(
                "{SELECTED} is {:?}, so lfx will not use this backend; set {SELECTED}={PLUGIN_NAME}",
                other.unwrap_or("none")
            ),
        }),
    }
    report.lines.splice(0..0, lines);
    report.ok = !report
        .lines
        .iter()
        .any(|line| line.level == DoctorLevel::Refused);
}

/// Sets `__module__` of a class to the public path of this module.
fn public_module<T: pyo3::PyTypeInfo>(py: Python<'_>) -> PyResult<()> {
    py.get_type::<T>().setattr("__module__", MODULE)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    IMPORTED_BY.get_or_init(std::process::id);
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("LOGGER_NAME", logbridge::LOGGER_NAME)?;
    m.add("CreateOSError", py.get_type::<CreateOSError>())?;
    m.add("Unavailable", py.get_type::<Unavailable>())?;
    m.add("ExecutionFailed", py.get_type::<ExecutionFailed>())?;
    public_module::<CreateOSError>(py)?;
    public_module::<Unavailable>(py)?;
    public_module::<ExecutionFailed>(py)?;
    m.add_class::<NativeBackend>()?;
    m.add_class::<NativeCapabilities>()?;
    m.add_class::<RunResult>()?;
    m.add_class::<Output>()?;
    m.add_class::<Timings>()?;
    m.add_class::<ReapReport>()?;
    m.add_function(wrap_pyfunction!(capabilities, m)?)?;
    m.add_function(wrap_pyfunction!(reap, m)?)?;
    m.add_function(wrap_pyfunction!(logbridge::_emit_log_records, m)?)?;
    logbridge::register_fork_hooks(m)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report_ok() -> DoctorReport {
        DoctorReport {
            ok: true,
            lines: vec![DoctorLine {
                level: DoctorLevel::Ok,
                text: "credential accepted".into(),
            }],
        }
    }

    #[test]
    fn trust_gate_refuses_when_plugin_not_listed() {
        let mut report = report_ok();
        add_trust_gate(&mut report, &|name| {
            (name == "LANGFLOW_SANDBOX_BACKEND").then(|| "createos".into())
        });
        assert!(!report.ok);
        assert_eq!(report.lines[0].level, DoctorLevel::Refused);
        assert!(
            report.lines[0]
                .text
                .contains("LANGFLOW_SANDBOX_BACKEND_PLUGINS")
        );
        assert_eq!(report.lines.len(), 3);
    }

    #[test]
    fn trust_gate_passes_when_listed_and_selected() {
        let mut report = report_ok();
        add_trust_gate(&mut report, &|name| match name {
            "LANGFLOW_SANDBOX_BACKEND_PLUGINS" => Some("other, CreateOS ".into()),
            "LANGFLOW_SANDBOX_BACKEND" => Some(" createos".into()),
            _ => None,
        });
        assert!(report.ok);
        assert!(
            report
                .lines
                .iter()
                .take(2)
                .all(|line| line.level == DoctorLevel::Ok)
        );
    }

    #[test]
    fn trust_gate_warns_when_not_selected() {
        let mut report = report_ok();
        add_trust_gate(&mut report, &|name| {
            (name == "LANGFLOW_SANDBOX_BACKEND_PLUGINS").then(|| "createos".into())
        });
        assert!(report.ok);
        assert_eq!(report.lines[1].level, DoctorLevel::Warn);
    }
}
