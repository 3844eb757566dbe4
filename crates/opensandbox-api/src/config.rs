//! Settings: where the server is, the key, timeouts and the retry policy.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::HeaderValue;
use secrecy::{ExposeSecret, SecretString};
use url::Url;

use crate::error::{Error, Result};
use crate::transport::Transport;

/// The environment variable naming the server, as the official SDK reads it: a `host[:port]`
/// (plain `http`, as the SDK does) or a URL (`https://sandboxes.internal:8443`).
pub const ENV_DOMAIN: &str = "OPEN_SANDBOX_DOMAIN";
/// The environment variable holding the API key (sent as `OPEN-SANDBOX-API-KEY`).
pub const ENV_API_KEY: &str = "OPEN_SANDBOX_API_KEY";
/// The domain used when none is configured (the SDK's default).
pub const DEFAULT_DOMAIN: &str = "localhost:8080";
/// The header that carries the key.
pub const API_KEY_HEADER: &str = "OPEN-SANDBOX-API-KEY";
/// Default timeout of one buffered request, body included (30 s).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Default timeout to open a connection (10 s).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default `User-Agent`.
pub const DEFAULT_USER_AGENT: &str = concat!("opensandbox-rust/", env!("CARGO_PKG_VERSION"));

/// When and how the client repeats a failed call. Only calls that are safe to repeat are ever
/// repeated: reads, deletes, `/ping`, `PUT`s, the merge patch of metadata and a renew to an
/// absolute time. Create, exec, upload, pause, resume and snapshot creation never are.
///
/// A safe call is repeated after a transport error, a timeout, 408, 429 or 5xx, with a
/// jittered exponential backoff (`Retry-After` may lengthen a wait, never shorten it), until
/// `max_retries` repeats were made or the next attempt would start after `budget` since the
/// first one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Repeats after the first attempt (default 3).
    pub max_retries: u32,
    /// The first backoff (default 200 ms); it doubles on each repeat.
    pub base_delay: Duration,
    /// The longest single wait (default 5 s).
    pub max_delay: Duration,
    /// No attempt starts later than this after the first (default 30 s).
    pub budget: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 3,
            base_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
            budget: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// Never repeat anything.
    pub fn none() -> Self {
        RetryPolicy {
            max_retries: 0,
            ..RetryPolicy::default()
        }
    }

    fn check(&self) -> Result<()> {
        if self.base_delay.is_zero() || self.max_delay < self.base_delay {
            return Err(Error::Config(
                "retry policy: base_delay must be > 0 and <= max_delay".into(),
            ));
        }
        Ok(())
    }

    /// The wait before repeat number `attempt` (0-based): `base · 2^attempt` plus up to one
    /// `base` of jitter, at most `max_delay`, and never shorter than `retry_after` (itself
    /// capped at `max_delay`).
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let doubled = self
            .base_delay
            .saturating_mul(1u32 << attempt.min(20))
            .saturating_add(self.base_delay.mul_f64(rand::random::<f64>()));
        let backoff = doubled.min(self.max_delay);
        backoff.max(retry_after.unwrap_or_default().min(self.max_delay))
    }
}

/// An environment lookup given to [`ClientBuilder::env_lookup`].
type EnvLookup = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// Builds a [`crate::Client`]. Explicit settings win over the environment.
#[derive(Default)]
pub struct ClientBuilder {
    domain: Option<String>,
    api_key: Option<SecretString>,
    timeout: Option<Duration>,
    connect_timeout: Option<Duration>,
    retry: Option<RetryPolicy>,
    user_agent: Option<String>,
    allow_insecure_http: bool,
    env: Option<EnvLookup>,
}

impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("domain", &self.domain.as_deref().map(shown_domain))
            .field("api_key", &self.api_key.as_ref().map(|_| "[REDACTED]"))
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("retry", &self.retry)
            .field("allow_insecure_http", &self.allow_insecure_http)
            .finish_non_exhaustive()
    }
}

impl ClientBuilder {
    /// The server: a `host[:port]` (taken as plain `http://`, as the SDK does) or an
    /// `http(s)://` URL, optionally with a path prefix. `/v1` is appended unless the path
    /// already ends with it. Overrides [`ENV_DOMAIN`].
    #[must_use]
    pub fn domain(mut self, domain: impl Into<String>) -> Self {
        self.domain = Some(domain.into());
        self
    }

