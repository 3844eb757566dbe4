//! Bounded output capture. Each stream keeps only its last `cap` bytes *while it streams*, so a
//! guest printing gigabytes costs the host about `cap` bytes per stream.
//!
//! The window is held in blocks. The first few KiB of a stream sit on the heap; past that,
//! every block is an anonymous memory mapping of its own (64 KiB for the default 1 MiB cap),
//! so the window never fragments the allocator's heap and its pages go back to the OS the
//! moment a block is dropped. A block that falls off the front of the window is reused for new
//! output, so a stream of any length maps at most `cap / block + 2` blocks.
//!
//! The kept text comes out as a [`Text`]: a sequence of pieces, each one block (or a short
//! owned string such as the truncation marker). A consumer that builds one string from it
//! piece by piece, dropping each piece as it goes (the Python bindings do), holds the
//! window's memory once, not twice.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::fmt;

use memmap2::MmapMut;

/// Streams whose cap is at most this many bytes stay on the heap, and so do the first this
/// many bytes of any stream.
const SMALL_OUTPUT: usize = 16 * 1024;
/// Block size bounds: a window is cut into about 16 blocks, each a whole number of pages.
const MIN_BLOCK: usize = 4 * 1024;
const MAX_BLOCK: usize = 64 * 1024;

/// The marker put in front of a truncated stream.
///
/// ASCII on purpose: CPython stores a `str` at the width of its widest character, so a single
/// `…` in the marker would make Python hold the whole kept stream at two bytes per character.
pub fn truncation_marker(dropped: u64) -> String {
    format!("[... {dropped} bytes truncated ...]\n")
}

/// Where a block's bytes live.
enum Mem {
    Heap(Vec<u8>),
    Mapped(MmapMut),
}

/// A run of consecutive output bytes: `len` bytes filled out of `size`.
struct Block {
    mem: Mem,
    len: usize,
    size: usize,
}

impl Block {
    fn heap(size: usize) -> Self {
        Self {
            mem: Mem::Heap(Vec::new()),
            len: 0,
            size,
        }
    }

    /// A block in a mapping of its own, or on the heap if the OS refuses the mapping.
    fn mapped(size: usize) -> Self {
        match MmapMut::map_anon(size) {
            Ok(map) => Self {
                mem: Mem::Mapped(map),
                len: 0,
                size,
            },
            Err(_) => Self {
                mem: Mem::Heap(Vec::with_capacity(size)),
                len: 0,
                size,
            },
        }
    }

    fn filled(&self) -> &[u8] {
        match &self.mem {
            Mem::Heap(v) => v,
            Mem::Mapped(m) => &m[..self.len],
        }
    }

    fn room(&self) -> usize {
        self.size - self.len
    }

    /// Copies as much of `data` as fits; returns how much that was.
    fn append(&mut self, data: &[u8]) -> usize {
        let n = data.len().min(self.room());
        match &mut self.mem {
            Mem::Heap(v) => v.extend_from_slice(&data[..n]),
            Mem::Mapped(m) => m[self.len..self.len + n].copy_from_slice(&data[..n]),
        }
        self.len += n;
        n
    }

    fn clear(&mut self) {
        if let Mem::Heap(v) = &mut self.mem {
            v.clear();
        }
        self.len = 0;
    }
}

impl Clone for Block {
    /// A copy on the heap (clones are for callers that keep a report, not for the hot path).
    fn clone(&self) -> Self {
        Self {
            mem: Mem::Heap(self.filled().to_vec()),
            len: self.len,
            size: self.len,
        }
    }
}

/// Keeps the tail of a byte stream in at most `cap` bytes.
pub struct TailBuffer {
    cap: usize,
    block: usize,
    blocks: VecDeque<Block>,
    /// Bytes at the start of `blocks[0]` that are no longer part of the window.
    head: usize,
    held: usize,
    total: u64,
    /// The last block to fall off the front, kept for reuse.
    spare: Option<Block>,
}

impl fmt::Debug for TailBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TailBuffer")
            .field("cap", &self.cap)
            .field("held", &self.held)
            .field("total", &self.total)
            .field("blocks", &self.blocks.len())
            .finish_non_exhaustive()
    }
}

/// What a [`TailBuffer`] kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    /// The kept text, prefixed with a marker such as `[... 1234 bytes truncated ...]` when bytes
    /// were dropped.
    pub text: Text,
    /// True when anything was dropped.
    pub truncated: bool,
    /// Bytes the stream produced in total.
    pub total_bytes: u64,
    /// Bytes dropped from the front (including any partial character or line at the cut).
    pub dropped_bytes: u64,
}

