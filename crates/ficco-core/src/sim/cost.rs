//! The cost model: pure functions from shapes and a [`HwProfile`] to times in
//! milliseconds. The simulator ([`crate::sim`]) uses the same pieces, so a
//! task that runs alone in a simulation takes exactly the time given here.
//!
//! Modelling assumptions:
//! - **GEMM** (`c[m,n] = a[m,k] @ b[k,n]`, bf16): the output is cut into tiles
//!   of one of the profile's shapes; each SM computes one tile at a time, so a
//!   GEMM on `s` SMs runs `waves = ceil(tiles / s)` waves, each taking
//!   `2·tm·tn·(k + k_overhead) / (sustained / sm_count)`. Partial tiles cost a
//!   full tile (tile quantization) and a partial last wave costs a full wave
//!   (wave quantization), which is what makes small chunks inefficient. A
//!   launch overhead is added, and the time is never below the HBM roofline.
//!   The tile shape and split-K factor (up to `gemm.max_split_k`, used only
//!   while output tiles leave SMs idle; each extra split writes and reads f32
//!   partials) are those that give the least time, as a library heuristic
//!   would pick.
//! - **Grouped GEMM** (a mixture-of-experts layer's experts in one kernel):
//!   the tiles of every group form one pool on the SMs, so only the whole
//!   kernel's last wave is quantized, not each group's; a tile of a group
//!   of depth k takes that group's tile time. One launch; the HBM floor is
//!   every group's operands; no split-K (grouped kernels do not split).
//! - **NCCL collectives**: `latency + bus bytes per rank / bus bandwidth`, with
//!   per-(collective, P) parameters fitted on measurements; bus bytes are
//!   nccl-tests' (`size·(P-1)/P`, twice that for all-reduce).
//! - **Grouped send/recv**: `latency + max(bytes sent, bytes received) / p2p bw`.
//! - **Copy engine**: `latency + bytes / min(copy-engine bw, usable NVLink bw)`.
//! - **Reduce**: `launch + (sources + 1)·bytes / HBM bandwidth` (read every
//!   source, write the result), at full bandwidth with `full_bw_sms` SMs.
//! - **Sequential reference**: collective then GEMM with no gap between them
//!   (the GEMM is launched behind the collective on the device).

use crate::problem::workload::{Collective, Op, Problem, ELEM_BYTES};
use crate::sim::profile::HwProfile;

const US: f64 = 1e-3;

/// Bytes per millisecond of a bandwidth in GB/s.
pub fn bytes_per_ms(gbs: f64) -> f64 {
    gbs * 1e6
}

/// How a GEMM is cut into tiles and waves on a given number of SMs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GemmCost {
    pub tile_m: usize,
    pub tile_n: usize,
    /// Split-K factor: each output tile is computed as this many pieces of
    /// depth k / split_k (1 = no split).
    pub split_k: usize,
    /// Work tiles (output tiles x split_k).
    pub tiles: usize,
    /// SMs the GEMM runs on.
    pub sms: usize,
    /// ceil(tiles / sms).
    pub waves: usize,
    /// Time of one wave (one tile per SM), ms.
    pub wave_ms: f64,
    /// Launch overhead, ms.
    pub launch_ms: f64,
    /// HBM roofline floor of the whole GEMM (excluding launch), ms.
    pub memory_ms: f64,
}

impl GemmCost {
    /// Total time alone: launch + max(waves x wave time, memory floor).
    pub fn total_ms(&self) -> f64 {
        self.launch_ms + (self.waves as f64 * self.wave_ms).max(self.memory_ms)
    }

    /// Time per wave once the memory floor is accounted for (the floor is
    /// spread over the waves), ms.
    pub fn effective_wave_ms(&self) -> f64 {
        let compute = self.waves as f64 * self.wave_ms;
        self.wave_ms * (self.memory_ms / compute).max(1.0)
    }
}

/// Time of one tile of `tm x tn` over depth `k`, ms (one SM).
pub fn tile_ms(hw: &HwProfile, tm: usize, tn: usize, k: usize) -> f64 {
    let per_sm_flops_per_ms = hw.gemm.sustained_tflops * 1e9 / hw.sm_count as f64;
    2.0 * tm as f64 * tn as f64 * (k as f64 + hw.gemm.k_overhead) / per_sm_flops_per_ms
}

