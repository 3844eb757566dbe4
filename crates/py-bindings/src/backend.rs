//! The sandbox backend's native half (`NativeBackend`) and the operator's `reap()`.
//!
//! Every call blocks with the GIL released and stays interruptible by Ctrl-C ([`crate::wait`]);
//! failures are raised as the public classes of `langflow_sandbox_createos.exceptions`
//! ([`crate::errors`]):
//!
//! | call | `SandboxRefusedError` (nothing ran) | `SandboxFailedError` |
//! |---|---|---|
//! | `run` | refusals: settings, key, policy, shape | infrastructure failure, outcome unknown, internal error |
//! | `reap` | missing, malformed or rejected key or endpoint | the listing failed (transient), internal error |
//!
//! Ctrl-C raises `KeyboardInterrupt` from any of them, after an interrupted run's guest is
//! destroyed (bounded).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use langflow_backend::{
    Backend, BackendOptions, ENV_LF_ALLOW_NETWORK, ENV_LF_ALLOWED_DOMAINS, ENV_LF_MEMORY,
    ENV_LF_TIMEOUT, LfxPolicy, SurfaceOptions,
};
use pyo3::prelude::*;

use crate::errors;
use crate::perprocess::{PerProcess, Remembered, State, forked};
use crate::results::{ReapReport, RunResult};
use crate::session::{SHUTDOWN_BUDGET, surface_options};
use crate::wait::{Waited, block_bounded, drive};
use crate::{logbridge, runtime, sigterm};

/// Time allowed, after Ctrl-C, for the interrupted run's guest to be destroyed.
const INTERRUPT_CLEANUP: Duration = Duration::from_secs(15);
/// Time allowed, in a forked child, for a run's guest to be destroyed before `run()`
/// returns, whatever the run's outcome.
const FORKED_CLEANUP: Duration = Duration::from_secs(15);

/// Reads lfx's `_SandboxSettings` into the policy the backend enforces. A value that does not
/// fit is a configuration the backend cannot honour: the error is the refusal's message, which
/// names the variable (fail closed).
pub(crate) fn policy_from(settings: &Bound<'_, PyAny>) -> Result<LfxPolicy, String> {
    fn field<'py>(
        settings: &Bound<'py, PyAny>,
        attr: &str,
        var: &str,
    ) -> Result<Bound<'py, PyAny>, String> {
        settings
            .getattr(attr)
            .map_err(|_| format!("{var}: the lfx settings have no `{attr}`"))
    }
    fn whole(settings: &Bound<'_, PyAny>, attr: &str, var: &str) -> Result<u32, String> {
        let value = field(settings, attr, var)?;
        value
            .extract::<u32>()
            .map_err(|_| format!("{var}: expected a whole number of at least 0, got {value}"))
    }
    fn flag(settings: &Bound<'_, PyAny>, attr: &str, var: &str) -> Result<bool, String> {
        let value = field(settings, attr, var)?;
        value
            .extract::<bool>()
            .map_err(|_| format!("{var}: expected true or false, got {value}"))
    }
    const DOMAINS: &str = ENV_LF_ALLOWED_DOMAINS;
    let domains = field(settings, "allowed_domains", DOMAINS)?;
    let allowed_domains = domains
        .try_iter()
        .and_then(|items| {
            items
                .map(|item| item?.extract::<String>())
                .collect::<PyResult<Vec<_>>>()
        })
        .map_err(|_| format!("{DOMAINS}: expected a list of domain names"))?;
    Ok(LfxPolicy {
        timeout_seconds: whole(settings, "timeout_seconds", ENV_LF_TIMEOUT)?,
        memory_mb: whole(settings, "memory_mb", ENV_LF_MEMORY)?,
        allow_network: flag(settings, "allow_network", ENV_LF_ALLOW_NETWORK)?,
        allowed_domains,
    })
}

