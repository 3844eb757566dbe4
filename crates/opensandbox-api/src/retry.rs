//! The retry policy: when a call that is safe to repeat is repeated, and how long the client
//! waits in between. Which calls are safe is the transport's business; this is only the timing.

use std::time::Duration;

use crate::error::{Error, Result};

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

    pub(crate) fn check(&self) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
