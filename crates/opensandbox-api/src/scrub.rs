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

/// The shortest secret looked for: a shorter one would shred every message.
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

    /// [`Scrubber::scrub`] for a text that was cut at its end (a body read to a cap): the
    /// last (longest secret - 1) bytes are dropped first, whatever they hold, so the start of
    /// a secret that straddled the cut cannot remain, and what is shown never depends on
    /// whether they matched one (a mask that did would answer guesses at a key's start).
    pub(crate) fn scrub_cut(&self, text: &str) -> String {
        let longest = self
            .needles
            .iter()
            .map(|n| n.expose_secret().len())
            .max()
            .unwrap_or(0);
        let mut end = text.len().saturating_sub(longest.saturating_sub(1));
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        self.scrub(&text[..end])
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

/// `text` on one line, through the workspace's one escaping ([`outside_text::line`]): control
/// characters, line and paragraph separators, bidirectional and other invisible format
/// characters become escapes (`\n`, `\u{202e}` …), so a server cannot break a log record into
/// two, hide text or reorder what a terminal shows. Everything else is kept as it is.
pub fn escape_line(text: &str) -> String {
    outside_text::line(text).into_owned()
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
    fn a_cut_text_loses_a_fixed_amount_at_the_cut_whatever_it_holds() {
        let s = Scrubber::default().with(KEY);
        let drop = KEY.len() - 1;
        for k in 1..KEY.len() {
            let text = format!("echo: {}", &KEY[..k]);
            let shown = s.scrub_cut(&text);
            assert_eq!(shown.len(), text.len().saturating_sub(drop), "{k}");
            assert!(!shown.contains("osk-"), "{k}: {shown}");
        }
        let plain = "echo: a reply that ends with ordinary words";
        assert_eq!(s.scrub_cut(plain).len(), plain.len() - drop);
        // Uncut text keeps a part of a secret: it is the sender's own text.
        assert_eq!(s.scrub("echo: osk-test"), "echo: osk-test");
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
        // A cut text loses a fixed amount at the cut (the longest secret less one byte).
        assert_eq!(s.snippet("short", 100, true), "…");
        assert_eq!(Scrubber::default().snippet("short", 100, true), "short…");
    }

    #[test]
    fn debug_shows_no_secret() {
        let s = Scrubber::default().with(KEY);
        assert!(!format!("{s:?}").contains(KEY));
    }
}
