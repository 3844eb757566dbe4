//! Managed processes and PTYs (`/v1/sandboxes/{id}/processes`).
//!
//! A managed process is a server-side resource: it keeps running when no client is connected, its
//! output is retained in a bounded window numbered by a monotonically increasing `seq`, and a
//! client can reconnect from any retained sequence number.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::BoxStream;
use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::transport::{Transport, ndjson_frames, seg};
use crate::wire_enum::{is_zero_u32, lenient_enum, nullable};
use crate::{Error, RequestOptions, Result, Sandbox};

lenient_enum! {
    /// What kind of managed process this is.
    pub enum ProcessKind {
        /// A process with separate stdin/stdout/stderr pipes.
        Process => "process",
        /// A process attached to a pseudo-terminal.
        Pty => "pty",
    }
}

lenient_enum! {
    /// Lifecycle state of a managed process.
    pub enum ProcessState {
        /// Being started.
        Starting => "starting",
        /// Running.
        Running => "running",
        /// A termination was requested and is in progress.
        Terminating => "terminating",
        /// The process exited.
        Exited => "exited",
        /// The process could not be started or failed.
        Failed => "failed",
    }
}

lenient_enum! {
    /// Which output stream a `data` frame came from.
    pub enum ProcessStreamKind {
        /// Standard output of a pipe process.
        Stdout => "stdout",
        /// Standard error of a pipe process.
        Stderr => "stderr",
        /// The terminal output of a PTY process.
        Pty => "pty",
    }
}

/// The foreground process group leader of a PTY (PTY processes only).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct ProcessForeground {
    /// Operating-system pid of the foreground process.
    #[serde(deserialize_with = "nullable")]
    pub pid: i64,
    /// Its command.
    #[serde(deserialize_with = "nullable")]
    pub cmd: String,
    /// Its arguments.
    #[serde(deserialize_with = "nullable")]
    pub args: Vec<String>,
}

/// The retained output window of a managed process.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct ProcessOutputWindow {
    /// Oldest sequence number still retained (replayable).
    #[serde(deserialize_with = "nullable")]
    pub oldest_seq: u64,
    /// Newest sequence number produced so far.
    #[serde(deserialize_with = "nullable")]
    pub newest_seq: u64,
    /// Bytes currently retained.
    #[serde(deserialize_with = "nullable")]
    pub bytes: u64,
}

/// A managed process as the control plane reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
#[non_exhaustive]
pub struct ManagedProcess {
    /// Server-assigned process id (used in every path below `/processes`).
    #[serde(deserialize_with = "nullable")]
    pub process_id: String,
    /// Pipe process or PTY.
    #[serde(deserialize_with = "nullable")]
    pub kind: ProcessKind,
    /// Operating-system pid of the leader inside the guest.
    #[serde(deserialize_with = "nullable")]
    pub pid: i64,
    /// Lifecycle state.
    #[serde(deserialize_with = "nullable")]
    pub state: ProcessState,
    /// Whether the leader process has exited.
    #[serde(deserialize_with = "nullable")]
    pub leader_exited: bool,
    /// Whether the leader and every descendant have exited.
    #[serde(deserialize_with = "nullable")]
    pub tree_exited: bool,
    /// Creation time (RFC 3339).
    pub created_at: Option<String>,
    /// Finish time (RFC 3339), once exited.
    pub finished_at: Option<String>,
    /// Exit code of the leader, once exited normally.
    pub exit_code: Option<i32>,
    /// Name of the signal that ended the leader, if any.
    pub signal: Option<String>,
    /// Command that was started.
    #[serde(deserialize_with = "nullable")]
    pub cmd: String,
    /// Its arguments.
    #[serde(deserialize_with = "nullable")]
    pub args: Vec<String>,
    /// Working directory.
    #[serde(deserialize_with = "nullable")]
    pub cwd: String,
    /// Foreground process (PTY only).
    pub foreground: Option<ProcessForeground>,
    /// Retained output window.
    #[serde(deserialize_with = "nullable")]
    pub output: ProcessOutputWindow,
}

/// Terminal size for a PTY process. A zero field is left out of the request, so
/// `PtySize::default()` asks for the server's default size (`"pty": {}`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PtySize {
    /// Rows; `0` means the server default.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub rows: u32,
    /// Columns; `0` means the server default.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub cols: u32,
}

