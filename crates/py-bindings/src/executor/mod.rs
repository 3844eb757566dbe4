//! The whole-flow executor's native half: `NativeExecutor.start()` returns a `FlowEvents`, an
//! async iterator whose events are produced on this process's runtime.
//!
//! No Python object is touched on a runtime thread. A flow run is driven by a producer task
//! that pushes each event into a queue bounded in bytes ([`QUEUE_BYTES`]) and writes one byte
//! to a socket pair. A consumer that does not take the events makes the producer wait for room
//! (so it stops reading the guest's output, and the guest's writes block), but never past the
//! run's host deadline: then the run is stopped, the guest destroyed, and the consumer gets the
//! events queued so far and a `SandboxFailedError`. A panic in the producer is caught: the
//! run is closed (the guest destroyed) and the consumer gets a `SandboxFailedError`, never
//! a silent end. An event's JSON is built into Python objects only when it is taken
//! ([`crate::payload`]), from the bytes the executor admitted. `__anext__` takes an event that is already there, or registers the socket's
//! read end with the running asyncio loop (`loop.add_reader`): the loop's own thread then runs
//! the callback, which takes the event and completes the awaited future. So the awaitable
//! completes on the event loop, the waiting costs no thread, and `fork()` is safe: a child
//! that inherited a `FlowEvents` refuses to use it (its producer lives in the parent), and
//! builds its own runtime and executor for new runs.
//!
//! `aclose()` (and dropping the iterator) stops the run: the producer closes it, which stops
//! the exec and destroys the guest; the awaitable of `aclose()` completes once that is done.

use std::sync::{Arc, PoisonError};

use std::io::Write as _;

use langflow_executor::{Executor, ExecutorError, ExecutorOptions, RunHead};
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use sandbox_core::provider::ProviderKind;
use tokio::sync::oneshot;

use crate::perprocess::PerProcess;
use crate::session::SHUTDOWN_BUDGET;
use crate::wait::block_bounded;
use crate::{errors, logbridge, runtime, session, sigterm};

mod producer;
mod stream;

use stream::pipe;
pub use stream::{FlowEvents, FlowWake};

/// This process's executor (see [`PerProcess`]).
static EXECUTOR: PerProcess<Arc<Executor>> = PerProcess::new();
/// This process's executor on an OpenSandbox server.
static OPENSANDBOX_EXECUTOR: PerProcess<Arc<Executor>> = PerProcess::new();

fn executor(provider: ProviderKind) -> Arc<Executor> {
    match provider {
        ProviderKind::OpenSandbox => OPENSANDBOX_EXECUTOR.get_or_init(|| {
            Arc::new(Executor::with_options(ExecutorOptions {
                surface: session::opensandbox_surface_options(),
                provider,
                ..ExecutorOptions::default()
            }))
        }),
        _ => EXECUTOR.get_or_init(|| {
            Arc::new(Executor::with_options(ExecutorOptions {
                surface: session::surface_options(),
                ..ExecutorOptions::default()
            }))
        }),
    }
}

/// This process's executor on `provider` if it built one.
fn existing(provider: ProviderKind) -> Option<Arc<Executor>> {
    match provider {
        ProviderKind::OpenSandbox => OPENSANDBOX_EXECUTOR.current(),
        _ => EXECUTOR.current(),
    }
}

/// Destroys the guests of this process's flow runs, on every provider (SIGTERM's cleanup).
pub(crate) async fn shutdown_executor() {
    for provider in [ProviderKind::CreateOs, ProviderKind::OpenSandbox] {
        if let Some(ex) = existing(provider) {
            ex.shutdown().await;
        }
    }
}

/// The error an executor failure is raised as: refusals as `SandboxRefusedError`,
/// infrastructure failures as `SandboxFailedError`, and a flow that failed in the guest as
/// the built-in exception it raised there (`ValueError`, `TypeError`, else `RuntimeError`), as
/// it would have in-process.
fn to_pyerr(py: Python<'_>, err: ExecutorError) -> PyErr {
    match err {
        ExecutorError::Unavailable(m) => errors::unavailable(py, m),
        ExecutorError::Execution(m) => errors::execution(py, m),
        ExecutorError::Flow {
            error_type,
            message,
        } => match error_type.as_deref() {
            Some("ValueError") => PyValueError::new_err(message),
            Some("TypeError") => PyTypeError::new_err(message),
            _ => PyRuntimeError::new_err(message),
        },
    }
}

