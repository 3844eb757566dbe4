//! One classification of control-plane call failures, with one wording, for every surface.
//!
//! A failed call is one of: **unavailable** (refused or rejected: fix the configuration; lfx's
//! `SandboxUnavailableError`), **not started** (a transient failure before the program was
//! dispatched), or **may have run** (anything after the exec request was sent). A shutdown that
//! overtook the work reads as the shutdown. The hints that tell a user what to do exist here
//! only.
//!
//! Every message names the provider the guest ran on ([`ProviderKind::display_name`]), and a
//! hint names that provider's settings: an OpenSandbox operator is never told about CreateOS.

use crate::control::{CallError, CallFailure};
use crate::error::{ErrorKind, Redactor, SandboxError};
use crate::provider::ProviderKind;

/// Whether the program may have started when something failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Nothing was dispatched: the program certainly did not run.
    BeforeDispatch,
    /// The exec request was sent.
    Dispatched,
}

/// The hint for a failure of `failure` on `provider`, or `""` when there is nothing to add.
pub fn hint(provider: ProviderKind, failure: CallFailure, stage: Stage) -> String {
    match (provider, failure, stage) {
        (ProviderKind::CreateOs, CallFailure::Status(401), _) => {
            " Check CREATEOS_SANDBOX_API_KEY (or CREATEOS_API_KEY); get a key at \
             https://createos.nodeops.network/profile."
                .to_owned()
        }
        (_, CallFailure::Status(401), _) => format!(
            " Check {}: the {} server did not accept it.",
            provider.key_setting(),
            provider.display_name()
        ),
        (_, CallFailure::Status(403), _) => {
            " The key is not allowed to do this (quota or scope).".to_owned()
        }
        (ProviderKind::CreateOs, CallFailure::Redirect, _) => {
            " The control plane redirected; set CREATEOS_SANDBOX_BASE_URL to the final URL."
                .to_owned()
        }
        (_, CallFailure::Redirect, _) => format!(
            " The {} server redirected; set {} to the final address.",
            provider.display_name(),
            provider.address_setting()
        ),
        (_, f, Stage::BeforeDispatch) if kind_before_dispatch(f) == ErrorKind::Transient => {
            " The program was not started; retrying later may succeed.".to_owned()
        }
        _ => String::new(),
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

/// The error every surface gives when a shutdown overtook its work on `provider`.
pub fn shut_down(provider: ProviderKind, stage: Stage) -> SandboxError {
    let name = provider.display_name();
    match stage {
        Stage::BeforeDispatch => SandboxError::new(
            ErrorKind::Transient,
            format!(
                "{name} sandboxes in this process were shut down while this run was starting; \
                 the program was not started"
            ),
        ),
        Stage::Dispatched => SandboxError::new(
            ErrorKind::OutcomeUnknown,
            format!(
                "{name} sandboxes in this process were shut down while the program was \
                 running; the code may have run but did not finish"
            ),
        ),
    }
}

/// A call `op` to `provider` that failed before anything was dispatched (create, upload,
/// read-back, credential check, catalog, a declined exec): unavailable or not started. With
/// `closed` (shutdown began), whatever the control plane answered reads as the shutdown.
pub fn before_dispatch(
    provider: ProviderKind,
    op: &str,
    e: &CallError,
    closed: bool,
    redactor: &Redactor,
) -> SandboxError {
    if closed {
        return shut_down(provider, Stage::BeforeDispatch);
    }
    let hint = hint(provider, e.failure, Stage::BeforeDispatch);
    failed(provider, op, e, &hint, redactor).with_retry_after(e.retry_after)
}

/// A call `op` to `provider` that has nothing to do with a program (a download, a listing):
/// unavailable, or transient ("retrying later may succeed").
pub fn call_failed(
    provider: ProviderKind,
    op: &str,
    e: &CallError,
    closed: bool,
    redactor: &Redactor,
) -> SandboxError {
    let name = provider.display_name();
    if closed {
        return SandboxError::new(
            ErrorKind::Transient,
            format!("{name} sandboxes in this process were shut down before the {op} finished"),
        );
    }
    let hint = match kind_before_dispatch(e.failure) {
        ErrorKind::Transient => " Retrying later may succeed.".to_owned(),
        _ => hint(provider, e.failure, Stage::Dispatched),
    };
    failed(provider, op, e, &hint, redactor)
}

fn failed(
    provider: ProviderKind,
    op: &str,
    e: &CallError,
    hint: &str,
    redactor: &Redactor,
) -> SandboxError {
    let detail = redactor.cap(&e.message);
    let name = provider.display_name();
    SandboxError::new(
        kind_before_dispatch(e.failure),
        format!("{name} {op} failed: {detail}.{hint}"),
    )
    .redacted(redactor)
}

/// An exec request to `provider` that was sent and failed: rejected (a 4xx, a redirect: not
/// started) or may have run.
pub fn after_dispatch(
    provider: ProviderKind,
    e: &CallError,
    closed: bool,
    redactor: &Redactor,
) -> SandboxError {
    if closed {
        return shut_down(provider, Stage::Dispatched);
    }
    let name = provider.display_name();
    let detail = redactor.cap(&e.message);
    let rejected = match e.failure {
        CallFailure::Status(s) => (400..500).contains(&s),
        CallFailure::Redirect | CallFailure::Config => true,
        _ => false,
    };
    if rejected {
        let hint = hint(provider, e.failure, Stage::Dispatched);
        SandboxError::new(
            ErrorKind::Rejected,
            format!("{name} exec was rejected: {detail}. The program was not started.{hint}"),
        )
    } else {
        SandboxError::new(
            ErrorKind::OutcomeUnknown,
            format!(
                "{name} exec failed after the program was dispatched ({detail}); the code may \
                 have run. It was not retried"
            ),
        )
    }
    .redacted(redactor)
}

/// An exec stream from `provider` that broke after the program was dispatched, with how much
/// output arrived.
pub fn stream_broke(
    provider: ProviderKind,
    e: &CallError,
    stdout: u64,
    stderr: u64,
    redactor: &Redactor,
) -> SandboxError {
    let detail = redactor.cap(&e.message);
    let name = provider.display_name();
    SandboxError::new(
        ErrorKind::OutcomeUnknown,
        format!(
            "the exec stream from {name} broke after the program was dispatched ({detail}); \
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
            let err = before_dispatch(ProviderKind::CreateOs, "create", &e(failure), false, &r);
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
            let err = after_dispatch(ProviderKind::CreateOs, &e(f), false, &r);
            assert_eq!(err.kind(), ErrorKind::OutcomeUnknown);
            assert!(err.message().contains("may have run"), "{err}");
        }
        let err = after_dispatch(
            ProviderKind::CreateOs,
            &e(CallFailure::Status(400)),
            false,
            &r,
        );
        assert_eq!(err.kind(), ErrorKind::Rejected);
        assert!(err.message().contains("not started"), "{err}");
    }

    #[test]
    fn a_closed_session_reads_as_the_shutdown() {
        let r = Redactor::default();
        let err = before_dispatch(
            ProviderKind::CreateOs,
            "upload",
            &e(CallFailure::Status(409)),
            true,
            &r,
        );
        assert!(err.message().contains("shut down") && err.message().contains("not started"));
        let err = after_dispatch(ProviderKind::CreateOs, &e(CallFailure::Transport), true, &r);
        assert_eq!(err.kind(), ErrorKind::OutcomeUnknown);
        assert!(err.message().contains("shut down"));
    }

    #[test]
    fn every_message_names_the_provider_it_ran_on() {
        let r = Redactor::default();
        let os = ProviderKind::OpenSandbox;
        let messages = [
            before_dispatch(os, "create", &e(CallFailure::Status(422)), false, &r),
            before_dispatch(os, "create", &e(CallFailure::Status(401)), false, &r),
            before_dispatch(os, "create", &e(CallFailure::Redirect), false, &r),
            before_dispatch(os, "create", &e(CallFailure::Transport), true, &r),
            call_failed(os, "download", &e(CallFailure::Status(404)), false, &r),
            call_failed(os, "download", &e(CallFailure::Transport), true, &r),
            after_dispatch(os, &e(CallFailure::Status(400)), false, &r),
            after_dispatch(os, &e(CallFailure::Transport), false, &r),
            after_dispatch(os, &e(CallFailure::Transport), true, &r),
            shut_down(os, Stage::BeforeDispatch),
            stream_broke(os, &e(CallFailure::Transport), 1, 2, &r),
        ];
        for err in messages {
            let m = err.message();
            assert!(m.contains("OpenSandbox"), "{m}");
            assert!(!m.contains("CreateOS") && !m.contains("CREATEOS"), "{m}");
        }
        let m = before_dispatch(os, "create", &e(CallFailure::Status(401)), false, &r);
        assert!(m.message().contains("OPEN_SANDBOX_API_KEY"), "{m}");
        // CreateOS keeps its wording, byte for byte.
        let m = stream_broke(ProviderKind::CreateOs, &e(CallFailure::Transport), 1, 2, &r);
        assert!(
            m.message().starts_with(
                "the exec stream from CreateOS broke after the program was dispatched ("
            ),
            "{m}"
        );
        let m = shut_down(ProviderKind::CreateOs, Stage::BeforeDispatch);
        assert_eq!(
            m.message(),
            "CreateOS sandboxes in this process were shut down while this run was starting; \
             the program was not started"
        );
    }
}