impl TailBuffer {
    /// A buffer that keeps at most `cap` bytes (at least 1).
    pub fn new(cap: usize) -> Self {
        let cap = cap.max(1);
        Self {
            cap,
            block: (cap / 16)
                .next_multiple_of(MIN_BLOCK)
                .clamp(MIN_BLOCK, MAX_BLOCK),
            blocks: VecDeque::new(),
            head: 0,
            held: 0,
            total: 0,
            spare: None,
        }
    }

    /// The cap in bytes.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Bytes seen so far.
    pub fn total_bytes(&self) -> u64 {
        self.total
    }

    /// Bytes currently held (never more than the cap).
    pub fn held_bytes(&self) -> usize {
        self.held
    }

    /// Bytes of memory the buffer has set aside for the window, spare block included. Stays
    /// within `cap` plus two blocks however much was pushed.
    pub fn reserved_bytes(&self) -> usize {
        self.blocks.iter().chain(&self.spare).map(|b| b.size).sum()
    }

    /// Appends a chunk, dropping from the front whatever exceeds the cap.
    pub fn push(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        let mut data = data;
        if data.len() >= self.cap {
            while let Some(b) = self.blocks.pop_front() {
                self.recycle(b);
            }
            self.head = 0;
            self.held = 0;
            data = &data[data.len() - self.cap..];
        }
        while !data.is_empty() {
            if self.blocks.back().is_none_or(|b| b.room() == 0) {
                let b = self.new_block();
                self.blocks.push_back(b);
            }
            if let Some(back) = self.blocks.back_mut() {
                let n = back.append(data);
                data = &data[n..];
                self.held += n;
            }
            // Trim block by block, so the block that falls off is there to be reused.
            self.drop_front(self.held.saturating_sub(self.cap));
        }
    }

    fn new_block(&mut self) -> Block {
        if let Some(mut b) = self.spare.take() {
            b.clear();
            return b;
        }
        if self.cap <= SMALL_OUTPUT {
            Block::heap(self.block)
        } else if self.total <= SMALL_OUTPUT as u64 {
            Block::heap(SMALL_OUTPUT.min(self.block))
        } else {
            Block::mapped(self.block)
        }
    }

    /// Keeps the larger of a freed block and the current spare; the other is released.
    fn recycle(&mut self, block: Block) {
        if self.spare.as_ref().is_none_or(|s| s.size < block.size) {
            self.spare = Some(block);
        }
    }

    /// Removes `n` bytes (at most those held) from the front of the window.
    fn drop_front(&mut self, mut n: usize) {
        n = n.min(self.held);
        while n > 0 {
            let Some(front) = self.blocks.front() else {
                break;
            };
            let avail = front.len - self.head;
            if n < avail {
                self.head += n;
                self.held -= n;
                break;
            }
            n -= avail;
            self.held -= avail;
            self.head = 0;
            if let Some(b) = self.blocks.pop_front() {
                self.recycle(b);
            }
        }
    }

    /// The window's bytes, in order, one slice per block.
    fn slices(&self) -> impl Iterator<Item = &[u8]> {
        self.blocks
            .iter()
            .enumerate()
            .map(|(i, b)| &b.filled()[if i == 0 { self.head } else { 0 }..])
    }

    /// Position (from the window's start) of the first `byte` in `from..to`.
    fn find(&self, byte: u8, from: usize, to: usize) -> Option<usize> {
        let mut offset = 0;
        for s in self.slices() {
            if offset >= to {
                break;
            }
            let lo = from.saturating_sub(offset).min(s.len());
            let hi = (to - offset).min(s.len());
            if lo >= hi {
                offset += s.len();
                continue;
            }
            if let Some(p) = s[lo..hi].iter().position(|b| *b == byte) {
                return Some(offset + lo + p);
            }
            offset += s.len();
        }
        None
    }

