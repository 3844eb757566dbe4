//! What the runner writes: one JSON frame per line on its standard output, anything else as
//! log lines. Parsing is bounded: a frame line longer than the limit stops the run (the
//! [`createos_api::LineFramer`] refuses it before buffering more), a malformed line is reported
//! and skipped, and a log line longer than [`MAX_LOG_LINE`] is cut.

use std::fmt::Write as _;

use bytes::Bytes;
use serde_json::Value;

/// The longest log line kept, in bytes; the rest of a longer line is dropped (and counted).
pub const MAX_LOG_LINE: usize = 4096;

/// One frame of the runner's protocol.
#[derive(Debug, Clone, PartialEq)]
pub enum RunnerFrame {
    /// lfx is importable in the guest.
    Hello {
        /// lfx's version in the guest.
        lfx: String,
        /// Python's version in the guest.
        python: String,
    },
    /// A vertex finished (the whole frame object).
    Vertex(Value),
    /// The run finished: the serialized `RunOutputs` (empty in stream mode).
    Complete(Value),
    /// The run could not finish.
    Error {
        /// `missing_lfx`, `flow` or `protocol`.
        kind: String,
        /// The Python exception type, for `flow`.
        error_type: Option<String>,
        /// What the runner said.
        message: String,
    },
}

/// How one line of the runner's standard output reads.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    /// A frame.
    Frame(RunnerFrame),
    /// Not a frame: a log line.
    Log(String),
    /// A line that looks like a frame but is not one; the reason.
    Malformed(String),
}

fn text(v: &Value, key: &str) -> Option<String> {
    v.get(key).and_then(Value::as_str).map(str::to_owned)
}

/// Reads one line of the runner's standard output.
pub fn parse_line(line: &[u8]) -> Line {
    let trimmed = line.trim_ascii();
    if trimmed.is_empty() {
        return Line::Log(String::new());
    }
    if trimmed[0] != b'{' {
        return Line::Log(String::from_utf8_lossy(trimmed).into_owned());
    }
    let v: Value = match serde_json::from_slice(trimmed) {
        Ok(v) => v,
        Err(e) => return Line::Malformed(format!("not JSON ({e})")),
    };
    let Some(kind) = v.get("frame").and_then(Value::as_str) else {
        return Line::Malformed("a JSON object without a `frame` key".to_owned());
    };
    match kind {
        "hello" => Line::Frame(RunnerFrame::Hello {
            lfx: text(&v, "lfx").unwrap_or_default(),
            python: text(&v, "python").unwrap_or_default(),
        }),
        "vertex" if v.get("id").is_some_and(Value::is_string) => {
            Line::Frame(RunnerFrame::Vertex(v))
        }
        "vertex" => Line::Malformed("a vertex frame without an id".to_owned()),
        "complete" => match v.get("outputs") {
            Some(Value::Array(_)) => {
                let Value::Object(mut o) = v else {
                    unreachable!("checked above")
                };
                Line::Frame(RunnerFrame::Complete(
                    o.remove("outputs").unwrap_or_default(),
                ))
            }
            _ => Line::Malformed("a complete frame without an outputs list".to_owned()),
        },
        "error" => Line::Frame(RunnerFrame::Error {
            kind: text(&v, "kind").unwrap_or_else(|| "flow".to_owned()),
            error_type: text(&v, "type"),
            message: text(&v, "message").unwrap_or_default(),
        }),
        other => Line::Malformed(format!("an unknown frame kind {other:?}")),
    }
}

/// Splits the guest's standard error into log lines, keeping at most [`MAX_LOG_LINE`] bytes of
/// each (the rest of a longer line is dropped as it arrives, so memory stays bounded).
#[derive(Debug, Default)]
pub struct LogLines {
    partial: Vec<u8>,
    cut: usize,
}

impl LogLines {
    /// Feeds a chunk; returns the lines it completed (a cut line ends with a marker).
    pub fn push(&mut self, chunk: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        for piece in chunk.split_inclusive(|b| *b == b'\n') {
            let (body, ends) = match piece.strip_suffix(b"\n") {
                Some(b) => (b, true),
                None => (piece, false),
            };
            let room = MAX_LOG_LINE.saturating_sub(self.partial.len());
            let take = body.len().min(room);
            self.partial.extend_from_slice(&body[..take]);
            self.cut += body.len() - take;
            if ends {
                out.push(self.take());
            }
        }
        out
    }

    /// The unterminated last line, if any.
    pub fn finish(&mut self) -> Option<String> {
        (!self.partial.is_empty() || self.cut > 0).then(|| self.take())
    }

    fn take(&mut self) -> String {
        let mut line = String::from_utf8_lossy(&self.partial)
            .trim_end_matches('\r')
            .to_owned();
        if self.cut > 0 {
            let _ = write!(line, " [... {} bytes cut]", self.cut);
        }
        self.partial.clear();
        self.cut = 0;
        line
    }
}

/// Feeds `framer` with a chunk of the runner's standard output.
pub fn push_stdout(framer: &mut createos_api::LineFramer, chunk: &str) {
    framer.push(Bytes::copy_from_slice(chunk.as_bytes()));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_logs_and_malformed_lines() {
        assert_eq!(
            parse_line(br#"{"frame":"hello","lfx":"1.13.0","python":"3.11"}"#),
            Line::Frame(RunnerFrame::Hello {
                lfx: "1.13.0".into(),
                python: "3.11".into()
            })
        );
        assert!(matches!(
            parse_line(br#"{"frame":"vertex","id":"a","seq":1}"#),
            Line::Frame(RunnerFrame::Vertex(_))
        ));
        assert_eq!(
            parse_line(br#"{"frame":"complete","outputs":[1]}"#),
            Line::Frame(RunnerFrame::Complete(serde_json::json!([1])))
        );
        assert_eq!(parse_line(b"hello world"), Line::Log("hello world".into()));
        for bad in [
            &br#"{"frame":"vertex"}"#[..],
            br#"{"frame":"complete"}"#,
            br#"{"frame":"wat"}"#,
            br#"{"no":"frame"}"#,
            br#"{"frame":"vertex","id":"#,
        ] {
            assert!(matches!(parse_line(bad), Line::Malformed(_)), "{bad:?}");
        }
    }

    #[test]
    fn log_lines_are_cut_not_buffered() {
        let mut l = LogLines::default();
        assert_eq!(l.push(b"one\ntw"), vec!["one"]);
        assert_eq!(l.push(b"o\r\n"), vec!["two"]);
        let huge = vec![b'x'; MAX_LOG_LINE * 3];
        assert!(l.push(&huge).is_empty());
        assert!(l.partial.len() <= MAX_LOG_LINE);
        let lines = l.push(b"y\nz");
        assert_eq!(lines.len(), 1);
        assert!(lines[0].ends_with(&format!("[... {} bytes cut]", MAX_LOG_LINE * 2 + 1)));
        assert_eq!(l.finish().as_deref(), Some("z"));
        assert_eq!(l.finish(), None);
    }
}
