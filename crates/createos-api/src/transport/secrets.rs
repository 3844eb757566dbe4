//! Secrets and redaction: the credentials a transport must never reveal, the headers that
//! carry them, and the one [`Redactor`] that keeps them (whole or cut) out of every text this
//! crate, and the crates built on it, show.

use std::fmt;
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
pub const REDACTED: &str = "[REDACTED]";

/// The shortest fragment of a secret that is masked at the edge of a text (4 bytes).
///
/// A text that was cut (an error snippet, a body cut at its cap, a stream line shown in part)
/// may end with the first bytes of a key or start with its last bytes. Any suffix of a text
/// that is a prefix of a secret, and any prefix of a text that is a suffix of a secret, at
/// least this long, is treated as the secret and replaced. Shorter fragments are left alone:
/// masking every 1 to 3 byte coincidence would shred ordinary messages, and 3 bytes of a key
/// give an attacker nothing useful. A secret of this length or shorter is not masked at all
/// (it would shred every message; such a key is rejected anyway).
pub const MIN_SECRET_FRAGMENT: usize = 4;

/// Longest text [`Redactor::cap`] keeps, in characters.
pub const MAX_DETAIL_CHARS: usize = 500;

/// The range of `text` left once a prefix of `secret` at its end and a suffix of `secret`
/// at its start (each at least [`MIN_SECRET_FRAGMENT`] bytes) are taken away. `valid` says
/// whether a cut at a byte offset is allowed (a char boundary, for text).
fn edge_fragments(text: &[u8], secret: &[u8], valid: &dyn Fn(usize) -> bool) -> (usize, usize) {
    let longest = secret.len().saturating_sub(1);
    let mut end = text.len();
    for k in (MIN_SECRET_FRAGMENT..=longest.min(text.len())).rev() {
        if text.ends_with(&secret[..k]) && valid(text.len() - k) {
            end = text.len() - k;
            break;
        }
    }
    let mut start = 0;
    for k in (MIN_SECRET_FRAGMENT..=longest.min(end)).rev() {
        if text[..end].starts_with(&secret[secret.len() - k..]) && valid(k) {
            start = k;
            break;
        }
    }
    (start, end)
}

/// `text` with every whole occurrence of `secret` replaced, then with a fragment of it at
/// either edge replaced (see [`MIN_SECRET_FRAGMENT`]).
fn redact_bytes(text: &[u8], secret: &[u8], valid: &dyn Fn(&[u8], usize) -> bool) -> Vec<u8> {
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
    let (start, end) = edge_fragments(&out, secret, &|at| valid(&out, at));
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
/// headers), a third-party error type or a guest: every occurrence of each secret, a fragment
/// of one at either edge of the text (see [`MIN_SECRET_FRAGMENT`]), and, in text, the value
/// of any `x-api-key` header-like fragment. The one redaction of this crate and of the crates
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

    /// `text` with every secret, a fragment of a secret at either edge, and `x-api-key`
    /// header values replaced by [`REDACTED`].
    pub fn apply(&self, text: &str) -> String {
        let mut out = text.to_owned();
        for s in self.0.iter() {
            let bytes = redact_bytes(out.as_bytes(), s.expose_secret().as_bytes(), &|b, at| {
                std::str::from_utf8(b).is_ok_and(|t| t.is_char_boundary(at))
            });
            // Whole UTF-8 sequences were replaced by ASCII at char boundaries, so the result
            // stays valid UTF-8.
            out = String::from_utf8(bytes)
                .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
        }
        mask_api_key_headers(&out)
    }

    /// Bytes with every secret, and a fragment of one at either edge (a body cut by a cap ends
    /// with what may be the start of a key), replaced.
    pub fn apply_bytes(&self, bytes: &[u8]) -> Bytes {
        let mut out = bytes.to_vec();
        for s in self.0.iter() {
            out = redact_bytes(&out, s.expose_secret().as_bytes(), &|_, _| true);
        }
        Bytes::from(out)
    }

    /// [`cap_detail`] for text that may hold a secret: redacts, cuts to
    /// [`MAX_DETAIL_CHARS`], then redacts again, so a secret that straddled the cut leaves no
    /// fragment at the new edge; the result is one line, its control, line-break and
    /// bidirectional characters escaped (`outside_text::line`), fit for a message or a log.
    pub fn cap(&self, text: &str) -> String {
        let capped = cap_detail(&self.apply(text));
        let capped = match capped.strip_suffix('…') {
            Some(cut) => format!("{}…", self.apply(cut)),
            None => capped,
        };
        outside_text::line(&capped).into_owned()
    }

    /// At most `max_chars` characters of `text`, redacted before the cut and again after
    /// it, so a secret that straddles the cut leaves no fragment behind.
    pub fn shorten(&self, text: &str, max_chars: usize) -> String {
        let longest = self
            .0
            .iter()
            .map(|s| s.expose_secret().len())
            .max()
            .unwrap_or(0);
        // Every secret that starts inside the kept part ends inside this window.
        let window: String = text.chars().take(max_chars + longest).collect();
        let scrubbed = self.apply(&window);
        let cut: String = scrubbed.chars().take(max_chars).collect();
        self.apply(&cut)
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
        let s = Redactor::default()
            .with(&SecretString::from("sekrit-key"))
            .with(&SecretString::from("skp_sb_tok"));
        assert_eq!(
            s.apply("a sekrit-key b skp_sb_tok"),
            "a [REDACTED] b [REDACTED]"
        );
        assert_eq!(&s.apply_bytes(b"xx sekrit-key yy")[..], b"xx [REDACTED] yy");
        assert_eq!(&s.apply_bytes(b"xx sekri")[..], b"xx [REDACTED]");
        // Fragments of at least MIN_SECRET_FRAGMENT bytes at either edge are masked ...
        assert_eq!(s.apply("xx sekr"), "xx [REDACTED]");
        assert_eq!(s.apply("it-key yy"), "[REDACTED] yy");
        assert_eq!(
            s.apply("b_tok, then sekrit-k"),
            "[REDACTED], then [REDACTED]"
        );
        // ... shorter ones, and fragments inside the text, are not.
        assert_eq!(s.apply("xx sek"), "xx sek");
        assert_eq!(s.apply("key yy"), "key yy");
        assert_eq!(s.apply("a sekri b"), "a sekri b");
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
        // A multi-byte text that ends with what looks like a key's first bytes is cut at a
        // char boundary only.
        let r = Redactor::new("éàkey-1234");
        assert_eq!(r.apply("x éàke"), "x [REDACTED]");
    }
}
