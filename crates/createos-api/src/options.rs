//! Per-request options shared by every call.

use std::time::Duration;

use reqwest::header::HeaderMap;

/// The longest wait a server's `Retry-After` can impose on one retry when
/// [`RetryOptions::max_delay`] is shorter (60 s).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// Retry policy for idempotent-safe failures (see the crate docs for the rules).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryOptions {
    /// Retries after the first attempt (default 2, so 3 attempts in total).
    pub max_retries: u32,
    /// Base of the exponential backoff (default 0.5 s).
    pub base_delay: Duration,
    /// Cap of the exponential backoff (default 30 s). A server's `Retry-After` may
    /// lengthen a wait up to the larger of this and [`MAX_RETRY_AFTER`], never shorten it
    /// below the backoff: see [`RetryOptions::delay`].
    pub max_delay: Duration,
}

impl Default for RetryOptions {
    fn default() -> Self {
        Self {
            max_retries: 2,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
        }
    }
}

impl RetryOptions {
    /// No retries at all.
    pub fn none() -> Self {
        Self {
            max_retries: 0,
            ..Self::default()
        }
    }

    pub(crate) fn validate(&self) -> crate::Result<()> {
        if self.base_delay.is_zero() {
            return Err(crate::Error::Config("retry base_delay must be > 0".into()));
        }
        if self.max_delay < self.base_delay {
            return Err(crate::Error::Config(
                "retry max_delay must be >= base_delay".into(),
            ));
        }
        Ok(())
    }

    /// The wait before retry number `attempt` (0-based) when the server sent
    /// `retry_after` (the parsed `Retry-After`, see [`crate::ApiError::retry_after`]):
    /// `max(backoff(attempt), min(retry_after, max(max_delay, MAX_RETRY_AFTER)))`.
    ///
    /// A server may ask for a *longer* wait, capped so a hostile or confused answer cannot
    /// park the caller for hours; it can never make the client retry faster than its own
    /// backoff schedule (a `Retry-After: 0`, a negative, a date in the past or garbage all
    /// mean "use the backoff"), so a server answering 429 forever cannot turn the client's
    /// retries into a tight loop.
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let backoff = self.backoff(attempt);
        let cap = self.max_delay.max(MAX_RETRY_AFTER);
        match retry_after {
            Some(asked) => backoff.max(asked.min(cap)),
            None => backoff,
        }
    }

    /// The backoff before retry number `attempt` (0-based), without `Retry-After`:
    /// `min(base * 2^attempt + U[0,1) * base, max_delay)`.
    pub(crate) fn backoff(&self, attempt: u32) -> Duration {
        let base = self.base_delay.as_secs_f64();
        let exp = base * f64::from(2u32.saturating_pow(attempt.min(30)));
        let jitter = rand::random::<f64>() * base;
        let secs = (exp + jitter).min(self.max_delay.as_secs_f64());
        Duration::from_secs_f64(secs.max(0.0))
    }
}

/// Options accepted by every call.
#[derive(Debug, Clone, Default)]
pub struct RequestOptions {
    /// Overrides the client's default timeout for this call. For buffered calls (JSON,
    /// plain text) it bounds the whole exchange, body read included; for streams and
    /// downloads it bounds the wait for the response headers and then each idle gap between
    /// two body chunks; for a streamed upload it bounds each gap between two chunks sent and
    /// then the whole answer, headers and body, within one timeout of the body's end (no total
    /// deadline while the body makes progress).
    pub timeout: Option<Duration>,
    /// Disable retries for this call.
    pub disable_retry: bool,
    /// Extra headers. Credential-bearing headers (`Authorization`, `Proxy-Authorization`,
    /// `X-Api-Key`, `X-Auth-Token`, `Cookie`, `Set-Cookie`, `X-CSRF-Token`) are dropped.
    pub headers: HeaderMap,
    /// Overrides the client's retry policy for this call; validated like
    /// [`crate::ClientBuilder::retry`] (an invalid one is an [`crate::Error::Config`] and
    /// nothing is sent).
    pub retry: Option<RetryOptions>,
}

impl RequestOptions {
    /// Options with only a timeout.
    pub fn with_timeout(timeout: Duration) -> Self {
        Self {
            timeout: Some(timeout),
            ..Self::default()
        }
    }
}
