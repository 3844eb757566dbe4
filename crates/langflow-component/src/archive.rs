//! Reading the guest's artifact archive safely, in memory.
//!
//! The guest chose every byte of the archive, so nothing in it is trusted: the reader keeps
//! only regular files with safe relative names, returns at most [`ArchiveLimits::max_files`]
//! of them, stops decompressing once [`ArchiveLimits::max_unpacked_bytes`] have come out of
//! the gzip stream (headers included, so a gzip bomb costs a bounded amount of memory and
//! CPU), and never writes anything to the host's disk. Whatever it skips or stops at becomes
//! a note; reading never fails and never panics.

use std::collections::BTreeSet;
use std::io::{self, Read};

use base64::Engine as _;
use tar::EntryType;

/// Bounds on what one archive may cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchiveLimits {
    /// Files returned at most (256).
    pub max_files: usize,
    /// Entries of any kind examined at most (directories, links and skipped entries count).
    pub max_entries: usize,
    /// Bytes decompressed at most, tar headers included; reading stops there.
    pub max_unpacked_bytes: u64,
    /// Longest accepted member name, in bytes.
    pub max_name_bytes: usize,
}

impl Default for ArchiveLimits {
    fn default() -> Self {
        Self {
            max_files: MAX_FILES,
            max_entries: 4 * MAX_FILES,
            max_unpacked_bytes: MAX_UNPACKED_BYTES,
            max_name_bytes: 1024,
        }
    }
}

/// At most this many files come back from one run.
pub const MAX_FILES: usize = 256;
/// At most this many bytes are decompressed from one archive (16 MiB).
pub const MAX_UNPACKED_BYTES: u64 = 16 * 1024 * 1024;

/// One file the guest returned.
#[derive(Clone, PartialEq, Eq)]
pub struct ReturnedFile {
    /// Its path relative to `/workspace/artifacts`, `/`-separated, with no `.` or `..`.
    pub path: String,
    /// Its size in bytes.
    pub size: u64,
    /// The content, when it is valid UTF-8.
    pub text: Option<String>,
    /// The content in standard base64, when it is not valid UTF-8.
    pub base64: Option<String>,
}

impl std::fmt::Debug for ReturnedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReturnedFile")
            .field("path", &self.path)
            .field("size", &self.size)
            .field("text", &self.text.is_some())
            .finish_non_exhaustive()
    }
}

/// What [`read_archive`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extracted {
    /// The files kept, in archive order.
    pub files: Vec<ReturnedFile>,
    /// One line per thing skipped or cut short, in the order met.
    pub notes: Vec<String>,
}

/// A reader that refuses to yield more than `left` bytes.
struct Bounded<R> {
    inner: R,
    left: u64,
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Err(io::Error::other("the decompressed size limit was reached"));
        }
        let want = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.left -= n as u64;
        Ok(n)
    }
}

/// Why a member name is refused, or the safe name.
fn safe_name(raw: &[u8], max_bytes: usize) -> Result<String, &'static str> {
    let Ok(name) = std::str::from_utf8(raw) else {
        return Err("its name is not UTF-8");
    };
    if name.len() > max_bytes {
        return Err("its name is too long");
    }
    if name.starts_with('/') {
        return Err("its path is absolute");
    }
    if name.chars().any(|c| c.is_control() || c == '\\') {
        return Err("its name has control characters or a backslash");
    }
    let mut parts = Vec::new();
    for part in name.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err("its path climbs out with `..`"),
            p => parts.push(p),
        }
    }
    Ok(parts.join("/"))
}

/// Shows a raw member name in a note, bounded and without control characters.
fn shown(raw: &[u8]) -> String {
    let s: String = String::from_utf8_lossy(raw)
        .chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .take(120)
        .collect();
    format!("{s:?}")
}

fn kind_of(t: EntryType) -> Option<&'static str> {
    match t {
        EntryType::Regular | EntryType::Continuous => None,
        EntryType::Symlink => Some("a symbolic link"),
        EntryType::Link => Some("a hard link"),
        EntryType::Char | EntryType::Block => Some("a device"),
        EntryType::Fifo => Some("a FIFO"),
        EntryType::GNUSparse => Some("a sparse file"),
        _ => Some("not a regular file"),
    }
}

