//! Command execution: buffered, shell, streaming and `wait_for_port`.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::time::Duration;

use futures::{Stream, StreamExt};
use reqwest::Method;
use reqwest::header::HeaderMap;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::{CommandFailure, Error, Result};
use crate::options::RequestOptions;
use crate::sandbox::Sandbox;
use crate::transport::{RawBody, ndjson_frames};
use crate::wire_enum::nullable;

/// `POST …/exec` body. `cmd` runs directly (no shell); wrap scripts in `bash -c`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RunCommandRequest {
    /// Program to run.
    pub cmd: String,
    /// Arguments (omitted when empty).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Standard input (omitted when empty).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub stdin: String,
    /// Environment; keys must have been declared at create (omitted when empty).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

impl RunCommandRequest {
    /// Run `cmd` with no arguments.
    pub fn new(cmd: impl Into<String>) -> Self {
        Self {
            cmd: cmd.into(),
            ..Self::default()
        }
    }

    /// Append one argument.
    #[must_use]
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Append arguments.
    #[must_use]
    pub fn args<I: IntoIterator<Item = S>, S: Into<String>>(mut self, args: I) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Set standard input.
    #[must_use]
    pub fn stdin(mut self, stdin: impl Into<String>) -> Self {
        self.stdin = stdin.into();
        self
    }

    /// Set one environment variable.
    #[must_use]
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }
}

/// Per-call exec options. `stdin` and `env` override the request's when set.
#[derive(Debug, Clone, Default)]
pub struct ExecOptions {
    /// HTTP timeout of the call (there is no server-side exec timeout; use `timeout(1)` in
    /// the guest). For streams it bounds the wait for headers and each idle gap.
    pub timeout: Option<Duration>,
    /// Overrides `RunCommandRequest::stdin`.
    pub stdin: Option<String>,
    /// Overrides `RunCommandRequest::env`.
    pub env: Option<BTreeMap<String, String>>,
    /// Extra headers (credential headers are dropped).
    pub headers: HeaderMap,
    /// Disable retries (buffered exec is a POST: only 429/503 are ever retried).
    pub disable_retry: bool,
}

impl ExecOptions {
    /// Options with an HTTP timeout.
    pub fn timeout(timeout: Duration) -> Self {
        Self {
            timeout: Some(timeout),
            ..Self::default()
        }
    }

    fn request_options(&self) -> RequestOptions {
        RequestOptions {
            timeout: self.timeout,
            disable_retry: self.disable_retry,
            headers: self.headers.clone(),
            retry: None,
        }
    }

    fn apply(&self, mut req: RunCommandRequest) -> RunCommandRequest {
        if let Some(s) = &self.stdin {
            req.stdin.clone_from(s);
        }
        if let Some(e) = &self.env {
            req.env.clone_from(e);
        }
        req
    }
}

fn default_exit() -> i64 {
    1
}

fn exit_code_or_failure<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    Ok(Option::<i64>::deserialize(d)?.unwrap_or_else(default_exit))
}

fn missing_result() -> CommandResult {
    CommandResult {
        exit_code: default_exit(),
        ..CommandResult::default()
    }
}

fn result_or_failure<'de, D: serde::Deserializer<'de>>(d: D) -> Result<CommandResult, D::Error> {
    Ok(Option::<CommandResult>::deserialize(d)?.unwrap_or_else(missing_result))
}

/// Outcome of a buffered command.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct CommandResult {
    /// Captured standard output.
    #[serde(default, deserialize_with = "nullable")]
    pub stdout: String,
    /// Captured standard error.
    #[serde(default, deserialize_with = "nullable")]
    pub stderr: String,
    /// Exit status (124 when a guest `timeout` fired). Absent or `null` on the wire = 1, so
    /// a malformed answer never reads as success.
    #[serde(default = "default_exit", deserialize_with = "exit_code_or_failure")]
    pub exit_code: i64,
    /// Agent-level failure (the command could not start).
    #[serde(default)]
    pub error: Option<String>,
}

/// `POST …/exec` answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct RunCommandResponse {
    /// The command's result. An absent or `null` `result` reads as a failure (exit code 1),
    /// never as success.
    #[serde(default = "missing_result", deserialize_with = "result_or_failure")]
    pub result: CommandResult,
    /// Server-side execution time in milliseconds.
    #[serde(default)]
    pub exec_ms: Option<f64>,
}

impl RunCommandResponse {
    /// Exit code 0 and no agent error.
    pub fn success(&self) -> bool {
        self.result.exit_code == 0 && self.result.error.as_deref().is_none_or(str::is_empty)
    }
}

/// One event of a command stream.
///
/// Serde uses the *projected* form (`{"type":"exit","exitCode":0}`, `{"type":"error",
/// "message":…}`), like the other SDKs' models; the wire frames (`exit_code`, `hb` …) are
/// parsed by [`Sandbox::stream_command`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
#[non_exhaustive]
pub enum ExecEvent {
    /// A chunk of standard output.
    Stdout {
        /// The text.
        data: String,
    },
    /// A chunk of standard error.
    Stderr {
        /// The text.
        data: String,
    },
    /// The process exited.
    Exit {
        /// Exit status.
        #[serde(rename = "exitCode")]
        exit_code: i64,
    },
    /// The agent reported an error.
    Error {
        /// The message.
        message: String,
    },
    /// Keep-alive.
    Heartbeat,
}

/// A stream of [`ExecEvent`]s. Dropping it closes the HTTP response.
pub type ExecStream = Pin<Box<dyn Stream<Item = Result<ExecEvent>> + Send>>;

