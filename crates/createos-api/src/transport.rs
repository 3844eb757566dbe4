//! HTTP transport: URL building, credentials, JSend decoding, retries, error mapping,
//! pagination and the NDJSON/SSE frame splitter shared by every stream.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use futures::stream::{self, BoxStream, StreamExt};
use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode};
use secrecy::{ExposeSecret, SecretString};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use url::Url;

use crate::error::{ApiError, Error, MAX_ERROR_BODY, Result};
use crate::options::{RequestOptions, RetryOptions};

/// Headers that carry credentials; never forwarded from callers.
pub(crate) const SENSITIVE_HEADERS: [&str; 7] = [
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "x-auth-token",
    "cookie",
    "set-cookie",
    "x-csrf-token",
];

/// Longest accepted stream line (16 MiB); longer is a protocol error.
pub(crate) const MAX_LINE: usize = 16 * 1024 * 1024;

const REDACTED: &str = "[REDACTED]";

/// Largest JSON success body read into memory (64 MiB); more is a protocol error.
pub(crate) const MAX_JSON_BODY: usize = 64 * 1024 * 1024;

/// A byte cap on a buffered response body and what exceeding it means.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyCap {
    /// Most bytes accepted.
    pub(crate) limit: usize,
    /// Report [`Error::TooLarge`] (a client-side cap on a legitimate body) instead of
    /// [`Error::Protocol`] (a body no valid answer can have).
    pub(crate) too_large: bool,
}

impl BodyCap {
    /// The cap of JSend answers: [`MAX_JSON_BODY`], a protocol error beyond it.
    pub(crate) fn json() -> Self {
        Self {
            limit: MAX_JSON_BODY,
            too_large: false,
        }
    }

    fn error(self, method: &Method, path: &str) -> Error {
        if self.too_large {
            Error::TooLarge {
                what: format!("response body of {method} {path}"),
                limit: self.limit as u64,
            }
        } else {
            Error::protocol(format!(
                "response body of {method} {path} exceeds the limit of {} bytes",
                self.limit
            ))
        }
    }
}

/// The shortest fragment of a secret that is masked at the edge of a text (4 bytes).
///
/// A text that was cut (an error snippet, a body cut at its cap, a stream line shown in part)
/// may end with the first bytes of a key or start with its last bytes. Any suffix of a text
/// that is a prefix of a secret, and any prefix of a text that is a suffix of a secret, at
/// least this long, is treated as the secret and replaced. Shorter fragments are left alone:
/// masking every 1 to 3 byte coincidence would shred ordinary messages, and 3 bytes of a key
/// give an attacker nothing useful.
pub const MIN_SECRET_FRAGMENT: usize = 4;

/// The range of `text` left once a prefix of `secret` at its end and a suffix of `secret`
/// at its start (each at least [`MIN_SECRET_FRAGMENT`] bytes) are taken away.
fn edge_fragments(text: &[u8], secret: &[u8]) -> (usize, usize) {
    let longest = secret.len().saturating_sub(1);
    let mut end = text.len();
    for k in (MIN_SECRET_FRAGMENT..=longest.min(text.len())).rev() {
        if text.ends_with(&secret[..k]) {
            end = text.len() - k;
            break;
        }
    }
    let mut start = 0;
    for k in (MIN_SECRET_FRAGMENT..=longest.min(end)).rev() {
        if text[..end].starts_with(&secret[secret.len() - k..]) {
            start = k;
            break;
        }
    }
    (start, end)
}

/// `text` with every whole occurrence of `secret` replaced, then with a fragment of it at
/// either edge replaced (see [`MIN_SECRET_FRAGMENT`]).
fn redact_bytes(text: &[u8], secret: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    if secret.is_empty() || !text.windows(secret.len()).any(|w| w == secret) {
        out.extend_from_slice(text);
    } else {
        let mut i = 0;
        while i < text.len() {
            if text[i..].starts_with(secret) {
                out.extend_from_slice(REDACTED.as_bytes());
                i += secret.len();
            } else {
                out.push(text[i]);
                i += 1;
            }
        }
    }
    if secret.len() <= MIN_SECRET_FRAGMENT {
        return out;
    }
    let (start, end) = edge_fragments(&out, secret);
    if start == 0 && end == out.len() {
        return out;
    }
    let mut masked = Vec::with_capacity(out.len() + 2 * REDACTED.len());
    if start > 0 {
        masked.extend_from_slice(REDACTED.as_bytes());
    }
    masked.extend_from_slice(&out[start..end]);
    if end < out.len() {
        masked.extend_from_slice(REDACTED.as_bytes());
    }
    masked
}

/// The secrets a transport must never reveal.
#[derive(Clone, Default)]
pub(crate) struct Secrets(Arc<Vec<SecretString>>);

impl Secrets {
    fn with(&self, s: &SecretString) -> Secrets {
        let mut v: Vec<SecretString> = self.0.iter().cloned().collect();
        v.push(s.clone());
        // Longest first, so a secret that contains another is replaced whole.
        v.sort_by_key(|s| std::cmp::Reverse(s.expose_secret().len()));
        Secrets(Arc::new(v))
    }

    /// Replace every secret occurrence in `text`, and a fragment of a secret at either edge
    /// of it (see [`MIN_SECRET_FRAGMENT`]).
    pub(crate) fn scrub(&self, text: &str) -> String {
        let bytes = self.scrub_bytes(text.as_bytes(), true);
        // Whole UTF-8 sequences were replaced by ASCII, and the edge fragments start at the
        // first byte or end at the last byte of a secret, so the result stays valid UTF-8.
        String::from_utf8(bytes.to_vec())
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }

