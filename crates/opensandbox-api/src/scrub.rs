//! Keeping server text safe to show: the API key (and any per-call secret, such as a registry
//! password) removed, the text cut to a bound and escaped onto one line.
//!
//! Everything that reaches an [`crate::Error`] from outside (an error body, a header, a stream
//! frame, a transport error's message) goes through a [`Scrubber`] first.

use std::sync::Arc;

use secrecy::{ExposeSecret, SecretString};

/// What a secret is replaced with.
pub const REDACTED: &str = "[REDACTED]";

/// The most characters of server text an error keeps (after escaping).
pub const MAX_SNIPPET_CHARS: usize = 512;

/// A cut text may end with the first bytes of a secret; a trailing fragment at least this long
/// is masked too. Shorter ones are left: masking every 1 to 3 byte coincidence would shred
/// ordinary messages and gives an attacker nothing.
const MIN_FRAGMENT: usize = 4;

/// Removes secrets from text. Cheap to clone; `Debug` says how many secrets it holds, never
/// one of them.
#[derive(Clone, Default)]
pub(crate) struct Scrubber {
    /// Every spelling to remove, longest first (so a secret containing another goes whole).
    needles: Arc<Vec<SecretString>>,
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Scrubber({} needles)", self.needles.len())
    }
}

impl Scrubber {
    /// This scrubber plus `secret`, both as written and as a JSON string would escape it (a
    /// server that echoes a request body echoes it JSON-encoded). Blank or very short secrets
    /// are ignored: they would shred every message.
    pub(crate) fn with(&self, secret: &str) -> Scrubber {
        let secret = secret.trim();
        if secret.len() < MIN_FRAGMENT {
            return self.clone();
        }
        let mut needles: Vec<SecretString> = self.needles.iter().cloned().collect();
        let json = serde_json::to_string(secret).unwrap_or_default();
        let json_inner = json.trim_matches('"');
        for spelling in [secret, json_inner] {
            if !needles.iter().any(|n| n.expose_secret() == spelling) {
                needles.push(SecretString::from(spelling.to_owned()));
            }
        }
        needles.sort_by_key(|n| std::cmp::Reverse(n.expose_secret().len()));
        Scrubber {
            needles: Arc::new(needles),
        }
    }

    /// `text` with every whole occurrence of a secret replaced by [`REDACTED`].
    pub(crate) fn scrub(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for needle in self.needles.iter() {
            let needle = needle.expose_secret();
            if out.contains(needle) {
                out = out.replace(needle, REDACTED);
            }
        }
        out
    }

    /// [`Scrubber::scrub`] for a text that was cut at its end (a body read to a cap): a tail
    /// that is the start of a secret, [`MIN_FRAGMENT`] bytes or more, is masked as well.
    pub(crate) fn scrub_cut(&self, text: &str) -> String {
        let mut out = self.scrub(text);
        let mut longest_tail = 0;
        for needle in self.needles.iter() {
            let needle = needle.expose_secret().as_bytes();
            let bytes = out.as_bytes();
            let max = needle.len().saturating_sub(1).min(bytes.len());
            if let Some(k) = (MIN_FRAGMENT..=max)
                .rev()
                .find(|&k| bytes.ends_with(&needle[..k]) && out.is_char_boundary(out.len() - k))
            {
                longest_tail = longest_tail.max(k);
            }
        }
        if longest_tail > 0 {
            out.truncate(out.len() - longest_tail);
            out.push_str(REDACTED);
        }
        out
    }

    /// Text from outside, shown in an error: scrubbed, escaped onto one line and cut to
    /// `max_chars` characters (with `…` when cut). `was_cut` says whether `text` itself is
    /// already the start of something longer.
    pub(crate) fn snippet(&self, text: &str, max_chars: usize, was_cut: bool) -> String {
        let clean = if was_cut {
            self.scrub_cut(text)
        } else {
            self.scrub(text)
        };
        let escaped = escape_line(clean.trim());
        match escaped.char_indices().nth(max_chars) {
            Some((at, _)) => format!("{}…", &escaped[..at]),
            None if was_cut => format!("{escaped}…"),
            None => escaped,
        }
    }
}

/// `text` on one line: control characters, line and paragraph separators and bidirectional
/// overrides become escapes (`\n`, `\u{202e}` …), so a server cannot break a log record into
/// two or reorder what a terminal shows. Everything else is kept as it is.
pub fn escape_line(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let hidden = c.is_control()
            || matches!(
                c,
                '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{feff}'
            )
            || ('\u{202a}'..='\u{202e}').contains(&c)
            || ('\u{2066}'..='\u{2069}').contains(&c);
        if hidden {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "osk-test-4f1c2a9e";

    #[test]
    fn whole_secrets_and_their_json_spelling_are_replaced() {
        let s = Scrubber::default().with(KEY).with("pa\"ss\\word");
        assert_eq!(
            s.scrub(&format!("key {KEY} and {KEY}")),
            "key [REDACTED] and [REDACTED]"
        );
        assert_eq!(
            s.scrub(r#"{"password":"pa\"ss\\word"}"#),
            r#"{"password":"[REDACTED]"}"#
        );
        // Too short to be a secret: ignored.
        assert_eq!(Scrubber::default().with("ab").scrub("ab ab"), "ab ab");
    }

    #[test]
    fn a_cut_tail_that_starts_a_secret_is_masked() {
        let s = Scrubber::default().with(KEY);
        for k in MIN_FRAGMENT..KEY.len() {
            let text = format!("echo: {}", &KEY[..k]);
            assert_eq!(
                s.scrub_cut(&text),
                "echo: [REDACTED]",
                "fragment of {k} bytes"
            );
        }
        // Three bytes are not a fragment; a fragment inside the text is not at the cut.
        assert_eq!(s.scrub_cut("echo: osk"), "echo: osk");
        assert_eq!(s.scrub_cut("osk-test tail"), "osk-test tail");
    }

    #[test]
    fn snippets_are_one_line_bounded_and_marked_when_cut() {
        let s = Scrubber::default().with(KEY);
        let shown = s.snippet(&format!("a\nb\r\u{202e}c {KEY}"), 100, false);
        assert_eq!(shown, "a\\nb\\r\\u{202e}c [REDACTED]");
        let long = "x".repeat(600);
        let shown = s.snippet(&long, MAX_SNIPPET_CHARS, false);
        assert_eq!(shown.chars().count(), MAX_SNIPPET_CHARS + 1);
        assert!(shown.ends_with('…'));
        assert_eq!(s.snippet("short", 100, true), "short…");
    }

    #[test]
    fn debug_shows_no_secret() {
        let s = Scrubber::default().with(KEY);
        assert!(!format!("{s:?}").contains(KEY));
    }
}
