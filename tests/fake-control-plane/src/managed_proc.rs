//! A managed process's record: what it runs, its state and its retained, sequenced output
//! (1 MiB per process). The routes that start, follow and stop one are in `procs`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, MutexGuard};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tokio::io::AsyncWrite;
use tokio::sync::watch;

use crate::util::signal_groups;

/// Output retained per process for replay (older chunks are dropped).
pub(crate) const RETAIN_BYTES: usize = 1024 * 1024;

/// Where a process's stdin (or PTY input) is written.
pub(crate) type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// Mutable process state.
#[derive(Debug)]
#[allow(clippy::struct_excessive_bools)]
pub(crate) struct ProcState {
    pub state: &'static str,
    pub exit_code: Option<i32>,
    pub signal: Option<String>,
    pub finished_at: Option<String>,
    pub leader_exited: bool,
    pub tree_exited: bool,
    pub output_done: bool,
    pub chunks: VecDeque<(u64, &'static str, Vec<u8>)>,
    pub bytes: usize,
    pub newest_seq: u64,
    pub dropped: bool,
    pub input_seq: u64,
    pub rows: u64,
    pub cols: u64,
}

/// A managed process.
pub(crate) struct ManagedProc {
    pub id: String,
    pub pty: bool,
    pub pid: i32,
    pub pgid: AtomicI32,
    pub cmd: String,
    pub args: Vec<String>,
    pub cwd: String,
    pub created_at: String,
    pub st: Mutex<ProcState>,
    pub changed: watch::Sender<u64>,
    pub stdin: tokio::sync::Mutex<Option<Writer>>,
}

impl std::fmt::Debug for ManagedProc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedProc")
            .field("id", &self.id)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

impl ManagedProc {
    /// Sends `sig` to the process's group.
    pub(crate) fn signal_group(&self, sig: Signal) {
        signal_groups(&[self.pgid.load(Ordering::SeqCst)], sig);
    }

    /// Locks the mutable state (a poisoned lock is recovered).
    pub(crate) fn lock(&self) -> MutexGuard<'_, ProcState> {
        self.st
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Wakes every follower (`connect`, `wait`): something changed.
    pub(crate) fn bump(&self) {
        self.changed.send_modify(|v| *v += 1);
    }

    /// The wire projection.
    pub(crate) fn to_json(&self) -> Value {
        let st = self.lock();
        let oldest = st.chunks.front().map_or(st.newest_seq + 1, |c| c.0);
        let mut v = json!({
            "process_id": self.id,
            "kind": if self.pty { "pty" } else { "process" },
            "pid": self.pid,
            "state": st.state,
            "leader_exited": st.leader_exited,
            "tree_exited": st.tree_exited,
            "created_at": self.created_at,
            "cmd": self.cmd,
            "args": self.args,
            "cwd": self.cwd,
            "output": {"oldest_seq": oldest, "newest_seq": st.newest_seq, "bytes": st.bytes},
        });
        let o = v.as_object_mut().expect("object");
        if let Some(c) = st.exit_code {
            o.insert("exit_code".into(), json!(c));
        }
        if let Some(s) = &st.signal {
            o.insert("signal".into(), json!(s));
        }
        if let Some(f) = &st.finished_at {
            o.insert("finished_at".into(), json!(f));
        }
        if self.pty {
            o.insert(
                "foreground".into(),
                json!({"pid": self.pid, "cmd": self.cmd, "args": self.args}),
            );
        }
        v
    }

    /// Appends a chunk of `stream` output with the next `seq`, dropping the oldest chunks beyond
    /// [`RETAIN_BYTES`].
    pub(crate) fn push_output(&self, stream: &'static str, data: Vec<u8>) {
        let mut st = self.lock();
        st.newest_seq += 1;
        let seq = st.newest_seq;
        st.bytes += data.len();
        st.chunks.push_back((seq, stream, data));
        while st.bytes > RETAIN_BYTES && st.chunks.len() > 1 {
            if let Some((_, _, d)) = st.chunks.pop_front() {
                st.bytes -= d.len();
                st.dropped = true;
            }
        }
        drop(st);
        self.bump();
    }

    /// Whether any process of its group is still alive.
    pub(crate) fn group_alive(&self) -> bool {
        let g = self.pgid.load(Ordering::SeqCst);
        g > 1 && killpg(Pid::from_raw(g), None).is_ok()
    }
}
