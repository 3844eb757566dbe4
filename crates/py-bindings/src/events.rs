//! Observation events to Python, pulled and added up: `enable_events()` and `drain_events()`.
//!
//! Once Python asked for events ([`enable_events`]), every session this process builds gets
//! an [`EventQueue`] as its observer. Each event is added to what was held since the last
//! drain: counts and sums by label (no key, code or output: the labels are surfaces,
//! outcomes, reasons, routes, status classes and shapes), plus each run's duration and each
//! destroyed guest's usage record, those two bounded at [`EVENT_CAP`] each, the oldest
//! dropped and counted. Adding never blocks a run beyond one short mutex hold and never
//! touches Python. Python drains from a thread that holds the GIL ([`drain_events`]) at a
//! scrape, from a small daemon thread, now and then after a run, and at exit, and pays one
//! step per label set that changed, not one per event: many runs between two drains cost
//! it about what one does. No callback from a runtime thread into Python, so no GIL is ever
//! taken by a tokio worker and nothing can run during interpreter finalisation.
//!
//! Fork: the queue is held per process ([`crate::perprocess::PerProcess`]), so a forked child
//! starts with an empty queue of its own, installed on the session the child builds; the
//! parent's queue, and the events it held at the fork, are never seen in the child. The
//! switch [`enable_events`] set is inherited (a child of a process that asked for events
//! keeps producing them). The queue's mutex is locked by runtime threads (to add) and by
//! the draining thread; a child never locks its parent's queue, so one inherited locked is
//! never waited for.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use sandbox_core::observe::{DestroyReason, Event, GuestUsage, Observer, RunOutcome, StatusClass};
use sandbox_core::provider::ProviderKind;
use sandbox_core::session::Session;
use sandbox_core::surface::SurfaceKind;

use crate::perprocess::PerProcess;

/// Run durations and usage records kept while nobody drains (each); the oldest are dropped
/// first (and counted) past it. Counts and sums are added up in place, so they never drop.
pub const EVENT_CAP: usize = 65_536;

/// What one count or sum is of: a family and its labels (all from fixed sets, but for the
/// shape of a guest-seconds sum, which is the operator's configuration).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Tally {
    Created(SurfaceKind),
    Adopted(SurfaceKind),
    LetGo(SurfaceKind),
    Destroyed(SurfaceKind, DestroyReason),
    GuestSeconds(SurfaceKind, String),
    Runs(SurfaceKind, RunOutcome),
    Request(&'static str, StatusClass),
    Pool(SurfaceKind, bool),
    Waits(SurfaceKind),
    WaitSeconds(SurfaceKind),
    Refusals(SurfaceKind),
    Orphans,
    Store(sandbox_core::observe::StoreEvent),
}

impl Tally {
    /// `(kind, label, label)` as [`drain_events`] hands them over.
    fn labels(&self) -> (&'static str, &str, &str) {
        match self {
            Tally::Created(s) => ("guest_created", s.as_str(), ""),
            Tally::Adopted(s) => ("guest_adopted", s.as_str(), ""),
            Tally::LetGo(s) => ("guest_let_go", s.as_str(), ""),
            Tally::Destroyed(s, r) => ("guest_destroyed", s.as_str(), r.as_str()),
            Tally::GuestSeconds(s, shape) => ("guest_seconds", s.as_str(), shape),
            Tally::Runs(s, o) => ("run_finished", s.as_str(), o.as_str()),
            Tally::Request(route, status) => ("control_request", route, status.as_str()),
            Tally::Pool(s, hit) => ("pool", s.as_str(), if *hit { "hit" } else { "miss" }),
            Tally::Waits(s) => ("admission_wait", s.as_str(), ""),
            Tally::WaitSeconds(s) => ("admission_wait_seconds", s.as_str(), ""),
            Tally::Refusals(s) => ("admission_refused", s.as_str(), ""),
            Tally::Orphans => ("orphans_reaped", "", ""),
            Tally::Store(what) => ("admission_store", what.as_str(), ""),
        }
    }
}

