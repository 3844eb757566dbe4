//! SIGTERM: a clean exit that destroys this process's guests, where nobody else handles it.
//!
//! `lfx run`, `docker stop` and systemd stop a process with SIGTERM, whose default action
//! kills it at once: `atexit` never runs and every guest outlives the process. So, on the
//! first run in a process, if Python reports SIGTERM at its default (`signal.getsignal` is
//! `SIG_DFL`), a handler is installed that turns SIGTERM into: destroy every live guest of the
//! process (bounded), write the log records still queued to stderr, then die of SIGTERM
//! exactly as the default would have (same exit status for the parent). A second SIGTERM
//! during that cleanup kills at once.
//!
//! Decisions, and why:
//!
//! - **Never replace someone else's handler.** Checked when installing, with the GIL held, so no
//!   Python code can change the handler between the check and the installation. A handler
//!   installed *later* (uvicorn, gunicorn, the application) simply replaces ours.
//! - **Installed at the first run, not at construction.** lfx builds the backend and runs it
//!   on a worker thread (`asyncio.to_thread`), and Langflow builds it in processes that never
//!   run code; the first run is the first moment a guest can exist, and the runtime the
//!   watcher needs exists from then on. So the handler cannot be Python's `signal.signal`,
//!   which only the main thread may call: it is an OS-level handler (`signal-hook`) that
//!   works from any thread. Python's own handler table still reads `SIG_DFL`, so code that
//!   checks it before installing its own handler behaves as before.
//! - **The handler only sets a flag** (all a signal handler may safely do); a task on this
//!   process's runtime (the watcher) polls it every 100 ms. Polling an atomic in the process's
//!   own memory is fork-safe, unlike a self-pipe whose descriptors a forked child would share
//!   with its parent.
//! - **Without a watcher, the default action.** The handler's first action is "take the default
//!   action (die of SIGTERM) if this process has no watcher" (`unwatched`). A forked child
//!   inherits the handler but not the watcher (a task of the parent's runtime), so an
//!   `os.register_at_fork` hook, registered with the handler, sets `unwatched` in every child
//!   forked by Python (`os.fork`, multiprocessing's fork start method): a child that has not
//!   run anything dies of its first SIGTERM, as it would without the plugin (`Pool.terminate()`
//!   ends busy workers). The child's first run starts its own watcher and clears `unwatched`;
//!   from then on the child's SIGTERM destroys the child's guests, then kills it. The parent's
//!   guests are never the child's: every cleanup list is keyed on the process id.
//! - **No SIGTERM lost at the fork.** One that reaches the child between the fork and the hook
//!   only sets the flag: the hook finds it set and kills the child then. A flag the child
//!   inherited set (the parent was already cleaning up when it forked, noted by a before-fork
//!   hook) is cleared instead: that SIGTERM was the parent's.
//! - **No wrong verdict.** Once SIGTERM is being handled, a run that ends (its guest was just
//!   destroyed under it) does not return to the caller: the process is about to die of
//!   SIGTERM, and reporting a failure first would be a false result.
//! - **No record lost.** Records reach Python's `logging` only when a thread holding the GIL
//!   drains them ([`crate::logbridge`]); the cleanup's own (a guest that could not be
//!   destroyed, say) would die with the process. They are written to stderr, one plain line
//!   each, right before it dies.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use signal_hook::consts::SIGTERM;
use tokio::runtime::Runtime;

/// How often the watcher looks at the flag.
const POLL: Duration = Duration::from_millis(100);

/// Our handler's state, once it is installed in this process image (a forked child inherits
/// the handler and these values).
struct Handler {
    /// Set by the handler: a SIGTERM arrived. Read by this process's watcher.
    flag: Arc<AtomicBool>,
    /// True while this process has no watcher: the handler then takes the default action.
    /// True from the installation until the watcher starts, and again in every forked child
    /// (the fork hook) until the child starts a watcher of its own.
    unwatched: Arc<AtomicBool>,
}

static HANDLER: OnceLock<Handler> = OnceLock::new();

/// The flag's value when this process image was forked (set by the before-fork hook): a child
/// that finds the flag set when its after-fork hook runs got a SIGTERM of its own only if the
/// parent's was not set already.
static FLAG_AT_FORK: AtomicBool = AtomicBool::new(false);

/// Process that last decided whether to watch SIGTERM (0: none yet).
static DECIDED_BY: AtomicU32 = AtomicU32::new(0);

/// Set once SIGTERM is being handled in this process: runs must not report results.
static TERMINATING: AtomicBool = AtomicBool::new(false);

/// Whether this process is exiting because of SIGTERM.
pub fn terminating() -> bool {
    TERMINATING.load(Ordering::SeqCst)
}

/// What [`arm`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Armed {
    /// Our handler is installed and this process has a watcher.
    Watching,
    /// Someone else handles (or ignores) SIGTERM: left alone.
    LeftAlone,
    /// Decided earlier in this process.
    AlreadyDecided,
}

/// What SIGTERM's watcher runs: every surface's shutdown, registered once by the module's
/// initialisation ([`set_every_surface`]), so a surface arms the handler without naming the
/// others.
static EVERY_SURFACE: std::sync::OnceLock<fn() -> futures::future::BoxFuture<'static, ()>> =
    std::sync::OnceLock::new();

/// Registers the shutdown of every surface of the process (the module's initialisation).
pub fn set_every_surface(shutdown: fn() -> futures::future::BoxFuture<'static, ()>) {
    let _ = EVERY_SURFACE.set(shutdown);
}

