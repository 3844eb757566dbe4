//! Small helpers: timestamps, ids, query strings, Kubernetes label rules, guest path mapping.

use std::fmt::Write as _;
use std::path::{Component, Path, PathBuf};

use rand::Rng;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// `t` as the server writes timestamps: RFC 3339 in UTC with microseconds and a `Z`.
pub(crate) fn rfc3339(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.microsecond()
    )
}

/// Parses an RFC 3339 timestamp (any offset, any fraction); a timestamp without an offset is
/// taken as UTC, as the server's pydantic model does.
pub(crate) fn parse_rfc3339(text: &str) -> Option<OffsetDateTime> {
    let text = text.trim();
    if let Ok(t) = OffsetDateTime::parse(text, &Rfc3339) {
        return Some(t);
    }
    // Python's isoformat() of a naive datetime: no offset at all.
    OffsetDateTime::parse(&format!("{text}Z"), &Rfc3339).ok()
}

/// Milliseconds since the Unix epoch (the `timestamp` of execd frames).
pub(crate) fn epoch_millis() -> i64 {
    i64::try_from(OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000).unwrap_or(0)
}

/// A random UUID-shaped identifier (version 4 layout), as the server's sandbox ids are.
pub(crate) fn uuid4() -> String {
    let mut rng = rand::rng();
    let mut b: [u8; 16] = rng.random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h: String = b.iter().fold(String::new(), |mut acc, x| {
        let _ = write!(acc, "{x:02x}");
        acc
    });
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// A random lower-case hex string of `len` characters.
pub(crate) fn hex_id(len: usize) -> String {
    let mut rng = rand::rng();
    (0..len)
        .map(|_| char::from(b"0123456789abcdef"[rng.random_range(0..16)]))
        .collect()
}

/// Decodes `%XX` escapes, and `+` as a space when `plus` is set; invalid escapes stay as they are.
pub(crate) fn percent_decode(s: &str, plus: bool) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2]))
        {
            out.push(h * 16 + l);
            i += 3;
            continue;
        }
        if plus && b[i] == b'+' {
            out.push(b' ');
        } else {
            out.push(b[i]);
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Percent-encodes everything but unreserved characters (RFC 3986), as Go's `url.PathEscape`
/// does for a file name.
pub(crate) fn percent_encode_path(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// Parses a query string into decoded pairs, in order, keeping repeated keys and blank values.
pub(crate) fn parse_query(q: Option<&str>) -> Vec<(String, String)> {
    let Some(q) = q else { return Vec::new() };
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k, true), percent_decode(v, true))
        })
        .collect()
}

/// Parses the `metadata=` list filter the way the server does (Python's
/// `parse_qsl(value, keep_blank_values=True, strict_parsing=True)` on the already-decoded query
/// value): `k=v` pairs joined by `&`, each side decoded once more. A pair without `=` is an error.
pub(crate) fn parse_metadata_filter(value: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for pair in value.split('&') {
        if pair.is_empty() {
            return Err("bad query field: ''".into());
        }
        let Some((k, v)) = pair.split_once('=') else {
            return Err(format!("bad query field: {pair:?}"));
        };
        out.push((percent_decode(k, true), percent_decode(v, true)));
    }
    Ok(out)
}

/// A Kubernetes label name: at most 63 characters of `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`.
fn is_label_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A DNS subdomain (RFC 1123): dot-separated lower-case labels of `[a-z0-9-]`, at most 253
/// characters, each label starting and ending with an alphanumeric character.
fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.len() <= 63
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// A Kubernetes label key: `name` or `prefix/name` with a DNS-subdomain prefix.
pub(crate) fn is_label_key(key: &str) -> bool {
    match key.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_label_name(name),
        None => is_label_name(key),
    }
}

/// A Kubernetes label value: empty, or a label name.
pub(crate) fn is_label_value(value: &str) -> bool {
    value.is_empty() || is_label_name(value)
}

/// The guest directories whose absolute paths in command text are rewritten into the guest's
/// host directory.
pub(crate) const GUEST_ROOTS: &[&str] = &["/workspace", "/tmp", "/root", "/home"];

