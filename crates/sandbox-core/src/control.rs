//! The control-plane operations the lifecycle needs, as a small object-safe trait.
//!
//! `sandbox_createos::CreateOsControlPlane` implements it over `createos-api`; tests can
//! implement it in memory. Keeping the lifecycle behind this seam also keeps it
//! provider-neutral where that costs nothing.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::BoxStream;

/// Default timeout of one control call (not exec, which gets the host deadline).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// One catalog entry (`GET /v1/shapes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    /// Shape id, e.g. `s-2vcpu-4gb`.
    pub id: String,
    /// Virtual CPUs.
    pub vcpu: u32,
    /// Memory in MiB.
    pub mem_mib: u32,
}

/// How a control-plane call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CallFailure {
    /// The server answered with this HTTP status.
    Status(u16),
    /// Connect, reset, or any transport failure before a complete response.
    Transport,
    /// The per-request timeout elapsed.
    Timeout,
    /// The server redirected; redirects are never followed (the base URL is wrong).
    Redirect,
    /// The response could not be decoded (not JSend, bad JSON, missing fields).
    Protocol,
    /// The client refused the call before sending it (e.g. no key).
    Config,
    /// A byte cap was exceeded (a download larger than allowed); nothing more is read.
    TooLarge,
}

/// A failed control-plane call. The message is already free of the API key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallError {
    /// How it failed.
    pub failure: CallFailure,
    /// Human message (operation, status and a capped, redacted body snippet).
    pub message: String,
    /// The server's `Retry-After`, if any.
    pub retry_after: Option<Duration>,
    /// The provider knows the call had no effect although its status alone does not say so
    /// (OpenSandbox: a create the server answered with its own error, after which nothing
    /// under the create's nonce was found, or what was found was deleted). Such a create
    /// leaves nothing to look up later ([`CallError::is_declined`]).
    pub not_created: bool,
}

impl CallError {
    /// Builds an error.
    pub fn new(failure: CallFailure, message: impl Into<String>) -> Self {
        Self {
            failure,
            message: message.into(),
            retry_after: None,
            not_created: false,
        }
    }

    /// The same error, known to have had no effect (see [`CallError::not_created`]).
    #[must_use]
    pub fn with_nothing_created(mut self) -> Self {
        self.not_created = true;
        self
    }

    /// 429, 5xx, transport failures, timeouts and garbled responses: worth retrying when the
    /// operation is safe to repeat.
    pub fn is_transient(&self) -> bool {
        match self.failure {
            CallFailure::Status(s) => s == 429 || s >= 500,
            CallFailure::Transport | CallFailure::Timeout | CallFailure::Protocol => true,
            CallFailure::Redirect | CallFailure::Config | CallFailure::TooLarge => false,
        }
    }

    /// The server said it did not take the request on (429 or 503), or the provider made sure
    /// it had no effect ([`CallError::not_created`]), so even a non-idempotent call is known
    /// not to have happened.
    pub fn is_declined(&self) -> bool {
        self.not_created || matches!(self.failure, CallFailure::Status(429 | 503))
    }

    /// 404.
    pub fn is_not_found(&self) -> bool {
        self.failure == CallFailure::Status(404)
    }

