//! The whole-flow executor's native half: `NativeExecutor.start()` returns a `FlowEvents`, an
//! async iterator whose events are produced on this process's runtime.
//!
//! No Python object is touched on a runtime thread. A flow run is driven by a producer task
//! that pushes each event into a queue bounded in bytes ([`QUEUE_BYTES`]) and writes one byte
//! to a socket pair. A consumer that does not take the events makes the producer wait for room
//! (so it stops reading the guest's output, and the guest's writes block), but never past the
//! run's host deadline: then the run is stopped, the guest destroyed, and the consumer gets the
//! events queued so far and a `CreateOSExecutionError`. A panic in the producer is caught: the
//! run is closed (the guest destroyed) and the consumer gets a `CreateOSExecutionError`, never
//! a silent end. An event's JSON is built into Python objects only when it is taken
//! ([`crate::payload`]), from the bytes the executor admitted. `__anext__` takes an event that is already there, or registers the socket's
//! read end with the running asyncio loop (`loop.add_reader`): the loop's own thread then runs
//! the callback, which takes the event and completes the awaited future. So the awaitable
//! completes on the event loop, the waiting costs no thread, and `fork()` is safe: a child
//! that inherited a `FlowEvents` refuses to use it (its producer lives in the parent), and
//! builds its own runtime and executor for new runs.
//!
//! `aclose()` (and dropping the iterator) stops the run: the producer closes it, which stops
//! the exec and destroys the guest; the awaitable of `aclose()` completes once that is done.

use std::future::Future;
use std::io::{Read as _, Write as _};
#[cfg(unix)]
use std::os::fd::AsRawFd as _;
#[cfg(unix)]
use std::os::unix::net::UnixStream;
use std::panic::AssertUnwindSafe;
// Only named on other platforms, where `wake_pair` refuses (see there).
#[cfg(not(unix))]
use std::net::TcpStream as UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::FutureExt as _;
use langflow_executor::frames::{MAX_FRAME_BYTES, escape_controls};
use langflow_executor::{
    Event, Executor, ExecutorError, ExecutorOptions, FlowRequest, FlowRun, FlowTimings, RunHead,
};
use pyo3::exceptions::{PyRuntimeError, PyStopAsyncIteration, PyTypeError, PyValueError};
use pyo3::prelude::*;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use crate::perprocess::PerProcess;
use crate::wait::block_bounded;
use crate::{errors, logbridge, payload, runtime, session, sigterm};

/// Bytes of events held between the producer and a consumer that has not taken them yet: the
/// largest frame the executor admits fits alone.
pub(crate) const QUEUE_BYTES: usize = MAX_FRAME_BYTES;
/// What each queued event counts besides its JSON.
const ITEM_OVERHEAD: usize = 256;
/// Bound on `shutdown()`.
const SHUTDOWN_BUDGET: Duration = Duration::from_secs(30);

type Item = Result<Event, ExecutorError>;

/// An item in the queue, holding its share of [`QUEUE_BYTES`] (none for the run's last
/// failure) until the consumer has built it.
struct Queued {
    item: Item,
    room: Option<OwnedSemaphorePermit>,
}

/// What a consumer finds in the queue.
enum Ready {
    /// An event or the run's failure.
    Item(Queued),
    /// The run is over (after its last item).
    End,
}

/// What the queue charges for `item`.
fn cost(item: &Item) -> usize {
    ITEM_OVERHEAD
        + match item {
            Ok(Event::Vertex(p) | Event::Message(p) | Event::Complete(p)) => p.len(),
            Err(e) => e.to_string().len(),
        }
}

/// The failure of a run whose producer panicked.
fn panicked() -> ExecutorError {
    ExecutorError::Execution(
        "the flow run failed with an internal error (a panic in the executor); the run was \
         stopped and its guest destroyed, and the flow may have run. This is a bug in \
         langflow-sandbox-createos"
            .to_owned(),
    )
}

/// The failure of a run whose consumer did not take its events before the host deadline.
fn too_slow() -> ExecutorError {
    ExecutorError::Execution(format!(
        "the flow's events were not read in time: the host holds at most {QUEUE_BYTES} bytes of \
         a run's events, and they waited for the consumer until the run's host deadline \
         (CREATEOS_EXECUTOR_TIMEOUT_SECONDS plus its grace), so the run was stopped and its \
         guest destroyed; the flow may have run. Read a run's events as they arrive"
    ))
}

