//! Where an HTTP/1.1 body ends ([`Decoder`]): by its length, at the end of its
//! chunked framing (RFC 9112 section 7.1), or when the connection closes; fed
//! the bytes as they arrive, it never reads a socket, so it is tested byte by
//! byte (`codec/tests.rs`).

use super::codec::{Framing, MAX_CHUNK_META, is_tchar};

/// Where a body ends, fed the bytes as they arrive.
#[derive(Debug)]
pub(crate) enum Decoder {
    Length(u64),
    Chunked(Chunked),
    UntilClose,
    Done,
}

/// A chunked body being read.
#[derive(Debug)]
pub(crate) struct Chunked {
    state: Chunk,
    /// Extension and trailer bytes so far (bounded per body by
    /// [`MAX_CHUNK_META`]).
    meta: usize,
    /// Trailer fields are consumed but not relayed: request trailers could
    /// carry `content-length` or `host` to an upstream that merges them, and
    /// nothing the agent judged looked at them (nginx drops them too).
    strip_trailers: bool,
    /// Only the payload is relayed (to an HTTP/1.0 client, which knows no
    /// chunked framing): a step is all chunk data or all framing, dropped.
    dechunk: bool,
}

/// Where a chunked body is (RFC 9112 section 7.1).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Chunk {
    /// Reading the hex size; `digits` read so far.
    Size {
        size: u64,
        digits: u8,
    },
    /// Whitespace after the size (`BWS`): only `;` may follow.
    SizeWs {
        size: u64,
    },
    /// Skipping a chunk extension up to CR.
    Ext {
        size: u64,
    },
    SizeLf {
        size: u64,
    },
    Data(u64),
    DataCr,
    DataLf,
    /// At the start of a trailer line (or the final CRLF).
    Trailer,
    /// Inside a trailer field; whether its `:` was seen.
    TrailerLine {
        colon: bool,
    },
    TrailerLf,
    EndLf,
}

/// What [`Decoder::advance`] consumed.
pub(crate) struct Step {
    /// Bytes of the input that belong to the body (framing included).
    pub(crate) taken: usize,
    /// Of those, payload bytes (what byte limits count).
    pub(crate) payload: u64,
    /// The bytes taken are not relayed (stripped trailer fields).
    pub(crate) dropped: bool,
}

impl Decoder {
    /// A decoder of a response body (trailers are relayed).
    pub(crate) fn new(framing: Framing) -> Self {
        Self::with_trailers(framing, false)
    }

    /// A decoder of a request body: trailer fields are dropped.
    pub(crate) fn request(framing: Framing) -> Self {
        Self::with_trailers(framing, true)
    }

    /// A decoder of a response body whose chunked framing (and trailers) is
    /// dropped, leaving the payload: for an HTTP/1.0 client.
    pub(crate) fn dechunked(framing: Framing) -> Self {
        let mut decoder = Self::new(framing);
        if let Decoder::Chunked(body) = &mut decoder {
            body.dechunk = true;
        }
        decoder
    }

    fn with_trailers(framing: Framing, strip_trailers: bool) -> Self {
        match framing {
            Framing::Empty | Framing::Length(0) => Decoder::Done,
            Framing::Length(n) => Decoder::Length(n),
            Framing::Chunked => Decoder::Chunked(Chunked {
                state: Chunk::Size { size: 0, digits: 0 },
                meta: 0,
                strip_trailers,
                dechunk: false,
            }),
            Framing::UntilClose => Decoder::UntilClose,
        }
    }

    pub(crate) fn done(&self) -> bool {
        matches!(self, Decoder::Done)
    }

    /// Consumes what of `input` belongs to the body; `None` on broken chunking.
    pub(crate) fn advance(&mut self, input: &[u8]) -> Option<Step> {
        match self {
            Decoder::Done => Some(Step {
                taken: 0,
                payload: 0,
                dropped: false,
            }),
            Decoder::UntilClose => Some(Step {
                taken: input.len(),
                payload: input.len() as u64,
                dropped: false,
            }),
            Decoder::Length(left) => {
                let take = usize::try_from(*left).map_or(input.len(), |l| l.min(input.len()));
                *left -= take as u64;
                if *left == 0 {
                    *self = Decoder::Done;
                }
                Some(Step {
                    taken: take,
                    payload: take as u64,
                    dropped: false,
                })
            }
            Decoder::Chunked(body) => {
                let step = body.advance(input)?;
                if step.done {
                    *self = Decoder::Done;
                }
                Some(Step {
                    taken: step.taken,
                    payload: step.payload,
                    dropped: step.dropped,
                })
            }
        }
    }
}

/// A byte that may not appear in a chunk extension or a trailer field: a control
/// byte other than HTAB (CR and LF end lines and are handled by the caller).
fn is_control(b: u8) -> bool {
    (b < 0x20 && b != b'\t') || b == 0x7f
}

/// What [`Chunked::advance`] consumed.
struct ChunkStep {
    taken: usize,
    payload: u64,
    done: bool,
    dropped: bool,
}

impl ChunkStep {
    /// A step that does not end the body.
    fn part(taken: usize, payload: u64, dropped: bool) -> Self {
        Self {
            taken,
            payload,
            done: false,
            dropped,
        }
    }
}

impl Chunked {
    /// Whether `state` is inside a trailer field (dropped when stripping).
    fn in_trailer_field(state: Chunk) -> bool {
        matches!(state, Chunk::TrailerLine { .. } | Chunk::TrailerLf)
    }