    /// The API key (trimmed). Overrides [`ENV_API_KEY`].
    #[must_use]
    pub fn api_key(mut self, key: impl Into<SecretString>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// The timeout of one buffered request, body included (default 30 s). Streams and
    /// downloads use it for the wait for the answer's headers and then for each idle gap.
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// The timeout to open a connection (default 10 s).
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = Some(timeout);
        self
    }

    /// The retry policy (see [`RetryPolicy`]).
    #[must_use]
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = Some(retry);
        self
    }

    /// The `User-Agent` header.
    #[must_use]
    pub fn user_agent(mut self, user_agent: impl Into<String>) -> Self {
        self.user_agent = Some(user_agent.into());
        self
    }

    /// Allow sending the key over plain `http` to a host that is not loopback. Off by default:
    /// without it a non-loopback `http` domain is refused at [`ClientBuilder::build`]. Only
    /// `localhost`, `127.0.0.0/8` and `::1` count as loopback.
    #[must_use]
    pub fn allow_insecure_http(mut self, allow: bool) -> Self {
        self.allow_insecure_http = allow;
        self
    }

    /// Read [`ENV_DOMAIN`] and [`ENV_API_KEY`] through `lookup` instead of the process
    /// environment (for tests and embedders).
    #[must_use]
    pub fn env_lookup(
        mut self,
        lookup: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.env = Some(Arc::new(lookup));
        self
    }

    /// Check every setting and build the client. The domain and key fall back to
    /// [`ENV_DOMAIN`] (then [`DEFAULT_DOMAIN`]) and [`ENV_API_KEY`]; a missing or blank key,
    /// an unusable domain, a zero timeout or an invalid retry policy is an [`Error::Config`].
    pub fn build(self) -> Result<crate::Client> {
        let env = |name: &str| -> Option<String> {
            let value = match &self.env {
                Some(lookup) => lookup(name),
                None => std::env::var(name).ok(),
            };
            value.filter(|v| !v.trim().is_empty())
        };
        let domain = self
            .domain
            .clone()
            .or_else(|| env(ENV_DOMAIN))
            .unwrap_or_else(|| DEFAULT_DOMAIN.to_owned());
        let base = base_url(&domain)?;
        if base.scheme() == "http" && !self.allow_insecure_http && !is_loopback(&base) {
            return Err(Error::Config(format!(
                "refusing to send the API key over plain http to {}: set {ENV_DOMAIN} to an \
                 https:// URL, or opt in with ClientBuilder::allow_insecure_http(true)",
                base.host_str().unwrap_or_default()
            )));
        }
        let key = self
            .api_key
            .clone()
            .or_else(|| env(ENV_API_KEY).map(SecretString::from))
            .ok_or_else(|| {
                Error::Config(format!(
                    "no API key: set {ENV_API_KEY} or pass ClientBuilder::api_key"
                ))
            })?;
        let key = SecretString::from(key.expose_secret().trim().to_owned());
        if key.expose_secret().is_empty() {
            return Err(Error::Config(format!(
                "the API key ({ENV_API_KEY}) is blank"
            )));
        }
        if HeaderValue::from_str(key.expose_secret()).is_err() {
            return Err(Error::Config(format!(
                "the API key ({ENV_API_KEY}) contains characters a header cannot carry"
            )));
        }
        let timeout = self.timeout.unwrap_or(DEFAULT_TIMEOUT);
        let connect_timeout = self.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT);
        if timeout.is_zero() || connect_timeout.is_zero() {
            return Err(Error::Config("timeouts must be > 0".into()));
        }
        let retry = self.retry.unwrap_or_default();
        retry.check()?;
        let user_agent =
            HeaderValue::from_str(self.user_agent.as_deref().unwrap_or(DEFAULT_USER_AGENT))
                .map_err(|_| Error::Config("the user agent is not a valid header value".into()))?;
        // No redirects (a `Location` could carry the key elsewhere) and no proxy from the
        // environment (`HTTP_PROXY` would see the key of a plain-http server).
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .connect_timeout(connect_timeout)
            .build()
            .map_err(|e| Error::Config(format!("cannot build the HTTP client: {e}")))?;
        let transport = Transport::new(http, base, key, timeout, retry, user_agent);
        Ok(crate::Client::from_transport(transport))
    }
}