/// The executor's native half: one `langflow_executor::Executor` per process and provider,
/// built on first use. Constructing it does nothing: no thread, no I/O, no environment read.
#[pyclass(frozen, module = "langflow_sandbox_createos._native")]
pub struct NativeExecutor {
    provider: ProviderKind,
}

#[pymethods]
#[allow(clippy::unused_self)] // Python methods: the state is per process, not per object.
impl NativeExecutor {
    /// The executor on `provider` (`createos`, the default, or `opensandbox`); any other
    /// name raises `ValueError`.
    #[new]
    #[pyo3(signature = (provider = "createos"))]
    fn new(provider: &str) -> PyResult<Self> {
        let provider = ProviderKind::parse(provider).ok_or_else(|| {
            PyValueError::new_err("provider must be \"createos\" or \"opensandbox\"")
        })?;
        Ok(Self { provider })
    }

    /// The most chat-history messages of the run's session a run sends to its guest (the
    /// glue reads one more, so a cut is noticed).
    #[classattr]
    const HISTORY_MESSAGES: usize = langflow_executor::job::MAX_HISTORY_MESSAGES;

    /// Starts a flow run and returns its events at once; the guest is created by the run's
    /// producer. `head` is the JSON head document (`flow_id`, `session_id`, `options`, the
    /// uploaded `files`), enough to admit the run, refuse it and create its guest, whose runner
    /// starts importing lfx at once; the rest of the request follows with
    /// [`FlowEvents::supply`] (the job is uploaded once it is there). `lfx_version` is the
    /// host's lfx version. A malformed head raises `SandboxFailedError`; every other failure
    /// comes out of the events.
    #[pyo3(signature = (head, lfx_version = None))]
    fn start(
        &self,
        py: Python<'_>,
        head: &str,
        lfx_version: Option<String>,
    ) -> PyResult<FlowEvents> {
        logbridge::install();
        logbridge::sync_level(py);
        let head = RunHead::from_json(head).map_err(|why| {
            errors::execution(py, format!("the flow run request is malformed: {why}"))
        })?;
        let mode = head.mode.as_str();
        let rt = runtime::get()
            .map_err(|e| errors::execution(py, format!("cannot start the async runtime: {e}")))?;
        // `lfx run` and container stops end a process with SIGTERM: destroy the flow's guest.
        sigterm::arm_every_surface(py, rt);
        let (producer, shared, done) = pipe().map_err(|e| {
            if e.kind() == std::io::ErrorKind::Unsupported {
                errors::unavailable(py, e.to_string())
            } else {
                errors::execution(py, format!("cannot create the wake socket: {e}"))
            }
        })?;
        let executor = executor(self.provider);
        let (body_tx, body_rx) = oneshot::channel();
        *shared.body.lock().unwrap_or_else(PoisonError::into_inner) = Some(body_tx);
        let body = async move {
            body_rx.await.unwrap_or_else(|_| {
                Err(ExecutorError::Execution(
                    "the flow run was never handed its flow (the caller went away); nothing of \
                     the flow ran and the guest was destroyed"
                        .to_owned(),
                ))
            })
        };
        // Driven on a blocking-pool thread by `block_on` (sandbox-core's futures are not
        // provably `Send`), on this process's runtime. Never cancelled from outside: the
        // producer stops itself when asked, so the guest is always closed.
        let driver = rt.handle().clone();
        rt.spawn_blocking(move || {
            let _done = done;
            driver.block_on(async move {
                let start = executor.start_with(&head, body, lfx_version.as_deref());
                Box::pin(producer.run(start)).await;
            });
        });
        Ok(FlowEvents {
            shared: Arc::new(shared),
            pid: std::process::id(),
            mode,
        })
    }

