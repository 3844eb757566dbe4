//! Observation events to Python, pulled: `enable_events()` and `drain_events()`.
//!
//! Once Python asked for events ([`enable_events`]), every session this process builds gets
//! an [`EventQueue`] as its observer: each event is copied (owned, no key, code or output:
//! the labels of the event and a destroyed guest's usage record) into a bounded queue, the
//! oldest dropped and counted past [`EVENT_CAP`]. Pushing never blocks a run beyond one
//! short mutex hold and never touches Python. Python drains the queue from a thread that
//! holds the GIL ([`drain_events`]): after each run, at a scrape, from a small daemon
//! thread, at exit. No callback from a runtime thread into Python, so no GIL is ever taken
//! by a tokio worker and nothing can run during interpreter finalisation.
//!
//! Fork: the queue is held per process ([`crate::process::PerProcess`]), so a forked child
//! starts with an empty queue of its own, installed on the session the child builds; the
//! parent's queue, and the events it held at the fork, are never seen in the child. The
//! switch [`enable_events`] set is inherited (a child of a process that asked for events
//! keeps producing them). The queue's mutex is locked by runtime threads (to push) and by
//! the draining thread; a child never locks its parent's queue, so one inherited locked is
//! never waited for.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};
use sandbox_core::observe::{Event, GuestUsage, Observer, RunOutcome};
use sandbox_core::session::Session;
use sandbox_core::surface::SurfaceKind;

use crate::process::PerProcess;

/// Events kept while nobody drains; the oldest are dropped first (and counted) past it.
pub const EVENT_CAP: usize = 65_536;

/// One event, owned: the labels and figures of an [`Event`], nothing else.
#[derive(Debug, Clone, PartialEq)]
enum Owned {
    Created {
        surface: SurfaceKind,
        shape: String,
    },
    Destroyed(Box<GuestUsage>),
    Run {
        surface: SurfaceKind,
        outcome: &'static str,
        seconds: f64,
    },
    Request {
        route: &'static str,
        status: &'static str,
    },
    Pool {
        surface: SurfaceKind,
        hit: bool,
    },
    AdmissionWait {
        surface: SurfaceKind,
        seconds: f64,
    },
    AdmissionRefused {
        surface: SurfaceKind,
    },
    Orphans {
        count: u64,
    },
}

impl Owned {
    fn of(event: &Event<'_>) -> Self {
        match *event {
            Event::GuestCreated { surface, shape } => Owned::Created {
                surface,
                shape: shape.to_owned(),
            },
            Event::GuestDestroyed(u) => Owned::Destroyed(Box::new(u.clone())),
            Event::RunFinished {
                surface,
                outcome,
                seconds,
            } => Owned::Run {
                surface,
                outcome: outcome.as_str(),
                seconds,
            },
            Event::ControlRequest { route, status } => Owned::Request {
                route,
                status: status.as_str(),
            },
            Event::Pool { surface, hit } => Owned::Pool { surface, hit },
            Event::AdmissionWait { surface, seconds } => Owned::AdmissionWait { surface, seconds },
            Event::AdmissionRefused { surface } => Owned::AdmissionRefused { surface },
            Event::OrphansReaped { count } => Owned::Orphans { count },
        }
    }
}

#[derive(Debug, Default)]
struct Held {
    events: VecDeque<Owned>,
    dropped: u64,
}

/// The bounded queue one process's events wait in until Python drains them.
#[derive(Debug, Default)]
pub struct EventQueue {
    held: Mutex<Held>,
}

impl EventQueue {
    fn push(&self, event: Owned) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        if held.events.len() >= EVENT_CAP {
            held.events.pop_front();
            held.dropped += 1;
        }
        held.events.push_back(event);
    }

    /// Everything queued, and how many were dropped since the last take.
    fn take(&self) -> (VecDeque<Owned>, u64) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let dropped = std::mem::take(&mut held.dropped);
        (std::mem::take(&mut held.events), dropped)
    }
}