    /// 409: the name is taken, or the guest is not in a state that allows the call (paused,
    /// resuming, being destroyed).
    pub fn is_conflict(&self) -> bool {
        self.failure == CallFailure::Status(409)
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CallError {}

#[cfg(test)]
mod time_tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::parse_rfc3339;

    #[test]
    fn rfc3339_timestamps() {
        let at = |s| parse_rfc3339(s).map(|t| t.duration_since(UNIX_EPOCH).unwrap());
        assert_eq!(at("1970-01-01T00:00:00Z"), Some(Duration::ZERO));
        // Checked with `date -u -d 2026-12-01T07:45:07Z +%s`.
        assert_eq!(
            at("2026-12-01T07:45:07Z"),
            Some(Duration::from_secs(1_796_111_107))
        );
        assert_eq!(
            at("2026-12-01T07:45:07.250Z"),
            Some(Duration::from_millis(1_796_111_107_250))
        );
        assert_eq!(
            at("2026-12-01T09:45:07+02:00"),
            Some(Duration::from_secs(1_796_111_107))
        );
        assert_eq!(
            at("2024-02-29T00:00:00Z"),
            Some(Duration::from_secs(1_709_164_800))
        );
        for bad in [
            "",
            "yesterday",
            "2026-13-01T00:00:00Z",
            "2026-12-01T25:00:00Z",
            "2026-12-01",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }
}

/// What the lifecycle asks to create.
#[derive(Clone, PartialEq, Eq)]
pub struct CreateGuest {
    /// Unique name, minted before the call.
    pub name: String,
    /// Shape id.
    pub shape: String,
    /// Rootfs name or template id.
    pub rootfs: String,
    /// Environment declared at create (exec may only use declared keys).
    pub envs: BTreeMap<String, String>,
    /// Egress allowlist.
    pub egress: Vec<String>,
    /// Idle pause backstop, in seconds (>= 60).
    pub auto_pause_after_seconds: u32,
}

impl fmt::Debug for CreateGuest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Env values may be secrets: show names only.
        f.debug_struct("CreateGuest")
            .field("name", &self.name)
            .field("shape", &self.shape)
            .field("rootfs", &self.rootfs)
            .field("envs", &self.envs.keys().collect::<Vec<_>>())
            .field("egress", &self.egress)
            .field("auto_pause_after_seconds", &self.auto_pause_after_seconds)
            .finish()
    }
}

/// A guest's lifecycle status, typed. Values this crate does not know are kept verbatim in
/// [`GuestStatus::Other`] and never fail a call.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GuestStatus {
    /// Being created.
    Creating,
    /// Running: exec, files and processes are served.
    #[default]
    Running,
    /// Being paused.
    Pausing,
    /// Paused (snapshot held); resume before use.
    Paused,
    /// Being resumed.
    Resuming,
    /// Being forked.
    Forking,
    /// Being destroyed (the name stays taken until `destroyed`).
    Destroying,
    /// Destroyed.
    Destroyed,
    /// Failed.
    Failed,
    /// Errored.
    Error,
    /// A status this crate does not know.
    Other(String),
}

impl GuestStatus {
    /// The wire spelling.
    pub fn as_str(&self) -> &str {
        match self {
            GuestStatus::Creating => "creating",
            GuestStatus::Running => "running",
            GuestStatus::Pausing => "pausing",
            GuestStatus::Paused => "paused",
            GuestStatus::Resuming => "resuming",
            GuestStatus::Forking => "forking",
            GuestStatus::Destroying => "destroying",
            GuestStatus::Destroyed => "destroyed",
            GuestStatus::Failed => "failed",
            GuestStatus::Error => "error",
            GuestStatus::Other(s) => s,
        }
    }

    /// `destroying`, `destroyed`, `failed` or `error`: the guest will never run again.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            GuestStatus::Destroying
                | GuestStatus::Destroyed
                | GuestStatus::Failed
                | GuestStatus::Error
        )
    }
}

impl From<&str> for GuestStatus {
    fn from(s: &str) -> Self {
        match s {
            "creating" => GuestStatus::Creating,
            "running" => GuestStatus::Running,
            "pausing" => GuestStatus::Pausing,
            "paused" => GuestStatus::Paused,
            "resuming" => GuestStatus::Resuming,
            "forking" => GuestStatus::Forking,
            "destroying" => GuestStatus::Destroying,
            "destroyed" => GuestStatus::Destroyed,
            "failed" => GuestStatus::Failed,
            "error" => GuestStatus::Error,
            other => GuestStatus::Other(other.to_owned()),
        }
    }
}

impl fmt::Display for GuestStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A guest as the control plane reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuestInfo {
    /// Sandbox id.
    pub id: String,
    /// Name, if reported.
    pub name: Option<String>,
    /// Lifecycle status.
    pub status: GuestStatus,
    /// Egress rules, if reported (absent means allow-all).
    pub egress: Option<Vec<String>>,
    /// Names of the environment variables declared at create, if reported (values are never
    /// returned).
    pub envs: Option<Vec<String>>,
    /// The idle auto-pause backstop in seconds; `None` when auto-pause is off (CreateOS then
    /// omits the key) or not reported.
    pub auto_pause_after_seconds: Option<u32>,
}

impl GuestInfo {
    /// `destroying`, `destroyed`, `failed` or `error`: nothing left to destroy or use.
    pub fn is_terminal(&self) -> bool {
        self.status.is_terminal()
    }
}

