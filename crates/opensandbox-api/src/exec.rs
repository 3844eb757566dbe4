//! execd through the server's proxy: `/ping`, streamed commands, interrupt and status.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::stream::{self, BoxStream, Stream, StreamExt};
use reqwest::Method;
use reqwest::header::{self, HeaderValue};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio::time::Instant;

use crate::client::Client;
use crate::error::{Error, ErrorKind, Result, Route};
use crate::frames::{FrameDecoder, FrameError, FrameLimits};
use crate::scrub::{MAX_SNIPPET_CHARS, Scrubber};
use crate::transport::{Call, Replay};
use crate::wire::or_default;

/// The port execd listens on inside a sandbox.
pub const EXECD_PORT: u16 = 44772;
/// Default idle period of a command stream (30 s; execd pings every 3 s).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// execd of one sandbox, reached through the server's proxy
/// (`/v1/sandboxes/{id}/proxy/44772/...`). Cheap to clone.
///
/// The proxy does not check the API key in 1.1.1 (anyone who reaches the server's port can
/// drive any sandbox's execd: keep the server on a private network); the key is sent anyway,
/// and the proxy strips it before it reaches the sandbox.
#[derive(Clone, Debug)]
pub struct Execd {
    client: Client,
    sandbox_id: String,
}

impl Client {
    /// execd of sandbox `sandbox_id`, through the server's proxy. Nothing is sent yet.
    pub fn execd(&self, sandbox_id: &str) -> Execd {
        Execd {
            client: self.clone(),
            sandbox_id: sandbox_id.to_owned(),
        }
    }
}

/// What a command runs: a shell line (`bash -c`) or an argument vector (no shell).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Program {
    Shell(String),
    Argv(Vec<String>),
}

/// `POST /command`: a command to run. No stdin: execd has none.
#[derive(Debug, Clone)]
pub struct RunCommand {
    program: Program,
    /// The working directory.
    pub cwd: Option<String>,
    /// execd kills the command (its process group) after this long; sent in milliseconds.
    pub timeout: Option<Duration>,
    /// Environment variables of this command. For a value that is a secret use
    /// [`RunCommand::secret_env`].
    pub envs: BTreeMap<String, String>,
    /// Environment values that are secrets: never in `Debug`, scrubbed from errors and frames'
    /// error quotes.
    secret_envs: BTreeMap<String, SecretString>,
    /// Run detached: the stream ends after `init`; poll [`Execd::command_status`].
    pub background: bool,
    /// Run as this user id (and group id).
    pub uid: Option<u32>,
    /// Run with this group id (needs `uid`).
    pub gid: Option<u32>,
}

impl RunCommand {
    fn with(program: Program) -> Self {
        RunCommand {
            program,
            cwd: None,
            timeout: None,
            envs: BTreeMap::new(),
            secret_envs: BTreeMap::new(),
            background: false,
            uid: None,
            gid: None,
        }
    }

    /// A shell line, run with `bash -c`.
    pub fn shell(command: impl Into<String>) -> Self {
        Self::with(Program::Shell(command.into()))
    }

    /// An argument vector run without a shell (`argv[0]` looked up in `PATH`; new in 1.1.1).
    pub fn argv<I: IntoIterator<Item = S>, S: Into<String>>(argv: I) -> Self {
        Self::with(Program::Argv(argv.into_iter().map(Into::into).collect()))
    }

