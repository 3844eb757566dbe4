//! `POST /command`: a guest command run as a real local process, streamed as execd frames.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use time::OffsetDateTime;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use super::Guest;
use crate::config::OutputFraming;
use crate::util::{epoch_millis, hex_id};

/// How the stream of one command should misbehave (fault injection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamFault {
    /// Behave.
    None,
    /// After `init`, send nothing at all (no output, no ping, no end).
    StallAfterInit,
}

/// What a command asked for.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    /// `command` (shell text) or `argv`.
    pub program: Program,
    pub cwd: Option<String>,
    pub timeout: Option<Duration>,
    pub envs: BTreeMap<String, String>,
    pub background: bool,
}

/// Shell text or a literal argument vector.
#[derive(Debug, Clone)]
pub(crate) enum Program {
    Shell(String),
    Argv(Vec<String>),
}

impl Program {
    /// The `content` reported by the status route.
    fn content(&self) -> String {
        match self {
            Self::Shell(s) => s.clone(),
            Self::Argv(a) => a.join(" "),
        }
    }
}

/// Parses a `/command` body; `Err` is the 400 message.
pub(crate) fn parse_request(body: &[u8]) -> Result<Request, String> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|e| format!("error parsing request, MAYBE invalid body format. {e}"))?;
    let Value::Object(m) = v else {
        return Err("error parsing request, MAYBE invalid body format. expected an object".into());
    };
    let command = match m.get("command") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err("error parsing request: command must be a string".into()),
    };
    let argv = match m.get("argv") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => {
            let mut out = Vec::with_capacity(a.len());
            for x in a {
                let Some(s) = x.as_str() else {
                    return Err("error parsing request: argv must be a list of strings".into());
                };
                if s.contains('\0') {
                    return Err("invalid request, validation error argv contains NUL".into());
                }
                out.push(s.to_owned());
            }
            Some(out)
        }
        Some(_) => return Err("error parsing request: argv must be a list of strings".into()),
    };
    let program = match (command, argv) {
        (Some(_), Some(_)) => {
            return Err(
                "invalid request, validation error command and argv are mutually exclusive".into(),
            );
        }
        (Some(c), None) if !c.trim().is_empty() => Program::Shell(c),
        (None, Some(a)) if a.first().is_some_and(|s| !s.is_empty()) => Program::Argv(a),
        _ => {
            return Err(
                "invalid request, validation error Key: 'RunCommandRequest.Command' Error:Field \
                 validation for 'Command' failed on the 'required' tag"
                    .into(),
            );
        }
    };
    let timeout = match m.get("timeout") {
        None | Some(Value::Null) => None,
        Some(t) => match t.as_i64() {
            Some(0) => None,
            Some(ms) if ms > 0 => Some(Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
            _ => {
                return Err(
                    "invalid request, validation error timeout must be at least 1 millisecond"
                        .into(),
                );
            }
        },
    };
    let cwd = m
        .get("cwd")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_owned);
    let background = m
        .get("background")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut envs = BTreeMap::new();
    if let Some(Value::Object(e)) = m.get("envs") {
        for (k, v) in e {
            if let Some(s) = v.as_str() {
                envs.insert(k.clone(), s.to_owned());
            }
        }
    }
    Ok(Request {
        program,
        cwd,
        timeout,
        envs,
        background,
    })
}

/// The record `GET /command/status/{id}` reports.
#[derive(Debug)]
pub(crate) struct Record {
    pub id: String,
    pub content: String,
    pub started_at: OffsetDateTime,
    pub state: Mutex<RecordState>,
    /// Process group of the command (0 before it started).
    pub pgid: i32,
    /// Output of a background command (bounded), read by `/command/{id}/logs`.
    pub log: Mutex<Vec<u8>>,
}

/// The mutable part of a [`Record`].
#[derive(Debug, Default)]
pub(crate) struct RecordState {
    pub running: bool,
    pub exit_code: Option<i32>,
    pub error: Option<String>,
    pub finished_at: Option<OffsetDateTime>,
}

impl Record {
    /// The status body.
    pub(crate) fn to_json(&self) -> Value {
        let st = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut v = json!({
            "id": self.id,
            "content": self.content,
            "running": st.running,
            "exit_code": st.exit_code,
            "started_at": crate::util::rfc3339(self.started_at),
            "finished_at": st.finished_at.map(crate::util::rfc3339),
        });
        if let (Some(e), Some(o)) = (&st.error, v.as_object_mut()) {
            o.insert("error".into(), json!(e));
        }
        v
    }