/// The tiling with the least time for `m x k x n` on `sms` SMs (at least 1).
pub fn gemm_cost(hw: &HwProfile, m: usize, k: usize, n: usize, sms: usize) -> GemmCost {
    let sms = sms.clamp(1, hw.sm_count);
    // Sizes in f64: no product of shapes can overflow here, whatever the caller passes.
    let (mf, kf, nf) = (m as f64, k as f64, n as f64);
    let memory_ms = (mf * kf + kf * nf + mf * nf) * ELEM_BYTES as f64 / bytes_per_ms(hw.hbm_gbs);
    let mut best: Option<GemmCost> = None;
    for &[tm, tn] in &hw.gemm.tile_shapes {
        let out_tiles = m.div_ceil(tm).saturating_mul(n.div_ceil(tn));
        for split_k in 1..=hw.gemm.max_split_k.max(1) {
            // Split only while it fills idle SMs.
            if split_k > 1 && out_tiles.saturating_mul(split_k - 1) >= sms {
                break;
            }
            let tiles = out_tiles.saturating_mul(split_k);
            // f32 partials written and read back once more per extra split.
            let partials = (split_k - 1) as f64 * mf * nf * 8.0 / bytes_per_ms(hw.hbm_gbs);
            let c = GemmCost {
                tile_m: tm,
                tile_n: tn,
                split_k,
                tiles,
                sms,
                waves: tiles.div_ceil(sms),
                wave_ms: tile_ms(hw, tm, tn, k.div_ceil(split_k)),
                launch_ms: (hw.launch_us + hw.gemm.fixed_us) * US,
                memory_ms: memory_ms + partials,
            };
            if best.is_none_or(|b| c.total_ms() < b.total_ms()) {
                best = Some(c);
            }
        }
    }
    best.expect("profile has tile shapes")
}

/// The tiling with the least time for a grouped GEMM of `groups`
/// (m, k, n) on `sms` SMs (see the module doc). Empty groups cost nothing;
/// no groups at all cost nothing but the launch.
pub fn grouped_gemm_cost(hw: &HwProfile, groups: &[(usize, usize, usize)], sms: usize) -> GemmCost {
    let sms = sms.clamp(1, hw.sm_count);
    let memory_ms = groups
        .iter()
        .map(|&(m, k, n)| {
            let (mf, kf, nf) = (m as f64, k as f64, n as f64);
            (mf * kf + kf * nf + mf * nf) * ELEM_BYTES as f64
        })
        .sum::<f64>()
        / bytes_per_ms(hw.hbm_gbs);
    let mut best: Option<GemmCost> = None;
    for &[tm, tn] in &hw.gemm.tile_shapes {
        let mut tiles = 0usize;
        let mut busy = 0.0;
        for &(m, k, n) in groups {
            let t = m.div_ceil(tm).saturating_mul(n.div_ceil(tn));
            tiles = tiles.saturating_add(t);
            busy += t as f64 * tile_ms(hw, tm, tn, k);
        }
        let c = GemmCost {
            tile_m: tm,
            tile_n: tn,
            split_k: 1,
            tiles,
            sms,
            waves: tiles.div_ceil(sms),
            // The mean tile time: groups differ in depth only in general.
            wave_ms: if tiles > 0 { busy / tiles as f64 } else { 0.0 },
            launch_ms: (hw.launch_us + hw.gemm.fixed_us) * US,
            memory_ms,
        };
        if best.is_none_or(|b| c.total_ms() < b.total_ms()) {
            best = Some(c);
        }
    }
    best.expect("profile has tile shapes")
}

/// Non-empty groups from which the executor runs a grouped GEMM as one
/// kernel (ficco's grouped kernel, [`grouped_gemm_cost`]); fewer run as a
/// loop of GEMMs on one stream ([`loop_gemm_cost`]). Measured on one H200
/// (`ficco gemm-bench --grouped`, `bench/data/2026-11-23-h200-grouped/`):
/// with 16 to 128 experts the one kernel takes 0.19-0.92 of the loop's
/// time; with 2 to 8 large experts the loop is up to 35% faster.
pub const GROUPED_KERNEL_MIN_GROUPS: usize = 16;

/// A grouped GEMM as the executor runs it: one kernel from
/// [`GROUPED_KERNEL_MIN_GROUPS`] non-empty groups on, else a loop.
pub fn grouped_cost(hw: &HwProfile, groups: &[(usize, usize, usize)], sms: usize) -> GemmCost {
    let busy: Vec<(usize, usize, usize)> = groups.iter().copied().filter(|g| g.0 > 0).collect();
    if busy.len() >= GROUPED_KERNEL_MIN_GROUPS {
        grouped_gemm_cost(hw, groups, sms)
    } else {
        loop_gemm_cost(hw, &busy, sms)
    }
}

