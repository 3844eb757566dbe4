//! Secrets and redaction: the credentials a transport must never reveal, the headers that
//! carry them, and the one [`Redactor`] that keeps them (whole or cut) out of every text
//! createos-api, sandbox-core and the crates built on them show (one redaction for every
//! crate, so that the policy crate needs no control-plane client to hide a key).

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use secrecy::{ExposeSecret, SecretString};

/// Headers that carry credentials; never forwarded from callers.
pub const SENSITIVE_HEADERS: [&str; 7] = [
    "authorization",
    "proxy-authorization",
    "x-api-key",
    "x-auth-token",
    "cookie",
    "set-cookie",
    "x-csrf-token",
];

/// What a secret is replaced with.
pub const REDACTED: &str = "[REDACTED]";

/// The shortest secret a [`Redactor`] hides (4 bytes); a shorter one is ignored, since masking
/// every 1 to 3 byte coincidence would shred ordinary messages (such a key is rejected anyway).
///
/// Only **whole** occurrences of a secret are masked. A part of a secret in a text is never
/// masked on its own: in text that a guest or a server chose, masking a part that matches the
/// start of a key (and leaving one that does not) would answer "is this the start of the key?"
/// one character at a time. Where this crate cuts a text itself, it redacts before the cut with
/// the text past the cut in view, or, when it never saw past the cut (a body read to a cap),
/// drops a fixed amount at the cut whatever it holds ([`Redactor::apply_cut_bytes`]).
pub const MIN_SECRET_FRAGMENT: usize = 4;

/// Longest text [`Redactor::cap`] keeps, in characters.
pub const MAX_DETAIL_CHARS: usize = 500;

/// `text` with every whole occurrence of `secret` replaced by [`REDACTED`].
fn redact_bytes(text: &[u8], secret: &[u8]) -> Vec<u8> {
    if secret.is_empty()
        || text.len() < secret.len()
        || !text.windows(secret.len()).any(|w| w == secret)
    {
        return text.to_vec();
    }
    let mut out = Vec::with_capacity(text.len());
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
    out
}

/// Masks the value following `x-api-key` (any case) and a `:`/`=`/`"` separator, so a header
/// a server echoed is hidden even when it altered the key's spelling around it.
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

/// Truncates text to [`MAX_DETAIL_CHARS`] characters (char-boundary safe), trimmed, with `…`
/// when it was cut. For text that may carry a secret use [`Redactor::cap`], which redacts
/// before and after the cut.
pub fn cap_detail(detail: &str) -> String {
    let detail = detail.trim();
    match detail.char_indices().nth(MAX_DETAIL_CHARS) {
        Some((idx, _)) => format!("{}…", &detail[..idx]),
        None => detail.to_owned(),
    }
}

/// Removes secrets from text that may have passed through a server (which can echo request
/// headers), a third-party error type or a guest: every whole occurrence of each secret (never
/// a part of one: see [`MIN_SECRET_FRAGMENT`]), and, in text, the value of any `x-api-key`
/// header-like fragment. The one redaction of this crate and of the crates
/// built on it.
///
/// Cheap to clone (shared). `Debug` shows how many secrets it holds, never one of them.
#[derive(Clone, Default)]
pub struct Redactor(Arc<Vec<SecretString>>);

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redactor")
            .field("secrets", &self.0.len())
            .finish()
    }
}

impl Redactor {
    /// A redactor for `secret` (see [`Redactor::add`]).
    pub fn new(secret: &str) -> Self {
        let mut r = Self::default();
        r.add(secret);
        r
    }

