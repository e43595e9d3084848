//! Wire format of the control plane: a fixed 20-byte header, then the payload.
//!
//! ```text
//! magic "HMCP" | version u16 | kind u16 | sequence u64 | payload length u32   (little endian)
//! ```
//!
//! Every connection numbers its frames per direction from 0; the decoder rejects a gap, so a
//! reordered or lost frame is an error instead of silent corruption. Payload lengths are capped
//! (a small cap before the handshake, a large one after), so an absurd length prefix from a
//! stranger costs nothing.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

use super::unique_id::PROTOCOL_VERSION;
use crate::error::{Error, ErrorKind};

/// The first four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"HMCP";
/// Bytes of the frame header.
pub const HEADER_LEN: usize = 20;
/// Largest payload accepted before a peer has authenticated.
pub const MAX_HANDSHAKE_PAYLOAD: u32 = 4 << 10;
/// Largest payload accepted from an authenticated peer (256 MiB).
pub const MAX_PAYLOAD: u32 = 256 << 20;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum Kind {
    /// Member → root: rank, world size and secret.
    Hello = 1,
    /// Root → member: everyone has arrived.
    Welcome = 2,
    /// Root → member: the handshake or rendezvous failed; payload is a [`WireError`].
    Reject = 3,
    /// Member → root: this rank's part of a collective.
    Contribute = 4,
    /// Root → member: the outcome of a collective.
    Outcome = 5,
    /// Either way: a point-to-point message, routed through the root.
    Send = 6,
    /// Root → member: the plane is broken (peer lost, mismatch); payload is a [`WireError`].
    Abort = 7,
    /// Either way: the sender is closing cleanly.
    Bye = 8,
    /// Member → root: end the job with this exit status; root → member: a global exit with
    /// this status is under way, record it and acknowledge. Payload: the status, i32 (see
    /// `control/global_exit.rs`).
    Exit = 9,
    /// Member → root: the global exit's status is recorded here.
    ExitAck = 10,
    /// Root → member: every member has recorded the global exit; end the process with this
    /// status (i32) now.
    ExitNow = 11,
    /// Either way: the sender is alive (see `control/liveness.rs`); sent every fifth of the
    /// peer timeout. Empty once the plane is up; while the rendezvous waits, the sender's node
    /// name.
    Heartbeat = 12,
    /// Member → root: a rank on the sender's host fell silent past the peer timeout (seen over
    /// the host's local liveness sockets, see `control/host_watch.rs`). Payload: that rank, u32;
    /// how long it was silent, in milliseconds, u32.
    Silent = 13,
}

impl Kind {
    fn from_u16(value: u16) -> Option<Kind> {
        Some(match value {
            1 => Kind::Hello,
            2 => Kind::Welcome,
            3 => Kind::Reject,
            4 => Kind::Contribute,
            5 => Kind::Outcome,
            6 => Kind::Send,
            7 => Kind::Abort,
            8 => Kind::Bye,
            9 => Kind::Exit,
            10 => Kind::ExitAck,
            11 => Kind::ExitNow,
            12 => Kind::Heartbeat,
            13 => Kind::Silent,
            _ => return None,
        })
    }
}

/// One decoded frame.
#[derive(Debug, PartialEq, Eq)]
pub struct Frame {
    /// What it carries.
    pub kind: Kind,
    /// Its position in the connection's stream of frames.
    pub sequence: u64,
    /// The payload bytes.
    pub payload: Vec<u8>,
}

/// Why a byte stream is not a valid sequence of frames.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// The first four bytes are not `HMCP`.
    #[error("bad magic (not a hyper_multicore control-plane connection)")]
    BadMagic,
    /// Protocol version differs.
    #[error("protocol version {0} (this build speaks {PROTOCOL_VERSION})")]
    BadVersion(u16),
    /// Unknown frame kind.
    #[error("unknown frame kind {0}")]
    UnknownKind(u16),
    /// Payload length above the cap.
    #[error("frame of {length} bytes exceeds the {cap}-byte limit")]
    TooLarge {
        /// Announced length.
        length: u32,
        /// The cap in force.
        cap: u32,
    },
    /// A frame is missing or out of order.
    #[error("frame sequence {got} where {expected} was expected")]
    BadSequence {
        /// The next expected number.
        expected: u64,
        /// The number received.
        got: u64,
    },
}

