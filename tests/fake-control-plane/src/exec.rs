//! Running guest commands as real local subprocesses.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use crate::state::App;
use crate::util::{map_guest_text, signal_groups};

/// Host environment variables passed through to guest commands.
const PASS_THROUGH: &[&str] = &[
    "LANG",
    "LC_ALL",
    "USER",
    "LOGNAME",
    "PYENV_ROOT",
    "PYENV_VERSION",
];

/// Builds the environment of a guest command.
pub(crate) fn guest_env(
    app: &App,
    dir: &Path,
    envs: &BTreeMap<String, String>,
) -> Vec<(OsString, OsString)> {
    let mut out: Vec<(OsString, OsString)> = Vec::new();
    for k in PASS_THROUGH {
        if let Some(v) = std::env::var_os(k) {
            out.push(((*k).into(), v));
        }
    }
    // A pyenv shim finds its root through HOME, which the guest replaces.
    if std::env::var_os("PYENV_ROOT").is_none()
        && let Some(home) = std::env::var_os("HOME")
    {
        let root = Path::new(&home).join(".pyenv");
        if root.is_dir() {
            out.push(("PYENV_ROOT".into(), root.into_os_string()));
        }
    }
    if std::env::var_os("LANG").is_none() {
        out.push(("LANG".into(), "C.UTF-8".into()));
    }
    let mut dirs: Vec<std::path::PathBuf> = app.guest_path.clone();
    if let Some(host) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&host));
    }
    let path = std::env::join_paths(dirs).unwrap_or_default();
    out.push(("PATH".into(), path));
    out.push(("HOME".into(), dir.join("root").into_os_string()));
    out.push(("TMPDIR".into(), dir.join("tmp").into_os_string()));
    out.push(("PWD".into(), dir.join("workspace").into_os_string()));
    for (k, v) in envs {
        out.push((k.into(), map_guest_text(v, dir).into()));
    }
    out
}

/// A command to run in a guest.
#[derive(Debug)]
pub(crate) struct Spec {
    pub cmd: String,
    pub args: Vec<String>,
    pub stdin: Option<Vec<u8>>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    /// The guest's network namespace (enforcing mode): the command runs inside it.
    pub netns: Option<String>,
}

/// The message of a command that cannot start because it is not found.
fn not_found(cmd: &str) -> String {
    format!("exec: {cmd:?}: executable file not found in $PATH")
}

/// The command for `spec` with its environment `env`: the program itself, or, in the enforcing
/// mode, `ip netns exec NS` followed by the program found on the guest's `PATH` (found here, so
/// a missing program still fails to start instead of running `ip` that then fails).
pub(crate) fn guest_command(
    app: &App,
    dir: &Path,
    spec: &Spec,
    env: &[(OsString, OsString)],
) -> Result<Command, String> {
    let cmd = map_guest_text(&spec.cmd, dir);
    let (Some(ns), Some(enforcer)) = (&spec.netns, &app.enforcer) else {
        return Ok(Command::new(&cmd));
    };
    let program = if cmd.contains('/') {
        Some(std::path::PathBuf::from(&cmd)).filter(|p| p.is_file())
    } else {
        let path = env
            .iter()
            .rev()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone());
        path.and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(&cmd))
                .find(|p| p.is_file())
        })
    };
    let program = program.ok_or_else(|| not_found(&spec.cmd))?;
    let mut command = Command::new(enforcer.ip_program());
    command.args(["netns", "exec", ns]).arg(program);
    Ok(command)
}

/// Output produced by a running command.
#[derive(Debug)]
pub(crate) enum Out {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
}

/// A spawned guest command.
#[derive(Debug)]
pub(crate) struct Running {
    pub child: Child,
    pub pgid: i32,
    pub rx: mpsc::Receiver<Out>,
    pub stdin: Option<tokio::process::ChildStdin>,
}