    /// Returns the kept text. After a cut it starts at a character boundary, and at a line
    /// boundary when that still keeps at least half the window; a marker says how much was
    /// dropped.
    pub fn finish(mut self) -> Captured {
        let total = self.total;
        let mut dropped = total - self.held as u64;
        if dropped > 0 {
            // Skip UTF-8 continuation bytes left by the cut.
            let skip = self
                .slices()
                .flatten()
                .take(3)
                .take_while(|b| is_continuation(**b))
                .count();
            let mut start = skip;
            // A line start counts only if at least half the window follows it.
            let last = self.held.saturating_sub(self.cap / 2);
            if let Some(nl) = self.find(b'\n', start, last) {
                start = nl + 1;
            }
            self.drop_front(start);
            dropped += start as u64;
        }
        let mut pieces = VecDeque::with_capacity(self.blocks.len() + 2);
        if dropped > 0 {
            pieces.push_back(Piece::owned(truncation_marker(dropped)));
        }
        split_into_pieces(self.blocks, self.head, &mut pieces);
        let len = pieces.iter().map(Piece::len).sum();
        Captured {
            text: Text { pieces, len },
            truncated: dropped > 0,
            total_bytes: total,
            dropped_bytes: dropped,
        }
    }
}

fn is_continuation(b: u8) -> bool {
    (b & 0b1100_0000) == 0b1000_0000
}

/// Length of the UTF-8 sequence a lead byte starts (0 for a byte that cannot start one).
fn sequence_len(lead: u8) -> usize {
    match lead {
        0x00..=0x7f => 1,
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf7 => 4,
        _ => 0,
    }
}

/// How many bytes at the end of `bytes` begin a character that does not finish there.
fn unfinished_suffix(bytes: &[u8]) -> usize {
    let from = bytes.len().saturating_sub(4);
    for i in (from..bytes.len()).rev() {
        if !is_continuation(bytes[i]) {
            let want = sequence_len(bytes[i]);
            let have = bytes.len() - i;
            return if want > have { have } else { 0 };
        }
    }
    0
}

/// Turns the window's blocks into pieces that each hold whole characters: a character cut by
/// a block edge moves into a small piece of its own.
fn split_into_pieces(blocks: VecDeque<Block>, head: usize, pieces: &mut VecDeque<Piece>) {
    let mut carry: Vec<u8> = Vec::new();
    for (i, block) in blocks.into_iter().enumerate() {
        let mut start = if i == 0 { head } else { 0 };
        let end = block.len;
        let bytes = block.filled();
        if let Some(&lead) = carry.first() {
            let missing = sequence_len(lead).saturating_sub(carry.len());
            let took = bytes[start..end]
                .iter()
                .take(missing)
                .take_while(|b| is_continuation(**b))
                .count();
            carry.extend_from_slice(&bytes[start..start + took]);
            start += took;
            if took < missing && start == end {
                // The block ended inside the character too (a tiny block): keep carrying.
                continue;
            }
            pieces.push_back(Piece::owned(String::from_utf8_lossy(&carry).into_owned()));
            carry.clear();
        }
        let cut = unfinished_suffix(&bytes[start..end]);
        carry.extend_from_slice(&bytes[end - cut..end]);
        let end = end - cut;
        if end > start {
            // Checked once here, so a piece's bytes are always UTF-8; a block holding bytes
            // that are not becomes an owned, repaired copy.
            if std::str::from_utf8(&bytes[start..end]).is_ok() {
                pieces.push_back(Piece(PieceData::Block { block, start, end }));
            } else {
                let repaired = String::from_utf8_lossy(&bytes[start..end]).into_owned();
                pieces.push_back(Piece::owned(repaired));
            }
        }
    }
    if !carry.is_empty() {
        pieces.push_back(Piece::owned(String::from_utf8_lossy(&carry).into_owned()));
    }
}

/// Part of a [`Text`]: whole characters, owned by the piece.
#[derive(Clone)]
pub struct Piece(PieceData);

#[derive(Clone)]
enum PieceData {
    Owned(String),
    Block {
        block: Block,
        start: usize,
        end: usize,
    },
}

impl Piece {
    fn owned(s: String) -> Self {
        Self(PieceData::Owned(s))
    }

    /// The piece's text (invalid UTF-8 from the guest was already replaced by U+FFFD). Not
    /// copied, though a block's bytes are checked again on each call.
    pub fn as_str(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(self.as_bytes())
    }

    /// The piece's bytes, always valid UTF-8 whole characters. Lets a consumer cut the piece
    /// smaller (at any byte that is not a continuation byte) and check only what it takes.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            PieceData::Owned(s) => s.as_bytes(),
            PieceData::Block { block, start, end } => &block.filled()[*start..*end],
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        match &self.0 {
            PieceData::Owned(s) => s.len(),
            PieceData::Block { start, end, .. } => end - start,
        }
    }

    /// True for a piece with no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl fmt::Debug for Piece {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.as_str(), f)
    }
}