/// The header bytes of a frame.
pub fn encode_header(kind: Kind, sequence: u64, payload_len: u32) -> [u8; HEADER_LEN] {
    let mut header = [0u8; HEADER_LEN];
    header[0..4].copy_from_slice(&MAGIC);
    header[4..6].copy_from_slice(&u16::from(PROTOCOL_VERSION).to_le_bytes());
    header[6..8].copy_from_slice(&(kind as u16).to_le_bytes());
    header[8..16].copy_from_slice(&sequence.to_le_bytes());
    header[16..20].copy_from_slice(&payload_len.to_le_bytes());
    header
}

/// Writes one frame whose payload is the concatenation of `parts`.
pub fn write_frame(
    out: &mut impl Write,
    kind: Kind,
    sequence: u64,
    parts: &[&[u8]],
) -> io::Result<()> {
    let total: usize = parts.iter().map(|p| p.len()).sum();
    let length = u32::try_from(total)
        .ok()
        .filter(|&l| l <= MAX_PAYLOAD)
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a {total}-byte control-plane message exceeds the {MAX_PAYLOAD}-byte cap"),
            )
        })?;
    let header = encode_header(kind, sequence, length);
    if total <= 64 << 10 {
        // Small frames go out in one write so Nagle-free sockets send one segment.
        let mut buffer = Vec::with_capacity(HEADER_LEN + total);
        buffer.extend_from_slice(&header);
        for part in parts {
            buffer.extend_from_slice(part);
        }
        return out.write_all(&buffer);
    }
    out.write_all(&header)?;
    for part in parts {
        out.write_all(part)?;
    }
    Ok(())
}

/// Reassembles frames from a byte stream, checking magic, version, kind, size and sequence.
#[derive(Debug)]
pub struct FrameDecoder {
    /// Received bytes in `start..end`; past `end`, space already zeroed for the next read (so a
    /// read does not zero its whole window again: a 64 KiB memset per small frame).
    buffer: Vec<u8>,
    start: usize,
    end: usize,
    cap: u32,
    expected_sequence: u64,
}

impl FrameDecoder {
    /// A decoder accepting payloads of at most `cap` bytes.
    pub fn new(cap: u32) -> Self {
        FrameDecoder {
            buffer: Vec::new(),
            start: 0,
            end: 0,
            cap,
            expected_sequence: 0,
        }
    }

    /// Changes the payload cap (raised once the peer has authenticated).
    pub fn set_cap(&mut self, cap: u32) {
        self.cap = cap;
    }