impl PtySize {
    /// A terminal of `rows` × `cols`.
    pub fn new(rows: u32, cols: u32) -> Self {
        Self { rows, cols }
    }
}

/// Body of `POST /processes`. Empty fields are omitted; `pty: Some(..)` makes it a PTY (which may
/// leave `cmd` empty to get the guest's default shell).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManagedProcessCreateRequest {
    /// Program to run (no shell; wrap in `sh -c` for shell syntax). May be empty for a PTY.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cmd: String,
    /// Arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Working directory inside the guest.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cwd: String,
    /// Environment values for this process; keys should be declared at sandbox creation.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Present for a PTY process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
}

impl ManagedProcessCreateRequest {
    /// A pipe process running `cmd` with `args`.
    pub fn command<I, S>(cmd: impl Into<String>, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            cmd: cmd.into(),
            args: args.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// A PTY running the guest's default shell.
    pub fn shell_pty(size: PtySize) -> Self {
        Self {
            pty: Some(size),
            ..Self::default()
        }
    }

    /// Sets the working directory.
    #[must_use]
    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = cwd.into();
        self
    }

    /// Adds one environment value.
    #[must_use]
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }

    /// Runs the command attached to a PTY of the given size.
    #[must_use]
    pub fn pty(mut self, size: PtySize) -> Self {
        self.pty = Some(size);
        self
    }
}

/// A signal that can be sent to a managed process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ManagedProcessSignal {
    /// `SIGHUP`.
    #[serde(rename = "SIGHUP")]
    Hup,
    /// `SIGINT`.
    #[serde(rename = "SIGINT")]
    Int,
    /// `SIGQUIT`.
    #[serde(rename = "SIGQUIT")]
    Quit,
    /// `SIGKILL`.
    #[serde(rename = "SIGKILL")]
    Kill,
    /// `SIGTERM`.
    #[serde(rename = "SIGTERM")]
    Term,
    /// `SIGUSR1`.
    #[serde(rename = "SIGUSR1")]
    Usr1,
    /// `SIGUSR2`.
    #[serde(rename = "SIGUSR2")]
    Usr2,
    /// `SIGWINCH`.
    #[serde(rename = "SIGWINCH")]
    Winch,
}

impl ManagedProcessSignal {
    /// The wire name, e.g. `"SIGTERM"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hup => "SIGHUP",
            Self::Int => "SIGINT",
            Self::Quit => "SIGQUIT",
            Self::Kill => "SIGKILL",
            Self::Term => "SIGTERM",
            Self::Usr1 => "SIGUSR1",
            Self::Usr2 => "SIGUSR2",
            Self::Winch => "SIGWINCH",
        }
    }
}

/// What `wait` waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ManagedProcessWaitScope {
    /// Only the leader process.
    Leader,
    /// The leader and all of its descendants.
    Tree,
}

impl ManagedProcessWaitScope {
    /// The wire spelling (`leader` or `tree`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Leader => "leader",
            Self::Tree => "tree",
        }
    }
}

/// Options for [`Processes::wait`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ManagedProcessWaitOptions {
    /// What to wait for; `None` lets the server choose (the leader).
    pub scope: Option<ManagedProcessWaitScope>,
    /// Server-side long-poll budget, sent as `timeout_ms`. The HTTP timeout of the call is
    /// raised to this plus a margin when no explicit request timeout is set.
    pub timeout: Option<Duration>,
}

/// Options for [`Processes::delete`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ManagedProcessDeleteOptions {
    /// Time between SIGTERM and the final kill of the whole tree, sent as `grace_ms`.
    pub grace: Option<Duration>,
}

/// Options for [`Processes::follow_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessFollowOptions {
    /// How many reconnects in a row may happen without a new frame before the stream gives up.
    pub max_reconnects: u32,
    /// Pause before each reconnect.
    pub reconnect_delay: Duration,
}

impl Default for ProcessFollowOptions {
    fn default() -> Self {
        Self {
            max_reconnects: 5,
            reconnect_delay: Duration::from_millis(200),
        }
    }
}