    /// The working directory.
    #[must_use]
    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// The server-side timeout.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// One environment variable.
    #[must_use]
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.envs.insert(name.into(), value.into());
        self
    }

    /// One environment variable whose value is a secret: sent like [`RunCommand::env`], never
    /// shown in `Debug`, and removed from this command's errors. (What the command itself
    /// prints is its output, not scrubbed.)
    #[must_use]
    pub fn secret_env(mut self, name: impl Into<String>, value: impl Into<SecretString>) -> Self {
        self.secret_envs.insert(name.into(), value.into());
        self
    }

    /// Run detached.
    #[must_use]
    pub fn background(mut self, background: bool) -> Self {
        self.background = background;
        self
    }

    fn to_wire(&self) -> Result<Value> {
        let mut body = Map::new();
        match &self.program {
            Program::Shell(line) if line.trim().is_empty() => {
                return Err(Error::InvalidArgument("the command is empty".into()));
            }
            Program::Shell(line) => {
                body.insert("command".into(), Value::from(line.as_str()));
            }
            Program::Argv(argv) if argv.first().is_none_or(String::is_empty) => {
                return Err(Error::InvalidArgument("argv[0] is empty".into()));
            }
            Program::Argv(argv) => {
                body.insert("argv".into(), Value::from(argv.clone()));
            }
        }
        if let Some(cwd) = &self.cwd {
            body.insert("cwd".into(), Value::from(cwd.as_str()));
        }
        if let Some(t) = self.timeout {
            let ms = u64::try_from(t.as_millis()).unwrap_or(u64::MAX);
            if ms == 0 {
                return Err(Error::InvalidArgument(
                    "a command timeout must be at least 1 ms".into(),
                ));
            }
            body.insert("timeout".into(), Value::from(ms));
        }
        if !self.envs.is_empty() || !self.secret_envs.is_empty() {
            let mut envs = self.envs.clone();
            for (name, value) in &self.secret_envs {
                envs.insert(name.clone(), value.expose_secret().to_owned());
            }
            body.insert("envs".into(), serde_json::json!(envs));
        }
        body.insert("background".into(), Value::from(self.background));
        if self.gid.is_some() && self.uid.is_none() {
            return Err(Error::InvalidArgument("gid needs uid".into()));
        }
        if let Some(uid) = self.uid {
            body.insert("uid".into(), Value::from(uid));
        }
        if let Some(gid) = self.gid {
            body.insert("gid".into(), Value::from(gid));
        }
        Ok(Value::Object(body))
    }
}

/// How a command stream is watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamOptions {
    /// The stream fails with [`Error::Idle`] when no frame (a ping included) arrives for this
    /// long, counted from the request until the answer's headers and then between frames
    /// (default [`DEFAULT_IDLE_TIMEOUT`]). execd pings every 3 s while a command runs; a
    /// paused sandbox sends nothing, so this is how it shows.
    pub idle_timeout: Duration,
    /// The stream fails with [`Error::Timeout`] once this long has passed since the request,
    /// however lively it is (default: none).
    pub deadline: Option<Duration>,
    /// Frame and line bounds.
    pub limits: FrameLimits,
}

impl Default for StreamOptions {
    fn default() -> Self {
        StreamOptions {
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            deadline: None,
            limits: FrameLimits::default(),
        }
    }
}

/// An `error` event: `ename` and `evalue` (for a command, the exit code as text).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExecError {
    /// `ename` (`CommandExecError`).
    pub name: String,
    /// `evalue`.
    pub value: String,
    /// `traceback` lines.
    pub traceback: Vec<String>,
}

/// One event of a command stream.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ExecEvent {
    /// `init`: the command started; its id (for [`Execd::interrupt`] and
    /// [`Execd::command_status`]).
    Init {
        /// The command id.
        command_id: String,
    },
    /// `stdout`: a piece of standard output (execd sends it line by line).
    Stdout {
        /// The text.
        text: String,
        /// Unix milliseconds, when sent.
        timestamp: Option<i64>,
    },
    /// `stderr`: a piece of standard error.
    Stderr {
        /// The text.
        text: String,
        /// Unix milliseconds, when sent.
        timestamp: Option<i64>,
    },
    /// `error`: the command failed (for a command that ran, `value` is its exit code).
    Error(ExecError),
    /// `execution_complete`: the command finished.
    Complete {
        /// Its run time in milliseconds.
        execution_time_ms: Option<u64>,
    },
    /// `ping`: execd's keep-alive.
    Ping,
    /// Another type (`status`, `result`, `execution_count`, or one added later), as sent.
    Other {
        /// The `type`.
        kind: String,
        /// The whole frame.
        frame: Map<String, Value>,
    },
}