/// Reads a gzip-compressed tar archive held in memory and keeps its regular files with safe
/// names, within `limits`. Never fails: everything skipped or cut short is a note.
pub fn read_archive(gz: &[u8], limits: &ArchiveLimits) -> Extracted {
    let mut out = Extracted::default();
    let reader = Bounded {
        inner: flate2::read::GzDecoder::new(gz),
        left: limits.max_unpacked_bytes,
    };
    let mut archive = tar::Archive::new(reader);
    let entries = match archive.entries() {
        Ok(e) => e,
        Err(e) => {
            out.notes
                .push(format!("the archive could not be read: {e}"));
            return out;
        }
    };
    let mut seen = BTreeSet::new();
    let mut examined = 0usize;
    for entry in entries {
        let mut entry = match entry {
            Ok(e) => e,
            Err(e) => {
                out.notes.push(format!(
                    "the archive could not be read past {} file(s): {e}",
                    out.files.len()
                ));
                break;
            }
        };
        examined += 1;
        if examined > limits.max_entries {
            out.notes.push(format!(
                "the archive has more than {} entries; the rest were not read",
                limits.max_entries
            ));
            break;
        }
        let raw = entry.path_bytes().into_owned();
        let kind = entry.header().entry_type();
        if kind == EntryType::Directory {
            continue;
        }
        if let Some(what) = kind_of(kind) {
            out.notes
                .push(format!("{} was skipped: it is {what}", shown(&raw)));
            continue;
        }
        let name = match safe_name(&raw, limits.max_name_bytes) {
            Ok(n) if n.is_empty() => {
                out.notes
                    .push(format!("{} was skipped: it has no name", shown(&raw)));
                continue;
            }
            Ok(n) => n,
            Err(why) => {
                out.notes
                    .push(format!("{} was skipped: {why}", shown(&raw)));
                continue;
            }
        };
        if out.files.len() == limits.max_files {
            out.notes.push(format!(
                "more than {} files were returned; the rest were not read",
                limits.max_files
            ));
            break;
        }
        if !seen.insert(name.clone()) {
            out.notes
                .push(format!("{name:?} appears twice; the first copy was kept"));
            continue;
        }
        let mut content = Vec::new();
        if let Err(e) = entry.read_to_end(&mut content) {
            out.notes
                .push(format!("{name:?} could not be read ({e}); reading stopped"));
            break;
        }
        let size = content.len() as u64;
        let (text, base64) = match String::from_utf8(content) {
            Ok(s) => (Some(s), None),
            Err(e) => (
                None,
                Some(base64::engine::general_purpose::STANDARD.encode(e.as_bytes())),
            ),
        };
        out.files.push(ReturnedFile {
            path: name,
            size,
            text,
            base64,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use flate2::Compression;
    use flate2::write::GzEncoder;

    use super::*;

    /// A raw ustar header for `name` (written verbatim, so hostile names survive).
    fn header(name: &[u8], kind: u8, size: u64, link: &[u8]) -> [u8; 512] {
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name);
        h[100..107].copy_from_slice(b"0000644");
        h[108..115].copy_from_slice(b"0000000");
        h[116..123].copy_from_slice(b"0000000");
        h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
        h[136..147].copy_from_slice(b"00000000000");
        h[156] = kind;
        h[157..157 + link.len()].copy_from_slice(link);
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].copy_from_slice(b"        ");
        let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
        h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        h
    }

    /// One raw member: name, type flag, content, link target.
    type Member<'a> = (&'a [u8], u8, &'a [u8], &'a [u8]);

    /// A tar of raw members, gzip-compressed.
    fn tgz(members: &[Member<'_>]) -> Vec<u8> {
        let mut tar = Vec::new();
        for (name, kind, content, link) in members {
            tar.extend_from_slice(&header(name, *kind, content.len() as u64, link));
            tar.extend_from_slice(content);
            tar.resize(tar.len().next_multiple_of(512), 0);
        }
        tar.extend_from_slice(&[0u8; 1024]);
        let mut gz = GzEncoder::new(Vec::new(), Compression::default());
        gz.write_all(&tar).unwrap();
        gz.finish().unwrap()
    }

    fn paths(x: &Extracted) -> Vec<&str> {
        x.files.iter().map(|f| f.path.as_str()).collect()
    }

    #[test]
    fn keeps_regular_files_as_text_or_base64() {
        let gz = tgz(&[
            (b"./", b'5', b"", b""),
            (b"./report.txt", b'0', b"hello\n", b""),
            (b"./sub/data.bin", b'0', &[0xff, 0x00, 0xfe], b""),
        ]);
        let x = read_archive(&gz, &ArchiveLimits::default());
        assert_eq!(paths(&x), ["report.txt", "sub/data.bin"]);
        assert_eq!(x.files[0].text.as_deref(), Some("hello\n"));
        assert_eq!(x.files[0].size, 6);
        assert_eq!(x.files[1].text, None);
        assert_eq!(x.files[1].base64.as_deref(), Some("/wD+"));
        assert!(x.notes.is_empty(), "{:?}", x.notes);
    }

    #[test]
    fn hostile_names_and_kinds_are_skipped_with_a_note() {
        let gz = tgz(&[
            (b"../escape.txt", b'0', b"x", b""),
            (b"a/../../escape2.txt", b'0', b"x", b""),
            (b"/etc/passwd", b'0', b"x", b""),
            (b"link", b'2', b"", b"/etc/passwd"),
            (b"hard", b'1', b"", b"ok.txt"),
            (b"dev", b'3', b"", b""),
            (b"blk", b'4', b"", b""),
            (b"fifo", b'6', b"", b""),
            (b"bad\x01name", b'0', b"x", b""),
            (b"\xff\xfe", b'0', b"x", b""),
            (b"ok.txt", b'0', b"fine", b""),
        ]);
        let x = read_archive(&gz, &ArchiveLimits::default());
        assert_eq!(paths(&x), ["ok.txt"]);
        assert_eq!(x.notes.len(), 10, "{:#?}", x.notes);
        let all = x.notes.join("\n");
        for needle in [
            "`..`",
            "absolute",
            "symbolic link",
            "hard link",
            "a device",
            "FIFO",
            "control characters",
            "not UTF-8",
        ] {
            assert!(all.contains(needle), "{needle}: {all}");
        }
    }

    #[test]
    fn at_most_max_files_come_back() {
        let names: Vec<String> = (0..300).map(|i| format!("f{i:03}")).collect();
        let members: Vec<Member<'_>> = names
            .iter()
            .map(|n| (n.as_bytes(), b'0', b"x".as_slice(), b"".as_slice()))
            .collect();
        let x = read_archive(&tgz(&members), &ArchiveLimits::default());
        assert_eq!(x.files.len(), 256);
        assert_eq!(x.files[255].path, "f255");
        assert!(x.notes[0].contains("more than 256 files"), "{:?}", x.notes);
    }

    #[test]
    fn a_gzip_bomb_stops_at_the_unpacked_limit() {
        // 64 MiB of zeros in one member compress to about 64 KiB.
        let zeros = vec![0u8; 64 * 1024 * 1024];
        let gz = tgz(&[
            (b"small.txt", b'0', b"first", b""),
            (b"bomb", b'0', &zeros, b""),
        ]);
        assert!(gz.len() < 1024 * 1024, "{}", gz.len());
        let limits = ArchiveLimits::default();
        let x = read_archive(&gz, &limits);
        assert_eq!(paths(&x), ["small.txt"]);
        assert_eq!(x.notes.len(), 1, "{:?}", x.notes);
        assert!(x.notes[0].contains("size limit"), "{:?}", x.notes);
    }

    #[test]
    fn garbage_and_truncated_archives_are_notes_not_errors() {
        let x = read_archive(b"not gzip at all", &ArchiveLimits::default());
        assert!(x.files.is_empty());
        assert_eq!(x.notes.len(), 1, "{:?}", x.notes);
        let good = tgz(&[
            (b"a.txt", b'0', b"aaaa", b""),
            (b"b.txt", b'0', b"bbbb", b""),
        ]);
        for cut in [10, good.len() / 2, good.len() - 9] {
            let x = read_archive(&good[..cut], &ArchiveLimits::default());
            assert!(x.files.len() <= 2);
            assert!(!x.notes.is_empty() || x.files.len() == 2, "cut {cut}");
        }
        let x = read_archive(&[], &ArchiveLimits::default());
        assert!(x.files.is_empty());
    }

    #[test]
    fn duplicate_names_keep_the_first() {
        let gz = tgz(&[
            (b"a.txt", b'0', b"one", b""),
            (b"./a.txt", b'0', b"two", b""),
        ]);
        let x = read_archive(&gz, &ArchiveLimits::default());
        assert_eq!(paths(&x), ["a.txt"]);
        assert_eq!(x.files[0].text.as_deref(), Some("one"));
        assert!(x.notes[0].contains("twice"));
    }

    #[test]
    fn entry_count_is_bounded_even_when_nothing_is_kept() {
        let names: Vec<String> = (0..50).map(|i| format!("l{i}")).collect();
        let members: Vec<Member<'_>> = names
            .iter()
            .map(|n| (n.as_bytes(), b'2', b"".as_slice(), b"x".as_slice()))
            .collect();
        let limits = ArchiveLimits {
            max_entries: 10,
            ..ArchiveLimits::default()
        };
        let x = read_archive(&tgz(&members), &limits);
        assert!(x.files.is_empty());
        assert_eq!(x.notes.len(), 11, "{:?}", x.notes);
        assert!(x.notes[10].contains("more than 10 entries"));
    }
}
