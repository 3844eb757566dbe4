//! Every guest the suite created, so that each one is destroyed on every path (a failed check,
//! an error, Ctrl-C) and the run's cost can be stated.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// One guest the suite knows about.
#[derive(Debug)]
struct Guest {
    id: String,
    name: String,
    /// When the create answer arrived (or the sweep found it).
    since: Instant,
    /// When a DELETE for it was accepted.
    ended: Option<Instant>,
}

/// The suite's guests, shared between the checks and the cleanup.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    guests: Mutex<Vec<Guest>>,
    /// Creates sent whose answer has not been handled yet.
    inflight: Arc<AtomicUsize>,
}

/// Counts one create in flight until dropped.
#[derive(Debug)]
pub(crate) struct CreateInFlight(Arc<AtomicUsize>);

impl Drop for CreateInFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Registry {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Guest>> {
        self.guests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Counts a create as in flight until the returned guard is dropped (after its answer was
    /// registered), so cleanup can wait for answers that are still on their way.
    pub(crate) fn begin_create(&self) -> CreateInFlight {
        self.inflight.fetch_add(1, Ordering::SeqCst);
        CreateInFlight(Arc::clone(&self.inflight))
    }

    /// Creates whose answer has not been handled yet.
    pub(crate) fn inflight(&self) -> usize {
        self.inflight.load(Ordering::SeqCst)
    }

    /// Notes a guest the suite created (or found under its prefix). A known id is not counted
    /// twice.
    pub(crate) fn created(&self, id: &str, name: &str) {
        let mut g = self.lock();
        if g.iter().any(|x| x.id == id) {
            return;
        }
        g.push(Guest {
            id: id.to_owned(),
            name: name.to_owned(),
            since: Instant::now(),
            ended: None,
        });
    }

    /// Notes that a DELETE for this guest was accepted (or that it is gone already).
    pub(crate) fn destroyed(&self, id: &str) {
        if let Some(x) = self.lock().iter_mut().find(|x| x.id == id)
            && x.ended.is_none()
        {
            x.ended = Some(Instant::now());
        }
    }

    /// `(id, name)` of every guest without an accepted DELETE.
    pub(crate) fn live(&self) -> Vec<(String, String)> {
        self.lock()
            .iter()
            .filter(|x| x.ended.is_none())
            .map(|x| (x.id.clone(), x.name.clone()))
            .collect()
    }

    /// Guests created, guests destroyed, and the sum of their lifetimes in seconds (create
    /// answer to accepted DELETE; a guest still live counts up to now).
    pub(crate) fn totals(&self) -> (usize, usize, f64) {
        let g = self.lock();
        let now = Instant::now();
        let destroyed = g.iter().filter(|x| x.ended.is_some()).count();
        let secs = g
            .iter()
            .map(|x| x.ended.unwrap_or(now).duration_since(x.since).as_secs_f64())
            .sum();
        (g.len(), destroyed, secs)
    }
}

#[cfg(test)]
mod tests {
    use super::Registry;

    #[test]
    fn counts_each_guest_once_and_tracks_live_ones() {
        let r = Registry::default();
        r.created("a", "lc-1");
        r.created("a", "lc-1");
        r.created("b", "lc-2");
        r.destroyed("a");
        r.destroyed("a");
        let (created, destroyed, secs) = r.totals();
        assert_eq!((created, destroyed), (2, 1));
        assert!(secs >= 0.0);
        assert_eq!(r.live(), vec![("b".to_owned(), "lc-2".to_owned())]);
    }

    #[test]
    fn creates_in_flight_are_counted_until_the_guard_drops() {
        let r = Registry::default();
        let a = r.begin_create();
        let b = r.begin_create();
        assert_eq!(r.inflight(), 2);
        drop(a);
        assert_eq!(r.inflight(), 1);
        drop(b);
        assert_eq!(r.inflight(), 0);
    }
}