/// A loop of GEMMs on one stream, one per group, as one cost: each GEMM
/// pays its own launch and its own waves, the last one padded (its idle
/// SMs wait for the next GEMM): `waves` is the sum of the GEMMs' waves,
/// `tiles` those waves' slots, `wave_ms` their mean, and the memory floor
/// the sum of theirs (applied to the whole, not per GEMM). No group at all
/// costs one launch.
pub fn loop_gemm_cost(hw: &HwProfile, groups: &[(usize, usize, usize)], sms: usize) -> GemmCost {
    let sms = sms.clamp(1, hw.sm_count);
    let costs: Vec<GemmCost> = groups
        .iter()
        .map(|&(m, k, n)| gemm_cost(hw, m, k, n, sms))
        .collect();
    let waves: usize = costs.iter().map(|c| c.waves).sum();
    let busy: f64 = costs.iter().map(|c| c.waves as f64 * c.wave_ms).sum();
    let first = costs.first();
    let tile = hw.gemm.tile_shapes.first().copied().unwrap_or([128, 128]);
    GemmCost {
        tile_m: first.map_or(tile[0], |c| c.tile_m),
        tile_n: first.map_or(tile[1], |c| c.tile_n),
        split_k: 1,
        tiles: waves.saturating_mul(sms),
        sms,
        waves,
        wave_ms: if waves > 0 { busy / waves as f64 } else { 0.0 },
        launch_ms: if costs.is_empty() {
            (hw.launch_us + hw.gemm.fixed_us) * US
        } else {
            costs.iter().map(|c| c.launch_ms).sum()
        },
        memory_ms: costs.iter().map(|c| c.memory_ms).sum(),
    }
}

/// GEMM time alone on `sms` SMs, ms.
pub fn gemm_ms(hw: &HwProfile, m: usize, k: usize, n: usize, sms: usize) -> f64 {
    gemm_cost(hw, m, k, n, sms).total_ms()
}

/// Bus bytes per rank of a collective whose NCCL "size" is `size` bytes.
pub fn bus_bytes(coll: Collective, size: usize, gpus: usize) -> f64 {
    let f = (gpus - 1) as f64 / gpus as f64;
    match coll {
        Collective::AllGather | Collective::ReduceScatter => size as f64 * f,
        Collective::AllReduce => 2.0 * size as f64 * f,
    }
}

/// Time of one NCCL collective over `gpus` ranks whose NCCL "size" (the
/// gathered buffer for all-gather, the input for reduce-scatter, the buffer
/// for all-reduce) is `size` bytes, ms.
pub fn collective_ms(hw: &HwProfile, coll: Collective, size: usize, gpus: usize) -> f64 {
    let (lat, bw) = collective_protocol(hw, coll, size, gpus);
    lat + bus_bytes(coll, size, gpus) / bw
}

/// The (latency in ms, bus bandwidth in bytes/ms) of the faster protocol for
/// a collective of `size` bytes: the calibrated per-(collective, P) one, or
/// the low-latency one (`nccl.ll_*`) when the profile has it and it is faster.
pub fn collective_protocol(
    hw: &HwProfile,
    coll: Collective,
    size: usize,
    gpus: usize,
) -> (f64, f64) {
    let p = hw.collective(coll, gpus);
    let simple = (p.latency_us * US, bytes_per_ms(p.bus_gbs));
    let bus = bus_bytes(coll, size, gpus);
    match (hw.nccl.ll_latency_us, hw.nccl.ll_bus_gbs) {
        (Some(l), Some(b)) => {
            let ll = (l * US, bytes_per_ms(b));
            if ll.0 + bus / ll.1 < simple.0 + bus / simple.1 {
                ll
            } else {
                simple
            }
        }
        _ => simple,
    }
}

/// Time of one grouped NCCL send/recv step in which a rank sends `sent` and
/// receives `received` bytes, ms.
pub fn sendrecv_ms(hw: &HwProfile, sent: usize, received: usize) -> f64 {
    hw.nccl.p2p_latency_us * US + sent.max(received) as f64 / bytes_per_ms(hw.nccl.p2p_bus_gbs)
}

/// Bandwidth of one copy-engine transfer alone, GB/s.
pub fn copy_gbs(hw: &HwProfile) -> f64 {
    hw.copy_engine.bw_gbs.min(hw.nvlink.usable_gbs)
}

/// Time of one copy-engine transfer of `bytes` alone (peer or local), ms.
pub fn copy_ms(hw: &HwProfile, bytes: usize) -> f64 {
    hw.copy_engine.latency_us * US + bytes as f64 / bytes_per_ms(copy_gbs(hw))
}

/// (latency ms, bandwidth GB/s) of one copy alone: pushes (the issuing GPU
/// writes) use `bw_gbs`/`latency_us`, pulls the `pull_*` values when set.
pub fn copy_params(hw: &HwProfile, pull: bool) -> (f64, f64) {
    let ce = &hw.copy_engine;
    if pull {
        (
            ce.pull_latency_us.unwrap_or(ce.latency_us) * US,
            ce.pull_bw_gbs
                .unwrap_or(ce.bw_gbs)
                .min(hw.nvlink.usable_gbs),
        )
    } else {
        (ce.latency_us * US, copy_gbs(hw))
    }
}