/// Text kept from one stream, as a sequence of [`Piece`]s.
///
/// Iterating takes the pieces out one at a time; each piece's memory is released when it is
/// dropped, so building one string piece by piece never holds the text twice. `Display` (and
/// so `to_string()`) joins it in one go; equality compares the joined text.
#[derive(Clone, Default)]
pub struct Text {
    pieces: VecDeque<Piece>,
    len: usize,
}

impl Text {
    /// Length in bytes of what is left.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no text is left.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Iterator for Text {
    type Item = Piece;

    fn next(&mut self) -> Option<Piece> {
        let piece = self.pieces.pop_front()?;
        self.len -= piece.len();
        Some(piece)
    }
}

impl From<String> for Text {
    fn from(s: String) -> Self {
        let len = s.len();
        let pieces = if s.is_empty() {
            VecDeque::new()
        } else {
            VecDeque::from([Piece::owned(s)])
        };
        Self { pieces, len }
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Self {
        Self::from(s.to_owned())
    }
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.pieces
            .iter()
            .try_for_each(|p| f.write_str(&p.as_str()))
    }
}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.to_string(), f)
    }
}

impl Text {
    /// Compares with `other` piece by piece, without joining.
    fn eq_str(&self, other: &str) -> bool {
        let mut rest = other;
        for piece in &self.pieces {
            match rest.strip_prefix(&*piece.as_str()) {
                Some(r) => rest = r,
                None => return false,
            }
        }
        rest.is_empty()
    }
}

impl PartialEq for Text {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.eq_str(&other.to_string())
    }
}

impl Eq for Text {}

impl PartialEq<str> for Text {
    fn eq(&self, other: &str) -> bool {
        self.eq_str(other)
    }
}

impl PartialEq<&str> for Text {
    fn eq(&self, other: &&str) -> bool {
        self.eq_str(other)
    }
}

impl PartialEq<String> for Text {
    fn eq(&self, other: &String) -> bool {
        self.eq_str(other)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng, rngs::StdRng};

    fn text(t: TailBuffer) -> String {
        t.finish().text.to_string()
    }

    #[test]
    fn the_marker_is_ascii() {
        // A non-ASCII marker would make CPython store the whole stream two bytes per character.
        assert!(truncation_marker(u64::MAX).is_ascii());
    }

    #[test]
    fn under_cap_is_verbatim() {
        let mut t = TailBuffer::new(16);
        t.push(b"hello ");
        t.push(b"world");
        let c = t.finish();
        assert_eq!(c.text, "hello world");
        assert_eq!(c.text.len(), 11);
        assert!(!c.truncated);
        assert_eq!(c.total_bytes, 11);
    }

    #[test]
    fn keeps_the_tail_with_a_marker() {
        let mut t = TailBuffer::new(10);
        for i in 0..100 {
            t.push(format!("{i:03}").as_bytes());
            assert!(t.held_bytes() <= 10);
        }
        let c = t.finish();
        assert!(c.truncated);
        assert_eq!(c.total_bytes, 300);
        assert_eq!(c.text, format!("{}6097098099", truncation_marker(290)));
    }

    #[test]
    fn single_huge_chunk() {
        let mut t = TailBuffer::new(4);
        t.push(&[b'x'; 1000]);
        t.push(b"ab");
        assert_eq!(text(t), format!("{}xxab", truncation_marker(998)));
    }

    #[test]
    fn cut_is_char_boundary_safe() {
        let mut t = TailBuffer::new(7);
        t.push("ééééé".as_bytes()); // 10 bytes; the last 7 start mid-character
        let c = t.finish();
        assert!(c.truncated);
        assert_eq!(c.text, format!("{}ééé", truncation_marker(4)));
    }

    #[test]
    fn drops_partial_line_only_when_half_survives() {
        let mut t = TailBuffer::new(14);
        t.push(b"zzzzz\n0123456789\n");
        assert_eq!(text(t), format!("{}0123456789\n", truncation_marker(6)));
        let mut t = TailBuffer::new(12);
        t.push(b"aaaaaaaaaa\nbbbbbbb\ncccc\n");
        // only 5 bytes follow the first newline in the window: the partial line stays
        assert_eq!(text(t), format!("{}bbbbbb\ncccc\n", truncation_marker(12)));
    }

