//! Hardware profiles: the named, file-backed description of a multi-GPU node
//! that the cost model ([`crate::sim::cost`]) and the simulator ([`crate::sim`])
//! read. This is the "network + compute hardware" layer in ASTRA-sim's terms.
//!
//! A profile is a TOML file. Two are built in (embedded from
//! `crates/ficco-core/profiles/`):
//!
//! - `h200-nvlink`: 4x H200 on NVSwitch, calibrated against the 60 measured
//!   scenarios of `data/anchor-h200x4.jsonl` and bandwidths measured on the
//!   device (one 256 MiB peer copy at 390 GB/s, 0.69 ms; about 400 GB/s into
//!   one GPU from three peers).
//! - `h100-nvlink`: `h200-nvlink`'s model (the same die, NVLink and NCCL)
//!   with H100's memory, its GEMM values refit on `ficco soak` on 4 H100s
//!   (`tests/sim_h100.rs`).
//!
//! Any other profile is a TOML file with the same fields; [`HwProfile::load`]
//! takes a built-in name or a path. Units are in the field names: `_us`
//! microseconds, `_gbs` GB/s (1e9 bytes per second), `_tflops` 1e12 FLOP/s.
//!
//! Modelling assumptions the fields encode:
//! - Full-switch topology: every GPU reaches every other at the same speed,
//!   and the bottleneck is each GPU's NVLink egress and ingress.
//! - NCCL collectives run at a per-(collective, P) bus bandwidth after a fixed
//!   latency, and their kernels hold `nccl_sms` SMs while they run.
//! - Contention is a set of constant time multipliers (see [`Contention`]).

use crate::error::{Error, Result};
use crate::problem::workload::{Collective, Problem};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// GEMM efficiency parameters (see [`crate::sim::cost::gemm_cost`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GemmParams {
    /// Output tile shapes `[rows, cols]` a cuBLASLt-like library may pick; the
    /// model takes whichever gives the least time.
    pub tile_shapes: Vec<[usize; 2]>,
    /// Whole-GPU throughput at which full tiles complete, TFLOP/s.
    pub sustained_tflops: f64,
    /// Per-tile fixed cost (prologue, epilogue) as extra K elements.
    pub k_overhead: f64,
    /// Largest split-K factor the library may use when output tiles leave
    /// SMs idle (1 = never split).
    pub max_split_k: usize,
    /// Persistent kernels (Hopper cuBLASLt): the GEMM launches
    /// min(tiles, SMs) blocks that each keep their SM until they have
    /// computed all their tiles, so other kernels (even on high-priority
    /// streams) only get SMs in the GEMM's tail. Default false: every tile
    /// is a block and high-priority kernels are resident at once.
    #[serde(default)]
    pub persistent: bool,
    /// With `persistent`: a GEMM with fewer tiles than SMs still occupies
    /// every SM it may use (split-K / stream-K spread its work over them) for
    /// its whole time, so a GEMM on another stream cannot fill the gap.
    /// Default false.
    #[serde(default)]
    pub full_grid: bool,
    /// Fixed cost of a GEMM besides its tiles (prologue, tile-scheduler
    /// setup, epilogue drain), µs, charged once per GEMM. Default 0.
    #[serde(default)]
    pub fixed_us: f64,
}

/// NVLink of one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkParams {
    /// Only "switch" (full NVSwitch crossbar) is modelled.
    pub topology: String,
    /// Spec bandwidth per direction per GPU, GB/s (documentation).
    pub bw_gbs: f64,
    /// Bandwidth transfers reach per direction per GPU, GB/s: the capacity of
    /// each GPU's egress and of its ingress in the simulator.
    pub usable_gbs: f64,
    /// One-way latency, µs.
    pub latency_us: f64,
    /// With it, a plan's plain cross-rank dependencies run as the GPU
    /// executor runs them (`plan::signal`): the producer's stream writes a
    /// flag (`latency_us`, holding that stream), and the consumer's stream
    /// starts its next task this long after the flag lands (stream-wait
    /// polling, the launch behind it), µs; Wait tasks take it too. Default:
    /// none (dependencies are seen at once, Waits take no time).
    #[serde(default)]
    pub flag_wait_us: Option<f64>,
}

