//! Suite TOML: an error or scenarios whose problems validate, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(suite) = ficco_core::problem::suite::parse(text, "fuzz") {
        for sc in &suite.scenarios {
            assert!(sc.problem.validate().is_ok(), "{sc:?}");
        }
    }
});