/// Spawns `spec` in the guest directory `dir`; `Err` is the "could not start" message.
pub(crate) fn spawn(
    app: &App,
    dir: &Path,
    spec: &Spec,
    keep_stdin: bool,
) -> Result<Running, String> {
    let cwd = match &spec.cwd {
        Some(c) if !c.is_empty() => std::path::PathBuf::from(map_guest_text(c, dir)),
        _ => dir.join("workspace"),
    };
    let env = guest_env(app, dir, &spec.env);
    let mut command = guest_command(app, dir, spec, &env)?;
    command
        .args(spec.args.iter().map(|a| map_guest_text(a, dir)))
        .current_dir(&cwd)
        .env_clear()
        .envs(env)
        .process_group(0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(if spec.stdin.is_some() || keep_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    let mut child = command.spawn().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            not_found(&spec.cmd)
        } else {
            format!("exec: {:?}: {e}", spec.cmd)
        }
    })?;
    let pgid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
    let (tx, rx) = mpsc::channel(64);
    if let Some(out) = child.stdout.take() {
        tokio::spawn(pump(out, tx.clone(), Out::Stdout));
    }
    if let Some(err) = child.stderr.take() {
        tokio::spawn(pump(err, tx, Out::Stderr));
    }
    let mut stdin = child.stdin.take();
    if !keep_stdin && let (Some(data), Some(mut pipe)) = (spec.stdin.clone(), stdin.take()) {
        tokio::spawn(async move {
            let _ = pipe.write_all(&data).await;
            let _ = pipe.shutdown().await;
        });
    }
    Ok(Running {
        child,
        pgid,
        rx,
        stdin,
    })
}

async fn pump<R: AsyncRead + Unpin>(mut r: R, tx: mpsc::Sender<Out>, wrap: fn(Vec<u8>) -> Out) {
    let mut buf = vec![0_u8; 16 * 1024];
    loop {
        match r.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if tx.send(wrap(buf[..n].to_vec())).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// The exit code a shell would report (128 + signal for a killed process).
pub(crate) fn exit_code(st: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}

/// Incremental lossy UTF-8 decoding that keeps a split multi-byte character for the next chunk.
#[derive(Debug, Default)]
pub(crate) struct Utf8Carry {
    pending: Vec<u8>,
}

impl Utf8Carry {
    pub(crate) fn push(&mut self, data: &[u8]) -> String {
        self.pending.extend_from_slice(data);
        let keep = incomplete_tail(&self.pending);
        let cut = self.pending.len() - keep;
        let text = String::from_utf8_lossy(&self.pending[..cut]).into_owned();
        self.pending.drain(..cut);
        text
    }

    pub(crate) fn finish(&mut self) -> String {
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        text
    }
}

/// Bytes at the end of `b` that begin a multi-byte character not yet complete.
fn incomplete_tail(b: &[u8]) -> usize {
    for back in 1..=3.min(b.len()) {
        let c = b[b.len() - back];
        if c & 0b1100_0000 == 0b1000_0000 {
            continue; // continuation byte
        }
        let need = if c >= 0xF0 {
            4
        } else if c >= 0xE0 {
            3
        } else if c >= 0xC0 {
            2
        } else {
            1
        };
        return if need > back { back } else { 0 };
    }
    0
}

/// Kills a process group when dropped unless disarmed (client went away mid-exec).
#[derive(Debug)]
pub(crate) struct KillGuard {
    pub pgid: i32,
    pub armed: bool,
}

impl Drop for KillGuard {
    fn drop(&mut self) {
        if self.armed {
            signal_groups(&[self.pgid], Signal::SIGCONT);
            signal_groups(&[self.pgid], Signal::SIGKILL);
        }
    }
}

/// How long to keep reading output after the leader exits (background children may hold the pipes).
const DRAIN_GRACE: Duration = Duration::from_millis(200);

/// Runs to completion, buffering output: the `result` object of a buffered exec.
pub(crate) async fn run_buffered(mut running: Running) -> (Value, u128) {
    let started = Instant::now();
    let mut guard = KillGuard {
        pgid: running.pgid,
        armed: true,
    };
    let (mut out, mut err) = (Utf8Carry::default(), Utf8Carry::default());
    let (mut stdout, mut stderr) = (String::new(), String::new());
    let mut status: Option<ExitStatus> = None;
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            chunk = running.rx.recv() => match chunk {
                Some(Out::Stdout(b)) => stdout.push_str(&out.push(&b)),
                Some(Out::Stderr(b)) => stderr.push_str(&err.push(&b)),
                None => break,
            },
            st = running.child.wait(), if status.is_none() => {
                status = st.ok();
                if status.is_none() { break; }
                deadline = Some(tokio::time::Instant::now() + DRAIN_GRACE);
            },
            () = sleep_opt(deadline) => break,
        }
    }
    if status.is_none() {
        status = running.child.wait().await.ok();
    }
    guard.armed = false;
    stdout.push_str(&out.finish());
    stderr.push_str(&err.finish());
    let code = status.map_or(1, exit_code);
    (
        json!({"stdout": stdout, "stderr": stderr, "exit_code": code}),
        started.elapsed().as_millis(),
    )
}

