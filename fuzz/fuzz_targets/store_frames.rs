//! The rendezvous store's frames and challenge under arbitrary bytes:
//! truncated frames, huge lengths, unknown opcodes. Never a panic, never a
//! field over MAX_FIELD, every frame read back as itself, no proof forged.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ficco_cuda::runtime::fuzzing::store_frames(data);
});