    /// Adds another secret to hide, trimmed. One shorter than [`MIN_SECRET_FRAGMENT`] bytes
    /// is ignored: redacting a three-letter "key" would shred every message, and such a key
    /// is rejected anyway.
    pub fn add(&mut self, secret: &str) {
        let s = secret.trim();
        if s.len() < MIN_SECRET_FRAGMENT || self.0.iter().any(|x| x.expose_secret() == s) {
            return;
        }
        let mut v: Vec<SecretString> = self.0.iter().cloned().collect();
        v.push(SecretString::from(s.to_owned()));
        // Longest first, so a secret that contains another is replaced whole.
        v.sort_by_key(|s| std::cmp::Reverse(s.expose_secret().len()));
        self.0 = Arc::new(v);
    }

    /// This redactor with `secret` added.
    #[must_use]
    pub fn with(&self, secret: &SecretString) -> Self {
        let mut r = self.clone();
        r.add(secret.expose_secret());
        r
    }

    /// How many secrets it hides.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when it hides no secret (it still masks `x-api-key` values in text).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The length in bytes of the longest secret it hides (0 when it hides none).
    pub fn longest(&self) -> usize {
        self.0
            .iter()
            .map(|s| s.expose_secret().len())
            .max()
            .unwrap_or(0)
    }

    /// `text` with every whole occurrence of a secret, and `x-api-key` header values, replaced
    /// by [`REDACTED`]. A part of a secret is left as it is (see [`MIN_SECRET_FRAGMENT`]).
    pub fn apply(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for s in self.0.iter() {
            // Whole UTF-8 sequences are replaced by ASCII, so the result stays valid UTF-8.
            let bytes = redact_bytes(out.as_bytes(), s.expose_secret().as_bytes());
            out = String::from_utf8(bytes)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
        }
        mask_api_key_headers(&out)
    }

    /// Bytes with every whole occurrence of a secret replaced.
    pub fn apply_bytes(&self, bytes: &[u8]) -> Bytes {
        let mut out = bytes.to_vec();
        for s in self.0.iter() {
            out = redact_bytes(&out, s.expose_secret().as_bytes());
        }
        Bytes::from(out)
    }

    /// [`Redactor::apply_bytes`] for bytes this crate cut at their end without reading past the
    /// cut (a body read to a cap): the last [`Redactor::longest`]` - 1` bytes are dropped first,
    /// whatever they hold, so the start of a secret that straddled the cut cannot remain, and
    /// what is shown never depends on whether those bytes matched one.
    pub fn apply_cut_bytes(&self, bytes: &[u8]) -> Bytes {
        let drop = self.longest().saturating_sub(1).min(bytes.len());
        self.apply_bytes(&bytes[..bytes.len() - drop])
    }

    /// [`cap_detail`] for text that may hold a secret: redacts the whole text (so a secret that
    /// straddles the cut is replaced whole), cuts to [`MAX_DETAIL_CHARS`]; the result is one
    /// line, its control, line-break, invisible and bidirectional characters escaped
    /// (`outside_text::line`), fit for a message or a log.
    pub fn cap(&self, text: &str) -> String {
        crate::line(&cap_detail(&self.apply(text))).into_owned()
    }

