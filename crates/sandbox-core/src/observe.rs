//! Observation: what every guest and run of a process did, for metrics and usage records. The
//! counters, events, observer and usage records are the `sandbox-metrics` crate's (below this
//! one, re-exported here whole); this module adds the readings of the core's own types: a
//! failed run's [`outcome_of`], a control-plane call's [`status_class`] and a policy's
//! [`egress_kind`].

pub use sandbox_metrics::observe::*;

use crate::control::{CallError, CallFailure};
use crate::egress::EgressPolicy;
use crate::error::{ErrorKind, SandboxError};

/// The outcome of a run that failed with `e`.
pub fn outcome_of(e: &SandboxError) -> RunOutcome {
    match e.kind() {
        ErrorKind::Refused | ErrorKind::Rejected => RunOutcome::Refused,
        ErrorKind::AtCapacity | ErrorKind::Transient => RunOutcome::Unavailable,
        ErrorKind::OutcomeUnknown => RunOutcome::MayHaveRun,
    }
}

/// The class of a control-plane call's result.
pub fn status_class<T>(r: &Result<T, CallError>) -> StatusClass {
    match r {
        Ok(_) => StatusClass::Success,
        Err(e) => match e.failure {
            CallFailure::Redirect => StatusClass::of_status(None, true),
            CallFailure::Status(s) if s >= 300 => StatusClass::of_status(Some(s), false),
            _ => StatusClass::of_status(None, false),
        },
    }
}

/// `open`, `none` or `allowlist`: the egress label of a usage record.
pub fn egress_kind(policy: &EgressPolicy) -> &'static str {
    match policy {
        EgressPolicy::AllowAll => "open",
        EgressPolicy::DenyAll => "none",
        EgressPolicy::Rules(_) | EgressPolicy::Domains(_) => "allowlist",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_classes() {
        let e = |f| Err::<(), _>(CallError::new(f, "x"));
        assert_eq!(status_class(&Ok::<(), CallError>(())), StatusClass::Success);
        assert_eq!(
            status_class(&e(CallFailure::Status(429))),
            StatusClass::ClientError
        );
        assert_eq!(
            status_class(&e(CallFailure::Status(503))),
            StatusClass::ServerError
        );
        assert_eq!(
            status_class(&e(CallFailure::Redirect)),
            StatusClass::Redirect
        );
        assert_eq!(
            status_class(&e(CallFailure::Timeout)),
            StatusClass::NoAnswer
        );
    }

    #[test]
    fn outcomes_of_errors() {
        assert_eq!(
            outcome_of(&SandboxError::refused("no")),
            RunOutcome::Refused
        );
        assert_eq!(
            outcome_of(&SandboxError::new(ErrorKind::OutcomeUnknown, "?")),
            RunOutcome::MayHaveRun
        );
    }
}
