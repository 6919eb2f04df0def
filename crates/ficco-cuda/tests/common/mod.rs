//! Helpers shared by the GPU tests (the integration tests here, and the
//! crate's own GPU unit tests, which include this file): the skip policy,
//! bf16 conversion, test data and the relative-error check.
//!
//! Skip policy: a test that cannot run prints `SKIPPED: <test>: <reason>` to
//! stderr. Where there is no usable GPU at all (no libraries, no device, the
//! device does not open) and `FICCO_REQUIRE_GPU=1` is set (every device run
//! sets it), the test fails instead. A machine with fewer GPUs than a test
//! needs (but at least one) still skips: that is the machine, not a lost GPU.
#![allow(dead_code)]

/// Whether `FICCO_REQUIRE_GPU=1` is set.
pub fn gpu_required() -> bool {
    std::env::var("FICCO_REQUIRE_GPU").is_ok_and(|v| v.trim() == "1")
}

/// What a test found when it looked for GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuAvailability {
    /// `found` GPUs with every library.
    Found(usize),
    /// No usable GPU: the reason (missing library, no device, open failed).
    Unusable(String),
}

/// Whether `test`, which needs `wanted` GPUs, can run. Prints the skip and
/// returns false when it cannot; panics (test failure) when no GPU is usable
/// and [`gpu_required`].
pub fn gate(test: &str, wanted: usize, found: GpuAvailability) -> bool {
    match found {
        GpuAvailability::Found(n) if n >= wanted => true,
        GpuAvailability::Found(n) if n > 0 => {
            eprintln!("SKIPPED: {test}: needs {wanted} GPUs, this machine has {n}");
            false
        }
        GpuAvailability::Found(_) => no_gpu(test, "no GPU found"),
        GpuAvailability::Unusable(reason) => no_gpu(test, &reason),
    }
}

/// Skips `test` for lack of a usable GPU, or fails it under [`gpu_required`].
pub fn no_gpu(test: &str, reason: &str) -> bool {
    if gpu_required() {
        panic!("{test}: FICCO_REQUIRE_GPU=1 but no usable GPU: {reason}");
    }
    eprintln!("SKIPPED: {test}: {reason}");
    false
}

/// f32 → bf16 bits, round to nearest even.
pub fn f2b(f: f32) -> u16 {
    if f.is_nan() {
        return 0x7fc0;
    }
    let u = f.to_bits();
    ((u + 0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

pub fn b2f(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// Deterministic ~U(-1,1) bf16 data.
pub fn rand(n: usize, seed: u64) -> Vec<u16> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            f2b(((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0)
        })
        .collect()
}

/// ||out - ref|| / ||ref||; infinite when `out` holds a NaN.
pub fn rel_err(out: &[f32], reference: &[f32]) -> f64 {
    let (mut d, mut r) = (0.0f64, 0.0f64);
    for (o, x) in out.iter().zip(reference) {
        if o.is_nan() {
            return f64::INFINITY;
        }
        d += ((*o - *x) as f64).powi(2);
        r += (*x as f64).powi(2);
    }
    (d / r.max(1e-30)).sqrt()
}

/// Every copy-engine schedule of `op` (the loopback design space), with and
/// without controls, named once.
pub fn copy_schedules(op: ficco_core::problem::workload::Op) -> Vec<ficco_core::space::Schedule> {
    use ficco_core::space::{enumerate, Engine, SpaceOptions};
    let mut out = vec![];
    for controls in [false, true] {
        let opts = SpaceOptions {
            controls,
            sm_count: 132,
            nccl_sms: 16,
        };
        for s in enumerate(op, opts) {
            if s.engine == Engine::Copy && !s.is_seq() && !out.contains(&s) {
                out.push(s);
            }
        }
    }
    out
}

#[cfg(test)]
mod policy_tests {
    use super::*;

    #[test]
    fn enough_gpus_run_and_too_few_skip() {
        assert!(gate("t", 1, GpuAvailability::Found(1)));
        assert!(gate("t", 2, GpuAvailability::Found(8)));
        // Fewer GPUs than needed is a skip even when a GPU is required.
        assert!(!gate("t", 2, GpuAvailability::Found(1)));
    }

    #[test]
    fn no_gpu_skips_or_fails_as_required() {
        let r = std::panic::catch_unwind(|| {
            gate(
                "t",
                1,
                GpuAvailability::Unusable("simulated, policy test".into()),
            )
        });
        if gpu_required() {
            assert!(
                r.is_err(),
                "a missing GPU must fail under FICCO_REQUIRE_GPU=1"
            );
        } else {
            assert!(!r.expect("no panic without FICCO_REQUIRE_GPU"));
        }
    }
}
