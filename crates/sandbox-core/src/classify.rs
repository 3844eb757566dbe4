//! One classification of control-plane call failures, with one wording, for every surface.
//!
//! A failed call is one of: **unavailable** (refused or rejected: fix the configuration; lfx's
//! `SandboxUnavailableError`), **not started** (a transient failure before the program was
//! dispatched), or **may have run** (anything after the exec request was sent). A shutdown that
//! overtook the work reads as the shutdown. The hints that tell a user what to do exist here
//! only.

use crate::control::{CallError, CallFailure};
use crate::error::{ErrorKind, Redactor, SandboxError};

/// Whether the program may have started when something failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Nothing was dispatched: the program certainly did not run.
    BeforeDispatch,
    /// The exec request was sent.
    Dispatched,
}

/// The hint for a failure of `failure`, or `""` when there is nothing to add.
pub fn hint(failure: CallFailure, stage: Stage) -> &'static str {
    match (failure, stage) {
        (CallFailure::Status(401), _) => {
            " Check CREATEOS_SANDBOX_API_KEY (or CREATEOS_API_KEY); get a key at \
             https://createos.nodeops.network/profile."
        }
        (CallFailure::Status(403), _) => " The key is not allowed to do this (quota or scope).",
        (CallFailure::Redirect, _) => {
            " The control plane redirected; set CREATEOS_SANDBOX_BASE_URL to the final URL."
        }
        (f, Stage::BeforeDispatch) if kind_before_dispatch(f) == ErrorKind::Transient => {
            " The program was not started; retrying later may succeed."
        }
        _ => "",
    }
}

/// The kind of a failure before dispatch: 4xx (but 429) and redirects are rejections, a call
/// the client refused to send is a refusal, everything else is transient.
fn kind_before_dispatch(failure: CallFailure) -> ErrorKind {
    match failure {
        CallFailure::Status(s) if (400..500).contains(&s) && s != 429 => ErrorKind::Rejected,
        CallFailure::Redirect => ErrorKind::Rejected,
        CallFailure::Config | CallFailure::TooLarge => ErrorKind::Refused,
        _ => ErrorKind::Transient,
    }
}

/// The error every surface gives when a shutdown overtook its work.
pub fn shut_down(stage: Stage) -> SandboxError {
    match stage {
        Stage::BeforeDispatch => SandboxError::new(
            ErrorKind::Transient,
            "CreateOS sandboxes in this process were shut down while this run was starting; \
             the program was not started",
        ),
        Stage::Dispatched => SandboxError::new(
            ErrorKind::OutcomeUnknown,
            "CreateOS sandboxes in this process were shut down while the program was running; \
             the code may have run but did not finish",
        ),
    }
}

/// A call `op` that failed before anything was dispatched (create, upload, read-back,
/// credential check, catalog, a declined exec): unavailable or not started. With `closed`
/// (shutdown began), whatever the control plane answered reads as the shutdown.
pub fn before_dispatch(op: &str, e: &CallError, closed: bool, redactor: &Redactor) -> SandboxError {
    if closed {
        return shut_down(Stage::BeforeDispatch);
    }
    failed(op, e, hint(e.failure, Stage::BeforeDispatch), redactor).with_retry_after(e.retry_after)
}

/// A call `op` that has nothing to do with a program (a download, a listing): unavailable,
/// or transient ("retrying later may succeed").
pub fn call_failed(op: &str, e: &CallError, closed: bool, redactor: &Redactor) -> SandboxError {
    if closed {
        return SandboxError::new(
            ErrorKind::Transient,
            format!("CreateOS sandboxes in this process were shut down before the {op} finished"),
        );
    }
    let hint = match kind_before_dispatch(e.failure) {
        ErrorKind::Transient => " Retrying later may succeed.",
        _ => hint(e.failure, Stage::Dispatched),
    };
    failed(op, e, hint, redactor)
}

fn failed(op: &str, e: &CallError, hint: &str, redactor: &Redactor) -> SandboxError {
    let detail = redactor.cap(&e.message);
    SandboxError::new(
        kind_before_dispatch(e.failure),
        format!("CreateOS {op} failed: {detail}.{hint}"),
    )
    .redacted(redactor)
}

