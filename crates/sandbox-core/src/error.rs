//! The error taxonomy shared by every surface, and key redaction.
//!
//! | kind | retried? | what Langflow sees |
//! |---|---|---|
//! | [`ErrorKind::Refused`] | never | `SandboxUnavailableError` |
//! | [`ErrorKind::Rejected`] | never | `SandboxUnavailableError` |
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
}

impl ErrorKind {
    /// True for the kinds that mean "this sandbox cannot be used as configured" (fail closed),
    /// which lfx spells `SandboxUnavailableError`.
    pub fn is_unavailable(self) -> bool {
        matches!(self, ErrorKind::Refused | ErrorKind::Rejected)
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::Refused => "refused",
            ErrorKind::Rejected => "rejected",
            ErrorKind::Transient => "transient",
            ErrorKind::OutcomeUnknown => "outcome unknown",
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
}

impl SandboxError {
    /// Builds an error of `kind` with `message`.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
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
        }
    }
}

/// Longest message kept from a server-provided body, in characters.
pub const MAX_DETAIL_CHARS: usize = 500;

/// Removes a secret from text that may have passed through a server (which can echo request
/// headers) or through a third-party error type.
///
/// Besides the exact key, it also masks the value of any `x-api-key` header-like fragment, so
/// an echoed header is hidden even if the server altered the key's spelling around it.
#[derive(Clone, Default)]
pub struct Redactor {
    secrets: Vec<String>,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redactor")
            .field("secrets", &self.secrets.len())
            .finish()
    }
}

/// The replacement text for a redacted secret.
pub const REDACTED: &str = "[REDACTED]";

impl Redactor {
    /// A redactor for `secret` (ignored when shorter than 4 characters: redacting a one-letter
    /// "key" would shred every message, and such a key is rejected anyway).
    pub fn new(secret: &str) -> Self {
        let mut r = Self::default();
        r.add(secret);
        r
    }

    /// Adds another secret to hide.
    pub fn add(&mut self, secret: &str) {
        let s = secret.trim();
        if s.len() >= 4 && !self.secrets.iter().any(|x| x == s) {
            self.secrets.push(s.to_owned());
            // Longest first, so a key that contains another is replaced whole.
            self.secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
        }
    }

    /// Returns `text` with every secret replaced and `x-api-key` header values masked.
    pub fn apply(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), REDACTED);
            }
        }
        mask_api_key_headers(&out)
    }
}

/// Masks the value following `x-api-key` (any case) and a `:`/`=`/`"` separator.
fn mask_api_key_headers(text: &str) -> String {
    const NEEDLE: &str = "x-api-key";
    let lower = text.to_ascii_lowercase();
    if !lower.contains(NEEDLE) {
        return text.to_owned();
    }
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while let Some(pos) = lower[i..].find(NEEDLE) {
        let start = i + pos + NEEDLE.len();
        out.push_str(&text[i..start]);
        // Skip separators: quotes, colon, equals, whitespace.
        let mut j = start;
        while j < bytes.len() && matches!(bytes[j], b'"' | b'\'' | b':' | b'=' | b' ' | b'\t') {
            j += 1;
        }
        out.push_str(&text[start..j]);
        if text[j..].starts_with(REDACTED) {
            out.push_str(REDACTED);
            i = j + REDACTED.len();
            continue;
        }
        // The value runs to the next quote, comma, whitespace, brace or bracket.
        let mut k = j;
        while k < bytes.len()
            && !matches!(
                bytes[k],
                b'"' | b'\'' | b',' | b' ' | b'\t' | b'\r' | b'\n' | b'}' | b']' | b';'
            )
        {
            k += 1;
        }
        if k > j {
            out.push_str(REDACTED);
        }
        i = k;
    }
    out.push_str(&text[i..]);
    out
}

/// Truncates server-provided detail to [`MAX_DETAIL_CHARS`] characters (char-boundary safe).
pub fn cap_detail(detail: &str) -> String {
    let detail = detail.trim();
    match detail.char_indices().nth(MAX_DETAIL_CHARS) {
        Some((idx, _)) => format!("{}…", &detail[..idx]),
        None => detail.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_kinds() {
        assert!(ErrorKind::Refused.is_unavailable());
        assert!(ErrorKind::Rejected.is_unavailable());
        assert!(!ErrorKind::Transient.is_unavailable());
        assert!(!ErrorKind::OutcomeUnknown.is_unavailable());
    }

    #[test]
    fn redacts_key_everywhere() {
        let r = Redactor::new("sk-live-123456");
        let msg = r.apply("bad key sk-live-123456 (sk-live-123456)");
        assert!(!msg.contains("sk-live-123456"));
        assert_eq!(msg, "bad key [REDACTED] ([REDACTED])");
    }

    #[test]
    fn masks_echoed_headers_even_without_known_key() {
        let r = Redactor::default();
        let msg = r.apply(r#"{"headers":{"X-Api-Key":"abcdef-secret","accept":"*/*"}}"#);
        assert!(!msg.contains("abcdef-secret"), "{msg}");
        assert!(msg.contains("accept"));
        let msg = r.apply("x-api-key: zzz-secret\r\nhost: a");
        assert!(!msg.contains("zzz-secret"), "{msg}");
        assert!(msg.contains("host: a"));
        let r = Redactor::new("abcdef-secret");
        let msg = r.apply(r#"{"X-Api-Key":"abcdef-secret"}"#);
        assert_eq!(msg, r#"{"X-Api-Key":"[REDACTED]"}"#);
    }

    #[test]
    fn error_redaction_keeps_kind() {
        let e = SandboxError::new(ErrorKind::Rejected, "HTTP 401 for key k-0000-1111");
        let e = e.redacted(&Redactor::new("k-0000-1111"));
        assert_eq!(e.kind(), ErrorKind::Rejected);
        assert_eq!(e.to_string(), "HTTP 401 for key [REDACTED]");
    }

    #[test]
    fn debug_of_redactor_hides_secrets() {
        let r = Redactor::new("very-secret-key");
        assert!(!format!("{r:?}").contains("very-secret"));
    }

    #[test]
    fn cap_detail_is_char_safe() {
        let s = "é".repeat(MAX_DETAIL_CHARS + 10);
        let c = cap_detail(&s);
        assert_eq!(c.chars().count(), MAX_DETAIL_CHARS + 1);
    }
}
