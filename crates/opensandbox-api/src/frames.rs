//! The frame decoder of execd's command streams, without I/O.
//!
//! execd writes each event as a bare JSON object followed by a blank line
//! (`{"type":"stdout",...}\n\n`), which is not server-sent events; a standard SSE writer (a
//! proxy, a later execd) would write `data: {...}\n\n` instead, possibly over several `data:`
//! lines, with `:` comments and `event:`/`id:`/`retry:` fields. [`FrameDecoder`] reads both,
//! even mixed in one stream, with any line ending (`\n`, `\r\n`, `\r`), from chunks cut
//! anywhere, and holds a bounded amount of memory whatever the input.

use bytes::BytesMut;
use serde_json::{Map, Value};

/// Default of [`FrameLimits::max_line`] and [`FrameLimits::max_frame`] (4 MiB).
pub const DEFAULT_MAX_FRAME: usize = 4 * 1024 * 1024;

/// The bounds of a [`FrameDecoder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    /// The longest line (terminator excluded), in bytes, comments and fields included. A
    /// longer one is refused as soon as its buffered start passes the limit.
    pub max_line: usize,
    /// The largest frame: the JSON of one event, summed over its `data:` lines.
    pub max_frame: usize,
}

impl Default for FrameLimits {
    fn default() -> Self {
        FrameLimits {
            max_line: DEFAULT_MAX_FRAME,
            max_frame: DEFAULT_MAX_FRAME,
        }
    }
}

/// Why a stream could not be decoded. After one, the decoder stops: every later call returns
/// the same error and input is dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FrameError {
    /// A line passed [`FrameLimits::max_line`].
    LineTooLong {
        /// The limit.
        limit: usize,
    },
    /// A frame passed [`FrameLimits::max_frame`].
    FrameTooLarge {
        /// The limit.
        limit: usize,
    },
    /// A frame is not JSON, or the stream ended inside one.
    NotJson {
        /// The JSON parser's message.
        reason: String,
        /// The start of the frame (up to 256 bytes, lossy UTF-8, unescaped: scrub and
        /// escape it before showing it).
        start: String,
    },
    /// A frame is JSON but not an object.
    NotObject,
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::LineTooLong { limit } => write!(f, "a stream line passed {limit} bytes"),
            FrameError::FrameTooLarge { limit } => write!(f, "a stream frame passed {limit} bytes"),
            FrameError::NotJson { reason, .. } => write!(f, "a stream frame is not JSON: {reason}"),
            FrameError::NotObject => f.write_str("a stream frame is not a JSON object"),
        }
    }
}

impl std::error::Error for FrameError {}

/// Splits a byte stream into JSON-object frames. [`push`](Self::push) each chunk, take frames
/// with [`next_frame`](Self::next_frame) until it returns `Ok(None)`, then push the next
/// chunk; call [`finish`](Self::finish) at the end of input so a last frame without its blank
/// line is returned too.
///
/// Memory: at most one line (bounded by `max_line`) plus the chunk being cut, and one frame
/// (bounded by `max_frame`).
///
/// ```
/// use opensandbox_api::{FrameDecoder, FrameLimits};
///
/// let mut d = FrameDecoder::new(FrameLimits::default());
/// let mut types = Vec::new();
/// for chunk in ["{\"type\":\"init\",\"text\":\"c1\"}\n", "\ndata: {\"type\":", "\"ping\"}\r\n\r\n"] {
///     d.push(chunk.as_bytes());
///     while let Some(frame) = d.next_frame()? {
///         types.push(frame["type"].as_str().unwrap().to_owned());
///     }
/// }
/// assert_eq!(types, ["init", "ping"]);
/// # Ok::<(), opensandbox_api::FrameError>(())
/// ```
#[derive(Debug)]
pub struct FrameDecoder {
    limits: FrameLimits,
    /// Input not yet cut into lines.
    input: BytesMut,
    /// How far `input` is known to hold no line end.
    scanned: usize,
    /// The last line ended with `\r`: a `\n` first in the next input belongs to it.
    after_cr: bool,
    /// `data:` lines of the current SSE event, joined by `\n`; `None` before the first.
    data: Option<Vec<u8>>,
    /// Lines of the current bare-JSON frame.
    bare: Vec<u8>,
    finished: bool,
    failed: Option<FrameError>,
}