/// One frame of `GET /processes/{pid}/connect`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProcessEvent {
    /// A chunk of output.
    Data {
        /// Sequence number (strictly increasing per process).
        seq: u64,
        /// Which stream it came from.
        stream: ProcessStreamKind,
        /// The decoded bytes (may be empty).
        data: Bytes,
    },
    /// The process exited; the stream ends after this frame.
    Exit {
        /// Exit code, if it exited normally.
        exit_code: Option<i32>,
        /// Signal name, if a signal ended it.
        signal: Option<String>,
    },
    /// Keep-alive; carries nothing.
    Heartbeat,
    /// The server could not serve the request, typically because `after` is older than the
    /// retained window; reconnect from `oldest_available_seq - 1` to replay what is left.
    Error {
        /// The server's message.
        message: String,
        /// Oldest sequence number still retained.
        oldest_available_seq: Option<u64>,
    },
    /// A frame type this client does not know (kept for forward compatibility).
    Unknown {
        /// The frame's `type`.
        kind: String,
        /// The whole frame.
        frame: Map<String, Value>,
    },
}

impl ProcessEvent {
    /// Decodes one wire frame (`snake_case` keys, `type` required, base64 decoded strictly).
    pub fn from_frame(frame: Map<String, Value>) -> Result<Self> {
        let kind = match frame.get("type") {
            Some(Value::String(kind)) => kind.clone(),
            _ => return Err(protocol("process stream frame has no string `type`")),
        };
        match kind.as_str() {
            "data" => {
                let seq = frame
                    .get("seq")
                    .and_then(Value::as_u64)
                    .ok_or_else(|| protocol("process data frame has no integer `seq`"))?;
                let stream = match frame.get("stream") {
                    Some(Value::String(s)) => ProcessStreamKind::from(s.as_str()),
                    _ => ProcessStreamKind::default(),
                };
                let encoded = match frame.get("data_base64") {
                    Some(Value::String(s)) => s.as_str(),
                    None | Some(Value::Null) => "",
                    Some(_) => {
                        return Err(protocol("process data frame `data_base64` is not a string"));
                    }
                };
                let data = base64::engine::general_purpose::STANDARD
                    .decode(encoded)
                    .map_err(|e| protocol(format!("process data frame has invalid base64: {e}")))?;
                Ok(Self::Data {
                    seq,
                    stream,
                    data: Bytes::from(data),
                })
            }
            "exit" => Ok(Self::Exit {
                exit_code: frame
                    .get("exit_code")
                    .and_then(Value::as_i64)
                    .and_then(|c| i32::try_from(c).ok()),
                signal: frame
                    .get("signal")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
            }),
            "heartbeat" => Ok(Self::Heartbeat),
            "error" => Ok(Self::Error {
                message: frame
                    .get("error")
                    .or_else(|| frame.get("message"))
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                oldest_available_seq: frame.get("oldest_available_seq").and_then(Value::as_u64),
            }),
            _ => Ok(Self::Unknown { kind, frame }),
        }
    }
}

fn protocol(message: impl Into<String>) -> Error {
    crate::wire_enum::protocol_error(message)
}

/// Managed-process operations on one sandbox; get it from [`Sandbox::processes`].
#[derive(Clone)]
pub struct Processes {
    transport: Arc<Transport>,
    sandbox_id: String,
    options: RequestOptions,
}

impl std::fmt::Debug for Processes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Processes")
            .field("sandbox_id", &self.sandbox_id)
            .finish_non_exhaustive()
    }
}

impl Sandbox {
    /// Managed processes and PTYs of this sandbox (uses this handle's credential).
    pub fn processes(&self) -> Processes {
        Processes {
            transport: Arc::clone(self.transport()),
            sandbox_id: self.id().to_owned(),
            options: RequestOptions::default(),
        }
    }
}

#[derive(Deserialize)]
struct ProcessList {
    #[serde(default, deserialize_with = "nullable")]
    processes: Vec<ManagedProcess>,
}

#[derive(Deserialize)]
struct InputAck {
    input_seq: u64,
}

impl Processes {
    /// The same service with `options` applied to every call.
    #[must_use]
    pub fn with_options(mut self, options: RequestOptions) -> Self {
        self.options = options;
        self
    }

    fn base(&self) -> String {
        format!("/v1/sandboxes/{}/processes", seg(&self.sandbox_id))
    }

    fn path(&self, pid: &str, tail: &str) -> String {
        format!("{}/{}{}", self.base(), seg(pid), tail)
    }

