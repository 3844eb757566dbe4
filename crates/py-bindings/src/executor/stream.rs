//! The consumer's side of a flow run: `FlowEvents` (the async iterator, `supply`, `timings`),
//! `FlowWake` (the event loop's callback), and the queue and wake socket the producer fills.

use std::io::{Read as _, Write as _};
#[cfg(unix)]
use std::os::fd::AsRawFd as _;
#[cfg(unix)]
use std::os::unix::net::UnixStream;
// Only named on other platforms, where `wake_pair` refuses (see there).
#[cfg(not(unix))]
use std::net::TcpStream as UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use langflow_executor::frames::MAX_FRAME_BYTES;
use langflow_executor::{Event, ExecutorError, FlowRequest, Timings};
use pyo3::exceptions::{PyRuntimeError, PyStopAsyncIteration};
use pyo3::prelude::*;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use super::producer::Producer;
use super::to_pyerr;
use crate::{errors, logbridge, payload};

/// Bytes of events held between the producer and a consumer that has not taken them yet: the
/// largest frame the executor admits fits alone.
pub(crate) const QUEUE_BYTES: usize = MAX_FRAME_BYTES;
/// What each queued event counts besides its JSON.
const ITEM_OVERHEAD: usize = 256;

pub(super) type Item = Result<Event, ExecutorError>;

/// An item in the queue, holding its share of [`QUEUE_BYTES`] (none for the run's last
/// failure) until the consumer has built it.
pub(super) struct Queued {
    pub(super) item: Item,
    pub(super) room: Option<OwnedSemaphorePermit>,
}

/// What a consumer finds in the queue.
pub(super) enum Ready {
    /// An event or the run's failure.
    Item(Queued),
    /// The run is over (after its last item).
    End,
}

/// What the queue charges for `item`.
pub(super) fn cost(item: &Item) -> usize {
    ITEM_OVERHEAD
        + match item {
            Ok(Event::Vertex(p) | Event::Message(p) | Event::Complete(p)) => p.len(),
            Err(e) => e.to_string().len(),
        }
}

/// What the consumer and the producer share. Dropping the consumer's last reference asks the
/// producer to stop.
pub(super) struct Shared {
    pub(super) rx: Mutex<mpsc::UnboundedReceiver<Queued>>,
    pub(super) wake_read: UnixStream,
    pub(super) stop: Arc<Notify>,
    pub(super) stopping: Arc<AtomicBool>,
    pub(super) finished: Arc<AtomicBool>,
    /// The run's phases so far, published by the producer.
    pub(super) timings: Arc<Mutex<Timings>>,
    /// How the run ended, published by the producer once it did.
    pub(super) outcome: Arc<Mutex<Option<&'static str>>>,
    /// Where the rest of the request goes ([`FlowEvents::supply`]), until it is sent.
    pub(super) body: Mutex<Option<oneshot::Sender<Result<FlowRequest, ExecutorError>>>>,
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
    pub(super) fn try_take(&self) -> Option<Ready> {
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
                    outside_text::line(&e.to_string())
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
    pub(super) shared: Arc<Shared>,
    pub(super) pid: u32,
    pub(super) mode: &'static str,
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
    /// `SandboxFailedError` and ends the run (its guest destroyed); a second call raises.
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

    /// How the run ended, as its span reports it (`ok`, `program_failed`, `timed_out`,
    /// `refused`, `may_have_run`, or `stopped` when the consumer stopped reading before the
    /// end), decided by the native side; `None` until it ended.
    #[getter]
    fn outcome(&self) -> Option<&'static str> {
        *self
            .shared
            .outcome
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
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
pub(super) struct Finished {
    pub(super) flag: Arc<AtomicBool>,
    pub(super) wake: UnixStream,
}

impl Drop for Finished {
    fn drop(&mut self) {
        self.flag.store(true, Ordering::SeqCst);
        let _ = (&self.wake).write(&[1]);
    }
}

/// The two ends of one run's event queue, and the guard that marks the run finished.
pub(super) fn pipe() -> std::io::Result<(Producer, Shared, Finished)> {
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
    let timings = Arc::new(Mutex::new(Timings::default()));
    let outcome = Arc::new(Mutex::new(None));
    let producer = Producer {
        tx,
        room: Arc::new(Semaphore::new(QUEUE_BYTES)),
        wake: wake_write,
        stop: Arc::clone(&stop),
        stopping: Arc::clone(&stopping),
        timings: Arc::clone(&timings),
        outcome: Arc::clone(&outcome),
    };
    let shared = Shared {
        rx: Mutex::new(rx),
        wake_read,
        stop,
        stopping,
        finished,
        timings,
        outcome,
        body: Mutex::new(None),
    };
    Ok((producer, shared, done))
}