/// DMA copy engines of one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CopyEngineParams {
    /// Copy engines usable for peer copies (asyncEngineCount).
    pub count: usize,
    /// Bandwidth of one copy engine, GB/s.
    pub bw_gbs: f64,
    /// Fixed cost of one copy (launch and DMA setup), µs.
    pub latency_us: f64,
    /// Bandwidth of one copy that pulls (the issuing GPU reads a peer's
    /// memory), GB/s; remote reads reach less than pushes. Default `bw_gbs`.
    #[serde(default)]
    pub pull_bw_gbs: Option<f64>,
    /// Fixed cost of one pulling copy, µs. Default `latency_us`.
    #[serde(default)]
    pub pull_latency_us: Option<f64>,
    /// Aggregate bandwidth of the copies one GPU issues while two or more of
    /// them move bytes at once (to or from different peers), GB/s: concurrent
    /// copy engines of one GPU reach less together than one alone. Default:
    /// no limit besides the links.
    #[serde(default)]
    pub fanout_gbs: Option<f64>,
}

/// One collective's calibrated bus bandwidth at one GPU count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CollectiveParams {
    pub kind: Collective,
    pub gpus: usize,
    /// Bus bytes per rank per second, GB/s (nccl-tests' busbw).
    pub bus_gbs: f64,
    pub latency_us: f64,
}

/// NCCL parameters besides `HwProfile::nccl_sms`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NcclParams {
    /// Grouped send/recv: bytes per rank per second (the larger of what a rank
    /// sends and what it receives), GB/s.
    pub p2p_bus_gbs: f64,
    pub p2p_latency_us: f64,
    /// Grouped send/recv: bandwidth to or from one peer, GB/s (NCCL's
    /// channels per peer limit it). Default: no per-peer limit.
    #[serde(default)]
    pub p2p_peer_gbs: Option<f64>,
    /// Low-latency protocol of collectives (NCCL's LL for small messages):
    /// latency, µs. A collective takes the faster of this protocol and its
    /// calibrated (bandwidth) one. Default: no such protocol.
    #[serde(default)]
    pub ll_latency_us: Option<f64>,
    /// Low-latency protocol: bus bandwidth, GB/s (with `ll_latency_us`).
    #[serde(default)]
    pub ll_bus_gbs: Option<f64>,
    /// CTAs (channels) of a ring collective's kernel: under a green-context
    /// split (`-gcN`) whose communication partition has fewer SMs, the
    /// kernel runs in rounds ([`crate::sim`]). Default: not modelled.
    #[serde(default)]
    pub channels: Option<usize>,
    /// Per-(collective, P) parameters.
    pub collective: Vec<CollectiveParams>,
    /// Grouped send/recv at a given communicator size, overriding
    /// `p2p_latency_us` and `p2p_peer_gbs` there (NCCL splits its p2p
    /// channels among the communicator's peers, so one peer's bandwidth
    /// depends on P). P not listed: the largest listed P below it, else the
    /// global values. Default: none.
    #[serde(default)]
    pub p2p: Vec<P2pParams>,
}

/// Grouped send/recv at one communicator size (see [`NcclParams::p2p`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct P2pParams {
    pub gpus: usize,
    /// Fixed cost of one grouped step, µs. Default `p2p_latency_us`.
    #[serde(default)]
    pub latency_us: Option<f64>,
    /// Bandwidth to or from one peer, GB/s. Default `p2p_peer_gbs`.
    #[serde(default)]
    pub peer_gbs: Option<f64>,
}

/// Memory-bound reduce kernels.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReduceParams {
    /// SMs a reduce kernel needs to reach full HBM bandwidth; with fewer it
    /// runs proportionally slower.
    pub full_bw_sms: usize,
    pub launch_us: f64,
}

/// Contention between compute and communication, as time multipliers (≥ 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Contention {
    /// GEMM tiles run this much slower while an NCCL transfer runs on the GPU
    /// (HBM and L2 traffic; the SMs NCCL holds are accounted separately).
    pub gemm_slowdown_nccl: f64,
    /// GEMM tiles run this much slower while a copy-engine transfer reads or
    /// writes the GPU's HBM.
    pub gemm_slowdown_copy: f64,
    /// NCCL transfers run this much slower while a GEMM runs on any of their GPUs.
    pub nccl_slowdown_gemm: f64,
    /// Copy-engine transfers run this much slower while a GEMM runs on either end.
    pub copy_slowdown_gemm: f64,
    /// GEMM tiles run this much slower while another GEMM (another compute
    /// stream) runs on the same GPU (shared L2 and HBM). Default 1.
    #[serde(default = "one")]
    pub gemm_slowdown_gemm: f64,
}

