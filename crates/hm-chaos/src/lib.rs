//! Library side of `hm-chaos`: the harnesses that the cargo-fuzz targets (`fuzz/`), the property
//! tests and the corpus replay share, so a fuzz finding replays on stable in CI exactly as the
//! fuzzer ran it.
//!
//! ```
//! // Any bytes: no panic, and the decoder never buffers more than one incomplete frame.
//! hm_chaos::harness::fuzz_frame_decoder(b"\x00\x07HMCP\x01\x00\x01\x00");
//! hm_chaos::harness::fuzz_unique_id(b"\x01\x04\x7f\x00\x00\x01\x0f\xa0");
//! ```
//!
//! The suite itself (fault points, soak, bootstrap abuse) is the `hm-chaos` binary.

#![deny(unsafe_code)]

pub mod harness;