/// Rewrites each `/workspace`, `/tmp`, `/root` or `/home` that starts `text` or follows
/// whitespace, a quote, `=`, `:`, `,` or a shell separator or redirection (and ends at a path
/// boundary) to the same path under `root`.
pub(crate) fn map_guest_text(text: &str, root: &Path) -> String {
    let root = root.to_string_lossy();
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        let at_boundary = i == 0
            || matches!(
                bytes[i - 1],
                b' ' | b'\t'
                    | b'\n'
                    | b'\''
                    | b'"'
                    | b'='
                    | b':'
                    | b'>'
                    | b'<'
                    | b'('
                    | b';'
                    | b'|'
                    | b'&'
                    | b','
            );
        if at_boundary
            && bytes[i] == b'/'
            && let Some(prefix) = GUEST_ROOTS.iter().find(|p| {
                text[i..].starts_with(**p)
                    && text[i + p.len()..]
                        .chars()
                        .next()
                        .is_none_or(|c| !(c.is_alphanumeric() || matches!(c, '_' | '-' | '.')))
            })
        {
            out.push_str(&root);
            out.push_str(prefix);
            i += prefix.len();
            continue;
        }
        let ch = text[i..].chars().next().unwrap_or('\0');
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

/// Normalises an absolute guest path lexically (`.` dropped, `..` applied); `None` when it is
/// relative or climbs above `/`.
pub(crate) fn normalize_guest_path(path: &str) -> Option<PathBuf> {
    if !path.starts_with('/') {
        return None;
    }
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for c in Path::new(path).components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(p) => parts.push(p),
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::Prefix(_) => return None,
        }
    }
    let mut out = PathBuf::from("/");
    for p in parts {
        out.push(p);
    }
    Some(out)
}

/// An octal permission written as decimal digits (`755`) as a mode (`0o755`); `None` when a digit
/// is 8 or 9 or it is out of range.
pub(crate) fn octal_digits_to_mode(digits: i64) -> Option<u32> {
    if !(0..=7777).contains(&digits) {
        return None;
    }
    let text = digits.to_string();
    u32::from_str_radix(&text, 8).ok()
}

/// A mode (`0o755`) as the octal digits execd reports (`755`).
pub(crate) fn mode_to_octal_digits(mode: u32) -> i64 {
    format!("{:o}", mode & 0o7777).parse().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip_and_accept_python_forms() {
        let t = parse_rfc3339("2026-12-04T12:00:00.123456+00:00").unwrap();
        assert_eq!(rfc3339(t), "2026-12-04T12:00:00.123456Z");
        let naive = parse_rfc3339("2026-12-04T12:00:00").unwrap();
        assert_eq!(rfc3339(naive), "2026-12-04T12:00:00.000000Z");
        let offset = parse_rfc3339("2026-12-04T14:00:00+02:00").unwrap();
        assert_eq!(offset, naive + time::Duration::hours(0));
        assert!(parse_rfc3339("yesterday").is_none());
    }

    #[test]
    fn metadata_filter_is_decoded_twice_like_the_server() {
        // The SDK quotes each side, httpx encodes the whole value again, the query parser
        // decodes one layer: what reaches parse_metadata_filter still has the inner escapes.
        let f = parse_metadata_filter("created-by=langflow&note=a%26b%3Dc").unwrap();
        assert_eq!(
            f,
            vec![
                ("created-by".to_owned(), "langflow".to_owned()),
                ("note".to_owned(), "a&b=c".to_owned())
            ]
        );
        assert!(parse_metadata_filter("novalue").is_err());
        assert!(parse_metadata_filter("a=1&&b=2").is_err());
        assert_eq!(parse_metadata_filter("a=").unwrap()[0].1, "");
    }

    #[test]
    fn label_rules_follow_kubernetes() {
        assert!(is_label_key("created-by"));
        assert!(is_label_key("example.com/owner"));
        assert!(!is_label_key("-bad"));
        assert!(!is_label_key("Upper.Example.com/x"));
        assert!(!is_label_key(&"k".repeat(64)));
        assert!(is_label_value(""));
        assert!(is_label_value("lf-run_1.2"));
        assert!(!is_label_value("has space"));
        assert!(!is_label_value(&"v".repeat(64)));
    }

    #[test]
    fn guest_text_maps_roots_at_boundaries_only() {
        let root = Path::new("/g");
        assert_eq!(
            map_guest_text("cat /workspace/a", root),
            "cat /g/workspace/a"
        );
        assert_eq!(
            map_guest_text("x=/tmp/y;ls /home", root),
            "x=/g/tmp/y;ls /g/home"
        );
        assert_eq!(
            map_guest_text("/tmpfile /usr/tmp", root),
            "/tmpfile /usr/tmp"
        );
    }

    #[test]
    fn guest_paths_normalise_and_refuse_escapes() {
        assert_eq!(
            normalize_guest_path("/workspace/./a/../b").unwrap(),
            Path::new("/workspace/b")
        );
        assert!(normalize_guest_path("/../etc").is_none());
        assert!(normalize_guest_path("rel").is_none());
        assert_eq!(normalize_guest_path("/").unwrap(), Path::new("/"));
    }

    #[test]
    fn modes_are_octal_digits() {
        assert_eq!(octal_digits_to_mode(755), Some(0o755));
        assert_eq!(octal_digits_to_mode(644), Some(0o644));
        assert_eq!(octal_digits_to_mode(789), None);
        assert_eq!(mode_to_octal_digits(0o640), 640);
    }

    #[test]
    fn ids_have_the_expected_shape() {
        let id = uuid4();
        assert_eq!(id.len(), 36);
        assert_eq!(id.as_bytes()[14], b'4');
        assert_eq!(hex_id(32).len(), 32);
    }
}
