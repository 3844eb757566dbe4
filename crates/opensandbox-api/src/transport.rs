//! Sending requests: the key header, retries where they are safe, status checks, bounded body
//! reads, and the mapping of every failure to [`Error`].

use std::fmt::Write as _;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::stream::{self, BoxStream, StreamExt};
use reqwest::Method;
use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};
use secrecy::{ExposeSecret, SecretString};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::time::Instant;
use url::Url;

use crate::error::{ApiError, Error, RedirectRefused, Result, Route, TlsFailure};
use crate::retry::RetryPolicy;
use crate::scrub::{MAX_SNIPPET_CHARS, Scrubber, escape_line};

/// The header that carries the API key (sent on every request, execd's included).
pub const API_KEY_HEADER: &str = "OPEN-SANDBOX-API-KEY";

/// The most bytes of an error body read (64 KiB); the rest is dropped unread.
pub(crate) const MAX_ERROR_BODY: usize = 64 * 1024;
/// The most bytes of a JSON answer accepted (16 MiB).
pub(crate) const MAX_JSON_BODY: usize = 16 * 1024 * 1024;
/// The longest `X-Request-ID` kept, in characters.
const MAX_REQUEST_ID_CHARS: usize = 128;

/// Whether a call may be sent again after a failure that may have reached the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replay {
    /// Repeating it has the effect of sending it once (reads, deletes, `PUT`s ...).
    Safe,
    /// It must go out at most once (create, exec, upload, pause ...).
    Never,
}

/// A request body; cheap to clone, so a safe call can be sent again.
#[derive(Clone)]
pub(crate) enum Body {
    Empty,
    Json(Bytes),
    Raw(HeaderValue, Bytes),
}

/// One call to the server, as the operations of this crate describe it.
pub(crate) struct Call {
    pub(crate) method: Method,
    /// The path below the base URL, as raw segments (encoded when the URL is built).
    segments: Vec<String>,
    /// The path as errors show it.
    pub(crate) path: String,
    pub(crate) query: Vec<(&'static str, String)>,
    pub(crate) body: Body,
    pub(crate) replay: Replay,
    pub(crate) headers: HeaderMap,
    /// Overrides the client's timeout.
    pub(crate) timeout: Option<Duration>,
    /// Secrets of this call only (a registry password in a create body), scrubbed from its
    /// errors on top of the key.
    pub(crate) secrets: Vec<SecretString>,
}

impl Call {
    /// A call to the path made of `segments` (ids among them). An empty, `.` or `..` segment
    /// is refused: it would name another resource once the URL is normalised.
    pub(crate) fn new(method: Method, segments: &[&str], replay: Replay) -> Result<Call> {
        if let Some(bad) = segments
            .iter()
            .find(|s| s.is_empty() || **s == "." || **s == "..")
        {
            return Err(Error::InvalidArgument(format!(
                "{:?} cannot be an id or a path segment",
                escape_line(bad)
            )));
        }
        Ok(Call {
            method,
            path: escape_line(&format!("/{}", segments.join("/"))),
            segments: segments.iter().map(|s| (*s).to_owned()).collect(),
            query: Vec::new(),
            body: Body::Empty,
            replay,
            headers: HeaderMap::new(),
            timeout: None,
            secrets: Vec::new(),
        })
    }

    pub(crate) fn get(segments: &[&str]) -> Result<Call> {
        Call::new(Method::GET, segments, Replay::Safe)
    }

    /// The request, for errors.
    pub(crate) fn route(&self) -> Route {
        Route {
            method: self.method.clone(),
            path: self.path.clone(),
        }
    }

    pub(crate) fn query(mut self, name: &'static str, value: impl Into<String>) -> Call {
        self.query.push((name, value.into()));
        self
    }

