//! What the runner writes: one JSON frame per line on its standard output, anything else as
//! log lines.
//!
//! Everything the guest writes is hostile: flow code can write raw lines to the runner's frame
//! stream, so the runner's own care (a result of 200,000 values cut unless its vertex is an
//! output, a line of 1 MiB at most) is a courtesy. The host bounds what it parses itself ([`FrameLimits`]): a frame line longer than
//! its bound stops the run before more of it is buffered (the [`createos_api::LineFramer`]
//! refuses it), and every other frame is checked by [`census`], a pass over its bytes that
//! builds nothing, before any of it is materialised: its nesting depth and its count of JSON
//! values (an object tagged `__lfx__`, which the host rebuilds as an lfx object, counts
//! [`TAGGED_VALUE_WEIGHT`] more). A frame over a bound is [`Line::Refused`], naming the bound; the run's totals are
//! bounded by the caller ([`FrameLimits::run_bytes`], [`FrameLimits::run_values`],
//! [`FrameLimits::run_messages`]). An admitted vertex, message or terminal frame is handed on as
//! its raw bytes ([`Payload`]), not as a parsed tree.
//!
//! A frame longer than one line is sent in pieces, each a [`RunnerFrame::Chunk`] of its JSON
//! text, which the caller reassembles within the run's bound on bytes (`chunks`) and reads
//! with [`parse_line`] like any other frame.
//!
//! A malformed line is reported and skipped, a log line longer than [`MAX_LOG_LINE`] is cut,
//! and guest text that goes into a log record or an error message is escaped first with the
//! workspace's one escaping (`outside-text`: one line for a record, [`outside_text::block`] for
//! a multi-line message), so it can neither act on the operator's terminal nor start a line of
//! the host's log.

use std::borrow::Cow;
use std::fmt::{self, Write as _};

use bytes::Bytes;
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

/// The longest log line kept, in bytes; the rest of a longer line is dropped (and counted).
pub const MAX_LOG_LINE: usize = 4096;
/// The longest frame line accepted (16 MiB): the terminal frame carries the run's outputs.
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;
/// The deepest nesting of arrays and objects accepted in a frame (the frame object is level 1).
pub const MAX_FRAME_DEPTH: usize = 64;
/// The most JSON values accepted in one frame: every scalar, array and object counts one, and
/// an object with an `__lfx__` key counts [`TAGGED_VALUE_WEIGHT`] more. A `DataFrame` of 5,000
/// rows of 10 columns, carried three times by its vertex frame, is 165,000.
pub const MAX_FRAME_VALUES: u64 = 250_000;
/// What an object tagged `__lfx__` (a `Message`, `Data` or `DataFrame` the host rebuilds as an
/// lfx object, about 1 to 3.5 KB each in Python) counts on top of its own value.
pub const TAGGED_VALUE_WEIGHT: u64 = 32;
/// The most frame bytes accepted in one run by default, all frames together: each run takes its
/// bound from `CREATEOS_EXECUTOR_MAX_RESULT_BYTES`, whose default this is.
pub const MAX_RUN_BYTES: u64 = crate::settings::DEFAULT_MAX_RESULT_BYTES;
/// The most JSON values accepted in one run, all frames together (counted as for
/// [`MAX_FRAME_VALUES`]).
pub const MAX_RUN_VALUES: u64 = 1_000_000;
/// The most message frames accepted in one run: each one is a write to the host's message
/// store (a chat of a few turns stores a handful).
pub const MAX_RUN_MESSAGES: u64 = 1000;
/// The longest flow error message kept from an error frame, in bytes; the rest is cut.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024;
/// The longest short field kept from a frame (versions, the frame kind, an exception type).
const MAX_FIELD_BYTES: usize = 128;
/// The deepest nesting `serde_json` itself accepts; a deeper bound would never be reached.
const SERDE_DEPTH: usize = 120;