    /// At most `max_chars` characters of `text`, redacted with the text past the cut in view,
    /// so a secret that straddles the cut is replaced whole and leaves no part behind.
    pub fn shorten(&self, text: &str, max_chars: usize) -> String {
        // Every secret that starts inside the kept part ends inside this window.
        let window: String = text.chars().take(max_chars + self.longest()).collect();
        self.apply(&window).chars().take(max_chars).collect()
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
/// use outside_text::secrets::redact_url;
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
    fn every_whole_secret_is_replaced_and_no_part_of_one() {
        let s = Redactor::default()
            .with(&SecretString::from("sekrit-key"))
            .with(&SecretString::from("skp_sb_tok"));
        assert_eq!(
            s.apply("a sekrit-key b skp_sb_tok"),
            "a [REDACTED] b [REDACTED]"
        );
        assert_eq!(&s.apply_bytes(b"xx sekrit-key yy")[..], b"xx [REDACTED] yy");
        // A part of a secret, at an edge or inside, is the text's own: left as it is.
        for text in ["xx sekr", "it-key yy", "b_tok, then sekrit-k", "a sekri b"] {
            assert_eq!(s.apply(text), text);
            assert_eq!(&s.apply_bytes(text.as_bytes())[..], text.as_bytes());
        }
    }

    /// Issue 45: what is shown of a text a guest chose never depends on whether a part of it
    /// shorter than the key matches the key, so refusals and masks answer no guess.
    #[test]
    fn masking_is_no_oracle_for_the_start_or_end_of_a_key() {
        let key = "sk-live-7f3c9a1e5b2d4c6e";
        let r = Redactor::new(key);
        for k in 1..key.len() {
            for guess in [&key[..k], &key[key.len() - k..]] {
                for text in [
                    format!("line ending {guess}"),
                    format!("{guess} starts this line"),
                ] {
                    assert_eq!(r.apply(&text), text, "{k}");
                    assert_eq!(r.cap(&text), text, "{k}");
                    assert_eq!(r.shorten(&text, 400), text, "{k}");
                }
            }
        }
        assert_eq!(r.apply(&format!("x {key} y")), "x [REDACTED] y");
    }

    #[test]
    fn a_cut_body_drops_a_fixed_amount_at_the_cut_whatever_it_holds() {
        let key = "sk-live-7f3c9a1e5b2d";
        let r = Redactor::new(key);
        let drop = key.len() - 1;
        let base = "e".repeat(100);
        // A body cut through the key, and one that ends with ordinary text: both lose the same
        // number of bytes, so the shown text says nothing about what was dropped.
        for k in 1..key.len() {
            let cut = format!("{base}{}", &key[..k]);
            let shown = r.apply_cut_bytes(cut.as_bytes());
            assert_eq!(shown.len(), cut.len() - drop, "{k}");
            assert!(!String::from_utf8_lossy(&shown).contains("sk-l"), "{k}");
        }
        let plain = format!("{base}zzzzzzzzzzzzzzzzzzzzzzzzz");
        assert_eq!(
            r.apply_cut_bytes(plain.as_bytes()).len(),
            plain.len() - drop
        );
        assert_eq!(
            &Redactor::default().apply_cut_bytes(b"no secret")[..],
            b"no secret"
        );
    }

    #[test]
    fn shorten_redacts_across_the_cut_at_every_offset() {
        let key = "sk_live_0123456789abcdefXYZ";
        let s = Redactor::default().with(&SecretString::from(key));
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

    #[test]
    fn redacts_key_everywhere() {
        let r = Redactor::new("sk-live-123456");
        let msg = r.apply("bad key sk-live-123456 (sk-live-123456)");
        assert_eq!(msg, "bad key [REDACTED] ([REDACTED])");
        // Too short to be a key: never masked (it would shred every message).
        assert_eq!(Redactor::new("abc").apply("abc abc"), "abc abc");
        assert!(Redactor::new(" abc ").is_empty());
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
    fn debug_of_redactor_hides_secrets() {
        let r = Redactor::new("very-secret-key");
        assert!(!format!("{r:?}").contains("very-secret"));
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
        // A text that arrives already cut (by whoever sent it) is shown as it came: its edges
        // are the sender's choice, and masking them would answer guesses.
        let pre_cut = format!("{}{}", "a".repeat(100), &key[..12]);
        assert_eq!(r.cap(&pre_cut), pre_cut);
    }

    #[test]
    fn cap_detail_is_char_safe() {
        let s = "é".repeat(MAX_DETAIL_CHARS + 10);
        let c = cap_detail(&s);
        assert_eq!(c.chars().count(), MAX_DETAIL_CHARS + 1);
        // A multi-byte secret is replaced whole; the result is still UTF-8.
        let r = Redactor::new("éàkey-1234");
        assert_eq!(r.apply("x éàkey-1234 é"), "x [REDACTED] é");
    }
}
