//! Blocking on async work from a Python thread: GIL released, Ctrl-C honoured.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use futures::FutureExt;
use pyo3::exceptions::PyKeyboardInterrupt;
use pyo3::prelude::*;

use crate::logbridge;
use crate::runtime::Rt;

/// How long the waiting thread polls without the GIL before it takes the GIL to check for
/// signals and forward queued log records. Completion is not delayed by it: the wait ends as
/// soon as the future does.
const SLICE: Duration = Duration::from_millis(100);

/// What became of a future driven by [`drive`].
pub enum Waited<T> {
    /// The future completed with this output.
    Finished(T),
    /// The future panicked; it was unwound (its drop guards ran).
    Panicked,
    /// A signal handler raised (Ctrl-C gives `KeyboardInterrupt`). The future was dropped
    /// before this was returned (bounded by [`DROP_WAIT`]): whatever its drop hands to the
    /// background (a guest's destroy) is already spawned.
    Interrupted(PyErr),
}

/// How long an interrupted wait waits for the driver thread to drop the future.
const DROP_WAIT: Duration = Duration::from_secs(5);

/// What the driver thread reports back.
enum Done<T> {
    Finished(T),
    Panicked,
    /// Cancelled by the waiter; the future is dropped.
    Dropped,
}

/// Builds `make()`'s future on the runtime's driver thread ([`Rt::spawn_run`]) and waits for
/// it with the GIL released, until it completes, panics or a signal handler raises.
///
/// Polling the future on the driver thread, next to the connection tasks that carry its
/// requests, is what keeps a run's HTTP exchanges free of thread hand-offs: the waiting
/// thread is woken once, with the result. The future still uses the runtime's timers, I/O and
/// connection pools, and anything it spawns (background destroys) lands on the runtime.
///
/// Every [`SLICE`] the waiting thread takes the GIL back briefly to run Python's signal
/// handlers (only the main thread ever sees a signal) and to drain the log queue, so a Ctrl-C
/// interrupts even a long run: the future is then dropped on the driver thread, which is
/// what destroys an interrupted run's guest. On any other thread a Ctrl-C since the run
/// started does the same ([`crate::interrupt`]).
pub fn drive<F, Fut>(py: Python<'_>, rt: &'static Rt, make: F) -> Waited<Fut::Output>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future + 'static,
    Fut::Output: Send + 'static,
{
    let started = crate::interrupt::Generation::now();
    let (done, outcome) = mpsc::sync_channel::<Done<Fut::Output>>(1);
    let (cancel, cancelled) = tokio::sync::oneshot::channel::<()>();
    let spawned = rt.spawn_run(move || async move {
        let work = AssertUnwindSafe(async move { make().await }).catch_unwind();
        let report = tokio::select! {
            out = work => out.map_or(Done::Panicked, Done::Finished),
            _ = cancelled => Done::Dropped,
        };
        let _ = done.send(report);
    });
    if !spawned {
        return Waited::Panicked;
    }
    let mut outcome = outcome;
    loop {
        // The receiver is `Send` but not `Sync`: it goes into the GIL-free closure and back.
        let (back, got) = py.detach(move || {
            let got = outcome.recv_timeout(SLICE);
            (outcome, got)
        });
        outcome = back;
        match got {
            Ok(Done::Finished(out)) => return Waited::Finished(out),
            // A run that stopped without a report (the task was torn down) is a panic too.
            Ok(Done::Panicked | Done::Dropped) | Err(RecvTimeoutError::Disconnected) => {
                return Waited::Panicked;
            }
            Err(RecvTimeoutError::Timeout) => {
                logbridge::drain(py);
                // A Ctrl-C since the run started ends it on any thread, as on the main thread
                // (`crate::interrupt`: only the main thread runs Python's handlers).
                let interrupted = py.check_signals().err().or_else(|| {
                    started.interrupted().then(|| {
                        PyKeyboardInterrupt::new_err(
                            "interrupted (Ctrl-C): the run was cancelled and its guest destroyed",
                        )
                    })
                });
                if let Some(err) = interrupted {
                    let _ = cancel.send(());
                    // Bounded: the drop itself awaits nothing.
                    let _ = py.detach(move || outcome.recv_timeout(DROP_WAIT).is_ok());
                    return Waited::Interrupted(err);
                }
            }
        }
    }
}

/// Blocks on `future` with the GIL released, giving up after `budget`. Used for cleanup
/// that must end even when the control plane does not answer; not interruptible.
pub fn block_bounded<F>(
    py: Python<'_>,
    rt: &'static Rt,
    budget: Duration,
    future: F,
) -> Option<F::Output>
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    py.detach(|| rt.block_on(async { tokio::time::timeout(budget, future).await.ok() }))
}