/// The host's bounds on what it parses from a guest. [`Default`] is the `MAX_*` constants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameLimits {
    /// [`MAX_FRAME_BYTES`]: the longest frame line.
    pub frame_bytes: usize,
    /// [`MAX_FRAME_DEPTH`]: the deepest nesting in a frame (at most 120).
    pub frame_depth: usize,
    /// [`MAX_FRAME_VALUES`]: the most JSON values in a frame.
    pub frame_values: u64,
    /// [`MAX_RUN_BYTES`]: the most frame bytes in a run (a run's executor sets it from
    /// `CREATEOS_EXECUTOR_MAX_RESULT_BYTES`).
    pub run_bytes: u64,
    /// [`MAX_RUN_VALUES`]: the most JSON values in a run.
    pub run_values: u64,
    /// [`MAX_RUN_MESSAGES`]: the most message frames in a run.
    pub run_messages: u64,
}

impl Default for FrameLimits {
    fn default() -> Self {
        Self {
            frame_bytes: MAX_FRAME_BYTES,
            frame_depth: MAX_FRAME_DEPTH,
            frame_values: MAX_FRAME_VALUES,
            run_bytes: MAX_RUN_BYTES,
            run_values: MAX_RUN_VALUES,
            run_messages: MAX_RUN_MESSAGES,
        }
    }
}

/// One of the host's bounds on what a guest sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// [`MAX_FRAME_BYTES`].
    FrameBytes,
    /// [`MAX_FRAME_DEPTH`].
    FrameDepth,
    /// [`MAX_FRAME_VALUES`].
    FrameValues,
    /// [`MAX_RUN_BYTES`], set by `CREATEOS_EXECUTOR_MAX_RESULT_BYTES`.
    RunBytes,
    /// [`MAX_RUN_VALUES`].
    RunValues,
    /// [`MAX_RUN_MESSAGES`].
    RunMessages,
}

impl Bound {
    /// The bound's name, as the constant (or, for [`Bound::RunBytes`], the setting) that sets
    /// it.
    pub fn name(self) -> &'static str {
        match self {
            Bound::FrameBytes => "MAX_FRAME_BYTES",
            Bound::FrameDepth => "MAX_FRAME_DEPTH",
            Bound::FrameValues => "MAX_FRAME_VALUES",
            Bound::RunBytes => crate::settings::ENV_MAX_RESULT_BYTES,
            Bound::RunValues => "MAX_RUN_VALUES",
            Bound::RunMessages => "MAX_RUN_MESSAGES",
        }
    }

    /// What the guest sent that passed the bound, with the bound's value in `limits`.
    pub fn describe(self, limits: &FrameLimits) -> String {
        match self {
            Bound::FrameBytes => format!("a frame line longer than {} bytes", limits.frame_bytes),
            Bound::FrameDepth => format!(
                "a frame nested deeper than {} levels",
                limits.frame_depth.min(SERDE_DEPTH)
            ),
            Bound::FrameValues => format!(
                "a frame of more than {} JSON values (an object tagged __lfx__ counts \
                 {TAGGED_VALUE_WEIGHT} more)",
                limits.frame_values
            ),
            Bound::RunBytes => format!(
                "frames of more than {} bytes in all in one run",
                limits.run_bytes
            ),
            Bound::RunValues => format!(
                "frames of more than {} JSON values in all in one run",
                limits.run_values
            ),
            Bound::RunMessages => format!(
                "more than {} message frames (chat messages to store) in one run",
                limits.run_messages
            ),
        }
    }
}

/// A frame's JSON as the guest sent it, after it passed the host's bounds: the whole vertex
/// frame, or the terminal frame's `outputs` list. Kept as bytes (valid UTF-8 JSON), so nothing
/// is materialised on the host until its consumer converts it.
#[derive(Clone, PartialEq, Eq)]
pub struct Payload {
    json: Bytes,
}

impl Payload {
    /// `json` as a payload, if it is JSON within `limits` ([`census`]).
    pub fn admit(json: impl Into<Bytes>, limits: &FrameLimits) -> Result<Self, Census> {
        let json = json.into();
        census(&json, limits)?;
        Ok(Self { json })
    }

    /// The JSON text's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.json
    }

    /// The JSON text's length in bytes.
    pub fn len(&self) -> usize {
        self.json.len()
    }

    /// True for an empty text (never the case for a payload of a frame).
    pub fn is_empty(&self) -> bool {
        self.json.is_empty()
    }

    /// The JSON as a `serde_json` tree (materialised at full size: its census bounds it).
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.json).unwrap_or(Value::Null)
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Payload({} bytes)", self.json.len())
    }
}

