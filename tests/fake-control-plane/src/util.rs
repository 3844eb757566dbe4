//! Small helpers: guest path mapping, timestamps, percent-decoding, ids, process-group signals.

use std::path::{Component, Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use rand::Rng;

/// The guest directories that are mapped into a guest's host directory.
pub(crate) const GUEST_ROOTS: &[&str] = &["/workspace", "/tmp", "/root"];

/// Rewrites every occurrence of `/workspace`, `/tmp` or `/root` that starts the text or follows
/// whitespace, a quote, `=`, `:` or a shell redirection/separator character (and ends at a path
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
                        .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == '-' || c == '.'))
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

/// Maps an absolute guest path (files API) to the host path under `root`.
/// Refuses relative paths and any `..` component.
pub(crate) fn map_guest_file(path: &str, root: &Path) -> Result<PathBuf, String> {
    if !path.starts_with('/') {
        return Err("path must be absolute".into());
    }
    let mut out = root.to_path_buf();
    let mut parts = 0;
    for comp in Path::new(path).components() {
        match comp {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(p) => {
                out.push(p);
                parts += 1;
            }
            Component::ParentDir => return Err("path must not contain '..'".into()),
            Component::Prefix(_) => return Err("invalid path".into()),
        }
    }
    if parts == 0 {
        return Err("path must name a file".into());
    }
    Ok(out)
}

/// RFC 3339 UTC timestamp with millisecond precision.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let (y, m, day) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        d.subsec_millis()
    )
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    (
        y,
        u32::try_from(m).unwrap_or(1),
        u32::try_from(d).unwrap_or(1),
    )
}

/// Now, as RFC 3339.
pub(crate) fn now_rfc3339() -> String {
    rfc3339(SystemTime::now())
}

/// Decodes `%XX` escapes (and leaves everything else alone).
pub(crate) fn percent_decode(s: &str) -> String {
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
        out.push(b[i]);
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

/// Parses a query string into decoded pairs (`+` is a space).
pub(crate) fn parse_query(q: Option<&str>) -> Vec<(String, String)> {
    let Some(q) = q else { return Vec::new() };
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (
                percent_decode(&k.replace('+', " ")),
                percent_decode(&v.replace('+', " ")),
            )
        })
        .collect()
}

/// A random lower-case alphanumeric string.
pub(crate) fn random_id(len: usize) -> String {
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut rng = rand::rng();
    (0..len)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect()
}

/// Sends `sig` to each process group, ignoring groups that are gone.
pub(crate) fn signal_groups(pgids: &[i32], sig: Signal) {
    for &g in pgids {
        if g > 1 {
            let _ = killpg(Pid::from_raw(g), sig);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_guest_roots_at_boundaries_only() {
        let root = Path::new("/g");
        assert_eq!(map_guest_text("/workspace/a.py", root), "/g/workspace/a.py");
        assert_eq!(
            map_guest_text("cat /workspace/x && ls /tmp", root),
            "cat /g/workspace/x && ls /g/tmp"
        );
        assert_eq!(map_guest_text("HOME=/root", root), "HOME=/g/root");
        assert_eq!(map_guest_text("'/tmp/x'", root), "'/g/tmp/x'");
        assert_eq!(map_guest_text("a:/tmp", root), "a:/g/tmp");
        assert_eq!(map_guest_text("cat x >/tmp/y", root), "cat x >/g/tmp/y");
        assert_eq!(
            map_guest_text("/tmpfile /usr/tmp /rootx", root),
            "/tmpfile /usr/tmp /rootx"
        );
        assert_eq!(map_guest_text("/usr/bin/python3", root), "/usr/bin/python3");
    }

    #[test]
    fn file_paths_refuse_escapes() {
        let root = Path::new("/g");
        assert_eq!(
            map_guest_file("/workspace/a/b.txt", root).unwrap(),
            Path::new("/g/workspace/a/b.txt")
        );
        assert!(map_guest_file("/workspace/../../etc/passwd", root).is_err());
        assert!(map_guest_file("relative", root).is_err());
        assert!(map_guest_file("/", root).is_err());
    }

    #[test]
    fn formats_rfc3339() {
        let t = UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_123);
        assert_eq!(rfc3339(t), "2023-11-14T22:13:20.123Z");
    }

    #[test]
    fn decodes_percent_and_queries() {
        assert_eq!(percent_decode("%2Fworkspace%2Fa%20b"), "/workspace/a b");
        assert_eq!(percent_decode("100%"), "100%");
        let q = parse_query(Some("path=%2Ftmp%2Fx&stream=true&x"));
        assert_eq!(q[0], ("path".into(), "/tmp/x".into()));
        assert_eq!(q[2], ("x".into(), String::new()));
    }
}