    /// Replace every secret occurrence in `bytes`, and a fragment of a secret at either
    /// edge (a body cut by a cap ends with what may be the start of a key).
    pub(crate) fn scrub_bytes(&self, bytes: &[u8], _truncated: bool) -> Bytes {
        let mut out = bytes.to_vec();
        for s in self.0.iter() {
            out = redact_bytes(&out, s.expose_secret().as_bytes());
        }
        Bytes::from(out)
    }

    /// At most `max_chars` characters of `text`, redacted before the cut and again after
    /// it, so a secret that straddles the cut leaves no fragment behind.
    pub(crate) fn shorten(&self, text: &str, max_chars: usize) -> String {
        let longest = self
            .0
            .iter()
            .map(|s| s.expose_secret().len())
            .max()
            .unwrap_or(0);
        // Every secret that starts inside the kept part ends inside this window.
        let window: String = text.chars().take(max_chars + longest).collect();
        let scrubbed = self.scrub(&window);
        let cut: String = scrubbed.chars().take(max_chars).collect();
        self.scrub(&cut)
    }
}

/// Settings shared by a transport and every delegated copy of it.
#[derive(Clone)]
pub(crate) struct Shared {
    pub(crate) http: reqwest::Client,
    pub(crate) base: Url,
    pub(crate) base_str: String,
    pub(crate) timeout: Duration,
    pub(crate) retry: RetryOptions,
    pub(crate) user_agent: HeaderValue,
    pub(crate) allow_insecure_http: bool,
    /// The proxy in use, redacted for display (`None`: direct, or an injected client).
    pub(crate) proxy: Option<String>,
}

/// The HTTP transport. Cheap to clone via `Arc`.
pub(crate) struct Transport {
    shared: Arc<Shared>,
    credential: Option<SecretString>,
    secrets: Secrets,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("base_url", &crate::net::redact_url(&self.shared.base_str))
            .field("proxy", &self.shared.proxy)
            .field("credential", &self.credential.as_ref().map(|_| REDACTED))
            .field("timeout", &self.shared.timeout)
            .field("retry", &self.shared.retry)
            .finish_non_exhaustive()
    }
}

/// The body of a raw (never retried) request.
pub(crate) enum RawBody {
    /// No body.
    None,
    /// A JSON body.
    Json(Value),
    /// Bytes with a content type.
    Bytes(Bytes, &'static str),
    /// A streamed `application/octet-stream` body. No total deadline applies while it is
    /// sent: the timeout bounds each idle gap between two chunks, then the wait for the
    /// response once the body is complete.
    Stream(BoxStream<'static, std::io::Result<Bytes>>),
}

/// Stored in a raw response's extensions so stream readers can map errors and time out.
#[derive(Clone)]
pub(crate) struct RawMeta {
    pub(crate) method: Method,
    pub(crate) endpoint: String,
    pub(crate) idle_timeout: Duration,
    pub(crate) secrets: Secrets,
    /// When a buffered answer to this request must be complete: the request's timeout
    /// after its last progress (the end of a streamed body, else the start). Uploads read
    /// their answer under it, so a trickling answer cannot hold them forever.
    pub(crate) answer_deadline: tokio::time::Instant,
}

/// Percent-encode one path segment (every byte except `A-Za-z0-9-._~`).
pub(crate) fn seg(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

fn is_public(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/v1/shapes" | "/v1/rootfs")
}

fn is_idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::PUT | Method::DELETE
    )
}

pub(crate) fn is_loopback_host(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip).is_loopback(),
        Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip).is_loopback(),
        Some(url::Host::Domain(d)) => {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            // Only the name itself: `*.localhost` resolves wherever DNS says, so it is not
            // a loopback host for the plain-http rule.
            d == "localhost"
        }
        None => false,
    }
}

