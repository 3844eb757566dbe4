//! Frames longer than one frame line, reassembled on the host within the run's bound on bytes.
//!
//! A vertex that answers with megabytes of text carries them in one frame several times over
//! (its `results`, `outputs`, `artifacts` and `messages`), so its frame can be far longer than
//! the host accepts in one line ([`crate::frames::MAX_FRAME_BYTES`]). The runner sends such a
//! frame's JSON text in pieces instead, one after another and nothing between them:
//!
//! ```text
//! {"frame":"chunk","index":0,"total":20001201,"data":"{\"frame\":\"vertex\",\"id\":..."}
//! {"frame":"chunk","index":1,"total":20001201,"data":"xxxxxxxx..."}
//! ...
//! ```
//!
//! `total` is the length of the whole text in bytes, the same in every piece; `data` is the next
//! piece of the text. [`Reassembly`] puts the pieces back together and hands over the whole text
//! once `total` bytes have arrived; the caller then reads it as any other frame line.
//!
//! Whatever a guest claims is checked before it costs the host anything: a `total` larger than
//! what the run has left of its bound on bytes (`CREATEOS_EXECUTOR_MAX_RESULT_BYTES`) is refused
//! at the first piece, before anything is buffered, and the buffer grows with what arrived (at
//! most twice that), never past the claimed `total`. A piece out of order, a piece with a different `total`, a piece that would
//! overrun `total`, an empty piece, or any other frame before the last piece is a broken frame
//! ([`Broken`]): the run is stopped and its guest destroyed. A frame that never finishes is
//! reported by the caller when the output ends or the run's clock runs out
//! ([`Reassembly::progress`]).

use std::fmt;

use bytes::Bytes;

/// A chunked frame the host could not reassemble: the run must stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Broken {
    /// The frame claims more bytes than the run has left of its bound.
    OverBound {
        /// The frame's claimed length.
        total: u64,
        /// What the run had left of its bound when the frame began.
        room: u64,
    },
    /// A piece arrived out of its place.
    OutOfOrder {
        /// The place due.
        expected: u64,
        /// The place the piece claims.
        got: u64,
    },
    /// A piece claims another total than the frame's first piece.
    TotalChanged {
        /// The first piece's total.
        first: u64,
        /// This piece's.
        now: u64,
    },
    /// The pieces add up to more than the frame's total.
    Overrun {
        /// The frame's total.
        total: u64,
        /// What the pieces added up to, with the one that overran it.
        received: u64,
    },
    /// A piece without data, or a frame of no bytes.
    Empty,
    /// Another frame arrived before the chunked frame's last piece.
    Interrupted {
        /// What the frame had received of its total.
        received: u64,
        /// The frame's total.
        total: u64,
    },
}

impl fmt::Display for Broken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Broken::OverBound { total, room } => write!(
                f,
                "a chunked frame of {total} bytes, when the run had {room} bytes left of its bound"
            ),
            Broken::OutOfOrder { expected, got } => write!(
                f,
                "a chunked frame's piece {got} where piece {expected} was due"
            ),
            Broken::TotalChanged { first, now } => write!(
                f,
                "a piece of a chunked frame of {first} bytes that claims {now} bytes"
            ),
            Broken::Overrun { total, received } => write!(
                f,
                "pieces of a chunked frame of {total} bytes that add up to {received} bytes"
            ),
            Broken::Empty => f.write_str("an empty piece of a chunked frame"),
            Broken::Interrupted { received, total } => write!(
                f,
                "another frame in the middle of a chunked frame ({received} of its {total} \
                 bytes had arrived)"
            ),
        }
    }
}

/// The frame being reassembled.
#[derive(Debug)]
struct Open {
    total: u64,
    next: u64,
    text: Vec<u8>,
}

/// Puts a chunked frame's pieces back together, one frame at a time.
#[derive(Debug, Default)]
pub struct Reassembly {
    open: Option<Open>,
}

impl Reassembly {
    /// Takes the piece `index` of a frame of `total` bytes, `data`; `room` is what the run has
    /// left of its bound on bytes before this piece. Returns the whole frame's text once its
    /// last piece arrived. Memory: at most `total` bytes (and at most twice what arrived), and
    /// `total` is at most `room`.
    pub fn push(
        &mut self,
        index: u64,
        total: u64,
        data: &[u8],
        room: u64,
    ) -> Result<Option<Bytes>, Broken> {
        if data.is_empty() || total == 0 {
            return Err(Broken::Empty);
        }
        if let Some(open) = &self.open {
            if index != open.next {
                return Err(Broken::OutOfOrder {
                    expected: open.next,
                    got: index,
                });
            }
            if total != open.total {
                return Err(Broken::TotalChanged {
                    first: open.total,
                    now: total,
                });
            }
        } else if index != 0 {
            return Err(Broken::OutOfOrder {
                expected: 0,
                got: index,
            });
        } else if total > room || usize::try_from(total).is_err() {
            return Err(Broken::OverBound { total, room });
        }
        let open = self.open.get_or_insert_with(|| Open {
            total,
            next: 0,
            text: Vec::new(),
        });
        let received = len(&open.text).saturating_add(len(data));
        if received > open.total {
            let total = open.total;
            self.open = None;
            return Err(Broken::Overrun { total, received });
        }
        // Grown by doubling, never past the claimed total (which the run's bound holds): memory
        // follows what arrived, whatever the guest claims.
        let needed = open.text.len() + data.len();
        if open.text.capacity() < needed {
            let total = usize::try_from(open.total).unwrap_or(usize::MAX);
            let grown = open
                .text
                .capacity()
                .saturating_mul(2)
                .max(needed)
                .min(total);
            open.text.reserve_exact(grown - open.text.len());
        }
        open.text.extend_from_slice(data);
        open.next += 1;
        if received < open.total {
            return Ok(None);
        }
        Ok(self.open.take().map(|open| Bytes::from(open.text)))
    }