/// [`arm`] with the shutdown of every surface of the process (see [`set_every_surface`]); also
/// arms the cancellation of runs blocked on any thread by Ctrl-C ([`crate::interrupt`]).
pub fn arm_every_surface(py: Python<'_>, rt: &'static Runtime) -> Armed {
    crate::interrupt::arm(py);
    let shutdown = EVERY_SURFACE.get().copied();
    arm(py, rt, move || async move {
        if let Some(shutdown) = shutdown {
            shutdown().await;
        }
    })
}

/// Installs the SIGTERM handler if SIGTERM is at its default, and starts this process's
/// watcher, once per process. `cleanup` runs (on the runtime) when SIGTERM arrives; the
/// process then dies of SIGTERM.
pub fn arm<F, Fut>(py: Python<'_>, rt: &'static Runtime, cleanup: F) -> Armed
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let pid = std::process::id();
    if DECIDED_BY.swap(pid, Ordering::SeqCst) == pid {
        return Armed::AlreadyDecided;
    }
    let handler = if let Some(handler) = HANDLER.get() {
        // Installed before the fork that made this process: the handler is inherited.
        handler
    } else {
        if !at_default(py) {
            return Armed::LeftAlone;
        }
        match install(py) {
            Ok(handler) => HANDLER.get_or_init(|| handler),
            Err(err) => {
                tracing::warn!(
                    target: "langflow_sandbox_createos",
                    "cannot watch SIGTERM ({err}); a SIGTERM will leave guests to their \
                     auto-pause backstop"
                );
                return Armed::LeftAlone;
            }
        }
    };
    rt.spawn(watch(Arc::clone(&handler.flag), cleanup));
    // From here on a SIGTERM only sets the flag: the watcher just spawned acts on it (one that
    // arrived since the installation or the fork already killed the process, which had no
    // guest yet).
    handler.unwatched.store(false, Ordering::SeqCst);
    Armed::Watching
}

/// Whether Python reports SIGTERM at its default action.
fn at_default(py: Python<'_>) -> bool {
    let Ok(signal) = py.import("signal") else {
        return false;
    };
    let (Ok(current), Ok(default)) = (
        signal.call_method1("getsignal", (SIGTERM,)),
        signal.getattr("SIG_DFL"),
    ) else {
        return false;
    };
    current.eq(default).unwrap_or(false)
}

/// Registers the fork hooks, then, in this order, "without a watcher, the default action",
/// "a second SIGTERM runs the default action" and "set the flag": with a watcher, the first
/// SIGTERM only sets the flag.
fn install(py: Python<'_>) -> PyResult<Handler> {
    // The hooks first: a child must never inherit a handler that nothing in it acts on.
    let hooks = PyDict::new(py);
    hooks.set_item("before", wrap_pyfunction!(before_fork, py)?)?;
    hooks.set_item("after_in_child", wrap_pyfunction!(after_fork_in_child, py)?)?;
    py.import("os")?
        .getattr("register_at_fork")?
        .call((), Some(&hooks))?;
    let handler = Handler {
        flag: Arc::new(AtomicBool::new(false)),
        unwatched: Arc::new(AtomicBool::new(true)),
    };
    // Should a later registration fail, `unwatched` stays true in every process that has any
    // of these actions: SIGTERM keeps its default action there.
    signal_hook::flag::register_conditional_default(SIGTERM, Arc::clone(&handler.unwatched))?;
    signal_hook::flag::register_conditional_default(SIGTERM, Arc::clone(&handler.flag))?;
    signal_hook::flag::register(SIGTERM, Arc::clone(&handler.flag))?;
    Ok(handler)
}

/// `os.register_at_fork(before=...)`: notes whether this process already got SIGTERM.
#[pyfunction]
fn before_fork() {
    if let Some(handler) = HANDLER.get() {
        FLAG_AT_FORK.store(handler.flag.load(Ordering::SeqCst), Ordering::SeqCst);
    }
}

/// `os.register_at_fork(after_in_child=...)`: the child has no watcher, so SIGTERM takes its
/// default action again; one that arrived between the fork and this hook (it only set the
/// flag) is acted on now, as the default action would have.
#[pyfunction]
fn after_fork_in_child() {
    let Some(handler) = HANDLER.get() else {
        return;
    };
    handler.unwatched.store(true, Ordering::SeqCst);
    // The parent's SIGTERM and its cleanup are not this child's.
    TERMINATING.store(false, Ordering::SeqCst);
    if handler.flag.swap(false, Ordering::SeqCst) && !FLAG_AT_FORK.load(Ordering::SeqCst) {
        die_of_sigterm();
    }
}

async fn watch<F, Fut>(flag: Arc<AtomicBool>, cleanup: F)
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    while !flag.load(Ordering::SeqCst) {
        tokio::time::sleep(POLL).await;
    }
    TERMINATING.store(true, Ordering::SeqCst);
    tracing::info!(
        target: "langflow_sandbox_createos",
        "SIGTERM: destroying this process's guests, then exiting"
    );
    cleanup().await;
    // No thread will hand the cleanup's records to Python's logging any more.
    crate::logbridge::flush_to_stderr();
    die_of_sigterm();
}

/// Dies of SIGTERM, as the default action would have; exit(143) only if that fails.
fn die_of_sigterm() -> ! {
    let _ = signal_hook::low_level::emulate_default_handler(SIGTERM);
    std::process::exit(128 + SIGTERM);
}
