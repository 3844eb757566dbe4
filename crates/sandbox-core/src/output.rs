//! Bounded output capture. Each stream keeps only its last `cap` bytes *while it streams*, so a
//! guest printing gigabytes costs the host at most `cap` bytes per stream.

use std::collections::VecDeque;

/// Keeps the tail of a byte stream in at most `cap` bytes.
#[derive(Debug)]
pub struct TailBuffer {
    cap: usize,
    buf: VecDeque<u8>,
    total: u64,
}

/// What a [`TailBuffer`] kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    /// The kept text, prefixed with a marker such as `[… 1234 bytes truncated …]` when bytes
    /// were dropped.
    pub text: String,
    /// True when anything was dropped.
    pub truncated: bool,
    /// Bytes the stream produced in total.
    pub total_bytes: u64,
    /// Bytes dropped from the front (including any partial character or line at the cut).
    pub dropped_bytes: u64,
}

/// Bytes reserved behind the window for the truncation marker.
const MARKER_ROOM: usize = 64;
/// Output up to this size grows the buffer normally; past it the whole window is reserved.
const SMALL_OUTPUT: usize = 16 * 1024;

/// The marker put in front of a truncated stream.
pub fn truncation_marker(dropped: u64) -> String {
    format!("[… {dropped} bytes truncated …]\n")
}

impl TailBuffer {
    /// A buffer that keeps at most `cap` bytes (at least 1).
    pub fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            buf: VecDeque::new(),
            total: 0,
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
        self.buf.len()
    }

    /// Appends a chunk, dropping from the front whatever exceeds the cap.
    pub fn push(&mut self, data: &[u8]) {
        self.total += data.len() as u64;
        let needed = self.buf.len() + data.len();
        if needed > self.buf.capacity() && needed > SMALL_OUTPUT && self.buf.capacity() < self.cap {
            // Once output outgrows the buffer, take the whole window (plus room for the
            // truncation marker) in one allocation: growing by doubling would copy the tail
            // several times and leave the smaller blocks behind in the allocator.
            self.buf
                .reserve_exact(self.cap + MARKER_ROOM - self.buf.len());
        }
        if data.len() >= self.cap {
            self.buf.clear();
            self.buf.extend(&data[data.len() - self.cap..]);
            return;
        }
        let overflow = (self.buf.len() + data.len()).saturating_sub(self.cap);
        if overflow > 0 {
            self.buf.drain(..overflow);
        }
        self.buf.extend(data);
    }

    /// Returns the kept text. After a cut it starts at a character boundary, and at a line
    /// boundary when that still keeps at least half the window; a marker says how much was
    /// dropped.
    pub fn finish(self) -> Captured {
        let total = self.total;
        let mut bytes: Vec<u8> = self.buf.into();
        let mut dropped = total - bytes.len() as u64;
        if dropped > 0 {
            // Skip UTF-8 continuation bytes left by the cut.
            let skip = bytes
                .iter()
                .take(3)
                .take_while(|b| (**b & 0b1100_0000) == 0b1000_0000)
                .count();
            let mut start = skip;
            if let Some(nl) = bytes[start..].iter().position(|b| *b == b'\n') {
                let after = start + nl + 1;
                if bytes.len() - after >= self.cap / 2 {
                    start = after;
                }
            }
            bytes.drain(..start);
            dropped += start as u64;
        }
        if dropped > 0 {
            // The marker goes in front of the kept bytes in place: no second copy of the tail.
            let marker = truncation_marker(dropped);
            bytes.splice(0..0, marker.bytes());
        }
        let text = match String::from_utf8(bytes) {
            Ok(text) => text,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        };
        Captured {
            text,
            truncated: dropped > 0,
            total_bytes: total,
            dropped_bytes: dropped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn under_cap_is_verbatim() {
        let mut t = TailBuffer::new(16);
        t.push(b"hello ");
        t.push(b"world");
        let c = t.finish();
        assert_eq!(c.text, "hello world");
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
        let c = t.finish();
        assert_eq!(c.text, format!("{}xxab", truncation_marker(998)));
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
        let c = t.finish();
        assert_eq!(c.text, format!("{}0123456789\n", truncation_marker(6)));
        let mut t = TailBuffer::new(12);
        t.push(b"aaaaaaaaaa\nbbbbbbb\ncccc\n");
        let c = t.finish();
        // only 5 bytes follow the first newline in the window: the partial line stays
        assert_eq!(c.text, format!("{}bbbbbb\ncccc\n", truncation_marker(12)));
    }
}
