//! Arbitrary bytes, in arbitrary chunks, into the control-plane frame decoder: no panic, frames
//! in sequence and under the cap, never more than one incomplete frame buffered.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| hm_chaos::harness::fuzz_frame_decoder(data));