/// The API base (`…/v1`) for a domain as the SDK reads it.
pub(crate) fn base_url(domain: &str) -> Result<Url> {
    let domain = domain.trim();
    if domain.is_empty() {
        return Err(Error::Config(format!("{ENV_DOMAIN} is blank")));
    }
    let lower = domain.to_ascii_lowercase();
    let with_scheme = if lower.starts_with("http://") || lower.starts_with("https://") {
        domain.to_owned()
    } else if lower.contains("://") {
        return Err(Error::Config(format!(
            "{ENV_DOMAIN} {}: only http:// and https:// are supported",
            shown_domain(domain)
        )));
    } else {
        format!("http://{domain}")
    };
    let mut url = Url::parse(&with_scheme).map_err(|e| {
        Error::Config(format!(
            "{ENV_DOMAIN} {} is not a host[:port] or URL: {e}",
            shown_domain(domain)
        ))
    })?;
    if url.host_str().is_none_or(str::is_empty) {
        return Err(Error::Config(format!("{ENV_DOMAIN} has no host")));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Error::Config(format!(
            "{ENV_DOMAIN} must not carry credentials; pass the key as {ENV_API_KEY}"
        )));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(Error::Config(format!(
            "{ENV_DOMAIN} must not have a query or fragment"
        )));
    }
    let path = url.path().trim_end_matches('/').to_owned();
    if path.ends_with("/v1") {
        url.set_path(&path);
    } else {
        url.set_path(&format!("{path}/v1"));
    }
    Ok(url)
}

/// A domain as it may be shown: anything after `?` or `#` dropped and a `user:pw@` hidden.
pub(crate) fn shown_domain(domain: &str) -> String {
    let kept = domain.split(['?', '#']).next().unwrap_or_default();
    let (scheme, rest) = kept.split_at(kept.find("://").map_or(0, |i| i + 3));
    match rest.rfind('@') {
        Some(at) => format!("{scheme}***@{}", &rest[at + 1..]),
        None => kept.to_owned(),
    }
}

/// Whether the URL's host is `localhost`, in `127.0.0.0/8` or `::1`.
fn is_loopback(url: &Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip).is_loopback(),
        Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip).is_loopback(),
        Some(url::Host::Domain(name)) => {
            name.trim_end_matches('.').eq_ignore_ascii_case("localhost")
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domains_are_read_as_the_sdk_reads_them() {
        let cases = [
            ("localhost:8080", "http://localhost:8080/v1"),
            ("127.0.0.1:8080/", "http://127.0.0.1:8080/v1"),
            ("https://sb.example.com", "https://sb.example.com/v1"),
            (
                "HTTPS://sb.example.com:8443/api/",
                "https://sb.example.com:8443/api/v1",
            ),
            ("http://[::1]:8080/v1", "http://[::1]:8080/v1"),
        ];
        for (domain, want) in cases {
            assert_eq!(base_url(domain).unwrap().as_str(), want, "{domain}");
        }
        for bad in ["", "ftp://x", "https://u:pw@h", "https://h/?t=1", "http://"] {
            assert!(base_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn loopback_is_only_localhost_127_and_v6_one() {
        for (u, want) in [
            ("http://localhost/", true),
            ("http://127.8.0.1/", true),
            ("http://[::1]/", true),
            ("http://a.localhost/", false),
            ("http://10.0.0.1/", false),
        ] {
            assert_eq!(is_loopback(&Url::parse(u).unwrap()), want, "{u}");
        }
    }

    #[test]
    fn shown_domains_hide_credentials_and_queries() {
        assert_eq!(shown_domain("https://u:pw@h:1/x?k=v"), "https://***@h:1/x");
        assert_eq!(shown_domain("u:p@h"), "***@h");
    }

    #[test]
    fn delays_grow_stay_capped_and_respect_retry_after() {
        let p = RetryPolicy {
            max_retries: 5,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
            budget: Duration::from_secs(10),
        };
        for _ in 0..20 {
            let first = p.delay(0, None);
            assert!(first >= Duration::from_millis(100) && first < Duration::from_millis(200));
            assert!(p.delay(2, None) >= Duration::from_millis(400));
            assert_eq!(p.delay(30, None), Duration::from_secs(1));
            assert_eq!(
                p.delay(0, Some(Duration::from_secs(60))),
                Duration::from_secs(1)
            );
            assert!(p.delay(0, Some(Duration::ZERO)) >= Duration::from_millis(100));
        }
    }
}
