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

    /// Returns `text` with every secret replaced, a fragment of a secret at either edge of
    /// the text replaced (see [`MIN_SECRET_FRAGMENT`]) and `x-api-key` header values masked.
    pub fn apply(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for s in &self.secrets {
            if out.contains(s.as_str()) {
                out = out.replace(s.as_str(), REDACTED);
            }
        }
        for s in &self.secrets {
            out = mask_edge_fragments(&out, s);
        }
        mask_api_key_headers(&out)
    }

    /// [`cap_detail`] for text that may hold a secret: redacts, cuts to
    /// [`MAX_DETAIL_CHARS`], then redacts again, so a secret that straddled the cut leaves no
    /// fragment at the new edge.
    pub fn cap(&self, text: &str) -> String {
        let capped = cap_detail(&self.apply(text));
        match capped.strip_suffix('…') {
            Some(cut) => format!("{}…", self.apply(cut)),
            None => capped,
        }
    }
}

/// The shortest fragment of a secret that [`Redactor::apply`] masks at the start or end of a
/// text (4 bytes): a text that was cut somewhere upstream may end with the first bytes of the
/// key or start with its last bytes. Any such fragment at least this long counts as the key;
/// shorter ones are left alone, since masking every 1–3 character coincidence would shred
/// ordinary messages and reveals nothing useful.
pub const MIN_SECRET_FRAGMENT: usize = 4;

/// Replaces a suffix of `text` that is a prefix of `secret`, and a prefix of `text` that is a
/// suffix of `secret`, when at least [`MIN_SECRET_FRAGMENT`] bytes long.
fn mask_edge_fragments(text: &str, secret: &str) -> String {
    let (t, k) = (text.as_bytes(), secret.as_bytes());
    let longest = k.len().saturating_sub(1);
    let mut end = t.len();
    for n in (MIN_SECRET_FRAGMENT..=longest.min(t.len())).rev() {
        if t.ends_with(&k[..n]) && text.is_char_boundary(t.len() - n) {
            end = t.len() - n;
            break;
        }
    }
    let mut start = 0;
    for n in (MIN_SECRET_FRAGMENT..=longest.min(end)).rev() {
        if t[..end].starts_with(&k[k.len() - n..]) && text.is_char_boundary(n) {
            start = n;
            break;
        }
    }
    if start == 0 && end == t.len() {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len() + 2 * REDACTED.len());
    if start > 0 {
        out.push_str(REDACTED);
    }
    out.push_str(&text[start..end]);
    if end < t.len() {
        out.push_str(REDACTED);
    }
    out
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
/// For text that may carry a secret use [`Redactor::cap`], which redacts before and after
/// the cut.
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
    fn fragments_at_either_edge_count_as_the_key() {
        let key = "sk-live-0123456789abcdef";
        let r = Redactor::new(key);
        assert_eq!(r.apply("cut here: sk-live-01"), "cut here: [REDACTED]");
        assert_eq!(r.apply("89abcdef was the rest"), "[REDACTED] was the rest");
        // Below the threshold, or inside the text, nothing is masked.
        assert_eq!(r.apply("ends with sk-"), "ends with sk-");
        assert_eq!(r.apply("a sk-live-01 b"), "a sk-live-01 b");
    }

    #[test]
    fn cap_never_leaves_a_fragment_at_the_cut() {
        let key = "sk-live-0123456789abcdef";
        let r = Redactor::new(key);
        for offset in MAX_DETAIL_CHARS - 30..MAX_DETAIL_CHARS + 5 {
            let text = format!("{}{key}{}", "a".repeat(offset), "b".repeat(300));
            let capped = r.cap(&text);
            for i in 0..=key.len() - MIN_SECRET_FRAGMENT {
                let frag = &key[i..i + MIN_SECRET_FRAGMENT];
                assert!(
                    !capped.contains(frag),
                    "offset {offset}: {frag} in {capped}"
                );
            }
            assert!(capped.chars().count() <= MAX_DETAIL_CHARS + 1 + REDACTED.len());
        }
        // A text that arrives already cut through the key is masked at its edge too.
        let pre_cut = format!("{}{}", "a".repeat(100), &key[..12]);
        assert_eq!(r.cap(&pre_cut), format!("{}{REDACTED}", "a".repeat(100)));
        // A partial key inside the text (not masked: it is not at an edge) is not exposed
        // further by a cut that lands inside it.
        for n in MIN_SECRET_FRAGMENT..12 {
            let text = format!(
                "{}{} tail {}",
                "a".repeat(MAX_DETAIL_CHARS - n),
                &key[..12],
                "z".repeat(50)
            );
            let capped = r.cap(&text);
            assert!(
                !capped.contains(&key[..MIN_SECRET_FRAGMENT]),
                "n={n}: {capped}"
            );
            assert!(capped.ends_with(&format!("{REDACTED}…")), "n={n}: {capped}");
        }
    }

    #[test]
    fn cap_detail_is_char_safe() {
        let s = "é".repeat(MAX_DETAIL_CHARS + 10);
        let c = cap_detail(&s);
        assert_eq!(c.chars().count(), MAX_DETAIL_CHARS + 1);
    }
}
