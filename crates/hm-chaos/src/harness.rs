//! Harnesses for the two parsers that read bytes from strangers: the control-plane
//! [`FrameDecoder`] (every byte a TCP peer sends before and after the handshake) and
//! [`UniqueId`] (bytes from the launcher environment or the world's control plane).
//!
//! Each harness panics on a broken invariant, never on bad input:
//! - the decoder returns frames in sequence, never a payload above its cap, and after it has
//!   been drained (until it needs more bytes) it holds less than one header plus one capped
//!   payload — so a 4 GiB length prefix costs nothing;
//! - a unique ID that parses has exactly one byte form and one text form, and both parse back
//!   to it; every parse failure is an `InvalidArgument` error.

use std::io::{self, Read};

use hyper_multicore::control::frame::{
    write_frame, FrameDecoder, FrameError, Kind, HEADER_LEN, MAX_HANDSHAKE_PAYLOAD, MAX_PAYLOAD,
};
use hyper_multicore::control::UniqueId;
use hyper_multicore::ErrorKind;

/// What feeding one byte stream to a decoder produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeSummary {
    /// Frames decoded before the stream ended or failed.
    pub frames: usize,
    /// The payload bytes of those frames, concatenated.
    pub payload_bytes: usize,
    /// Why decoding stopped early, if it did.
    pub error: Option<FrameError>,
    /// Most bytes the decoder held after being drained.
    pub max_buffered: usize,
}

/// How bytes reach the decoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feed {
    /// [`FrameDecoder::push`] of each chunk.
    Push,
    /// [`FrameDecoder::read_from`] a reader that returns at most one chunk per `read`.
    Read,
}

/// Feeds `stream` to a decoder with payload cap `cap`, in chunks whose sizes cycle through
/// `splits` (0 counts as 1; empty = one chunk), draining it after every chunk as the router
/// and the rendezvous do, and stopping at the first error as they do (they drop the
/// connection). Panics if an invariant breaks.
pub fn decode_in_chunks(cap: u32, stream: &[u8], splits: &[usize], feed: Feed) -> DecodeSummary {
    let mut decoder = FrameDecoder::new(cap);
    let mut summary = DecodeSummary {
        frames: 0,
        payload_bytes: 0,
        error: None,
        max_buffered: 0,
    };
    let bound = HEADER_LEN + cap as usize;
    let mut reader = ChunkReader {
        stream,
        offset: 0,
        splits,
        index: 0,
    };
    loop {
        let before = decoder.buffered();
        let added = match feed {
            Feed::Push => {
                let chunk = reader.next_chunk(usize::MAX);
                decoder.push(chunk);
                chunk.len()
            }
            Feed::Read => decoder
                .read_from(&mut reader)
                .expect("a slice reader never fails"),
        };
        if added == 0 {
            return summary;
        }
        assert_eq!(decoder.buffered(), before + added, "bytes went missing");
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => {
                    assert!(
                        frame.payload.len() <= cap as usize,
                        "a {}-byte payload passed the {cap}-byte cap",
                        frame.payload.len()
                    );
                    assert_eq!(
                        frame.sequence, summary.frames as u64,
                        "frame out of sequence"
                    );
                    summary.frames += 1;
                    summary.payload_bytes += frame.payload.len();
                }
                Ok(None) => break,
                Err(error) => {
                    summary.error = Some(error);
                    return summary;
                }
            }
        }
        let buffered = decoder.buffered();
        assert!(
            buffered < bound,
            "the drained decoder holds {buffered} bytes; one incomplete frame is below {bound}"
        );
        summary.max_buffered = summary.max_buffered.max(buffered);
    }
}

/// A reader over a slice that hands out chunks of the sizes in `splits`, cycling.
struct ChunkReader<'a> {
    stream: &'a [u8],
    offset: usize,
    splits: &'a [usize],
    index: usize,
}

impl<'a> ChunkReader<'a> {
    fn next_chunk(&mut self, room: usize) -> &'a [u8] {
        let left = self.stream.len() - self.offset;
        let wanted = match self.splits {
            [] => left,
            splits => splits[self.index % splits.len()].max(1),
        };
        self.index += 1;
        let take = wanted.min(left).min(room);
        let chunk = &self.stream[self.offset..self.offset + take];
        self.offset += take;
        chunk
    }
}

