//! Entry points of the cargo-fuzz targets in `fuzz/` (CUDA-free: the
//! runtime's parsers, reachable without a GPU). Each panics only when an
//! invariant of the parser breaks, which is what the fuzzer looks for.

use super::auth::{serve_challenge, JobSecret};
use super::store::{read_request, Request, MAX_FIELD};
use std::io::{Read, Write};

/// The fuzz targets' entry (`fuzz/fuzz_targets/store_frames.rs`): reads
/// `data` as a stream of frames the way a connection is served, and as the
/// answer to the challenge. Panics only when an invariant breaks: a field
/// over [`MAX_FIELD`] accepted, or a frame that does not read back as
/// itself.
pub fn store_frames(data: &[u8]) {
    let mut r = data;
    while let Ok(Some(req)) = read_request(&mut r) {
        let longest = match &req {
            Request::Set(k, v) => k.len().max(v.len()),
            Request::Add(k, _) | Request::Get(k, _) | Request::Abort(k) => k.len(),
            Request::Hello(_) | Request::Bye => 0,
        };
        assert!(longest <= MAX_FIELD as usize, "a field over MAX_FIELD");
        let again = read_request(&mut req.encode().as_slice());
        assert!(matches!(again, Ok(Some(ref a)) if *a == req), "{req:?}");
    }
    // The server's side of the challenge over the same bytes: a fixed-size
    // read, refused (no key of all zeros is the test's secret).
    struct Peer<'a>(&'a [u8]);
    impl Read for Peer<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            self.0.read(buf)
        }
    }
    impl Write for Peer<'_> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    if let Some(secret) = JobSecret::from_hex(&"00".repeat(32)) {
        // A random server nonce: arbitrary bytes cannot hold its proof.
        assert!(serve_challenge(&mut Peer(data), &secret).is_err());
    }
}

/// The descriptor sockets' control-message walker over arbitrary bytes:
/// never more descriptors than the bytes hold.
pub fn fd_message(data: &[u8]) {
    let parsed = super::fdpass::scm_rights(data);
    assert!(parsed.fds.len() <= data.len() / 4);
}
