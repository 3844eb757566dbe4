//! The OpenSandbox sandbox backend's native half (`NativeOpenSandboxBackend`) and its
//! capabilities: `LANGFLOW_SANDBOX_BACKEND=opensandbox`.
//!
//! Same rules as [`crate::backend`]: the GIL is released while a run blocks, Ctrl-C interrupts
//! it (the run's sandbox is deleted when its future is dropped), refusals raise
//! `SandboxRefusedError` (lfx's `SandboxUnavailableError`) and infrastructure failures
//! `SandboxFailedError`. A forked child builds its own backend and runtime. `shutdown()`
//! and SIGTERM delete the sandboxes of runs still in flight, as for CreateOS's guests.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use langflow_backend::opensandbox::{self, OpenSandboxBackend};
use pyo3::prelude::*;

use crate::backend::policy_from;
use crate::errors;
use crate::perprocess::{PerProcess, Remembered, State};
use crate::results::{NativeCapabilities, RunResult};
use crate::session::SHUTDOWN_BUDGET;
use crate::wait::{Waited, block_bounded, drive};
use crate::{logbridge, runtime, session, sigterm};

/// How long an interrupted run waits for its sandbox's delete before re-raising.
const INTERRUPT_CLEANUP: Duration = Duration::from_secs(15);

/// Every OpenSandbox backend built in this process image: SIGTERM's cleanup deletes their
/// runs' sandboxes.
static LIVES: Remembered<OpenSandboxBackend> = Remembered::new();

/// Deletes the in-flight runs' sandboxes of every OpenSandbox backend of this process
/// (SIGTERM's cleanup), within [`SHUTDOWN_BUDGET`].
pub async fn shutdown_all() {
    let lives = LIVES.of_this_process();
    let all = futures::future::join_all(lives.iter().map(|b| b.shutdown()));
    if tokio::time::timeout(SHUTDOWN_BUDGET, all).await.is_err() {
        tracing::warn!(
            target: "langflow_sandbox_createos",
            "OpenSandbox shutdown did not finish within {}s; the server-side timeout and the \
             orphan sweep remove what is left",
            SHUTDOWN_BUDGET.as_secs()
        );
    }
}

/// What the OpenSandbox backend declares to lfx: `hardware-virtualized` only when
/// `OPEN_SANDBOX_ATTEST_ISOLATION` says so. Reads the environment (and a secret's `_FILE`); no
/// network I/O, no thread.
#[pyfunction]
pub fn opensandbox_capabilities() -> NativeCapabilities {
    NativeCapabilities::from(opensandbox::capabilities_with(
        sandbox_core::vars::process_env,
    ))
}

/// Why lfx's backend seam will refuse this backend, naming the settings, or `None` when the
/// isolation is attested. lfx's own refusal ("reports 'container' isolation, not a
/// hardware-virtualized boundary") names no setting; the Python glue raises this instead,
/// before lfx decides. Reads the environment; no I/O beyond a secret's `_FILE`.
#[pyfunction]
pub fn opensandbox_isolation_refusal() -> Option<String> {
    use sandbox_opensandbox::OpenSandboxSettings;
    use sandbox_opensandbox::settings::{
        Attestation, ENV_ALLOW_CONTAINER_ISOLATION, ENV_ATTEST_ISOLATION, ENV_RUNTIME_CLASS,
    };
    let settings = OpenSandboxSettings::from_lookup(sandbox_core::vars::process_env).ok()?;
    if settings.attestation == Attestation::HardwareVirtualized {
        return None;
    }
    let container = if settings.allow_container_isolation {
        format!(
            " ({ENV_ALLOW_CONTAINER_ISOLATION}=true is set, but it is for the CreateOS Sandbox \
             component and the executor: lfx's sandbox backend runs code only in a \
             hardware-virtualized sandbox)"
        )
    } else {
        String::new()
    };
    Some(format!(
        "the OpenSandbox backend refuses to run code: its isolation is not attested, so it is \
         a container, and lfx's sandbox backend runs code only in a hardware-virtualized \
         sandbox{container}. If the OpenSandbox server's [secure_runtime] is Kata or \
         Firecracker, set {ENV_ATTEST_ISOLATION}=hardware-virtualized (and {ENV_RUNTIME_CLASS} \
         on Kubernetes); nothing was created"
    ))
}