/// A frame's field as text: a string as it is, a number or boolean written out, anything
/// else empty.
fn text_of(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::Bool(b)) => b.to_string(),
        _ => String::new(),
    }
}

impl ExecEvent {
    /// The event a decoded frame holds. Never fails: a frame of an unknown type is
    /// [`ExecEvent::Other`], and fields of an unexpected type read as empty.
    pub fn from_frame(frame: Map<String, Value>) -> ExecEvent {
        let kind = text_of(frame.get("type"));
        let text = || text_of(frame.get("text"));
        let timestamp = frame.get("timestamp").and_then(Value::as_i64);
        match kind.as_str() {
            "init" => ExecEvent::Init { command_id: text() },
            "stdout" => ExecEvent::Stdout {
                text: text(),
                timestamp,
            },
            "stderr" => ExecEvent::Stderr {
                text: text(),
                timestamp,
            },
            "error" => {
                let err = frame.get("error");
                let field = |name| text_of(err.and_then(|e| e.get(name)));
                let traceback = match err.and_then(|e| e.get("traceback")) {
                    Some(Value::Array(lines)) => lines.iter().map(|l| text_of(Some(l))).collect(),
                    Some(Value::Null) | None => Vec::new(),
                    Some(other) => vec![text_of(Some(other))],
                };
                ExecEvent::Error(ExecError {
                    name: field("ename"),
                    value: field("evalue"),
                    traceback,
                })
            }
            "execution_complete" => ExecEvent::Complete {
                execution_time_ms: frame.get("execution_time").and_then(Value::as_u64),
            },
            "ping" => ExecEvent::Ping,
            _ => ExecEvent::Other { kind, frame },
        }
    }
}

/// A command's exit status as the official SDK derives it from the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// The exit code.
    Code(i32),
    /// Not known: no `error` or `execution_complete` arrived (the stream broke, or the
    /// command runs in the background), or the `error` value is not a number (the command
    /// did not start).
    Unknown,
}

impl ExitStatus {
    /// Whether the command is known to have exited with 0.
    pub fn success(self) -> bool {
        self == ExitStatus::Code(0)
    }
}

/// Folds events into an [`ExitStatus`]: after an `error` event, the integer of its `evalue`
/// (else unknown, even if `execution_complete` follows); else 0 once `execution_complete`
/// arrived; else unknown.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExitTracker {
    error_value: Option<String>,
    complete: bool,
}

impl ExitTracker {
    /// Takes one event into account.
    pub fn observe(&mut self, event: &ExecEvent) {
        match event {
            ExecEvent::Error(e) => self.error_value = Some(e.value.clone()),
            ExecEvent::Complete { .. } => self.complete = true,
            _ => {}
        }
    }

    /// The status so far.
    pub fn status(&self) -> ExitStatus {
        match &self.error_value {
            Some(v) => parse_exit_code(v).map_or(ExitStatus::Unknown, ExitStatus::Code),
            None if self.complete => ExitStatus::Code(0),
            None => ExitStatus::Unknown,
        }
    }
}

/// Python's `int()` of an exit code: surrounding whitespace and a sign allowed.
fn parse_exit_code(text: &str) -> Option<i32> {
    let t = text.trim();
    t.strip_prefix('+').unwrap_or(t).parse().ok()
}

/// A running command's events. Implements `Stream<Item = Result<ExecEvent>>`; ends after
/// the last frame or the first error. Dropping it closes the connection, and execd kills the
/// command's process group when its client goes away.
pub struct CommandStream {
    events: BoxStream<'static, Result<ExecEvent>>,
    exit: ExitTracker,
    command_id: Option<String>,
    execution_time_ms: Option<u64>,
}