/// A listed guest and when it was created, if the control plane said
/// ([`ControlPlane::list_guests_aged`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgedGuest {
    /// The guest.
    pub info: GuestInfo,
    /// Its `created_at`, if reported and readable.
    pub created_at: Option<std::time::SystemTime>,
}

/// Reads an RFC 3339 timestamp (`2026-12-01T07:45:07.123Z`, or with a `±HH:MM` offset) as
/// a point in time; `None` when it is not one.
pub fn parse_rfc3339(text: &str) -> Option<std::time::SystemTime> {
    fn num(s: &str) -> Option<i64> {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    }
    let (date, rest) = text.trim().split_at_checked(10)?;
    let rest = rest.strip_prefix(['T', 't', ' '])?;
    let (year, month, day) = (
        num(date.get(0..4)?)?,
        num(date.get(5..7)?)?,
        num(date.get(8..10)?)?,
    );
    if date.as_bytes().get(4) != Some(&b'-') || date.as_bytes().get(7) != Some(&b'-') {
        return None;
    }
    let (clock, zone) = match rest.find(['Z', 'z', '+', '-']) {
        Some(at) => rest.split_at(at),
        None => return None,
    };
    let (hms, frac) = clock.split_once('.').unwrap_or((clock, ""));
    let mut hms = hms.split(':');
    let (hh, mm, ss) = (num(hms.next()?)?, num(hms.next()?)?, num(hms.next()?)?);
    if hms.next().is_some() || !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    if hh > 23 || mm > 59 || ss > 60 || (!frac.is_empty() && num(frac).is_none()) {
        return None;
    }
    let offset = match zone {
        "Z" | "z" => 0,
        signed => {
            let sign = if signed.starts_with('-') { -1 } else { 1 };
            let (oh, om) = signed.get(1..)?.split_once(':')?;
            sign * (num(oh)? * 3600 + num(om)? * 60)
        }
    };
    // Days since 1970-01-01 of a proleptic Gregorian date.
    let (yy, mp) = if month <= 2 {
        (year - 1, month + 9)
    } else {
        (year, month - 3)
    };
    let era = yy.div_euclid(400);
    let yoe = yy - era * 400;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hh * 3600 + mm * 60 + ss - offset;
    let nanos: u32 = if frac.is_empty() {
        0
    } else {
        let digits: String = frac.chars().chain(std::iter::repeat('0')).take(9).collect();
        digits.parse().ok()?
    };
    let base = std::time::UNIX_EPOCH;
    let whole = if secs >= 0 {
        base.checked_add(Duration::from_secs(u64::try_from(secs).ok()?))?
    } else {
        base.checked_sub(Duration::from_secs(secs.unsigned_abs()))?
    };
    whole.checked_add(Duration::from_nanos(u64::from(nanos)))
}

/// One command to run in a guest.
#[derive(Clone, PartialEq, Eq)]
pub struct ExecRequest {
    /// Program (no shell; see [`crate::exec::Command`] for the shell form).
    pub cmd: String,
    /// Arguments.
    pub args: Vec<String>,
    /// Environment for this command; every key must have been declared at create.
    pub env: BTreeMap<String, String>,
    /// Standard input (empty: none).
    pub stdin: String,
    /// HTTP budget of the whole stream.
    pub timeout: Duration,
}

impl fmt::Debug for ExecRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Env values, stdin and the arguments (a script, an inline program) may be secrets:
        // names and sizes only.
        f.debug_struct("ExecRequest")
            .field("cmd", &self.cmd)
            .field("arg_bytes", &arg_sizes(&self.args))
            .field("env", &self.env.keys().collect::<Vec<_>>())
            .field("stdin_bytes", &self.stdin.len())
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// A file download as it arrives: the declared length, if any, and the body in chunks.
/// Dropping it stops the transfer.
pub struct Download {
    /// `Content-Length`, when the server declared one.
    pub content_length: Option<u64>,
    /// The body.
    pub body: BoxStream<'static, Result<Bytes, CallError>>,
}

impl fmt::Debug for Download {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Download")
            .field("content_length", &self.content_length)
            .finish_non_exhaustive()
    }
}