    fn finish(&self, code: i32, error: Option<String>) {
        let mut st = self
            .state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        st.running = false;
        st.exit_code = Some(code);
        st.error = error;
        st.finished_at = Some(OffsetDateTime::now_utc());
    }
}

/// Largest background log kept per command.
const MAX_BACKGROUND_LOG: usize = 4 * 1024 * 1024;
/// Largest line buffered while waiting for its terminator (then it is sent as is).
const MAX_LINE: usize = 64 * 1024 * 1024;
/// How long output is still read after the command's leader exits.
const DRAIN_GRACE: Duration = Duration::from_millis(200);

/// Builds one frame: the JSON object followed by `\n\n`, without any `data:` prefix.
fn frame(v: &Value) -> Bytes {
    let mut s = v.to_string();
    s.push_str("\n\n");
    Bytes::from(s)
}

fn event(kind: &str) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    m.insert("type".into(), json!(kind));
    m.insert("timestamp".into(), json!(epoch_millis()));
    m
}

/// Output of a running command.
enum Out {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
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

/// Splits output the way execd's log tailer does: a frame per line without its terminator
/// (`\n`, `\r` or `\r\n`), a blank line as `"\n"`, the unterminated rest at the end.
#[derive(Debug, Default)]
pub(crate) struct LineSplitter {
    buf: Vec<u8>,
    last_cr: bool,
}

impl LineSplitter {
    /// Feeds bytes; returns the complete lines.
    pub(crate) fn push(&mut self, data: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        for &b in data {
            if b == b'\n' || b == b'\r' {
                if !self.buf.is_empty() {
                    out.push(String::from_utf8_lossy(&self.buf).into_owned());
                    self.buf.clear();
                } else if !(b == b'\n' && self.last_cr) {
                    out.push("\n".to_owned());
                }
                self.last_cr = b == b'\r';
                continue;
            }
            self.last_cr = false;
            self.buf.push(b);
            if self.buf.len() >= MAX_LINE {
                out.push(String::from_utf8_lossy(&self.buf).into_owned());
                self.buf.clear();
            }
        }
        out
    }

    /// The unterminated rest, if any.
    pub(crate) fn finish(&mut self) -> Option<String> {
        if self.buf.is_empty() {
            return None;
        }
        let s = String::from_utf8_lossy(&self.buf).into_owned();
        self.buf.clear();
        Some(s)
    }
}

/// Incremental lossy UTF-8 decoding that keeps a split character for the next chunk.
#[derive(Debug, Default)]
pub(crate) struct Utf8Carry {
    pending: Vec<u8>,
}

impl Utf8Carry {
    /// Feeds bytes; returns the text decoded so far.
    pub(crate) fn push(&mut self, data: &[u8]) -> String {
        self.pending.extend_from_slice(data);
        let mut keep = 0;
        for back in 1..=3.min(self.pending.len()) {
            let c = self.pending[self.pending.len() - back];
            if c & 0b1100_0000 == 0b1000_0000 {
                continue;
            }
            let need = match c {
                0xF0.. => 4,
                0xE0.. => 3,
                0xC0.. => 2,
                _ => 1,
            };
            keep = if need > back { back } else { 0 };
            break;
        }
        let cut = self.pending.len() - keep;
        let text = String::from_utf8_lossy(&self.pending[..cut]).into_owned();
        self.pending.drain(..cut);
        text
    }

    /// The undecodable rest.
    pub(crate) fn finish(&mut self) -> String {
        let t = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        t
    }
}

/// Per-stream decoding in the configured framing.
enum Framer {
    Lines(LineSplitter),
    Chunks(Utf8Carry),
}

impl Framer {
    fn new(f: OutputFraming) -> Self {
        match f {
            OutputFraming::Lines => Self::Lines(LineSplitter::default()),
            OutputFraming::Chunks => Self::Chunks(Utf8Carry::default()),
        }
    }

    fn push(&mut self, data: &[u8]) -> Vec<String> {
        match self {
            Self::Lines(l) => l.push(data),
            Self::Chunks(c) => {
                let t = c.push(data);
                if t.is_empty() { Vec::new() } else { vec![t] }
            }
        }
    }