impl Read for ChunkReader<'_> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let chunk = self.next_chunk(buffer.len());
        buffer[..chunk.len()].copy_from_slice(chunk);
        Ok(chunk.len())
    }
}

/// The frames of a well-formed stream: `(kind, payload)` numbered from 0.
pub fn encode_frames(frames: &[(Kind, Vec<u8>)]) -> Vec<u8> {
    let mut stream = Vec::new();
    for (sequence, (kind, payload)) in frames.iter().enumerate() {
        write_frame(&mut stream, *kind, sequence as u64, &[payload]).expect("a Vec never fails");
    }
    stream
}

/// Every frame kind.
pub const KINDS: [Kind; 13] = [
    Kind::Hello,
    Kind::Welcome,
    Kind::Reject,
    Kind::Contribute,
    Kind::Outcome,
    Kind::Send,
    Kind::Abort,
    Kind::Bye,
    Kind::Exit,
    Kind::ExitAck,
    Kind::ExitNow,
    Kind::Heartbeat,
    Kind::Silent,
];

/// The cargo-fuzz entry for the frame decoder. Byte 0 picks the cap (the handshake cap, the
/// authenticated cap, or a small one) and whether the rest is raw bytes or a recipe of
/// well-formed frames followed by raw bytes; bytes 1–4 are chunk sizes. Both feeding paths run.
pub fn fuzz_frame_decoder(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let cap = match mode & 0x3f {
        0 => MAX_HANDSHAKE_PAYLOAD,
        1 => MAX_PAYLOAD,
        small => u32::from(small) * 8,
    };
    let (splits, body) = rest.split_at(rest.len().min(4));
    let splits: Vec<usize> = splits.iter().map(|&b| usize::from(b)).collect();
    let stream = if mode & 0x80 != 0 {
        recipe_stream(body)
    } else {
        body.to_vec()
    };
    let pushed = decode_in_chunks(cap, &stream, &splits, Feed::Push);
    let read = decode_in_chunks(cap, &stream, &splits, Feed::Read);
    assert_eq!(
        (pushed.frames, pushed.payload_bytes, &pushed.error),
        (read.frames, read.payload_bytes, &read.error),
        "push and read_from disagree"
    );
}

/// Turns fuzz bytes into mostly valid frames: each frame takes a kind byte, a length byte and
/// that many payload bytes; a kind byte of 0xff ends the recipe and the rest is appended raw.
fn recipe_stream(body: &[u8]) -> Vec<u8> {
    let mut frames = Vec::new();
    let mut rest = body;
    while let [kind, length, tail @ ..] = rest {
        if *kind == 0xff {
            break;
        }
        let take = usize::from(*length).min(tail.len());
        frames.push((
            KINDS[usize::from(*kind) % KINDS.len()],
            tail[..take].to_vec(),
        ));
        rest = &tail[take..];
    }
    let mut stream = encode_frames(&frames);
    stream.extend_from_slice(rest);
    stream
}

/// Lower-case hex, as [`UniqueId`]'s text form.
pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The cargo-fuzz entry for unique IDs: parses `data` as the byte form, as text, and as the hex
/// of the bytes, and checks that the forms agree.
pub fn fuzz_unique_id(data: &[u8]) {
    let parsed = UniqueId::from_bytes(data);
    match &parsed {
        Ok(id) => {
            assert_eq!(id.to_bytes(), data, "the byte form is not canonical");
            let text = id.to_string();
            assert_eq!(text.parse::<UniqueId>().expect("own text parses"), *id);
            assert_ne!(id.endpoint().port(), 0);
        }
        Err(error) => assert_eq!(error.kind(), ErrorKind::InvalidArgument, "{error}"),
    }
    let hex = to_hex(data);
    match hex.parse::<UniqueId>() {
        Ok(id) => assert_eq!(Some(&id), parsed.as_ref().ok(), "hex and bytes disagree"),
        Err(error) => {
            assert!(
                parsed.is_err(),
                "bytes parse but their hex does not: {error}"
            );
            assert_eq!(error.kind(), ErrorKind::InvalidArgument);
        }
    }
    if let Ok(text) = std::str::from_utf8(data) {
        match text.parse::<UniqueId>() {
            Ok(id) => assert_eq!(
                to_hex(&id.to_bytes()),
                text.trim().to_ascii_lowercase(),
                "the text form is not the hex of the byte form"
            ),
            Err(error) => assert_eq!(error.kind(), ErrorKind::InvalidArgument, "{error}"),
        }
    }
}