    /// Checks that no chunked frame is open before a frame of another kind is read.
    pub fn between_frames(&self) -> Result<(), Broken> {
        match self.progress() {
            None => Ok(()),
            Some((received, total)) => Err(Broken::Interrupted { received, total }),
        }
    }

    /// The open frame's bytes received so far and its total, if one is being reassembled.
    pub fn progress(&self) -> Option<(u64, u64)> {
        self.open.as_ref().map(|o| (len(&o.text), o.total))
    }
}

fn len(bytes: &[u8]) -> u64 {
    u64::try_from(bytes.len()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splits `text` into pieces of `size` bytes and pushes them all, as the runner sends them.
    fn send(r: &mut Reassembly, text: &[u8], size: usize, room: u64) -> Result<Bytes, Broken> {
        let total = len(text);
        let mut whole = None;
        for (i, piece) in text.chunks(size).enumerate() {
            assert!(whole.is_none(), "the frame ended before its last piece");
            whole = r.push(i as u64, total, piece, room)?;
        }
        Ok(whole.expect("the last piece ends the frame"))
    }

    #[test]
    fn pieces_in_order_give_back_the_whole_text() {
        let text: Vec<u8> = (0..5_000_003u32)
            .map(|i| b"{}x\"\\"[i as usize % 5])
            .collect();
        let mut r = Reassembly::default();
        for size in [1_048_576, 1_000_000, 5_000_003, 7] {
            let whole = send(
                &mut r,
                &text[..if size == 7 { 99 } else { text.len() }],
                size,
                u64::MAX,
            )
            .unwrap();
            assert_eq!(whole, text[..whole.len()], "{size}");
            assert_eq!(r.progress(), None);
            assert_eq!(r.between_frames(), Ok(()));
        }
        // Exactly the room left is enough.
        assert_eq!(send(&mut r, b"abcdef", 4, 6).unwrap(), &b"abcdef"[..]);
    }

    #[test]
    fn a_claimed_total_over_the_room_is_refused_before_anything_is_kept() {
        let mut r = Reassembly::default();
        assert_eq!(
            r.push(0, u64::MAX, b"{", 64 << 20),
            Err(Broken::OverBound {
                total: u64::MAX,
                room: 64 << 20
            })
        );
        assert_eq!(r.progress(), None, "nothing was kept");
        assert_eq!(
            r.push(0, 7, b"{", 6),
            Err(Broken::OverBound { total: 7, room: 6 })
        );
        // A total the run can take is not allocated before the pieces bring it.
        assert_eq!(r.push(0, 1 << 20, b"{", 1 << 20), Ok(None));
        assert_eq!(r.progress(), Some((1, 1 << 20)));
        assert!(r.open.as_ref().unwrap().text.capacity() < 1024);
        for i in 1..1000 {
            assert_eq!(r.push(i, 1 << 20, &[b' '; 1000], 1 << 20), Ok(None));
        }
        let capacity = r.open.as_ref().unwrap().text.capacity();
        assert!(capacity <= 2 * 999_001, "{capacity}");
    }

    #[test]
    fn pieces_out_of_order_or_disagreeing_are_refused() {
        let mut r = Reassembly::default();
        assert_eq!(
            r.push(1, 10, b"abc", 100),
            Err(Broken::OutOfOrder {
                expected: 0,
                got: 1
            })
        );
        assert_eq!(r.push(0, 10, b"abc", 100), Ok(None));
        assert_eq!(
            r.push(2, 10, b"def", 100),
            Err(Broken::OutOfOrder {
                expected: 1,
                got: 2
            })
        );
        let mut r = Reassembly::default();
        assert_eq!(r.push(0, 10, b"abc", 100), Ok(None));
        assert_eq!(
            r.push(0, 10, b"abc", 100),
            Err(Broken::OutOfOrder {
                expected: 1,
                got: 0
            }),
            "a piece sent twice"
        );
        let mut r = Reassembly::default();
        assert_eq!(r.push(0, 10, b"abc", 100), Ok(None));
        assert_eq!(
            r.push(1, 11, b"def", 100),
            Err(Broken::TotalChanged { first: 10, now: 11 })
        );
        let mut r = Reassembly::default();
        assert_eq!(r.push(0, 5, b"abc", 100), Ok(None));
        assert_eq!(
            r.push(1, 5, b"def", 100),
            Err(Broken::Overrun {
                total: 5,
                received: 6
            })
        );
        assert_eq!(r.progress(), None, "an overrun frame is dropped");
        assert_eq!(r.push(0, 5, b"", 100), Err(Broken::Empty));
        assert_eq!(r.push(0, 0, b"a", 100), Err(Broken::Empty));
    }

    #[test]
    fn an_open_frame_refuses_other_frames_and_says_how_far_it_got() {
        let mut r = Reassembly::default();
        assert_eq!(r.push(0, 10, b"abcd", 100), Ok(None));
        assert_eq!(r.progress(), Some((4, 10)));
        assert_eq!(
            r.between_frames(),
            Err(Broken::Interrupted {
                received: 4,
                total: 10
            })
        );
        let text = r.between_frames().unwrap_err().to_string();
        assert!(text.contains("4 of its 10 bytes"), "{text}");
    }
}