async fn sleep_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Encodes one stream frame as NDJSON or SSE.
pub(crate) fn frame(sse: bool, v: &Value) -> Bytes {
    let text = v.to_string();
    if sse {
        Bytes::from(format!("data: {text}\n\n"))
    } else {
        Bytes::from(format!("{text}\n"))
    }
}

/// A heartbeat frame; in SSE mode it is preceded by a `: keep-alive` comment line, so an SSE
/// stream carries both comment lines and `data:` lines (the dual-format parser skips comments).
pub(crate) fn heartbeat(sse: bool, v: &Value) -> Bytes {
    if sse {
        Bytes::from(format!(": keep-alive\ndata: {v}\n\n"))
    } else {
        frame(false, v)
    }
}

/// A streamed NDJSON (or SSE) response fed by `rx`.
pub(crate) fn stream_response(sse: bool, rx: mpsc::Receiver<Bytes>) -> Response {
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, std::io::Error>(b), rx))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(
            header::CONTENT_TYPE,
            if sse {
                "text/event-stream"
            } else {
                "application/x-ndjson"
            },
        )
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_default()
}

/// Streams a running command's output as frames into `tx`, with heartbeats and a final exit frame.
/// With `stall_mid`, output is forwarded but no heartbeat or exit frame ever follows.
pub(crate) async fn run_streaming(
    app: Arc<App>,
    mut running: Running,
    tx: mpsc::Sender<Bytes>,
    stall_mid: bool,
) {
    let sse = app.sse;
    let mut guard = KillGuard {
        pgid: running.pgid,
        armed: true,
    };
    let (mut out, mut err) = (Utf8Carry::default(), Utf8Carry::default());
    let mut status: Option<ExitStatus> = None;
    let mut deadline: Option<tokio::time::Instant> = None;
    let mut hb =
        tokio::time::interval_at(tokio::time::Instant::now() + app.heartbeat, app.heartbeat);
    loop {
        let frame_value = tokio::select! {
            () = tx.closed() => return, // client gone: the guard kills the group
            () = app.shutdown.cancelled() => return,
            chunk = running.rx.recv() => match chunk {
                Some(Out::Stdout(b)) => {
                    let s = out.push(&b);
                    if s.is_empty() { continue; }
                    json!({"stdout": s})
                }
                Some(Out::Stderr(b)) => {
                    let s = err.push(&b);
                    if s.is_empty() { continue; }
                    json!({"stderr": s})
                }
                None => break,
            },
            st = running.child.wait(), if status.is_none() => {
                status = st.ok();
                if status.is_none() { break; }
                deadline = Some(tokio::time::Instant::now() + DRAIN_GRACE);
                continue;
            },
            () = sleep_opt(deadline) => break,
            _ = hb.tick(), if !stall_mid => {
                if tx.send(heartbeat(sse, &json!({"hb": true}))).await.is_err() {
                    return;
                }
                continue;
            }
        };
        if tx.send(frame(sse, &frame_value)).await.is_err() {
            return;
        }
    }
    if status.is_none() {
        tokio::select! {
            () = tx.closed() => return,
            st = running.child.wait() => status = st.ok(),
        }
    }
    guard.armed = false;
    for (key, rest) in [("stdout", out.finish()), ("stderr", err.finish())] {
        if !rest.is_empty() && tx.send(frame(sse, &json!({key: rest}))).await.is_err() {
            return;
        }
    }
    if stall_mid {
        tokio::select! {
            () = tx.closed() => {},
            () = app.shutdown.cancelled() => {},
        }
        return;
    }
    let code = status.map_or(1, exit_code);
    let _ = tx.send(frame(sse, &json!({"exit_code": code}))).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn utf8_carry_keeps_split_characters() {
        let mut c = Utf8Carry::default();
        let bytes = "é€".as_bytes();
        assert_eq!(c.push(&bytes[..1]), "");
        assert_eq!(c.push(&bytes[1..3]), "é");
        assert_eq!(c.push(&bytes[3..]), "€");
        assert_eq!(c.push(b"\xffok"), "\u{fffd}ok");
        assert_eq!(c.push(b"\xe2"), "");
        assert_eq!(c.finish(), "\u{fffd}");
    }
}
