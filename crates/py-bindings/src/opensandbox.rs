//! The OpenSandbox sandbox backend's native half (`NativeOpenSandboxBackend`) and its
//! capabilities: `LANGFLOW_SANDBOX_BACKEND=opensandbox`.
//!
//! Same rules as [`crate::backend`]: the GIL is released while a run blocks, Ctrl-C interrupts
//! it (the run's sandbox is deleted when its future is dropped), refusals raise
//! `CreateOSUnavailableError` (lfx's `SandboxUnavailableError`) and infrastructure failures
//! `CreateOSExecutionError`. A forked child builds its own backend and runtime.

use std::collections::BTreeMap;
use std::sync::Arc;

use langflow_backend::opensandbox::{self, OpenSandboxBackend};
use pyo3::prelude::*;

use crate::backend::policy_from;
use crate::errors;
use crate::perprocess::{PerProcess, State};
use crate::results::{NativeCapabilities, RunResult};
use crate::wait::{Waited, drive};
use crate::{logbridge, runtime, session};

/// What the OpenSandbox backend declares to lfx: `hardware-virtualized` only when
/// `OPEN_SANDBOX_ATTEST_ISOLATION` says so. Reads the environment; no I/O, no thread.
#[pyfunction]
pub fn opensandbox_capabilities() -> NativeCapabilities {
    NativeCapabilities::from(opensandbox::capabilities_with(|k| std::env::var(k).ok()))
}

/// Deletes this deployment's OpenSandbox sandboxes (metadata `created-by`, the
/// `OPEN_SANDBOX_CREATED_BY` value) older than `older_than_seconds`, or with `dry_run` only
/// lists them; returns their ids. Reads the `OPEN_SANDBOX_*` settings; blocks with the GIL
/// released. A missing key or unusable domain raises `CreateOSUnavailableError`, a failed
/// listing `CreateOSExecutionError`.
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
        let backend = self
            .held
            .get_or_init(|| Arc::new(OpenSandboxBackend::with_session(session::session())));
        let outcome = drive(py, rt, move || async move {
            backend.run(&code, env, &policy).await
        });
        let result = match outcome {
            Waited::Finished(Ok(out)) => RunResult::new(py, out),
            Waited::Finished(Err(err)) => Err(errors::from_surface(py, err)),
            Waited::Panicked => Err(errors::execution(
                py,
                "the OpenSandbox run failed with an internal error (panic); its sandbox is \
                 deleted in the background or by the server-side timeout",
            )),
            Waited::Interrupted(interrupt) => Err(interrupt),
        };
        logbridge::drain(py);
        result
    }

    /// Forgets the backend (each run deletes its own sandbox). Idempotent.
    fn shutdown(&self) {
        drop(self.held.take());
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
