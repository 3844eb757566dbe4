//! Ctrl-C while a run blocks on a worker thread: the runs in flight when it came are cancelled
//! (their guests destroyed), as a run on the main thread is.
//!
//! `lfx run` runs a sandbox call on a worker thread (`asyncio.to_thread`). Only the main
//! thread runs Python's signal handlers, so [`crate::wait::drive`] on the worker never learns
//! of a Ctrl-C from them: `asyncio.run` cancels its main task, then waits for the worker, which
//! waits for its whole program (up to its timeout), so the process exits that much later and
//! the guest lives that long. What this module adds, once per process, at the first run:
//!
//! - **A flag set by SIGINT**, an OS-level action (`signal-hook`) in front of Python's own
//!   handler, which still runs (the main thread gets its `KeyboardInterrupt`, or asyncio's
//!   runner cancels its task, as before). Armed only when SIGINT interrupts the program:
//!   Python's `signal.default_int_handler`, or the handler `asyncio.run` (or `anyio.run`, as
//!   `lfx run` uses) installs over it while it runs. A
//!   process that ignores SIGINT or handles it itself (a server that shuts down gracefully)
//!   is left alone.
//! - **Generations.** Every blocked run polls the flag as it waits ([`Generation::interrupted`]):
//!   the first to see it set clears it and starts a new generation. A run started in an
//!   earlier generation than the current one was in flight when Ctrl-C came: it drops its work
//!   (which destroys its guest), waits for that, bounded, and raises `KeyboardInterrupt` in its
//!   thread. A run started after the Ctrl-C (a program that caught it and went on) is not
//!   affected.

use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

use pyo3::prelude::*;
use signal_hook::consts::SIGINT;

/// Set by SIGINT once armed (shared with the signal action).
static SEEN: OnceLock<Arc<AtomicBool>> = OnceLock::new();
/// How many Ctrl-Cs the runs of this process have seen.
static GENERATION: AtomicU64 = AtomicU64::new(0);
/// The process that decided whether to arm (a forked child decides again).
static DECIDED_BY: AtomicU32 = AtomicU32::new(0);

/// Turns a SIGINT that arrived since the last look into a new generation.
fn poll() -> u64 {
    if SEEN.get().is_some_and(|s| s.swap(false, Ordering::SeqCst)) {
        GENERATION.fetch_add(1, Ordering::SeqCst) + 1
    } else {
        GENERATION.load(Ordering::SeqCst)
    }
}

/// The generation a run started in.
#[derive(Debug, Clone, Copy)]
pub struct Generation(u64);

impl Generation {
    /// The current one, for a run starting now.
    pub fn now() -> Self {
        Self(poll())
    }

    /// Whether a Ctrl-C came since this run started.
    pub fn interrupted(self) -> bool {
        poll() != self.0
    }
}

/// Arms the SIGINT flag once per process when SIGINT interrupts the program (see the module
/// docs); a failure leaves things as they were.
pub fn arm(py: Python<'_>) {
    let pid = std::process::id();
    if DECIDED_BY.swap(pid, Ordering::SeqCst) == pid {
        return;
    }
    if let Some(seen) = SEEN.get() {
        // Armed before the fork that made this process: the action is inherited; a Ctrl-C
        // the parent saw is not the child's.
        seen.store(false, Ordering::SeqCst);
        return;
    }
    match interrupts(py) {
        Ok(true) => {}
        Ok(false) => return,
        Err(err) => {
            tracing::debug!(target: "langflow_sandbox_createos", error = %err, "SIGINT handler not readable");
            return;
        }
    }
    let seen = Arc::new(AtomicBool::new(false));
    match signal_hook::flag::register(SIGINT, Arc::clone(&seen)) {
        Ok(_) => {
            let _ = SEEN.set(seen);
        }
        Err(err) => tracing::debug!(
            target: "langflow_sandbox_createos",
            error = %err,
            "Ctrl-C will not cancel runs on worker threads (the SIGINT flag could not be set)"
        ),
    }
}

/// Whether SIGINT's handler now interrupts the program: Python's default, or the handler
/// `asyncio.run` (or `anyio.run`, which `lfx run` goes through) puts over it while it runs: a
/// method `Runner._on_sigint`, bound, or wrapped in `functools.partial` as anyio does.
fn interrupts(py: Python<'_>) -> PyResult<bool> {
    let signal = py.import("signal")?;
    let current = signal.call_method1("getsignal", (SIGINT,))?;
    if current.is(&signal.getattr("default_int_handler")?) {
        return Ok(true);
    }
    let method = current.getattr("func").unwrap_or(current);
    Ok(method
        .getattr("__func__")
        .and_then(|f| f.getattr("__qualname__"))
        .and_then(|q| q.extract::<String>())
        .is_ok_and(|q| q == "Runner._on_sigint"))
}