/// Expand one wire frame into events: heartbeat, stdout, stderr, error, exit (§3.2).
pub(crate) fn frame_events(frame: &Map<String, Value>) -> Result<Vec<ExecEvent>> {
    let mut out = Vec::new();
    let truthy = |v: &Value| match v {
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        _ => false,
    };
    if frame.get("hb").is_some_and(truthy) {
        out.push(ExecEvent::Heartbeat);
    }
    let text = |k: &str| -> Result<Option<String>> {
        match frame.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(_) => Err(Error::protocol(format!(
                "exec stream frame: `{k}` is not a string"
            ))),
        }
    };
    if let Some(s) = text("stdout")? {
        out.push(ExecEvent::Stdout { data: s });
    }
    if let Some(s) = text("stderr")? {
        out.push(ExecEvent::Stderr { data: s });
    }
    if let Some(s) = text("error")? {
        out.push(ExecEvent::Error { message: s });
    }
    match frame.get("exit_code") {
        None | Some(Value::Null) => {}
        Some(v) => {
            let code = v
                .as_i64()
                .or_else(|| {
                    #[allow(clippy::cast_possible_truncation)] // integral and range-checked
                    v.as_f64()
                        .filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15)
                        .map(|f| f as i64)
                })
                .ok_or_else(|| {
                    Error::protocol("exec stream frame: `exit_code` is not an integer")
                })?;
            out.push(ExecEvent::Exit { exit_code: code });
        }
    }
    Ok(out)
}

const STDERR_TAIL: usize = 2000;

fn valid_port_host(host: &str) -> bool {
    !host.is_empty()
        && !host.contains("..")
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-')
}

impl Sandbox {
    /// `POST …/exec`: run a command and collect its output. A non-zero exit is not an
    /// error here (see [`Sandbox::shell`]).
    pub async fn run_command(
        &self,
        req: RunCommandRequest,
        opts: ExecOptions,
    ) -> Result<RunCommandResponse> {
        let req = opts.apply(req);
        let body = serde_json::to_value(&req).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        self.transport()
            .json(
                Method::POST,
                &self.path("/exec"),
                &[],
                Some(body),
                &opts.request_options(),
            )
            .await
    }

    /// Run `bash -lc <script>`; a non-zero exit or an agent error becomes
    /// [`Error::CommandFailed`] carrying the last 2000 characters of stderr.
    pub async fn shell(
        &self,
        script: impl Into<String>,
        opts: ExecOptions,
    ) -> Result<RunCommandResponse> {
        let req = RunCommandRequest::new("bash").arg("-lc").arg(script);
        let resp = self.run_command(req, opts).await?;
        if resp.success() {
            return Ok(resp);
        }
        let stderr = &resp.result.stderr;
        let skip = stderr.chars().count().saturating_sub(STDERR_TAIL);
        Err(Error::CommandFailed(Box::new(CommandFailure {
            exit_code: Some(resp.result.exit_code),
            error: resp.result.error.clone().filter(|e| !e.is_empty()),
            stderr_tail: stderr.chars().skip(skip).collect(),
            response: resp,
        })))
    }

    /// `POST …/exec?stream=true`: a stream of typed events parsed from NDJSON and/or
    /// single-line SSE. Never retried. Dropping the stream stops the HTTP transfer.
    pub async fn stream_command(
        &self,
        req: RunCommandRequest,
        opts: ExecOptions,
    ) -> Result<ExecStream> {
        let req = opts.apply(req);
        let mut body =
            serde_json::to_value(&req).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        if let Value::Object(o) = &mut body {
            o.insert("stream".into(), Value::Bool(true));
        }
        let resp = self
            .transport()
            .raw(
                Method::POST,
                &self.path("/exec"),
                &[("stream", "true".into())],
                RawBody::Json(body),
                &opts.request_options(),
            )
            .await?;
        let events = ndjson_frames(resp)
            .flat_map(|frame| {
                let items: Vec<Result<ExecEvent>> = match frame.and_then(|f| frame_events(&f)) {
                    Ok(evs) => evs.into_iter().map(Ok).collect(),
                    Err(e) => vec![Err(e)],
                };
                futures::stream::iter(items)
            })
            .scan(false, |failed, item| {
                // Stop after the first error: the stream is closed on a protocol error.
                if *failed {
                    return futures::future::ready(None);
                }
                *failed = item.is_err();
                futures::future::ready(Some(item))
            });
        Ok(Box::pin(events))
    }

    /// Wait until something listens on `host:port` inside the guest, probing with bash's
    /// `/dev/tcp` under GNU `timeout`. A non-zero exit becomes [`Error::OperationTimeout`].
    pub async fn wait_for_port(&self, port: u16, host: &str, timeout: Duration) -> Result<()> {
        if port == 0 {
            return Err(Error::InvalidArgument("port must be 1..=65535".into()));
        }
        if !valid_port_host(host) {
            return Err(Error::InvalidArgument(format!("invalid host {host:?}")));
        }
        let secs = timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0);
        let secs = secs.max(1);
        let script = format!(
            "timeout {secs} bash -c 'until (echo > /dev/tcp/{host}/{port}) 2>/dev/null; do sleep 0.25; done'"
        );
        let req = RunCommandRequest::new("bash").arg("-c").arg(script);
        let resp = self
            .run_command(req, ExecOptions::timeout(timeout + Duration::from_secs(5)))
            .await?;
        if resp.success() {
            Ok(())
        } else {
            Err(Error::OperationTimeout {
                operation: format!("port {port} on {host} in sandbox {}", self.id()),
                after: timeout,
            })
        }
    }
}
