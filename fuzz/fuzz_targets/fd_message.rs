//! The descriptor sockets' control messages (`SCM_RIGHTS`) under arbitrary
//! bytes: headers that claim huge or tiny lengths, unknown levels and
//! types, truncation. Never a panic, never a read outside the buffer,
//! never more descriptors than the bytes hold.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ficco_cuda::runtime::fuzzing::fd_message(data);
});