/// Parse `Retry-After`: delta-seconds (float accepted) or an HTTP-date; negatives clamp to 0.
pub(crate) fn parse_retry_after(headers: &HeaderMap) -> Option<Duration> {
    let v = headers.get(header::RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = v.parse::<f64>() {
        if secs.is_finite() {
            return Some(Duration::from_secs_f64(secs.clamp(0.0, 1e9)));
        }
        return None;
    }
    let when = httpdate::parse_http_date(v).ok()?;
    Some(
        when.duration_since(SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

impl Transport {
    pub(crate) fn new(shared: Shared, credential: Option<SecretString>) -> Transport {
        let secrets = match &credential {
            Some(c) => Secrets::default().with(c),
            None => Secrets::default(),
        };
        Transport {
            shared: Arc::new(shared),
            credential,
            secrets,
        }
    }

    /// The same transport with a different credential (delegated access token).
    /// The pool, timeout and retry settings are shared; both secrets stay redacted.
    #[allow(dead_code)] // used by extension modules
    pub(crate) fn with_credential(&self, secret: SecretString) -> Transport {
        Transport {
            shared: Arc::clone(&self.shared),
            secrets: self.secrets.with(&secret),
            credential: Some(secret),
        }
    }

    /// The same transport (pool and credential shared) with another default timeout
    /// and/or retry policy.
    pub(crate) fn with_settings(
        &self,
        timeout: Option<Duration>,
        retry: Option<RetryOptions>,
    ) -> Transport {
        let mut shared = (*self.shared).clone();
        if let Some(t) = timeout {
            shared.timeout = t;
        }
        if let Some(r) = retry {
            shared.retry = r;
        }
        Transport {
            shared: Arc::new(shared),
            credential: self.credential.clone(),
            secrets: self.secrets.clone(),
        }
    }

    pub(crate) fn base_url(&self) -> &str {
        &self.shared.base_str
    }

    pub(crate) fn proxy(&self) -> Option<&str> {
        self.shared.proxy.as_deref()
    }

    pub(crate) fn has_credential(&self) -> bool {
        self.credential.is_some()
    }

    #[allow(dead_code)] // used by extension modules
    pub(crate) fn secrets(&self) -> &Secrets {
        &self.secrets
    }

    #[allow(dead_code)] // used by extension modules
    pub(crate) fn default_timeout(&self) -> Duration {
        self.shared.timeout
    }

    fn build(
        &self,
        method: &Method,
        path: &str,
        query: &[(&str, String)],
        opts: &RequestOptions,
    ) -> Result<reqwest::RequestBuilder> {
        let mut url = Url::parse(&format!("{}{}", self.shared.base_str, path))
            .map_err(|e| Error::InvalidArgument(format!("invalid request path {path:?}: {e}")))?;
        if url.origin() != self.shared.base.origin() {
            return Err(Error::protocol("refusing request to non-base origin"));
        }
        if !query.is_empty() {
            let mut q = url.query_pairs_mut();
            for (k, v) in query {
                q.append_pair(k, v);
            }
        }
        let mut headers = HeaderMap::new();
        headers.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        headers.insert(header::USER_AGENT, self.shared.user_agent.clone());
        for (name, value) in &opts.headers {
            if !SENSITIVE_HEADERS.contains(&name.as_str()) {
                headers.append(name.clone(), value.clone());
            }
        }
        if !is_public(path) {
            let Some(cred) = &self.credential else {
                return Err(Error::Auth(
                    "no API key configured (set CREATEOS_API_KEY or pass one to the builder)"
                        .into(),
                ));
            };
            if url.scheme() != "https"
                && !self.shared.allow_insecure_http
                && !is_loopback_host(&url)
            {
                return Err(Error::Config(
                    "refusing to send the API key over plain http to a non-loopback host; \
                     use https or opt in with ClientBuilder::allow_insecure_http(true)"
                        .into(),
                ));
            }
            let mut v = HeaderValue::from_str(cred.expose_secret()).map_err(|_| {
                Error::Config("the API key contains invalid header characters".into())
            })?;
            v.set_sensitive(true);
            headers.insert(HeaderName::from_static("x-api-key"), v);
        }
        Ok(self
            .shared
            .http
            .request(method.clone(), url)
            .headers(headers))
    }

    fn map_send_error(
        &self,
        method: &Method,
        endpoint: &str,
        e: reqwest::Error,
        timeout: Duration,
    ) -> Error {
        if e.is_timeout() {
            return Error::Timeout {
                method: method.clone(),
                endpoint: endpoint.to_owned(),
                after: timeout,
            };
        }
        let message = self.secrets.scrub(&error_chain(&e));
        Error::Transport {
            method: method.clone(),
            endpoint: endpoint.to_owned(),
            message,
            source: Box::new(e.without_url()),
        }
    }

    /// Check the status: redirects become protocol errors, non-2xx become [`Error::Api`].
    async fn check(
        &self,
        method: &Method,
        endpoint: &str,
        sent: &Url,
        resp: reqwest::Response,
    ) -> Result<reqwest::Response> {
        let status = resp.status();
        if status.is_redirection() {
            let cross = resp
                .headers()
                .get(header::LOCATION)
                .and_then(|l| l.to_str().ok())
                .and_then(|l| sent.join(l).ok())
                .is_some_and(|target| target.origin() != self.shared.base.origin());
            return Err(Error::redirect(
                if cross {
                    "refusing redirect to non-base origin"
                } else {
                    "unexpected redirect response"
                },
                Some(status),
                cross,
            ));
        }
        if resp.url() != sent {
            let cross = resp.url().origin() != self.shared.base.origin();
            return Err(Error::redirect(
                "the HTTP client followed a redirect; redirects are never accepted",
                None,
                cross,
            ));
        }
        if status.is_success() {
            return Ok(resp);
        }
        Err(self.api_error(method, endpoint, resp).await)
    }

    async fn api_error(
        &self,
        method: &Method,
        endpoint: &str,
        mut resp: reqwest::Response,
    ) -> Error {
        let status = resp.status();
        let raw_headers = resp.headers().clone();
        let mut body = BytesMut::new();
        let mut truncated = false;
        while let Ok(Some(chunk)) = resp.chunk().await {
            let room = MAX_ERROR_BODY - body.len();
            if chunk.len() > room {
                body.extend_from_slice(&chunk[..room]);
                truncated = true;
                break;
            }
            body.extend_from_slice(&chunk);
            if body.len() == MAX_ERROR_BODY {
                // Any further byte means the body was cut.
                truncated = matches!(resp.chunk().await, Ok(Some(c)) if !c.is_empty());
                break;
            }
        }
        drop(resp);
        let body = self.secrets.scrub_bytes(&body, truncated);
        let (code, message) = envelope_message(&body);
        let mut headers = HeaderMap::new();
        for (name, value) in &raw_headers {
            if SENSITIVE_HEADERS.contains(&name.as_str()) {
                continue;
            }
            let scrubbed = value.to_str().map(|s| self.secrets.scrub(s)).ok();
            if let Some(v) = scrubbed.and_then(|s| HeaderValue::from_str(&s).ok()) {
                headers.append(name.clone(), v);
            }
        }
        let request_id = headers
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        Error::Api(Box::new(ApiError {
            status,
            method: method.clone(),
            endpoint: endpoint.to_owned(),
            code,
            message: self.secrets.scrub(&message),
            request_id,
            retry_after: parse_retry_after(&headers),
            body,
            body_truncated: truncated,
            headers,
        }))
    }

    fn should_retry(method: &Method, err: &Error) -> bool {
        match err {
            Error::Api(api) => match api.status.as_u16() {
                429 | 503 => true,
                408 | 500 | 502 | 504 => is_idempotent(method),
                _ => false,
            },
            Error::Transport { .. } | Error::Timeout { .. } => is_idempotent(method),
            _ => false,
        }
    }

    /// One attempt of a buffered request: returns status + full body. The timeout bounds
    /// the whole exchange, body read included; the body is refused the moment it would
    /// exceed `cap` bytes (and before reading when `Content-Length` already does), with
    /// the error `over_cap` builds.
    #[allow(clippy::too_many_arguments)]
    async fn attempt(
        &self,
        method: &Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<&Value>,
        opts: &RequestOptions,
        timeout: Duration,
        cap: BodyCap,
    ) -> Result<(StatusCode, Bytes)> {
        let mut rb = self.build(method, path, query, opts)?.timeout(timeout);
        if let Some(b) = body {
            let bytes = serde_json::to_vec(b)
                .map_err(|e| Error::InvalidArgument(format!("cannot encode request body: {e}")))?;
            rb = rb
                .header(header::CONTENT_TYPE, "application/json")
                .body(bytes);
        }
        let req = rb
            .build()
            .map_err(|e| self.map_send_error(method, path, e, timeout))?;
        let sent = req.url().clone();
        let resp = self
            .shared
            .http
            .execute(req)
            .await
            .map_err(|e| self.map_send_error(method, path, e, timeout))?;
        let mut resp = self.check(method, path, &sent, resp).await?;
        let status = resp.status();
        if resp
            .content_length()
            .is_some_and(|len| len > cap.limit as u64)
        {
            return Err(cap.error(method, path));
        }
        let mut buf = BytesMut::new();
        loop {
            match resp.chunk().await {
                Ok(Some(chunk)) => {
                    if chunk.len() > cap.limit - buf.len() {
                        return Err(cap.error(method, path));
                    }
                    buf.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(e) => return Err(self.map_send_error(method, path, e, timeout)),
            }
        }
        Ok((status, buf.freeze()))
    }

    /// A buffered request with retries (§1.7): returns the status and the body, read to at
    /// most `cap` bytes under the request's timeout. Per-call retry options are validated
    /// like the builder's.
    pub(crate) async fn fetch(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Value>,
        opts: &RequestOptions,
        cap: BodyCap,
    ) -> Result<(StatusCode, Bytes)> {
        if let Some(r) = &opts.retry {
            r.validate()?;
        }
        let retry = opts.retry.unwrap_or(self.shared.retry);
        let max = if opts.disable_retry {
            0
        } else {
            retry.max_retries
        };
        let timeout = opts.timeout.unwrap_or(self.shared.timeout);
        let mut attempt = 0u32;
        loop {
            match self
                .attempt(&method, path, query, body.as_ref(), opts, timeout, cap)
                .await
            {
                Ok(answer) => return Ok(answer),
                Err(e) if attempt < max && Self::should_retry(&method, &e) => {
                    let delay = retry.delay(attempt, e.as_api().and_then(|a| a.retry_after));
                    tracing::debug!(%method, path, attempt, ?delay, error = %e, "retrying createos request");
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// A JSON request with retries; returns the raw JSend `data`.
    pub(crate) async fn json_value(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Value>,
        opts: &RequestOptions,
    ) -> Result<Value> {
        let (status, bytes) = self
            .fetch(method, path, query, body, opts, BodyCap::json())
            .await?;
        self.decode_jsend(status, &bytes)
    }

    /// JSend request: returns the decoded `data` (`Option<T>` decodes a 204 as `None`).
    pub(crate) async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Value>,
        opts: &RequestOptions,
    ) -> Result<T> {
        let data = self.json_value(method, path, query, body, opts).await?;
        self.decode_data(data, path)
    }

    /// Decode a JSend `data` value into `T`, mapping failures to a redacted protocol error.
    pub(crate) fn decode_data<T: DeserializeOwned>(&self, data: Value, what: &str) -> Result<T> {
        serde_json::from_value(data).map_err(|e| {
            Error::protocol(format!(
                "cannot decode response of {what}: {}",
                self.secrets.scrub(&e.to_string())
            ))
        })
    }

    /// JSend request whose `data` is ignored.
    #[allow(dead_code)] // used by extension modules
    pub(crate) async fn unit(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Value>,
        opts: &RequestOptions,
    ) -> Result<()> {
        self.json_value(method, path, query, body, opts)
            .await
            .map(|_| ())
    }

    fn decode_jsend(&self, status: StatusCode, bytes: &[u8]) -> Result<Value> {
        if matches!(status.as_u16(), 204 | 205) && bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(Value::Null);
        }
        let env: Value = serde_json::from_slice(bytes).map_err(|e| {
            Error::protocol(format!(
                "invalid JSend envelope: {}; body starts with {:?}",
                e,
                self.snippet(bytes)
            ))
        })?;
        let Value::Object(mut obj) = env else {
            return Err(Error::protocol("invalid JSend envelope: not an object"));
        };
        match obj.get("status").and_then(Value::as_str) {
            Some("success") => Ok(obj.remove("data").unwrap_or(Value::Null)),
            Some(_) => {
                let msg = obj
                    .get("message")
                    .and_then(Value::as_str)
                    .filter(|m| !m.is_empty())
                    .unwrap_or("unexpected JSend status");
                Err(Error::protocol(self.secrets.scrub(msg)))
            }
            None => Err(Error::protocol("invalid JSend envelope: missing status")),
        }
    }

    /// The first 200 characters of a body, for an error message; redacted before and after
    /// the cut.
    fn snippet(&self, bytes: &[u8]) -> String {
        let window = &bytes[..bytes.len().min(200 * 4 + 4096)];
        self.secrets.shorten(&String::from_utf8_lossy(window), 200)
    }

    /// Raw response for streams, bytes and uploads: never retried; non-2xx already
    /// turned into [`Error::Api`]. The timeout bounds the wait for the response headers;
    /// stream readers then apply it to every idle gap between chunks. A streamed upload
    /// body has no total deadline: the timeout bounds each gap between two body chunks
    /// (a stalled source or a peer that stopped reading), then the wait for the response
    /// after the last chunk.
    pub(crate) async fn raw(
        &self,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: RawBody,
        opts: &RequestOptions,
    ) -> Result<reqwest::Response> {
        let timeout = opts.timeout.unwrap_or(self.shared.timeout);
        let mut rb = self.build(&method, path, query, opts)?;
        let progress = Progress::new();
        rb = match body {
            RawBody::None => rb,
            RawBody::Json(v) => {
                let bytes = serde_json::to_vec(&v).map_err(|e| {
                    Error::InvalidArgument(format!("cannot encode request body: {e}"))
                })?;
                rb.header(header::CONTENT_TYPE, "application/json")
                    .body(bytes)
            }
            RawBody::Bytes(b, ct) => rb.header(header::CONTENT_TYPE, ct).body(b),
            RawBody::Stream(s) => rb
                .header(header::CONTENT_TYPE, "application/octet-stream")
                .body(reqwest::Body::wrap_stream(progress.track(s))),
        };
        let req = rb
            .build()
            .map_err(|e| self.map_send_error(&method, path, e, timeout))?;
        let sent = req.url().clone();
        progress.touch();
        let fut = self.shared.http.execute(req);
        let resp = match progress.run(fut, timeout).await {
            None => {
                return Err(Error::Timeout {
                    method,
                    endpoint: path.to_owned(),
                    after: timeout,
                });
            }
            Some(r) => r.map_err(|e| self.map_send_error(&method, path, e, timeout))?,
        };
        let mut resp =
            match tokio::time::timeout(timeout, self.check(&method, path, &sent, resp)).await {
                Err(_) => {
                    return Err(Error::Timeout {
                        method,
                        endpoint: path.to_owned(),
                        after: timeout,
                    });
                }
                Ok(r) => r?,
            };
        resp.extensions_mut().insert(RawMeta {
            method,
            endpoint: path.to_owned(),
            idle_timeout: timeout,
            secrets: self.secrets.clone(),
            answer_deadline: progress.last() + timeout,
        });
        Ok(resp)
    }
}

/// When a raw request last made progress: its start, then every chunk of a streamed body
/// handed to the connection and the end of that body.
#[derive(Clone)]
struct Progress(Arc<std::sync::Mutex<tokio::time::Instant>>);

impl Progress {
    fn new() -> Self {
        Self(Arc::new(std::sync::Mutex::new(tokio::time::Instant::now())))
    }

    fn touch(&self) {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = tokio::time::Instant::now();
    }

    fn last(&self) -> tokio::time::Instant {
        *self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `body`, recording progress on every chunk it yields and when it ends.
    fn track(
        &self,
        body: BoxStream<'static, std::io::Result<Bytes>>,
    ) -> BoxStream<'static, std::io::Result<Bytes>> {
        let on_chunk = self.clone();
        let on_end = self.clone();
        body.inspect(move |_| on_chunk.touch())
            .chain(stream::poll_fn(move |_| {
                on_end.touch();
                std::task::Poll::Ready(None)
            }))
            .boxed()
    }

    /// Drive `fut` until it completes (`Some`) or `timeout` passes without progress (`None`).
    async fn run<F: Future>(&self, fut: F, timeout: Duration) -> Option<F::Output> {
        tokio::pin!(fut);
        loop {
            let deadline = self.last() + timeout;
            tokio::select! {
                out = &mut fut => return Some(out),
                () = tokio::time::sleep_until(deadline) => {
                    if self.last() + timeout <= tokio::time::Instant::now() {
                        return None;
                    }
                }
            }
        }
    }
}

fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// JSend `code` and message of an error body (see the contract §1.5).
fn envelope_message(body: &[u8]) -> (i64, String) {
    let Ok(Value::Object(obj)) = serde_json::from_slice::<Value>(body) else {
        return (0, "request failed".to_owned());
    };
    let code = match obj.get("code") {
        Some(Value::Number(n)) => n.as_i64().unwrap_or(0),
        Some(Value::String(s)) => s.trim().parse().unwrap_or(0),
        _ => 0,
    };
    if let Some(m) = obj
        .get("message")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
    {
        return (code, m.to_owned());
    }
    match obj.get("data") {
        Some(Value::String(s)) if !s.is_empty() => (code, s.clone()),
        Some(Value::Object(map)) if !map.is_empty() => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let parts: Vec<String> = keys
                .into_iter()
                .map(|k| match &map[k] {
                    Value::String(s) => format!("{k}: {s}"),
                    other => format!("{k}: {other}"),
                })
                .collect();
            (code, parts.join("; "))
        }
        _ => (code, "request failed".to_owned()),
    }
}

/// The response body as a stream of chunks, each awaited under the idle timeout.
pub(crate) fn body_chunks(resp: reqwest::Response) -> BoxStream<'static, Result<Bytes>> {
    let meta = resp
        .extensions()
        .get::<RawMeta>()
        .cloned()
        .unwrap_or_else(|| RawMeta {
            method: Method::GET,
            endpoint: resp.url().path().to_owned(),
            idle_timeout: Duration::from_secs(60),
            secrets: Secrets::default(),
            answer_deadline: tokio::time::Instant::now() + Duration::from_secs(60),
        });
    let inner = resp.bytes_stream();
    stream::unfold(Some((inner, meta)), |state| async move {
        let (mut inner, meta) = state?;
        match tokio::time::timeout(meta.idle_timeout, inner.next()).await {
            Err(_) => Some((
                Err(Error::Timeout {
                    method: meta.method.clone(),
                    endpoint: meta.endpoint.clone(),
                    after: meta.idle_timeout,
                }),
                None,
            )),
            Ok(None) => None,
            Ok(Some(Ok(b))) => Some((Ok(b), Some((inner, meta)))),
            Ok(Some(Err(e))) => {
                let err = if e.is_timeout() {
                    Error::Timeout {
                        method: meta.method.clone(),
                        endpoint: meta.endpoint.clone(),
                        after: meta.idle_timeout,
                    }
                } else {
                    Error::Transport {
                        method: meta.method.clone(),
                        endpoint: meta.endpoint.clone(),
                        message: meta.secrets.scrub(&error_chain(&e)),
                        source: Box::new(e.without_url()),
                    }
                };
                Some((Err(err), None))
            }
        }
    })
    .boxed()
}

/// Frame state for [`ndjson_frames`].
struct Framer {
    chunks: BoxStream<'static, Result<Bytes>>,
    /// What is left of the current network chunk; lines are cut from it without copying.
    chunk: Bytes,
    /// The start of a line whose end has not arrived yet.
    partial: BytesMut,
    secrets: Secrets,
    eof: bool,
    /// A transport error, delivered after the complete lines that preceded it.
    failed: Option<Error>,
}

impl Framer {
    /// Handle one complete line per §3.1; returns a frame, nothing, or an error.
    fn line(&self, raw: &[u8]) -> Result<Option<Map<String, Value>>> {
        let text = std::str::from_utf8(raw)
            .map_err(|e| Error::protocol_with("stream line is not valid UTF-8", e))?;
        let line = text.trim();
        if line.is_empty()
            || line.starts_with(':')
            || line.starts_with("event:")
            || line.starts_with("id:")
            || line.starts_with("retry:")
        {
            return Ok(None);
        }
        let json = match line.strip_prefix("data:") {
            Some(rest) => {
                let rest = rest.trim();
                if rest.is_empty() {
                    return Ok(None);
                }
                rest
            }
            None => line,
        };
        match serde_json::from_str::<Value>(json) {
            Ok(Value::Object(m)) => Ok(Some(m)),
            Ok(_) => Err(Error::protocol("stream frame is not a JSON object")),
            Err(e) => Err(Error::protocol(format!(
                "invalid stream frame: {}; line starts with {:?}",
                self.secrets.scrub(&e.to_string()),
                self.secrets.shorten(json, 200)
            ))),
        }
    }

    /// The next frame among the lines already received, parsed only now: a network chunk
    /// carrying many frames is neither copied nor held parsed all at once. After end of
    /// stream an unterminated last line counts too.
    fn next_buffered(&mut self) -> Result<Option<Map<String, Value>>> {
        while let Some(pos) = self.chunk.iter().position(|b| *b == b'\n' || *b == b'\r') {
            let head = self.chunk.split_to(pos + 1);
            let frame = if self.partial.is_empty() {
                self.line(&head[..pos])?
            } else {
                self.partial.extend_from_slice(&head[..pos]);
                let whole = self.partial.split();
                self.line(&whole)?
            };
            if frame.is_some() {
                return Ok(frame);
            }
        }
        if !self.chunk.is_empty() {
            self.partial.extend_from_slice(&self.chunk);
            self.chunk.clear();
        }
        if self.partial.len() > MAX_LINE {
            return Err(Error::protocol(format!(
                "stream line longer than {MAX_LINE} bytes"
            )));
        }
        if self.eof && !self.partial.is_empty() {
            let rest = self.partial.split();
            return self.line(&rest);
        }
        Ok(None)
    }
}

/// Split a response body into JSON-object frames: NDJSON and single-line SSE, mixed
/// freely (§3.1). Dropping the stream drops the response and closes the connection.
pub(crate) fn ndjson_frames(
    resp: reqwest::Response,
) -> BoxStream<'static, Result<Map<String, Value>>> {
    let secrets = resp
        .extensions()
        .get::<RawMeta>()
        .map(|m| m.secrets.clone())
        .unwrap_or_default();
    frames_from_chunks(body_chunks(resp), secrets)
}

/// The framing half of [`ndjson_frames`], over any stream of body chunks.
fn frames_from_chunks(
    chunks: BoxStream<'static, Result<Bytes>>,
    secrets: Secrets,
) -> BoxStream<'static, Result<Map<String, Value>>> {
    let framer = Framer {
        chunks,
        chunk: Bytes::new(),
        partial: BytesMut::new(),
        secrets,
        eof: false,
        failed: None,
    };
    stream::unfold(Some(framer), |state| async move {
        let mut f = state?;
        loop {
            match f.next_buffered() {
                Ok(Some(frame)) => return Some((Ok(frame), Some(f))),
                Ok(None) => {}
                Err(e) => return Some((Err(e), None)),
            }
            if let Some(e) = f.failed.take() {
                return Some((Err(e), None));
            }
            if f.eof {
                return None;
            }
            match f.chunks.next().await {
                Some(Ok(chunk)) => f.chunk = chunk,
                Some(Err(e)) => f.failed = Some(e),
                None => f.eof = true,
            }
        }
    })
    .boxed()
}

/// Split a list page into rows and an optional total (§1.9): a bare array,
/// `{data, pagination}`, or a legacy key.
pub(crate) fn page_rows(
    data: Value,
    legacy_key: Option<&str>,
) -> Result<(Vec<Value>, Option<u64>)> {
    match data {
        Value::Array(rows) => Ok((rows, None)),
        Value::Null => Ok((Vec::new(), None)),
        Value::Object(mut obj) => {
            let total = obj
                .get("pagination")
                .and_then(|p| p.get("total"))
                .and_then(Value::as_u64);
            let rows = match obj.remove("data") {
                Some(Value::Array(rows)) => rows,
                Some(Value::Null) | None => match legacy_key.and_then(|k| obj.remove(k)) {
                    Some(Value::Array(rows)) => rows,
                    Some(Value::Null) | None => Vec::new(),
                    Some(_) => {
                        return Err(Error::protocol("list response: legacy key is not an array"));
                    }
                },
                Some(_) => return Err(Error::protocol("list response: `data` is not an array")),
            };
            Ok((rows, total))
        }
        _ => Err(Error::protocol(
            "list response is neither an array nor an object",
        )),
    }
}

/// Default page size when the caller gave none.
pub(crate) const DEFAULT_PAGE: u64 = 100;
/// The server's largest page.
pub(crate) const MAX_PAGE: u64 = 500;

/// The most pages one list walk requests (1000, so 500 000 rows at the largest page size);
/// a walk that has not ended by then fails with a protocol error rather than run forever.
pub const MAX_PAGES: u32 = 1000;

/// A fingerprint of a page's rows, to notice a server that answers the same page again.
fn page_fingerprint(rows: &[Value]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for r in rows {
        r.to_string().hash(&mut h);
    }
    rows.len().hash(&mut h);
    h.finish()
}

struct Pager {
    t: Arc<Transport>,
    path: String,
    query: Vec<(&'static str, String)>,
    legacy: Option<&'static str>,
    opts: RequestOptions,
    offset: u64,
    limit: u64,
    buffered: VecDeque<Value>,
    done: bool,
    pages: u32,
    last_page: Option<u64>,
}

/// Walk limit/offset pages lazily, yielding rows. `query` may carry `limit` (page size,
/// capped at 500) and `offset` (start); both are replaced by the walk.
///
/// The walk ends on an empty page, a page shorter than asked, a page identical to the one
/// before (a server ignoring `offset`), a missing `total` or `offset + rows >= total`; a
/// `total` that is never reached cannot keep it going. After [`MAX_PAGES`] pages it fails
/// with a protocol error.
pub(crate) fn paginate<T: DeserializeOwned + Send + 'static>(
    t: Arc<Transport>,
    path: String,
    query: Vec<(&'static str, String)>,
    legacy_key: Option<&'static str>,
    opts: RequestOptions,
) -> BoxStream<'static, Result<T>> {
    let mut limit = DEFAULT_PAGE;
    let mut offset = 0;
    let mut rest = Vec::new();
    for (k, v) in query {
        match k {
            "limit" => limit = v.parse().unwrap_or(DEFAULT_PAGE),
            "offset" => offset = v.parse().unwrap_or(0),
            _ => rest.push((k, v)),
        }
    }
    let pager = Pager {
        t,
        path,
        query: rest,
        legacy: legacy_key,
        opts,
        offset,
        limit: limit.clamp(1, MAX_PAGE),
        buffered: VecDeque::new(),
        done: false,
        pages: 0,
        last_page: None,
    };
    stream::unfold(Some(pager), |state| async move {
        let mut p = state?;
        loop {
            if let Some(row) = p.buffered.pop_front() {
                let item = p.t.decode_data::<T>(row, &p.path);
                return match item {
                    Ok(v) => Some((Ok(v), Some(p))),
                    Err(e) => Some((Err(e), None)),
                };
            }
            if p.done {
                return None;
            }
            if p.pages >= MAX_PAGES {
                return Some((
                    Err(Error::protocol(format!(
                        "list {} did not end after {MAX_PAGES} pages",
                        p.path
                    ))),
                    None,
                ));
            }
            p.pages += 1;
            let mut q: Vec<(&str, String)> = p.query.iter().map(|(k, v)| (*k, v.clone())).collect();
            q.push(("limit", p.limit.to_string()));
            q.push(("offset", p.offset.to_string()));
            let page =
                p.t.json_value(Method::GET, &p.path, &q, None, &p.opts)
                    .await;
            let (rows, total) = match page.and_then(|d| page_rows(d, p.legacy)) {
                Ok(x) => x,
                Err(e) => return Some((Err(e), None)),
            };
            let n = rows.len() as u64;
            let fingerprint = page_fingerprint(&rows);
            if p.last_page == Some(fingerprint) {
                // The same rows again: the server ignores `offset`; they were yielded already.
                return None;
            }
            p.last_page = Some(fingerprint);
            match total {
                Some(total) if n >= p.limit && p.offset + n < total => p.offset += n,
                _ => p.done = true,
            }
            p.buffered.extend(rows);
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames_of(chunks: Vec<Result<Bytes>>) -> Vec<std::result::Result<Value, String>> {
        let stream = frames_from_chunks(stream::iter(chunks).boxed(), Secrets::default());
        futures::executor::block_on(stream.collect::<Vec<_>>())
            .into_iter()
            .map(|r| r.map(Value::Object).map_err(|e| e.to_string()))
            .collect()
    }

    #[test]
    fn frames_survive_any_chunking_and_an_unterminated_last_line() {
        let body = b": hi\r\n{\"a\":1}\ndata: {\"b\":\"\xc3\xa9\"}\r\n\nevent: x\n{\"c\":3}";
        for size in 1..body.len() {
            let chunks = body
                .chunks(size)
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect();
            let got = frames_of(chunks);
            let want: Vec<std::result::Result<Value, String>> = vec![
                Ok(serde_json::json!({"a": 1})),
                Ok(serde_json::json!({"b": "é"})),
                Ok(serde_json::json!({"c": 3})),
            ];
            assert_eq!(got, want, "chunks of {size} bytes");
        }
    }

    #[test]
    fn frames_before_a_transport_error_come_first_and_a_partial_line_is_dropped() {
        let got = frames_of(vec![
            Ok(Bytes::from_static(b"{\"a\":1}\n{\"b\"")),
            Err(Error::protocol("connection reset")),
            Ok(Bytes::from_static(b":2}\n")),
        ]);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0], Ok(serde_json::json!({"a": 1})));
        assert!(
            got[1]
                .as_ref()
                .is_err_and(|e| e.contains("connection reset"))
        );
    }

    #[test]
    fn a_line_past_the_limit_fails_without_waiting_for_its_end() {
        let piece = Bytes::from(vec![b'x'; 1024 * 1024]);
        let chunks = (0..=MAX_LINE / piece.len())
            .map(|_| Ok(piece.clone()))
            .collect();
        let got = frames_of(chunks);
        assert_eq!(got.len(), 1);
        assert!(got[0].as_ref().is_err_and(|e| e.contains("longer than")));
    }

    fn headers(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::RETRY_AFTER, HeaderValue::from_str(v).unwrap());
        h
    }

    #[test]
    fn retry_after_accepts_seconds_floats_and_dates() {
        assert_eq!(
            parse_retry_after(&headers("3")),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            parse_retry_after(&headers("1.5")),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(parse_retry_after(&headers("-4")), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after(&headers("Wed, 21 Oct 2015 07:28:00 GMT")),
            Some(Duration::ZERO)
        );
        let future = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
        let d = parse_retry_after(&headers(&future)).unwrap();
        assert!(
            d > Duration::from_secs(100) && d <= Duration::from_secs(120),
            "{d:?}"
        );
        assert_eq!(parse_retry_after(&headers("soon")), None);
        assert_eq!(parse_retry_after(&headers("NaN")), None);
        assert_eq!(parse_retry_after(&HeaderMap::new()), None);
    }

    #[test]
    fn backoff_is_exponential_jittered_and_capped() {
        let r = RetryOptions {
            max_retries: 5,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
        };
        for _ in 0..50 {
            let d0 = r.backoff(0);
            assert!(
                d0 >= Duration::from_millis(100) && d0 < Duration::from_millis(200),
                "{d0:?}"
            );
            let d2 = r.backoff(2);
            assert!(
                d2 >= Duration::from_millis(400) && d2 < Duration::from_millis(500),
                "{d2:?}"
            );
            assert!(r.backoff(40) <= Duration::from_secs(1));
        }
    }

    #[test]
    fn seg_encodes_like_quote_safe_empty() {
        assert_eq!(seg("sb-1_a.b~c"), "sb-1_a.b~c");
        assert_eq!(seg("a/b c?#%"), "a%2Fb%20c%3F%23%25");
        assert_eq!(seg("é"), "%C3%A9");
    }

    #[test]
    fn scrub_replaces_every_secret_and_a_cut_tail() {
        let s = Secrets::default()
            .with(&SecretString::from("sekrit-key"))
            .with(&SecretString::from("skp_sb_tok"));
        assert_eq!(
            s.scrub("a sekrit-key b skp_sb_tok"),
            "a [REDACTED] b [REDACTED]"
        );
        assert_eq!(
            &s.scrub_bytes(b"xx sekrit-key yy", false)[..],
            b"xx [REDACTED] yy"
        );
        assert_eq!(&s.scrub_bytes(b"xx sekri", true)[..], b"xx [REDACTED]");
        // Fragments of at least MIN_SECRET_FRAGMENT bytes at either edge are masked ...
        assert_eq!(s.scrub("xx sekr"), "xx [REDACTED]");
        assert_eq!(s.scrub("it-key yy"), "[REDACTED] yy");
        assert_eq!(
            s.scrub("b_tok, then sekrit-k"),
            "[REDACTED], then [REDACTED]"
        );
        // ... shorter ones, and fragments inside the text, are not.
        assert_eq!(s.scrub("xx sek"), "xx sek");
        assert_eq!(s.scrub("key yy"), "key yy");
        assert_eq!(s.scrub("a sekri b"), "a sekri b");
    }

    #[test]
    fn shorten_redacts_across_the_cut_at_every_offset() {
        let key = "sk_live_0123456789abcdefXYZ";
        let s = Secrets::default().with(&SecretString::from(key));
        for offset in 150..250 {
            let mut text = "a".repeat(offset);
            text.push_str(key);
            text.push_str(&"b".repeat(500 - text.len().min(500)));
            let shown = s.shorten(&text, 200);
            assert!(shown.chars().count() <= 200 + REDACTED.len(), "{offset}");
            for i in 0..=key.len() - MIN_SECRET_FRAGMENT {
                let frag = &key[i..i + MIN_SECRET_FRAGMENT];
                assert!(
                    !shown.contains(frag),
                    "offset {offset}: {frag:?} in {shown}"
                );
            }
        }
    }

    #[test]
    fn page_rows_accepts_every_documented_shape() {
        let (rows, total) = page_rows(serde_json::json!([1, 2]), None).unwrap();
        assert_eq!((rows.len(), total), (2, None));
        let (rows, total) = page_rows(
            serde_json::json!({"data": [1], "pagination": {"total": 9}}),
            None,
        )
        .unwrap();
        assert_eq!((rows.len(), total), (1, Some(9)));
        let (rows, _) = page_rows(
            serde_json::json!({"templates": [1, 2, 3]}),
            Some("templates"),
        )
        .unwrap();
        assert_eq!(rows.len(), 3);
        assert!(page_rows(serde_json::json!("x"), None).is_err());
    }

    #[test]
    fn envelope_messages_follow_the_contract_order() {
        assert_eq!(
            envelope_message(br#"{"status":"error","message":"m","code":5}"#),
            (5, "m".into())
        );
        assert_eq!(
            envelope_message(br#"{"status":"fail","data":"plain"}"#),
            (0, "plain".into())
        );
        assert_eq!(
            envelope_message(br#"{"status":"fail","data":{"b":"2","a":1}}"#),
            (0, "a: 1; b: 2".into())
        );
        assert_eq!(
            envelope_message(br#"{"status":"fail","data":null}"#),
            (0, "request failed".into())
        );
        assert_eq!(envelope_message(b"<html>"), (0, "request failed".into()));
    }
}