impl std::fmt::Debug for CommandStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandStream")
            .field("command_id", &self.command_id)
            .field("exit", &self.exit.status())
            .finish_non_exhaustive()
    }
}

impl CommandStream {
    /// The command id, once `init` arrived.
    pub fn command_id(&self) -> Option<&str> {
        self.command_id.as_deref()
    }

    /// The exit status from the events seen so far.
    pub fn exit_status(&self) -> ExitStatus {
        self.exit.status()
    }

    /// Reads the stream to its end, keeping at most `max_output` bytes of stdout and stderr
    /// together (what comes after is dropped, and `truncated` says so; the stream is still read
    /// to its end so the exit status is known).
    pub async fn collect_output(mut self, max_output: usize) -> Result<CommandOutput> {
        let mut out = CommandOutput::default();
        while let Some(event) = self.next().await {
            match event? {
                ExecEvent::Stdout { text, .. } => out.keep(&text, max_output, true),
                ExecEvent::Stderr { text, .. } => out.keep(&text, max_output, false),
                ExecEvent::Error(e) => out.error = Some(e),
                _ => {}
            }
        }
        out.exit = self.exit.status();
        out.command_id = self.command_id;
        out.execution_time_ms = self.execution_time_ms;
        Ok(out)
    }
}

impl Stream for CommandStream {
    type Item = Result<ExecEvent>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let polled = self.events.poll_next_unpin(cx);
        if let Poll::Ready(Some(Ok(event))) = &polled {
            let this = &mut *self;
            this.exit.observe(event);
            match event {
                ExecEvent::Init { command_id } => this.command_id = Some(command_id.clone()),
                ExecEvent::Complete { execution_time_ms } => {
                    this.execution_time_ms = *execution_time_ms;
                }
                _ => {}
            }
        }
        polled
    }
}

/// What [`CommandStream::collect_output`] gathered.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct CommandOutput {
    /// Standard output kept. execd sends a frame per line without its line end; frames are
    /// joined with `\n` where neither side carries a line break, as the official SDK joins
    /// them (so `echo a; echo b` collects as `"a\nb"`; a frame with its own line ends is kept
    /// as sent).
    pub stdout: String,
    /// Standard error kept, joined the same way.
    pub stderr: String,
    /// Whether output past the cap was dropped.
    pub truncated: bool,
    /// The exit status.
    pub exit: ExitStatus,
    /// The last `error` event.
    pub error: Option<ExecError>,
    /// The command id.
    pub command_id: Option<String>,
    /// The run time execd reported.
    pub execution_time_ms: Option<u64>,
}

impl Default for CommandOutput {
    fn default() -> Self {
        CommandOutput {
            stdout: String::new(),
            stderr: String::new(),
            truncated: false,
            exit: ExitStatus::Unknown,
            error: None,
            command_id: None,
            execution_time_ms: None,
        }
    }
}

impl CommandOutput {
    fn keep(&mut self, text: &str, cap: usize, stdout: bool) {
        let line_break = |c: char| c == '\n' || c == '\r';
        let sink = if stdout { &self.stdout } else { &self.stderr };
        // execd sends a frame per line without its line end: two frames that do not carry a
        // line break between them are two lines (the SDK joins them the same way).
        let joined = !sink.is_empty()
            && !sink.ends_with(line_break)
            && !text.is_empty()
            && !text.starts_with(line_break);
        let owned;
        let text = if joined {
            owned = format!("\n{text}");
            owned.as_str()
        } else {
            text
        };
        let room = cap.saturating_sub(self.stdout.len() + self.stderr.len());
        let mut cut = text.len().min(room);
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        if cut < text.len() {
            self.truncated = true;
        }
        let sink = if stdout {
            &mut self.stdout
        } else {
            &mut self.stderr
        };
        sink.push_str(&text[..cut]);
    }
}