    fn finish(&mut self) -> Option<String> {
        match self {
            Self::Lines(l) => l.finish(),
            Self::Chunks(c) => Some(c.finish()).filter(|t| !t.is_empty()),
        }
    }
}

/// How the process ended, as execd reports it.
fn outcome(st: Option<ExitStatus>) -> (i32, String) {
    use std::os::unix::process::ExitStatusExt;
    match st {
        Some(st) if st.code().is_some() => {
            let c = st.code().unwrap_or(1);
            (c, format!("exit status {c}"))
        }
        // Go's ExitCode() is -1 for a process ended by a signal (timeout, interrupt, kill).
        Some(st) => {
            let sig = st
                .signal()
                .and_then(|s| Signal::try_from(s).ok())
                .map_or_else(|| "unknown".to_owned(), |s| signal_text(s).to_owned());
            (-1, format!("signal: {sig}"))
        }
        None => (1, "wait failed".to_owned()),
    }
}

fn signal_text(s: Signal) -> &'static str {
    match s {
        Signal::SIGKILL => "killed",
        Signal::SIGTERM => "terminated",
        Signal::SIGINT => "interrupt",
        Signal::SIGSEGV => "segmentation fault",
        Signal::SIGABRT => "aborted",
        Signal::SIGHUP => "hangup",
        Signal::SIGPIPE => "broken pipe",
        _ => s.as_str(),
    }
}

/// Kills a process group when dropped unless disarmed (the client went away mid-command).
struct KillGuard {
    guest: Arc<Guest>,
    pgid: i32,
    armed: bool,
}

impl Drop for KillGuard {
    fn drop(&mut self) {
        if self.armed {
            crate::execd::signal_group(self.pgid, Signal::SIGCONT);
            crate::execd::signal_group(self.pgid, Signal::SIGKILL);
        }
        self.guest.forget_group(self.pgid);
    }
}

/// Spawns the command in `guest`; `Err` is why it could not start.
fn spawn(guest: &Guest, req: &Request) -> Result<(Child, i32), String> {
    let env: Vec<(OsString, OsString)> = guest.command_env(&req.envs);
    let cwd = match &req.cwd {
        Some(c) => guest.host_path_text(c),
        None => guest.default_cwd(),
    };
    let mut command = match &req.program {
        Program::Shell(text) => {
            let shell = if std::path::Path::new("/bin/bash").exists() {
                "/bin/bash"
            } else {
                "/bin/sh"
            };
            let mut c = Command::new(shell);
            c.arg("-c").arg(guest.map_text(text));
            c
        }
        Program::Argv(argv) => {
            let program = guest.resolve_program(&argv[0], &env, &cwd);
            let mut c = Command::new(program);
            c.args(argv[1..].iter().map(|a| guest.map_text(a)));
            c
        }
    };
    command
        .current_dir(&cwd)
        .env_clear()
        .envs(env)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(false);
    let child = command.spawn().map_err(|e| match &req.program {
        Program::Argv(a) if e.kind() == std::io::ErrorKind::NotFound && cwd.is_dir() => {
            format!("exec: {:?}: executable file not found in $PATH", a[0])
        }
        _ if !cwd.is_dir() => format!(
            "chdir {}: no such file or directory",
            req.cwd.as_deref().unwrap_or("/workspace")
        ),
        _ => format!("fork/exec: {e}"),
    })?;
    let pgid = child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(0);
    guest.remember_group(pgid);
    Ok((child, pgid))
}