/// One frame of the runner's protocol.
#[derive(Debug, Clone, PartialEq)]
pub enum RunnerFrame {
    /// lfx is importable in the guest and the runner read its job.
    Hello {
        /// lfx's version in the guest (cut and escaped).
        lfx: String,
        /// Python's version in the guest (cut and escaped).
        python: String,
        /// How long the runner's import of lfx took, as the guest reports it (bounded by
        /// [`crate::timings::reported`]).
        preload_ms: Option<u64>,
        /// How long the runner then waited for the job, as the guest reports it.
        wait_ms: Option<u64>,
    },
    /// The flow was rebuilt in the guest; its vertices run next.
    Graph {
        /// How long the rebuild took, as the guest reports it.
        rebuild_ms: Option<u64>,
    },
    /// A vertex finished (the whole frame object).
    Vertex(Payload),
    /// A chat message the flow stored, updated or deleted (the whole frame object: `op`, the
    /// guest's message `id`, and the `message`), for the host's message store.
    Message(Payload),
    /// The run finished: the serialized `RunOutputs` (empty in stream mode).
    Complete(Payload),
    /// One piece of a frame too long for one line: the next `data` of its JSON text, which is
    /// `total` bytes long, in order from `index` 0.
    Chunk {
        /// The piece's place, from 0.
        index: u64,
        /// The length of the whole frame's JSON text, in bytes, as the guest claims it.
        total: u64,
        /// The piece of that text (at most a frame line's length).
        data: String,
    },
    /// The run could not finish.
    Error {
        /// `missing_lfx`, `flow` or `protocol` (cut and escaped).
        kind: String,
        /// The Python exception type, for `flow` (cut and escaped).
        error_type: Option<String>,
        /// What the runner said: cut to [`MAX_MESSAGE_BYTES`], *not* escaped yet (the caller
        /// redacts, then escapes with [`outside_text::block`]).
        message: String,
    },
}

/// How one line of the runner's standard output reads.
#[derive(Debug, Clone, PartialEq)]
pub enum Line {
    /// A frame, and its count of JSON values (as [`census`] counts them).
    Frame(RunnerFrame, u64),
    /// Not a frame: a log line (cut to [`MAX_LOG_LINE`], not escaped yet).
    Log(String),
    /// A line that looks like a frame but is not one; the reason (cut and escaped).
    Malformed(String),
    /// A frame over one of the host's bounds: the run must stop.
    Refused(Bound),
}

/// Why [`census`] did not admit a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Census {
    /// Over a bound.
    Refused(Bound),
    /// Not JSON (the parser's reason).
    Malformed(String),
}

/// Counts the JSON values of `json` and checks its nesting against `limits`, without
/// building anything (strings with escapes are unescaped one at a time into a scratch
/// buffer). Stops at the first bound passed. Returns the count (tagged objects weighted).
pub fn census(json: &[u8], limits: &FrameLimits) -> Result<u64, Census> {
    if json.len() > limits.frame_bytes {
        return Err(Census::Refused(Bound::FrameBytes));
    }
    let mut count = Counter {
        limits,
        values: 0,
        refused: None,
    };
    let mut de = serde_json::Deserializer::from_slice(json);
    let parsed = Node {
        counter: &mut count,
        depth: 1,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end());
    match (parsed, count.refused) {
        (_, Some(bound)) => Err(Census::Refused(bound)),
        (Err(e), None) => Err(Census::Malformed(e.to_string())),
        (Ok(()), None) => Ok(count.values),
    }
}

struct Counter<'l> {
    limits: &'l FrameLimits,
    values: u64,
    refused: Option<Bound>,
}

impl Counter<'_> {
    fn count<E: de::Error>(&mut self, n: u64) -> Result<(), E> {
        self.values = self.values.saturating_add(n);
        if self.values > self.limits.frame_values {
            return Err(self.refuse(Bound::FrameValues));
        }
        Ok(())
    }

    fn enter<E: de::Error>(&mut self, depth: usize) -> Result<(), E> {
        if depth > self.limits.frame_depth.min(SERDE_DEPTH) {
            return Err(self.refuse(Bound::FrameDepth));
        }
        self.count(1)
    }

    fn refuse<E: de::Error>(&mut self, bound: Bound) -> E {
        self.refused = Some(bound);
        E::custom(bound.name())
    }
}