/// What happened since the last drain: counts and sums added up by label, each run's
/// duration (for a histogram) and each destroyed guest's usage record.
#[derive(Debug, Default)]
struct Held {
    tallies: HashMap<(ProviderKind, Tally), f64>,
    run_seconds: VecDeque<(ProviderKind, SurfaceKind, f64)>,
    usages: VecDeque<GuestUsage>,
    dropped: u64,
    /// The provider of the event being added.
    provider: ProviderKind,
}

impl Held {
    fn add(&mut self, tally: Tally, n: f64) {
        *self.tallies.entry((self.provider, tally)).or_default() += n;
    }

    fn keep<T>(queue: &mut VecDeque<T>, dropped: &mut u64, item: T) {
        if queue.len() >= EVENT_CAP {
            queue.pop_front();
            *dropped += 1;
        }
        queue.push_back(item);
    }

    fn observe(&mut self, provider: ProviderKind, event: &Event<'_>) {
        self.provider = provider;
        match *event {
            Event::GuestCreated { surface, .. } => self.add(Tally::Created(surface), 1.0),
            Event::GuestAdopted { surface } => self.add(Tally::Adopted(surface), 1.0),
            Event::GuestLetGo { surface } => self.add(Tally::LetGo(surface), 1.0),
            Event::GuestDestroyed(u) => {
                self.add(Tally::Destroyed(u.surface, u.reason), 1.0);
                self.add(
                    Tally::GuestSeconds(u.surface, u.shape.clone()),
                    u.guest_seconds,
                );
                Self::keep(&mut self.usages, &mut self.dropped, u.clone());
            }
            Event::RunFinished {
                surface,
                outcome,
                seconds,
            } => {
                self.add(Tally::Runs(surface, outcome), 1.0);
                Self::keep(
                    &mut self.run_seconds,
                    &mut self.dropped,
                    (provider, surface, seconds),
                );
            }
            Event::ControlRequest { route, status } => self.add(Tally::Request(route, status), 1.0),
            Event::Pool { surface, hit } => self.add(Tally::Pool(surface, hit), 1.0),
            Event::AdmissionWait { surface, seconds } => {
                self.add(Tally::Waits(surface), 1.0);
                self.add(Tally::WaitSeconds(surface), seconds);
            }
            Event::AdmissionRefused { surface } => self.add(Tally::Refusals(surface), 1.0),
            #[allow(clippy::cast_precision_loss)] // counts far below 2^52
            Event::OrphansReaped { count } => self.add(Tally::Orphans, count as f64),
            Event::AdmissionStore(what) => self.add(Tally::Store(what), 1.0),
        }
    }
}

/// Where one process's events are added up until Python drains them.
#[derive(Debug, Default)]
pub struct EventQueue {
    held: Mutex<Held>,
}

