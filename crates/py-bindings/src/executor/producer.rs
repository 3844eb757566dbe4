//! The runtime's side of a flow run: the producer that drives a `FlowRun` and queues its
//! events for the consumer, within the queue's bytes and the run's host deadline, catching a
//! panic as the run's failure.

use std::future::Future;
use std::io::Write as _;
#[cfg(not(unix))]
use std::net::TcpStream as UnixStream;
#[cfg(unix)]
use std::os::unix::net::UnixStream;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use futures::FutureExt as _;
use langflow_executor::{Event, ExecutorError, FlowRun, Timings};
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio::time::Instant;

use super::stream::{QUEUE_BYTES, Queued, cost};

/// The failure of a run whose producer panicked.
pub(super) fn panicked() -> ExecutorError {
    ExecutorError::Execution(
        "the flow run failed with an internal error (a panic in the executor); the run was \
         stopped and its guest destroyed, and the flow may have run. This is a bug in \
         langflow-sandbox-createos"
            .to_owned(),
    )
}

/// The failure of a run whose consumer did not take its events before the host deadline.
pub(super) fn too_slow() -> ExecutorError {
    ExecutorError::Execution(format!(
        "the flow's events were not read in time: the host holds at most {QUEUE_BYTES} bytes of \
         a run's events, and they waited for the consumer until the run's host deadline \
         (CREATEOS_EXECUTOR_TIMEOUT_SECONDS plus its grace), so the run was stopped and its \
         guest destroyed; the flow may have run. Read a run's events as they arrive"
    ))
}

/// A started flow run, as the producer drives it: a [`FlowRun`] (tests drive stand-ins).
pub(super) trait Run {
    /// The next event; `Ok(None)` after the last.
    fn next(&mut self) -> impl Future<Output = Result<Option<Event>, ExecutorError>>;
    /// Stops the run and destroys its guest.
    fn close(&mut self) -> impl Future<Output = ()>;
    /// When the host gives up on the run, whatever the guest does.
    fn host_deadline(&self) -> Instant;
    /// Where the run's time went so far.
    fn timings(&self) -> Timings {
        Timings::default()
    }
    /// How the run ended, once it ended.
    fn outcome(&self) -> Option<&'static str> {
        None
    }
}

impl Run for FlowRun {
    fn next(&mut self) -> impl Future<Output = Result<Option<Event>, ExecutorError>> {
        FlowRun::next(self)
    }

    fn close(&mut self) -> impl Future<Output = ()> {
        FlowRun::close(self)
    }

    fn host_deadline(&self) -> Instant {
        FlowRun::host_deadline(self)
    }

    fn timings(&self) -> Timings {
        FlowRun::timings(self)
    }

    fn outcome(&self) -> Option<&'static str> {
        FlowRun::outcome(self)
    }
}

/// A run whose phases are published when it is dropped (however the producer's loop ends).
struct Published<'a, R: Run> {
    run: &'a mut R,
    producer: &'a Producer,
}

impl<R: Run> Published<'_, R> {
    fn publish(&self) {
        self.producer.publish(&*self.run);
    }

    async fn next(&mut self) -> Result<Option<Event>, ExecutorError> {
        self.run.next().await
    }

    async fn close(&mut self) {
        self.run.close().await;
    }

    fn host_deadline(&self) -> Instant {
        self.run.host_deadline()
    }
}

impl<R: Run> Drop for Published<'_, R> {
    fn drop(&mut self) {
        self.publish();
    }
}

/// How queueing an event went.
enum Sent {
    Queued,
    /// The consumer asked to stop (or is gone).
    Stopped,
    /// No room came before the run's host deadline.
    Late,
}

/// The runtime side of one flow run. Holds no Python object.
pub(super) struct Producer {
    pub(super) tx: mpsc::UnboundedSender<Queued>,
    /// [`QUEUE_BYTES`] of room, taken by each queued event until the consumer builds it.
    pub(super) room: Arc<Semaphore>,
    pub(super) wake: UnixStream,
    pub(super) stop: Arc<Notify>,
    pub(super) stopping: Arc<AtomicBool>,
    pub(super) timings: Arc<Mutex<Timings>>,
    pub(super) outcome: Arc<Mutex<Option<&'static str>>>,
}

impl Producer {
    /// Publishes `run`'s phases so far, and its outcome once it ended, to the consumer.
    fn publish<R: Run>(&self, run: &R) {
        *self.timings.lock().unwrap_or_else(PoisonError::into_inner) = run.timings();
        if let Some(outcome) = run.outcome() {
            *self.outcome.lock().unwrap_or_else(PoisonError::into_inner) = Some(outcome);
        }
    }