fn unsupported<T: Send + 'static>(what: &str) -> BoxFuture<'static, Result<T, CallError>> {
    let e = CallError::new(
        CallFailure::Config,
        format!("this control plane cannot {what}"),
    );
    Box::pin(futures::future::ready(Err(e)))
}

/// The size of each argument (what `Debug` shows instead of the text).
fn arg_sizes(args: &[String]) -> Vec<usize> {
    args.iter().map(String::len).collect()
}

/// A long-lived process to start in a guest (`POST …/processes`): it outlives the request
/// that started it and ends with the guest. `Debug` shows the arguments' sizes, not their
/// text.
#[derive(Clone, PartialEq, Eq)]
pub struct ProcessSpec {
    /// Program (no shell).
    pub cmd: String,
    /// Arguments.
    pub args: Vec<String>,
    /// Working directory in the guest (empty: the control plane's default).
    pub cwd: String,
}

impl fmt::Debug for ProcessSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProcessSpec")
            .field("cmd", &self.cmd)
            .field("arg_bytes", &arg_sizes(&self.args))
            .field("cwd", &self.cwd)
            .finish()
    }
}

/// One event of a streaming exec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecFrame {
    /// A chunk of standard output.
    Stdout(String),
    /// A chunk of standard error.
    Stderr(String),
    /// The process exited with this status, exactly as the agent reported it (a value outside
    /// 0..=255 is not a process status, and the lifecycle treats it as a protocol failure).
    Exit(i64),
    /// The agent reported an error (e.g. the command could not start).
    Error(String),
    /// Keep-alive.
    Heartbeat,
}

/// A stream of exec frames.
pub type ExecStream = BoxStream<'static, Result<ExecFrame, CallError>>;

/// A template's build status.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TemplateStatus {
    /// Accepted or being built.
    Building,
    /// Built: usable as a guest's rootfs.
    Ready,
    /// The build failed (its log says why).
    Failed,
    /// A status this crate does not know, verbatim.
    Other(String),
}

impl fmt::Display for TemplateStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TemplateStatus::Building => "building",
            TemplateStatus::Ready => "ready",
            TemplateStatus::Failed => "failed",
            TemplateStatus::Other(s) => s,
        })
    }
}

/// A template (a custom guest image) as the control plane reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateInfo {
    /// Its id: usable as a guest's rootfs once ready.
    pub id: String,
    /// Its name.
    pub name: String,
    /// Its build status.
    pub status: TemplateStatus,
}

/// One line of a template's build log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateLogLine {
    /// The text, as the build wrote it (not redacted yet).
    pub line: String,
    /// The last line of the build; the stream ends after it.
    pub is_final: bool,
}

/// A template's build log as it is written.
pub type TemplateLogStream = BoxStream<'static, Result<TemplateLogLine, CallError>>;