/// One JSON value at `depth` (the frame object is at depth 1).
struct Node<'c, 'l> {
    counter: &'c mut Counter<'l>,
    depth: usize,
}

impl<'de> DeserializeSeed<'de> for Node<'_, '_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.counter.count(1)
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.counter.count(1)
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.counter.count(1)
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.counter.count(1)
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.counter.count(1)
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.counter.count(1)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.counter.enter(self.depth)?;
        while seq
            .next_element_seed(Node {
                counter: &mut *self.counter,
                depth: self.depth + 1,
            })?
            .is_some()
        {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        self.counter.enter(self.depth)?;
        while let Some(tagged) = map.next_key_seed(Key)? {
            if tagged {
                self.counter.count(TAGGED_VALUE_WEIGHT)?;
            }
            map.next_value_seed(Node {
                counter: &mut *self.counter,
                depth: self.depth + 1,
            })?;
        }
        Ok(())
    }
}

/// An object key: true for the `__lfx__` tag.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_str(self)
    }
}

impl Visitor<'_> for Key {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<bool, E> {
        Ok(key == "__lfx__")
    }
}

/// The top-level fields of a frame the host reads; the rest is skipped (nothing is built).
#[derive(Deserialize)]
struct Head<'a> {
    #[serde(borrow)]
    frame: Option<&'a RawValue>,
    #[serde(borrow)]
    id: Option<&'a RawValue>,
    #[serde(borrow)]
    outputs: Option<&'a RawValue>,
    #[serde(borrow)]
    kind: Option<&'a RawValue>,
    #[serde(borrow, rename = "type")]
    error_type: Option<&'a RawValue>,
    #[serde(borrow)]
    message: Option<&'a RawValue>,
    #[serde(borrow)]
    lfx: Option<&'a RawValue>,
    #[serde(borrow)]
    python: Option<&'a RawValue>,
    #[serde(borrow)]
    op: Option<&'a RawValue>,
    #[serde(borrow)]
    preload_ms: Option<&'a RawValue>,
    #[serde(borrow)]
    wait_ms: Option<&'a RawValue>,
    #[serde(borrow)]
    rebuild_ms: Option<&'a RawValue>,
    #[serde(borrow)]
    index: Option<&'a RawValue>,
    #[serde(borrow)]
    total: Option<&'a RawValue>,
    #[serde(borrow)]
    data: Option<&'a RawValue>,
}

/// What a message frame asks of the host's message store.
pub const MESSAGE_OPS: &[&str] = &["store", "update", "delete", "delete_session"];

fn is_text(raw: &RawValue) -> bool {
    raw.get().starts_with('"')
}

/// A string field's text, if it is a string.
fn text<'a>(raw: Option<&'a RawValue>) -> Option<Cow<'a, str>> {
    let raw = raw?;
    raw.get()
        .starts_with('"')
        .then(|| serde_json::from_str::<Cow<'a, str>>(raw.get()).ok())
        .flatten()
}

/// A duration field the guest reported, bounded ([`crate::timings::reported`]).
fn millis(raw: Option<&RawValue>) -> Option<u64> {
    let value: Value = serde_json::from_str(raw?.get()).ok()?;
    crate::timings::reported(&value)
}

/// A whole number field, if it is one.
fn count(raw: Option<&RawValue>) -> Option<u64> {
    serde_json::from_str(raw?.get()).ok()
}

/// A short field: cut to [`MAX_FIELD_BYTES`] and escaped.
fn field(raw: Option<&RawValue>) -> Option<String> {
    text(raw).map(|t| outside_text::line(&cut(&t, MAX_FIELD_BYTES)).into_owned())
}

