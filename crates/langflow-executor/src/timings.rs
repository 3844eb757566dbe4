//! Where a flow run's time went, phase by phase: what the host measured on its own clock and
//! what the guest runner reported of its own (bounded, since the guest is not trusted).
//!
//! A run's phases, in order, on the cold path (a warm pool guest skips create and the preload):
//!
//! 1. on the host, before any guest: the settings and gateway checks (`plan_ms`), reading the
//!    uploaded files (`files_ms`), the credential check and the shape catalog (`open_ms`, 0 once
//!    cached in the process);
//! 2. the guest: admission and create, or taking a pool guest (`create_ms`);
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

use std::time::Duration;

use serde_json::{Map, Value};
use tokio::time::Instant;

/// The longest duration a guest may report for one of its phases (one day); anything else
/// reads as not reported.
pub const MAX_REPORTED_MS: u64 = 86_400_000;
/// [`MAX_REPORTED_MS`] as a float (exactly representable).
const MAX_REPORTED_F64: f64 = 86_400_000.0;

/// Per-phase timings of one flow run, in milliseconds; `None` for a phase the run did not
/// reach (or, for the guest's own figures, did not report).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlowTimings {
    /// Settings and gateway checks.
    pub plan_ms: Option<u64>,
    /// Measuring and reading the run's uploaded files.
    pub files_ms: Option<u64>,
    /// The credential check and the shape catalog (0 once the process has them).
    pub open_ms: Option<u64>,
    /// Admission and create (or taking a warm pool guest).
    pub create_ms: Option<u64>,
    /// From the guest to the runner's exec request accepted (a cold guest: the runner's upload
    /// and the exec; a pool guest: the hand-off's exec, after the job).
    pub dispatch_ms: Option<u64>,
    /// What the glue spent resolving the flow's variables, its history and files and dumping
    /// the graph (reported by the glue; it overlaps the create on the cold path).
    pub host_context_ms: Option<u64>,
    /// From the guest to the job uploaded (the egress read-back and the wait for the glue's
    /// context included).
    pub job_ms: Option<u64>,
    /// From the runner's exec request to its hello frame.
    pub runner_ready_ms: Option<u64>,
    /// The guest runner's import of lfx and its graph machinery (guest clock).
    pub guest_preload_ms: Option<u64>,
    /// How long the guest runner waited for the job after its preload (guest clock).
    pub guest_wait_ms: Option<u64>,
    /// The flow's rebuild in the guest, `Graph.from_payload` and the host context (guest clock).
    pub rebuild_ms: Option<u64>,
    /// From the run's start to its first vertex event.
    pub first_event_ms: Option<u64>,
    /// From the run's start to its end.
    pub total_ms: Option<u64>,
}

impl FlowTimings {
    /// The phases as `(name, value)` pairs, in run order.
    pub fn fields(&self) -> [(&'static str, Option<u64>); 13] {
        [
            ("plan_ms", self.plan_ms),
            ("files_ms", self.files_ms),
            ("open_ms", self.open_ms),
            ("create_ms", self.create_ms),
            ("dispatch_ms", self.dispatch_ms),
            ("host_context_ms", self.host_context_ms),
            ("job_ms", self.job_ms),
            ("runner_ready_ms", self.runner_ready_ms),
            ("guest_preload_ms", self.guest_preload_ms),
            ("guest_wait_ms", self.guest_wait_ms),
            ("rebuild_ms", self.rebuild_ms),
            ("first_event_ms", self.first_event_ms),
            ("total_ms", self.total_ms),
        ]
    }

    /// The phases that were measured, as `name=value` words for a log line.
    pub fn summary(&self) -> String {
        self.fields()
            .iter()
            .filter_map(|(k, v)| v.map(|v| format!("{k}={v}")))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The phases as a JSON object (`null` for a phase not reached).
    pub fn to_json(&self) -> Value {
        let map: Map<String, Value> = self
            .fields()
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.map_or(Value::Null, Value::from)))
            .collect();
        Value::Object(map)
    }
}

/// Milliseconds of `d`, saturating.
pub fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Milliseconds from `since` to now.
pub fn since(since: Instant) -> u64 {
    ms(since.elapsed())
}

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

    #[test]
    fn summary_and_json_show_what_was_measured() {
        let t = FlowTimings {
            plan_ms: Some(1),
            create_ms: Some(40),
            total_ms: Some(900),
            ..FlowTimings::default()
        };
        assert_eq!(t.summary(), "plan_ms=1 create_ms=40 total_ms=900");
        let j = t.to_json();
        assert_eq!(j["create_ms"], json!(40));
        assert_eq!(j["rebuild_ms"], Value::Null);
        assert_eq!(j.as_object().unwrap().len(), 13);
    }
}