impl EventQueue {
    /// Everything held, emptied.
    fn take(&self) -> Held {
        std::mem::take(&mut *self.held.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

impl Observer for EventQueue {
    fn observe(&self, event: &Event<'_>) {
        self.observe_on(ProviderKind::CreateOs, event);
    }

    fn observe_on(&self, provider: ProviderKind, event: &Event<'_>) {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .observe(provider, event);
    }
}

/// Whether Python asked for events (inherited by a forked child).
static ENABLED: AtomicBool = AtomicBool::new(false);

/// This process's queue.
static QUEUE: PerProcess<Arc<EventQueue>> = PerProcess::new();

/// Registers this process's queue as `session`'s observer, if Python asked for events. Called
/// on every session the process builds.
pub fn observe_session(session: &Session) {
    if ENABLED.load(Ordering::Acquire) {
        let queue: Arc<dyn Observer> = QUEUE.get_or_init(Arc::default);
        session.observation().set_observer(Some(queue));
    }
}

/// Turns queueing on for every session this process (and its forked children) builds from now
/// on; `crate::session::enable_events` also installs the queue on a session already built.
pub fn enable() {
    ENABLED.store(true, Ordering::Release);
}

/// Whether `CREATEOS_METRICS` leaves this process's metrics and spans on (sandbox-core's
/// rule: `off`, `0`, `false`, `no` or `disabled` turn them off; anything else leaves them on).
/// Read from the environment now; no I/O.
#[pyfunction]
pub fn metrics_enabled() -> bool {
    sandbox_core::settings::metrics_enabled(&|k| std::env::var(k).ok())
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn usage_dict<'py>(py: Python<'py>, u: &GuestUsage) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("surface", u.surface.as_str())?;
    d.set_item("guest", &u.guest)?;
    d.set_item("flow_id", u.flow_id.as_deref())?;
    d.set_item("node_id", u.node_id.as_deref())?;
    d.set_item("session_hash", u.session_hash.as_deref())?;
    d.set_item("shape", &u.shape)?;
    d.set_item("rootfs", &u.rootfs)?;
    d.set_item("egress", u.egress)?;
    d.set_item("created_at", unix_seconds(u.created_at))?;
    d.set_item("destroyed_at", unix_seconds(u.destroyed_at))?;
    d.set_item("guest_seconds", u.guest_seconds)?;
    d.set_item("runs", u.runs)?;
    d.set_item("outcome", u.outcome.map(RunOutcome::as_str))?;
    d.set_item("bytes_returned", u.bytes_returned)?;
    d.set_item("reason", u.reason.as_str())?;
    d.set_item("worker", u.worker)?;
    d.set_item("host", &u.host)?;
    d.set_item("provider", u.provider.as_str())?;
    Ok(d)
}

/// What [`drain_events`] hands Python: the tallies, the run durations, the usage records and
/// the drop count.
type Drained<'py> = (
    Bound<'py, PyList>,
    Bound<'py, PyList>,
    Bound<'py, PyList>,
    u64,
);

/// Takes what this process observed since the last call, added up: `(tallies, run_seconds,
/// usages, dropped)`. `tallies` holds one `(kind, label, label, value, provider)` per family,
/// labels and provider (`createos`, `opensandbox`) that changed: `("guest_created", surface, "", n)`, `("guest_destroyed", surface,
/// reason, n)`, `("guest_seconds", surface, shape, seconds)`, `("run_finished", surface,
/// outcome, n)`, `("control_request", route, status_class, n)`, `("pool", surface,
/// "hit"|"miss", n)`, `("admission_wait", surface, "", n)`, `("admission_wait_seconds",
/// surface, "", seconds)`, `("admission_refused", surface, "", n)`, `("orphans_reaped", "",
/// "", n)`. `run_seconds` holds `(surface, seconds, provider)` per run, oldest first; `usages` a dict
/// per destroyed guest (only with `usage=True`: otherwise they are discarded), oldest first;
/// `dropped` how many of either were dropped meanwhile (each holds [`EVENT_CAP`]). So a
/// drain costs Python one step per label set, not per event. Empty before
/// [`enable_events`]. Never a key, code or output: a usage record carries the guest's name,
/// flow and node ids, a hash of the session id, its shape, image, egress kind, times, runs,
/// outcome, bytes returned, reason, worker, host and provider.
#[pyfunction]
#[pyo3(signature = (usage = true))]
pub fn drain_events(py: Python<'_>, usage: bool) -> PyResult<Drained<'_>> {
    let (tallies, runs, usages) = (PyList::empty(py), PyList::empty(py), PyList::empty(py));
    let Some(queue) = QUEUE.current() else {
        return Ok((tallies, runs, usages, 0));
    };
    let held = queue.take();
    for ((provider, tally), value) in &held.tallies {
        let (kind, a, b) = tally.labels();
        tallies.append((kind, a, b, *value, provider.as_str()))?;
    }
    for (provider, surface, seconds) in &held.run_seconds {
        runs.append((surface.as_str(), *seconds, provider.as_str()))?;
    }
    if usage {
        for u in &held.usages {
            usages.append(usage_dict(py, u)?)?;
        }
    }
    Ok((tallies, runs, usages, held.dropped))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(t: Tally) -> (ProviderKind, Tally) {
        (ProviderKind::CreateOs, t)
    }

    #[test]
    fn counts_add_up_by_label_and_only_durations_and_usages_can_drop() {
        let q = EventQueue::default();
        for _ in 0..EVENT_CAP + 3 {
            q.observe(&Event::RunFinished {
                surface: SurfaceKind::Backend,
                outcome: RunOutcome::Ok,
                seconds: 0.5,
            });
        }
        for status in [
            StatusClass::ClientError,
            StatusClass::ClientError,
            StatusClass::Success,
        ] {
            q.observe(&Event::ControlRequest {
                route: "create",
                status,
            });
        }
        q.observe(&Event::OrphansReaped { count: 4 });
        let held = q.take();
        assert_eq!(held.run_seconds.len(), EVENT_CAP);
        assert_eq!(held.dropped, 3);
        #[allow(clippy::cast_precision_loss)]
        let runs = (EVENT_CAP + 3) as f64;
        assert_eq!(
            held.tallies
                .get(&c(Tally::Runs(SurfaceKind::Backend, RunOutcome::Ok))),
            Some(&runs),
            "a count is never dropped"
        );
        assert_eq!(
            held.tallies
                .get(&c(Tally::Request("create", StatusClass::ClientError))),
            Some(&2.0)
        );
        assert_eq!(
            held.tallies
                .get(&c(Tally::Request("create", StatusClass::Success))),
            Some(&1.0)
        );
        assert_eq!(held.tallies.get(&c(Tally::Orphans)), Some(&4.0));
        assert_eq!(held.tallies.len(), 4);
        let held = q.take();
        assert!(held.tallies.is_empty() && held.run_seconds.is_empty());
        assert_eq!(held.dropped, 0, "the drop count starts again after a take");
    }

    #[test]
    fn another_providers_events_are_added_up_apart() {
        let q = EventQueue::default();
        let run = Event::RunFinished {
            surface: SurfaceKind::Backend,
            outcome: RunOutcome::Ok,
            seconds: 0.5,
        };
        q.observe(&run);
        q.observe_on(ProviderKind::OpenSandbox, &run);
        q.observe_on(ProviderKind::OpenSandbox, &run);
        let held = q.take();
        let ok = Tally::Runs(SurfaceKind::Backend, RunOutcome::Ok);
        assert_eq!(held.tallies.get(&c(ok.clone())), Some(&1.0));
        assert_eq!(
            held.tallies.get(&(ProviderKind::OpenSandbox, ok)),
            Some(&2.0)
        );
        assert_eq!(
            held.run_seconds.back(),
            Some(&(ProviderKind::OpenSandbox, SurfaceKind::Backend, 0.5))
        );
    }

    #[test]
    fn a_destroyed_guest_is_counted_summed_and_kept_with_its_usage_only() {
        let q = EventQueue::default();
        let usage = GuestUsage {
            surface: SurfaceKind::Executor,
            guest: "lf-x".into(),
            flow_id: Some("f".into()),
            node_id: None,
            session_hash: Some("abc".into()),
            shape: "s-1".into(),
            rootfs: "python:3.12".into(),
            egress: "none",
            created_at: SystemTime::now(),
            destroyed_at: SystemTime::now(),
            guest_seconds: 1.5,
            runs: 1,
            outcome: Some(RunOutcome::TimedOut),
            bytes_returned: 7,
            reason: DestroyReason::Timeout,
            worker: 42,
            host: "host-a".into(),
            provider: ProviderKind::CreateOs,
        };
        q.observe(&Event::GuestDestroyed(&usage));
        q.observe(&Event::GuestDestroyed(&usage));
        let held = q.take();
        assert_eq!(held.usages, [usage.clone(), usage]);
        assert_eq!(
            held.tallies.get(&c(Tally::Destroyed(
                SurfaceKind::Executor,
                DestroyReason::Timeout
            ))),
            Some(&2.0)
        );
        assert_eq!(
            held.tallies
                .get(&c(Tally::GuestSeconds(SurfaceKind::Executor, "s-1".into()))),
            Some(&3.0)
        );
        assert_eq!(
            Tally::GuestSeconds(SurfaceKind::Executor, "s-1".into()).labels(),
            ("guest_seconds", "executor", "s-1")
        );
    }
}