/// Runs a foreground command, sending its frames into `tx` until it ends, the client goes
/// away (`tx` closed: the process group is killed) or the guest is destroyed.
pub(crate) async fn run_foreground(
    guest: Arc<Guest>,
    req: Request,
    tx: mpsc::Sender<Bytes>,
    fault: StreamFault,
) {
    let started = Instant::now();
    let id = hex_id(32);
    let spawned = spawn(&guest, &req);
    let record = Arc::new(Record {
        id: id.clone(),
        content: req.program.content(),
        started_at: OffsetDateTime::now_utc(),
        state: Mutex::new(RecordState {
            running: spawned.is_ok(),
            ..RecordState::default()
        }),
        pgid: spawned.as_ref().map_or(0, |(_, p)| *p),
        log: Mutex::new(Vec::new()),
    });
    guest.remember_command(record.clone());
    let mut init = event("init");
    init.insert("text".into(), json!(id));
    if tx.send(frame(&Value::Object(init))).await.is_err() {
        if let Ok((_, pgid)) = &spawned {
            crate::execd::signal_group(*pgid, Signal::SIGKILL);
        }
        return;
    }
    let (mut child, pgid) = match spawned {
        Ok(x) => x,
        Err(msg) => {
            record.finish(1, Some(msg.clone()));
            let mut e = event("error");
            e.insert(
                "error".into(),
                json!({"ename": "CommandExecError", "evalue": msg, "traceback": [msg]}),
            );
            let _ = tx.send(frame(&Value::Object(e))).await;
            return;
        }
    };
    let mut guard = KillGuard {
        guest: guest.clone(),
        pgid,
        armed: true,
    };
    if fault == StreamFault::StallAfterInit {
        tokio::select! {
            () = tx.closed() => {},
            () = guest.gone.cancelled() => {},
        }
        return;
    }
    let framing = guest.framing();
    let (otx, mut orx) = mpsc::channel::<Out>(64);
    if let Some(o) = child.stdout.take() {
        tokio::spawn(pump(o, otx.clone(), Out::Stdout));
    }
    if let Some(e) = child.stderr.take() {
        tokio::spawn(pump(e, otx, Out::Stderr));
    }
    let (mut fo, mut fe) = (Framer::new(framing), Framer::new(framing));
    let mut eid: i64 = 0;
    let ping_every = guest.ping_interval();
    // execd pings at once after init, then every period.
    let mut first = event("ping");
    first.insert("text".into(), json!("pong"));
    if tx.send(frame(&Value::Object(first))).await.is_err() {
        return;
    }
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + ping_every, ping_every);
    let deadline = req.timeout.map(|t| tokio::time::Instant::now() + t);
    let mut status: Option<ExitStatus> = None;
    let mut pipes_closed = false;
    let mut drain_until: Option<tokio::time::Instant> = None;
    let mut timed_out = false;
    loop {
        // A frozen (paused) guest sends nothing at all, pings included.
        if guest.is_frozen() {
            tokio::select! {
                () = tx.closed() => return,
                () = guest.gone.cancelled() => return,
                () = guest.wait_thawed() => { ping.reset(); continue; }
            }
        }
        let mut frames: Vec<Value> = Vec::new();
        tokio::select! {
            () = tx.closed() => return,
            () = guest.gone.cancelled() => return,
            () = guest.wait_frozen() => continue,
            chunk = orx.recv(), if !pipes_closed => match chunk {
                Some(Out::Stdout(b)) => {
                    for t in fo.push(&b) { eid += 1; frames.push(output("stdout", &t, eid)); }
                }
                Some(Out::Stderr(b)) => {
                    for t in fe.push(&b) { eid += 1; frames.push(output("stderr", &t, eid)); }
                }
                None => {
                    pipes_closed = true;
                    if status.is_some() { break; }
                }
            },
            st = child.wait(), if status.is_none() => {
                status = st.ok();
                if status.is_none() || pipes_closed { break; }
                // Children that outlive the leader may hold the pipes: read a little longer.
                drain_until = Some(tokio::time::Instant::now() + DRAIN_GRACE);
            },
            () = sleep_opt(drain_until) => break,
            () = sleep_opt(deadline), if status.is_none() && !timed_out => {
                timed_out = true;
                crate::execd::signal_group(pgid, Signal::SIGCONT);
                crate::execd::signal_group(pgid, Signal::SIGKILL);
            },
            _ = ping.tick() => {
                let mut p = event("ping");
                p.insert("text".into(), json!("pong"));
                frames.push(Value::Object(p));
            },
        }
        for f in frames {
            if tx.send(frame(&f)).await.is_err() {
                return;
            }
        }
    }
    guard.armed = false;
    drop(guard);
    for (kind, rest) in [("stdout", fo.finish()), ("stderr", fe.finish())] {
        if let Some(t) = rest {
            eid += 1;
            if tx.send(frame(&output(kind, &t, eid))).await.is_err() {
                return;
            }
        }
    }
    let (code, text) = outcome(status);
    if code == 0 {
        record.finish(0, None);
        let mut c = event("execution_complete");
        let ms = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
        if ms > 0 {
            c.insert("execution_time".into(), json!(ms));
        }
        let _ = tx.send(frame(&Value::Object(c))).await;
    } else {
        record.finish(code, Some(text.clone()));
        let mut e = event("error");
        e.insert(
            "error".into(),
            json!({"ename": "CommandExecError", "evalue": code.to_string(), "traceback": [text]}),
        );
        let _ = tx.send(frame(&Value::Object(e))).await;
    }
}

fn output(kind: &str, text: &str, eid: i64) -> Value {
    let mut m = event(kind);
    m.insert("text".into(), json!(text));
    m.insert("eid".into(), json!(eid));
    Value::Object(m)
}

