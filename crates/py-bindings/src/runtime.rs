//! The process's tokio runtime and the one thread that drives it, keyed on the process id.
//!
//! One thread drives everything: a current-thread runtime polled by a thread of its own,
//! with a [`LocalSet`] on which the surfaces' runs are placed ([`Rt::spawn_run`]). A run's
//! request, the connection task that carries it, the socket's readiness and the background
//! destroy and pool refill that follow then all happen on that thread, so an HTTP exchange
//! wakes no other thread: the waiting Python thread is woken once, when the run is over. The
//! work is I/O bound and small (about a millisecond of CPU per run); a multi-thread runtime
//! spent more CPU on hand-offs and wake-ups between its threads than on the work itself
//! (`BENCHMARKS.md`, issue 12). CPU-heavy steps (archive reads) go to the blocking pool.
//!
//! A child created by `fork()` inherits the parent's runtime object but not its thread, and
//! it shares the parent's epoll descriptor: using it hangs the child and can deadlock the
//! parent (build-notes §4). So the runtime is rebuilt on first use in a new process, and the
//! inherited one is leaked, never dropped (dropping it would try to join threads that do not
//! exist in the child).

use std::future::Future;
use std::ops::Deref;

use tokio::runtime::{Builder, Runtime};
use tokio::sync::mpsc;
use tokio::task::LocalSet;

use crate::perprocess::PerProcess;

/// Work handed to the driver thread: called there, inside the [`LocalSet`].
type Job = Box<dyn FnOnce() + Send>;

/// This process's runtime and the queue into its driver thread's [`LocalSet`].
///
/// Dereferences to the [`Runtime`]: `block_on`, `spawn` and `spawn_blocking` work from any
/// thread as usual (a thread calling `block_on` polls its own future and is woken by the
/// driver thread).
pub struct Rt {
    rt: Runtime,
    jobs: mpsc::UnboundedSender<Job>,
}

impl Deref for Rt {
    type Target = Runtime;

    fn deref(&self) -> &Runtime {
        &self.rt
    }
}

impl Rt {
    /// Builds `make()`'s future on the driver thread and polls it there, to completion.
    ///
    /// The future need not be `Send` (sandbox-core's are not provably so: a rustc limitation
    /// with async closures); only `make` crosses threads. Returns `false`, without calling
    /// `make`, if the driver thread is gone (it never exits while the process lives).
    pub fn spawn_run<F, Fut>(&self, make: F) -> bool
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        self.jobs
            .send(Box::new(move || {
                drop(tokio::task::spawn_local(make()));
            }))
            .is_ok()
    }
}

/// The runtime of the process that built it (see [`PerProcess`]).
static RUNTIME: PerProcess<&'static Rt> = PerProcess::new();

/// Builds a runtime and starts its driver thread.
fn build() -> std::io::Result<&'static Rt> {
    let rt = Builder::new_current_thread().enable_all().build()?;
    let (jobs, mut queue) = mpsc::unbounded_channel::<Job>();
    let built: &'static Rt = Box::leak(Box::new(Rt { rt, jobs }));
    std::thread::Builder::new()
        .name("createos-rt".into())
        .spawn(move || {
            let local = LocalSet::new();
            built.rt.block_on(local.run_until(async move {
                // The sender lives as long as the process (the `Rt` is leaked): this loop,
                // and with it the runtime's driving, ends only with the process.
                while let Some(job) = queue.recv().await {
                    job();
                }
            }));
        })?;
    Ok(built)
}

/// Returns this process's runtime, building it (and its driver thread) on first use in this
/// process.
///
/// The slot's lock is held only to read or swap it, never while the thread is spawned, so a
/// `fork()` racing with another thread's first use cannot leave the child waiting on a lock
/// its owner took with it. Two threads racing at first use may each build one; the loser's
/// never ran anything and stays parked on its empty queue (a leak of one idle thread, once).
pub fn get() -> std::io::Result<&'static Rt> {
    if let Some(rt) = RUNTIME.current() {
        return Ok(rt);
    }
    let built = build()?;
    // Whatever was in the slot belonged to a parent process: it is leaked on purpose.
    Ok(RUNTIME.get_or_init(|| built))
}

/// Returns this process's runtime if one has been built, without building one.
pub fn existing() -> Option<&'static Rt> {
    RUNTIME.current()
}

/// Forgets a runtime inherited from a parent process, so the next use builds a fresh one.
///
/// A runtime built by this process is left alone: runs in flight keep working.
pub fn forget_inherited() {
    RUNTIME.forget_inherited();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_runtime_per_process() {
        let a = get().unwrap();
        let b = get().unwrap();
        assert!(std::ptr::eq(a, b));
        assert!(std::ptr::eq(existing().unwrap(), a));
        // Forgetting only drops runtimes from other processes.
        forget_inherited();
        assert!(std::ptr::eq(get().unwrap(), a));
        assert_eq!(a.block_on(async { 40 + 2 }), 42);
    }

    #[test]
    fn runs_are_polled_on_the_driver_thread() {
        let rt = get().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let caller = std::thread::current().id();
        assert!(rt.spawn_run(move || async move {
            // A `!Send` value held across an await: only the driver thread ever sees it.
            let here = std::rc::Rc::new(std::thread::current().id());
            tokio::task::yield_now().await;
            let spawned = tokio::spawn(async { 1 }).await.unwrap();
            let _ = tx.send((
                *here,
                std::thread::current().name().map(str::to_owned),
                spawned,
            ));
        }));
        let (thread, name, spawned) = rx.recv().unwrap();
        assert_ne!(thread, caller);
        assert_eq!(name.as_deref(), Some("createos-rt"));
        assert_eq!(spawned, 1, "tasks spawned from a run are driven too");
    }
}
