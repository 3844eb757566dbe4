//! The CreateOS Sandbox component's native half: `NativeComponent.run` (one execution of the
//! node), `describe_component` (the node's description) and `reap_reused` (the operator's
//! deletion of old reused guests).
//!
//! One `langflow_component::SandboxComponent` per process, on the process's shared session
//! ([`crate::session::session`]); a forked child builds its own and never touches the
//! parent's. Every call blocks with the GIL released and stays interruptible by Ctrl-C
//! ([`crate::wait`]); failures are raised as the public classes of
//! `langflow_sandbox_createos.exceptions` ([`crate::errors`]):
//! `SandboxRefusedError` when nothing ran (a refusal naming the node's input or the
//! setting), `SandboxFailedError` for an infrastructure failure.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use langflow_component::{
    ComponentError, ComponentInputs, ComponentOptions, ComponentOutput,
    ENV_ACCEPT_EGRESS_EXCEPTIONS, ProviderKind, ReapReport, Reuse, SandboxComponent,
    SurfaceOptions, describe, parse_age,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::errors;
use crate::perprocess::PerProcess;
use crate::session::{self, SHUTDOWN_BUDGET, surface_options};
use crate::wait::{Waited, block_bounded, drive};
use crate::{logbridge, runtime, sigterm};

/// Time allowed, after Ctrl-C, for the interrupted run's fresh guest to be destroyed.
const INTERRUPT_CLEANUP: Duration = Duration::from_secs(15);

/// This process's component and its runs in flight.
struct Held {
    component: SandboxComponent,
    running: AtomicUsize,
}

/// The component of the process that built it (see [`PerProcess`]).
static HELD: PerProcess<Arc<Held>> = PerProcess::new();
/// The component on an OpenSandbox server, of the process that built it.
static HELD_OPENSANDBOX: PerProcess<Arc<Held>> = PerProcess::new();

/// This process's component on `provider`, built on first use on the process's session for
/// that provider.
fn held(provider: ProviderKind) -> Arc<Held> {
    let build = |surface| {
        Arc::new(Held {
            component: SandboxComponent::with_options(ComponentOptions {
                surface,
                provider,
                ..ComponentOptions::default()
            }),
            running: AtomicUsize::new(0),
        })
    };
    match provider {
        ProviderKind::OpenSandbox => {
            HELD_OPENSANDBOX.get_or_init(|| build(session::opensandbox_surface_options()))
        }
        _ => HELD.get_or_init(|| build(surface_options())),
    }
}

/// Destroys this process's fresh guests on every provider (kept guests stay for the next
/// process).
pub(crate) async fn shutdown_component() {
    for h in [HELD.current(), HELD_OPENSANDBOX.current()]
        .into_iter()
        .flatten()
    {
        h.component.shutdown().await;
    }
}

fn raise(py: Python<'_>, err: &ComponentError) -> PyErr {
    errors::from_surface(py, err.clone())
}

