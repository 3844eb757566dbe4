//! The whole-flow executor's native half: `NativeExecutor.start()` returns a `FlowEvents`, an
//! async iterator whose events are produced on this process's runtime.
//!
//! No Python object is touched on a runtime thread. A flow run is driven by a producer task
//! ([`crate::wait::Task`]) that pushes each event into a bounded channel and writes one byte to
//! a socket pair. `__anext__` takes an event that is already there, or registers the socket's
//! read end with the running asyncio loop (`loop.add_reader`): the loop's own thread then runs
//! the callback, which takes the event and completes the awaited future. So the awaitable
//! completes on the event loop, the waiting costs no thread, and `fork()` is safe: a child
//! that inherited a `FlowEvents` refuses to use it (its producer lives in the parent), and
//! builds its own runtime and executor for new runs.
//!
//! `aclose()` (and dropping the iterator) stops the run: the producer closes it, which stops
//! the exec and destroys the guest; the awaitable of `aclose()` completes once that is done.

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
use std::time::Duration;

use langflow_executor::{Event, Executor, ExecutorError, ExecutorOptions, FlowRequest};
use pyo3::exceptions::{PyRuntimeError, PyStopAsyncIteration, PyTypeError, PyValueError};
use pyo3::prelude::*;
use tokio::sync::{Notify, mpsc};

use crate::wait::block_bounded;
use crate::{errors, logbridge, process, runtime, sigterm};

/// Events buffered between the producer and a consumer that has not asked yet.
const CHANNEL: usize = 32;
/// Bound on `shutdown()`.
const SHUTDOWN_BUDGET: Duration = Duration::from_secs(30);

type Item = Result<Event, ExecutorError>;

/// What a consumer finds in the channel.
enum Ready {
    /// An event or the run's failure.
    Item(Item),
    /// The run is over (after its last item).
    End,
}

/// This process's executor, with the id of the process that built it.
static EXECUTOR: Mutex<Option<(u32, Arc<Executor>)>> = Mutex::new(None);

fn executor() -> Arc<Executor> {
    let pid = std::process::id();
    let mut slot = EXECUTOR.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((owner, ex)) = slot.as_ref()
        && *owner == pid
    {
        return Arc::clone(ex);
    }
    if let Some(inherited) = slot.take() {
        // Built by a parent: its connections and tasks belong to the parent's runtime.
        std::mem::forget(inherited);
    }
    let ex = Arc::new(Executor::with_options(ExecutorOptions {
        session: Some(process::session()),
        // Idle pool guests would outlive an `os._exit`: no warm pool in a forked child.
        pool_allowed: !process::forked(),
        ..ExecutorOptions::default()
    }));
    *slot = Some((pid, Arc::clone(&ex)));
    ex
}