    /// Starts a process or PTY (`POST /processes`).
    pub async fn create(&self, request: &ManagedProcessCreateRequest) -> Result<ManagedProcess> {
        let body = serde_json::to_value(request).map_err(|e| protocol(e.to_string()))?;
        self.transport
            .json(Method::POST, &self.base(), &[], Some(body), &self.options)
            .await
    }

    /// Lists the sandbox's managed processes (`GET /processes` → `{processes: [..]}`).
    pub async fn list(&self) -> Result<Vec<ManagedProcess>> {
        let list: ProcessList = self
            .transport
            .json(Method::GET, &self.base(), &[], None, &self.options)
            .await?;
        Ok(list.processes)
    }

    /// Fetches one process (`GET /processes/{pid}`).
    pub async fn get(&self, pid: &str) -> Result<ManagedProcess> {
        self.transport
            .json(Method::GET, &self.path(pid, ""), &[], None, &self.options)
            .await
    }

    /// Opens the output stream (`GET /processes/{pid}/connect?after=N`): retained frames with
    /// `seq > after` are replayed, then new output follows until the `exit` frame. Never retried;
    /// see [`Processes::follow`] for a stream that reconnects by itself.
    pub async fn connect(
        &self,
        pid: &str,
        after: u64,
    ) -> Result<BoxStream<'static, Result<ProcessEvent>>> {
        let response = self
            .transport
            .raw(
                Method::GET,
                &self.path(pid, "/connect"),
                &[("after", after.to_string())],
                RawBody::None,
                &self.options,
            )
            .await?;
        Ok(ndjson_frames(response)
            .map(|frame| frame.and_then(ProcessEvent::from_frame))
            .boxed())
    }

    /// Like [`Processes::connect`], but tracks the largest `seq` seen and reconnects with
    /// `after=<that seq>` when the connection drops before the `exit` frame, so no output is
    /// lost or repeated. Ends after an `exit` or `error` frame.
    pub fn follow(&self, pid: &str, after: u64) -> BoxStream<'static, Result<ProcessEvent>> {
        self.follow_with(pid, after, ProcessFollowOptions::default())
    }

    /// [`Processes::follow`] with explicit reconnect settings.
    pub fn follow_with(
        &self,
        pid: &str,
        after: u64,
        options: ProcessFollowOptions,
    ) -> BoxStream<'static, Result<ProcessEvent>> {
        let state = FollowState {
            service: self.clone(),
            pid: pid.to_owned(),
            last_seq: after,
            current: None,
            failures: 0,
            options,
            done: false,
        };
        futures::stream::unfold(state, FollowState::step).boxed()
    }

    /// Sends text to the process's stdin (or terminal). Returns the server's `input_seq`.
    pub async fn input(&self, pid: &str, text: &str) -> Result<u64> {
        self.input_bytes(pid, text.as_bytes()).await
    }

    /// Sends raw bytes to the process's stdin (or terminal). Returns the server's `input_seq`.
    pub async fn input_bytes(&self, pid: &str, data: &[u8]) -> Result<u64> {
        let body = serde_json::json!({
            "data_base64": base64::engine::general_purpose::STANDARD.encode(data),
        });
        let ack: InputAck = self
            .transport
            .json(
                Method::POST,
                &self.path(pid, "/input"),
                &[],
                Some(body),
                &self.options,
            )
            .await?;
        Ok(ack.input_seq)
    }

    /// Closes the process's stdin (pipe processes only; PTYs reject it).
    pub async fn close_stdin(&self, pid: &str) -> Result<()> {
        self.transport
            .unit(
                Method::POST,
                &self.path(pid, "/stdin/close"),
                &[],
                None,
                &self.options,
            )
            .await
    }

    /// Resizes a PTY (pipe processes reject it). Zero fields are omitted.
    pub async fn resize(&self, pid: &str, size: PtySize) -> Result<()> {
        let body = serde_json::to_value(size).map_err(|e| protocol(e.to_string()))?;
        self.transport
            .unit(
                Method::POST,
                &self.path(pid, "/resize"),
                &[],
                Some(body),
                &self.options,
            )
            .await
    }

    /// Sends a signal to the process.
    pub async fn signal(&self, pid: &str, signal: ManagedProcessSignal) -> Result<()> {
        let body = serde_json::json!({ "signal": signal.as_str() });
        self.transport
            .unit(
                Method::POST,
                &self.path(pid, "/signal"),
                &[],
                Some(body),
                &self.options,
            )
            .await
    }

    /// Long-polls until the leader (or the whole tree) exits or the server-side budget runs out,
    /// and returns the process as it is then.
    pub async fn wait(
        &self,
        pid: &str,
        options: ManagedProcessWaitOptions,
    ) -> Result<ManagedProcess> {
        let mut query: Vec<(&str, String)> = Vec::new();
        if let Some(scope) = options.scope {
            query.push(("scope", scope.as_str().to_owned()));
        }
        let mut request_options = self.options.clone();
        if let Some(timeout) = options.timeout {
            query.push(("timeout_ms", duration_ms(timeout).to_string()));
            if request_options.timeout.is_none() {
                request_options.timeout = Some(timeout + WAIT_HTTP_MARGIN);
            }
        }
        self.transport
            .json(
                Method::GET,
                &self.path(pid, "/wait"),
                &query,
                None,
                &request_options,
            )
            .await
    }

    /// Terminates the process tree (SIGTERM, then a kill after `grace`) and removes it.
    pub async fn delete(
        &self,
        pid: &str,
        options: ManagedProcessDeleteOptions,
    ) -> Result<ManagedProcess> {
        let mut query: Vec<(&str, String)> = Vec::new();
        if let Some(grace) = options.grace {
            query.push(("grace_ms", duration_ms(grace).to_string()));
        }
        self.transport
            .json(
                Method::DELETE,
                &self.path(pid, ""),
                &query,
                None,
                &self.options,
            )
            .await
    }
}

