//! The crate's single error type and its classification.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::HeaderMap;
use reqwest::{Method, StatusCode};

/// Result alias used by every fallible call in this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Boxed error source kept inside [`Error`] variants.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Everything that can go wrong when talking to CreateOS.
///
/// Every message, body and header kept here has had the API key and any delegated
/// access token replaced by `[REDACTED]`, including when a server reflects them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server answered with a non-2xx status.
    #[error("{0}")]
    Api(Box<ApiError>),
    /// No API key (or access token) is configured for an endpoint that needs one.
    /// Nothing was sent.
    #[error("authentication error: {0}")]
    Auth(String),
    /// The client configuration is invalid (base URL, key, injected HTTP client ...).
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A caller-supplied argument was refused before anything was sent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The request could not be sent or the response could not be read
    /// (connect, TLS, reset, body read).
    #[error("{method} {endpoint}: transport error: {message}")]
    Transport {
        /// HTTP method.
        method: Method,
        /// Endpoint path as passed to the client (no base URL).
        endpoint: String,
        /// A redacted description.
        message: String,
        /// The underlying error.
        #[source]
        source: BoxError,
    },
    /// An HTTP timeout elapsed (request, or idle time between two body chunks).
    #[error("{method} {endpoint}: timed out after {after:?}")]
    Timeout {
        /// HTTP method.
        method: Method,
        /// Endpoint path.
        endpoint: String,
        /// The timeout that elapsed.
        after: Duration,
    },
    /// The server's answer does not follow the contract: bad JSend envelope,
    /// undecodable JSON, a redirect, a malformed stream frame, an over-long stream line.
    #[error("protocol error: {message}")]
    Protocol {
        /// A redacted description.
        message: String,
        /// The decode error, when there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// A transfer exceeded the caller's byte cap.
    #[error("{what} exceeds the limit of {limit} bytes")]
    TooLarge {
        /// What was too large (e.g. "download of /workspace/x (Content-Length 9000)").
        what: String,
        /// The configured cap in bytes.
        limit: u64,
    },
    /// `shell()` ran a command that exited non-zero or reported an agent error.
    #[error("{0}")]
    CommandFailed(Box<CommandFailure>),
    /// A polling budget (`wait_until_*`, `wait_for_port`) ran out.
    #[error("operation timed out after {after:?}: {operation}")]
    OperationTimeout {
        /// What was being waited for.
        operation: String,
        /// The budget that ran out.
        after: Duration,
    },
    /// A sandbox reached a state from which the awaited state cannot follow
    /// (e.g. `failed` while waiting for `running`).
    #[error("sandbox {id} is {status} while waiting for {wanted}")]
    UnexpectedState {
        /// Sandbox id.
        id: String,
        /// The status seen.
        status: crate::SandboxStatus,
        /// The awaited status.
        wanted: crate::SandboxStatus,
    },
    /// Reading an upload source failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// A coarse classification of [`Error`], stable enough to build policies on
/// (fail closed vs retry, 404 vs 409 ...). Modelled on aws-smithy's `ErrorKind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// No credential configured, or HTTP 401 / 403.
    Auth,
    /// Bad configuration or a refused argument; nothing was sent.
    Config,
    /// HTTP 404.
    NotFound,
    /// HTTP 409 (paused sandbox, duplicate name, second token ...).
    Conflict,
    /// Another 4xx (400, 422 ...); never retryable.
    InvalidRequest,
    /// HTTP 429.
    RateLimited,
    /// HTTP 5xx (503 = no capacity / not ready).
    Unavailable,
    /// Connect/reset/body-read failure.
    Transport,
    /// An HTTP timeout: the client's own, or a server's 408 Request Timeout. Retryable.
    Timeout,
    /// The server broke the wire contract.
    Protocol,
    /// A byte cap was exceeded.
    TooLarge,
    /// `shell()` saw a failing command.
    CommandFailed,
    /// A polling budget ran out.
    OperationTimeout,
    /// The sandbox reached a terminal or unexpected state.
    UnexpectedState,
    /// Local I/O failure.
    Io,
}

