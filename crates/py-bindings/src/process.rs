//! Per-process state: which process built which surface, and what a process still owes.
//!
//! **The fork rule of this crate**, for every value held per process ([`PerProcess`]: the
//! runtime, the session, the backends, the component and the executor). A Python object and a
//! static survive `fork()`, but what they hold (connection pools, reapers, the runtime's
//! thread and epoll descriptor) belongs to the process that built it. So each value is held
//! with the id of the process that built it; a process with another id builds its own on first
//! use and leaks, never drops, the inherited one (dropping it would release connections, tasks
//! and threads that belong to the parent's runtime). The slots are locked only to read or swap
//! a value, on a thread that holds the GIL (never inside a run's future on the driver thread):
//! `os.fork()` holds the GIL, so no other thread holds a slot at the fork, and a child never
//! inherits one locked. (SIGTERM's shutdown reads them from the runtime as the process ends.)
//!
//! Every backend is also remembered here by process id, so SIGTERM can shut down the current
//! process's backends without touching any Python object ([`shutdown_all`]). Which options a
//! forked process's surfaces get is sandbox-core's rule (`SurfaceOptions::for_process`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::Duration;

use langflow_backend::{Backend, BackendOptions};
use sandbox_core::session::Session;
use sandbox_core::surface::SurfaceOptions;

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

/// [`forked`], for Python (`_native.forked()`): the metrics drain after a forked process's
/// last run in flight, since such a process may end with `os._exit`. No I/O.
#[pyo3::pyfunction]
#[pyo3(name = "forked")]
pub fn forked_py() -> bool {
    forked()
}

/// The options every surface of this process is built with: the process's session, and the
/// fork rule applied when this process was forked.
pub fn surface_options() -> SurfaceOptions {
    SurfaceOptions {
        session: Some(session()),
        ..SurfaceOptions::default()
    }
    .for_process(forked())
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
/// one shape-catalog fetch) that every surface of this process shares.
static SESSION: PerProcess<Session> = PerProcess::new();

/// This process's session, built on first use (a child after `fork()` builds its own).
pub fn session() -> Session {
    SESSION.get_or_init(|| {
        let session = Session::default();
        crate::events::observe_session(&session);
        session
    })
}

/// This process's session, if it built one already.
pub fn current_session() -> Option<Session> {
    SESSION.current()
}

/// Whose value a [`PerProcess`] holds, as seen from the calling process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// None built yet (or taken out).
    Idle,
    /// Built by this process.
    Active,
    /// Built by a parent process before a `fork()`; unused here.
    Inherited,
}

/// A value together with the id of the process that built it (see the fork rule in the module
/// docs). `T` is a cheap handle (an `Arc`, a session, a `&'static`).
pub struct PerProcess<T> {
    slot: Mutex<Option<(u32, T)>>,
}

