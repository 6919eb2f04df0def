//! ficco's own Hopper GEMM (`-own`, `-smN`, `-occS`) in the cost model.
//!
//! The kernel was measured beside the autotuned cuBLASLt by `ficco
//! gemm-bench`, both in one run on fresh random data, over every whole and
//! chunk GEMM of the llama3 suite (the profile's `own_gemm.points`). The
//! model keeps the calibrated cuBLASLt wave model ([`cost::gemm_cost`]: tiles,
//! waves on the SMs the GEMM may use, launch, HBM floor) and multiplies its
//! wave time by ficco's time over cuBLASLt's on that shape:
//!
//! - a measured shape takes its own ratio, `cuBLASLt TFLOP/s / ficco TFLOP/s`;
//! - another shape takes the geometric mean of the ratios of the
//!   [`NEIGHBOURS`] nearest measured shapes, weighted by 1 / d², where d is
//!   the distance in (log₂ M, log₂ N, log₂ K): GEMM efficiency follows the
//!   shape's scale (wave quantization, split-K, K depth per tile), not its
//!   absolute size;
//! - a profile without points takes `own_gemm.default_ratio` (1: as fast as
//!   cuBLASLt).
//!
//! Ratios measured in one run compare the two engines at one clock (the GPU's
//! clock follows its power draw), which is why the table holds both engines'
//! throughput rather than ficco's alone. `-occS` multiplies by the stage
//! count's `own_gemm.stage_slowdown`. An SM budget (`-smN`) or a green context
//! enters through the wave model's SM count, as for cuBLASLt's SM target.

use crate::sim::cost::{self, GemmCost};
use crate::sim::profile::HwProfile;

/// Measured shapes an unmeasured shape's ratio is interpolated from.
pub const NEIGHBOURS: usize = 4;

/// ficco's GEMM time over cuBLASLt's for `m × k × n` (row-major
/// `[m,k]·[k,n]`) on the whole device, from the profile's measurements.
pub fn time_ratio(hw: &HwProfile, m: usize, k: usize, n: usize) -> f64 {
    let own = &hw.own_gemm;
    let at = |p: &[f64; 5]| p[4] / p[3];
    let q = [log2(m), log2(n), log2(k)];
    let mut near: Vec<(f64, usize)> = own
        .points
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let d2 = (0..3).map(|j| (log2f(p[j]) - q[j]).powi(2)).sum::<f64>();
            (d2, i)
        })
        .collect();
    if near.is_empty() {
        return own.default_ratio;
    }
    // Nearest first; ties by table order, so the result does not depend on sorting.
    near.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    if near[0].0 == 0.0 {
        return at(&own.points[near[0].1]);
    }
    let (mut wsum, mut lsum) = (0.0, 0.0);
    for &(d2, i) in near.iter().take(NEIGHBOURS) {
        let w = 1.0 / d2;
        wsum += w;
        lsum += w * at(&own.points[i]).ln();
    }
    (lsum / wsum).exp()
}

/// The `-occS` time multiplier of `stages` pipeline stages (1 when the
/// profile does not list that count, or without `-occS`).
pub fn stage_factor(hw: &HwProfile, stages: Option<usize>) -> f64 {
    let Some(s) = stages else { return 1.0 };
    hw.own_gemm
        .stage_slowdown
        .iter()
        .find(|e| e[0] == s as f64)
        .map_or(1.0, |e| e[1])
}

/// ficco's kernel on `m × k × n` with at most `sms` SMs and `stages`
/// (`-occS`): the cuBLASLt wave model with every wave [`time_ratio`] ×
/// [`stage_factor`] as long. The HBM floor and the launch stay: no kernel
/// beats them.
pub fn gemm_cost(
    hw: &HwProfile,
    m: usize,
    k: usize,
    n: usize,
    sms: usize,
    stages: Option<usize>,
) -> GemmCost {
    let mut c = cost::gemm_cost(hw, m, k, n, sms);
    c.wave_ms *= time_ratio(hw, m, k, n) * stage_factor(hw, stages);
    c
}

/// ficco's kernel's time alone, ms.
pub fn gemm_ms(
    hw: &HwProfile,
    m: usize,
    k: usize,
    n: usize,
    sms: usize,
    stages: Option<usize>,
) -> f64 {
    gemm_cost(hw, m, k, n, sms, stages).total_ms()
}

fn log2(x: usize) -> f64 {
    log2f(x as f64)
}