/// Reads one line of the runner's standard output (`line` as the framer cut it), checking a
/// frame against `limits` before anything of it is built.
pub fn parse_line(line: &Bytes, limits: &FrameLimits) -> Line {
    let trimmed = line.slice_ref(line.trim_ascii());
    if trimmed.is_empty() {
        return Line::Log(String::new());
    }
    if trimmed[0] != b'{' {
        return Line::Log(log_text(&trimmed));
    }
    let values = match census(&trimmed, limits) {
        Ok(values) => values,
        Err(Census::Refused(bound)) => return Line::Refused(bound),
        Err(Census::Malformed(why)) => return malformed(&format!("not JSON ({why})")),
    };
    let head: Head<'_> = match serde_json::from_slice(&trimmed) {
        Ok(head) => head,
        Err(e) => return malformed(&format!("not a frame object ({e})")),
    };
    let Some(kind) = text(head.frame) else {
        return malformed("a JSON object without a `frame` key");
    };
    let frame = match kind.as_ref() {
        "hello" => RunnerFrame::Hello {
            lfx: field(head.lfx).unwrap_or_default(),
            python: field(head.python).unwrap_or_default(),
            preload_ms: millis(head.preload_ms),
            wait_ms: millis(head.wait_ms),
        },
        "graph" => RunnerFrame::Graph {
            rebuild_ms: millis(head.rebuild_ms),
        },
        "vertex" if head.id.is_some_and(is_text) => RunnerFrame::Vertex(Payload {
            json: trimmed.clone(),
        }),
        "vertex" => return malformed("a vertex frame without an id"),
        "message" => match text(head.op).as_deref() {
            Some(op) if MESSAGE_OPS.contains(&op) && head.id.is_some_and(is_text) => {
                RunnerFrame::Message(Payload {
                    json: trimmed.clone(),
                })
            }
            _ => return malformed("a message frame without a known op and a message id"),
        },
        "complete" => match head.outputs {
            Some(outputs) if outputs.get().starts_with('[') => RunnerFrame::Complete(Payload {
                json: trimmed.slice_ref(outputs.get().as_bytes()),
            }),
            _ => return malformed("a complete frame without an outputs list"),
        },
        "chunk" => match (count(head.index), count(head.total), text(head.data)) {
            (Some(index), Some(total), Some(data)) => RunnerFrame::Chunk {
                index,
                total,
                data: data.into_owned(),
            },
            _ => return malformed("a chunk frame without an index, a total and its data"),
        },
        "error" => RunnerFrame::Error {
            kind: field(head.kind).unwrap_or_else(|| "flow".to_owned()),
            error_type: field(head.error_type),
            message: text(head.message)
                .map(|m| cut(&m, MAX_MESSAGE_BYTES).into_owned())
                .unwrap_or_default(),
        },
        other => {
            return malformed(&format!(
                "an unknown frame kind {:?}",
                cut(other, MAX_FIELD_BYTES)
            ));
        }
    };
    Line::Frame(frame, values)
}

fn malformed(why: &str) -> Line {
    Line::Malformed(outside_text::line(&cut(why, 2 * MAX_FIELD_BYTES)).into_owned())
}

/// A line that is not a frame, as a log line: at most [`MAX_LOG_LINE`] bytes of it.
fn log_text(line: &[u8]) -> String {
    let keep = line.len().min(MAX_LOG_LINE);
    let mut text = String::from_utf8_lossy(&line[..keep]).into_owned();
    if keep < line.len() {
        let _ = write!(text, " [... {} bytes cut]", line.len() - keep);
    }
    text
}

