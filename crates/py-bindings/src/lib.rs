//! `langflow_sandbox_createos._native`: the `PyO3` extension behind the wheel.
//!
//! The Python package is glue: it builds lfx's own dataclasses from what this module returns.
//! Everything else happens here or below, in `langflow-backend`. This file only registers the
//! module; the work is split by concern:
//!
//! - [`backend`]: `NativeBackend` (run, shutdown) and `reap()`;
//! - [`doctor`]: `doctor()`, the deployment check of every enabled surface;
//! - [`component`]: `NativeComponent` (the CreateOS Sandbox node), `describe_component()` and
//!   `reap_reused()`;
//! - [`executor`]: `NativeExecutor` and the async `FlowEvents` of a whole-flow run;
//! - [`gateway`]: `gateway_main()`, the egress gateway behind `python -m ... gateway`;
//! - [`perprocess`]: `PerProcess<T>`, every per-process value (runtime, session, backends,
//!   component, executor) keyed on the process id with the fork rule stated once, so a forked
//!   child builds its own while the parent's is untouched;
//! - [`session`]: what every surface of a process shares (the session, the surfaces' options,
//!   the shutdown budget) and what Python reads of it (`counters`);
//! - [`results`]: the values handed to Python (capabilities, run results, output streams);
//! - [`events`]: observation events queued per process for Python to drain (metrics, usage
//!   records);
//! - [`errors`]: failures raised as the public classes of `langflow_sandbox_createos.exceptions`;
//! - [`runtime`]: one tokio runtime per process, built lazily and rebuilt after `fork()`;
//! - [`wait`]: blocking calls that release the GIL and stay interruptible by Ctrl-C;
//! - [`sigterm`]: destroying the process's guests on SIGTERM when nobody else handles it;
//! - [`logbridge`]: `tracing` events forwarded to Python's `logging` from the waiting thread.
//!
//! This is the one place that assembles the process: importing the module installs the
//! admission store's driver (`sandbox-store`, behind the default `store` feature) into
//! sandbox-core, which never names it. Built without the feature, a set
//! `CREATEOS_ADMISSION_STORE` refuses every run, naming it.
//!
//! Importing the module starts no thread and does no I/O.

mod backend;
mod component;
mod doctor;
mod errors;
mod events;
mod executor;
mod gateway;
mod interrupt;
mod logbridge;
mod opensandbox;
mod payload;
mod perprocess;
mod results;
mod runtime;
mod session;
mod sigterm;
mod wait;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    perprocess::note_import();
    sandbox_createos::install();
    #[cfg(feature = "store")]
    sandbox_store::install();
    sigterm::set_every_surface(|| Box::pin(shutdown_every_surface()));
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("LOGGER_NAME", logbridge::LOGGER_NAME)?;
    m.add("OUTPUT_PIECE_BYTES", results::STEP_BYTES)?;
    m.add_class::<backend::NativeBackend>()?;
    m.add_class::<opensandbox::NativeOpenSandboxBackend>()?;
    m.add_function(wrap_pyfunction!(opensandbox::opensandbox_capabilities, m)?)?;
    m.add_function(wrap_pyfunction!(
        opensandbox::opensandbox_isolation_refusal,
        m
    )?)?;
    m.add_function(wrap_pyfunction!(opensandbox::opensandbox_reap, m)?)?;
    m.add_class::<results::NativeCapabilities>()?;
    m.add_class::<results::RunResult>()?;
    m.add_class::<results::Output>()?;
    m.add_class::<results::Timings>()?;
    m.add_class::<results::ReapReport>()?;
    m.add_class::<executor::NativeExecutor>()?;
    m.add_class::<executor::FlowEvents>()?;
    m.add_class::<executor::FlowWake>()?;
    m.add_function(wrap_pyfunction!(results::capabilities, m)?)?;
    m.add_function(wrap_pyfunction!(session::counters, m)?)?;
    m.add_function(wrap_pyfunction!(perprocess::forked_py, m)?)?;
    m.add_function(wrap_pyfunction!(session::enable_events, m)?)?;
    m.add_function(wrap_pyfunction!(events::drain_events, m)?)?;
    m.add_function(wrap_pyfunction!(events::metrics_enabled, m)?)?;
    m.add_function(wrap_pyfunction!(backend::reap, m)?)?;
    m.add_function(wrap_pyfunction!(doctor::doctor, m)?)?;
    m.add_function(wrap_pyfunction!(executor::template_plan, m)?)?;
    m.add_function(wrap_pyfunction!(executor::template_build, m)?)?;
    m.add_function(wrap_pyfunction!(logbridge::_emit_log_records, m)?)?;
    m.add_function(wrap_pyfunction!(logbridge::_hold_log_queue, m)?)?;
    m.add_function(wrap_pyfunction!(logbridge::outside_line, m)?)?;
    m.add_class::<component::NativeComponent>()?;
    m.add_class::<component::ComponentRun>()?;
    m.add_class::<component::ReusedReapReport>()?;
    m.add_function(wrap_pyfunction!(component::describe_component, m)?)?;
    m.add("COMPONENT_DESCRIPTION", langflow_component::DESCRIPTION)?;
    m.add_function(wrap_pyfunction!(component::reap_reused, m)?)?;
    m.add_function(wrap_pyfunction!(gateway::gateway_main, m)?)?;
    Ok(())
}

/// Every surface's shutdown at once (the sandbox backends on either provider, the
/// component's fresh guests, the executor's flow runs): SIGTERM's cleanup, whichever surface
/// armed the handler first.
async fn shutdown_every_surface() {
    tokio::join!(
        backend::shutdown_all(),
        opensandbox::shutdown_all(),
        component::shutdown_component(),
        executor::shutdown_executor()
    );
}