/// This process's executor (see [`PerProcess`]).
static EXECUTOR: PerProcess<Arc<Executor>> = PerProcess::new();

fn executor() -> Arc<Executor> {
    EXECUTOR.get_or_init(|| {
        Arc::new(Executor::with_options(ExecutorOptions {
            surface: session::surface_options(),
            ..ExecutorOptions::default()
        }))
    })
}

/// This process's executor if it built one.
fn existing() -> Option<Arc<Executor>> {
    EXECUTOR.current()
}

/// Destroys the guests of this process's flow runs (SIGTERM's cleanup).
pub(crate) async fn shutdown_executor() {
    if let Some(ex) = existing() {
        ex.shutdown().await;
    }
}

/// The error an executor failure is raised as: refusals as `CreateOSUnavailableError`,
/// infrastructure failures as `CreateOSExecutionError`, and a flow that failed in the guest as
/// the built-in exception it raised there (`ValueError`, `TypeError`, else `RuntimeError`), as
/// it would have in-process.
fn to_pyerr(py: Python<'_>, err: ExecutorError) -> PyErr {
    match err {
        ExecutorError::Unavailable(m) => errors::unavailable(py, m),
        ExecutorError::Execution(m) => errors::execution(py, m),
        ExecutorError::Flow {
            error_type,
            message,
        } => match error_type.as_deref() {
            Some("ValueError") => PyValueError::new_err(message),
            Some("TypeError") => PyTypeError::new_err(message),
            _ => PyRuntimeError::new_err(message),
        },
    }
}

/// What the consumer and the producer share. Dropping the consumer's last reference asks the
/// producer to stop.
struct Shared {
    rx: Mutex<mpsc::UnboundedReceiver<Queued>>,
    wake_read: UnixStream,
    stop: Arc<Notify>,
    stopping: Arc<AtomicBool>,
    finished: Arc<AtomicBool>,
    /// The run's phases so far, published by the producer.
    timings: Arc<Mutex<FlowTimings>>,
    /// Where the rest of the request goes ([`FlowEvents::supply`]), until it is sent.
    body: Mutex<Option<oneshot::Sender<Result<FlowRequest, ExecutorError>>>>,
}

impl Shared {
    #[cfg(unix)]
    fn fd(&self) -> i32 {
        self.wake_read.as_raw_fd()
    }

    #[cfg(not(unix))]
    fn fd(&self) -> u64 {
        use std::os::windows::io::AsRawSocket as _;
        self.wake_read.as_raw_socket()
    }

    /// The next item or the end, if either is there yet.
    fn try_take(&self) -> Option<Ready> {
        let mut rx = self.rx.lock().unwrap_or_else(PoisonError::into_inner);
        match rx.try_recv() {
            Ok(queued) => Some(Ready::Item(queued)),
            Err(mpsc::error::TryRecvError::Empty) => None,
            Err(mpsc::error::TryRecvError::Disconnected) => Some(Ready::End),
        }
    }

