//! Backoff for calls that are safe to repeat, bounded by a deadline.

use std::future::Future;
use std::time::Duration;

use rand::Rng;
use tokio::time::Instant;

use crate::LOG_TARGET;
use crate::control::{CallError, CallFailure};

/// Exponential backoff with jitter, bounded by a deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// First delay.
    pub base: Duration,
    /// Largest scheduled delay. A server's `Retry-After` may lengthen a wait beyond it (up to
    /// the deadline), never shorten one below the schedule.
    pub max: Duration,
    /// Total time a call may spend retrying, measured from its first attempt.
    pub budget: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_millis(200),
            max: Duration::from_secs(5),
            budget: Duration::from_secs(30),
        }
    }
}

impl Backoff {
    /// The delay before retry number `attempt` (0-based): `min(base·2^attempt, max)` plus up to
    /// one `base` of jitter.
    pub fn delay(&self, attempt: u32) -> Duration {
        let exp = self.base.saturating_mul(1u32 << attempt.min(16));
        let jitter = self.base.mul_f64(rand::rng().random_range(0.0..1.0));
        exp.min(self.max) + jitter
    }

    /// The wait before retry number `attempt` (0-based) after a failure that carried
    /// `retry_after`: the scheduled [`Backoff::delay`], lengthened to the server's
    /// `Retry-After` when that is longer. A zero, missing or smaller value never shortens the
    /// schedule, so a server answering `Retry-After: 0` cannot turn the retries into a storm.
    pub fn delay_after(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        self.delay(attempt).max(retry_after.unwrap_or_default())
    }
}

/// The least time a retry must have left to be started, for a call whose whole window (first
/// attempt to deadline) is `window`: a quarter of it, at most one second. An attempt with less
/// would most likely be cut at the deadline ([`clipped`]), which turns an answer that said
/// "not done" into an unknown outcome for a call that is not safe to repeat (a create, an
/// exec).
pub fn attempt_floor(window: Duration) -> Duration {
    (window / 4).min(Duration::from_secs(1))
}

/// Whether a retry after waiting `delay` still has [`attempt_floor`] before `deadline`, for a
/// call whose first attempt started at `started`.
pub fn worth_retrying(delay: Duration, started: Instant, deadline: Instant) -> bool {
    let floor = attempt_floor(deadline.saturating_duration_since(started));
    Instant::now() + delay + floor < deadline
}

/// Runs one control-plane call, but never past `deadline`: a call still unanswered then is
/// dropped (which closes its request) and fails as a [`CallFailure::Timeout`] naming `what`.
/// Whatever the per-request timeout of the control plane, no attempt outlives its budget.
///
/// A dropped request may still have reached the server: for a call that is not safe to
/// repeat, the caller treats the timeout as an unknown outcome (a create keeps its name with
/// the reaper; an exec may have run).
pub async fn clipped<T>(
    deadline: Instant,
    what: &str,
    call: impl Future<Output = Result<T, CallError>>,
) -> Result<T, CallError> {
    match tokio::time::timeout_at(deadline, call).await {
        Ok(res) => res,
        Err(_) => Err(CallError::new(
            CallFailure::Timeout,
            format!("{what} was not answered within its budget (the request was abandoned)"),
        )),
    }
}

