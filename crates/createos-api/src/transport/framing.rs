//! Stream framing: a bounded line framer (public, so other crates can split their own byte
//! streams the same way) and, on top of it, the NDJSON/SSE frame splitter of every stream
//! this crate reads (contract §3.1).

use bytes::{Bytes, BytesMut};
use futures::stream::{self, BoxStream, StreamExt};
use serde_json::{Map, Value};

use super::idle::{RawMeta, body_chunks};
use super::secrets::Redactor;
use crate::error::{Error, Result};

/// The longest line a stream of this crate accepts (16 MiB); a longer one fails the stream
/// with a protocol error, as soon as it is known to be longer (without waiting for its end).
pub const MAX_STREAM_LINE: usize = 16 * 1024 * 1024;

/// A line longer than the limit of a [`LineFramer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LineTooLong {
    /// The limit that was exceeded, in bytes.
    pub limit: usize,
}

impl std::fmt::Display for LineTooLong {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stream line longer than {} bytes", self.limit)
    }
}

impl std::error::Error for LineTooLong {}

/// Splits a byte stream, arriving in chunks of any size, into lines, holding at most one
/// line's worth of bytes (plus the chunk being cut).
///
/// It does no I/O: [`push`](Self::push) each chunk as it arrives, take the complete lines
/// with [`next_line`](Self::next_line) until it returns `Ok(None)`, and call
/// [`finish`](Self::finish) at the end of the input so an unterminated last line is
/// returned too.
///
/// - A line ends at `\n`, `\r\n` or `\r` (the line endings of server-sent events, which
///   covers NDJSON); the terminator is not part of the line, and `\r\n` split between two
///   chunks still ends one line. Blank lines are returned (as empty lines).
/// - Lines are returned as [`Bytes`], cut from the pushed chunk without copying when the
///   whole line lies in one chunk; a line spread over several chunks is copied once.
/// - A line longer than the limit is an error ([`LineTooLong`]), reported as soon as the
///   buffered start of the line passes the limit. The framer stops there: every later call
///   returns the same error and pushed chunks are dropped, so memory stays bounded.
/// - Bytes are not decoded: a line may hold any bytes, UTF-8 or not.
///
/// ```
/// use bytes::Bytes;
/// use createos_api::{LineFramer, LineTooLong};
///
/// let mut framer = LineFramer::new(16);
/// let mut lines = Vec::new();
/// for chunk in ["data: {\"a\"", ":1}\r", "\nsecond\nlast"] {
///     framer.push(Bytes::from(chunk));
///     while let Some(line) = framer.next_line()? {
///         lines.push(line);
///     }
/// }
/// framer.finish();
/// while let Some(line) = framer.next_line()? {
///     lines.push(line);
/// }
/// assert_eq!(lines, ["data: {\"a\":1}", "second", "last"]);
///
/// // A line past the limit fails before its end arrives.
/// let mut framer = LineFramer::new(4);
/// framer.push(Bytes::from("12345"));
/// assert_eq!(framer.next_line(), Err(LineTooLong { limit: 4 }));
/// # Ok::<(), LineTooLong>(())
/// ```
#[derive(Debug, Clone)]
pub struct LineFramer {
    /// What is left of the latest chunk; lines are cut from it without copying.
    chunk: Bytes,
    /// The start of a line whose end has not arrived yet.
    partial: BytesMut,
    max_line: usize,
    /// The last terminator was `\r`: a `\n` right after it belongs to it.
    after_cr: bool,
    /// [`finish`](Self::finish) was called.
    finished: bool,
    /// A line was too long; the framer has stopped.
    failed: bool,
}

impl LineFramer {
    /// A framer that refuses lines longer than `max_line` bytes (terminator excluded).
    pub fn new(max_line: usize) -> Self {
        Self {
            chunk: Bytes::new(),
            partial: BytesMut::new(),
            max_line,
            after_cr: false,
            finished: false,
            failed: false,
        }
    }

    /// The longest line accepted, in bytes.
    pub fn max_line(&self) -> usize {
        self.max_line
    }