    /// Reads every pending wake; true when the producer's end is closed (it is gone).
    fn drain_wakes(&self) -> bool {
        let mut buf = [0u8; 256];
        loop {
            match (&self.wake_read).read(&mut buf) {
                Ok(0) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
    }

    fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        self.stop.notify_one();
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.stop();
    }
}

fn running_loop(py: Python<'_>) -> PyResult<Bound<'_, PyAny>> {
    py.import("asyncio")?.call_method0("get_running_loop")
}

fn resolve(py: Python<'_>, fut: &Bound<'_, PyAny>, ready: Ready) -> PyResult<()> {
    let Ready::Item(Queued { item, room }) = ready else {
        return fut
            .call_method1(
                "set_exception",
                (PyStopAsyncIteration::new_err(()).value(py),),
            )
            .map(drop);
    };
    let (kind, json) = match item {
        Ok(Event::Vertex(json)) => ("vertex", json),
        Ok(Event::Message(json)) => ("message", json),
        Ok(Event::Complete(json)) => ("complete", json),
        Err(e) => {
            return fut
                .call_method1("set_exception", (to_pyerr(py, e).value(py),))
                .map(drop);
        }
    };
    let built = payload::to_python(py, json.as_bytes());
    // The bytes leave the queue once they are Python objects.
    drop((json, room));
    match built {
        Ok(value) => fut.call_method1("set_result", ((kind, value),)),
        Err(e) => {
            let err = errors::execution(
                py,
                format!(
                    "the guest's {kind} event could not be read on the host: {}",
                    escape_controls(&e.to_string())
                ),
            );
            fut.call_method1("set_exception", (err.value(py),))
        }
    }
    .map(drop)
}

/// The loop-thread callback that completes one `__anext__` (or `aclose`) future.
#[pyclass(frozen, module = "langflow_sandbox_createos._native")]
pub struct FlowWake {
    shared: Arc<Shared>,
    fut: Py<PyAny>,
    event_loop: Py<PyAny>,
    closing: bool,
}

#[pymethods]
impl FlowWake {
    fn __call__(&self, py: Python<'_>) -> PyResult<()> {
        let producer_gone = self.shared.drain_wakes();
        logbridge::drain(py);
        let fut = self.fut.bind(py);
        let done = || -> PyResult<()> {
            self.event_loop
                .bind(py)
                .call_method1("remove_reader", (self.shared.fd(),))
                .map(drop)
        };
        if fut.call_method0("done")?.is_truthy()? {
            // Cancelled by the caller: whatever is ready stays for the next `__anext__`.
            return done();
        }
        if self.closing {
            if producer_gone || self.shared.finished.load(Ordering::SeqCst) {
                done()?;
                fut.call_method1("set_result", (py.None(),))?;
            }
            return Ok(());
        }
        match self.shared.try_take() {
            // A producer that is gone closed its channel first, so this cannot repeat.
            None if producer_gone => {
                done()?;
                resolve(py, fut, Ready::End)
            }
            None => Ok(()),
            Some(item) => {
                done()?;
                resolve(py, fut, item)
            }
        }
    }
}

/// The events of one flow run: an async iterator of `(kind, value)` pairs, `kind` being
/// `"vertex"` (the vertex frame, a `dict`), `"message"` (a chat message the flow stored,
/// updated or deleted: the message frame, a `dict`) or `"complete"` (the outputs, a `list`;
/// always last). Created by `NativeExecutor.start`.
#[pyclass(frozen, module = "langflow_sandbox_createos._native")]
pub struct FlowEvents {
    shared: Arc<Shared>,
    pid: u32,
    mode: &'static str,
}

impl FlowEvents {
    fn check_process(&self) -> PyResult<()> {
        if self.pid == std::process::id() {
            Ok(())
        } else {
            Err(PyRuntimeError::new_err(
                "this flow run was started by another process (before a fork); its events \
                 cannot be read here. Start the run in this process",
            ))
        }
    }

    fn waiter(&self, py: Python<'_>, closing: bool) -> PyResult<Py<PyAny>> {
        let lp = running_loop(py)?;
        let fut = lp.call_method0("create_future")?;
        let wake = FlowWake {
            shared: Arc::clone(&self.shared),
            fut: fut.clone().unbind(),
            event_loop: lp.clone().unbind(),
            closing,
        };
        lp.call_method1("add_reader", (self.shared.fd(), wake))?;
        Ok(fut.unbind())
    }
}

#[pymethods]
impl FlowEvents {
    fn __aiter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// An awaitable of the next `(kind, value)` pair; raises `StopAsyncIteration` after the
    /// `"complete"` event, and the run's failure as the matching exception.
    fn __anext__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.check_process()?;
        logbridge::drain(py);
        if let Some(item) = self.shared.try_take() {
            let fut = running_loop(py)?.call_method0("create_future")?;
            resolve(py, &fut, item)?;
            return Ok(fut.unbind());
        }
        self.waiter(py, false)
    }

    /// Stops the run (the exec is stopped and the guest destroyed) and returns an awaitable
    /// that completes once that is done. Idempotent.
    fn aclose(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.shared.stop();
        if self.pid != std::process::id() || self.shared.finished.load(Ordering::SeqCst) {
            let fut = running_loop(py)?.call_method0("create_future")?;
            fut.call_method1("set_result", (py.None(),))?;
            return Ok(fut.unbind());
        }
        self.waiter(py, true)
    }

    /// `"legacy"` (`Graph.arun`'s passthrough: the complete event carries `RunOutputs`) or
    /// `"stream"` (the streaming path: vertex events carry what callers read).
    #[getter]
    fn mode(&self) -> &'static str {
        self.mode
    }