/// What one line does to the frame being built.
enum Step {
    Nothing,
    /// A frame's text, to parse.
    Frame(Vec<u8>),
    /// A bare-JSON frame, parsed already (to find where it ends).
    Parsed(Value),
}

impl FrameDecoder {
    /// A decoder with these limits.
    pub fn new(limits: FrameLimits) -> Self {
        FrameDecoder {
            limits,
            input: BytesMut::new(),
            scanned: 0,
            after_cr: false,
            data: None,
            bare: Vec::new(),
            finished: false,
            failed: None,
        }
    }

    /// Adds input. Ignored after [`finish`](Self::finish) or an error.
    pub fn push(&mut self, chunk: &[u8]) {
        if self.failed.is_none() && !self.finished {
            self.input.extend_from_slice(chunk);
        }
    }

    /// Marks the end of input.
    pub fn finish(&mut self) {
        self.finished = true;
    }

    fn fail(&mut self, e: FrameError) -> FrameError {
        self.input = BytesMut::new();
        self.data = None;
        self.bare = Vec::new();
        self.failed = Some(e.clone());
        e
    }

    /// The next complete frame; `Ok(None)` when more input is needed (or, after
    /// [`finish`](Self::finish), when nothing is left).
    pub fn next_frame(&mut self) -> Result<Option<Map<String, Value>>, FrameError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        loop {
            let Some(line) = self.next_line()? else {
                if self.finished {
                    // The end of input ends the frame being built, as a blank line would.
                    return match self.blank_line() {
                        Step::Frame(raw) => self.parse(&raw).map(Some),
                        Step::Parsed(value) => self.object(value).map(Some),
                        Step::Nothing => Ok(None),
                    };
                }
                return Ok(None);
            };
            match self.line(&line) {
                Ok(Step::Nothing) => {}
                Ok(Step::Frame(raw)) => return self.parse(&raw).map(Some),
                Ok(Step::Parsed(value)) => return self.object(value).map(Some),
                Err(e) => return Err(self.fail(e)),
            }
        }
    }

    /// Cuts the next line off the input (terminator dropped); after `finish`, what is left
    /// without a terminator is the last line.
    fn next_line(&mut self) -> Result<Option<BytesMut>, FrameError> {
        if self.after_cr && !self.input.is_empty() {
            if self.input[0] == b'\n' {
                let _ = self.input.split_to(1);
            }
            self.after_cr = false;
        }
        let found = self.input[self.scanned..]
            .iter()
            .position(|b| matches!(b, b'\n' | b'\r'));
        let too_long = FrameError::LineTooLong {
            limit: self.limits.max_line,
        };
        if let Some(offset) = found {
            let end = self.scanned + offset;
            self.after_cr = self.input[end] == b'\r';
            let mut line = self.input.split_to(end + 1);
            line.truncate(end);
            self.scanned = 0;
            if line.len() > self.limits.max_line {
                return Err(self.fail(too_long));
            }
            return Ok(Some(line));
        }
        self.scanned = self.input.len();
        if self.input.len() > self.limits.max_line {
            return Err(self.fail(too_long));
        }
        if self.finished && !self.input.is_empty() {
            self.scanned = 0;
            return Ok(Some(self.input.split()));
        }
        Ok(None)
    }

    /// A blank line (or the end of input): the frame being built, if any, is complete.
    fn blank_line(&mut self) -> Step {
        if let Some(data) = self.data.take() {
            self.bare.clear();
            return Step::Frame(data);
        }
        if self.bare.is_empty() {
            Step::Nothing
        } else {
            Step::Frame(std::mem::take(&mut self.bare))
        }
    }

    fn line(&mut self, line: &[u8]) -> Result<Step, FrameError> {
        if line.is_empty() {
            return Ok(self.blank_line());
        }
        if self.bare.is_empty() {
            if line[0] == b':' {
                return Ok(Step::Nothing); // an SSE comment (a keep-alive)
            }
            if let Some((name, value)) = sse_field(line) {
                if name == b"data" {
                    let data = self.data.get_or_insert_with(Vec::new);
                    let joined = data.len() + usize::from(!data.is_empty()) + value.len();
                    if joined > self.limits.max_frame {
                        return Err(FrameError::FrameTooLarge {
                            limit: self.limits.max_frame,
                        });
                    }
                    if !data.is_empty() {
                        data.push(b'\n');
                    }
                    data.extend_from_slice(value);
                }
                return Ok(Step::Nothing); // event:, id:, retry: and unknown fields
            }
        }
        // A line of a bare-JSON frame.
        if self.bare.len() + 1 + line.len() > self.limits.max_frame {
            return Err(FrameError::FrameTooLarge {
                limit: self.limits.max_frame,
            });
        }
        if !self.bare.is_empty() {
            self.bare.push(b'\n');
        }
        self.bare.extend_from_slice(line);
        // A complete value ends the frame at once, so frames separated by a single newline
        // (NDJSON) are read too; an incomplete one waits for more lines (or the blank line
        // that makes it an error).
        match serde_json::from_slice::<Value>(&self.bare) {
            Ok(value) => {
                self.bare.clear();
                Ok(Step::Parsed(value))
            }
            Err(_) => Ok(Step::Nothing),
        }
    }

    /// The frame `value` holds, which must be an object.
    fn object(&mut self, value: Value) -> Result<Map<String, Value>, FrameError> {
        match value {
            Value::Object(map) => Ok(map),
            _ => Err(self.fail(FrameError::NotObject)),
        }
    }

    fn parse(&mut self, raw: &[u8]) -> Result<Map<String, Value>, FrameError> {
        match serde_json::from_slice::<Value>(raw) {
            Ok(value) => self.object(value),
            Err(e) => {
                let start = String::from_utf8_lossy(&raw[..raw.len().min(256)]).into_owned();
                Err(self.fail(FrameError::NotJson {
                    reason: e.to_string(),
                    start,
                }))
            }
        }
    }
}