/// `GET /command/status/{id}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct CommandStatus {
    /// The command id.
    #[serde(deserialize_with = "or_default")]
    pub id: String,
    /// The command line.
    #[serde(deserialize_with = "or_default")]
    pub content: String,
    /// Whether it still runs.
    #[serde(deserialize_with = "or_default")]
    pub running: bool,
    /// Its exit code, once finished.
    pub exit_code: Option<i64>,
    /// An error message.
    pub error: Option<String>,
    /// When it started (RFC 3339).
    pub started_at: Option<String>,
    /// When it finished (RFC 3339).
    pub finished_at: Option<String>,
    /// Fields this client does not know.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// The state of a command stream's reader.
struct Reader {
    /// The body's chunks (each already bounded by the idle period, so a frame that trickles
    /// in byte by byte is still cut off by the frame clock below).
    body: BoxStream<'static, Result<Bytes>>,
    decoder: FrameDecoder,
    idle: Duration,
    last_frame: Instant,
    /// When the stream must be over, and the deadline as configured.
    deadline: Option<(Instant, Duration)>,
    route: Route,
    scrubber: Scrubber,
    ended: bool,
}

impl Reader {
    fn frame_error(&self, e: FrameError) -> Error {
        match e {
            FrameError::LineTooLong { limit } => Error::TooLarge {
                what: format!("a line of the command stream of {}", self.route),
                limit: limit as u64,
            },
            FrameError::FrameTooLarge { limit } => Error::TooLarge {
                what: format!("a frame of the command stream of {}", self.route),
                limit: limit as u64,
            },
            FrameError::NotJson { reason, start } => Error::protocol(format!(
                "{}: a command stream frame is not JSON ({}); it starts with \"{}\"",
                self.route,
                self.scrubber.snippet(&reason, MAX_SNIPPET_CHARS, false),
                self.scrubber.snippet(&start, 200, true)
            )),
            FrameError::NotObject => Error::protocol(format!(
                "{}: a command stream frame is not a JSON object",
                self.route
            )),
        }
    }

    /// The next event, or `None` at the end of the stream.
    async fn next_event(&mut self) -> Option<Result<ExecEvent>> {
        loop {
            match self.decoder.next_frame() {
                Ok(Some(frame)) => {
                    self.last_frame = Instant::now();
                    return Some(Ok(ExecEvent::from_frame(frame)));
                }
                Ok(None) if self.ended => return None,
                Ok(None) => {}
                Err(e) => return Some(Err(self.frame_error(e))),
            }
            let idle_at = self.last_frame + self.idle;
            let wake = self.deadline.map_or(idle_at, |(at, _)| at.min(idle_at));
            match tokio::time::timeout_at(wake, self.body.next()).await {
                Err(_) if self.deadline.is_some_and(|(at, _)| at <= idle_at) => {
                    return Some(Err(Error::Timeout {
                        route: self.route.clone(),
                        after: self.deadline.map(|(_, d)| d).unwrap_or_default(),
                    }));
                }
                Err(_) => {
                    return Some(Err(Error::Idle {
                        route: self.route.clone(),
                        after: self.idle,
                    }));
                }
                Ok(Some(Ok(chunk))) => self.decoder.push(&chunk),
                Ok(Some(Err(e))) => return Some(Err(e)),
                Ok(None) => {
                    self.ended = true;
                    self.decoder.finish();
                }
            }
        }
    }
}

impl Execd {
    /// The sandbox id.
    pub fn sandbox_id(&self) -> &str {
        &self.sandbox_id
    }