impl<T: Clone> PerProcess<T> {
    /// Holds nothing: no thread, no I/O, no environment read.
    pub const fn new() -> Self {
        Self {
            slot: Mutex::new(None),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<(u32, T)>> {
        self.slot.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// This process's value, if it built one.
    pub fn current(&self) -> Option<T> {
        let pid = std::process::id();
        self.lock()
            .as_ref()
            .filter(|(owner, _)| *owner == pid)
            .map(|(_, v)| v.clone())
    }

    /// This process's value, built by `make` on first use (in a new process, too). `make` runs
    /// without the lock held (it may start a thread); if another thread of this process
    /// installed a value meanwhile, that one is kept and `make`'s is dropped.
    pub fn get_or_init(&self, make: impl FnOnce() -> T) -> T {
        if let Some(v) = self.current() {
            return v;
        }
        let built = make();
        let pid = std::process::id();
        let mut slot = self.lock();
        if let Some((owner, v)) = slot.as_ref()
            && *owner == pid
        {
            return v.clone();
        }
        forget_foreign(&mut slot);
        *slot = Some((pid, built.clone()));
        built
    }

    /// Takes this process's value out, if it built one; an inherited one is forgotten.
    pub fn take(&self) -> Option<T> {
        let mut slot = self.lock();
        forget_foreign(&mut slot);
        slot.take().map(|(_, v)| v)
    }

    /// Forgets a value inherited from a parent process; keeps this process's own.
    pub fn forget_inherited(&self) {
        forget_foreign(&mut self.lock());
    }

    /// Whose value is held.
    pub fn state(&self) -> State {
        match self.lock().as_ref() {
            None => State::Idle,
            Some((owner, _)) if *owner == std::process::id() => State::Active,
            Some(_) => State::Inherited,
        }
    }
}

/// Leaks a value that a parent process built: dropping it here would release connections,
/// tasks and threads that belong to the parent's runtime.
fn forget_foreign<T>(slot: &mut Option<(u32, T)>) {
    if matches!(slot, Some((owner, _)) if *owner != std::process::id())
        && let Some((_, inherited)) = slot.take()
    {
        std::mem::forget(inherited);
    }
}

/// This process's backend held by one `NativeBackend`, built on first use (see
/// [`PerProcess`]), and remembered for SIGTERM's [`shutdown_all`].
pub fn backend_of(held: &PerProcess<Arc<Live>>) -> Arc<Live> {
    held.get_or_init(|| {
        let live = Arc::new(Live {
            backend: Backend::with_options(BackendOptions {
                surface: surface_options(),
            }),
            inflight: AtomicUsize::new(0),
            forked: forked(),
        });
        remember(&live);
        live
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_nothing_until_first_use_then_the_callers_backend() {
        let held = PerProcess::new();
        assert_eq!(held.state(), State::Idle);
        assert!(held.current().is_none());
        let first = backend_of(&held);
        assert_eq!(held.state(), State::Active);
        // The same process gets the same backend back, not a new one.
        assert!(Arc::ptr_eq(&first, &backend_of(&held)));
        let taken = held.take().expect("this process's backend");
        assert!(Arc::ptr_eq(&first, &taken));
        assert_eq!(held.state(), State::Idle);
        assert!(held.take().is_none());
    }

    #[test]
    fn a_value_built_meanwhile_by_another_thread_wins() {
        let held: PerProcess<Arc<u32>> = PerProcess::new();
        let first = held.get_or_init(|| Arc::new(1));
        // A racing builder's value is dropped, the installed one handed out.
        let again = held.get_or_init(|| Arc::new(2));
        assert!(Arc::ptr_eq(&first, &again));
        held.lock().as_mut().expect("built").0 = std::process::id().wrapping_add(1);
        let inherited = Arc::clone(&first);
        let own = held.get_or_init(|| Arc::new(3));
        assert_eq!(*own, 3);
        // The inherited value was leaked, not dropped: its count still holds the leaked clone.
        assert_eq!(Arc::strong_count(&inherited), 4);
    }

    #[test]
    fn an_inherited_backend_is_never_handed_out_and_is_forgotten() {
        let held = PerProcess::new();
        let parent = backend_of(&held);
        // Pretend a parent with another id built it.
        held.lock().as_mut().expect("built").0 = std::process::id().wrapping_add(1);
        assert_eq!(held.state(), State::Inherited);
        assert!(
            held.current().is_none(),
            "an inherited value is never handed out"
        );
        let own = backend_of(&held);
        assert!(!Arc::ptr_eq(&parent, &own));
        assert_eq!(held.state(), State::Active);
        // Forgetting keeps this process's own backend.
        held.forget_inherited();
        assert_eq!(held.state(), State::Active);
    }

    #[test]
    fn a_child_starts_with_an_empty_warm_pool_of_its_own() {
        let held = PerProcess::new();
        let parent = backend_of(&held);
        held.lock().as_mut().expect("built").0 = std::process::id().wrapping_add(1);
        let own = backend_of(&held);
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
        let live = backend_of(&held);
        let run = InFlight::new(Arc::clone(&live));
        assert_eq!(live.inflight.load(Ordering::SeqCst), 1);
        drop(run);
        assert_eq!(live.inflight.load(Ordering::SeqCst), 0);
    }
}

/// What every surface of this process shares, for `doctor`, as `(level, text)` lines: the
/// live-guest caps, the admission wait and the control-plane retry budget (`info`), or the
/// refusal a bad value gets (`refused`: every run of every surface is refused with it). Read
/// from the environment now; no I/O.
#[pyo3::pyfunction]
pub fn shared_settings() -> Vec<(&'static str, String)> {
    sandbox_core::settings::shared_summary(&|k| std::env::var(k).ok())
        .into_iter()
        .map(|line| match line {
            Ok(text) => ("info", text),
            Err(refusal) => ("refused", refusal),
        })
        .collect()
}

/// One native total: its family name (`createos_…`), its labels, its value.
pub type Sample = (String, std::collections::BTreeMap<String, String>, f64);

/// This process's native totals (see `sandbox_core::observe::Counters::snapshot`), with the
/// admission state now: `createos_admission_live` (guests holding a slot) and
/// `createos_admission_waiting` (runs in line for one). A forked child's are its own. No I/O;
/// never a key, code or output.
#[pyo3::pyfunction]
pub fn counters() -> Vec<Sample> {
    let session = session();
    let adm = session.admission().stats();
    let mut out: Vec<Sample> = session
        .observation()
        .counters()
        .snapshot()
        .into_iter()
        .map(|s| {
            let labels = s
                .labels
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
            (s.name.to_owned(), labels, s.value)
        })
        .collect();
    #[allow(clippy::cast_precision_loss)] // counts far below 2^52
    for (name, value) in [
        ("createos_admission_live", adm.live as f64),
        (
            "createos_admission_waiting",
            (adm.waiting + adm.waiting_per_flow) as f64,
        ),
    ] {
        out.push((name.to_owned(), std::collections::BTreeMap::new(), value));
    }
    out
}
