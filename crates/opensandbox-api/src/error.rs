//! The crate's one error type, and a classification to build policies on.

use std::fmt;
use std::time::Duration;

use reqwest::{Method, StatusCode};

/// Result alias of every fallible call in this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A boxed error kept as the source of an [`Error`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// A failed call to an OpenSandbox server, or through its proxy to execd.
///
/// Nothing in it needs cleaning before a log line: server text (bodies, headers, frames) and
/// transport messages arrive here without the API key or a call's own secrets, on one line
/// and cut to a bound.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The server (or execd behind the proxy) answered with a non-2xx status.
    #[error("{0}")]
    Api(Box<ApiError>),
    /// The client's settings are unusable (domain, key, timeouts, retry policy). Nothing was
    /// sent.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// An argument was refused before anything was sent.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The request could not be sent or its answer not read (connect, TLS, reset).
    #[error("{route}: transport error: {message}")]
    Transport {
        /// The request.
        route: Route,
        /// What failed, scrubbed and on one line.
        message: String,
        /// The same text as an error (the HTTP client's own error is not kept: its chain can
        /// quote a URL).
        #[source]
        source: BoxError,
    },
    /// A request's timeout elapsed, or a command stream's overall deadline.
    #[error("{route}: timed out after {after:?}")]
    Timeout {
        /// The request.
        route: Route,
        /// The timeout.
        after: Duration,
    },
    /// A command stream received no frame, or a download no chunk, for its idle period: the
    /// sandbox stopped answering. A paused sandbox produces exactly this, since execd's
    /// keep-alive pings stop with it.
    #[error("{route}: nothing received for {after:?} (idle sandbox or stalled stream)")]
    Idle {
        /// The request.
        route: Route,
        /// The idle period.
        after: Duration,
    },
    /// The answer breaks the protocol: undecodable JSON, a redirect, an invalid frame.
    #[error("protocol error: {message}")]
    Protocol {
        /// A scrubbed, one-line description.
        message: String,
        /// The underlying error, when there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// A body, a frame or a line passed the cap that bounds it.
    #[error("{what} exceeds the limit of {limit} bytes")]
    TooLarge {
        /// What was too large.
        what: String,
        /// The cap, in bytes.
        limit: u64,
    },
    /// A polling wait (`wait_until_running`, `wait_until_ready`) used up its budget.
    #[error("{what}: not reached within {after:?}{}", last.as_ref().map(|e| format!(" (last: {e})")).unwrap_or_default())]
    WaitExpired {
        /// What was awaited.
        what: String,
        /// The budget.
        after: Duration,
        /// The last error seen while polling, if any.
        last: Option<Box<Error>>,
    },
    /// A sandbox reached a state the awaited one cannot follow (`Failed` while waiting for
    /// `Running`).
    #[error("sandbox {id} is {state} while waiting for {wanted}")]
    UnexpectedState {
        /// Sandbox id.
        id: String,
        /// The state seen, as the server spells it (`Failed`).
        state: String,
        /// The state awaited (`Running`).
        wanted: String,
    },
    /// Writing a download to a local sink failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// A coarse classification of [`Error`] (after aws-smithy's `ErrorKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// HTTP 401 or 403 (a missing or wrong `OPEN-SANDBOX-API-KEY`).
    Auth,
    /// HTTP 404.
    NotFound,
    /// HTTP 409 (a second pause, a snapshot still being created ...).
    Conflict,
    /// Another 4xx (400, 416, 422 ...): never worth repeating.
    InvalidRequest,
    /// HTTP 429.
    RateLimited,
    /// HTTP 5xx (502 from the proxy: execd or the egress sidecar not reachable).
    Unavailable,
    /// Connect, TLS or read failure.
    Transport,
    /// A timeout (the client's, or a server's 408).
    Timeout,
    /// A stream without a frame for its idle period.
    Idle,
    /// The server broke the protocol.
    Protocol,
    /// A cap was passed.
    TooLarge,
    /// Unusable settings or a refused argument; nothing was sent.
    Config,
    /// A polling wait ran out, or its target state cannot be reached.
    Wait,
    /// Local I/O failed.
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
            Error::Config(_) | Error::InvalidArgument(_) => ErrorKind::Config,
            Error::Transport { .. } => ErrorKind::Transport,
            Error::Timeout { .. } => ErrorKind::Timeout,
            Error::Idle { .. } => ErrorKind::Idle,
            Error::Protocol { .. } => ErrorKind::Protocol,
            Error::TooLarge { .. } => ErrorKind::TooLarge,
            Error::WaitExpired { .. } | Error::UnexpectedState { .. } => ErrorKind::Wait,
            Error::Io(_) => ErrorKind::Io,
        }
    }

    /// Whether the same call may succeed later: 408, 429, 5xx, transport failures and
    /// timeouts. It says nothing about whether repeating is *safe*: a create that timed out
    /// may have created a sandbox (see [`crate::Client::find_by_metadata`]). An [`Error::Idle`]
    /// is not retryable: the sandbox stopped answering, and a command may have run.
    ///
    /// An image the server could not pull ([`Error::is_image_pull_failure`]) is not
    /// retryable either, though it is a 500: the same image fails the same way until someone
    /// changes the image or the registry.
    ///
    /// Nor is a TLS failure ([`Error::is_tls_failure`]): a certificate the client's roots do
    /// not vouch for is refused the same way on every attempt.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Api(_) if self.is_image_pull_failure() => false,
            Error::Transport { .. } if self.is_tls_failure() => false,
            Error::Api(api) => matches!(api.status.as_u16(), 408 | 429 | 500..=599),
            Error::Transport { .. } | Error::Timeout { .. } => true,
            _ => false,
        }
    }

    /// Whether the server could not pull the sandbox's image: the image does not exist, or the
    /// server's registry does not have it or refuses it. Nothing was left behind.
    ///
    /// - Docker: a 500 `DOCKER::SANDBOX_IMAGE_PULL_FAILED` from the create.
    /// - Kubernetes: the create waits for the pod, and OpenSandbox's controller marks the
    ///   `BatchSandbox` `Failed` as soon as a container waits in `ErrImagePull` or
    ///   `ImagePullBackOff`; the create then answers a 500 `KUBERNETES::POD_FAILED` whose
    ///   message carries the controller's summary (`Sandbox <id> failed: 1/1 observed pods
    ///   failed; primary reason=ErrImagePull; sample pod=...`) and deletes the workload.
    ///   [`is_image_pull_message`] tells such a message from a crash or a configuration error.
    pub fn is_image_pull_failure(&self) -> bool {
        match self.code() {
            Some(c) if c.ends_with("::SANDBOX_IMAGE_PULL_FAILED") => true,
            Some("KUBERNETES::POD_FAILED") => self
                .as_api()
                .is_some_and(|a| is_image_pull_message(&a.message)),
            _ => false,
        }
    }

    /// The HTTP status of an API error.
    pub fn status(&self) -> Option<StatusCode> {
        self.as_api().map(|a| a.status)
    }

    /// The server's error `code` (e.g. `DOCKER::SANDBOX_NOT_FOUND`), when it sent one.
    pub fn code(&self) -> Option<&str> {
        self.as_api()
            .map(|a| a.code.as_str())
            .filter(|c| !c.is_empty())
    }

    /// The `X-Request-ID` of an API error, when the server sent one.
    pub fn request_id(&self) -> Option<&str> {
        self.as_api()
            .map(|a| a.request_id.as_str())
            .filter(|r| !r.is_empty())
    }

    /// The API error, if this is one.
    pub fn as_api(&self) -> Option<&ApiError> {
        match self {
            Error::Api(api) => Some(api),
            _ => None,
        }
    }

    /// Whether this is a refused redirect. Redirects are never followed (the `Location` could
    /// send the key elsewhere); a 3xx answer is an [`ErrorKind::Protocol`] error whose source
    /// is a [`RedirectRefused`].
    pub fn is_redirect(&self) -> bool {
        matches!(self, Error::Protocol { source: Some(s), .. } if s.is::<RedirectRefused>())
    }

    /// Whether the TLS handshake with the server failed (an [`ErrorKind::Transport`] error whose
    /// source is a [`TlsFailure`]): most often a certificate that no trusted root vouches for
    /// (a private CA the client was not given: see
    /// [`crate::ClientBuilder::ca_certificates_pem`]), one for another name, or expired; also
    /// a server that does not speak TLS on an `https://` URL. Not retryable.
    pub fn is_tls_failure(&self) -> bool {
        matches!(self, Error::Transport { source, .. } if source.is::<TlsFailure>())
    }

    pub(crate) fn protocol(message: impl Into<String>) -> Self {
        Error::Protocol {
            message: message.into(),
            source: None,
        }
    }
}

