//! Rust `tracing` events → Python `logging`, without touching Python from tokio threads.
//!
//! A tracing layer formats each event on the thread that emits it (usually a tokio worker)
//! and pushes it into a bounded in-process queue. Only a thread that already holds the GIL
//! drains the queue into the `langflow_sandbox_createos` logger: the thread waiting on a run
//! does so between its signal checks and when the run ends. No Python object is ever touched
//! from a runtime thread, so a worker can never stall on the GIL or outlive the interpreter
//! while holding a Python reference. The one exception is a process about to die of SIGTERM
//! ([`crate::sigterm`]): nobody will drain again, so [`flush_to_stderr`] writes what is left to
//! stderr as plain lines.
//!
//! Fork safety: a child created by `fork()` while another thread held the queue's mutex
//! inherits it locked, with no thread left to unlock it. So a process that did not lock a
//! queue yet (`OWNER` is another process's id) never blocks on one: it tries a bounded number
//! of times, and if the mutex stays locked it moves on to the next queue of [`QUEUES`], which
//! no thread of this process, nor of any process it descends from, ever locked. The queues are
//! used in order along any line of forks, so one found locked is never used again. No lock is
//! held across `fork()` on purpose (an `os.register_at_fork` hook holding the queue while other
//! Python hooks ran could release the GIL, and a thread that then took the GIL and waited for
//! the queue deadlocked the fork), and no thread holding a queue ever waits for the GIL, so a
//! thread holding the GIL may wait for one.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, Once, PoisonError, TryLockError};

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;
use tracing::field::{Field, Visit};
use tracing::subscriber::Interest;
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};

/// The Python logger every record goes to.
pub const LOGGER_NAME: &str = "langflow_sandbox_createos";

/// Records kept while nobody drains; older ones are dropped first and counted.
const QUEUE_CAP: usize = 2048;

/// Crates whose events are forwarded at every level the Python logger enables. Events from
/// other crates (hyper, reqwest, ...) are forwarded only from WARNING up.
const OWN_TARGETS: &[&str] = &[
    "createos_api",
    "sandbox_core",
    "langflow_backend",
    "langflow_sandbox_createos",
    "_native",
];

/// Python's numeric levels.
const PY_DEBUG: u32 = 10;
const PY_INFO: u32 = 20;
const PY_WARNING: u32 = 30;
const PY_ERROR: u32 = 40;
/// Below DEBUG, as tracing's TRACE has no Python name.
const PY_TRACE: u32 = 5;

/// The Python logger's effective level, refreshed each time a run starts.
static THRESHOLD: AtomicU32 = AtomicU32::new(PY_INFO);

/// One formatted event waiting for a thread that holds the GIL.
struct Record {
    level: u32,
    target: String,
    message: String,
}

struct Queue {
    /// Process that queued these records: a forked child must not re-emit its parent's.
    pid: u32,
    records: VecDeque<Record>,
    dropped: u64,
}

impl Queue {
    const fn new() -> Self {
        Self {
            pid: 0,
            records: VecDeque::new(),
            dropped: 0,
        }
    }
}

/// Forks, along one line of descent, that may find the queue locked before records are given
/// up (then with one warning). Each costs one empty queue of static memory.
const GENERATIONS: usize = 64;

/// The queues, used one after the other: [`CURRENT`] moves on only in a process that finds
/// its queue locked by a thread it does not have.
static QUEUES: [Mutex<Queue>; GENERATIONS] = [const { Mutex::new(Queue::new()) }; GENERATIONS];

/// Index of the queue in use in [`QUEUES`].
static CURRENT: AtomicUsize = AtomicUsize::new(0);

/// Id of the process whose threads lock the current queue (0: none yet). Any other value means
/// the queue was copied from a parent and may be held by a thread that does not exist here.
static OWNER: AtomicU32 = AtomicU32::new(0);

/// Attempts at taking an inherited queue before moving on to the next one.
const INHERITED_ATTEMPTS: u32 = 2000;

/// Id of the process that ran out of queues and drops its records (0: none).
static UNUSABLE_IN: AtomicU32 = AtomicU32::new(0);
/// Id of the process that reported [`UNUSABLE_IN`] (0: none).
static UNUSABLE_REPORTED_IN: AtomicU32 = AtomicU32::new(0);