    /// Bytes buffered but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.compact();
        self.room(bytes.len()).copy_from_slice(bytes);
        self.end += bytes.len();
    }

    /// Performs one `read` from `source` into the buffer; returns the bytes read (0 = end of stream).
    pub fn read_from(&mut self, source: &mut impl Read) -> io::Result<usize> {
        self.compact();
        // Never read more than one largest frame allows: an unauthenticated peer (4 KiB cap) costs
        // a few KiB of buffer, not 64.
        let floor = (self.cap as usize + HEADER_LEN).min(64 << 10);
        let wanted = self.bytes_wanted().clamp(floor, 8 << 20);
        let result = source.read(self.room(wanted));
        self.end += *result.as_ref().unwrap_or(&0);
        result
    }

    /// The `len` bytes of space right after the received ones (zeroed only when first grown).
    fn room(&mut self, len: usize) -> &mut [u8] {
        let needed = self.end + len;
        if self.buffer.len() < needed {
            self.buffer.resize(needed, 0);
        }
        &mut self.buffer[self.end..needed]
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, FrameError> {
        let available = &self.buffer[self.start..self.end];
        if available.len() < HEADER_LEN {
            if !MAGIC.starts_with(&available[..available.len().min(4)]) {
                return Err(FrameError::BadMagic);
            }
            return Ok(None);
        }
        let (kind, sequence, length) = self.parse_header(available)?;
        let end = HEADER_LEN + length as usize;
        if available.len() < end {
            return Ok(None);
        }
        if sequence != self.expected_sequence {
            return Err(FrameError::BadSequence {
                expected: self.expected_sequence,
                got: sequence,
            });
        }
        self.expected_sequence += 1;
        let payload = available[HEADER_LEN..end].to_vec();
        self.start += end;
        Ok(Some(Frame {
            kind,
            sequence,
            payload,
        }))
    }

    fn parse_header(&self, header: &[u8]) -> Result<(Kind, u64, u32), FrameError> {
        if header[0..4] != MAGIC {
            return Err(FrameError::BadMagic);
        }
        let version = u16::from_le_bytes([header[4], header[5]]);
        if version != u16::from(PROTOCOL_VERSION) {
            return Err(FrameError::BadVersion(version));
        }
        let raw_kind = u16::from_le_bytes([header[6], header[7]]);
        let kind = Kind::from_u16(raw_kind).ok_or(FrameError::UnknownKind(raw_kind))?;
        let sequence = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
        let length = u32::from_le_bytes(header[16..20].try_into().expect("4 bytes"));
        if length > self.cap {
            return Err(FrameError::TooLarge {
                length,
                cap: self.cap,
            });
        }
        Ok((kind, sequence, length))
    }

    fn bytes_wanted(&self) -> usize {
        let available = &self.buffer[self.start..self.end];
        if available.len() < HEADER_LEN {
            return HEADER_LEN - available.len();
        }
        match self.parse_header(available) {
            Ok((_, _, length)) => (HEADER_LEN + length as usize).saturating_sub(available.len()),
            Err(_) => 0,
        }
    }

    fn compact(&mut self) {
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        } else if self.start > 0 && self.start >= self.end / 2 {
            self.buffer.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, self.end - self.start);
        }
    }
}

/// An [`Error`] as it travels between ranks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireError {
    /// Its kind.
    pub kind: ErrorKind,
    /// The operation that failed.
    pub operation: String,
    /// The rank that raised it.
    pub rank: Option<u32>,
    /// The peer it is about.
    pub peer: Option<u32>,
    /// The message.
    pub message: String,
}

impl WireError {
    /// Captures an error for sending.
    pub fn from_error(error: &Error) -> Self {
        WireError {
            kind: error.kind(),
            operation: error.operation().to_string(),
            rank: error.rank().map(|r| r as u32),
            peer: error.peer().map(|p| p as u32),
            message: error.message().to_string(),
        }
    }

    /// Rebuilds the error on the receiving side.
    pub fn to_error(&self) -> Error {
        let mut error = Error::new(self.kind, self.operation.clone(), self.message.clone());
        if let Some(rank) = self.rank {
            error = error.on_rank(rank as usize);
        }
        if let Some(peer) = self.peer {
            error = error.with_peer(peer as usize);
        }
        error
    }

    /// Serialized form.
    pub fn encode(&self) -> Vec<u8> {
        postcard::to_stdvec(self).expect("a WireError always serializes")
    }