fn one() -> f64 {
    1.0
}

/// A hardware profile (see the module doc).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HwProfile {
    pub name: String,
    pub description: String,
    /// SMs per GPU.
    pub sm_count: usize,
    /// Dense bf16 peak, TFLOP/s (documentation and roofline).
    pub bf16_peak_tflops: f64,
    /// HBM bandwidth, GB/s.
    pub hbm_gbs: f64,
    /// SMs an NCCL kernel occupies while it runs.
    pub nccl_sms: usize,
    /// Kernel launch overhead, µs.
    pub launch_us: f64,
    /// Memory of one GPU, GB (1e9 bytes): shapes whose per-rank buffers do
    /// not fit are rejected ([`HwProfile::check_fits`]). Absent in older
    /// profile files: no check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_gb: Option<f64>,
    pub gemm: GemmParams,
    pub nvlink: LinkParams,
    pub copy_engine: CopyEngineParams,
    pub nccl: NcclParams,
    pub reduce: ReduceParams,
    pub contention: Contention,
    /// ficco's own Hopper GEMM against cuBLASLt (`-own`, `-smN`, `-occS`),
    /// from `ficco gemm-bench`. Absent: as fast as cuBLASLt.
    #[serde(default)]
    pub own_gemm: OwnGemmParams,
    /// Ignored: the time ratio of the mma.sync kernel that `-occB` used to
    /// run on, replaced by ficco's own Hopper GEMM ([`OwnGemmParams`]).
    /// Accepted so that profile files written before still load.
    #[serde(default, skip_serializing)]
    pub shaped_gemm_slowdown: Option<f64>,
}

/// ficco's own GEMM kernel measured beside cuBLASLt on one GPU (`ficco
/// gemm-bench`), which [`crate::sim::own`] turns into GEMM times.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OwnGemmParams {
    /// Where the points come from (documentation).
    #[serde(default)]
    pub source: String,
    /// Measured shapes, `[M, N, K, ficco TFLOP/s, cuBLASLt TFLOP/s]`, both
    /// engines timed in one run (cuBLASLt with the autotuned algorithm).
    #[serde(default)]
    pub points: Vec<[f64; 5]>,
    /// Time of ficco's kernel over cuBLASLt's where there are no points. Default 1.
    #[serde(default = "one")]
    pub default_ratio: f64,
    /// `[stages, time multiplier]` of `-occS`; stage counts not listed: 1.
    #[serde(default)]
    pub stage_slowdown: Vec<[f64; 2]>,
    /// Time multiplier of the `tile` schedules' kernel (ficco's, with its
    /// wait and signal hooks and its block-ordered tiles) over the plain
    /// kernel on the same shape. Default 1.
    #[serde(default = "one")]
    pub tile_slowdown: f64,
    /// Further multiplier where the tile kernel adds its blocks into a
    /// peer's buffer (`-acc`: a read-modify-write over NVLink). Default 1.
    #[serde(default = "one")]
    pub tile_acc_slowdown: f64,
}

impl Default for OwnGemmParams {
    fn default() -> Self {
        OwnGemmParams {
            source: String::new(),
            points: vec![],
            default_ratio: 1.0,
            stage_slowdown: vec![],
            tile_slowdown: 1.0,
            tile_acc_slowdown: 1.0,
        }
    }
}

/// Smallest positive value a profile quantity may take.
const PROFILE_MIN: f64 = 1e-6;
/// Largest value a profile quantity may take.
const PROFILE_MAX: f64 = 1e9;

/// The built-in profile used when none is named (the calibrated one).
pub const DEFAULT_PROFILE: &str = "h200-nvlink";

const BUILTIN: [(&str, &str); 2] = [
    (
        DEFAULT_PROFILE,
        include_str!("../../profiles/h200-nvlink.toml"),
    ),
    (
        "h100-nvlink",
        include_str!("../../profiles/h100-nvlink.toml"),
    ),
];

const BUILTIN_NAMES: [&str; 2] = [BUILTIN[0].0, BUILTIN[1].0];