    #[test]
    fn characters_cut_by_block_edges_stay_whole() {
        // 4 KiB blocks on the heap; 3-byte characters straddle every block edge.
        let mut t = TailBuffer::new(16 * 1024);
        let s = "€".repeat(5000);
        t.push(s.as_bytes());
        let c = t.finish();
        let kept = c.text.to_string();
        assert!(kept.ends_with("€€€"));
        assert!(
            !kept.contains('\u{fffd}'),
            "a character was broken at a block edge"
        );
        // Every piece holds whole characters on its own.
        for piece in c.text {
            assert!(!piece.as_str().contains('\u{fffd}'));
        }
    }

    #[test]
    fn memory_stays_within_the_cap_plus_two_blocks() {
        for cap in [10, 5000, 16 * 1024, 100_000, 1 << 20] {
            let mut t = TailBuffer::new(cap);
            let line = [b'y'; 1000];
            for _ in 0..(cap / 1000 + 1) * 20 {
                t.push(&line);
                assert!(t.held_bytes() <= cap);
                assert!(
                    t.reserved_bytes() <= cap.max(t.block) + 2 * t.block,
                    "cap {cap}: {} bytes reserved",
                    t.reserved_bytes()
                );
            }
            t.push(&vec![b'z'; cap * 3]);
            assert!(t.reserved_bytes() <= cap.max(t.block) + 2 * t.block);
            let c = t.finish();
            assert!(c.text.len() <= cap + 64);
            assert!(c.text.to_string().ends_with('z'));
        }
    }

    #[test]
    fn taking_pieces_one_by_one_gives_the_same_text() {
        let mut t = TailBuffer::new(200_000);
        for i in 0..50_000 {
            t.push(format!("line {i}\n").as_bytes());
        }
        let c = t.finish();
        let whole = c.text.to_string();
        let mut text = c.text;
        let mut joined = String::new();
        let mut pieces = 0;
        while let Some(piece) = text.next() {
            joined.push_str(&piece.as_str());
            pieces += 1;
            assert_eq!(text.len(), whole.len() - joined.len());
        }
        assert!(pieces > 3, "a 200 KB window comes out in several pieces");
        assert_eq!(joined, whole);
        assert!(joined.ends_with("line 49999\n"));
    }

    /// What the buffer must produce, computed the obvious way from the whole stream.
    fn model(stream: &[u8], cap: usize) -> String {
        let keep = stream.len().min(cap);
        let mut bytes = stream[stream.len() - keep..].to_vec();
        let mut dropped = (stream.len() - keep) as u64;
        if dropped > 0 {
            let mut start = bytes
                .iter()
                .take(3)
                .take_while(|b| is_continuation(**b))
                .count();
            if let Some(nl) = bytes[start..].iter().position(|b| *b == b'\n') {
                let after = start + nl + 1;
                if bytes.len() - after >= cap / 2 {
                    start = after;
                }
            }
            bytes.drain(..start);
            dropped += start as u64;
            bytes.splice(0..0, truncation_marker(dropped).bytes());
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    #[test]
    fn matches_the_simple_model_on_random_streams() {
        let alphabet: Vec<&[u8]> = vec![
            b"a",
            b"\n",
            "é".as_bytes(),
            "€".as_bytes(),
            "🦀".as_bytes(),
            b"\xff",
            b"\x80",
            b"\xf0\x9f",
            b"\xe0\x80",
            b"\xc0",
            b"line of text\n",
        ];
        let mut rng = StdRng::seed_from_u64(7);
        for round in 0..300 {
            let cap = [1, 3, 7, 64, 4096, 20_000, 70_000][round % 7];
            let mut t = TailBuffer::new(cap);
            let mut stream = Vec::new();
            let target = rng.random_range(0..cap * 3 + 100);
            while stream.len() < target {
                let mut chunk = Vec::new();
                let parts = if rng.random_bool(0.05) {
                    5000
                } else {
                    rng.random_range(1..40)
                };
                for _ in 0..parts {
                    chunk.extend_from_slice(alphabet[rng.random_range(0..alphabet.len())]);
                }
                t.push(&chunk);
                stream.extend_from_slice(&chunk);
            }
            let c = t.finish();
            assert_eq!(c.total_bytes, stream.len() as u64);
            assert_eq!(
                c.text.to_string(),
                model(&stream, cap),
                "round {round}, cap {cap}"
            );
        }
    }
}
