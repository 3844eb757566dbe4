//! HTTP transport, in five parts:
//!
//! - `secrets` (in `outside-text`, shared with sandbox-core): the credentials a transport must
//!   never reveal and the redaction helpers;
//! - [`send`]: request building, retries, JSend decoding and error mapping;
//! - [`idle`]: the idle timer of raw exchanges (streamed uploads, streams, downloads);
//! - [`framing`]: the bounded line framer and the NDJSON/SSE frame splitter of every stream;
//! - [`pagination`]: limit/offset list walks.
//!
//! This file holds the [`Transport`] itself: its settings, credential and delegated copies.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use reqwest::header::HeaderValue;
use secrecy::SecretString;
use serde_json::Value;
use url::Url;

use crate::options::RetryOptions;

mod framing;
mod idle;
mod pagination;
use outside_text::secrets;
mod send;

pub(crate) use framing::ndjson_frames;
pub use framing::{LineFramer, LineTooLong, MAX_STREAM_LINE};
pub(crate) use idle::{RawMeta, body_chunks};
pub(crate) use outside_text::secrets::SENSITIVE_HEADERS;
pub use outside_text::secrets::{
    MAX_DETAIL_CHARS, MIN_SECRET_FRAGMENT, REDACTED, Redactor, cap_detail, redact_url,
};
pub use pagination::MAX_PAGES;
pub(crate) use pagination::paginate;
pub(crate) use send::{BodyCap, is_loopback_host};

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
    secrets: Redactor,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport")
            .field("base_url", &redact_url(&self.shared.base_str))
            .field("proxy", &self.shared.proxy)
            .field(
                "credential",
                &self.credential.as_ref().map(|_| secrets::REDACTED),
            )
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

impl Transport {
    pub(crate) fn new(shared: Shared, credential: Option<SecretString>) -> Transport {
        let secrets = match &credential {
            Some(c) => Redactor::default().with(c),
            None => Redactor::default(),
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
    pub(crate) fn secrets(&self) -> &Redactor {
        &self.secrets
    }

    #[allow(dead_code)] // used by extension modules
    pub(crate) fn default_timeout(&self) -> Duration {
        self.shared.timeout
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seg_encodes_like_quote_safe_empty() {
        assert_eq!(seg("sb-1_a.b~c"), "sb-1_a.b~c");
        assert_eq!(seg("a/b c?#%"), "a%2Fb%20c%3F%23%25");
        assert_eq!(seg("é"), "%C3%A9");
    }
}