    pub(crate) fn json(mut self, value: &impl serde::Serialize) -> Result<Call> {
        let bytes = serde_json::to_vec(value)
            .map_err(|e| Error::InvalidArgument(format!("cannot encode the request body: {e}")))?;
        self.body = Body::Json(bytes.into());
        Ok(self)
    }
}

/// The HTTP side of a [`crate::Client`]: pool, base URL, key and policies.
pub(crate) struct Transport {
    http: reqwest::Client,
    base: Url,
    key: SecretString,
    scrubber: Scrubber,
    pub(crate) timeout: Duration,
    pub(crate) retry: RetryPolicy,
    user_agent: HeaderValue,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("base_url", &self.base.as_str())
            .field("api_key", &"[REDACTED]")
            .field("timeout", &self.timeout)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl Transport {
    pub(crate) fn new(
        http: reqwest::Client,
        base: Url,
        key: SecretString,
        timeout: Duration,
        retry: RetryPolicy,
        user_agent: HeaderValue,
    ) -> Transport {
        let scrubber = Scrubber::default().with(key.expose_secret());
        Transport {
            http,
            base,
            key,
            scrubber,
            timeout,
            retry,
            user_agent,
        }
    }

    pub(crate) fn base_url(&self) -> &Url {
        &self.base
    }

    /// The key's scrubber plus the call's own secrets.
    pub(crate) fn scrubber_for(&self, call: &Call) -> Scrubber {
        call.secrets
            .iter()
            .fold(self.scrubber.clone(), |s, secret| {
                s.with(secret.expose_secret())
            })
    }

    fn request(&self, call: &Call) -> Result<reqwest::Request> {
        let mut url = self.base.clone();
        url.path_segments_mut()
            .map_err(|()| Error::Config("the base URL cannot take a path".into()))?
            .pop_if_empty()
            .extend(&call.segments);
        if !call.query.is_empty() {
            let mut pairs = url.query_pairs_mut();
            for (name, value) in &call.query {
                pairs.append_pair(name, value);
            }
        }
        let mut headers = call.headers.clone();
        headers
            .entry(header::ACCEPT)
            .or_insert(HeaderValue::from_static("application/json"));
        headers.insert(header::USER_AGENT, self.user_agent.clone());
        let mut key = HeaderValue::from_str(self.key.expose_secret())
            .map_err(|_| Error::Config("the API key is not a valid header value".into()))?;
        key.set_sensitive(true);
        headers.insert(HeaderName::from_static("open-sandbox-api-key"), key);
        let mut req = reqwest::Request::new(call.method.clone(), url);
        match &call.body {
            Body::Empty => {}
            Body::Json(bytes) => {
                headers.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                *req.body_mut() = Some(bytes.clone().into());
            }
            Body::Raw(content_type, bytes) => {
                headers.insert(header::CONTENT_TYPE, content_type.clone());
                *req.body_mut() = Some(bytes.clone().into());
            }
        }
        *req.headers_mut() = headers;
        Ok(req)
    }

    fn transport_error(call: &Call, scrub: &Scrubber, e: &reqwest::Error) -> Error {
        let mut message = e.to_string();
        let mut cause = std::error::Error::source(e);
        while let Some(c) = cause {
            let _ = write!(message, ": {c}");
            cause = c.source();
        }
        let message = scrub.snippet(&message, MAX_SNIPPET_CHARS, false);
        let source: crate::error::BoxError = match tls_reason(e) {
            Some(reason) => Box::new(TlsFailure {
                reason: scrub.snippet(&reason, MAX_SNIPPET_CHARS, false),
            }),
            None => message.clone().into(),
        };
        Error::Transport {
            route: call.route(),
            source,
            message,
        }
    }

    /// Sends one request and takes its answer's head: a redirect is refused, a non-2xx
    /// answer becomes [`Error::Api`] (its body read to at most [`MAX_ERROR_BODY`] bytes).
    async fn exchange(&self, call: &Call, scrub: &Scrubber) -> Result<reqwest::Response> {
        let resp = self
            .http
            .execute(self.request(call)?)
            .await
            .map_err(|e| Self::transport_error(call, scrub, &e))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(resp);
        }
        if status.is_redirection() {
            return Err(Error::Protocol {
                message: format!(
                    "{}: the server answered a redirect (HTTP {}); redirects are never followed",
                    call.route(),
                    status.as_u16()
                ),
                source: Some(Box::new(RedirectRefused { status })),
            });
        }
        let headers = resp.headers().clone();
        // The error body is read best effort: a body that breaks off still leaves the status.
        let (body, cut) = read_at_most(resp, MAX_ERROR_BODY).await.unwrap_or_default();
        let text = String::from_utf8_lossy(&body);
        let (code, message) = error_fields(&text);
        let request_id = headers
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .map(|v| scrub.snippet(v, MAX_REQUEST_ID_CHARS, false))
            .unwrap_or_default();
        Err(Error::Api(Box::new(ApiError {
            status,
            route: call.route(),
            code: scrub.snippet(&code, 128, false),
            message: scrub.snippet(&message, MAX_SNIPPET_CHARS, false),
            request_id,
            snippet: scrub.snippet(&text, MAX_SNIPPET_CHARS, cut),
            body_truncated: cut,
            retry_after: retry_after(&headers),
        })))
    }

    /// One attempt of a buffered call, bounded as a whole by the timeout; the answer's body.
    async fn attempt(&self, call: &Call, scrub: &Scrubber, cap: usize) -> Result<Bytes> {
        let timeout = call.timeout.unwrap_or(self.timeout);
        let exchange = async {
            let resp = self.exchange(call, scrub).await?;
            let too_large = || Error::TooLarge {
                what: format!("the answer to {}", call.route()),
                limit: cap as u64,
            };
            if resp.content_length().is_some_and(|n| n > cap as u64) {
                return Err(too_large());
            }
            match read_at_most(resp, cap).await {
                Ok((_, true)) => Err(too_large()),
                Ok((body, false)) => Ok(body),
                Err(e) => Err(Self::transport_error(call, scrub, &e)),
            }
        };
        tokio::time::timeout(timeout, exchange)
            .await
            .unwrap_or_else(|_| {
                Err(Error::Timeout {
                    route: call.route(),
                    after: timeout,
                })
            })
    }

