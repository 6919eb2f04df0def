//! Writing a fitted hardware profile as TOML that
//! [`HwProfile::load`] reads back, with a comment header saying where it
//! comes from and how well it fits.

use super::Characterization;
use crate::sim::profile::HwProfile;
use std::fmt::Write as _;

/// The profile as TOML that [`HwProfile::load`] reads back, with a comment header.
pub fn profile_toml(hw: &HwProfile, ch: &Characterization) -> std::result::Result<String, String> {
    let body = toml::to_string(hw).map_err(|e| e.to_string())?;
    let mut head = String::new();
    let _ = writeln!(
        head,
        "# Hardware profile written by `ficco characterize` on {} ({:.0} s of measurements).",
        ch.device, ch.elapsed_s
    );
    if let Some(f) = &ch.fit {
        let _ = writeln!(
            head,
            "# Fitted over the built-in '{}'; fields not measured keep its values.",
            f.base
        );
        if let Some(g) = &f.gemm {
            let _ = writeln!(
                head,
                "# GEMM fit over {} samples: RMS log error {:.3} (base profile {:.3}).",
                g.samples, g.rms_log_err_fit, g.rms_log_err_base
            );
        }
        let _ = writeln!(
            head,
            "# gemm_slowdown_nccl excludes the nccl_sms SMs the simulator takes away (raw median {}).",
            f.gemm_slowdown_nccl_raw
                .map(|v| format!("{v:.3}"))
                .unwrap_or_else(|| "-".into())
        );
    }
    Ok(head + &body)
}
