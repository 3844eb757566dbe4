//! Blocking on a runtime task from a Python thread: GIL released, Ctrl-C honoured.

use std::time::Duration;

use pyo3::prelude::*;
use tokio::runtime::Runtime;
use tokio::task::{JoinError, JoinHandle};

use crate::logbridge;

/// How long the waiting thread sleeps without the GIL before it checks for signals and
/// forwards queued log records. Completion is not delayed by it: the wait ends as soon as
/// the task does.
const SLICE: Duration = Duration::from_millis(100);

/// What became of a wait.
pub enum Waited<T> {
    /// The task finished (or panicked, or was cancelled).
    Finished(Result<T, JoinError>),
    /// A signal handler raised (Ctrl-C gives `KeyboardInterrupt`); the task is still running.
    Interrupted(PyErr),
}

/// Waits for `handle` with the GIL released, in slices. Between slices it takes the GIL to
/// run Python's signal handlers (only the main thread ever sees a signal) and to drain the
/// log queue, so a Ctrl-C interrupts even a long run.
pub fn wait<T: Send + 'static>(
    py: Python<'_>,
    rt: &'static Runtime,
    handle: &mut JoinHandle<T>,
) -> Waited<T> {
    loop {
        let slice =
            py.detach(|| rt.block_on(async { tokio::time::timeout(SLICE, &mut *handle).await }));
        if let Ok(finished) = slice {
            return Waited::Finished(finished);
        }
        logbridge::drain(py);
        if let Err(err) = py.check_signals() {
            return Waited::Interrupted(err);
        }
    }
}

/// Blocks on `future` with the GIL released, giving up after `budget`. Used for cleanup
/// that must end even when the control plane does not answer; not interruptible.
pub fn block_bounded<F>(
    py: Python<'_>,
    rt: &'static Runtime,
    budget: Duration,
    future: F,
) -> Option<F::Output>
where
    F: std::future::Future + Send,
    F::Output: Send,
{
    py.detach(|| rt.block_on(async { tokio::time::timeout(budget, future).await.ok() }))
}

/// A run driven on its own blocking thread, cancellable.
///
/// `langflow-backend`'s futures are not provably `Send` (a rustc limitation with async
/// closures), so they cannot go to `Runtime::spawn`. Each one is instead polled by
/// `Handle::block_on` on a blocking-pool thread: it still uses the runtime's timers, I/O and
/// connection pools, and anything it spawns (background destroys) lands on the runtime. The
/// future is dropped when [`Task::cancel`] is called, which is what destroys an interrupted
/// run's guest.
pub struct Task<T> {
    /// Resolves to `None` when the run was cancelled.
    pub handle: JoinHandle<Option<T>>,
    cancel: Option<tokio::sync::oneshot::Sender<()>>,
}

impl<T: Send + 'static> Task<T> {
    /// Starts `make()`'s future on `rt`.
    pub fn start<F, Fut>(rt: &'static Runtime, make: F) -> Self
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = T>,
    {
        let (cancel, cancelled) = tokio::sync::oneshot::channel::<()>();
        let driver = rt.handle().clone();
        let handle = rt.spawn_blocking(move || {
            driver.block_on(async move {
                tokio::select! {
                    out = make() => Some(out),
                    _ = cancelled => None,
                }
            })
        });
        Self {
            handle,
            cancel: Some(cancel),
        }
    }

    /// Drops the run's future at its next await point.
    pub fn cancel(&mut self) {
        if let Some(cancel) = self.cancel.take() {
            let _ = cancel.send(());
        }
    }
}