    /// Runs `once` until it succeeds, fails for good, or the retry policy says stop. Only
    /// [`Replay::Safe`] calls are repeated.
    async fn with_retries<T, F, Fut>(&self, call: &Call, mut once: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let started = Instant::now();
        let mut attempt = 0u32;
        loop {
            let err = match once().await {
                Ok(answer) => return Ok(answer),
                Err(e) => e,
            };
            if call.replay == Replay::Never
                || attempt >= self.retry.max_retries
                || !err.is_retryable()
            {
                return Err(err);
            }
            let wait = self
                .retry
                .delay(attempt, err.as_api().and_then(|a| a.retry_after));
            if started.elapsed() + wait > self.retry.budget {
                return Err(err);
            }
            tracing::debug!(route = %call.route(), attempt, ?wait, error = %err, "repeating an opensandbox call");
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    /// A buffered call with retries; the answer's body read to at most `cap` bytes.
    pub(crate) async fn send(&self, call: &Call, cap: usize) -> Result<Bytes> {
        let scrub = self.scrubber_for(call);
        self.with_retries(call, || self.attempt(call, &scrub, cap))
            .await
    }

    /// A JSON call with retries, decoded into `T`.
    pub(crate) async fn json<T: DeserializeOwned>(&self, call: &Call) -> Result<T> {
        let body = self.send(call, MAX_JSON_BODY).await?;
        serde_json::from_slice(&body).map_err(|e| {
            let scrub = self.scrubber_for(call);
            let head = &body[..body.len().min(4096)];
            Error::protocol(format!(
                "{}: cannot decode the answer ({}); it starts with \"{}\"",
                call.route(),
                scrub.snippet(&e.to_string(), MAX_SNIPPET_CHARS, false),
                scrub.snippet(&String::from_utf8_lossy(head), 200, head.len() < body.len())
            ))
        })
    }

    /// Opens a streamed answer (a command stream, a download): its head must arrive within
    /// `wait`, else `on_wait` is the error. Safe calls are repeated until a head arrives; a
    /// body is never read twice.
    pub(crate) async fn open(
        &self,
        call: &Call,
        wait: Duration,
        on_wait: impl Fn() -> Error,
    ) -> Result<reqwest::Response> {
        let scrub = self.scrubber_for(call);
        self.with_retries(call, || async {
            tokio::time::timeout(wait, self.exchange(call, &scrub))
                .await
                .unwrap_or_else(|_| Err(on_wait()))
        })
        .await
    }

    /// The body of a streamed answer as chunks, each awaited at most `idle`. Dropping the
    /// stream drops the response, which closes the connection.
    pub(crate) fn chunks(
        &self,
        call: &Call,
        resp: reqwest::Response,
        idle: Duration,
    ) -> BoxStream<'static, Result<Bytes>> {
        let scrub = self.scrubber_for(call);
        let route = call.route();
        stream::unfold(Some(resp.bytes_stream()), move |state| {
            let scrub = scrub.clone();
            let route = route.clone();
            async move {
                let mut body = state?;
                match tokio::time::timeout(idle, body.next()).await {
                    Err(_) => Some((Err(Error::Idle { route, after: idle }), None)),
                    Ok(None) => None,
                    Ok(Some(Ok(chunk))) => Some((Ok(chunk), Some(body))),
                    Ok(Some(Err(e))) => {
                        let message = scrub.snippet(&e.to_string(), MAX_SNIPPET_CHARS, false);
                        let err = Error::Transport {
                            route,
                            source: message.clone().into(),
                            message,
                        };
                        Some((Err(err), None))
                    }
                }
            }
        })
        .boxed()
    }
}

/// The TLS library's reason, when `e` is a failed TLS handshake: a `rustls::Error` somewhere in
/// its chain, itself or inside `io::Error`s (the connector wraps it in two; an `io::Error`'s
/// `source` skips the error it wraps, so each is opened with `get_ref`).
fn tls_reason(e: &reqwest::Error) -> Option<String> {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        let mut inner: &(dyn std::error::Error + 'static) = c;
        loop {
            if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
                return Some(tls.to_string());
            }
            match inner
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::get_ref)
            {
                Some(wrapped) => inner = wrapped,
                None => break,
            }
        }
        cause = c.source();
    }
    None
}