    /// Add the next chunk of input. Take the lines of the previous chunk first (until
    /// [`next_line`](Self::next_line) returns `Ok(None)`): pushing earlier is correct but
    /// copies what was left of it. Ignored after [`finish`](Self::finish) or an error.
    pub fn push(&mut self, chunk: Bytes) {
        if self.failed || self.finished || chunk.is_empty() {
            return;
        }
        if self.chunk.is_empty() {
            self.chunk = chunk;
        } else {
            let mut joined = BytesMut::with_capacity(self.chunk.len() + chunk.len());
            joined.extend_from_slice(&self.chunk);
            joined.extend_from_slice(&chunk);
            self.chunk = joined.freeze();
        }
    }

    /// Mark the end of the input: the bytes after the last terminator, if any, become the
    /// last line.
    pub fn finish(&mut self) {
        self.finished = true;
    }

    /// The next complete line, `Ok(None)` when more input is needed (or, after
    /// [`finish`](Self::finish), when every line was returned), or an error when a line is
    /// longer than the limit.
    pub fn next_line(&mut self) -> std::result::Result<Option<Bytes>, LineTooLong> {
        let too_long = LineTooLong {
            limit: self.max_line,
        };
        if self.failed {
            return Err(too_long);
        }
        if self.after_cr && !self.chunk.is_empty() {
            if self.chunk[0] == b'\n' {
                let _ = self.chunk.split_to(1);
            }
            self.after_cr = false;
        }
        if let Some(pos) = self.chunk.iter().position(|b| *b == b'\n' || *b == b'\r') {
            let mut head = self.chunk.split_to(pos + 1);
            self.after_cr = head[pos] == b'\r';
            head.truncate(pos);
            let line = if self.partial.is_empty() {
                head
            } else {
                self.partial.extend_from_slice(&head);
                self.partial.split().freeze()
            };
            return self.checked(line).map(Some);
        }
        if !self.chunk.is_empty() {
            if self.partial.len() + self.chunk.len() > self.max_line {
                return Err(self.fail());
            }
            self.partial.extend_from_slice(&self.chunk);
            self.chunk.clear();
        }
        if self.finished && !self.partial.is_empty() {
            let rest = self.partial.split().freeze();
            return self.checked(rest).map(Some);
        }
        Ok(None)
    }

    fn checked(&mut self, line: Bytes) -> std::result::Result<Bytes, LineTooLong> {
        if line.len() > self.max_line {
            return Err(self.fail());
        }
        Ok(line)
    }

    fn fail(&mut self) -> LineTooLong {
        self.failed = true;
        self.chunk = Bytes::new();
        self.partial = BytesMut::new();
        LineTooLong {
            limit: self.max_line,
        }
    }
}

/// Frame state for [`ndjson_frames`].
struct Framer {
    chunks: BoxStream<'static, Result<Bytes>>,
    lines: LineFramer,
    secrets: Redactor,
    /// A transport error, delivered after the complete lines that preceded it.
    failed: Option<Error>,
}

impl Framer {
    /// Handle one complete line per §3.1; returns a frame, nothing, or an error.
    fn line(&self, raw: &[u8]) -> Result<Option<Map<String, Value>>> {
        let text = std::str::from_utf8(raw)
            .map_err(|e| Error::protocol_with("stream line is not valid UTF-8", e))?;
        let line = text.trim();
        if line.is_empty()
            || line.starts_with(':')
            || line.starts_with("event:")
            || line.starts_with("id:")
            || line.starts_with("retry:")
        {
            return Ok(None);
        }
        let json = match line.strip_prefix("data:") {
            Some(rest) => {
                let rest = rest.trim();
                if rest.is_empty() {
                    return Ok(None);
                }
                rest
            }
            None => line,
        };
        match serde_json::from_str::<Value>(json) {
            Ok(Value::Object(m)) => Ok(Some(m)),
            Ok(_) => Err(Error::protocol("stream frame is not a JSON object")),
            Err(e) => Err(Error::protocol(format!(
                "invalid stream frame: {}; line starts with {:?}",
                self.secrets.apply(&e.to_string()),
                self.secrets.shorten(json, 200)
            ))),
        }
    }