/// An exec request that was sent and failed: rejected (a 4xx, a redirect: not started) or
/// may have run.
pub fn after_dispatch(e: &CallError, closed: bool, redactor: &Redactor) -> SandboxError {
    if closed {
        return shut_down(Stage::Dispatched);
    }
    let detail = redactor.cap(&e.message);
    let rejected = match e.failure {
        CallFailure::Status(s) => (400..500).contains(&s),
        CallFailure::Redirect | CallFailure::Config => true,
        _ => false,
    };
    if rejected {
        let hint = hint(e.failure, Stage::Dispatched);
        SandboxError::new(
            ErrorKind::Rejected,
            format!("CreateOS exec was rejected: {detail}. The program was not started.{hint}"),
        )
    } else {
        SandboxError::new(
            ErrorKind::OutcomeUnknown,
            format!(
                "CreateOS exec failed after the program was dispatched ({detail}); the code may \
                 have run. It was not retried"
            ),
        )
    }
    .redacted(redactor)
}

/// An exec stream that broke after the program was dispatched, with how much output arrived.
pub fn stream_broke(e: &CallError, stdout: u64, stderr: u64, redactor: &Redactor) -> SandboxError {
    let detail = redactor.cap(&e.message);
    SandboxError::new(
        ErrorKind::OutcomeUnknown,
        format!(
            "the exec stream from CreateOS broke after the program was dispatched ({detail}); \
             the code may have run ({stdout} bytes of stdout and {stderr} of stderr had \
             arrived). It was not retried"
        ),
    )
    .redacted(redactor)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(failure: CallFailure) -> CallError {
        CallError::new(failure, "HTTP answer for key sk-classify-123456")
    }

    #[test]
    fn before_dispatch_kinds_and_hints() {
        let r = Redactor::new("sk-classify-123456");
        let cases = [
            (
                CallFailure::Status(401),
                ErrorKind::Rejected,
                "CREATEOS_SANDBOX_API_KEY",
            ),
            (
                CallFailure::Status(403),
                ErrorKind::Rejected,
                "quota or scope",
            ),
            (CallFailure::Status(422), ErrorKind::Rejected, ""),
            (
                CallFailure::Redirect,
                ErrorKind::Rejected,
                "CREATEOS_SANDBOX_BASE_URL",
            ),
            (CallFailure::Config, ErrorKind::Refused, ""),
            (
                CallFailure::Status(429),
                ErrorKind::Transient,
                "not started",
            ),
            (
                CallFailure::Status(503),
                ErrorKind::Transient,
                "not started",
            ),
            (CallFailure::Transport, ErrorKind::Transient, "not started"),
            (CallFailure::Timeout, ErrorKind::Transient, "not started"),
        ];
        for (failure, kind, needle) in cases {
            let err = before_dispatch("create", &e(failure), false, &r);
            assert_eq!(err.kind(), kind, "{failure:?}");
            assert!(err.message().contains(needle), "{failure:?}: {err}");
            assert!(!err.message().contains("sk-classify"), "{err}");
        }
    }

    #[test]
    fn after_dispatch_is_may_have_run_unless_rejected() {
        let r = Redactor::default();
        for f in [
            CallFailure::Transport,
            CallFailure::Timeout,
            CallFailure::Status(500),
        ] {
            let err = after_dispatch(&e(f), false, &r);
            assert_eq!(err.kind(), ErrorKind::OutcomeUnknown);
            assert!(err.message().contains("may have run"), "{err}");
        }
        let err = after_dispatch(&e(CallFailure::Status(400)), false, &r);
        assert_eq!(err.kind(), ErrorKind::Rejected);
        assert!(err.message().contains("not started"), "{err}");
    }

    #[test]
    fn a_closed_session_reads_as_the_shutdown() {
        let r = Redactor::default();
        let err = before_dispatch("upload", &e(CallFailure::Status(409)), true, &r);
        assert!(err.message().contains("shut down") && err.message().contains("not started"));
        let err = after_dispatch(&e(CallFailure::Transport), true, &r);
        assert_eq!(err.kind(), ErrorKind::OutcomeUnknown);
        assert!(err.message().contains("shut down"));
    }
}