impl Error {
    /// The coarse classification of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Api(api) => match api.status.as_u16() {
                401 | 403 => ErrorKind::Auth,
                404 => ErrorKind::NotFound,
                408 => ErrorKind::Timeout,
                409 => ErrorKind::Conflict,
                429 => ErrorKind::RateLimited,
                500..=599 => ErrorKind::Unavailable,
                _ => ErrorKind::InvalidRequest,
            },
            Error::Auth(_) => ErrorKind::Auth,
            Error::Config(_) | Error::InvalidArgument(_) => ErrorKind::Config,
            Error::Transport { .. } => ErrorKind::Transport,
            Error::Timeout { .. } => ErrorKind::Timeout,
            Error::Protocol { .. } => ErrorKind::Protocol,
            Error::TooLarge { .. } => ErrorKind::TooLarge,
            Error::CommandFailed(_) => ErrorKind::CommandFailed,
            Error::OperationTimeout { .. } => ErrorKind::OperationTimeout,
            Error::UnexpectedState { .. } => ErrorKind::UnexpectedState,
            Error::Io(_) => ErrorKind::Io,
        }
    }

    /// Whether trying the same operation again may succeed: 408, 429, 5xx, transport
    /// failures and HTTP timeouts. This says nothing about whether a retry is *safe*
    /// (a POST may already have taken effect); the client's own retries apply
    /// the stricter per-method rules.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Api(api) => matches!(api.status.as_u16(), 408 | 429 | 500..=599),
            Error::Transport { .. } | Error::Timeout { .. } => true,
            _ => false,
        }
    }

    /// The HTTP status of an API error.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Error::Api(api) => Some(api.status),
            _ => None,
        }
    }

    /// The `X-Request-ID` of an API error, when the server sent one.
    pub fn request_id(&self) -> Option<&str> {
        match self {
            Error::Api(api) if !api.request_id.is_empty() => Some(&api.request_id),
            _ => None,
        }
    }

    /// The API error payload, if this is one.
    pub fn as_api(&self) -> Option<&ApiError> {
        match self {
            Error::Api(api) => Some(api),
            _ => None,
        }
    }

    /// Whether this is a refused redirect: the server answered a 3xx (or the HTTP client
    /// followed one), which this client never accepts. Such an error is an
    /// [`ErrorKind::Protocol`] whose source is a [`RedirectRefused`]; test it with this
    /// method rather than by matching words in the message.
    pub fn is_redirect(&self) -> bool {
        self.redirect_details().is_some()
    }

    /// The details of a refused redirect (see [`Error::is_redirect`]).
    pub fn redirect_details(&self) -> Option<&RedirectRefused> {
        match self {
            Error::Protocol {
                source: Some(src), ..
            } => src.downcast_ref::<RedirectRefused>(),
            _ => None,
        }
    }

    /// A protocol error for a refused redirect.
    pub(crate) fn redirect(
        message: impl Into<String>,
        status: Option<StatusCode>,
        cross_origin: bool,
    ) -> Self {
        Error::Protocol {
            message: message.into(),
            source: Some(Box::new(RedirectRefused {
                status,
                cross_origin,
            })),
        }
    }

    pub(crate) fn protocol(message: impl Into<String>) -> Self {
        Error::Protocol {
            message: message.into(),
            source: None,
        }
    }

    pub(crate) fn protocol_with(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::Protocol {
            message: message.into(),
            source: Some(source.into()),
        }
    }
}

/// Why a redirect was refused: the source of the [`Error::Protocol`] that
/// [`Error::is_redirect`] recognises. The `Location` is not kept (it may carry a token).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct RedirectRefused {
    /// The 3xx status the server answered; `None` when an injected HTTP client followed the
    /// redirect itself before this client saw it.
    pub status: Option<StatusCode>,
    /// Whether the `Location` pointed at an origin other than the base URL's.
    pub cross_origin: bool,
}

impl fmt::Display for RedirectRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.status {
            Some(s) => write!(f, "HTTP {} redirect refused", s.as_u16()),
            None => f.write_str("followed redirect refused"),
        }
    }
}

impl std::error::Error for RedirectRefused {}

/// A non-2xx answer from the control plane, with everything needed to act on it.
#[derive(Clone)]
#[non_exhaustive]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Upper-case HTTP method.
    pub method: Method,
    /// The endpoint path as the client passed it (no base URL, no query).
    pub endpoint: String,
    /// JSend `code` (0 when absent or the body is not JSend).
    pub code: i64,
    /// The human message: envelope `message`, else string `data`, else `key: value; ...`
    /// of a `data` map, else `"request failed"`. Redacted.
    pub message: String,
    /// `X-Request-ID` response header (empty when absent).
    pub request_id: String,
    /// The response body, read to at most [`MAX_ERROR_BODY`] bytes, redacted. A body cut at
    /// that bound also loses the longest secret's length less one byte at the cut, whatever
    /// they hold (see [`crate::MIN_SECRET_FRAGMENT`]).
    pub body: Bytes,
    /// Whether the body was longer than [`MAX_ERROR_BODY`] and was cut.
    pub body_truncated: bool,
    /// Parsed `Retry-After`, when present and valid.
    pub retry_after: Option<Duration>,
    /// Response headers (credential-bearing ones removed, values redacted).
    pub headers: HeaderMap,
}

/// The largest error body kept in an [`ApiError`]: 4 MiB.
pub const MAX_ERROR_BODY: usize = 4 * 1024 * 1024;

/// The most bytes of a server's own words an error's message quotes (its `message`, a
/// protocol failure's text), before escaping: the text is one line, its control, line-break and
/// bidirectional characters shown as escapes (see the `outside-text` crate). The whole body
/// stays in [`ApiError::body`].
pub const MAX_MESSAGE_BYTES: usize = 2048;

impl ApiError {
    /// The body as (lossy) UTF-8 text.
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}: HTTP {}: {}",
            self.method,
            self.endpoint,
            self.status.as_u16(),
            self.message
        )
    }
}

impl fmt::Debug for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiError")
            .field("status", &self.status)
            .field("method", &self.method)
            .field("endpoint", &self.endpoint)
            .field("code", &self.code)
            .field("message", &self.message)
            .field("request_id", &self.request_id)
            .field("body_len", &self.body.len())
            .field("body_truncated", &self.body_truncated)
            .field("retry_after", &self.retry_after)
            .finish_non_exhaustive()
    }
}

/// Details of a command that `shell()` treated as failed.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct CommandFailure {
    /// The exit code (`None` when the agent reported an error before the command ran).
    pub exit_code: Option<i64>,
    /// The agent-level error, if any.
    pub error: Option<String>,
    /// The last 2000 characters of stderr.
    pub stderr_tail: String,
    /// The full response.
    pub response: crate::RunCommandResponse,
}

impl fmt::Display for CommandFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "command failed")?;
        if let Some(code) = self.exit_code {
            write!(f, " with exit code {code}")?;
        }
        if let Some(err) = &self.error {
            write!(f, ": {err}")?;
        }
        if !self.stderr_tail.is_empty() {
            write!(f, "; stderr: {}", self.stderr_tail)?;
        }
        Ok(())
    }
}