/// The request an error is about: its method and its path below the base URL (no query,
/// escaped onto one line). Shown as `POST /sandboxes/sb-1/proxy/44772/command`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// HTTP method.
    pub method: Method,
    /// The path below the base URL.
    pub path: String,
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.method, self.path)
    }
}

/// The source of the [`Error::Protocol`] a 3xx answer becomes (see [`Error::is_redirect`]).
/// The `Location` is not kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedirectRefused {
    /// The status answered.
    pub status: StatusCode,
}

impl fmt::Display for RedirectRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HTTP {} redirect refused", self.status.as_u16())
    }
}

impl std::error::Error for RedirectRefused {}

/// The source of the [`Error::Transport`] a failed TLS handshake becomes (see
/// [`Error::is_tls_failure`]): the TLS library's reason, on one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFailure {
    /// What the TLS library said (`invalid peer certificate: UnknownIssuer`).
    pub reason: String,
}

impl fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TLS handshake failed: {}", self.reason)
    }
}

impl std::error::Error for TlsFailure {}

/// Whether a Kubernetes pod failure summary (a `KUBERNETES::POD_FAILED` message, or a `Failed`
/// sandbox's status message) names an image pull as the reason: OpenSandbox's controller
/// writes `primary reason=ErrImagePull` or `primary reason=ImagePullBackOff` (the kubelet's
/// waiting reasons) when a container cannot get its image.
pub fn is_image_pull_message(message: &str) -> bool {
    ["ErrImagePull", "ImagePullBackOff"]
        .iter()
        .any(|r| message.contains(&format!("reason={r}")))
}

/// A non-2xx answer: the status, the server's `{code, message}`, its `X-Request-ID` and the
/// start of the body, all scrubbed, escaped and bounded.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// The request.
    pub route: Route,
    /// The body's `code` (`DOCKER::SANDBOX_NOT_FOUND`, `MISSING_API_KEY` ...); empty when absent.
    pub code: String,
    /// The body's `message`, else FastAPI's `detail`, else `"request failed"`.
    pub message: String,
    /// The `X-Request-ID` header; empty when absent.
    pub request_id: String,
    /// The start of the body, at most [`crate::MAX_SNIPPET_CHARS`] characters.
    pub snippet: String,
    /// Whether the body was longer than what was read of it.
    pub body_truncated: bool,
    /// `Retry-After` in seconds, when present and valid.
    pub retry_after: Option<Duration>,
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: HTTP {}", self.route, self.status.as_u16())?;
        if !self.code.is_empty() {
            write!(f, " {}", self.code)?;
        }
        write!(f, ": {}", self.message)?;
        if !self.request_id.is_empty() {
            write!(f, " (request id {})", self.request_id)?;
        }
        Ok(())
    }
}
