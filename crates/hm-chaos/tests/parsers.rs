//! The parsers that read strangers' bytes, on stable: property tests over arbitrary bytes and
//! arbitrary splits, and a replay of the cargo-fuzz corpus (`fuzz/corpus/`) through the very
//! harnesses the fuzz targets run.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

use hm_chaos::harness::{
    decode_in_chunks, encode_frames, fuzz_frame_decoder, fuzz_unique_id, to_hex, Feed, KINDS,
};
use hyper_multicore::control::frame::{
    encode_header, FrameDecoder, FrameError, HEADER_LEN, MAX_HANDSHAKE_PAYLOAD, MAX_PAYLOAD,
};
use hyper_multicore::control::UniqueId;
use proptest::prelude::*;

fn caps() -> impl Strategy<Value = u32> {
    prop_oneof![Just(MAX_HANDSHAKE_PAYLOAD), Just(MAX_PAYLOAD), 0u32..200]
}

fn frames() -> impl Strategy<Value = Vec<(usize, Vec<u8>)>> {
    prop::collection::vec(
        (0..KINDS.len(), prop::collection::vec(any::<u8>(), 0..300)),
        0..12,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Arbitrary bytes in arbitrary chunks: no panic, and after every drain less than one
    /// header plus one capped payload stays buffered (asserted inside the harness).
    #[test]
    fn arbitrary_bytes_never_panic_and_stay_bounded(
        cap in caps(),
        stream in prop::collection::vec(any::<u8>(), 0..2048),
        splits in prop::collection::vec(0usize..64, 0..6),
    ) {
        for feed in [Feed::Push, Feed::Read] {
            let summary = decode_in_chunks(cap, &stream, &splits, feed);
            prop_assert!(summary.max_buffered < HEADER_LEN + cap as usize);
        }
    }

    /// Well-formed frames come back exactly, whatever the split, on both feeding paths.
    #[test]
    fn well_formed_frames_survive_any_split(
        frames in frames(),
        splits in prop::collection::vec(0usize..97, 0..6),
    ) {
        let frames: Vec<_> = frames.into_iter().map(|(k, p)| (KINDS[k], p)).collect();
        let stream = encode_frames(&frames);
        for feed in [Feed::Push, Feed::Read] {
            let summary = decode_in_chunks(MAX_HANDSHAKE_PAYLOAD, &stream, &splits, feed);
            prop_assert_eq!(summary.error, None);
            prop_assert_eq!(summary.frames, frames.len());
            prop_assert_eq!(summary.payload_bytes, frames.iter().map(|f| f.1.len()).sum::<usize>());
        }
        let mut decoder = FrameDecoder::new(MAX_HANDSHAKE_PAYLOAD);
        decoder.push(&stream);
        for (sequence, (kind, payload)) in frames.iter().enumerate() {
            let frame = decoder.next_frame().unwrap().unwrap();
            prop_assert_eq!((frame.kind, frame.sequence, &frame.payload), (*kind, sequence as u64, payload));
        }
        prop_assert_eq!(decoder.next_frame(), Ok(None));
    }

    /// Where a stream goes wrong does not depend on how it was cut.
    #[test]
    fn the_verdict_does_not_depend_on_the_split(
        cap in caps(),
        frames in frames(),
        junk in prop::collection::vec(any::<u8>(), 0..64),
        a in prop::collection::vec(0usize..50, 0..5),
        b in prop::collection::vec(0usize..50, 0..5),
    ) {
        let mut stream = encode_frames(&frames.into_iter().map(|(k, p)| (KINDS[k], p)).collect::<Vec<_>>());
        stream.extend(junk);
        let one = decode_in_chunks(cap, &stream, &a, Feed::Push);
        let two = decode_in_chunks(cap, &stream, &b, Feed::Read);
        prop_assert_eq!((one.frames, one.error), (two.frames, two.error));
    }

    /// A length prefix above the cap is refused as soon as the header is in, with nothing
    /// more buffered than the header: a 4 GiB prefix costs 20 bytes.
    #[test]
    fn oversized_prefixes_cost_one_header(cap in caps(), excess in 1u64..=u64::from(u32::MAX)) {
        let length = (u64::from(cap) + excess).min(u64::from(u32::MAX)) as u32;
        prop_assume!(length > cap);
        let mut decoder = FrameDecoder::new(cap);
        decoder.push(&encode_header(KINDS[0], 0, length));
        prop_assert_eq!(decoder.next_frame(), Err(FrameError::TooLarge { length, cap }));
        prop_assert_eq!(decoder.buffered(), HEADER_LEN);
    }

    /// The fuzz entry points on arbitrary input.
    #[test]
    fn fuzz_entries_hold_on_arbitrary_input(data in prop::collection::vec(any::<u8>(), 0..600)) {
        fuzz_frame_decoder(&data);
        fuzz_unique_id(&data);
    }

    /// Every valid unique ID round-trips through bytes and text.
    #[test]
    fn valid_unique_ids_round_trip(
        v6 in any::<bool>(),
        v4 in any::<[u8; 4]>(),
        v6_octets in any::<[u8; 16]>(),
        port in 1u16..,
        secret in any::<[u8; 16]>(),
    ) {
        let ip = if v6 { IpAddr::V6(Ipv6Addr::from(v6_octets)) } else { IpAddr::V4(Ipv4Addr::from(v4)) };
        prop_assume!(!ip.is_unspecified());
        let id = UniqueId::new(SocketAddr::new(ip, port), secret);
        fuzz_unique_id(&id.to_bytes());
        fuzz_unique_id(id.to_string().as_bytes());
        prop_assert_eq!(UniqueId::from_bytes(&id.to_bytes()).unwrap(), id.clone());
        prop_assert_eq!(to_hex(&id.to_bytes()).to_uppercase().parse::<UniqueId>().unwrap(), id);
    }

    /// Arbitrary text: no panic, and only `InvalidArgument` errors.
    #[test]
    fn arbitrary_text_never_panics(text in ".{0,80}") {
        fuzz_unique_id(text.as_bytes());
    }
}

/// Replays every file of `fuzz/corpus/<target>` (seeds and whatever fuzzing added).
fn replay(target: &str, harness: fn(&[u8])) -> usize {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target);
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let outcome = std::panic::catch_unwind(|| harness(&data));
        assert!(outcome.is_ok(), "{} broke the harness", path.display());
        count += 1;
    }
    count
}

#[test]
fn the_frame_decoder_corpus_replays() {
    assert!(replay("frame_decoder", fuzz_frame_decoder) >= 12);
}

#[test]
fn the_unique_id_corpus_replays() {
    assert!(replay("unique_id", fuzz_unique_id) >= 13);
}
