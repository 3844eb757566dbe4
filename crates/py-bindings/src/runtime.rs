//! The process's tokio runtime, keyed on the process id.
//!
//! A child created by `fork()` inherits the parent's runtime object but none of its worker
//! threads, and it shares the parent's epoll descriptor: using it hangs the child and can
//! deadlock the parent (build-notes §4). So the runtime is rebuilt on first use in a new
//! process, and the inherited one is leaked, never dropped (dropping it would try to join
//! threads that do not exist in the child).

use std::sync::{Mutex, PoisonError};

use tokio::runtime::{Builder, Runtime};

/// The runtime of the process that built it, with that process's id.
static RUNTIME: Mutex<Option<(u32, &'static Runtime)>> = Mutex::new(None);

/// Upper bound on worker threads: the work is I/O bound, a few threads carry any load.
const MAX_WORKERS: usize = 4;

fn current() -> Option<&'static Runtime> {
    let pid = std::process::id();
    let slot = RUNTIME.lock().unwrap_or_else(PoisonError::into_inner);
    match *slot {
        Some((owner, rt)) if owner == pid => Some(rt),
        _ => None,
    }
}

/// Returns this process's runtime, building it on first use in this process.
///
/// The lock is held only to read or swap the slot, never while threads are spawned, so a
/// `fork()` racing with another thread's first use cannot leave the child waiting on a lock
/// its owner took with it.
pub fn get() -> std::io::Result<&'static Runtime> {
    if let Some(rt) = current() {
        return Ok(rt);
    }
    let workers = std::thread::available_parallelism()
        .map_or(2, std::num::NonZero::get)
        .clamp(2, MAX_WORKERS);
    let built = Builder::new_multi_thread()
        .worker_threads(workers)
        .thread_name("createos-rt")
        .enable_all()
        .build()?;
    let pid = std::process::id();
    let mut slot = RUNTIME.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((owner, rt)) = *slot
        && owner == pid
    {
        // Another thread of this process won the race; ours never ran anything.
        drop(slot);
        built.shutdown_background();
        return Ok(rt);
    }
    let rt: &'static Runtime = Box::leak(Box::new(built));
    // Whatever was in the slot belonged to a parent process: it is leaked on purpose.
    *slot = Some((pid, rt));
    Ok(rt)
}

/// Returns this process's runtime if one has been built, without building one.
pub fn existing() -> Option<&'static Runtime> {
    current()
}

/// Forgets a runtime inherited from a parent process, so the next use builds a fresh one.
///
/// A runtime built by this process is left alone: runs in flight keep working.
pub fn forget_inherited() {
    let pid = std::process::id();
    let mut slot = RUNTIME.lock().unwrap_or_else(PoisonError::into_inner);
    if matches!(*slot, Some((owner, _)) if owner != pid) {
        // The `&'static Runtime` is simply dropped as a reference: the runtime leaks.
        *slot = None;
    }
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
}
