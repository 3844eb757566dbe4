//! The error taxonomy shared by every surface, and key redaction.
//!
//! | kind | retried? | what Langflow sees |
//! |---|---|---|
//! | [`ErrorKind::Refused`] | never | `SandboxUnavailableError` |
//! | [`ErrorKind::Rejected`] | never | `SandboxUnavailableError` |
//! | [`ErrorKind::AtCapacity`] | waited for, inside the admission wait | `SandboxUnavailableError` |
//! | [`ErrorKind::Transient`] | before dispatch, inside a deadline | `SandboxExecutionError` |
//! | [`ErrorKind::OutcomeUnknown`] | never (the code may have run) | `SandboxExecutionError` |

use std::fmt;

/// What went wrong, at the granularity a caller acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Refused by policy before any guest existed, or a guest that does not honour the policy
    /// (missing key, hostname allowlist, link-local hole not accepted, shape too small,
    /// egress read-back mismatch, a bad setting).
    Refused,
    /// The control plane answered with a 4xx other than 429 (bad key, quota, validation).
    Rejected,
    /// 429, 5xx or a transport failure *before* the program was dispatched; retried with
    /// backoff inside a deadline, and reported when it persists.
    Transient,
    /// A failure *after* the program was dispatched: the code may have run.
    OutcomeUnknown,
    /// Nothing ran because the process (`CREATEOS_MAX_LIVE_GUESTS`), the flow
    /// (`CREATEOS_MAX_LIVE_GUESTS_PER_FLOW`) or the CreateOS account (its quota, 429 on create)
    /// had no room for another guest within the run's admission wait.
    AtCapacity,
}

impl ErrorKind {
    /// True for the kinds that mean "this sandbox cannot be used as configured" (fail closed),
    /// which lfx spells `SandboxUnavailableError`.
    pub fn is_unavailable(self) -> bool {
        matches!(
            self,
            ErrorKind::Refused | ErrorKind::Rejected | ErrorKind::AtCapacity
        )
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::Refused => "refused",
            ErrorKind::Rejected => "rejected",
            ErrorKind::Transient => "transient",
            ErrorKind::OutcomeUnknown => "outcome unknown",
            ErrorKind::AtCapacity => "at capacity",
        })
    }
}

/// An error from sandbox-core: a [`ErrorKind`] and a human message that names the setting or
/// the call involved and, where there is one, the fix. Messages never contain the API key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SandboxError {
    kind: ErrorKind,
    message: String,
    retry_after: Option<std::time::Duration>,
}

impl SandboxError {
    /// Builds an error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            retry_after: None,
        }
    }

    /// The server's `Retry-After` on the call that failed, when it sent one: how long a caller
    /// that tries again later (the warm pool's refill) should wait at least.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        self.retry_after
    }

    /// The same error, carrying the server's `Retry-After`.
    #[must_use]
    pub fn with_retry_after(mut self, retry_after: Option<std::time::Duration>) -> Self {
        self.retry_after = retry_after;
        self
    }

    /// A policy refusal.
    pub fn refused(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Refused, message)
    }

    /// The kind of failure.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message (also the `Display` form).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Returns the same error with every occurrence of the key replaced by `[REDACTED]`.
    #[must_use]
    pub fn redacted(self, redactor: &Redactor) -> Self {
        Self {
            kind: self.kind,
            message: redactor.apply(&self.message),
            retry_after: self.retry_after,
        }
    }
}

/// The one key redaction of this workspace, `outside_text::secrets` (shared with createos-api:
/// every whole secret, and `x-api-key` header values), with its constants and its cap of
/// server-provided detail.
pub use outside_text::secrets::{
    MAX_DETAIL_CHARS, MIN_SECRET_FRAGMENT, REDACTED, Redactor, cap_detail, redact_url,
};

/// Whether `c` must not reach a terminal or a log line as it is; the workspace's one rule,
/// [`outside_text::is_unsafe`].
pub use outside_text::is_unsafe as is_unsafe_outside_char;

/// Text a server sent (a store's error reply, a database's message) as it may enter an error,
/// a log record or `doctor`'s report: the secrets of `redactor` masked (before and after the
/// cut, so none straddles it), cut to [`MAX_DETAIL_CHARS`] characters (`…` when it was cut, as
/// control-plane snippets are cut by [`cap_detail`]), then [`outside_text::line`]. Reads at
/// most a few times [`MAX_DETAIL_CHARS`] characters of `text`, however long it is.
pub fn outside_text(text: &str, redactor: &Redactor) -> String {
    let text = text.trim();
    let shown = if text.char_indices().nth(MAX_DETAIL_CHARS).is_some() {
        format!("{}…", redactor.shorten(text, MAX_DETAIL_CHARS).trim_end())
    } else {
        redactor.apply(text)
    };
    outside_text::line(&shown).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_kinds() {
        assert!(ErrorKind::Refused.is_unavailable());
        assert!(ErrorKind::Rejected.is_unavailable());
        assert!(ErrorKind::AtCapacity.is_unavailable());
        assert!(!ErrorKind::Transient.is_unavailable());
        assert!(!ErrorKind::OutcomeUnknown.is_unavailable());
    }

    #[test]
    fn outside_text_is_one_bounded_line_with_no_control_and_no_secret() {
        let hostile = format!(
            "ERR \x1b[2J\x1b]0;owned\x07line\\nnext\r\n\u{85}\u{2028}\u{2029}\u{202e}rev\u{2066}\u{7f} \
             pw-secret-123 {}",
            "x".repeat(5 << 20)
        );
        let shown = outside_text(&hostile, &Redactor::new("pw-secret-123"));
        assert!(
            shown.chars().count() < MAX_DETAIL_CHARS * 2,
            "{}",
            shown.len()
        );
        assert!(shown.ends_with('…'));
        assert!(!shown.chars().any(is_unsafe_outside_char), "{shown}");
        assert!(!shown.contains("pw-secret"), "{shown}");
        assert!(
            shown.starts_with(
                "ERR \\x1b[2J\\x1b]0;owned\\x07line\\nnext\\r\\n\\x85\\u{2028}\\u{2029}\\u{202e}rev\\u{2066}\\x7f [REDACTED]"
            ),
            "{shown}"
        );
        // Plain text is kept as it is, and short text is not cut.
        assert_eq!(
            outside_text("relation \"x\" does not exist", &Redactor::default()),
            "relation \"x\" does not exist"
        );
        // A secret straddling the cut leaves no fragment before the mark.
        let key = "sk_live_0123456789abcdef";
        for offset in MAX_DETAIL_CHARS - 20..MAX_DETAIL_CHARS + 2 {
            let text = format!("{}{key}{}", "a".repeat(offset), "b".repeat(600));
            let shown = outside_text(&text, &Redactor::new(key));
            assert!(!shown.contains("sk_live"), "{offset}: {shown}");
        }
    }

    #[test]
    fn error_redaction_keeps_kind() {
        let e = SandboxError::new(ErrorKind::Rejected, "HTTP 401 for key k-0000-1111");
        let e = e.redacted(&Redactor::new("k-0000-1111"));
        assert_eq!(e.kind(), ErrorKind::Rejected);
        assert_eq!(e.to_string(), "HTTP 401 for key [REDACTED]");
    }
}
