//! Values held per process, and the fork rule of this crate, stated once.
//!
//! A Python object and a static survive `fork()`, but what they hold (connection pools,
//! reapers, the runtime's thread and epoll descriptor) belongs to the process that built it.
//! So each per-process value (the runtime, the session, the backends, the component, the
//! executor, the event queue) is a [`PerProcess`]: held with the id of the process that built
//! it; a process with another id builds its own on first use and leaks, never drops, the
//! inherited one (dropping it would release connections, tasks and threads that belong to the
//! parent's runtime). The slots are locked only to read or swap a value, on a thread that holds
//! the GIL (never inside a run's future on the driver thread): `os.fork()` holds the GIL, so no
//! other thread holds a slot at the fork, and a child never inherits one locked. (SIGTERM's
//! shutdown reads them from the runtime as the process ends.) Which options a forked process's
//! surfaces get is sandbox-core's rule (`SurfaceOptions::for_process`).

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};

/// Id of the process that imported the extension. A process with another id was forked from
/// it: such children commonly end with `os._exit` (multiprocessing, pre-fork servers), which
/// skips `atexit`, so they destroy each guest before `run()` returns instead of in the
/// background.
static IMPORTED_BY: OnceLock<u32> = OnceLock::new();

/// Values built in this process image, remembered weakly with the id of the process that built
/// each, so that SIGTERM's cleanup reaches every one this process still holds (a backend per
/// Python object; lfx may build several).
pub struct Remembered<T> {
    list: Mutex<Vec<(u32, Weak<T>)>>,
}

impl<T> Remembered<T> {
    /// An empty list.
    pub const fn new() -> Self {
        Self {
            list: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<(u32, Weak<T>)>> {
        // A panic while holding this lock cannot leave the list inconsistent.
        self.list.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Remembers `value` as this process's.
    pub fn remember(&self, value: &Arc<T>) {
        let pid = std::process::id();
        let mut list = self.lock();
        // Entries of other processes (a parent) and of dropped values are dead weight here.
        list.retain(|(owner, weak)| *owner == pid && weak.strong_count() > 0);
        list.push((pid, Arc::downgrade(value)));
    }

    /// Every value this process built and still holds.
    pub fn of_this_process(&self) -> Vec<Arc<T>> {
        let pid = std::process::id();
        self.lock()
            .iter()
            .filter(|(owner, _)| *owner == pid)
            .filter_map(|(_, weak)| weak.upgrade())
            .collect()
    }
}

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

    /// Makes the held value look built by another process (a parent before a `fork()`).
    #[cfg(test)]
    pub(crate) fn pretend_inherited(&self) {
        if let Some(held) = self.lock().as_mut() {
            held.0 = std::process::id().wrapping_add(1);
        }
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn holds_nothing_until_first_use_then_the_callers_value() {
        let held: PerProcess<Arc<u32>> = PerProcess::new();
        assert_eq!(held.state(), State::Idle);
        assert!(held.current().is_none());
        let first = held.get_or_init(|| Arc::new(1));
        assert_eq!(held.state(), State::Active);
        // The same process gets the same value back, not a new one.
        assert!(Arc::ptr_eq(&first, &held.get_or_init(|| Arc::new(2))));
        let taken = held.take().expect("this process's value");
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
    fn an_inherited_value_is_never_handed_out_and_is_forgotten() {
        let held: PerProcess<Arc<u32>> = PerProcess::new();
        let parent = held.get_or_init(|| Arc::new(1));
        // Pretend a parent with another id built it.
        held.lock().as_mut().expect("built").0 = std::process::id().wrapping_add(1);
        assert_eq!(held.state(), State::Inherited);
        assert!(
            held.current().is_none(),
            "an inherited value is never handed out"
        );
        let own = held.get_or_init(|| Arc::new(2));
        assert!(!Arc::ptr_eq(&parent, &own));
        assert_eq!(held.state(), State::Active);
        // Forgetting keeps this process's own value.
        held.forget_inherited();
        assert_eq!(held.state(), State::Active);
    }
}