    fn wake(&self) {
        // Non-blocking: a full socket already holds a pending wake.
        let _ = (&self.wake).write(&[1]);
    }

    fn stopped(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Queues `event` once there is room for it, unless the consumer asks to stop first or
    /// `deadline` passes.
    async fn send(&self, event: Event, deadline: Instant) -> Sent {
        let item = Ok(event);
        let cost = u32::try_from(cost(&item).min(QUEUE_BYTES)).unwrap_or(u32::MAX);
        let room = tokio::select! {
            room = Arc::clone(&self.room).acquire_many_owned(cost) => room.ok(),
            () = self.stop.notified() => return Sent::Stopped,
            () = tokio::time::sleep_until(deadline) => return Sent::Late,
        };
        let sent = self.tx.send(Queued { item, room }).is_ok();
        self.wake();
        if sent && !self.stopped() {
            Sent::Queued
        } else {
            Sent::Stopped
        }
    }

    /// Queues the run's failure, its last item, at once (it takes no room).
    fn fail(&self, err: ExecutorError) {
        let _ = self.tx.send(Queued {
            item: Err(err),
            room: None,
        });
        self.wake();
    }

    /// Drives the run that `start` starts to its end. A panic anywhere in it is caught and
    /// reported to the consumer as the run's failure.
    pub(super) async fn run<R: Run>(self, start: impl Future<Output = Result<R, ExecutorError>>) {
        if AssertUnwindSafe(self.drive(start))
            .catch_unwind()
            .await
            .is_err()
        {
            // Whatever was started was dropped while unwinding: a guest went to the reaper.
            self.fail(panicked());
        }
        // Dropping `self` closes the queue; `Finished` then marks the run over.
    }

    async fn drive<R: Run>(&self, start: impl Future<Output = Result<R, ExecutorError>>) {
        let started = tokio::select! {
            r = start => Some(r),
            // Dropping the start future hands a created guest to the reaper.
            () = self.stop.notified() => None,
        };
        let mut run = match started {
            None => return,
            Some(Err(e)) => return self.fail(e),
            Some(Ok(run)) => run,
        };
        // The run's phases reach the consumer as they are known, and once it ended.
        let mut run = Published {
            run: &mut run,
            producer: self,
        };
        loop {
            if self.stopped() {
                return run.close().await;
            }
            let step = tokio::select! {
                s = AssertUnwindSafe(run.next()).catch_unwind() => Some(s),
                () = self.stop.notified() => None,
            };
            let event = match step {
                None => return run.close().await,
                Some(Err(_panic)) => {
                    // Destroy the guest before the consumer hears of it.
                    run.close().await;
                    return self.fail(panicked());
                }
                Some(Ok(Ok(None))) => return,
                Some(Ok(Err(e))) => {
                    run.publish();
                    return self.fail(e);
                }
                Some(Ok(Ok(Some(event)))) => event,
            };
            run.publish();
            let last = matches!(event, Event::Complete(_));
            match self.send(event, run.host_deadline()).await {
                Sent::Queued if last => return,
                Sent::Queued => {}
                Sent::Stopped => return run.close().await,
                Sent::Late => {
                    run.close().await;
                    run.publish();
                    return self.fail(too_slow());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::time::Duration;

    use super::super::stream::{Ready, Shared, pipe};
    use std::sync::atomic::AtomicUsize;

    use langflow_executor::{FrameLimits, Payload};

    use super::*;

    enum Step {
        Event(Event),
        Panic,
    }

    /// A stand-in run: its steps, then nothing (it waits forever, as a silent guest would).
    struct Scripted {
        steps: VecDeque<Step>,
        pulled: Arc<AtomicUsize>,
        closed: Arc<AtomicBool>,
        deadline: Instant,
    }

    impl Run for Scripted {
        async fn next(&mut self) -> Result<Option<Event>, ExecutorError> {
            self.pulled.fetch_add(1, Ordering::SeqCst);
            match self.steps.pop_front() {
                Some(Step::Event(event)) => Ok(Some(event)),
                Some(Step::Panic) => panic!("injected: a bug in the executor"),
                None => std::future::pending().await,
            }
        }

        async fn close(&mut self) {
            self.closed.store(true, Ordering::SeqCst);
        }

        fn host_deadline(&self) -> Instant {
            self.deadline
        }
    }

    fn vertex(id: &str, pad: usize) -> Event {
        let json = format!(
            r#"{{"frame":"vertex","id":"{id}","pad":"{}"}}"#,
            "x".repeat(pad)
        );
        Event::Vertex(Payload::admit(json, &FrameLimits::default()).unwrap())
    }

    /// Runs `steps` through a real producer (on a thread of its own, as in production) and
    /// returns the consumer's end once the producer is done, with what the run saw.
    fn produce(steps: Vec<Step>, budget: Duration) -> (Shared, usize, bool, usize) {
        let (producer, shared, done) = pipe().unwrap();
        let room = Arc::clone(&producer.room);
        let pulled = Arc::new(AtomicUsize::new(0));
        let closed = Arc::new(AtomicBool::new(false));
        let run = Scripted {
            steps: steps.into(),
            pulled: Arc::clone(&pulled),
            closed: Arc::clone(&closed),
            deadline: Instant::now() + budget,
        };
        let driver = std::thread::spawn(move || {
            let _done = done;
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap()
                .block_on(producer.run(async move { Ok(run) }));
        });
        driver.join().unwrap();
        assert!(shared.finished.load(Ordering::SeqCst));
        (
            shared,
            pulled.load(Ordering::SeqCst),
            closed.load(Ordering::SeqCst),
            QUEUE_BYTES - room.available_permits(),
        )
    }

    /// Everything the consumer can take, in order, as short descriptions.
    fn drain(shared: &Shared) -> Vec<String> {
        let mut seen = Vec::new();
        while let Some(ready) = shared.try_take() {
            match ready {
                Ready::Item(Queued {
                    item: Ok(event), ..
                }) => seen.push(match event {
                    Event::Vertex(p) => format!("vertex {}", p.value()["id"]),
                    Event::Message(p) => format!("message {}", p.value()["id"]),
                    Event::Complete(_) => "complete".to_owned(),
                }),
                Ready::Item(Queued { item: Err(e), .. }) => seen.push(format!("error: {e}")),
                Ready::End => {
                    seen.push("end".to_owned());
                    break;
                }
            }
        }
        seen
    }

    #[test]
    fn a_panic_in_the_run_is_an_execution_error_after_the_guest_is_closed() {
        let (shared, _, closed, _) = produce(
            vec![Step::Event(vertex("a", 10)), Step::Panic],
            Duration::from_secs(60),
        );
        assert!(closed, "the run (its guest) was closed");
        let seen = drain(&shared);
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert_eq!(seen[0], "vertex \"a\"");
        assert!(seen[1].starts_with("error: "), "{seen:?}");
        assert!(seen[1].contains("internal error"), "{seen:?}");
        assert!(seen[1].contains("guest destroyed"), "{seen:?}");
        assert_eq!(seen[2], "end");
    }

    #[test]
    fn a_panic_while_starting_is_an_execution_error() {
        let (producer, shared, done) = pipe().unwrap();
        std::thread::spawn(move || {
            let _done = done;
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap()
                .block_on(producer.run(async {
                    panic!("injected: a bug while starting");
                    #[allow(unreachable_code)]
                    Err::<Scripted, _>(panicked())
                }));
        })
        .join()
        .unwrap();
        let seen = drain(&shared);
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(seen[0].contains("internal error"), "{seen:?}");
        assert_eq!(seen[1], "end");
    }

    #[test]
    fn a_consumer_that_does_not_read_holds_the_run_to_its_byte_bound_and_deadline() {
        // Four events of 6 MiB against 16 MiB of room: two fit, the third waits for room
        // until the run's host deadline, the fourth is never read from the guest.
        let mb6 = 6 * 1024 * 1024;
        let steps = ["a", "b", "c", "d"]
            .iter()
            .map(|id| Step::Event(vertex(id, mb6)))
            .collect();
        let (shared, pulled, closed, queued) = produce(steps, Duration::from_millis(300));
        assert_eq!(pulled, 3, "the run was read while there was room, then not");
        assert!(closed, "the run (its guest) was closed at the deadline");
        assert!(queued <= QUEUE_BYTES && queued >= 2 * mb6, "{queued}");
        let seen = drain(&shared);
        assert_eq!(seen[..2], ["vertex \"a\"", "vertex \"b\""], "{seen:?}");
        assert!(seen[2].contains("not read in time"), "{seen:?}");
        assert!(seen[2].contains(&QUEUE_BYTES.to_string()), "{seen:?}");
        assert_eq!(seen[3], "end");
    }
}