/// Runs `op` until it succeeds, fails with something `retryable` rejects, or the next attempt
/// would have less than [`attempt_floor`] of its window left before `deadline`. Every attempt is
/// [`clipped`] to what is left of the budget, so the whole call ends by `deadline`. `what`
/// names the operation in logs. Returns the result and the number of attempts made.
pub async fn retry_until<T, F, Fut>(
    backoff: &Backoff,
    deadline: Instant,
    what: &str,
    retryable: impl Fn(&CallError) -> bool,
    mut op: F,
) -> (Result<T, CallError>, u32)
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = Result<T, CallError>>,
{
    let mut attempt = 0u32;
    let started = Instant::now();
    loop {
        let res = clipped(deadline, what, op(attempt)).await;
        attempt += 1;
        match res {
            Ok(v) => return (Ok(v), attempt),
            Err(e) if retryable(&e) => {
                let delay = backoff.delay_after(attempt - 1, e.retry_after);
                if !worth_retrying(delay, started, deadline) {
                    return (Err(e), attempt);
                }
                tracing::info!(
                    target: LOG_TARGET,
                    operation = what,
                    attempt,
                    delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                    error = %e,
                    "retrying a control-plane call that did not reach the program"
                );
                tokio::time::sleep(delay).await;
            }
            Err(e) => return (Err(e), attempt),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn quick() -> Backoff {
        Backoff {
            base: Duration::from_millis(1),
            max: Duration::from_millis(2),
            budget: Duration::from_secs(5),
        }
    }

    #[tokio::test]
    async fn retries_transient_then_succeeds() {
        let n = AtomicU32::new(0);
        let (r, attempts) = retry_until(
            &quick(),
            Instant::now() + Duration::from_secs(5),
            "t",
            CallError::is_transient,
            |_| async {
                if n.fetch_add(1, Ordering::SeqCst) < 2 {
                    Err(CallError::new(CallFailure::Status(503), "busy"))
                } else {
                    Ok(7)
                }
            },
        )
        .await;
        assert_eq!(r.unwrap(), 7);
        assert_eq!(attempts, 3);
    }

    #[tokio::test]
    async fn does_not_retry_rejections() {
        let n = AtomicU32::new(0);
        let (r, attempts) = retry_until(
            &quick(),
            Instant::now() + Duration::from_secs(5),
            "t",
            CallError::is_transient,
            |_| async {
                n.fetch_add(1, Ordering::SeqCst);
                Err::<(), _>(CallError::new(CallFailure::Status(401), "no"))
            },
        )
        .await;
        assert_eq!(r.unwrap_err().failure, CallFailure::Status(401));
        assert_eq!(attempts, 1);
    }

    #[tokio::test]
    async fn stops_at_the_deadline() {
        let (r, attempts) = retry_until(
            &quick(),
            Instant::now() + Duration::from_millis(30),
            "t",
            CallError::is_transient,
            |_| async { Err::<(), _>(CallError::new(CallFailure::Transport, "reset")) },
        )
        .await;
        assert!(r.is_err());
        assert!(attempts >= 2, "{attempts}");
    }

    #[tokio::test]
    async fn retry_after_zero_never_shortens_the_schedule() {
        // A server that declines every call with `Retry-After: 0` gets the backoff schedule,
        // so a 300 ms deadline with a 40 ms base admits a handful of attempts, not hundreds.
        let b = Backoff {
            base: Duration::from_millis(40),
            max: Duration::from_millis(200),
            budget: Duration::from_secs(5),
        };
        let n = AtomicU32::new(0);
        let (r, attempts) = retry_until(
            &b,
            Instant::now() + Duration::from_millis(300),
            "t",
            CallError::is_declined,
            |_| async {
                n.fetch_add(1, Ordering::SeqCst);
                let mut e = CallError::new(CallFailure::Status(429), "slow down");
                e.retry_after = Some(Duration::ZERO);
                Err::<(), _>(e)
            },
        )
        .await;
        assert!(r.is_err());
        // 40+80+160 ms (each plus jitter) already reach the deadline: at most 4 attempts.
        assert!((2..=4).contains(&attempts), "{attempts} attempts");
        assert_eq!(n.load(Ordering::SeqCst), attempts);
    }

    #[tokio::test]
    async fn an_attempt_never_outlives_the_budget() {
        // Declined twice, then no answer at all: the third attempt is cut at the deadline
        // instead of waiting for a request timeout of its own.
        let n = AtomicU32::new(0);
        let t0 = Instant::now();
        let (r, attempts) = retry_until(
            &quick(),
            t0 + Duration::from_millis(300),
            "t",
            CallError::is_transient,
            |_| async {
                if n.fetch_add(1, Ordering::SeqCst) < 2 {
                    Err(CallError::new(CallFailure::Status(503), "busy"))
                } else {
                    std::future::pending::<Result<(), CallError>>().await
                }
            },
        )
        .await;
        let e = r.unwrap_err();
        assert_eq!(e.failure, CallFailure::Timeout);
        assert!(e.message.contains("budget"), "{}", e.message);
        assert_eq!(attempts, 3);
        let took = t0.elapsed();
        assert!(took >= Duration::from_millis(300), "{took:?}");
        assert!(took < Duration::from_secs(3), "{took:?}");
    }

    #[tokio::test]
    async fn a_retry_too_close_to_the_deadline_is_not_started() {
        // Declined every time, each answer taking 100 ms: no attempt starts with less than
        // the floor (a quarter of the 800 ms window) left, so none is cut at the deadline and
        // the last word is the server's "declined", not an unknown outcome.
        let b = Backoff {
            base: Duration::from_millis(10),
            max: Duration::from_millis(20),
            budget: Duration::from_millis(800),
        };
        assert_eq!(attempt_floor(b.budget), Duration::from_millis(200));
        let (r, _) = retry_until(
            &b,
            Instant::now() + b.budget,
            "t",
            CallError::is_declined,
            |_| async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                Err::<(), _>(CallError::new(CallFailure::Status(503), "busy"))
            },
        )
        .await;
        assert_eq!(r.unwrap_err().failure, CallFailure::Status(503));
        assert_eq!(
            attempt_floor(Duration::from_secs(30)),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn retry_after_lengthens_but_never_shortens() {
        let b = quick();
        assert!(b.delay_after(0, Some(Duration::ZERO)) >= b.base);
        assert!(b.delay_after(0, None) >= b.base);
        assert_eq!(
            b.delay_after(3, Some(Duration::from_secs(2))),
            Duration::from_secs(2)
        );
    }

    #[test]
    fn delay_is_capped() {
        let b = quick();
        for a in 0..40 {
            assert!(b.delay(a) <= b.max + b.base);
        }
    }
}
