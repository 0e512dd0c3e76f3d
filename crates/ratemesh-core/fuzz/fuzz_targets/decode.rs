//! Feeds arbitrary bytes to the peer frame decoder. It must never panic, and whatever it accepts
//! must be canonical: it re-encodes to exactly the input, which decodes to the same frame again.

#![no_main]

use libfuzzer_sys::fuzz_target;
use ratemesh_core::wire::{decode, encode};

const FRAME_LEN_MAX: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    if let Ok(frame) = decode(data, FRAME_LEN_MAX) {
        let bytes = encode(&frame, FRAME_LEN_MAX).expect("a decoded frame re-encodes within the bound");
        assert_eq!(bytes, data, "decode accepted a non-canonical encoding");
        let again = decode(&bytes, FRAME_LEN_MAX).expect("a re-encoded frame decodes");
        assert_eq!(again, frame, "re-encoding changed the frame");
    }
});