impl HwProfile {
    /// Names of the built-in profiles.
    pub fn builtin_names() -> &'static [&'static str] {
        &BUILTIN_NAMES
    }

    /// A built-in profile by name.
    pub fn builtin(name: &str) -> Result<HwProfile> {
        let (_, text) = BUILTIN
            .iter()
            .find(|(n, _)| *n == name)
            .ok_or_else(|| unknown(name))?;
        Self::from_toml(text).map_err(|e| Error::Profile(format!("built-in '{name}': {e}")))
    }

    /// A built-in name, or the path of a TOML profile file.
    pub fn load(name_or_path: &str) -> Result<HwProfile> {
        if BUILTIN_NAMES.contains(&name_or_path) {
            return Self::builtin(name_or_path);
        }
        let path = Path::new(name_or_path);
        let looks_like_path = name_or_path.ends_with(".toml")
            || name_or_path.contains('/')
            || name_or_path.contains('\\');
        if !path.exists() && !looks_like_path {
            return Err(unknown(name_or_path));
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Profile(format!("cannot read '{name_or_path}': {e}")))?;
        Self::from_toml(&text).map_err(|e| Error::Profile(format!("'{name_or_path}': {e}")))
    }

    /// Parses and checks a profile from TOML text.
    pub fn from_toml(text: &str) -> std::result::Result<HwProfile, String> {
        let hw: HwProfile = toml::from_str(text).map_err(|e| crate::error::toml_error(text, &e))?;
        hw.check()?;
        Ok(hw)
    }

    /// Checks that every quantity is usable (positive, multipliers ≥ 1, ...).
    pub fn check(&self) -> std::result::Result<(), String> {
        // Bounds far outside any real device, so that no derived time overflows.
        let pos = |what: &str, v: f64| {
            if v.is_finite() && (PROFILE_MIN..=PROFILE_MAX).contains(&v) {
                Ok(())
            } else {
                Err(format!(
                    "{what} must be positive, between {PROFILE_MIN:e} and {PROFILE_MAX:e}, got {v}"
                ))
            }
        };
        let nonneg = |what: &str, v: f64| {
            if v.is_finite() && (0.0..=PROFILE_MAX).contains(&v) {
                Ok(())
            } else {
                Err(format!(
                    "{what} must be between 0 and {PROFILE_MAX:e}, got {v}"
                ))
            }
        };
        if let Some(gb) = self.memory_gb {
            pos("memory_gb", gb)?;
        }
        if self.sm_count == 0 {
            return Err("sm_count must be positive".into());
        }
        if self.nccl_sms >= self.sm_count {
            return Err(format!(
                "nccl_sms = {} must be less than sm_count = {}",
                self.nccl_sms, self.sm_count
            ));
        }
        pos("bf16_peak_tflops", self.bf16_peak_tflops)?;
        pos("hbm_gbs", self.hbm_gbs)?;
        nonneg("launch_us", self.launch_us)?;
        if self.gemm.tile_shapes.is_empty()
            || self.gemm.tile_shapes.iter().any(|t| t[0] == 0 || t[1] == 0)
        {
            return Err(
                "gemm.tile_shapes needs at least one [rows, cols] with both positive".into(),
            );
        }
        pos("gemm.sustained_tflops", self.gemm.sustained_tflops)?;
        nonneg("gemm.k_overhead", self.gemm.k_overhead)?;
        if self.nvlink.topology != "switch" {
            return Err(format!(
                "nvlink.topology '{}' is not modelled (only \"switch\")",
                self.nvlink.topology
            ));
        }
        pos("nvlink.bw_gbs", self.nvlink.bw_gbs)?;
        pos("nvlink.usable_gbs", self.nvlink.usable_gbs)?;
        nonneg("nvlink.latency_us", self.nvlink.latency_us)?;
        if self.copy_engine.count == 0 {
            return Err("copy_engine.count must be positive".into());
        }
        pos("copy_engine.bw_gbs", self.copy_engine.bw_gbs)?;
        nonneg("gemm.fixed_us", self.gemm.fixed_us)?;
        if let Some(v) = self.copy_engine.pull_bw_gbs {
            pos("copy_engine.pull_bw_gbs", v)?;
        }
        if let Some(v) = self.copy_engine.pull_latency_us {
            nonneg("copy_engine.pull_latency_us", v)?;
        }
        if let Some(v) = self.nccl.p2p_peer_gbs {
            pos("nccl.p2p_peer_gbs", v)?;
        }
        for e in &self.nccl.p2p {
            if e.gpus < 2 {
                return Err(format!("nccl.p2p.gpus must be at least 2, got {}", e.gpus));
            }
            if let Some(v) = e.latency_us {
                nonneg("nccl.p2p.latency_us", v)?;
            }
            if let Some(v) = e.peer_gbs {
                pos("nccl.p2p.peer_gbs", v)?;
            }
        }
        if let Some(v) = self.nvlink.flag_wait_us {
            nonneg("nvlink.flag_wait_us", v)?;
        }
        if let Some(v) = self.copy_engine.fanout_gbs {
            pos("copy_engine.fanout_gbs", v)?;
        }
        if self.nccl.ll_latency_us.is_some() != self.nccl.ll_bus_gbs.is_some() {
            return Err("nccl.ll_latency_us and nccl.ll_bus_gbs go together".into());
        }
        if let (Some(l), Some(b)) = (self.nccl.ll_latency_us, self.nccl.ll_bus_gbs) {
            nonneg("nccl.ll_latency_us", l)?;
            pos("nccl.ll_bus_gbs", b)?;
        }
        nonneg("copy_engine.latency_us", self.copy_engine.latency_us)?;
        pos("nccl.p2p_bus_gbs", self.nccl.p2p_bus_gbs)?;
        nonneg("nccl.p2p_latency_us", self.nccl.p2p_latency_us)?;
        for c in [
            Collective::AllGather,
            Collective::ReduceScatter,
            Collective::AllReduce,
        ] {
            if !self.nccl.collective.iter().any(|p| p.kind == c) {
                return Err(format!("nccl.collective has no entry for {}", c.name()));
            }
        }
        for p in &self.nccl.collective {
            pos("nccl.collective.bus_gbs", p.bus_gbs)?;
            nonneg("nccl.collective.latency_us", p.latency_us)?;
            if p.gpus < 2 {
                return Err(format!(
                    "nccl.collective.gpus must be at least 2, got {}",
                    p.gpus
                ));
            }
        }
        if self.reduce.full_bw_sms == 0 {
            return Err("reduce.full_bw_sms must be positive".into());
        }
        nonneg("reduce.launch_us", self.reduce.launch_us)?;
        let own = &self.own_gemm;
        pos("own_gemm.default_ratio", own.default_ratio)?;
        for p in &own.points {
            for (i, what) in ["M", "N", "K", "ficco TFLOP/s", "cuBLASLt TFLOP/s"]
                .iter()
                .enumerate()
            {
                pos(&format!("own_gemm.points {what}"), p[i])?;
            }
        }
        for s in &own.stage_slowdown {
            pos("own_gemm.stage_slowdown stages", s[0])?;
            pos("own_gemm.stage_slowdown multiplier", s[1])?;
        }
        pos("own_gemm.tile_slowdown", own.tile_slowdown)?;
        pos("own_gemm.tile_acc_slowdown", own.tile_acc_slowdown)?;
        let c = &self.contention;
        for (what, v) in [
            ("contention.gemm_slowdown_nccl", c.gemm_slowdown_nccl),
            ("contention.gemm_slowdown_copy", c.gemm_slowdown_copy),
            ("contention.nccl_slowdown_gemm", c.nccl_slowdown_gemm),
            ("contention.copy_slowdown_gemm", c.copy_slowdown_gemm),
            ("contention.gemm_slowdown_gemm", c.gemm_slowdown_gemm),
        ] {
            if !(v.is_finite() && (1.0..=PROFILE_MAX).contains(&v)) {
                return Err(format!(
                    "{what} is a time multiplier and must be between 1 and {PROFILE_MAX:e}, got {v}"
                ));
            }
        }
        Ok(())
    }

    /// Checks that one rank's buffers of `problem`'s sequential plan (its
    /// inputs, the collective's buffer and the output) fit in one GPU's
    /// memory (`memory_gb`; no check when the profile has none).
    pub fn check_fits(&self, problem: &Problem) -> Result<()> {
        let Some(gb) = self.memory_gb else {
            return Ok(());
        };
        let plan = crate::plan::lower::lower(problem, &crate::space::Schedule::SEQ)?;
        let need = plan
            .ranks
            .iter()
            .map(|r| r.buffers.iter().map(|b| b.bytes() as f64).sum::<f64>())
            .fold(0.0, f64::max);
        if need > gb * 1e9 {
            return Err(Error::Shape(format!(
                "{}: one GPU's buffers need {:.1} GB, more than the {gb} GB of hardware profile '{}' (memory_gb)",
                problem.label(),
                need / 1e9,
                self.name
            )));
        }
        Ok(())
    }

    /// Grouped send/recv at `gpus` ranks: (latency µs, per-peer GB/s if
    /// limited), from the `nccl.p2p` entry with the largest P not above
    /// `gpus`, else the global values.
    pub fn p2p(&self, gpus: usize) -> (f64, Option<f64>) {
        let e = self
            .nccl
            .p2p
            .iter()
            .filter(|e| e.gpus <= gpus)
            .max_by_key(|e| e.gpus);
        (
            e.and_then(|e| e.latency_us)
                .unwrap_or(self.nccl.p2p_latency_us),
            e.and_then(|e| e.peer_gbs).or(self.nccl.p2p_peer_gbs),
        )
    }

    /// The parameters of `kind` at `gpus` ranks: the entry with the largest
    /// listed P not above `gpus`, or else the smallest listed P.
    pub fn collective(&self, kind: Collective, gpus: usize) -> &CollectiveParams {
        let of_kind = || self.nccl.collective.iter().filter(move |p| p.kind == kind);
        of_kind()
            .filter(|p| p.gpus <= gpus)
            .max_by_key(|p| p.gpus)
            .or_else(|| of_kind().min_by_key(|p| p.gpus))
            .expect("checked: every collective has an entry")
    }
}