/// `name: value` (one space after the colon dropped) when `line` is an SSE field: a name of
/// ASCII letters, then a colon or nothing.
fn sse_field(line: &[u8]) -> Option<(&[u8], &[u8])> {
    let name_len = line.iter().take_while(|b| b.is_ascii_alphabetic()).count();
    if name_len == 0 {
        return None;
    }
    let (name, rest) = line.split_at(name_len);
    match rest.split_first() {
        None => Some((name, &[])),
        Some((b':', value)) => Some((name, value.strip_prefix(b" ").unwrap_or(value))),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(limits: FrameLimits, chunks: &[&[u8]]) -> Result<Vec<Value>, FrameError> {
        let mut d = FrameDecoder::new(limits);
        let mut out = Vec::new();
        for chunk in chunks {
            d.push(chunk);
            while let Some(frame) = d.next_frame()? {
                out.push(Value::Object(frame));
            }
        }
        d.finish();
        while let Some(frame) = d.next_frame()? {
            out.push(Value::Object(frame));
        }
        Ok(out)
    }

    fn types(frames: &[Value]) -> Vec<&str> {
        frames
            .iter()
            .map(|f| f["type"].as_str().unwrap_or("?"))
            .collect()
    }

    /// Every way of cutting `body` into chunks of one size, one byte at a time included.
    fn every_chunking(body: &[u8]) -> impl Iterator<Item = Vec<&[u8]>> {
        (1..=body.len()).map(move |size| body.chunks(size).collect())
    }

    const BARE: &[u8] = b"{\"type\":\"init\",\"text\":\"cmd-1\",\"timestamp\":1}\n\n\
{\"type\":\"ping\",\"timestamp\":2}\n\n\
{\"type\":\"stdout\",\"text\":\"a\\nb\",\"timestamp\":3}\n\n\
{\"type\":\"error\",\"error\":{\"ename\":\"CommandExecError\",\"evalue\":\"3\",\"traceback\":[]}}\n\n\
{\"type\":\"execution_complete\",\"execution_time\":12}\n\n";

    #[test]
    fn bare_json_frames_at_every_chunking() {
        for chunks in every_chunking(BARE) {
            let frames = decode(FrameLimits::default(), &chunks).unwrap();
            assert_eq!(
                types(&frames),
                ["init", "ping", "stdout", "error", "execution_complete"],
                "{} chunks",
                chunks.len()
            );
            assert_eq!(frames[2]["text"], "a\nb");
        }
    }

    #[test]
    fn standard_sse_with_comments_fields_crlf_and_multiline_data() {
        let body: &[u8] = b": keep-alive\r\n\
event: message\r\nid: 7\r\nretry: 1000\r\ndata: {\"type\":\"stdout\",\r\ndata:\"text\":\"x\"}\r\n\r\n\
data:{\"type\":\"ping\"}\r\r\
data: {\"type\":\"stderr\",\"text\":\"e\"}\n\n";
        for chunks in every_chunking(body) {
            let frames = decode(FrameLimits::default(), &chunks).unwrap();
            assert_eq!(types(&frames), ["stdout", "ping", "stderr"]);
            assert_eq!(frames[0]["text"], "x");
        }
    }

    #[test]
    fn framings_mixed_and_single_newline_frames() {
        let body: &[u8] = b"{\"type\":\"init\"}\n{\"type\":\"ping\"}\ndata: {\"type\":\"stdout\"}\n\n{\n  \"type\": \"pretty\"\n}\n\n";
        for chunks in every_chunking(body) {
            let frames = decode(FrameLimits::default(), &chunks).unwrap();
            assert_eq!(types(&frames), ["init", "ping", "stdout", "pretty"]);
        }
    }

    #[test]
    fn a_last_frame_without_its_blank_line_counts() {
        let frames = decode(
            FrameLimits::default(),
            &[b"{\"type\":\"init\"}\n\n{\"type\":\"execution_complete\"}"],
        )
        .unwrap();
        assert_eq!(types(&frames), ["init", "execution_complete"]);
        let frames = decode(FrameLimits::default(), &[b"data: {\"type\":\"ping\"}"]).unwrap();
        assert_eq!(types(&frames), ["ping"]);
    }

    #[test]
    fn a_stream_cut_inside_a_frame_is_an_error() {
        let err = decode(FrameLimits::default(), &[b"{\"type\":\"stdout\",\"te"]).unwrap_err();
        assert!(matches!(err, FrameError::NotJson { .. }), "{err:?}");
        let err = decode(FrameLimits::default(), &[b"data: [1,2]\n\n"]).unwrap_err();
        assert_eq!(err, FrameError::NotObject);
    }

    #[test]
    fn oversize_frames_and_lines_fail_without_waiting_for_their_end() {
        let limits = FrameLimits {
            max_line: 64,
            max_frame: 100,
        };
        // One long line, never terminated: refused once 64 bytes are buffered.
        let mut d = FrameDecoder::new(limits);
        d.push(&[b'{'; 65]);
        assert_eq!(d.next_frame(), Err(FrameError::LineTooLong { limit: 64 }));
        d.push(b"\n\n{\"type\":\"ping\"}\n\n");
        assert_eq!(d.next_frame(), Err(FrameError::LineTooLong { limit: 64 }));
        // A comment longer than a line is refused too.
        let err = decode(limits, &[&[b':'; 80], b"\n"]).unwrap_err();
        assert_eq!(err, FrameError::LineTooLong { limit: 64 });
        // Many short data lines summing past the frame limit.
        let line = b"data: 0123456789012345678901234567890123456789\n";
        let err = decode(limits, &[line, line, line]).unwrap_err();
        assert_eq!(err, FrameError::FrameTooLarge { limit: 100 });
        // A bare frame over several lines, the same.
        let err = decode(
            limits,
            &[b"{\"a\":\n", &[b' '; 60], b"\n", &[b' '; 60], b"\n"],
        )
        .unwrap_err();
        assert_eq!(err, FrameError::FrameTooLarge { limit: 100 });
        // At the limit exactly: fine.
        let exact = format!("{{\"type\":\"{}\"}}\n\n", "x".repeat(64 - 11));
        assert_eq!(exact.len(), 66);
        assert_eq!(decode(limits, &[exact.as_bytes()]).unwrap().len(), 1);
    }
}