/// The queue, emptied of records another process queued; `None` when this process ran out of
/// queues that are not locked by a thread of a parent.
fn lock_queue() -> Option<MutexGuard<'static, Queue>> {
    let pid = std::process::id();
    if OWNER.load(Ordering::Acquire) == pid {
        let queue = &QUEUES[CURRENT.load(Ordering::Acquire)];
        return Some(queue.lock().unwrap_or_else(PoisonError::into_inner));
    }
    if UNUSABLE_IN.load(Ordering::Acquire) == pid {
        return None;
    }
    loop {
        let current = CURRENT.load(Ordering::Acquire);
        if let Some(mut queue) = adopt(&QUEUES[current]) {
            if queue.pid != pid {
                queue.pid = pid;
                queue.records.clear();
                queue.dropped = 0;
            }
            OWNER.store(pid, Ordering::Release);
            return Some(queue);
        }
        // Locked by a thread this process does not have: the next queue was never locked here
        // (nor in any ancestor, as they moved on in the same order). Another thread of this
        // process may have moved on already, hence the compare-exchange.
        if current + 1 == GENERATIONS {
            UNUSABLE_IN.store(pid, Ordering::Release);
            return None;
        }
        let _ = CURRENT.compare_exchange(current, current + 1, Ordering::AcqRel, Ordering::Acquire);
    }
}

/// Takes `queue` if it comes free within [`INHERITED_ATTEMPTS`] tries.
fn adopt(queue: &'static Mutex<Queue>) -> Option<MutexGuard<'static, Queue>> {
    for _ in 0..INHERITED_ATTEMPTS {
        match queue.try_lock() {
            Ok(queue) => return Some(queue),
            Err(TryLockError::Poisoned(poisoned)) => return Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => std::thread::yield_now(),
        }
    }
    None
}

/// Diagnostic: holds the log queue for `seconds` on the calling thread, with the GIL released.
/// The fork-safety test forks meanwhile, so that the child inherits the queue locked.
#[pyfunction]
pub fn _hold_log_queue(py: Python<'_>, seconds: f64) {
    py.detach(|| {
        let guard = lock_queue();
        std::thread::sleep(std::time::Duration::from_secs_f64(seconds.clamp(0.0, 60.0)));
        drop(guard);
    });
}

/// Emits `count` INFO events with `message` from the calling thread, with the GIL released,
/// then forwards what is queued to Python's `logging`. A diagnostic (the fork-safety test
/// uses it to log heavily from one thread while another forks).
#[pyfunction]
#[pyo3(signature = (count, message))]
pub fn _emit_log_records(py: Python<'_>, count: u64, message: &str) {
    install();
    sync_level(py);
    py.detach(|| {
        for seq in 0..count {
            tracing::info!(target: "langflow_sandbox_createos", seq, "{message}");
        }
    });
    drain(py);
}

fn py_level(level: Level) -> u32 {
    match level {
        Level::ERROR => PY_ERROR,
        Level::WARN => PY_WARNING,
        Level::INFO => PY_INFO,
        Level::DEBUG => PY_DEBUG,
        Level::TRACE => PY_TRACE,
    }
}

fn is_own(target: &str) -> bool {
    OWN_TARGETS.iter().any(|own| {
        target == *own
            || target
                .strip_prefix(own)
                .is_some_and(|rest| rest.starts_with("::"))
    })
}

fn wanted(metadata: &Metadata<'_>) -> bool {
    let level = py_level(*metadata.level());
    level >= THRESHOLD.load(Ordering::Relaxed) && (level >= PY_WARNING || is_own(metadata.target()))
}

/// Collects the `message` field and appends every other field as ` key=value`.
#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.rest, " {}={}", field.name(), value);
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.rest, " {}={:?}", field.name(), value);
        }
    }
}

/// The tracing layer that queues events for Python.
struct Forward;

impl<S: Subscriber> Layer<S> for Forward {
    fn register_callsite(&self, _metadata: &'static Metadata<'static>) -> Interest {
        // The threshold follows the Python logger, so decide per event, not once per callsite.
        Interest::sometimes()
    }

    fn enabled(&self, metadata: &Metadata<'_>, _ctx: Context<'_, S>) -> bool {
        wanted(metadata)
    }

    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let metadata = event.metadata();
        if !wanted(metadata) {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        fields.message.push_str(&fields.rest);
        push(Record {
            level: py_level(*metadata.level()),
            target: metadata.target().to_owned(),
            message: one_line(fields.message),
        });
    }
}