    /// The next frame among the lines already received, parsed only now: a network chunk
    /// carrying many frames is neither copied nor held parsed all at once. After end of
    /// stream an unterminated last line counts too.
    fn next_buffered(&mut self) -> Result<Option<Map<String, Value>>> {
        while let Some(raw) = self
            .lines
            .next_line()
            .map_err(|e| Error::protocol(e.to_string()))?
        {
            if let Some(frame) = self.line(&raw)? {
                return Ok(Some(frame));
            }
        }
        Ok(None)
    }
}

/// Split a response body into JSON-object frames: NDJSON and single-line SSE, mixed
/// freely (§3.1). Dropping the stream drops the response and closes the connection.
pub(crate) fn ndjson_frames(
    resp: reqwest::Response,
) -> BoxStream<'static, Result<Map<String, Value>>> {
    let secrets = resp
        .extensions()
        .get::<RawMeta>()
        .map(|m| m.secrets.clone())
        .unwrap_or_default();
    frames_from_chunks(body_chunks(resp), secrets)
}

/// The framing half of [`ndjson_frames`], over any stream of body chunks.
fn frames_from_chunks(
    chunks: BoxStream<'static, Result<Bytes>>,
    secrets: Redactor,
) -> BoxStream<'static, Result<Map<String, Value>>> {
    let framer = Framer {
        chunks,
        lines: LineFramer::new(MAX_STREAM_LINE),
        secrets,
        failed: None,
    };
    stream::unfold(Some(framer), |state| async move {
        let mut f = state?;
        loop {
            match f.next_buffered() {
                Ok(Some(frame)) => return Some((Ok(frame), Some(f))),
                Ok(None) => {}
                Err(e) => return Some((Err(e), None)),
            }
            if let Some(e) = f.failed.take() {
                return Some((Err(e), None));
            }
            if f.lines.finished {
                return None;
            }
            match f.chunks.next().await {
                Some(Ok(chunk)) => f.lines.push(chunk),
                Some(Err(e)) => f.failed = Some(e),
                None => f.lines.finish(),
            }
        }
    })
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames_of(chunks: Vec<Result<Bytes>>) -> Vec<std::result::Result<Value, String>> {
        let stream = frames_from_chunks(stream::iter(chunks).boxed(), Redactor::default());
        futures::executor::block_on(stream.collect::<Vec<_>>())
            .into_iter()
            .map(|r| r.map(Value::Object).map_err(|e| e.to_string()))
            .collect()
    }

    #[test]
    fn frames_survive_any_chunking_and_an_unterminated_last_line() {
        let body = b": hi\r\n{\"a\":1}\ndata: {\"b\":\"\xc3\xa9\"}\r\n\nevent: x\n{\"c\":3}";
        for size in 1..body.len() {
            let chunks = body
                .chunks(size)
                .map(|c| Ok(Bytes::copy_from_slice(c)))
                .collect();
            let got = frames_of(chunks);
            let want: Vec<std::result::Result<Value, String>> = vec![
                Ok(serde_json::json!({"a": 1})),
                Ok(serde_json::json!({"b": "é"})),
                Ok(serde_json::json!({"c": 3})),
            ];
            assert_eq!(got, want, "chunks of {size} bytes");
        }
    }

    #[test]
    fn frames_before_a_transport_error_come_first_and_a_partial_line_is_dropped() {
        let got = frames_of(vec![
            Ok(Bytes::from_static(b"{\"a\":1}\n{\"b\"")),
            Err(Error::protocol("connection reset")),
            Ok(Bytes::from_static(b":2}\n")),
        ]);
        assert_eq!(got.len(), 2, "{got:?}");
        assert_eq!(got[0], Ok(serde_json::json!({"a": 1})));
        assert!(
            got[1]
                .as_ref()
                .is_err_and(|e| e.contains("connection reset"))
        );
    }

    #[test]
    fn a_line_past_the_limit_fails_without_waiting_for_its_end() {
        let piece = Bytes::from(vec![b'x'; 1024 * 1024]);
        let chunks = (0..=MAX_STREAM_LINE / piece.len())
            .map(|_| Ok(piece.clone()))
            .collect();
        let got = frames_of(chunks);
        assert_eq!(got.len(), 1);
        assert!(got[0].as_ref().is_err_and(|e| e.contains("longer than")));
    }

    /// Every line `framer` yields for `chunks`, then after `finish`.
    fn lines_of(max_line: usize, chunks: &[&[u8]]) -> std::result::Result<Vec<Bytes>, LineTooLong> {
        let mut framer = LineFramer::new(max_line);
        let mut lines = Vec::new();
        for chunk in chunks {
            framer.push(Bytes::copy_from_slice(chunk));
            while let Some(line) = framer.next_line()? {
                lines.push(line);
            }
        }
        framer.finish();
        while let Some(line) = framer.next_line()? {
            lines.push(line);
        }
        Ok(lines)
    }

    #[test]
    fn lines_end_at_lf_crlf_or_cr_however_the_input_is_chunked() {
        let body: &[u8] = b"one\r\ntwo\nthree\rfour\r\n\r\n\nlast";
        let want: Vec<&[u8]> = vec![b"one", b"two", b"three", b"four", b"", b"", b"last"];
        for size in 1..=body.len() {
            let chunks: Vec<&[u8]> = body.chunks(size).collect();
            assert_eq!(
                lines_of(64, &chunks).unwrap(),
                want,
                "chunks of {size} bytes"
            );
        }
    }

    #[test]
    fn an_unterminated_line_waits_for_more_input_or_finish() {
        let mut framer = LineFramer::new(64);
        framer.push(Bytes::from_static(b"par"));
        assert_eq!(framer.next_line(), Ok(None));
        framer.push(Bytes::from_static(b"tial"));
        assert_eq!(framer.next_line(), Ok(None));
        framer.finish();
        assert_eq!(framer.next_line(), Ok(Some(Bytes::from_static(b"partial"))));
        assert_eq!(framer.next_line(), Ok(None));
        // Input after the end is ignored.
        framer.push(Bytes::from_static(b"late\n"));
        assert_eq!(framer.next_line(), Ok(None));
    }

    #[test]
    fn pushing_before_the_lines_are_taken_loses_nothing() {
        let mut framer = LineFramer::new(64);
        framer.push(Bytes::from_static(b"a\nb"));
        framer.push(Bytes::from_static(b"c\nd\r"));
        framer.push(Bytes::from_static(b"\ne\n"));
        let mut lines = Vec::new();
        while let Some(line) = framer.next_line().unwrap() {
            lines.push(line);
        }
        assert_eq!(lines, ["a", "bc", "d", "e"]);
    }

    #[test]
    fn the_limit_holds_at_every_chunking_and_the_framer_stops_after_it() {
        const TOO_LONG: LineTooLong = LineTooLong { limit: 4 };
        for body in [&b"12345\nok\n"[..], b"ok\n12345", b"ok\r12345\r\n"] {
            for size in 1..=body.len() {
                let chunks: Vec<&[u8]> = body.chunks(size).collect();
                assert_eq!(
                    lines_of(4, &chunks),
                    Err(TOO_LONG),
                    "{body:?} in chunks of {size}"
                );
            }
        }
        assert_eq!(
            lines_of(4, &[b"1234\n", b"5678"]).unwrap(),
            ["1234", "5678"]
        );

        let mut framer = LineFramer::new(4);
        framer.push(Bytes::from_static(b"123"));
        assert_eq!(framer.next_line(), Ok(None));
        framer.push(Bytes::from_static(b"45"));
        assert_eq!(framer.next_line(), Err(TOO_LONG));
        framer.push(Bytes::from_static(b"\nfine\n"));
        assert_eq!(framer.next_line(), Err(TOO_LONG));
        assert_eq!(framer.max_line(), 4);
    }
}
