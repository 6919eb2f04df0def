//! Hardware profile TOML: an error or a profile that passes its own check, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(hw) = ficco_core::sim::profile::HwProfile::from_toml(text) {
        assert!(hw.check().is_ok());
    }
});