    /// Parses the serialized form; a garbled payload becomes a protocol error.
    pub fn decode(bytes: &[u8]) -> WireError {
        postcard::from_bytes(bytes).unwrap_or_else(|e| WireError {
            kind: ErrorKind::Protocol,
            operation: "control plane".into(),
            rank: None,
            peer: None,
            message: format!("an error report from a peer could not be decoded: {e}"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(kind: Kind, sequence: u64, payload: &[u8]) -> Vec<u8> {
        let mut bytes = Vec::new();
        write_frame(&mut bytes, kind, sequence, &[payload]).unwrap();
        bytes
    }

    #[test]
    fn frames_survive_any_split() {
        let mut stream = encoded(Kind::Send, 0, b"hello");
        stream.extend(encoded(Kind::Bye, 1, b""));
        for split in 0..stream.len() {
            let mut decoder = FrameDecoder::new(MAX_PAYLOAD);
            decoder.push(&stream[..split]);
            let mut frames = Vec::new();
            while let Some(frame) = decoder.next_frame().unwrap() {
                frames.push(frame);
            }
            decoder.push(&stream[split..]);
            while let Some(frame) = decoder.next_frame().unwrap() {
                frames.push(frame);
            }
            assert_eq!(frames.len(), 2);
            assert_eq!(frames[0].payload, b"hello");
            assert_eq!(frames[1].kind, Kind::Bye);
        }
    }

    /// Hands out at most `chunk` bytes per read.
    struct Trickle<'a> {
        bytes: &'a [u8],
        chunk: usize,
    }

    impl Read for Trickle<'_> {
        fn read(&mut self, into: &mut [u8]) -> io::Result<usize> {
            let n = self.chunk.min(into.len()).min(self.bytes.len());
            into[..n].copy_from_slice(&self.bytes[..n]);
            self.bytes = &self.bytes[n..];
            Ok(n)
        }
    }

    #[test]
    fn frames_read_in_any_chunks_come_out_whole_and_in_order() {
        // Frames of many sizes, so reads end mid-header, mid-payload and across frames, and the
        // buffer is compacted with bytes of an unfinished frame in it.
        let payloads: Vec<Vec<u8>> = (0..40u8)
            .map(|i| (0..usize::from(i) * 37).map(|j| i ^ j as u8).collect())
            .collect();
        let mut stream = Vec::new();
        for (sequence, payload) in payloads.iter().enumerate() {
            stream.extend(encoded(Kind::Send, sequence as u64, payload));
        }
        for chunk in [1, 2, 7, 64, 1000, 1 << 20] {
            let mut decoder = FrameDecoder::new(MAX_PAYLOAD);
            let mut source = Trickle {
                bytes: &stream,
                chunk,
            };
            let mut received = Vec::new();
            while decoder.read_from(&mut source).unwrap() > 0 {
                while let Some(frame) = decoder.next_frame().unwrap() {
                    received.push(frame.payload);
                }
            }
            assert_eq!(received, payloads, "chunks of {chunk} bytes");
            assert_eq!(decoder.buffered(), 0);
        }
    }

    #[test]
    fn rejects_junk_oversize_and_gaps() {
        let mut junk = FrameDecoder::new(MAX_HANDSHAKE_PAYLOAD);
        junk.push(b"GET / HTTP/1.1\r\n");
        assert_eq!(junk.next_frame(), Err(FrameError::BadMagic));

        let mut huge = FrameDecoder::new(MAX_HANDSHAKE_PAYLOAD);
        let mut header = encode_header(Kind::Hello, 0, u32::MAX).to_vec();
        header.truncate(HEADER_LEN);
        huge.push(&header);
        assert!(matches!(
            huge.next_frame(),
            Err(FrameError::TooLarge { .. })
        ));

        let mut gap = FrameDecoder::new(MAX_PAYLOAD);
        gap.push(&encoded(Kind::Bye, 5, b""));
        assert_eq!(
            gap.next_frame(),
            Err(FrameError::BadSequence {
                expected: 0,
                got: 5
            })
        );
    }

    #[test]
    fn wire_errors_round_trip() {
        let error = Error::peer_lost("allgather", 3, "connection closed").on_rank(1);
        let back = WireError::decode(&WireError::from_error(&error).encode()).to_error();
        assert_eq!(back.kind(), ErrorKind::PeerLost);
        assert_eq!(back.peer(), Some(3));
        assert_eq!(back.rank(), Some(1));
        assert_eq!(back.to_string(), error.to_string());
    }
}