/// `message` as one line, whatever a field of it carries: a value from outside (a server's
/// sandbox id, a guest's name) that a call site forgot to escape cannot start a line of the
/// log. No copy when there is nothing to escape.
fn one_line(message: String) -> String {
    match outside_text::line(&message) {
        std::borrow::Cow::Borrowed(_) => message,
        std::borrow::Cow::Owned(escaped) => escaped,
    }
}

fn push(record: Record) {
    let Some(mut queue) = lock_queue() else {
        return;
    };
    if queue.records.len() >= QUEUE_CAP {
        queue.records.pop_front();
        queue.dropped += 1;
    }
    queue.records.push_back(record);
}

/// Installs the forwarding layer as the process's global tracing subscriber, once.
///
/// If the embedding process already installed a subscriber, that one keeps the events and
/// nothing reaches Python's `logging` from here.
pub fn install() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let subscriber = tracing_subscriber::registry().with(Forward);
        let _ = tracing::subscriber::set_global_default(subscriber);
    });
}

static LOGGER: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn logger(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    LOGGER
        .get_or_try_init(py, || {
            py.import("logging")?
                .getattr("getLogger")?
                .call1((LOGGER_NAME,))
                .map(Bound::unbind)
        })
        .map(|logger| logger.bind(py))
}

/// Reads the Python logger's effective level so events it would discard are not even formatted.
pub fn sync_level(py: Python<'_>) {
    if let Ok(level) = logger(py)
        .and_then(|logger| logger.call_method0("getEffectiveLevel"))
        .and_then(|level| level.extract::<u32>())
    {
        THRESHOLD.store(level, Ordering::Relaxed);
    }
}

/// Emits every queued record through Python's `logging`. Needs the GIL; never fails.
pub fn drain(py: Python<'_>) {
    let Some((records, dropped)) = take_queued() else {
        let pid = std::process::id();
        if UNUSABLE_REPORTED_IN.swap(pid, Ordering::AcqRel) != pid
            && let Ok(logger) = logger(py)
        {
            let _ = logger.call_method1(
                "log",
                (
                    PY_WARNING,
                    "log records of the native extension are unavailable in this process: its \
                     parents were forked too many times while another thread was logging",
                ),
            );
        }
        return;
    };
    if records.is_empty() && dropped == 0 {
        return;
    }
    emit(py, records, dropped);
}

/// Takes every queued record and the count of dropped ones.
fn take_queued() -> Option<(VecDeque<Record>, u64)> {
    let mut queue = lock_queue()?;
    Some((
        std::mem::take(&mut queue.records),
        std::mem::take(&mut queue.dropped),
    ))
}

fn dropped_message(dropped: u64) -> String {
    format!("{dropped} log records from the native extension were dropped (queue full)")
}

fn emit(py: Python<'_>, mut records: VecDeque<Record>, dropped: u64) {
    let Ok(logger) = logger(py) else { return };
    if dropped > 0 {
        let sent = logger.call_method1("log", (PY_WARNING, dropped_message(dropped)));
        if interrupted(py, sent.err()) {
            requeue(records);
            return;
        }
    }
    while let Some(record) = records.pop_front() {
        let extra = PyDict::new(py);
        let _ = extra.set_item("rust_target", &record.target);
        let kwargs = PyDict::new(py);
        let _ = kwargs.set_item("extra", extra);
        // A record Python cannot handle (a broken handler, say) must not fail the run.
        let sent = logger.call_method("log", (record.level, record.message), Some(&kwargs));
        if interrupted(py, sent.err()) {
            requeue(records);
            return;
        }
    }
}

/// Whether a log call was cut short by Ctrl-C, in which case the interrupt is handed on.
///
/// Emitting a record runs Python code, and Python runs a pending signal's handler at the first
/// bytecode it executes: a Ctrl-C that lands while records are forwarded raises
/// `KeyboardInterrupt` inside `logger.log`. Dropping that error (as for a broken handler) would
/// lose the Ctrl-C, and the run would go on to its timeout. So the interrupt is raised again
/// for the main thread (`_thread.interrupt_main`, as if SIGINT had arrived once more), and the
/// waiting loop's signal check, which comes right after the drain, turns it into the
/// `KeyboardInterrupt` of the interrupted call.
fn interrupted(py: Python<'_>, err: Option<PyErr>) -> bool {
    let Some(err) = err else { return false };
    if !err.is_instance_of::<pyo3::exceptions::PyKeyboardInterrupt>(py) {
        return false;
    }
    // `_thread.interrupt_main` is part of every CPython this wheel supports; should it fail,
    // there is no other way to hand the interrupt on from here.
    let _ = py
        .import("_thread")
        .and_then(|thread| thread.call_method0("interrupt_main"));
    true
}