    /// Hands the run the rest of its request: the JSON request document (`flow`, `inputs`,
    /// `options`, the resolved `variables`, `memory`, `file_params`, `host_context_ms`, ...).
    /// Its job is uploaded to the guest once it is there. A malformed request raises
    /// `CreateOSExecutionError` and ends the run (its guest destroyed); a second call raises.
    fn supply(&self, py: Python<'_>, request: &str) -> PyResult<()> {
        self.check_process()?;
        let sender = self
            .shared
            .body
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let Some(sender) = sender else {
            return Err(errors::execution(
                py,
                "this flow run was already handed its flow",
            ));
        };
        match FlowRequest::from_json(request) {
            Ok(request) => {
                // A run already over (stopped, refused) no longer listens: nothing to do.
                let _ = sender.send(Ok(request));
                Ok(())
            }
            Err(why) => {
                let message = format!("the flow run request is malformed: {why}");
                let _ = sender.send(Err(ExecutorError::Execution(message.clone())));
                Err(errors::execution(py, message))
            }
        }
    }

    /// Where the run's time went so far, in milliseconds per phase (`None` for a phase not
    /// reached): complete once the run ended. See `langflow_executor::timings`.
    #[getter]
    fn timings(&self) -> std::collections::BTreeMap<&'static str, Option<u64>> {
        let t = *self
            .shared
            .timings
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        t.fields().into_iter().collect()
    }

    fn __repr__(&self) -> String {
        format!(
            "<FlowEvents mode={} finished={}>",
            self.mode,
            self.shared.finished.load(Ordering::SeqCst)
        )
    }
}

/// The executor's native half: one `langflow_executor::Executor` per process, built on first
/// use. Constructing it does nothing: no thread, no I/O, no environment read.
#[pyclass(frozen, module = "langflow_sandbox_createos._native")]
pub struct NativeExecutor {}

#[pymethods]
#[allow(clippy::unused_self)] // Python methods: the state is per process, not per object.
impl NativeExecutor {
    #[new]
    fn new() -> Self {
        Self {}
    }

    /// The most chat-history messages of the run's session a run sends to its guest (the
    /// glue reads one more, so a cut is noticed).
    #[classattr]
    const HISTORY_MESSAGES: usize = langflow_executor::job::MAX_HISTORY_MESSAGES;

    /// Starts a flow run and returns its events at once; the guest is created by the run's
    /// producer. `head` is the JSON head document (`flow_id`, `session_id`, `options`, the
    /// uploaded `files`), enough to admit the run, refuse it and create its guest, whose runner
    /// starts importing lfx at once; the rest of the request follows with
    /// [`FlowEvents::supply`] (the job is uploaded once it is there). `lfx_version` is the
    /// host's lfx version. A malformed head raises `CreateOSExecutionError`; every other failure
    /// comes out of the events.
    #[pyo3(signature = (head, lfx_version = None))]
    fn start(
        &self,
        py: Python<'_>,
        head: &str,
        lfx_version: Option<String>,
    ) -> PyResult<FlowEvents> {
        logbridge::install();
        logbridge::sync_level(py);
        let head = RunHead::from_json(head).map_err(|why| {
            errors::execution(py, format!("the flow run request is malformed: {why}"))
        })?;
        let mode = head.mode.as_str();
        let rt = runtime::get()
            .map_err(|e| errors::execution(py, format!("cannot start the async runtime: {e}")))?;
        // `lfx run` and container stops end a process with SIGTERM: destroy the flow's guest.
        sigterm::arm_every_surface(py, rt);
        let (producer, shared, done) = pipe().map_err(|e| {
            if e.kind() == std::io::ErrorKind::Unsupported {
                errors::unavailable(py, e.to_string())
            } else {
                errors::execution(py, format!("cannot create the wake socket: {e}"))
            }
        })?;
        let executor = executor();
        let (body_tx, body_rx) = oneshot::channel();
        *shared.body.lock().unwrap_or_else(PoisonError::into_inner) = Some(body_tx);
        let body = async move {
            body_rx.await.unwrap_or_else(|_| {
                Err(ExecutorError::Execution(
                    "the flow run was never handed its flow (the caller went away); nothing of \
                     the flow ran and the guest was destroyed"
                        .to_owned(),
                ))
            })
        };
        // Driven on a blocking-pool thread by `block_on` (sandbox-core's futures are not
        // provably `Send`), on this process's runtime. Never cancelled from outside: the
        // producer stops itself when asked, so the guest is always closed.
        let driver = rt.handle().clone();
        rt.spawn_blocking(move || {
            let _done = done;
            driver.block_on(async move {
                let start = executor.start_with(&head, body, lfx_version.as_deref());
                Box::pin(producer.run(start)).await;
            });
        });
        Ok(FlowEvents {
            shared: Arc::new(shared),
            pid: std::process::id(),
            mode,
        })
    }

