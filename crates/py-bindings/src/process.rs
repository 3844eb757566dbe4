//! Per-process state: which process built which backend, and what a process still owes.
//!
//! A `NativeBackend` object survives `fork()`, but its backend (connection pool, reaper,
//! guest registry) belongs to the runtime of the process that built it. So the backend is
//! held together with the id of the process that built it ([`PerProcess`]): a process with
//! another id builds its own on first use and leaks, never drops, the inherited one (dropping
//! it would release connections and tasks that belong to the parent's runtime).
//!
//! Every backend is also remembered here by process id, so SIGTERM can shut down the current
//! process's backends without touching any Python object ([`shutdown_all`]).
//!
//! Fork rule for this crate's per-process slots (here, the runtime's, the component's and the
//! executor's): lock them only on a thread that holds the GIL, never inside a run's future on
//! the driver thread. `os.fork()` holds the GIL, so no other thread can be holding a slot at
//! the fork, and a child never inherits one locked. (SIGTERM's shutdown reads them from the
//! runtime, as the process is ending.)

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::Duration;

use langflow_backend::{Backend, BackendOptions};
use sandbox_core::session::Session;

/// Time allowed for a shutdown to destroy every live guest.
pub const SHUTDOWN_BUDGET: Duration = Duration::from_secs(30);

/// Id of the process that imported the extension. A process with another id was forked from
/// it: such children commonly end with `os._exit` (multiprocessing, pre-fork servers), which
/// skips `atexit`, so they destroy each guest before `run()` returns instead of in the
/// background.
static IMPORTED_BY: OnceLock<u32> = OnceLock::new();

/// Records the importing process; called once, when the module is initialised.
pub fn note_import() {
    IMPORTED_BY.get_or_init(std::process::id);
}

/// Whether this process was forked from the one that imported the extension (such a process
/// commonly ends with `os._exit`, so it keeps no idle guests).
pub fn forked() -> bool {
    IMPORTED_BY
        .get()
        .is_some_and(|&origin| origin != std::process::id())
}

/// One process's backend and the number of its runs in flight.
pub struct Live {
    /// The backend itself.
    pub backend: Backend,
    inflight: AtomicUsize,
    /// Built in a process forked from the one that imported the extension. Such a process
    /// commonly ends with `os._exit` (multiprocessing, pre-fork servers), which skips `atexit`
    /// and kills background work, so every run settles its guest before `run()` returns.
    pub forked: bool,
}