/// Writes every queued record to stderr, one plain line each (`LEVEL:logger:message`, as
/// Python's `logging.basicConfig` would), for a process about to die of SIGTERM: no thread
/// hands records to Python's `logging` any more, and whatever is still queued would be lost.
/// Records never carry the API key; control characters are escaped, so each stays one line.
/// Needs no GIL and touches no Python object.
pub fn flush_to_stderr() {
    use std::io::Write as _;
    let Some((records, dropped)) = take_queued() else {
        return;
    };
    let mut out = String::new();
    if dropped > 0 {
        plain_line(&mut out, PY_WARNING, &dropped_message(dropped));
    }
    for record in &records {
        plain_line(&mut out, record.level, &record.message);
    }
    if !out.is_empty() {
        // One write: stderr is unbuffered, and the process dies right after.
        let _ = std::io::stderr().lock().write_all(out.as_bytes());
    }
}

/// Appends `LEVEL:logger:message` and a newline, with the message's control characters escaped.
fn plain_line(out: &mut String, level: u32, message: &str) {
    let name = match level {
        PY_ERROR.. => "ERROR",
        PY_WARNING.. => "WARNING",
        PY_INFO.. => "INFO",
        PY_DEBUG.. => "DEBUG",
        _ => "TRACE",
    };
    let _ = write!(out, "{name}:{LOGGER_NAME}:{}", outside_text::line(message));
    out.push('\n');
}

/// Puts records not yet emitted back at the front of the queue, for the next drain.
fn requeue(records: VecDeque<Record>) {
    if records.is_empty() {
        return;
    }
    if let Some(mut queue) = lock_queue() {
        let newer = std::mem::replace(&mut queue.records, records);
        queue.records.extend(newer);
        while queue.records.len() > QUEUE_CAP {
            queue.records.pop_front();
            queue.dropped += 1;
        }
    }
}

/// Text from outside the process (a guest's names and messages, a store's reply) as the host
/// shows it: at most `limit` bytes, on one line, with every control, line-break and
/// bidirectional character escaped: the workspace's one escaping (`outside-text`), for the
/// Python glue.
#[pyfunction]
pub fn outside_line(text: &str, limit: usize) -> String {
    outside_text::snippet(text, limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_targets_match_by_crate_prefix() {
        assert!(is_own("sandbox_core"));
        assert!(is_own("sandbox_core::lifecycle"));
        assert!(!is_own("sandbox_core_extra"));
        assert!(!is_own("hyper::client"));
    }

    #[test]
    fn a_plain_line_is_one_line_whatever_the_message_holds() {
        let mut out = String::new();
        plain_line(
            &mut out,
            PY_ERROR,
            "could not destroy guest\nx=\u{1b}[2J\u{7}\u{2028}\u{202e}",
        );
        plain_line(&mut out, PY_INFO, "done");
        assert_eq!(
            out,
            "ERROR:langflow_sandbox_createos:could not destroy guest\\nx=\\x1b[2J\\x07\\u{2028}\\u{202e}\n\
             INFO:langflow_sandbox_createos:done\n"
        );
    }

    #[test]
    fn every_forwarded_record_is_one_line() {
        assert_eq!(
            one_line("sandbox run finished guest=sbx-1\nCRITICAL forged".to_owned()),
            "sandbox run finished guest=sbx-1\\nCRITICAL forged"
        );
        assert_eq!(one_line("plain".to_owned()), "plain");
    }

    #[test]
    fn queue_is_bounded_and_counts_drops() {
        for i in 0..(QUEUE_CAP + 5) {
            push(Record {
                level: PY_INFO,
                target: "sandbox_core".into(),
                message: format!("m{i}"),
            });
        }
        let queue = QUEUES[CURRENT.load(Ordering::Acquire)].lock().unwrap();
        assert_eq!(queue.records.len(), QUEUE_CAP);
        assert_eq!(queue.dropped, 5);
        assert_eq!(queue.records.front().unwrap().message, "m5");
    }
}
