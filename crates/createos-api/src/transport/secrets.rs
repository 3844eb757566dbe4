//! Secrets and redaction: the credentials a transport must never reveal, the headers that
//! carry them, and the helpers that keep them (whole or cut) out of every text it shows.

use std::sync::Arc;

use bytes::Bytes;
use secrecy::{ExposeSecret, SecretString};

/// Headers that carry credentials; never forwarded from callers.
pub(crate) const SENSITIVE_HEADERS: [&str; 7] = [
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "x-auth-token",
    "cookie",
    "set-cookie",
    "x-csrf-token",
];

/// What a secret is replaced with.
pub(super) const REDACTED: &str = "[REDACTED]";

/// The shortest fragment of a secret that is masked at the edge of a text (4 bytes).
///
/// A text that was cut (an error snippet, a body cut at its cap, a stream line shown in part)
/// may end with the first bytes of a key or start with its last bytes. Any suffix of a text
/// that is a prefix of a secret, and any prefix of a text that is a suffix of a secret, at
/// least this long, is treated as the secret and replaced. Shorter fragments are left alone:
/// masking every 1 to 3 byte coincidence would shred ordinary messages, and 3 bytes of a key
/// give an attacker nothing useful.
pub const MIN_SECRET_FRAGMENT: usize = 4;

/// The range of `text` left once a prefix of `secret` at its end and a suffix of `secret`
/// at its start (each at least [`MIN_SECRET_FRAGMENT`] bytes) are taken away.
fn edge_fragments(text: &[u8], secret: &[u8]) -> (usize, usize) {
    let longest = secret.len().saturating_sub(1);
    let mut end = text.len();
    for k in (MIN_SECRET_FRAGMENT..=longest.min(text.len())).rev() {
        if text.ends_with(&secret[..k]) {
            end = text.len() - k;
            break;
        }
    }
    let mut start = 0;
    for k in (MIN_SECRET_FRAGMENT..=longest.min(end)).rev() {
        if text[..end].starts_with(&secret[secret.len() - k..]) {
            start = k;
            break;
        }
    }
    (start, end)
}

/// `text` with every whole occurrence of `secret` replaced, then with a fragment of it at
/// either edge replaced (see [`MIN_SECRET_FRAGMENT`]).
fn redact_bytes(text: &[u8], secret: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    if secret.is_empty() || !text.windows(secret.len()).any(|w| w == secret) {
        out.extend_from_slice(text);
    } else {
        let mut i = 0;
        while i < text.len() {
            if text[i..].starts_with(secret) {
                out.extend_from_slice(REDACTED.as_bytes());
                i += secret.len();
            } else {
                out.push(text[i]);
                i += 1;
            }
        }
    }
    if secret.len() <= MIN_SECRET_FRAGMENT {
        return out;
    }
    let (start, end) = edge_fragments(&out, secret);
    if start == 0 && end == out.len() {
        return out;
    }
    let mut masked = Vec::with_capacity(out.len() + 2 * REDACTED.len());
    if start > 0 {
        masked.extend_from_slice(REDACTED.as_bytes());
    }
    masked.extend_from_slice(&out[start..end]);
    if end < out.len() {
        masked.extend_from_slice(REDACTED.as_bytes());
    }
    masked
}

/// The secrets a transport must never reveal.
#[derive(Clone, Default)]
pub(crate) struct Secrets(Arc<Vec<SecretString>>);

impl Secrets {
    pub(super) fn with(&self, s: &SecretString) -> Secrets {
        let mut v: Vec<SecretString> = self.0.iter().cloned().collect();
        v.push(s.clone());
        // Longest first, so a secret that contains another is replaced whole.
        v.sort_by_key(|s| std::cmp::Reverse(s.expose_secret().len()));
        Secrets(Arc::new(v))
    }

    /// Replace every secret occurrence in `text`, and a fragment of a secret at either edge
    /// of it (see [`MIN_SECRET_FRAGMENT`]).
    pub(crate) fn scrub(&self, text: &str) -> String {
        let bytes = self.scrub_bytes(text.as_bytes(), true);
        // Whole UTF-8 sequences were replaced by ASCII, and the edge fragments start at the
        // first byte or end at the last byte of a secret, so the result stays valid UTF-8.
        String::from_utf8(bytes.to_vec())
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }

    /// Replace every secret occurrence in `bytes`, and a fragment of a secret at either
    /// edge (a body cut by a cap ends with what may be the start of a key).
    pub(crate) fn scrub_bytes(&self, bytes: &[u8], _truncated: bool) -> Bytes {
        let mut out = bytes.to_vec();
        for s in self.0.iter() {
            out = redact_bytes(&out, s.expose_secret().as_bytes());
        }
        Bytes::from(out)
    }