/// `text` cut to at most `max_bytes` bytes (at a character boundary), with a marker saying how
/// much was cut ([`outside_text::cap`]).
pub fn cut(text: &str, max_bytes: usize) -> Cow<'_, str> {
    outside_text::cap(text, max_bytes)
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

    fn parse(line: &[u8]) -> Line {
        parse_line(&Bytes::copy_from_slice(line), &FrameLimits::default())
    }

    #[test]
    fn frames_logs_and_malformed_lines() {
        assert_eq!(
            parse(br#"{"frame":"hello","lfx":"1.13.0","python":"3.11"}"#),
            Line::Frame(
                RunnerFrame::Hello {
                    lfx: "1.13.0".into(),
                    python: "3.11".into(),
                    preload_ms: None,
                    wait_ms: None,
                },
                4
            )
        );
        assert_eq!(
            parse(br#"{"frame":"hello","lfx":"1","python":"3","preload_ms":2400,"wait_ms":-3}"#),
            Line::Frame(
                RunnerFrame::Hello {
                    lfx: "1".into(),
                    python: "3".into(),
                    preload_ms: Some(2400),
                    wait_ms: None,
                },
                6
            )
        );
        assert_eq!(
            parse(br#"{"frame":"graph","rebuild_ms":"soon"}"#),
            Line::Frame(RunnerFrame::Graph { rebuild_ms: None }, 3)
        );
        assert_eq!(
            parse(br#"{"frame":"graph","rebuild_ms":160.4}"#),
            Line::Frame(
                RunnerFrame::Graph {
                    rebuild_ms: Some(160)
                },
                3
            )
        );
        let Line::Frame(RunnerFrame::Vertex(v), 4) =
            parse(br#" {"frame":"vertex","id":"a","seq":1} "#)
        else {
            panic!()
        };
        assert_eq!(v.as_bytes(), br#"{"frame":"vertex","id":"a","seq":1}"#);
        let Line::Frame(RunnerFrame::Complete(c), _) =
            parse(br#"{"frame":"complete","outputs":[1, {"a":[]}]}"#)
        else {
            panic!()
        };
        assert_eq!(c.as_bytes(), br#"[1, {"a":[]}]"#);
        assert_eq!(c.value(), serde_json::json!([1, {"a": []}]));
        assert_eq!(parse(b"hello world"), Line::Log("hello world".into()));
        for bad in [
            &br#"{"frame":"vertex"}"#[..],
            br#"{"frame":"vertex","id":7}"#,
            br#"{"frame":"complete"}"#,
            br#"{"frame":"complete","outputs":{}}"#,
            br#"{"frame":"wat"}"#,
            br#"{"no":"frame"}"#,
            br#"{"frame":"vertex","id":"#,
            br#"{"frame":"vertex","id":"a"} trailing"#,
            br#"{"frame":"vertex","frame":"vertex","id":"a"}"#,
        ] {
            assert!(matches!(parse(bad), Line::Malformed(_)), "{bad:?}");
        }
    }

    #[test]
    fn chunk_frames_carry_a_piece_of_a_frame_text() {
        let Line::Frame(frame, 5) =
            parse(br#"{"frame":"chunk","index":2,"total":30,"data":"{\"frame\":\"v"}"#)
        else {
            panic!()
        };
        assert_eq!(
            frame,
            RunnerFrame::Chunk {
                index: 2,
                total: 30,
                data: r#"{"frame":"v"#.to_owned()
            }
        );
        for bad in [
            &br#"{"frame":"chunk","total":3,"data":"abc"}"#[..],
            br#"{"frame":"chunk","index":0,"data":"abc"}"#,
            br#"{"frame":"chunk","index":0,"total":3}"#,
            br#"{"frame":"chunk","index":-1,"total":3,"data":"abc"}"#,
            br#"{"frame":"chunk","index":0,"total":3.5,"data":"abc"}"#,
            br#"{"frame":"chunk","index":0,"total":"3","data":"abc"}"#,
            br#"{"frame":"chunk","index":0,"total":3,"data":["abc"]}"#,
        ] {
            assert!(matches!(parse(bad), Line::Malformed(_)), "{bad:?}");
        }
    }

    #[test]
    fn message_frames_need_a_known_op_and_an_id() {
        for op in MESSAGE_OPS {
            let line = format!(r#"{{"frame":"message","op":"{op}","id":"g-1","message":{{}}}}"#);
            let Line::Frame(RunnerFrame::Message(m), _) = parse(line.as_bytes()) else {
                panic!("{line}")
            };
            assert_eq!(m.as_bytes(), line.as_bytes());
        }
        for bad in [
            &br#"{"frame":"message","id":"g-1"}"#[..],
            br#"{"frame":"message","op":"drop_table","id":"g-1"}"#,
            br#"{"frame":"message","op":"store"}"#,
            br#"{"frame":"message","op":"store","id":1}"#,
            br#"{"frame":"message","op":1,"id":"g"}"#,
        ] {
            assert!(matches!(parse(bad), Line::Malformed(_)), "{bad:?}");
        }
    }

    #[test]
    fn the_census_counts_values_and_weighs_tags() {
        let limits = FrameLimits::default();
        assert_eq!(census(br#"{"a":[1,"x",null,true,{}]}"#, &limits), Ok(7));
        assert_eq!(
            census(br#"{"__lfx__":"Message","v":{}}"#, &limits),
            Ok(3 + TAGGED_VALUE_WEIGHT)
        );
        // Escaped keys are unescaped before they are compared.
        assert_eq!(
            census(br#"{"\u005f_lfx__":"Data"}"#, &limits),
            Ok(2 + TAGGED_VALUE_WEIGHT)
        );
        assert!(matches!(
            census(b"{\"a\":NaN}", &limits),
            Err(Census::Malformed(_))
        ));
    }

    #[test]
    fn frames_over_a_bound_are_refused_naming_it() {
        let limits = FrameLimits {
            frame_bytes: 4096,
            frame_depth: 8,
            frame_values: 100,
            ..FrameLimits::default()
        };
        let deep = format!(
            r#"{{"frame":"vertex","id":"a","r":{}{}}}"#,
            "[".repeat(7),
            "]".repeat(7)
        );
        assert!(matches!(
            parse_line(&Bytes::from(deep.clone()), &limits),
            Line::Frame(RunnerFrame::Vertex(_), 10)
        ));
        let deeper = deep.replacen('[', "[[", 1).replacen(']', "]]", 1);
        assert_eq!(
            parse_line(&Bytes::from(deeper), &limits),
            Line::Refused(Bound::FrameDepth)
        );
        // Far past serde_json's own recursion limit: still the named bound.
        let abyss = format!(r#"{{"r":{}"#, "[".repeat(3000));
        assert_eq!(
            census(abyss.as_bytes(), &limits),
            Err(Census::Refused(Bound::FrameDepth))
        );
        let many = format!(
            r#"{{"frame":"vertex","id":"a","r":[{}]}}"#,
            ["{}"; 96].join(",")
        );
        assert!(matches!(
            parse_line(&Bytes::from(many.clone()), &limits),
            Line::Frame(_, 100)
        ));
        let more = many.replacen("{}", "{},{}", 1);
        assert_eq!(
            parse_line(&Bytes::from(more), &limits),
            Line::Refused(Bound::FrameValues)
        );
        let tags = format!(
            r#"{{"frame":"vertex","id":"a","r":[{}]}}"#,
            [r#"{"__lfx__":1}"#; 3].join(",")
        );
        assert_eq!(
            parse_line(&Bytes::from(tags), &limits),
            Line::Refused(Bound::FrameValues)
        );
        let long = format!(r#"{{"frame":"vertex","id":"{}"}}"#, "x".repeat(4096));
        assert_eq!(
            parse_line(&Bytes::from(long), &limits),
            Line::Refused(Bound::FrameBytes)
        );
    }

    #[test]
    fn guest_text_in_frames_is_cut_and_escaped() {
        let Line::Frame(RunnerFrame::Hello { lfx, .. }, _) =
            parse(b"{\"frame\":\"hello\",\"lfx\":\"1\\u001b[2J\\u0007\"}")
        else {
            panic!()
        };
        assert_eq!(lfx, "1\\x1b[2J\\x07");
        let Line::Malformed(why) = parse(b"{\"frame\":\"\\u001b]0;pwned\\u0007\"}") else {
            panic!()
        };
        assert!(!why.contains('\u{1b}') && why.contains("\\u{1b}"), "{why}");
        let long = format!(
            r#"{{"frame":"error","message":"{}"}}"#,
            "m".repeat(MAX_MESSAGE_BYTES + 5)
        );
        let Line::Frame(RunnerFrame::Error { message, kind, .. }, _) = parse(long.as_bytes())
        else {
            panic!()
        };
        assert_eq!(kind, "flow");
        assert!(
            message.ends_with("[... 5 bytes cut]"),
            "{}",
            &message[message.len() - 40..]
        );
        let Line::Log(line) = parse(&vec![b'x'; MAX_LOG_LINE + 10]) else {
            panic!()
        };
        assert!(line.ends_with("[... 10 bytes cut]"));
    }

    #[test]
    fn a_cut_says_how_much_it_cut() {
        assert_eq!(cut("héllo", 2), "h [... 5 bytes cut]");
        assert_eq!(cut("hello", 5), "hello");
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