async fn sleep_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Starts a background command: `init` and `execution_complete` are sent at once, the output
/// goes to the command's log, and the process lives on until it ends, its timeout fires, it is
/// interrupted or the guest is destroyed.
pub(crate) async fn run_background(guest: Arc<Guest>, req: Request, tx: mpsc::Sender<Bytes>) {
    let started = Instant::now();
    let id = hex_id(32);
    let spawned = spawn(&guest, &req);
    let record = Arc::new(Record {
        id: id.clone(),
        content: req.program.content(),
        started_at: OffsetDateTime::now_utc(),
        state: Mutex::new(RecordState {
            running: spawned.is_ok(),
            ..RecordState::default()
        }),
        pgid: spawned.as_ref().map_or(0, |(_, p)| *p),
        log: Mutex::new(Vec::new()),
    });
    guest.remember_command(record.clone());
    let mut init = event("init");
    init.insert("text".into(), json!(id));
    let _ = tx.send(frame(&Value::Object(init))).await;
    let (mut child, pgid) = match spawned {
        Ok(x) => x,
        Err(msg) => {
            record.finish(255, Some(msg));
            return;
        }
    };
    let mut c = event("execution_complete");
    let ms = i64::try_from(started.elapsed().as_millis()).unwrap_or(0);
    if ms > 0 {
        c.insert("execution_time".into(), json!(ms));
    }
    let _ = tx.send(frame(&Value::Object(c))).await;
    drop(tx);
    let (otx, mut orx) = mpsc::channel::<Out>(64);
    if let Some(o) = child.stdout.take() {
        tokio::spawn(pump(o, otx.clone(), Out::Stdout));
    }
    if let Some(e) = child.stderr.take() {
        tokio::spawn(pump(e, otx, Out::Stderr));
    }
    let deadline = req.timeout.map(|t| tokio::time::Instant::now() + t);
    let mut status = None;
    loop {
        tokio::select! {
            () = guest.gone.cancelled() => {
                crate::execd::signal_group(pgid, Signal::SIGKILL);
                break;
            }
            chunk = orx.recv() => match chunk {
                Some(Out::Stdout(b) | Out::Stderr(b)) => {
                    let mut log = record.log.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    let room = MAX_BACKGROUND_LOG.saturating_sub(log.len());
                    log.extend_from_slice(&b[..b.len().min(room)]);
                }
                None => if status.is_some() { break },
            },
            st = child.wait(), if status.is_none() => {
                status = st.ok();
                if status.is_none() { break; }
            }
            () = sleep_opt(deadline), if status.is_none() => {
                crate::execd::signal_group(pgid, Signal::SIGKILL);
            }
        }
    }
    if status.is_none() {
        status = child.wait().await.ok();
    }
    guest.forget_group(pgid);
    let (code, text) = outcome(status);
    record.finish(code, (code != 0).then_some(text));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_split_like_execds_tailer() {
        let mut s = LineSplitter::default();
        assert_eq!(s.push(b"a\nb"), vec!["a"]);
        assert_eq!(s.push(b"c\r\n\nd"), vec!["bc", "\n"]);
        assert_eq!(s.push(b"\r\r\n"), vec!["d", "\n"]);
        assert_eq!(s.finish(), None);
        assert_eq!(s.push(b"tail"), Vec::<String>::new());
        assert_eq!(s.finish().as_deref(), Some("tail"));
    }

    #[test]
    fn requests_need_exactly_one_of_command_and_argv() {
        assert!(parse_request(br#"{"command":"echo hi"}"#).is_ok());
        assert!(parse_request(br#"{"argv":["echo","hi"]}"#).is_ok());
        assert!(parse_request(br#"{"command":"a","argv":["b"]}"#).is_err());
        assert!(parse_request(br"{}").is_err());
        assert!(parse_request(br#"{"command":"  "}"#).is_err());
        assert!(parse_request(br#"{"argv":[""]}"#).is_err());
        assert!(parse_request(br#"{"command":"x","timeout":-5}"#).is_err());
        assert!(parse_request(b"not json").is_err());
        let r = parse_request(br#"{"command":"x","timeout":1500,"envs":{"A":"1"}}"#).unwrap();
        assert_eq!(r.timeout, Some(Duration::from_millis(1500)));
        assert_eq!(r.envs.get("A").map(String::as_str), Some("1"));
    }

    #[test]
    fn utf8_carry_keeps_split_characters() {
        let mut c = Utf8Carry::default();
        let b = "é€".as_bytes();
        assert_eq!(c.push(&b[..1]), "");
        assert_eq!(c.push(&b[1..3]), "é");
        assert_eq!(c.push(&b[3..]), "€");
    }
}