fn log2f(x: f64) -> f64 {
    x.max(1.0).log2()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hw(points: Vec<[f64; 5]>) -> HwProfile {
        let mut hw = HwProfile::builtin("h200-nvlink").unwrap();
        hw.own_gemm.points = points;
        hw.own_gemm.stage_slowdown = vec![[2.0, 1.5]];
        hw
    }

    #[test]
    fn measured_shapes_take_their_ratio() {
        let hw = hw(vec![
            [1024.0, 1024.0, 1024.0, 500.0, 600.0],
            [4096.0, 1024.0, 1024.0, 600.0, 600.0],
        ]);
        // 600 / 500: ficco 1.2x slower.
        assert!((time_ratio(&hw, 1024, 1024, 1024) - 1.2).abs() < 1e-12);
        assert!((time_ratio(&hw, 4096, 1024, 1024) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn between_two_shapes_the_geometric_mean() {
        let hw = hw(vec![
            [1024.0, 1024.0, 1024.0, 500.0, 600.0],
            [4096.0, 1024.0, 1024.0, 600.0, 600.0],
        ]);
        // M = 2048 is one octave from each: equal weights, sqrt(1.2 x 1.0).
        let r = time_ratio(&hw, 2048, 1024, 1024);
        assert!((r - 1.2f64.sqrt()).abs() < 1e-12, "{r}");
        // M = 1448 ≈ 2^10.5 is 0.5 octave from the first, 1.5 from the second:
        // weights 4 and 4/9, so ln r = (4 ln 1.2) / (4 + 4/9) = 0.9 ln 1.2.
        let r = time_ratio(&hw, 1448, 1024, 1024);
        let want = (0.9 * 1.2f64.ln()).exp();
        assert!((r - want).abs() < 2e-3, "{r} vs {want}");
    }

    #[test]
    fn only_the_nearest_four_count() {
        let mut pts: Vec<[f64; 5]> = (0..4)
            .map(|i| [1024.0 * (1 << i) as f64, 1024.0, 1024.0, 500.0, 500.0])
            .collect();
        // A far, very slow shape does not move the estimate near the others.
        pts.push([1024.0, 65536.0, 65536.0, 100.0, 500.0]);
        let r = time_ratio(&hw(pts), 3000, 1024, 1024);
        assert!((r - 1.0).abs() < 1e-12, "{r}");
    }

    #[test]
    fn without_points_the_default_ratio() {
        let mut h = hw(vec![]);
        assert_eq!(time_ratio(&h, 64, 64, 64), 1.0);
        h.own_gemm.default_ratio = 1.25;
        assert_eq!(time_ratio(&h, 64, 64, 64), 1.25);
    }

    #[test]
    fn the_wave_model_scaled_by_ratio_and_stages() {
        let h = hw(vec![[8192.0, 8192.0, 8192.0, 700.0, 770.0]]);
        let base = cost::gemm_cost(&h, 8192, 8192, 8192, 132);
        let own = gemm_cost(&h, 8192, 8192, 8192, 132, None);
        assert_eq!((own.tiles, own.waves), (base.tiles, base.waves));
        assert!((own.wave_ms - base.wave_ms * 1.1).abs() < 1e-12);
        // Compute-bound: launch + waves x wave time, by hand.
        let want = base.launch_ms + base.waves as f64 * base.wave_ms * 1.1;
        assert!((gemm_ms(&h, 8192, 8192, 8192, 132, None) - want).abs() < 1e-9);
        // Two stages: 1.5x more per wave; three stages are not listed: 1.
        let two = gemm_cost(&h, 8192, 8192, 8192, 132, Some(2));
        assert!((two.wave_ms - base.wave_ms * 1.1 * 1.5).abs() < 1e-12);
        assert_eq!(stage_factor(&h, Some(3)), 1.0);
        // An SM budget: the wave model's waves on fewer SMs.
        let half = gemm_cost(&h, 8192, 8192, 8192, 66, None);
        assert!(
            half.waves >= 2 * own.waves - 1,
            "{} vs {}",
            half.waves,
            own.waves
        );
    }

    #[test]
    fn the_embedded_h200_table_is_the_2026_11_24_bench() {
        let h = HwProfile::builtin("h200-nvlink").unwrap();
        assert_eq!(h.own_gemm.points.len(), 161);
        // 8192^3: the autotuned pick at 648.6 TFLOP/s against cuBLASLt's 641.8.
        let r = time_ratio(&h, 8192, 8192, 8192);
        assert!((r - 641.8 / 648.6).abs() < 1e-9, "{r}");
        // 64 x 4096 x 3584 (the 64 x 128 tile): 127.7 / 132.0.
        assert!((time_ratio(&h, 64, 3584, 4096) - 127.7 / 132.0).abs() < 1e-9);
        assert!((stage_factor(&h, Some(2)) - 1.476).abs() < 1e-12);
    }
}