    /// Advances over `input`. Strict: a chunk line is `hex-size [BWS ";" ext]
    /// CRLF` (RFC 9112 section 7.1.1), every line ends with CRLF, a trailer line
    /// is a field (`token:value`, no leading whitespace, so no obs-fold). When
    /// trailers are stripped, a step ends where a trailer field starts or ends,
    /// so that a step's bytes are all relayed or all dropped.
    fn advance(&mut self, input: &[u8]) -> Option<ChunkStep> {
        let mut i = 0;
        let mut payload = 0;
        let mut dropping = self.strip_trailers && Self::in_trailer_field(self.state);
        while i < input.len() {
            let b = input[i];
            let state = match self.state {
                Chunk::Size { size, digits } => size_digit(size, digits, b)?,
                Chunk::SizeWs { size } => {
                    self.meta += 1;
                    match b {
                        b' ' | b'\t' => Chunk::SizeWs { size },
                        b';' => Chunk::Ext { size },
                        _ => return None,
                    }
                }
                Chunk::Ext { size } => {
                    self.meta += 1;
                    match b {
                        b'\r' => Chunk::SizeLf { size },
                        b if is_control(b) || b == b'\n' => return None,
                        _ => Chunk::Ext { size },
                    }
                }
                Chunk::SizeLf { size } => match (b, size) {
                    (b'\n', 0) => Chunk::Trailer,
                    (b'\n', size) => Chunk::Data(size),
                    _ => return None,
                },
                // Dechunking: chunk data is a step of its own.
                Chunk::Data(_) if self.dechunk && i > 0 => {
                    return Some(ChunkStep::part(i, payload, true));
                }
                Chunk::Data(left) => {
                    let take = self.take_data(left, input.len() - i);
                    payload += take as u64;
                    i += take;
                    if self.dechunk {
                        return Some(ChunkStep::part(i, payload, false));
                    }
                    continue;
                }
                Chunk::DataCr if b == b'\r' => Chunk::DataLf,
                Chunk::DataLf if b == b'\n' => Chunk::Size { size: 0, digits: 0 },
                Chunk::DataCr | Chunk::DataLf => return None,
                Chunk::Trailer => match b {
                    b'\r' => Chunk::EndLf,
                    // A field name is a token: no leading whitespace (obs-fold).
                    b if !is_tchar(b) => return None,
                    _ => {
                        self.meta += 1;
                        Chunk::TrailerLine { colon: false }
                    }
                },
                Chunk::TrailerLine { colon } => {
                    self.meta += 1;
                    trailer_byte(colon, b)?
                }
                Chunk::TrailerLf if b == b'\n' => Chunk::Trailer,
                Chunk::EndLf if b == b'\n' => {
                    return Some(ChunkStep {
                        taken: i + 1,
                        payload,
                        done: true,
                        dropped: self.dechunk,
                    });
                }
                Chunk::TrailerLf | Chunk::EndLf => return None,
            };
            if self.meta > MAX_CHUNK_META {
                return None;
            }
            // Stripping: stop where a trailer field starts (before its first
            // byte) or ends (after its LF), so a step is all kept or all dropped.
            if self.strip_trailers {
                match self.trailer_edge(state) {
                    Edge::Neither => {}
                    Edge::Starts if i > 0 => {
                        return Some(ChunkStep::part(i, payload, dropping));
                    }
                    // This step begins with the field: all of it is dropped.
                    Edge::Starts => dropping = true,
                    Edge::Ends => {
                        self.state = state;
                        return Some(ChunkStep::part(i + 1, payload, true));
                    }
                }
            }
            self.state = state;
            i += 1;
        }
        Some(ChunkStep::part(i, payload, dropping || self.dechunk))
    }

    /// Takes up to `left` bytes of chunk data from the `available` ones and
    /// says how many; once the chunk's data is all taken, its CRLF is next.
    fn take_data(&mut self, left: u64, available: usize) -> usize {
        let take = usize::try_from(left).map_or(available, |l| l.min(available));
        let left = left - take as u64;
        self.state = if left == 0 {
            Chunk::DataCr
        } else {
            Chunk::Data(left)
        };
        take
    }

    /// Whether going to `next` starts or ends a trailer field.
    fn trailer_edge(&self, next: Chunk) -> Edge {
        match (
            Self::in_trailer_field(self.state),
            Self::in_trailer_field(next),
        ) {
            (false, true) => Edge::Starts,
            (true, false) => Edge::Ends,
            _ => Edge::Neither,
        }
    }
}

/// Whether a change of state crosses the edge of a trailer field (where a
/// stripping step ends).
enum Edge {
    /// It stays inside a field, or outside every field.
    Neither,
    Starts,
    Ends,
}

/// The state after `b` on a chunk's hex size (`digits` of them read so far,
/// giving `size`); `None` when `b` breaks the line.
fn size_digit(size: u64, digits: u8, b: u8) -> Option<Chunk> {
    Some(match (b as char).to_digit(16) {
        // 15 hex digits fit in a u64; more is an overflow attempt.
        Some(d) if digits < 15 => Chunk::Size {
            size: size * 16 + u64::from(d),
            digits: digits + 1,
        },
        Some(_) => return None,
        None if digits == 0 => return None,
        None => match b {
            b'\r' => Chunk::SizeLf { size },
            b';' => Chunk::Ext { size },
            b' ' | b'\t' => Chunk::SizeWs { size },
            _ => return None,
        },
    })
}

/// The state after `b` inside a trailer field (`colon`: its `:` was seen);
/// `None` when `b` breaks the field.
fn trailer_byte(colon: bool, b: u8) -> Option<Chunk> {
    Some(match b {
        b'\r' if colon => Chunk::TrailerLf,
        b'\r' | b'\n' => return None,
        b if is_control(b) => return None,
        b':' => Chunk::TrailerLine { colon: true },
        b if !colon && !is_tchar(b) => return None,
        _ => Chunk::TrailerLine { colon },
    })
}