/// This process's runtime; failing to start one is an infrastructure failure.
fn runtime_or_err(py: Python<'_>) -> PyResult<&'static runtime::Rt> {
    runtime::get()
        .map_err(|err| errors::execution(py, format!("cannot start the async runtime: {err}")))
}

/// The sandbox backend's native half: one `langflow_backend::Backend` per process.
///
/// Constructing it does nothing: no thread, no I/O, no environment read. The runtime and the
/// backend are built by the first call that needs them, in whichever process makes it.
#[pyclass(frozen, module = "langflow_sandbox_createos._native")]
pub struct NativeBackend {
    /// The backend of the process that built it.
    held: PerProcess<Arc<Live>>,
}

#[pymethods]
impl NativeBackend {
    #[new]
    fn new() -> Self {
        Self {
            held: PerProcess::new(),
        }
    }

    /// Runs `code` in a fresh guest and destroys it. Blocks with the GIL released.
    ///
    /// `settings` is lfx's `_SandboxSettings`. The guest's output and exit code come back as a
    /// [`RunResult`]; a refusal raises `SandboxRefusedError`, an infrastructure failure
    /// `SandboxFailedError`. Ctrl-C raises `KeyboardInterrupt` after the guest is
    /// destroyed.
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
        let policy = policy_from(settings).map_err(|message| errors::unavailable(py, message))?;
        let rt = runtime_or_err(py)?;
        sigterm::arm_every_surface(py, rt);
        let live = backend_of(&self.held);
        let in_flight = InFlight::new(Arc::clone(&live));
        let outcome = drive(py, rt, move || async move {
            let outcome = in_flight.0.backend.run(&code, env, &policy).await;
            drop(in_flight);
            outcome
        });
        if sigterm::terminating() {
            // The process is about to die of SIGTERM and this run's guest was destroyed under
            // it: no verdict (a failure would be a false one). Bounded, in case the exit fails.
            py.detach(|| std::thread::sleep(SHUTDOWN_BUDGET + Duration::from_secs(5)));
        }
        let settle_here = live.forked && !matches!(outcome, Waited::Interrupted(_));
        let result = match outcome {
            // langflow-backend logs each run's timings (`sandbox run finished`); the drain
            // below hands that record to Python's logging.
            Waited::Finished(Ok(out)) => RunResult::new(py, out),
            Waited::Finished(Err(err)) => Err(errors::from_surface(py, err)),
            Waited::Panicked => Err(errors::execution(
                py,
                "the sandbox run failed with an internal error (panic); its guest is \
                 destroyed by the reaper",
            )),
            Waited::Interrupted(interrupt) => {
                // The run's future was dropped, which destroys its guest (langflow-backend's
                // guarantee); wait, bounded, for that destroy to reach the control plane
                // before re-raising.
                let live = Arc::clone(&live);
                let settled = block_bounded(py, rt, INTERRUPT_CLEANUP, async move {
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
        let Some(live) = self.held.take() else {
            return;
        };
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
        self.held.forget_inherited();
        runtime::forget_inherited();
    }

    fn __repr__(&self) -> String {
        let state = match self.held.state() {
            State::Idle => "idle",
            State::Active => "active",
            State::Inherited => "inherited",
        };
        format!("<NativeBackend pid={} state={state}>", std::process::id())
    }
}

/// Deletes this account's orphaned guests (one-shot `lf-` guests found paused), or with
/// `dry_run` only lists them. Reads the `CREATEOS_*` settings; blocks with the GIL released;
/// Ctrl-C interrupts. A missing or rejected key raises `SandboxRefusedError`, a failed
/// listing `SandboxFailedError`; a delete that fails is in the report's `failed`.
#[pyfunction]
#[pyo3(signature = (dry_run = false))]
pub fn reap(py: Python<'_>, dry_run: bool) -> PyResult<ReapReport> {
    logbridge::install();
    logbridge::sync_level(py);
    let rt = runtime_or_err(py)?;
    let result = match drive(py, rt, move || async move {
        // This sweep is the whole job: no second one in the background.
        let backend = Backend::with_options(BackendOptions {
            surface: SurfaceOptions {
                orphan_sweep: false,
                ..SurfaceOptions::default()
            },
        });
        backend.sweep_orphans(dry_run).await
    }) {
        Waited::Finished(Ok(report)) => Ok(ReapReport::from(report)),
        Waited::Finished(Err(err)) => Err(errors::from_surface(py, err)),
        Waited::Panicked => Err(errors::execution(
            py,
            "the orphan sweep failed with an internal error",
        )),
        Waited::Interrupted(interrupt) => Err(interrupt),
    };
    logbridge::drain(py);
    result
}

// --- This process's backends, remembered for SIGTERM --------------------------------------

/// One process's backend and the number of its runs in flight.
pub struct Live {
    /// The backend itself.
    pub backend: Backend,
    inflight: AtomicUsize,
    /// Built in a process forked from the one that imported the extension. Such a process
    /// commonly ends with `os._exit` (multiprocessing, pre-fork servers), which skips `atexit`
    /// and kills background work, so every run settles its guest before `run()` returns.
    pub forked: bool,
}

impl Live {
    /// Waits until this process holds no more guests than other runs in flight can account
    /// for: the interrupted run's guest, handed to the reaper when its future was dropped, is
    /// then destroyed (or the reaper is still retrying when the caller's bound expires). The
    /// warm pool's idle guests (`CREATEOS_SANDBOX_WARM_POOL`) belong to no run and are not
    /// waited for; shutdown destroys them.
    pub async fn settle_interrupted(&self) {
        loop {
            if self.backend.unpooled_guests() <= self.inflight.load(Ordering::SeqCst) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Counts a run as in flight for as long as it lives.
pub struct InFlight(pub Arc<Live>);

impl InFlight {
    /// Counts one more run of `live`.
    pub fn new(live: Arc<Live>) -> Self {
        live.inflight.fetch_add(1, Ordering::SeqCst);
        Self(live)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Every backend built in this process image.
static LIVES: Remembered<Live> = Remembered::new();

/// Shuts down every backend of this process, concurrently, within [`SHUTDOWN_BUDGET`].
pub async fn shutdown_all() {
    let lives = LIVES.of_this_process();
    let all = futures::future::join_all(lives.iter().map(|live| live.backend.shutdown()));
    if tokio::time::timeout(SHUTDOWN_BUDGET, all).await.is_err() {
        tracing::warn!(
            target: "langflow_sandbox_createos",
            "shutdown did not finish within {}s; remaining guests are bounded by auto-pause",
            SHUTDOWN_BUDGET.as_secs()
        );
    }
}

/// This process's backend held by one `NativeBackend`, built on first use (see
/// [`PerProcess`]), and remembered for SIGTERM's [`shutdown_all`].
pub fn backend_of(held: &PerProcess<Arc<Live>>) -> Arc<Live> {
    held.get_or_init(|| {
        let live = Arc::new(Live {
            backend: Backend::with_options(BackendOptions {
                surface: surface_options(),
            }),
            inflight: AtomicUsize::new(0),
            forked: forked(),
        });
        LIVES.remember(&live);
        live
    })
}

#[cfg(test)]
mod registry_tests {
    use super::*;

    #[test]
    fn holds_nothing_until_first_use_then_the_callers_backend() {
        let held = PerProcess::new();
        assert_eq!(held.state(), State::Idle);
        assert!(held.current().is_none());
        let first = backend_of(&held);
        assert_eq!(held.state(), State::Active);
        // The same process gets the same backend back, not a new one.
        assert!(Arc::ptr_eq(&first, &backend_of(&held)));
        let taken = held.take().expect("this process's backend");
        assert!(Arc::ptr_eq(&first, &taken));
        assert_eq!(held.state(), State::Idle);
        assert!(held.take().is_none());
    }

    #[test]
    fn a_child_starts_with_an_empty_warm_pool_of_its_own() {
        let held = PerProcess::new();
        let parent = backend_of(&held);
        held.pretend_inherited();
        let own = backend_of(&held);
        // The pool lives inside the backend: a child's new backend holds none of the
        // parent's idle guests and has counted nothing yet.
        assert!(!Arc::ptr_eq(&parent, &own));
        assert_eq!(
            own.backend.warm_pool(),
            langflow_backend::PoolStats::default()
        );
        assert_eq!(own.backend.unpooled_guests(), 0);
    }

    #[test]
    fn in_flight_counts_while_alive() {
        let held = PerProcess::new();
        let live = backend_of(&held);
        let run = InFlight::new(Arc::clone(&live));
        assert_eq!(live.inflight.load(Ordering::SeqCst), 1);
        drop(run);
        assert_eq!(live.inflight.load(Ordering::SeqCst), 0);
    }
}
