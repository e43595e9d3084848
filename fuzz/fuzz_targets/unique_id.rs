//! Arbitrary bytes and text as a unique ID: no panic, one canonical byte and text form.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| hm_chaos::harness::fuzz_unique_id(data));
