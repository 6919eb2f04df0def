//! Schedule names: an error or a schedule whose canonical name parses back to it, never a panic.
#![no_main]
use ficco_core::space::{Schedule, SpaceOptions};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(name) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(s) = name.parse::<Schedule>() {
        assert_eq!(s.name().parse::<Schedule>().unwrap(), s);
        let space = SpaceOptions {
            controls: true,
            sm_count: 132,
            nccl_sms: 16,
        };
        for op in ficco_core::problem::workload::Op::ALL {
            let _ = s.outside(op, space);
        }
    }
});
