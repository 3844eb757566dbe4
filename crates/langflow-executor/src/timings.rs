//! Where a flow run's time went, phase by phase, in sandbox-core's one [`Timings`]: what the
//! host measured on its own clock and what the guest runner reported of its own (bounded by
//! [`reported`], since the guest is not trusted).
//!
//! A run's phases, in order, on the cold path (a warm pool guest skips create and the preload):
//!
//! 1. on the host, before any guest: the settings and gateway checks (`plan_ms`), reading the
//!    uploaded files (`files_ms`), the credential check and the shape catalog (`open_ms`, 0 once
//!    cached in the process);
//! 2. the guest: admission and create, or taking a pool guest (`acquire_ms`);
//! 3. the runner started at once (`dispatch_ms`: its upload and the exec request), so the guest
//!    imports lfx (`guest_preload_ms`, the guest's clock) while the host resolves what the flow
//!    needs (`host_context_ms`, the glue's variable resolution, history and file collection and
//!    the graph's dump, measured by the glue) and uploads the job (`job_ms`, from the guest's
//!    create to the job written, the egress read-back included);
//! 4. the runner's hello (`runner_ready_ms`, from the exec request to the hello frame: the guest's
//!    Python start, the preload and the wait for the job, `guest_wait_ms`, which is 0 when the
//!    job was there first);
//! 5. the graph rebuilt in the guest (`rebuild_ms`, the guest's clock), then the first vertex
//!    (`first_event_ms`, from the run's start to the first vertex event on the host's clock) and
//!    the end (`total_ms`).

use serde_json::Value;

pub use sandbox_core::timings::{Timings, ms, since};

/// The longest duration a guest may report for one of its phases (one day); anything else
/// reads as not reported.
pub const MAX_REPORTED_MS: u64 = 86_400_000;
/// [`MAX_REPORTED_MS`] as a float (exactly representable).
const MAX_REPORTED_F64: f64 = 86_400_000.0;

/// A duration the guest (or the glue) reported: a whole, non-negative number of milliseconds up
/// to [`MAX_REPORTED_MS`], else `None`.
pub fn reported(value: &Value) -> Option<u64> {
    if let Some(n) = value.as_u64() {
        return (n <= MAX_REPORTED_MS).then_some(n);
    }
    let f = value.as_f64()?.round();
    // In range, the cast is exact.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let n = (f.is_finite() && (0.0..=MAX_REPORTED_F64).contains(&f)).then_some(f as u64);
    n
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reported_durations_are_bounded() {
        assert_eq!(reported(&json!(12)), Some(12));
        assert_eq!(reported(&json!(12.6)), Some(13));
        assert_eq!(reported(&json!(MAX_REPORTED_MS)), Some(MAX_REPORTED_MS));
        for bad in [
            json!(-1),
            json!(MAX_REPORTED_MS + 1),
            json!(1e300),
            json!("5"),
            json!(null),
            json!([1]),
        ] {
            assert_eq!(reported(&bad), None, "{bad}");
        }
    }
}