/// Deletes this deployment's OpenSandbox sandboxes (metadata `created-by`, the
/// `OPEN_SANDBOX_CREATED_BY` value) older than `older_than_seconds`, or with `dry_run` only
/// lists them; returns their ids. Reads the `OPEN_SANDBOX_*` settings; blocks with the GIL
/// released. A missing key or unusable domain raises `SandboxRefusedError`, a failed
/// listing `SandboxFailedError`.
#[pyfunction]
#[pyo3(signature = (older_than_seconds = 1800.0, dry_run = false))]
pub fn opensandbox_reap(
    py: Python<'_>,
    older_than_seconds: f64,
    dry_run: bool,
) -> PyResult<Vec<String>> {
    if !(0.0..=31_536_000.0).contains(&older_than_seconds) {
        return Err(errors::unavailable(
            py,
            "older_than_seconds must be between 0 and one year",
        ));
    }
    logbridge::install();
    let rt = runtime::get()
        .map_err(|err| errors::execution(py, format!("cannot start the async runtime: {err}")))?;
    let older_than = std::time::Duration::from_secs_f64(older_than_seconds);
    let result = match drive(py, rt, move || async move {
        OpenSandboxBackend::with_session(session::session())
            .sweep(older_than, dry_run)
            .await
    }) {
        Waited::Finished(Ok(ids)) => Ok(ids),
        Waited::Finished(Err(err)) => Err(errors::from_surface(py, err)),
        Waited::Panicked => Err(errors::execution(
            py,
            "the OpenSandbox orphan sweep failed with an internal error",
        )),
        Waited::Interrupted(interrupt) => Err(interrupt),
    };
    logbridge::drain(py);
    result
}

/// The OpenSandbox backend's native half: one `OpenSandboxBackend` per process, built on
/// first use on the process's session, so its runs share the caps, the metrics and the usage
/// records of every other surface of the process.
#[pyclass(frozen, module = "langflow_sandbox_createos._native")]
pub struct NativeOpenSandboxBackend {
    held: PerProcess<Arc<OpenSandboxBackend>>,
}

#[pymethods]
impl NativeOpenSandboxBackend {
    #[new]
    fn new() -> Self {
        Self {
            held: PerProcess::new(),
        }
    }

    /// Runs `code` in a fresh OpenSandbox sandbox and deletes it. Blocks with the GIL
    /// released; `settings` is lfx's `_SandboxSettings`.
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
        let rt = runtime::get().map_err(|err| {
            errors::execution(py, format!("cannot start the async runtime: {err}"))
        })?;
        sigterm::arm_every_surface(py, rt);
        let backend = self.held.get_or_init(|| {
            let b = Arc::new(OpenSandboxBackend::with_session(session::session()));
            LIVES.remember(&b);
            b
        });
        let running = Arc::clone(&backend);
        let outcome = drive(py, rt, move || async move {
            running.run(&code, env, &policy).await
        });
        if sigterm::terminating() {
            // The process is about to die of SIGTERM and this run's sandbox was deleted under
            // it: no verdict (a failure would be a false one). Bounded, in case the exit fails.
            py.detach(|| std::thread::sleep(SHUTDOWN_BUDGET + Duration::from_secs(5)));
        }
        let result = match outcome {
            Waited::Finished(Ok(out)) => RunResult::new(py, out),
            Waited::Finished(Err(err)) => Err(errors::from_surface(py, err)),
            Waited::Panicked => Err(errors::execution(
                py,
                "the OpenSandbox run failed with an internal error (panic); its sandbox is \
                 deleted in the background or by the server-side timeout",
            )),
            Waited::Interrupted(interrupt) => {
                // The run's future was dropped, which deletes its sandbox in the background;
                // wait, bounded, for that delete before re-raising.
                let settled = block_bounded(py, rt, INTERRUPT_CLEANUP, async move {
                    backend.settled().await;
                });
                if settled.is_none() {
                    tracing::warn!(
                        target: "langflow_sandbox_createos",
                        "the interrupted run's OpenSandbox sandbox was not confirmed deleted \
                         within {}s; the server-side timeout removes it",
                        INTERRUPT_CLEANUP.as_secs()
                    );
                }
                Err(interrupt)
            }
        };
        logbridge::drain(py);
        result
    }

    /// Deletes the sandboxes of this process's runs still in flight and forgets the backend
    /// (a later `run()` builds a fresh one). Idempotent.
    fn shutdown(&self, py: Python<'_>) {
        let Some(backend) = self.held.take() else {
            return;
        };
        // No runtime means no run ever started here, so there is nothing to delete.
        let Some(rt) = runtime::existing() else {
            return;
        };
        logbridge::install();
        if block_bounded(py, rt, SHUTDOWN_BUDGET, async move {
            backend.shutdown().await;
        })
        .is_none()
        {
            tracing::warn!(
                target: "langflow_sandbox_createos",
                "OpenSandbox shutdown did not finish within {}s; the server-side timeout \
                 removes what is left",
                SHUTDOWN_BUDGET.as_secs()
            );
        }
        logbridge::drain(py);
    }

    /// Drops state inherited from a parent process.
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
        format!(
            "<NativeOpenSandboxBackend pid={} state={state}>",
            std::process::id()
        )
    }
}