impl Live {
    /// Waits until this process holds no more guests than other runs in flight can account
    /// for: the interrupted run's guest, handed to the reaper when its future was dropped, is
    /// then destroyed (or the reaper is still retrying when the caller's bound expires). The
    /// warm pool's idle guests (`CREATEOS_SANDBOX_WARM_POOL`) belong to no run and are not
    /// waited for; shutdown destroys them.
    pub async fn settle_interrupted(&self) {
        loop {
            if self.backend.unpooled_guests() <= self.inflight.load(Ordering::SeqCst) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Counts a run as in flight for as long as it lives.
pub struct InFlight(pub Arc<Live>);

impl InFlight {
    /// Counts one more run of `live`.
    pub fn new(live: Arc<Live>) -> Self {
        live.inflight.fetch_add(1, Ordering::SeqCst);
        Self(live)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Every backend built in this process image, with the id of the process that built it.
static LIVES: Mutex<Vec<(u32, Weak<Live>)>> = Mutex::new(Vec::new());

fn remember(live: &Arc<Live>) {
    let pid = std::process::id();
    let mut lives = LIVES.lock().unwrap_or_else(PoisonError::into_inner);
    // Entries of other processes (a parent) and of dropped backends are dead weight here.
    lives.retain(|(owner, weak)| *owner == pid && weak.strong_count() > 0);
    lives.push((pid, Arc::downgrade(live)));
}

/// Every surface's shutdown at once (the sandbox backends, the component's fresh guests, the
/// executor's flow runs): SIGTERM's cleanup, whichever surface armed the handler first.
pub async fn shutdown_every_surface() {
    tokio::join!(
        shutdown_all(),
        crate::component::shutdown_component(),
        crate::executor::shutdown_executor()
    );
}

/// Shuts down every backend of this process, concurrently, within [`SHUTDOWN_BUDGET`].
pub async fn shutdown_all() {
    let pid = std::process::id();
    let lives: Vec<Arc<Live>> = LIVES
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .filter(|(owner, _)| *owner == pid)
        .filter_map(|(_, weak)| weak.upgrade())
        .collect();
    let all = futures::future::join_all(lives.iter().map(|live| live.backend.shutdown()));
    if tokio::time::timeout(SHUTDOWN_BUDGET, all).await.is_err() {
        tracing::warn!(
            target: "langflow_sandbox_createos",
            "shutdown did not finish within {}s; remaining guests are bounded by auto-pause",
            SHUTDOWN_BUDGET.as_secs()
        );
    }
}

/// The session (one control plane and connection pool per account, one credential check and
/// one shape-catalog fetch) that every surface of this process shares, with the id of the
/// process that built it.
static SESSION: Mutex<Option<(u32, Session)>> = Mutex::new(None);

/// This process's session, built on first use. A child after `fork()` builds its own and
/// leaks the parent's (its connections belong to the parent's runtime).
pub fn session() -> Session {
    let pid = std::process::id();
    let mut slot = SESSION.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((owner, session)) = slot.as_ref()
        && *owner == pid
    {
        return session.clone();
    }
    if let Some((_, inherited)) = slot.take() {
        std::mem::forget(inherited);
    }
    let session = Session::default();
    *slot = Some((pid, session.clone()));
    session
}

/// Whose backend a [`PerProcess`] holds, as seen from the calling process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// None built yet (or shut down).
    Idle,
    /// Built by this process.
    Active,
    /// Built by a parent process before a `fork()`; unused here.
    Inherited,
}

type Slot = Option<(u32, Arc<Live>)>;

/// A backend together with the id of the process that built it.
pub struct PerProcess {
    slot: Mutex<Slot>,
}

impl PerProcess {
    /// Holds nothing: no thread, no I/O, no environment read.
    pub const fn new() -> Self {
        Self {
            slot: Mutex::new(None),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// This process's backend, built on first use (in a new process, too).
    pub fn current(&self) -> Arc<Live> {
        let pid = std::process::id();
        let mut slot = self.lock();
        if let Some((owner, backend)) = slot.as_ref()
            && *owner == pid
        {
            return Arc::clone(backend);
        }
        forget_foreign(&mut slot);
        let forked = IMPORTED_BY.get().is_some_and(|&origin| origin != pid);
        let live = Arc::new(Live {
            backend: Backend::with_options(BackendOptions {
                background_destroy: !forked,
                // Idle pool guests would outlive an `os._exit`: no warm pool in a forked child.
                pool_allowed: !forked,
                session: Some(session()),
                ..BackendOptions::default()
            }),
            inflight: AtomicUsize::new(0),
            forked,
        });
        *slot = Some((pid, Arc::clone(&live)));
        remember(&live);
        live
    }

    /// Takes this process's backend out, if it built one; an inherited one is forgotten.
    pub fn take(&self) -> Option<Arc<Live>> {
        let mut slot = self.lock();
        forget_foreign(&mut slot);
        slot.take().map(|(_, live)| live)
    }

    /// Forgets a backend inherited from a parent process; keeps this process's own.
    pub fn forget_inherited(&self) {
        forget_foreign(&mut self.lock());
    }

    /// Whose backend is held.
    pub fn state(&self) -> State {
        match self.lock().as_ref() {
            None => State::Idle,
            Some((owner, _)) if *owner == std::process::id() => State::Active,
            Some(_) => State::Inherited,
        }
    }
}

/// Leaks a backend that a parent process built: dropping it here would release connections
/// and tasks that belong to the parent's runtime.
fn forget_foreign(slot: &mut Slot) {
    if matches!(slot, Some((owner, _)) if *owner != std::process::id())
        && let Some((_, inherited)) = slot.take()
    {
        std::mem::forget(inherited);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_nothing_until_first_use_then_the_callers_backend() {
        let held = PerProcess::new();
        assert_eq!(held.state(), State::Idle);
        let first = held.current();
        assert_eq!(held.state(), State::Active);
        // The same process gets the same backend back, not a new one.
        assert!(Arc::ptr_eq(&first, &held.current()));
        let taken = held.take().expect("this process's backend");
        assert!(Arc::ptr_eq(&first, &taken));
        assert_eq!(held.state(), State::Idle);
        assert!(held.take().is_none());
    }

    #[test]
    fn an_inherited_backend_is_never_handed_out_and_is_forgotten() {
        let held = PerProcess::new();
        let parent = held.current();
        // Pretend a parent with another id built it.
        held.lock().as_mut().expect("built").0 = std::process::id().wrapping_add(1);
        assert_eq!(held.state(), State::Inherited);
        let own = held.current();
        assert!(!Arc::ptr_eq(&parent, &own));
        assert_eq!(held.state(), State::Active);
        // Forgetting keeps this process's own backend.
        held.forget_inherited();
        assert_eq!(held.state(), State::Active);
    }

    #[test]
    fn a_child_starts_with_an_empty_warm_pool_of_its_own() {
        let held = PerProcess::new();
        let parent = held.current();
        held.lock().as_mut().expect("built").0 = std::process::id().wrapping_add(1);
        let own = held.current();
        // The pool lives inside the backend: a child's new backend holds none of the
        // parent's idle guests and has counted nothing yet.
        assert!(!Arc::ptr_eq(&parent, &own));
        assert_eq!(
            own.backend.warm_pool(),
            langflow_backend::PoolStats::default()
        );
        assert_eq!(own.backend.unpooled_guests(), 0);
    }

    #[test]
    fn in_flight_counts_while_alive() {
        let held = PerProcess::new();
        let live = held.current();
        let run = InFlight::new(Arc::clone(&live));
        assert_eq!(live.inflight.load(Ordering::SeqCst), 1);
        drop(run);
        assert_eq!(live.inflight.load(Ordering::SeqCst), 0);
    }
}