    /// A call to execd's `tail` path, through the proxy.
    pub(crate) fn call(&self, method: Method, tail: &[&str], replay: Replay) -> Result<Call> {
        let port = EXECD_PORT.to_string();
        let mut segments = vec![
            "sandboxes",
            self.sandbox_id.as_str(),
            "proxy",
            port.as_str(),
        ];
        segments.extend_from_slice(tail);
        Call::new(method, &segments, replay)
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// `GET /ping`: execd answers. Repeated on transport errors and 5xx like other reads.
    pub async fn ping(&self) -> Result<()> {
        let call = self.call(Method::GET, &["ping"], Replay::Safe)?;
        self.client
            .transport()
            .send(&call, 64 * 1024)
            .await
            .map(|_| ())
    }

    /// Polls `/ping` every `interval` until execd answers: `Running` does not mean execd is
    /// up. Stops at once on 401, 403 or 404 (a wrong key, a sandbox that is gone); past
    /// `budget` it is an [`Error::WaitExpired`] carrying the last error.
    pub async fn wait_until_ready(&self, budget: Duration, interval: Duration) -> Result<()> {
        let deadline = Instant::now() + budget;
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let mut call = self.call(Method::GET, &["ping"], Replay::Never)?;
            call.timeout = Some(remaining.clamp(Duration::from_millis(1), Duration::from_secs(5)));
            let err = match self.client.transport().send(&call, 64 * 1024).await {
                Ok(_) => return Ok(()),
                Err(e) if matches!(e.kind(), ErrorKind::Auth | ErrorKind::NotFound) => {
                    return Err(e);
                }
                Err(e) => e,
            };
            if Instant::now() + interval >= deadline {
                return Err(Error::WaitExpired {
                    what: format!("execd of sandbox {} answering /ping", self.sandbox_id),
                    after: budget,
                    last: Some(Box::new(err)),
                });
            }
            tokio::time::sleep(interval).await;
        }
    }

    /// `POST /command`: runs a command and streams its events. Sent once, never repeated.
    /// The answer's headers must arrive within the idle period (a paused sandbox never
    /// answers), and then a frame within each idle period (see [`StreamOptions`]).
    pub async fn run(&self, command: &RunCommand, options: StreamOptions) -> Result<CommandStream> {
        if options.idle_timeout.is_zero() {
            return Err(Error::InvalidArgument(
                "the idle timeout must be > 0".into(),
            ));
        }
        let started = Instant::now();
        let deadline = options.deadline.map(|d| (started + d, d));
        let mut call = self
            .call(Method::POST, &["command"], Replay::Never)?
            .json(&command.to_wire()?)?;
        call.secrets = command.secret_envs.values().cloned().collect();
        call.headers.insert(
            header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        );
        let route = call.route();
        let idle = options.idle_timeout;
        let t = self.client.transport();
        let opening = t.open(&call, idle, || Error::Idle {
            route: route.clone(),
            after: idle,
        });
        let resp = match deadline {
            Some((at, after)) => {
                tokio::time::timeout_at(at, opening)
                    .await
                    .unwrap_or_else(|_| {
                        Err(Error::Timeout {
                            route: route.clone(),
                            after,
                        })
                    })?
            }
            None => opening.await?,
        };
        let reader = Reader {
            body: t.chunks(&call, resp, idle),
            decoder: FrameDecoder::new(options.limits),
            idle,
            last_frame: Instant::now(),
            deadline,
            route,
            scrubber: t.scrubber_for(&call),
            ended: false,
        };
        let events = stream::unfold(Some(reader), |state| async move {
            let mut reader = state?;
            match reader.next_event().await {
                None => None,
                Some(Ok(event)) => Some((Ok(event), Some(reader))),
                Some(Err(e)) => Some((Err(e), None)),
            }
        });
        Ok(CommandStream {
            events: events.boxed(),
            exit: ExitTracker::default(),
            command_id: None,
            execution_time_ms: None,
        })
    }

    /// `DELETE /command?id=`: interrupts a command.
    pub async fn interrupt(&self, command_id: &str) -> Result<()> {
        let call = self
            .call(Method::DELETE, &["command"], Replay::Safe)?
            .query("id", command_id);
        self.client
            .transport()
            .send(&call, 64 * 1024)
            .await
            .map(|_| ())
    }