/// Extra HTTP time allowed on top of a `wait` long-poll budget.
const WAIT_HTTP_MARGIN: Duration = Duration::from_secs(15);

fn duration_ms(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

struct FollowState {
    service: Processes,
    pid: String,
    last_seq: u64,
    current: Option<BoxStream<'static, Result<ProcessEvent>>>,
    failures: u32,
    options: ProcessFollowOptions,
    done: bool,
}

impl FollowState {
    async fn step(mut self) -> Option<(Result<ProcessEvent>, Self)> {
        loop {
            if self.done {
                return None;
            }
            let Some(current) = self.current.as_mut() else {
                match self.service.connect(&self.pid, self.last_seq).await {
                    Ok(stream) => self.current = Some(stream),
                    Err(error) => {
                        if is_reconnectable(&error) && self.failures < self.options.max_reconnects {
                            self.failures += 1;
                            tokio::time::sleep(self.options.reconnect_delay).await;
                            continue;
                        }
                        self.done = true;
                        return Some((Err(error), self));
                    }
                }
                continue;
            };
            match current.next().await {
                Some(Ok(event)) => {
                    match &event {
                        ProcessEvent::Data { seq, .. } => {
                            if *seq <= self.last_seq {
                                continue; // already delivered before a reconnect
                            }
                            self.last_seq = *seq;
                            self.failures = 0;
                        }
                        ProcessEvent::Exit { .. } | ProcessEvent::Error { .. } => {
                            self.done = true;
                            self.current = None;
                        }
                        ProcessEvent::Heartbeat | ProcessEvent::Unknown { .. } => {}
                    }
                    return Some((Ok(event), self));
                }
                Some(Err(error)) => {
                    self.current = None;
                    if is_reconnectable(&error) && self.failures < self.options.max_reconnects {
                        self.failures += 1;
                        tokio::time::sleep(self.options.reconnect_delay).await;
                        continue;
                    }
                    self.done = true;
                    return Some((Err(error), self));
                }
                None => {
                    // The connection ended without an `exit` frame: it was dropped.
                    self.current = None;
                    if self.failures < self.options.max_reconnects {
                        self.failures += 1;
                        tokio::time::sleep(self.options.reconnect_delay).await;
                        continue;
                    }
                    self.done = true;
                    return Some((
                        Err(protocol("process stream kept ending before the exit frame")),
                        self,
                    ));
                }
            }
        }
    }
}

use crate::transport::RawBody;

fn is_reconnectable(error: &Error) -> bool {
    crate::wire_enum::is_connection_error(error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn frame(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            _ => unreachable!(),
        }
    }

    #[test]
    fn create_request_omits_empty_fields_and_serializes_empty_pty() {
        let pipe = ManagedProcessCreateRequest::command("sh", ["-c", "echo hi"]);
        assert_eq!(
            serde_json::to_value(&pipe).unwrap(),
            json!({"cmd":"sh","args":["-c","echo hi"]})
        );
        let pty = ManagedProcessCreateRequest::shell_pty(PtySize::default()).cwd("/root");
        assert_eq!(
            serde_json::to_value(&pty).unwrap(),
            json!({"cwd":"/root","pty":{}})
        );
        let sized = ManagedProcessCreateRequest::command("bash", Vec::<String>::new())
            .pty(PtySize::new(24, 0))
            .env("A", "1");
        assert_eq!(
            serde_json::to_value(&sized).unwrap(),
            json!({"cmd":"bash","env":{"A":"1"},"pty":{"rows":24}})
        );
    }

    #[test]
    fn process_decodes_leniently() {
        let p: ManagedProcess = serde_json::from_value(json!({
            "process_id": "p1", "kind": "pty", "pid": 42, "state": "zombie",
            "leader_exited": true, "args": null, "output": {"oldest_seq": 3, "newest_seq": 9, "bytes": 100},
            "foreground": {"pid": 43, "cmd": "vim", "args": ["x"]}, "brand_new_field": 1
        }))
        .unwrap();
        assert_eq!(p.kind, ProcessKind::Pty);
        assert_eq!(p.state, ProcessState::Unknown("zombie".into()));
        assert!(p.leader_exited && !p.tree_exited);
        assert!(p.args.is_empty());
        assert_eq!(p.output.newest_seq, 9);
        assert_eq!(p.foreground.unwrap().cmd, "vim");
        assert_eq!(p.exit_code, None);
    }

    #[test]
    fn signals_use_wire_names() {
        assert_eq!(
            serde_json::to_value(ManagedProcessSignal::Winch).unwrap(),
            json!("SIGWINCH")
        );
        assert_eq!(ManagedProcessSignal::Usr1.as_str(), "SIGUSR1");
    }

    #[test]
    fn frames_decode_by_type() {
        let data = ProcessEvent::from_frame(frame(
            json!({"type":"data","seq":7,"stream":"stderr","data_base64":"aGk="}),
        ))
        .unwrap();
        assert_eq!(
            data,
            ProcessEvent::Data {
                seq: 7,
                stream: ProcessStreamKind::Stderr,
                data: Bytes::from_static(b"hi")
            }
        );
        let empty = ProcessEvent::from_frame(frame(
            json!({"type":"data","seq":8,"stream":"pty","data_base64":""}),
        ))
        .unwrap();
        assert!(matches!(empty, ProcessEvent::Data { ref data, .. } if data.is_empty()));
        let exit = ProcessEvent::from_frame(frame(json!({"type":"exit","exit_code":0}))).unwrap();
        assert_eq!(
            exit,
            ProcessEvent::Exit {
                exit_code: Some(0),
                signal: None
            }
        );
        let err = ProcessEvent::from_frame(frame(
            json!({"type":"error","error":"gone","oldest_available_seq":5}),
        ))
        .unwrap();
        assert_eq!(
            err,
            ProcessEvent::Error {
                message: "gone".into(),
                oldest_available_seq: Some(5)
            }
        );
        assert_eq!(
            ProcessEvent::from_frame(frame(json!({"type":"heartbeat"}))).unwrap(),
            ProcessEvent::Heartbeat
        );
        assert!(matches!(
            ProcessEvent::from_frame(frame(json!({"type":"resize","rows":3}))).unwrap(),
            ProcessEvent::Unknown { ref kind, .. } if kind == "resize"
        ));
    }

    #[test]
    fn frames_reject_bad_base64_and_missing_type() {
        for bad in ["aGk", "aGk=\n", "a$==", "aGl="] {
            assert!(
                ProcessEvent::from_frame(frame(
                    json!({"type":"data","seq":1,"stream":"stdout","data_base64":bad})
                ))
                .is_err(),
                "{bad:?} must be rejected"
            );
        }
        assert!(ProcessEvent::from_frame(frame(json!({"seq":1}))).is_err());
        assert!(
            ProcessEvent::from_frame(frame(json!({"type":"data","data_base64":"aGk="}))).is_err()
        );
    }
}