impl Observer for EventQueue {
    fn observe(&self, event: &Event<'_>) {
        self.push(Owned::of(event));
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

/// Starts queueing this process's events (and its forked children's) for
/// [`drain_events`]. Idempotent; no thread, no I/O (a session not built yet gets the queue
/// when it is).
#[pyfunction]
pub fn enable_events() {
    ENABLED.store(true, Ordering::Release);
    if let Some(session) = crate::process::current_session() {
        observe_session(&session);
    }
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
    Ok(d)
}

fn to_python<'py>(py: Python<'py>, e: &Owned) -> PyResult<Bound<'py, PyTuple>> {
    let t = match e {
        Owned::Created { surface, shape } => {
            ("guest_created", surface.as_str(), shape.as_str()).into_pyobject(py)?
        }
        Owned::Destroyed(u) => ("guest_destroyed", usage_dict(py, u)?).into_pyobject(py)?,
        Owned::Run {
            surface,
            outcome,
            seconds,
        } => ("run_finished", surface.as_str(), *outcome, *seconds).into_pyobject(py)?,
        Owned::Request { route, status } => {
            ("control_request", *route, *status).into_pyobject(py)?
        }
        Owned::Pool { surface, hit } => ("pool", surface.as_str(), *hit).into_pyobject(py)?,
        Owned::AdmissionWait { surface, seconds } => {
            ("admission_wait", surface.as_str(), *seconds).into_pyobject(py)?
        }
        Owned::AdmissionRefused { surface } => {
            ("admission_refused", surface.as_str()).into_pyobject(py)?
        }
        Owned::Orphans { count } => ("orphans_reaped", *count).into_pyobject(py)?,
    };
    Ok(t)
}

/// Takes every event this process queued since the last call, oldest first, as plain tuples
/// (`("guest_created", surface, shape)`, `("guest_destroyed", usage)`, `("run_finished",
/// surface, outcome, seconds)`, `("control_request", route, status_class)`, `("pool",
/// surface, hit)`, `("admission_wait", surface, seconds)`, `("admission_refused", surface)`,
/// `("orphans_reaped", count)`), and how many were dropped meanwhile (the queue holds
/// [`EVENT_CAP`]). Empty before [`enable_events`]. Never a key, code or output: a usage
/// record carries the guest's name, flow and node ids, a hash of the session id, its shape,
/// image, egress kind, times, runs, outcome, bytes returned and reason.
#[pyfunction]
pub fn drain_events(py: Python<'_>) -> PyResult<(Bound<'_, PyList>, u64)> {
    let Some(queue) = QUEUE.current() else {
        return Ok((PyList::empty(py), 0));
    };
    let (events, dropped) = queue.take();
    let list = PyList::empty(py);
    for e in &events {
        list.append(to_python(py, e)?)?;
    }
    Ok((list, dropped))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sandbox_core::observe::{DestroyReason, StatusClass};

    #[test]
    fn the_queue_keeps_the_newest_and_counts_what_it_dropped() {
        let q = EventQueue::default();
        for _ in 0..EVENT_CAP + 3 {
            q.observe(&Event::OrphansReaped { count: 1 });
        }
        q.observe(&Event::ControlRequest {
            route: "create",
            status: StatusClass::ClientError,
        });
        let (events, dropped) = q.take();
        assert_eq!(events.len(), EVENT_CAP);
        assert_eq!(dropped, 4);
        assert_eq!(
            events.back(),
            Some(&Owned::Request {
                route: "create",
                status: "4xx"
            })
        );
        let (events, dropped) = q.take();
        assert!(events.is_empty());
        assert_eq!(dropped, 0, "the drop count starts again after a take");
    }

    #[test]
    fn a_destroyed_guest_is_copied_with_its_usage_only() {
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
        };
        q.observe(&Event::GuestDestroyed(&usage));
        q.observe(&Event::RunFinished {
            surface: SurfaceKind::Executor,
            outcome: RunOutcome::TimedOut,
            seconds: 2.0,
        });
        let (events, _) = q.take();
        assert_eq!(events[0], Owned::Destroyed(Box::new(usage)));
        assert_eq!(
            events[1],
            Owned::Run {
                surface: SurfaceKind::Executor,
                outcome: "timed_out",
                seconds: 2.0
            }
        );
    }
}