    /// Destroys every guest of this process's flow runs (bounded) and refuses new runs.
    fn shutdown(&self, py: Python<'_>) {
        let Some(ex) = existing() else {
            return;
        };
        let Some(rt) = runtime::existing() else {
            return;
        };
        let _ = block_bounded(py, rt, SHUTDOWN_BUDGET, async move {
            ex.shutdown().await;
        });
        logbridge::drain(py);
    }

    /// This process's executor warm pool (`CREATEOS_EXECUTOR_WARM_POOL`): `size`, `ready`,
    /// `filling`, `hits`, `misses`, `discarded`, `refill_failures` (all 0 before the first run).
    fn pool_stats(&self) -> std::collections::BTreeMap<&'static str, u64> {
        let s = existing().map(|ex| ex.pool_stats()).unwrap_or_default();
        let n = |v: usize| u64::try_from(v).unwrap_or(u64::MAX);
        [
            ("size", n(s.size)),
            ("ready", n(s.ready)),
            ("filling", n(s.filling)),
            ("hits", s.hits),
            ("misses", s.misses),
            ("discarded", s.discarded),
            ("refill_failures", s.refill_failures),
        ]
        .into_iter()
        .collect()
    }

    fn __repr__(&self) -> String {
        format!("<NativeExecutor pid={}>", std::process::id())
    }
}

/// The socket pair a run wakes its consumer through: the read end is what the asyncio loop
/// waits on (`loop.add_reader`).
#[cfg(unix)]
fn wake_pair() -> std::io::Result<(UnixStream, UnixStream)> {
    UnixStream::pair()
}

/// Windows: refused. `loop.add_reader` does not exist on Windows' default event loop (the
/// proactor), so the executor cannot wait for events without a thread per run there.
#[cfg(not(unix))]
fn wake_pair() -> std::io::Result<(UnixStream, UnixStream)> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "the CreateOS flow executor (LANGFLOW_EXECUTOR_KIND=createos) is not available on \
         Windows: it waits with the asyncio loop's add_reader, which Windows' default event loop \
         lacks. Unset LANGFLOW_EXECUTOR_KIND to run flows in-process, or run Langflow on Linux \
         or macOS; the CreateOS sandbox backend and component work on Windows",
    ))
}

/// Marks a run finished when its producer is done, even by a panic: set after the channel
/// closed, then one last wake.
struct Finished {
    flag: Arc<AtomicBool>,
    wake: UnixStream,
}

impl Drop for Finished {
    fn drop(&mut self) {
        self.flag.store(true, Ordering::SeqCst);
        let _ = (&self.wake).write(&[1]);
    }
}

/// The two ends of one run's event queue, and the guard that marks the run finished.
fn pipe() -> std::io::Result<(Producer, Shared, Finished)> {
    let (wake_write, wake_read) = wake_pair()?;
    wake_write.set_nonblocking(true)?;
    wake_read.set_nonblocking(true)?;
    let (tx, rx) = mpsc::unbounded_channel::<Queued>();
    let stop = Arc::new(Notify::new());
    let stopping = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    let done = Finished {
        flag: Arc::clone(&finished),
        wake: wake_write.try_clone()?,
    };
    let timings = Arc::new(Mutex::new(FlowTimings::default()));
    let producer = Producer {
        tx,
        room: Arc::new(Semaphore::new(QUEUE_BYTES)),
        wake: wake_write,
        stop: Arc::clone(&stop),
        stopping: Arc::clone(&stopping),
        timings: Arc::clone(&timings),
    };
    let shared = Shared {
        rx: Mutex::new(rx),
        wake_read,
        stop,
        stopping,
        finished,
        timings,
        body: Mutex::new(None),
    };
    Ok((producer, shared, done))
}