fn runtime_or_err(py: Python<'_>) -> PyResult<&'static runtime::Rt> {
    runtime::get()
        .map_err(|err| errors::execution(py, format!("cannot start the async runtime: {err}")))
}

/// One execution's outcome, as the plain Python values lfx's `Data` and `DataFrame` are
/// built from.
#[pyclass(frozen, get_all, module = "langflow_sandbox_createos._native")]
pub struct ComponentRun {
    /// The Results output: `result`, `stderr`, `exit_code`, `timed_out`, `sandbox_id`,
    /// `sandbox_name`, `provider` (`createos` or `opensandbox`: where the guest ran),
    /// `reused_guest`, `kept_guest`, `artifact_count`, `stdout_truncated`, `stderr_truncated`,
    /// `timings`, `notes`, and `error` when the program failed.
    results: Py<PyDict>,
    /// The Files output: one dict per file, `path`, `size`, `text` (UTF-8 content or
    /// `None`) and `base64` (the content otherwise, or `None`).
    files: Py<PyList>,
    /// How the run went, as the metrics count it: `ok`, `program_failed` or `timed_out`.
    outcome: &'static str,
}

#[pymethods]
impl ComponentRun {
    fn __repr__(&self, py: Python<'_>) -> String {
        let r = self.results.bind(py);
        let get = |k: &str| {
            r.get_item(k)
                .ok()
                .flatten()
                .map_or_else(|| "None".to_owned(), |v| v.to_string())
        };
        format!(
            "ComponentRun(exit_code={}, sandbox_name={:?}, reused_guest={}, files={})",
            get("exit_code"),
            get("sandbox_name"),
            get("reused_guest"),
            self.files.bind(py).len()
        )
    }
}

impl ComponentRun {
    fn new(py: Python<'_>, out: ComponentOutput, provider: ProviderKind) -> PyResult<Self> {
        let outcome = out.outcome.as_str();
        let results = PyDict::new(py);
        results.set_item("result", out.result)?;
        results.set_item("stderr", out.stderr)?;
        results.set_item("exit_code", out.exit_code)?;
        results.set_item("timed_out", out.timed_out)?;
        results.set_item("sandbox_id", out.sandbox_id)?;
        results.set_item("sandbox_name", out.sandbox_name)?;
        results.set_item("provider", provider.as_str())?;
        results.set_item("reused_guest", out.reused_guest)?;
        results.set_item("kept_guest", out.kept)?;
        results.set_item("artifact_count", out.files.len())?;
        results.set_item("stdout_truncated", out.stdout_truncated)?;
        results.set_item("stderr_truncated", out.stderr_truncated)?;
        let t = PyDict::new(py);
        // The component's phases of the shared timings type, as whole numbers (the keys its
        // Results have always had).
        for (phase, value) in out.timings.fields() {
            if let Some(value) = value {
                t.set_item(phase, value)?;
            }
        }
        results.set_item("timings", t)?;
        results.set_item("notes", out.notes)?;
        if let Some(e) = out.error {
            results.set_item("error", e)?;
        }
        let files = PyList::empty(py);
        for f in out.files {
            let row = PyDict::new(py);
            row.set_item("path", f.path)?;
            row.set_item("size", f.size)?;
            row.set_item("text", f.text)?;
            row.set_item("base64", f.base64)?;
            files.append(row)?;
        }
        Ok(Self {
            results: results.unbind(),
            files: files.unbind(),
            outcome,
        })
    }
}

/// Counts a run as in flight for as long as it lives.
struct Running(Arc<Held>);

impl Running {
    fn new(h: Arc<Held>) -> Self {
        h.running.fetch_add(1, Ordering::SeqCst);
        Self(h)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The CreateOS Sandbox component's native half. Holds nothing itself: the component of
/// the calling process is built on first use (no thread, no I/O, no environment read
/// before that).
#[pyclass(frozen, module = "langflow_sandbox_createos._native")]
pub struct NativeComponent;

// The handle holds nothing: the component belongs to the calling process, not the object.
#[allow(clippy::unused_self)]
#[pymethods]
impl NativeComponent {
    #[new]
    fn new() -> Self {
        Self
    }

    /// Runs one execution of the node and returns its [`ComponentRun`]. Blocks with the GIL
    /// released; Ctrl-C raises `KeyboardInterrupt` after the run's fresh guest is destroyed.
    /// `session_id` (the graph's Langflow session id) is optional: the node source that flows
    /// saved before session reuse embed does not pass it. `invocation` is the process's
    /// command line (`sys.argv`, which the package's glue adds), where Guest Reuse finds the
    /// exported flow `lfx run` was given when the graph carries no flow id.
    #[pyo3(signature = (
        *, flow_id, component_id, python_code, command, session_mode, collect_artifacts,
        allow_network, timeout_seconds, shape, session_id = None, allowed_domains = String::new(),
        invocation = Vec::new(), accept_egress_exceptions = false, provider = "createos"
    ))]
    #[allow(clippy::too_many_arguments, clippy::fn_params_excessive_bools)]
    fn run(
        &self,
        py: Python<'_>,
        flow_id: String,
        component_id: String,
        python_code: String,
        command: String,
        session_mode: &str,
        collect_artifacts: bool,
        allow_network: bool,
        timeout_seconds: i64,
        shape: String,
        session_id: Option<String>,
        allowed_domains: String,
        invocation: Vec<String>,
        accept_egress_exceptions: bool,
        provider: &str,
    ) -> PyResult<ComponentRun> {
        logbridge::install();
        logbridge::sync_level(py);
        let provider = ProviderKind::parse(provider).ok_or_else(|| {
            errors::unavailable(py, "Provider must be CreateOS or OpenSandbox".to_owned())
        })?;
        let reuse = Reuse::parse(session_mode).map_err(|e| raise(py, &e))?;
        let inputs = ComponentInputs {
            flow_id,
            invocation,
            session_id: session_id.unwrap_or_default(),
            component_id,
            python_code,
            command,
            reuse,
            return_files: collect_artifacts,
            allow_network,
            accept_egress_exceptions,
            allowed_domains,
            // Out of range reads as 0, which the component refuses naming the input.
            timeout_seconds: u32::try_from(timeout_seconds).unwrap_or(0),
            shape,
        };
        let rt = runtime_or_err(py)?;
        sigterm::arm_every_surface(py, rt);
        let h = held(provider);
        let running = Running::new(Arc::clone(&h));
        let result = match drive(py, rt, move || async move {
            let out = running.0.component.run(&inputs).await;
            drop(running);
            out
        }) {
            Waited::Finished(Ok(out)) => ComponentRun::new(py, out, provider),
            Waited::Finished(Err(err)) => Err(raise(py, &err)),
            Waited::Panicked => Err(errors::execution(
                py,
                "the sandbox component run did not finish (an internal error); a fresh guest \
                 is destroyed by the reaper, a kept one is left as it is",
            )),
            Waited::Interrupted(interrupt) => {
                // Dropping the run's future handed a fresh guest to the reaper; wait, bounded,
                // until it is destroyed (no more registered guests than runs in flight).
                let settled = block_bounded(py, rt, INTERRUPT_CLEANUP, async move {
                    while h.component.registered_guests() > h.running.load(Ordering::SeqCst) {
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                });
                if settled.is_none() {
                    tracing::warn!(
                        target: "langflow_sandbox_createos",
                        budget_s = INTERRUPT_CLEANUP.as_secs(),
                        "Ctrl-C: the fresh guest of the interrupted component run is not \
                         confirmed destroyed yet; the reaper keeps trying and auto-pause bounds \
                         its cost"
                    );
                }
                Err(interrupt)
            }
        };
        logbridge::drain(py);
        result
    }

    /// Destroys this process's fresh guests still alive (kept guests stay for the next
    /// process) and forgets the component; a later `run()` builds a fresh one. Idempotent.
    fn shutdown(&self, py: Python<'_>) {
        let held: Vec<Arc<Held>> = [HELD.take(), HELD_OPENSANDBOX.take()]
            .into_iter()
            .flatten()
            .collect();
        if held.is_empty() {
            return;
        }
        let Some(rt) = runtime::existing() else {
            return;
        };
        logbridge::install();
        let _ = block_bounded(py, rt, SHUTDOWN_BUDGET, async move {
            for h in held {
                h.component.shutdown().await;
            }
        });
        logbridge::drain(py);
    }

    fn __repr__(&self) -> String {
        let state = if HELD.current().is_some() || HELD_OPENSANDBOX.current().is_some() {
            "active"
        } else {
            "idle"
        };
        format!("<NativeComponent pid={} state={state}>", std::process::id())
    }
}

/// The policy a run with these inputs gets on `provider` (`createos` or `opensandbox`): where
/// it runs, the effective network policy (under the node's Accept Link-Local Egress or this
/// process's `LANGFLOW_SANDBOX_CREATEOS_ACCEPT_EGRESS_EXCEPTIONS`) and the reuse mode. An
/// unknown reuse mode is described as off, an unknown provider as CreateOS (a run refuses
/// either).
#[pyfunction]
#[pyo3(signature = (allow_network, session_mode, accept_egress_exceptions = false, provider = "createos"))]
pub fn describe_component(
    allow_network: bool,
    session_mode: &str,
    accept_egress_exceptions: bool,
    provider: &str,
) -> String {
    let reuse = Reuse::parse(session_mode).unwrap_or_default();
    let provider = ProviderKind::parse(provider).unwrap_or_default();
    describe(provider, allow_network, reuse, &|k| {
        if accept_egress_exceptions && k == ENV_ACCEPT_EGRESS_EXCEPTIONS {
            Some("true".to_owned())
        } else {
            std::env::var(k).ok()
        }
    })
}

/// What `reap_reused()` did: reused guests deleted (or that would be) and kept.
#[pyclass(frozen, get_all, module = "langflow_sandbox_createos._native")]
pub struct ReusedReapReport {
    /// Nothing was deleted; `deleted` lists what would have been.
    dry_run: bool,
    /// The age limit, in seconds.
    older_than_seconds: f64,
    /// `(name, id, age_seconds)` of each reused guest deleted (or that would be).
    deleted: Vec<(String, String, f64)>,
    /// `(name, id, age_seconds or None)` of each reused guest kept.
    kept: Vec<(String, String, Option<f64>)>,
    /// `(name, id, error)` of each reused guest that could not be deleted.
    failed: Vec<(String, String, String)>,
}

#[pymethods]
impl ReusedReapReport {
    fn __repr__(&self) -> String {
        format!(
            "ReusedReapReport(dry_run={}, deleted={}, kept={}, failed={})",
            if self.dry_run { "True" } else { "False" },
            self.deleted.len(),
            self.kept.len(),
            self.failed.len()
        )
    }
}

impl From<ReapReport> for ReusedReapReport {
    fn from(r: ReapReport) -> Self {
        let secs = |d: Option<Duration>| d.map(|d| d.as_secs_f64());
        Self {
            dry_run: r.dry_run,
            older_than_seconds: r.older_than.as_secs_f64(),
            deleted: r
                .deleted
                .into_iter()
                .map(|g| (g.name, g.id, secs(g.age).unwrap_or_default()))
                .collect(),
            kept: r
                .kept
                .into_iter()
                .map(|g| (g.name, g.id, secs(g.age)))
                .collect(),
            failed: r
                .failed
                .into_iter()
                .map(|(g, e)| (g.name, g.id, e))
                .collect(),
        }
    }
}

/// Deletes this account's reused component guests (`lf-c-…`) created at least `older_than`
/// ago (`90s`, `30m`, `1h`, `2d`, or seconds), or with `dry_run` only lists them; younger
/// ones are kept.
/// Reads the `CREATEOS_*` settings (`provider="opensandbox"`: the `OPEN_SANDBOX_*` ones, and
/// the kept sandboxes on that server); blocks with the GIL released; Ctrl-C interrupts. A
/// missing or rejected key raises `SandboxRefusedError`, a failed listing
/// `SandboxFailedError`.
#[pyfunction]
#[pyo3(signature = (older_than, dry_run = false, provider = "createos"))]
pub fn reap_reused(
    py: Python<'_>,
    older_than: &str,
    dry_run: bool,
    provider: &str,
) -> PyResult<ReusedReapReport> {
    logbridge::install();
    logbridge::sync_level(py);
    let older_than = parse_age(older_than).map_err(|e| raise(py, &e))?;
    let provider = ProviderKind::parse(provider).ok_or_else(|| {
        errors::unavailable(py, "provider must be createos or opensandbox".to_owned())
    })?;
    let rt = runtime_or_err(py)?;
    // Taken here, with the GIL held, not on the driver thread: `os.fork` holds the GIL, so a
    // child never inherits the session's lock taken by another thread.
    let session = match provider {
        ProviderKind::OpenSandbox => session::opensandbox_session(),
        _ => session::session(),
    };
    let waited = drive(py, rt, move || async move {
        let component = SandboxComponent::with_options(ComponentOptions {
            surface: SurfaceOptions {
                session: Some(session),
                orphan_sweep: false,
                pool_allowed: false,
                ..SurfaceOptions::default()
            },
            provider,
            ..ComponentOptions::default()
        });
        component.reap_reused(older_than, dry_run).await
    });
    logbridge::drain(py);
    let finished = match waited {
        Waited::Interrupted(interrupt) => return Err(interrupt),
        Waited::Finished(done) => Some(done),
        // A panic leaves no report.
        Waited::Panicked => None,
    };
    let report = finished
        .ok_or_else(|| {
            errors::execution(
                py,
                "the reap of reused guests failed with an internal error",
            )
        })?
        .map_err(|e| raise(py, &e))?;
    Ok(ReusedReapReport::from(report))
}
