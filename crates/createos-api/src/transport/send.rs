//! Sending: building a request (credential rules included), buffered calls with retries
//! and JSend decoding, raw calls for streams and uploads, and the mapping of every failure
//! to the crate's [`Error`].

use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use reqwest::header::{self, HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode};
use secrecy::ExposeSecret;
use serde::de::DeserializeOwned;
use serde_json::Value;
use url::Url;

use super::idle::{Progress, RawMeta};
use super::secrets::{Redactor, SENSITIVE_HEADERS};
use super::{RawBody, Transport};
use crate::error::{ApiError, Error, MAX_ERROR_BODY, MAX_MESSAGE_BYTES, Result};
use crate::options::RequestOptions;

/// Largest JSON success body read into memory (64 MiB); more is a protocol error.
const MAX_JSON_BODY: usize = 64 * 1024 * 1024;

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
    fn json() -> Self {
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

fn is_public(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/v1/shapes" | "/v1/rootfs")
}

fn is_idempotent(m: &Method) -> bool {
    matches!(
        *m,
        Method::GET | Method::HEAD | Method::PUT | Method::DELETE
    )
}

/// Whether `url` names a loopback host, to which the key may go over plain `http`:
/// `localhost`, `127.0.0.0/8` or `::1`.
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
fn parse_retry_after(headers: &HeaderMap) -> Option<Duration> {
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
                    "no API key configured (set CREATEOS_SANDBOX_API_KEY or CREATEOS_API_KEY, \
                     or pass one to the builder)"
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
        transport_error(method, endpoint, e, timeout, &self.secrets)
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
        // Cut at the cap: a fixed amount goes at the cut, whatever it holds (never a mask that
        // depends on whether the cut bytes start a key).
        let body = if truncated {
            self.secrets.apply_cut_bytes(&body)
        } else {
            self.secrets.apply_bytes(&body)
        };
        let (code, message) = envelope_message(&body);
        let mut headers = HeaderMap::new();
        for (name, value) in &raw_headers {
            if SENSITIVE_HEADERS.contains(&name.as_str()) {
                continue;
            }
            let scrubbed = value.to_str().map(|s| self.secrets.apply(s)).ok();
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
            // A server's words in an error: redacted, at most MAX_MESSAGE_BYTES, one line.
            message: outside_text::snippet(&self.secrets.apply(&message), MAX_MESSAGE_BYTES),
            request_id: outside_text::snippet(&request_id, 128),
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
            rb = with_json(rb, b)?;
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
                self.secrets.apply(&e.to_string())
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
                Err(Error::protocol(outside_text::snippet(
                    &self.secrets.apply(msg),
                    MAX_MESSAGE_BYTES,
                )))
            }
            None => Err(Error::protocol("invalid JSend envelope: missing status")),
        }
    }

    /// The first 200 characters of a body, for an error message; redacted before and after
    /// the cut.
    fn snippet(&self, bytes: &[u8]) -> String {
        let window = &bytes[..bytes.len().min(200 * 4 + 4096)];
        outside_text::line(&self.secrets.shorten(&String::from_utf8_lossy(window), 200))
            .into_owned()
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
        let timed_out = |method| Error::Timeout {
            method,
            endpoint: path.to_owned(),
            after: timeout,
        };
        let mut rb = self.build(&method, path, query, opts)?;
        let progress = Progress::new();
        rb = match body {
            RawBody::None => rb,
            RawBody::Json(v) => with_json(rb, &v)?,
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
            None => return Err(timed_out(method)),
            Some(r) => r.map_err(|e| self.map_send_error(&method, path, e, timeout))?,
        };
        let mut resp =
            match tokio::time::timeout(timeout, self.check(&method, path, &sent, resp)).await {
                Err(_) => return Err(timed_out(method)),
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

/// `rb` with `value` as its JSON body.
fn with_json(rb: reqwest::RequestBuilder, value: &Value) -> Result<reqwest::RequestBuilder> {
    let bytes = serde_json::to_vec(value)
        .map_err(|e| Error::InvalidArgument(format!("cannot encode request body: {e}")))?;
    Ok(rb
        .header(header::CONTENT_TYPE, "application/json")
        .body(bytes))
}

/// A failure of the HTTP client while sending to or reading from `endpoint`: a timeout
/// (reported as `after`), else a transport error whose message is redacted and whose source
/// carries no URL.
pub(super) fn transport_error(
    method: &Method,
    endpoint: &str,
    e: reqwest::Error,
    after: Duration,
    secrets: &Redactor,
) -> Error {
    if e.is_timeout() {
        return Error::Timeout {
            method: method.clone(),
            endpoint: endpoint.to_owned(),
            after,
        };
    }
    Error::Transport {
        method: method.clone(),
        endpoint: endpoint.to_owned(),
        message: secrets.apply(&error_chain(&e)),
        source: Box::new(e.without_url()),
    }
}

/// An error's message followed by those of its sources, `: `-separated.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::RetryOptions;

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
