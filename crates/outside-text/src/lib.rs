#![doc = include_str!("../README.md")]

pub mod secrets;

use std::borrow::Cow;
use std::fmt::Write as _;

/// What [`block()`] puts before every line after the first.
pub const CONTINUATION: &str = "  | ";

/// Whether `c` is written as an escape in [`line()`]: every control character (C0 including tab,
/// newline and carriage return, DEL, C1 including NEL), the line and paragraph separators, and
/// every invisible format character (Unicode's `Cf`: the bidirectional controls, zero-width
/// spaces and joiners, the byte-order mark, soft hyphen, tag characters, ...) and the
/// invisible fillers, so that what a reader sees of a text is all that is in it.
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}'
                | '\u{2029}'
                // Unicode 16's general category Cf (format characters).
                | '\u{00ad}'
                | '\u{0600}'..='\u{0605}'
                | '\u{061c}'
                | '\u{06dd}'
                | '\u{070f}'
                | '\u{0890}'..='\u{0891}'
                | '\u{08e2}'
                | '\u{180e}'
                | '\u{200b}'..='\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{206f}'
                | '\u{feff}'
                | '\u{fff9}'..='\u{fffb}'
                | '\u{110bd}'
                | '\u{110cd}'
                | '\u{13430}'..='\u{1343f}'
                | '\u{1bca0}'..='\u{1bca3}'
                | '\u{1d173}'..='\u{1d17a}'
                | '\u{e0001}'
                | '\u{e0020}'..='\u{e007f}'
                // Characters that show as blank space of no width or look like nothing.
                | '\u{034f}'
                | '\u{115f}'
                | '\u{1160}'
                | '\u{17b4}'
                | '\u{17b5}'
                | '\u{3164}'
                | '\u{ffa0}'
        )
}

/// `text` as one line: each character [`is_unsafe`] is written as a visible escape (`\n`, `\r`,
/// `\t`, `\x1b` below U+0100, `\u{2028}` above). Everything else is unchanged; nothing is cut.
pub fn line(text: &str) -> Cow<'_, str> {
    escape(text)
}

/// `text` as a readable multi-line message that cannot start a line of a log: its newlines stay,
/// every other unsafe character is escaped as in [`line()`], and every line after the first starts
/// with [`CONTINUATION`]. Trailing newlines are dropped.
pub fn block(text: &str) -> Cow<'_, str> {
    let text = text.trim_end_matches('\n');
    if !text.contains('\n') {
        return line(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for (i, part) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
            out.push_str(CONTINUATION);
        }
        out.push_str(&line(part));
    }
    Cow::Owned(out)
}

/// At most `max_bytes` bytes of `text`, cut at a character boundary, followed by
/// ` [... N bytes cut]` when anything was cut.
pub fn cap(text: &str, max_bytes: usize) -> Cow<'_, str> {
    if text.len() <= max_bytes {
        return Cow::Borrowed(text);
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    Cow::Owned(format!(
        "{} [... {} bytes cut]",
        &text[..end],
        text.len() - end
    ))
}

/// [`line()`] of at most `max_bytes` bytes of `text` (cut first, so the escapes of a long text
/// are never built): what an error quotes of a server's reply.
pub fn snippet(text: &str, max_bytes: usize) -> String {
    line(&cap(text, max_bytes)).into_owned()
}

fn escape(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if !is_unsafe(c) {
            out.push(c);
            continue;
        }
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x100 => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c => {
                let _ = write!(out, "\\u{{{:04x}}}", u32::from(c));
            }
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_break_control_and_bidi_character_is_escaped() {
        let hostile = "a\nb\rc\u{85}d\u{2028}e\u{2029}f\u{1b}[31mg\u{7}\u{7f}\u{9b}h\u{202e}i\u{2066}j\u{200f}k\u{61c}\tz\0";
        let shown = line(hostile);
        assert_eq!(
            shown,
            "a\\nb\\rc\\x85d\\u{2028}e\\u{2029}f\\x1b[31mg\\x07\\x7f\\x9bh\\u{202e}i\\u{2066}j\\u{200f}k\\u{061c}\\tz\\x00"
        );
        assert!(!shown.chars().any(is_unsafe));
        for c in (0..=0x10_ffff).filter_map(char::from_u32) {
            let one = c.to_string();
            let shown = line(&one);
            assert!(!shown.chars().any(is_unsafe), "{c:?} -> {shown:?}");
            assert_eq!(shown.lines().count(), 1, "{c:?} broke the line");
        }
    }

    /// Issue 45: invisible characters cannot hide text from whoever reads a message or a log.
    #[test]
    fn invisible_format_characters_are_escaped() {
        let hostile =
            "ok\u{200b}\u{200d}\u{feff}\u{00ad}\u{2060}\u{e0041}\u{e007f}\u{180e}\u{3164}";
        assert_eq!(
            line(hostile),
            "ok\\u{200b}\\u{200d}\\u{feff}\\xad\\u{2060}\\u{e0041}\\u{e007f}\\u{180e}\\u{3164}"
        );
        for c in [
            '\u{200b}',
            '\u{200c}',
            '\u{feff}',
            '\u{e0001}',
            '\u{e0020}',
            '\u{2064}',
        ] {
            assert!(is_unsafe(c), "{c:?}");
        }
        for c in ['a', 'é', '中', '😀', '\u{fe0f}', ' '] {
            assert!(!is_unsafe(c), "{c:?}");
        }
    }

    #[test]
    fn safe_text_is_borrowed_unchanged() {
        for text in ["plain text é 😀 中文", "C:\\path\\to", ""] {
            assert!(matches!(line(text), Cow::Borrowed(t) if t == text));
        }
    }

    #[test]
    fn a_block_keeps_its_lines_but_none_starts_with_outside_text() {
        let shown = block("ValueError: boom\nCRITICAL root: forged\r\n\n2026 fake record\n");
        assert_eq!(
            shown,
            "ValueError: boom\n  | CRITICAL root: forged\\r\n  | \n  | 2026 fake record"
        );
        for l in shown.lines().skip(1) {
            assert!(l.starts_with(CONTINUATION), "{l:?}");
        }
        assert_eq!(block("one line\u{2028}two"), "one line\\u{2028}two");
    }

    #[test]
    fn a_cap_cuts_at_a_character_boundary_and_says_how_much() {
        assert_eq!(cap("short", 10), "short");
        assert_eq!(cap("ééé", 3), "é [... 4 bytes cut]");
        let big = "x".repeat(5 << 20);
        let s = snippet(&big, 200);
        assert!(
            s.len() < 260 && s.ends_with(" [... 5242680 bytes cut]"),
            "{}",
            s.len()
        );
        assert_eq!(
            snippet("\u{1b}]0;title\u{7}ok", 100),
            "\\x1b]0;title\\x07ok"
        );
    }
}
