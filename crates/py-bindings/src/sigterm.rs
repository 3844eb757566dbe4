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
//!   process's runtime polls it every 100 ms. Polling an atomic in the process's own memory
//!   is fork-safe, unlike a self-pipe whose descriptors a forked child would share with its
//!   parent. A forked child inherits the handler and gets its own watcher on its first run.
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
use signal_hook::consts::SIGTERM;
use tokio::runtime::Runtime;

/// How often the watcher looks at the flag.
const POLL: Duration = Duration::from_millis(100);

/// The flag our handler sets, once it is installed in this process image (a forked child
/// inherits both the handler and this value).
static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();

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
    let flag = if let Some(flag) = FLAG.get() {
        // Installed before the fork that made this process: the handler is inherited.
        Arc::clone(flag)
    } else {
        if !at_default(py) {
            return Armed::LeftAlone;
        }
        match install() {
            Ok(flag) => Arc::clone(FLAG.get_or_init(|| flag)),
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
    rt.spawn(watch(flag, cleanup));
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

/// Registers, in this order, "a second SIGTERM runs the default action" and "set the flag",
/// so the first SIGTERM only sets the flag.
fn install() -> std::io::Result<Arc<AtomicBool>> {
    let flag = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register_conditional_default(SIGTERM, Arc::clone(&flag))?;
    signal_hook::flag::register(SIGTERM, Arc::clone(&flag))?;
    Ok(flag)
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
    // Dies of SIGTERM, as the default action would have; exit(143) only if that fails.
    let _ = signal_hook::low_level::emulate_default_handler(SIGTERM);
    std::process::exit(128 + SIGTERM);
}