/// Time of a reduce kernel summing `srcs` views of `bytes` each into one, ms.
pub fn reduce_ms(hw: &HwProfile, srcs: usize, bytes: usize) -> f64 {
    hw.reduce.launch_us * US + ((srcs + 1) * bytes) as f64 / bytes_per_ms(hw.hbm_gbs)
}

/// The GEMM(s) of the sequential reference alone (all SMs), ms. For ag-gemm
/// this is the gathered [M, K] x [K, N]; for `concurrent`, all its GEMMs;
/// for the MoE operators, the busiest rank's grouped GEMM over every
/// expert segment it holds.
pub fn problem_gemm_ms(hw: &HwProfile, p: &Problem) -> f64 {
    if let Some(rt) = p.routing() {
        return (0..p.gpus)
            .map(|q| {
                let groups: Vec<(usize, usize, usize)> = (0..p.gpus)
                    .flat_map(|r| rt.segments(r, q))
                    .map(|(_, _, rows)| (rows, p.k, p.n))
                    .collect();
                grouped_cost(hw, &groups, hw.sm_count).total_ms()
            })
            .fold(0.0, f64::max);
    }
    gemm_ms(hw, p.m, p.k, p.n, hw.sm_count) * p.gemm_count() as f64
}

/// The collective of the sequential reference alone, ms. For the MoE
/// operators, the all-to-all as one grouped send/recv step of the busiest
/// rank's bytes ([`Problem::comm_bytes`]) at the send/recv bandwidth,
/// capped per peer as the simulator does (the own block, a local copy,
/// is not counted).
pub fn problem_comm_ms(hw: &HwProfile, p: &Problem) -> f64 {
    if p.op.is_moe() {
        let bytes = p.comm_bytes() as f64;
        let (lat_us, peer_gbs) = hw.p2p(p.gpus);
        let per_peer = peer_gbs.map_or(f64::INFINITY, |g| g * (p.gpus - 1) as f64);
        let bw = bytes_per_ms(hw.nccl.p2p_bus_gbs.min(per_peer));
        return lat_us * US + bytes / bw;
    }
    collective_ms(hw, p.collective(), p.comm_bytes(), p.gpus)
}

/// The sequential reference: collective then GEMM (ag-gemm), or GEMM then
/// collective (gemm-rs, gemm-ar), with no gap, ms.
pub fn problem_seq_ms(hw: &HwProfile, p: &Problem) -> f64 {
    match p.op {
        Op::AgGemm | Op::GemmRs | Op::GemmAr | Op::Concurrent | Op::A2aGemm | Op::GemmA2a => {
            problem_comm_ms(hw, p) + problem_gemm_ms(hw, p)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hw() -> HwProfile {
        HwProfile::builtin("h200-nvlink").unwrap()
    }

    #[test]
    fn waves_quantize() {
        let mut hw = hw();
        hw.gemm.tile_shapes = vec![[128, 128]];
        let one = gemm_cost(&hw, 128 * 12, 4096, 128 * 11, 132);
        assert_eq!(one.waves, 1);
        let c = gemm_cost(&hw, 128 * 12, 4096, 128 * 12, 132);
        assert_eq!(c.waves, 2);
        assert!(c.total_ms() > 1.9 * (one.total_ms() - one.launch_ms));
        // Fewer SMs, more waves.
        assert!(
            gemm_ms(&hw, 4096, 4096, 4096, 66) > 1.9 * gemm_ms(&hw, 4096, 4096, 4096, 132) - 0.01
        );
    }

    #[test]
    fn small_chunks_are_less_efficient() {
        let hw = hw();
        let whole = gemm_ms(&hw, 8192, 8192, 2560, 132);
        let chunks = 32.0 * gemm_ms(&hw, 256, 8192, 2560, 132);
        assert!(chunks > 1.1 * whole, "{chunks} vs {whole}");
    }

    #[test]
    fn mission_bandwidths() {
        let hw = hw();
        // 256 MiB copy GPU0->1: 0.69 ms measured.
        let t = copy_ms(&hw, 256 << 20);
        assert!((t - 0.69).abs() < 0.03, "{t}");
        // All-gather, 32 MiB per rank, 4 GPUs: 0.35 ms measured.
        let t = collective_ms(&hw, Collective::AllGather, 4 * (32 << 20), 4);
        assert!((t - 0.35).abs() < 0.05, "{t}");
    }
}