fn unknown(name: &str) -> Error {
    Error::Profile(format!(
        "'{name}' is neither a built-in profile ({}) nor a TOML file{}",
        BUILTIN_NAMES.join(", "),
        crate::suggest::did_you_mean(name, BUILTIN_NAMES)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_load_and_check() {
        for name in HwProfile::builtin_names() {
            let hw = HwProfile::builtin(name).unwrap();
            assert_eq!(&hw.name, name);
            assert_eq!(HwProfile::load(name).unwrap(), hw);
        }
        assert!(HwProfile::builtin("h100-nvlink")
            .unwrap()
            .description
            .contains("H100"));
    }

    #[test]
    fn unknown_names_and_bad_files_say_why() {
        let e = HwProfile::load("a100").unwrap_err().to_string();
        assert_eq!(
            e,
            "hardware profile: 'a100' is neither a built-in profile (h200-nvlink, h100-nvlink) \
             nor a TOML file"
        );
        let e = HwProfile::load("h200-nvlnk").unwrap_err().to_string();
        assert!(e.ends_with("did you mean 'h200-nvlink'?"), "{e}");
        assert!(e.contains("h200-nvlink, h100-nvlink"), "{e}");
        let e = HwProfile::load("/nonexistent/x.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot read"), "{e}");
        let dir = std::env::temp_dir().join(format!("ficco-profile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bad = dir.join("bad.toml");
        std::fs::write(&bad, "name = 3").unwrap();
        let e = HwProfile::load(bad.to_str().unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("bad.toml"), "{e}");
        // A syntax error: where it is and what, on one line, once.
        std::fs::write(&bad, "name = \"x\"\nsm_count = \n").unwrap();
        let e = HwProfile::load(bad.to_str().unwrap())
            .unwrap_err()
            .to_string();
        assert!(!e.contains('\n') && !e.contains(" | "), "{e}");
        assert!(e.contains("bad.toml': line 2, column 12: "), "{e}");
        assert_eq!(e.matches("hardware profile").count(), 1, "{e}");
        let good = dir.join("mine.toml");
        let text = BUILTIN[0]
            .1
            .replace("name = \"h200-nvlink\"", "name = \"mine\"");
        std::fs::write(&good, text).unwrap();
        assert_eq!(
            HwProfile::load(good.to_str().unwrap()).unwrap().name,
            "mine"
        );
        let neg = dir.join("neg.toml");
        std::fs::write(
            &neg,
            BUILTIN[0]
                .1
                .replace("sustained_tflops = 770.0", "sustained_tflops = -1.0"),
        )
        .unwrap();
        let e = HwProfile::load(neg.to_str().unwrap())
            .unwrap_err()
            .to_string();
        assert!(e.contains("sustained_tflops must be positive"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn collective_falls_back_to_nearest_smaller_p() {
        let hw = HwProfile::builtin("h200-nvlink").unwrap();
        assert_eq!(hw.collective(Collective::AllGather, 8).gpus, 4);
        assert_eq!(hw.collective(Collective::AllGather, 3).gpus, 2);
        assert_eq!(hw.collective(Collective::AllReduce, 2).gpus, 2);
    }
}