/// At most `cap` bytes of an answer's body, and whether there was more (the rest is left
/// unread).
async fn read_at_most(mut resp: reqwest::Response, cap: usize) -> reqwest::Result<(Bytes, bool)> {
    let mut body = BytesMut::new();
    while let Some(chunk) = resp.chunk().await? {
        let room = cap - body.len();
        if chunk.len() > room {
            body.extend_from_slice(&chunk[..room]);
            return Ok((body.freeze(), true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body.freeze(), false))
}

/// `Retry-After` in (possibly fractional) seconds; dates and garbage are ignored.
fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    let secs: f64 = headers
        .get(header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs.min(3600.0)))
}

/// The `code` and message of an error body: `{code, message}` as the server writes it, else
/// FastAPI's `{detail}` (a string, a `{code, message}` object, or a list of validation
/// errors of which the first `msg` is kept), else `"request failed"`.
fn error_fields(body: &str) -> (String, String) {
    let fallback = || (String::new(), "request failed".to_owned());
    let Ok(Value::Object(obj)) = serde_json::from_str::<Value>(body) else {
        return fallback();
    };
    let text = |v: Option<&Value>| match v {
        Some(Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(Value::Number(n)) => Some(n.to_string()),
        _ => None,
    };
    let code = text(obj.get("code")).unwrap_or_default();
    if let Some(message) = text(obj.get("message")) {
        return (code, message);
    }
    match obj.get("detail") {
        Some(Value::String(s)) if !s.is_empty() => (code, s.clone()),
        Some(Value::Object(d)) => (
            text(d.get("code")).unwrap_or(code),
            text(d.get("message")).unwrap_or_else(|| "request failed".to_owned()),
        ),
        Some(Value::Array(items)) if !items.is_empty() => {
            let first = items[0]
                .get("msg")
                .and_then(Value::as_str)
                .unwrap_or("invalid request");
            let more = if items.len() > 1 {
                format!(" (and {} more)", items.len() - 1)
            } else {
                String::new()
            };
            (code, format!("{first}{more}"))
        }
        _ if !code.is_empty() => (code, "request failed".to_owned()),
        _ => fallback(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_of_every_observed_shape() {
        assert_eq!(
            error_fields(r#"{"code":"DOCKER::SANDBOX_NOT_FOUND","message":"gone"}"#),
            ("DOCKER::SANDBOX_NOT_FOUND".into(), "gone".into())
        );
        assert_eq!(
            error_fields(
                r#"{"detail":[{"loc":["body","timeout"],"msg":"Input should be greater than or equal to 60","input":30},{"msg":"x"}]}"#
            ),
            (
                String::new(),
                "Input should be greater than or equal to 60 (and 1 more)".into()
            )
        );
        assert_eq!(
            error_fields(r#"{"detail":{"code":"C","message":"m"}}"#),
            ("C".into(), "m".into())
        );
        assert_eq!(
            error_fields(r#"{"detail":"plain"}"#),
            (String::new(), "plain".into())
        );
        assert_eq!(
            error_fields("<html>"),
            (String::new(), "request failed".into())
        );
        assert_eq!(
            error_fields(r#"{"code":"MISSING_API_KEY"}"#),
            ("MISSING_API_KEY".into(), "request failed".into())
        );
    }

    #[test]
    fn retry_after_reads_seconds_only() {
        let mut h = HeaderMap::new();
        h.insert(header::RETRY_AFTER, HeaderValue::from_static("2.5"));
        assert_eq!(retry_after(&h), Some(Duration::from_millis(2500)));
        h.insert(
            header::RETRY_AFTER,
            HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&h), None);
        h.insert(header::RETRY_AFTER, HeaderValue::from_static("-1"));
        assert_eq!(retry_after(&h), None);
    }

    #[test]
    fn the_key_header_is_the_documented_one() {
        let sent = HeaderName::from_static("open-sandbox-api-key");
        assert_eq!(
            HeaderName::from_bytes(API_KEY_HEADER.as_bytes()).unwrap(),
            sent
        );
    }

    #[test]
    fn segments_are_encoded_and_dot_segments_refused() {
        let t = Transport::new(
            reqwest::Client::new(),
            Url::parse("http://127.0.0.1:1/api/v1").unwrap(),
            SecretString::from("key-12345"),
            Duration::from_secs(1),
            RetryPolicy::default(),
            HeaderValue::from_static("ua"),
        );
        let call = Call::get(&["sandboxes", "a/b c?#%"]).unwrap();
        assert_eq!(
            t.request(&call).unwrap().url().as_str(),
            "http://127.0.0.1:1/api/v1/sandboxes/a%2Fb%20c%3F%23%25"
        );
        assert_eq!(call.path, "/sandboxes/a/b c?#%");
        for bad in ["", ".", ".."] {
            assert!(Call::get(&["sandboxes", bad]).is_err(), "{bad:?}");
        }
    }
}