    /// Destroys every guest of this process's flow runs (bounded) and refuses new runs.
    fn shutdown(&self, py: Python<'_>) {
        let Some(ex) = existing(self.provider) else {
            return;
        };
        let Some(rt) = runtime::existing() else {
            return;
        };
        let _ = block_bounded(py, rt, SHUTDOWN_BUDGET, async move {
            ex.shutdown().await;
        });
        logbridge::drain(py);
    }

    /// This process's executor warm pool (`CREATEOS_EXECUTOR_WARM_POOL`): `size`, `ready`,
    /// `filling`, `hits`, `misses`, `discarded`, `refill_failures` (all 0 before the first run).
    fn pool_stats(&self) -> std::collections::BTreeMap<&'static str, u64> {
        let s = existing(self.provider)
            .map(|ex| ex.pool_stats())
            .unwrap_or_default();
        let n = |v: usize| u64::try_from(v).unwrap_or(u64::MAX);
        [
            ("size", n(s.size)),
            ("ready", n(s.ready)),
            ("filling", n(s.filling)),
            ("hits", s.hits),
            ("misses", s.misses),
            ("discarded", s.discarded),
            ("refill_failures", s.refill_failures),
        ]
        .into_iter()
        .collect()
    }

    fn __repr__(&self) -> String {
        format!("<NativeExecutor pid={}>", std::process::id())
    }
}

/// The requirements and Dockerfile of a template for a flow that needs `requirements` (what
/// lfx's flow-requirements reader found), pinned to the host's `lfx_version`. No I/O.
/// Returns `(name, dockerfile)`; `name` is derived from the Dockerfile unless given.
#[pyfunction]
#[pyo3(signature = (requirements, lfx_version, name = None))]
#[allow(clippy::needless_pass_by_value)] // a Python list arrives as an owned Vec
pub fn template_plan(
    py: Python<'_>,
    requirements: Vec<String>,
    lfx_version: &str,
    name: Option<String>,
) -> PyResult<(String, String)> {
    let reqs = langflow_executor::template::requirements(&requirements, lfx_version)
        .map_err(|e| to_pyerr(py, e))?;
    let dockerfile = langflow_executor::template::dockerfile(&reqs);
    let name = name.unwrap_or_else(|| langflow_executor::template::template_name(&dockerfile));
    Ok((name, dockerfile))
}

/// Builds `dockerfile` as the CreateOS template `name` with the `CREATEOS_SANDBOX_*` key and
/// endpoint, printing each build log line to standard error as it arrives, and returns the
/// ready template's id (the `CREATEOS_EXECUTOR_ROOTFS` value). Blocks with the GIL released;
/// Ctrl-C interrupts. A failed build raises `SandboxFailedError`; a missing or rejected
/// key `SandboxRefusedError`.
#[pyfunction]
pub fn template_build(py: Python<'_>, name: String, dockerfile: String) -> PyResult<String> {
    logbridge::install();
    logbridge::sync_level(py);
    let rt = runtime::get()
        .map_err(|e| errors::execution(py, format!("cannot start the async runtime: {e}")))?;
    // Taken here, with the GIL held (see `process`'s fork rule).
    let session = session::session();
    let result = match crate::wait::drive(py, rt, move || async move {
        let env: langflow_executor::EnvLookup = Arc::new(sandbox_core::vars::process_env);
        langflow_executor::template::build(&env, &session, &name, &dockerfile, |line| {
            // The build log goes to the terminal as it arrives (no Python object involved).
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "build: {line}");
        })
        .await
    }) {
        crate::wait::Waited::Finished(Ok(built)) => Ok(built.id),
        crate::wait::Waited::Finished(Err(e)) => Err(to_pyerr(py, e)),
        crate::wait::Waited::Panicked => Err(errors::execution(
            py,
            "the template build failed with an internal error",
        )),
        crate::wait::Waited::Interrupted(interrupt) => Err(interrupt),
    };
    logbridge::drain(py);
    result
}