    /// `GET /command/status/{id}`.
    pub async fn command_status(&self, command_id: &str) -> Result<CommandStatus> {
        let call = self.call(
            Method::GET,
            &["command", "status", command_id],
            Replay::Safe,
        )?;
        self.client.transport().json(&call).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn event(v: Value) -> ExecEvent {
        let Value::Object(map) = v else { panic!() };
        ExecEvent::from_frame(map)
    }

    fn status_of(events: &[ExecEvent]) -> ExitStatus {
        let mut t = ExitTracker::default();
        for e in events {
            t.observe(e);
        }
        t.status()
    }

    #[test]
    fn exit_codes_are_derived_as_the_sdk_does() {
        let err = |v: &str| {
            event(json!({"type":"error","error":{"ename":"CommandExecError","evalue":v}}))
        };
        let done = event(json!({"type":"execution_complete","execution_time":5}));
        assert_eq!(status_of(&[err("3"), done.clone()]), ExitStatus::Code(3));
        assert_eq!(status_of(&[err(" -1 ")]), ExitStatus::Code(-1));
        assert_eq!(status_of(std::slice::from_ref(&done)), ExitStatus::Code(0));
        assert_eq!(
            status_of(&[err("exec: not found"), done]),
            ExitStatus::Unknown
        );
        assert_eq!(
            status_of(&[event(json!({"type":"stdout","text":"x"}))]),
            ExitStatus::Unknown
        );
        let numeric = event(json!({"type":"error","error":{"evalue":2}}));
        assert_eq!(status_of(&[numeric]), ExitStatus::Code(2));
    }

    #[test]
    fn frames_become_events_leniently() {
        assert_eq!(
            event(json!({"type":"init","text":"cmd-9","timestamp":1})),
            ExecEvent::Init {
                command_id: "cmd-9".into()
            }
        );
        assert_eq!(
            event(json!({"type":"stdout","text":null,"timestamp":"soon"})),
            ExecEvent::Stdout {
                text: String::new(),
                timestamp: None
            }
        );
        assert_eq!(event(json!({"type":"ping"})), ExecEvent::Ping);
        let other = event(json!({"type":"result","results":{"text/plain":"4"}}));
        assert!(matches!(other, ExecEvent::Other { ref kind, .. } if kind == "result"));
        assert!(
            matches!(event(json!({"text":"no type"})), ExecEvent::Other { ref kind, .. } if kind.is_empty())
        );
        let ExecEvent::Error(e) = event(
            json!({"type":"error","error":{"ename":"E","evalue":"1","traceback":"one line"}}),
        ) else {
            panic!()
        };
        assert_eq!(e.traceback, ["one line"]);
    }

    #[test]
    fn command_bodies() {
        let body = RunCommand::shell("echo hi")
            .cwd("/tmp")
            .timeout(Duration::from_secs(2))
            .env("A", "1")
            .secret_env("TOKEN", "tok-secret-9");
        assert!(!format!("{body:?}").contains("tok-secret"));
        let body = body.to_wire().unwrap();
        assert_eq!(
            body,
            json!({"command":"echo hi","cwd":"/tmp","timeout":2000,"envs":{"A":"1","TOKEN":"tok-secret-9"},"background":false})
        );
        let body = RunCommand::argv(["python3", "-c", "print(1)"])
            .background(true)
            .to_wire()
            .unwrap();
        assert_eq!(
            body,
            json!({"argv":["python3","-c","print(1)"],"background":true})
        );
        assert!(RunCommand::shell(" ").to_wire().is_err());
        assert!(RunCommand::argv(Vec::<String>::new()).to_wire().is_err());
        assert!(
            RunCommand::shell("x")
                .timeout(Duration::from_micros(10))
                .to_wire()
                .is_err()
        );
    }

    #[test]
    fn output_is_capped_on_char_boundaries() {
        let mut out = CommandOutput::default();
        out.keep("héllo", 2, true);
        out.keep("more", 2, false);
        assert_eq!(out.stdout, "h");
        assert_eq!(out.stderr, "m");
        assert!(out.truncated);
        out.keep("x", 2, true);
        assert_eq!(out.stdout, "h", "nothing is kept once the cap is reached");
    }
}
