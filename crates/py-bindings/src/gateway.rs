//! `python -m langflow_sandbox_createos gateway`: the egress gateway, shipped in the wheel.
//!
//! The options are the `egress-gateway` binary's (one definition, in the gateway crate), parsed
//! here from the arguments Python passes on. The gateway runs on a runtime of its own (several
//! worker threads: it serves many guests' connections at once, unlike the plugin's runs) while
//! the calling thread waits with the GIL released and takes it back every 100 ms to run
//! Python's signal handlers: Ctrl-C (or SIGTERM, which the command turns into the same
//! `KeyboardInterrupt`) stops accepting, and the exception propagates.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use egress_gateway::cli::{Args, init_logging, run};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// How the usage and help messages name the command.
const COMMAND: &str = "python -m langflow_sandbox_createos gateway";

/// How often the waiting thread looks at Python's signal handlers.
const SLICE: Duration = Duration::from_millis(100);

/// Runs the egress gateway with the command-line arguments `argv` (those after `gateway`)
/// until it fails or a signal handler raises. Returns the exit status: 0 after `--help` or
/// `--version`, 2 for a usage or start-up error (printed to stderr). The shared secret comes
/// from `CREATEOS_GATEWAY_SECRET` and is never printed.
#[pyfunction]
pub fn gateway_main(py: Python<'_>, argv: Vec<String>) -> PyResult<i32> {
    let options = match Args::parse_args(COMMAND, argv) {
        Ok(options) => options,
        Err(err) => {
            let _ = err.print();
            return Ok(err.exit_code());
        }
    };
    init_logging();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("egress-gateway")
        .build()
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start the gateway runtime: {e}")))?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (done, finished) = mpsc::channel::<Result<(), String>>();
    runtime.spawn(async move {
        let result = run(&options, async {
            let _ = stopped.await;
        })
        .await;
        let _ = done.send(result);
    });
    let mut stop = Some(stop);
    let mut finished = finished;
    let outcome = loop {
        // The receiver is `Send` but not `Sync`: it goes into the GIL-free closure and back.
        let (back, got) = py.detach(move || {
            let got = finished.recv_timeout(SLICE);
            (finished, got)
        });
        finished = back;
        match got {
            Ok(Ok(())) => break Ok(0),
            Ok(Err(msg)) => {
                eprintln!("egress gateway: {msg}");
                break Ok(2);
            }
            Err(RecvTimeoutError::Disconnected) => {
                break Err(PyRuntimeError::new_err(
                    "the egress gateway stopped unexpectedly",
                ));
            }
            Err(RecvTimeoutError::Timeout) => {
                if let Err(signal) = py.check_signals() {
                    if let Some(stop) = stop.take() {
                        let _ = stop.send(());
                    }
                    let _ = py.detach(move || finished.recv_timeout(Duration::from_secs(2)));
                    break Err(signal);
                }
            }
        }
    };
    // Open tunnels are closed with the runtime; waiting for them would keep the process up.
    py.detach(|| runtime.shutdown_timeout(Duration::from_millis(500)));
    outcome
}