    /// At most `max_chars` characters of `text`, redacted before the cut and again after
    /// it, so a secret that straddles the cut leaves no fragment behind.
    pub(crate) fn shorten(&self, text: &str, max_chars: usize) -> String {
        let longest = self
            .0
            .iter()
            .map(|s| s.expose_secret().len())
            .max()
            .unwrap_or(0);
        // Every secret that starts inside the kept part ends inside this window.
        let window: String = text.chars().take(max_chars + longest).collect();
        let scrubbed = self.scrub(&window);
        let cut: String = scrubbed.chars().take(max_chars).collect();
        self.scrub(&cut)
    }
}

/// A configured URL as it may be shown in a message, log or `Debug`: everything from the
/// first `?` or `#` is dropped (a query or fragment may carry a token) and a `userinfo@` in
/// the authority becomes `***@`.
///
/// Works on text that is not a valid URL too (a bad port, an empty host, no scheme): it
/// never parses, it only cuts. Every `@` after the scheme is taken as the end of a userinfo,
/// so a password holding an unencoded `/` or `@` is hidden as well (at the price of also
/// hiding a path segment before an `@` in a path, which base URLs do not have).
///
/// ```
/// use createos_api::redact_url;
/// assert_eq!(redact_url("https://user:pw@h.test:99999/x?token=t#f"), "https://***@h.test:99999/x");
/// assert_eq!(redact_url("https://h.test/api"), "https://h.test/api");
/// ```
pub fn redact_url(raw: &str) -> String {
    let raw = raw.trim();
    let kept = &raw[..raw.find(['?', '#']).unwrap_or(raw.len())];
    let (scheme, rest) = match kept.find("://") {
        Some(i) => kept.split_at(i + 3),
        None => ("", kept),
    };
    match rest.rfind('@') {
        Some(at) => format!("{scheme}***@{}", &rest[at + 1..]),
        None => kept.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrub_replaces_every_secret_and_a_cut_tail() {
        let s = Secrets::default()
            .with(&SecretString::from("sekrit-key"))
            .with(&SecretString::from("skp_sb_tok"));
        assert_eq!(
            s.scrub("a sekrit-key b skp_sb_tok"),
            "a [REDACTED] b [REDACTED]"
        );
        assert_eq!(
            &s.scrub_bytes(b"xx sekrit-key yy", false)[..],
            b"xx [REDACTED] yy"
        );
        assert_eq!(&s.scrub_bytes(b"xx sekri", true)[..], b"xx [REDACTED]");
        // Fragments of at least MIN_SECRET_FRAGMENT bytes at either edge are masked ...
        assert_eq!(s.scrub("xx sekr"), "xx [REDACTED]");
        assert_eq!(s.scrub("it-key yy"), "[REDACTED] yy");
        assert_eq!(
            s.scrub("b_tok, then sekrit-k"),
            "[REDACTED], then [REDACTED]"
        );
        // ... shorter ones, and fragments inside the text, are not.
        assert_eq!(s.scrub("xx sek"), "xx sek");
        assert_eq!(s.scrub("key yy"), "key yy");
        assert_eq!(s.scrub("a sekri b"), "a sekri b");
    }

    #[test]
    fn shorten_redacts_across_the_cut_at_every_offset() {
        let key = "sk_live_0123456789abcdefXYZ";
        let s = Secrets::default().with(&SecretString::from(key));
        for offset in 150..250 {
            let mut text = "a".repeat(offset);
            text.push_str(key);
            text.push_str(&"b".repeat(500 - text.len().min(500)));
            let shown = s.shorten(&text, 200);
            assert!(shown.chars().count() <= 200 + REDACTED.len(), "{offset}");
            for i in 0..=key.len() - MIN_SECRET_FRAGMENT {
                let frag = &key[i..i + MIN_SECRET_FRAGMENT];
                assert!(
                    !shown.contains(frag),
                    "offset {offset}: {frag:?} in {shown}"
                );
            }
        }
    }

    #[test]
    fn redact_url_hides_userinfo_query_and_fragment_even_when_unparseable() {
        let cases = [
            ("https://user:pw-secret@/x", "https://***@/x"),
            (
                "https://user:pw-secret@host:99999",
                "https://***@host:99999",
            ),
            ("https://h.test/api?token=tok-secret", "https://h.test/api"),
            ("https://h.test/#frag-secret", "https://h.test/"),
            ("https://u:p/w-secret@h.test/x", "https://***@h.test/x"),
            ("https://u:p@w-secret@h.test", "https://***@h.test"),
            ("user:pw-secret@h.test:1/x", "***@h.test:1/x"),
            ("  http://127.0.0.1:8080/api  ", "http://127.0.0.1:8080/api"),
            ("not a url?token=tok-secret", "not a url"),
            ("", ""),
        ];
        for (raw, want) in cases {
            let got = redact_url(raw);
            assert_eq!(got, want, "{raw}");
            assert!(!got.contains("secret"), "{raw} -> {got}");
        }
    }
}