/// This process's executor if it built one.
fn existing() -> Option<Arc<Executor>> {
    let slot = EXECUTOR.lock().unwrap_or_else(PoisonError::into_inner);
    slot.as_ref()
        .filter(|(owner, _)| *owner == std::process::id())
        .map(|(_, ex)| Arc::clone(ex))
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
    rx: Mutex<mpsc::Receiver<Item>>,
    wake_read: UnixStream,
    stop: Arc<Notify>,
    stopping: Arc<AtomicBool>,
    finished: Arc<AtomicBool>,
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
            Ok(item) => Some(Ready::Item(item)),
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
    match ready {
        Ready::Item(Ok(Event::Vertex(v))) => {
            fut.call_method1("set_result", (("vertex", v.to_string()),))
        }
        Ready::Item(Ok(Event::Complete(v))) => {
            fut.call_method1("set_result", (("complete", v.to_string()),))
        }
        Ready::Item(Err(e)) => fut.call_method1("set_exception", (to_pyerr(py, e).value(py),)),
        Ready::End => fut.call_method1(
            "set_exception",
            (PyStopAsyncIteration::new_err(()).value(py),),
        ),
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

/// The events of one flow run: an async iterator of `(kind, json)` pairs, `kind` being
/// `"vertex"` or `"complete"` (always last). Created by `NativeExecutor.start`.
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

    /// An awaitable of the next `(kind, json)` pair; raises `StopAsyncIteration` after the
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

    /// Starts a flow run and returns its events at once; the guest is created by the run's
    /// producer. `request` is the JSON request document (`flow`, `inputs`, `options`, ...);
    /// `lfx_version` the host's lfx version. A malformed request raises
    /// `CreateOSExecutionError`; every other failure comes out of the events.
    #[pyo3(signature = (request, lfx_version = None))]
    fn start(
        &self,
        py: Python<'_>,
        request: &str,
        lfx_version: Option<String>,
    ) -> PyResult<FlowEvents> {
        logbridge::install();
        logbridge::sync_level(py);
        let request = FlowRequest::from_json(request).map_err(|why| {
            errors::execution(py, format!("the flow run request is malformed: {why}"))
        })?;
        let mode = request.mode().as_str();
        let rt = runtime::get()
            .map_err(|e| errors::execution(py, format!("cannot start the async runtime: {e}")))?;
        // `lfx run` and container stops end a process with SIGTERM: destroy the flow's guest.
        sigterm::arm(py, rt, process::shutdown_every_surface);
        let (wake_write, wake_read) = wake_pair()
            .and_then(|(w, r)| {
                w.set_nonblocking(true)?;
                r.set_nonblocking(true)?;
                Ok((w, r))
            })
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::Unsupported {
                    errors::unavailable(py, e.to_string())
                } else {
                    errors::execution(py, format!("cannot create the wake socket: {e}"))
                }
            })?;
        let (tx, rx) = mpsc::channel::<Item>(CHANNEL);
        let stop = Arc::new(Notify::new());
        let stopping = Arc::new(AtomicBool::new(false));
        let finished = Arc::new(AtomicBool::new(false));
        let executor = executor();
        let done = Finished {
            flag: Arc::clone(&finished),
            wake: wake_write
                .try_clone()
                .map_err(|e| errors::execution(py, format!("cannot clone the wake socket: {e}")))?,
        };
        let producer = Producer {
            tx,
            wake: wake_write,
            stop: Arc::clone(&stop),
            stopping: Arc::clone(&stopping),
        };
        // Driven on a blocking-pool thread by `block_on` (sandbox-core's futures are not
        // provably `Send`), on this process's runtime. Never cancelled from outside: the
        // producer stops itself when asked, so the guest is always closed.
        let driver = rt.handle().clone();
        rt.spawn_blocking(move || {
            let _done = done;
            driver.block_on(producer.run(executor, request, lfx_version));
        });
        Ok(FlowEvents {
            shared: Arc::new(Shared {
                rx: Mutex::new(rx),
                wake_read,
                stop,
                stopping,
                finished,
            }),
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

/// The runtime side of one flow run. Holds no Python object.
struct Producer {
    tx: mpsc::Sender<Item>,
    wake: UnixStream,
    stop: Arc<Notify>,
    stopping: Arc<AtomicBool>,
}

impl Producer {
    fn wake(&self) {
        // Non-blocking: a full socket already holds a pending wake.
        let _ = (&self.wake).write(&[1]);
    }

    fn stopped(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Sends `item` unless the consumer asked to stop first; false when it did (or is gone).
    async fn send(&self, item: Item) -> bool {
        let sent = tokio::select! {
            r = self.tx.send(item) => r.is_ok(),
            () = self.stop.notified() => false,
        };
        self.wake();
        sent && !self.stopped()
    }

    async fn run(self, executor: Arc<Executor>, request: FlowRequest, lfx: Option<String>) {
        let started = tokio::select! {
            r = executor.start(&request, lfx.as_deref()) => Some(r),
            // Dropping the start future hands a created guest to the reaper.
            () = self.stop.notified() => None,
        };
        match started {
            None => {}
            Some(Err(e)) => {
                self.send(Err(e)).await;
            }
            Some(Ok(mut run)) => loop {
                if self.stopped() {
                    run.close().await;
                    break;
                }
                let step = tokio::select! {
                    s = run.next() => Some(s),
                    () = self.stop.notified() => None,
                };
                match step {
                    None => {
                        run.close().await;
                        break;
                    }
                    Some(Ok(None)) => break,
                    Some(Ok(Some(ev))) => {
                        let last = matches!(ev, Event::Complete(_));
                        if !self.send(Ok(ev)).await {
                            run.close().await;
                            break;
                        }
                        if last {
                            break;
                        }
                    }
                    Some(Err(e)) => {
                        self.send(Err(e)).await;
                        break;
                    }
                }
            },
        }
        // Dropping `self` closes the channel; `Finished` then marks the run over.
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
    let result = match crate::wait::drive(py, rt, move || async move {
        let env: langflow_executor::EnvLookup = Arc::new(|k| std::env::var(k).ok());
        langflow_executor::template::build(&env, &name, &dockerfile, |line| {
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