/// The operations a guest lifecycle needs from a control plane.
pub trait ControlPlane: Send + Sync + 'static {
    /// Checks the credential (`GET /v1/whoami`); returns a short account label for logs.
    fn check_credential(&self) -> BoxFuture<'_, Result<String, CallError>>;
    /// The shape catalog.
    fn list_shapes(&self) -> BoxFuture<'_, Result<Vec<Shape>, CallError>>;
    /// Creates a guest. Never retried by the implementation.
    fn create(&self, req: CreateGuest) -> BoxFuture<'_, Result<GuestInfo, CallError>>;
    /// Finds a non-terminal guest by exact name.
    fn find_by_name(&self, name: String) -> BoxFuture<'_, Result<Option<GuestInfo>, CallError>>;
    /// Reads a guest's stored egress rules (`None` = absent = allow-all).
    fn egress(&self, id: String) -> BoxFuture<'_, Result<Option<Vec<String>>, CallError>>;
    /// Writes a file in the guest.
    fn upload(&self, id: String, path: String, data: Bytes)
    -> BoxFuture<'_, Result<(), CallError>>;
    /// Starts a streaming exec; [`ExecRequest::timeout`] is the HTTP budget for the whole
    /// stream. Never retried by the implementation. Dropping the stream stops the command.
    fn exec_stream(
        &self,
        id: String,
        req: ExecRequest,
    ) -> BoxFuture<'_, Result<ExecStream, CallError>>;
    /// Starts a long-lived process in the guest and returns its process id. Never retried by
    /// the implementation (a retry could start it twice).
    ///
    /// The default answers a [`CallFailure::Config`] error; only the executor's warm pool
    /// (a preloaded runner) needs it.
    fn spawn_process(
        &self,
        id: String,
        spec: ProcessSpec,
    ) -> BoxFuture<'_, Result<String, CallError>> {
        unsupported(&format!("start a process ({:?}) in guest {id}", spec.cmd))
    }

    /// Destroys a guest; a guest that is already gone (404) counts as destroyed.
    fn destroy(&self, id: String) -> BoxFuture<'_, Result<(), CallError>>;
    /// Lists every guest whose name starts with `prefix`, whatever its status. The
    /// implementation bounds the walk (pages and total time) and fails rather than hang.
    ///
    /// The default answers a [`CallFailure::Config`] error ("cannot list"), so a control plane
    /// that only runs programs (a test double) need not implement it; only the orphan sweep
    /// ([`crate::orphans`]) uses it.
    fn list_guests(&self, prefix: String) -> BoxFuture<'_, Result<Vec<GuestInfo>, CallError>> {
        unsupported(&format!("list guests (prefix {prefix:?})"))
    }

    /// Like [`ControlPlane::list_guests`], with each guest's creation time. The default
    /// lists without times (every `created_at` is `None`).
    fn list_guests_aged(&self, prefix: String) -> BoxFuture<'_, Result<Vec<AgedGuest>, CallError>> {
        Box::pin(async move {
            let guests = self.list_guests(prefix).await?;
            Ok(guests
                .into_iter()
                .map(|info| AgedGuest {
                    info,
                    created_at: None,
                })
                .collect())
        })
    }

    /// Reads one guest by id (status, egress, declared env names).
    ///
    /// The default answers a [`CallFailure::Config`] error; only named guests
    /// ([`crate::guest::Guest::acquire`]) need it.
    fn get(&self, id: String) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        unsupported(&format!("read guest {id}"))
    }

    /// Sets a guest's idle auto-pause backstop (`PATCH /v1/sandboxes/{id}` with
    /// `auto_pause_after_seconds`, 60..=86400) and returns the guest as the answer shows it.
    ///
    /// The default answers a [`CallFailure::Config`] error; only named guests need it
    /// ([`crate::guest::Guest::acquire`] raises an adopted guest's backstop to cover the run).
    fn set_auto_pause(
        &self,
        id: String,
        seconds: u32,
    ) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        unsupported(&format!("set the auto-pause of guest {id} to {seconds}s"))
    }

    /// Asks a paused guest to resume; the answer usually says `resuming`.
    ///
    /// The default answers a [`CallFailure::Config`] error; only named guests need it.
    fn resume(&self, id: String) -> BoxFuture<'_, Result<GuestInfo, CallError>> {
        unsupported(&format!("resume guest {id}"))
    }

    /// Starts building the template `name` from `dockerfile` (`POST /v1/templates`). Never
    /// retried by the implementation; a name already taken answers 409.
    ///
    /// The default answers a [`CallFailure::Config`] error; only the executor's template build
    /// needs it (as do the two calls below).
    fn create_template(
        &self,
        name: String,
        dockerfile: String,
    ) -> BoxFuture<'_, Result<TemplateInfo, CallError>> {
        let _ = dockerfile;
        unsupported(&format!("build the template {name:?}"))
    }

    /// Reads a template by id or name.
    fn get_template(&self, id_or_name: String) -> BoxFuture<'_, Result<TemplateInfo, CallError>> {
        unsupported(&format!("read the template {id_or_name:?}"))
    }

    /// Follows a template's build log until its final line.
    fn follow_template_log(
        &self,
        id: String,
    ) -> BoxFuture<'_, Result<TemplateLogStream, CallError>> {
        unsupported(&format!("follow the build log of template {id:?}"))
    }

    /// Starts downloading the file at `path` in the guest. `max_bytes` is a hint the
    /// implementation may enforce too; [`crate::guest::Guest::download`] always enforces it.
    ///
    /// The default answers a [`CallFailure::Config`] error.
    fn download(
        &self,
        id: String,
        path: String,
        max_bytes: Option<u64>,
    ) -> BoxFuture<'_, Result<Download, CallError>> {
        let _ = max_bytes;
        unsupported(&format!("download {path:?} from guest {id}"))
    }
}