/// A started flow run, as the producer drives it: a [`FlowRun`] (tests drive stand-ins).
trait Run {
    /// The next event; `Ok(None)` after the last.
    fn next(&mut self) -> impl Future<Output = Result<Option<Event>, ExecutorError>>;
    /// Stops the run and destroys its guest.
    fn close(&mut self) -> impl Future<Output = ()>;
    /// When the host gives up on the run, whatever the guest does.
    fn host_deadline(&self) -> Instant;
    /// Where the run's time went so far.
    fn timings(&self) -> FlowTimings {
        FlowTimings::default()
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

    fn timings(&self) -> FlowTimings {
        FlowRun::timings(self)
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
struct Producer {
    tx: mpsc::UnboundedSender<Queued>,
    /// [`QUEUE_BYTES`] of room, taken by each queued event until the consumer builds it.
    room: Arc<Semaphore>,
    wake: UnixStream,
    stop: Arc<Notify>,
    stopping: Arc<AtomicBool>,
    timings: Arc<Mutex<FlowTimings>>,
}

impl Producer {
    /// Publishes `run`'s phases so far to the consumer.
    fn publish<R: Run>(&self, run: &R) {
        *self.timings.lock().unwrap_or_else(PoisonError::into_inner) = run.timings();
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
    async fn run<R: Run>(self, start: impl Future<Output = Result<R, ExecutorError>>) {
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

/// The executor's effective settings for `doctor`, as `(level, text)` lines: one `info` line per
/// setting, or one `refused` line naming the bad setting (what a run would be refused with).
#[pyfunction]
pub fn executor_settings() -> Vec<(&'static str, String)> {
    match langflow_executor::settings::ExecutorSettings::from_lookup(&|k| std::env::var(k).ok()) {
        Ok(s) => s.summary().into_iter().map(|line| ("info", line)).collect(),
        Err(e) => vec![("refused", e.message().to_owned())],
    }
}

/// The requirements and Dockerfile of a template for a flow that needs `requirements` (what
/// lfx's flow-requirements reader found), pinned to the host's `lfx_version`. No I/O.
/// Returns `(name, dockerfile)`; `name` is derived from the Dockerfile unless given.
#[pyfunction]
#[pyo3(signature = (requirements, lfx_version, name = None))]
#[allow(clippy::needless_pass_by_value)] // a Python list arrives as an owned Vec
pub fn template_plan(
    py: Python<'_>,
    requirements: Vec<String>,
    lfx_version: &str,
    name: Option<String>,
) -> PyResult<(String, String)> {
    let reqs = langflow_executor::template::requirements(&requirements, lfx_version)
        .map_err(|e| to_pyerr(py, e))?;
    let dockerfile = langflow_executor::template::dockerfile(&reqs);
    let name = name.unwrap_or_else(|| langflow_executor::template::template_name(&dockerfile));
    Ok((name, dockerfile))
}

/// Builds `dockerfile` as the CreateOS template `name` with the `CREATEOS_SANDBOX_*` key and
/// endpoint, printing each build log line to standard error as it arrives, and returns the
/// ready template's id (the `CREATEOS_EXECUTOR_ROOTFS` value). Blocks with the GIL released;
/// Ctrl-C interrupts. A failed build raises `CreateOSExecutionError`; a missing or rejected
/// key `CreateOSUnavailableError`.
#[pyfunction]
pub fn template_build(py: Python<'_>, name: String, dockerfile: String) -> PyResult<String> {
    logbridge::install();
    logbridge::sync_level(py);
    let rt = runtime::get()
        .map_err(|e| errors::execution(py, format!("cannot start the async runtime: {e}")))?;
    // Taken here, with the GIL held (see `process`'s fork rule).
    let session = session::session();
    let result = match crate::wait::drive(py, rt, move || async move {
        let env: langflow_executor::EnvLookup = Arc::new(|k| std::env::var(k).ok());
        langflow_executor::template::build(&env, &session, &name, &dockerfile, |line| {
            // The build log goes to the terminal as it arrives (no Python object involved).
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "build: {line}");
        })
        .await
    }) {
        crate::wait::Waited::Finished(Ok(built)) => Ok(built.id),
        crate::wait::Waited::Finished(Err(e)) => Err(to_pyerr(py, e)),
        crate::wait::Waited::Panicked => Err(errors::execution(
            py,
            "the template build failed with an internal error",
        )),
        crate::wait::Waited::Interrupted(interrupt) => Err(interrupt),
    };
    logbridge::drain(py);
    result
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
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
