//! `gemm-bench --grouped`: ficco's grouped GEMM ([`crate::hgemm::grouped`],
//! one persistent launch over every expert) against the loop of cuBLASLt
//! calls the executor otherwise runs (one autotuned call per non-empty
//! expert, in order on one stream), on one GPU.
//!
//! The cases ([`grouped_cases`]) are the expert GEMMs of the MoE presets
//! (`mixtral-8x7b`, `qwen3-30b-a3b`, `deepseek-v2-lite`) for 4096 and 16384
//! tokens, uniform and heavy routing skew, both expert layers (`moe_up`:
//! K = hidden, N = 2 × FFN; `moe_down`: K = FFN, N = hidden): the expert row
//! counts of the rank that receives the most rows under the core's routing
//! ([`ficco_core::problem::routing`], default seed) on P GPUs (P = 1: every
//! expert on this GPU). Experts that receive nothing stay in the grouped
//! launch as empty groups.
//!
//! Operands are fresh random data from the fill kernel (A: the experts'
//! rows back to back, B: every expert's K × N weights), outputs poisoned
//! with NaN first; the grouped output (the chooser's tile and the other
//! one) is checked against the loop's. Times are CUDA-event medians after a
//! warm-up, the engines interleaved in rounds (`Bench::time_interleaved`).

use super::report::tflops;
use super::{Bench, BenchEngine};
use crate::error::Result;
use crate::gemm::GemmKey;
use crate::hgemm::grouped::{Group, GroupedArgs};
use crate::hgemm::{TileN, TypedPtr};
use crate::mem::DeviceBuffer;
use ficco_core::problem::models::{preset, Layer};
use ficco_core::problem::routing::{route, MoeSpec, Skew, DEFAULT_SEED};
use serde::Serialize;
use std::collections::HashSet;
use std::rc::Rc;

/// The models whose expert GEMMs are measured.
pub const MODELS: [&str; 3] = ["mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v2-lite"];
/// Tokens per layer.
pub const TOKENS: [usize; 2] = [4096, 16384];
/// Routing skews.
pub const SKEWS: [Skew; 2] = [Skew::NONE, Skew::HEAVY];

/// One grouped GEMM of the bench: one expert layer of one rank.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GroupedCase {
    /// The scenario name, e.g. `mixtral-8x7b.moe_up.t4096.p1.heavy`.
    pub scenario: String,
    /// The rank whose experts these are (the one receiving the most rows).
    pub rank: usize,
    pub n: usize,
    pub k: usize,
    /// Rows of each of the rank's experts (0: an empty expert).
    pub rows: Vec<usize>,
}

impl GroupedCase {
    /// Rows of all experts.
    pub fn total_rows(&self) -> usize {
        self.rows.iter().sum()
    }
    /// Experts that receive nothing.
    pub fn empty(&self) -> usize {
        self.rows.iter().filter(|&&m| m == 0).count()
    }
    /// The largest expert's rows.
    pub fn max_rows(&self) -> usize {
        self.rows.iter().copied().max().unwrap_or(0)
    }
}

/// Every case on `gpus` GPUs: [`MODELS`] × [`TOKENS`] × [`SKEWS`] × the two
/// expert layers, in that order.
pub fn grouped_cases(gpus: usize) -> ficco_core::error::Result<Vec<GroupedCase>> {
    let mut out = vec![];
    for name in MODELS {
        let model = preset(name)?;
        if let Some(why) = model.moe_misfit(gpus) {
            return Err(ficco_core::error::Error::Shape(why));
        }
        if TOKENS.iter().any(|t| t % gpus != 0) {
            return Err(ficco_core::error::Error::Shape(format!(
                "the token counts {TOKENS:?} must divide over {gpus} GPUs"
            )));
        }
        for tokens in TOKENS {
            for skew in SKEWS {
                // The routing a P-GPU problem of these sizes gets (P = 1 too,
                // which a problem does not take: no expert parallelism).
                let spec = MoeSpec::new(model.experts, model.top_k, skew, DEFAULT_SEED);
                spec.validate(gpus)?;
                let rt = route(tokens, gpus, &spec);
                for layer in Layer::MOE {
                    // As ModelSpec::problem_routed: (K, N) of each expert layer.
                    let (k, n) = match layer {
                        Layer::MoeUp => (model.hidden, 2 * model.ffn),
                        _ => (model.ffn, model.hidden),
                    };
                    let rank = (0..gpus)
                        .max_by_key(|&q| (rt.received(q), std::cmp::Reverse(q)))
                        .unwrap_or(0);
                    out.push(GroupedCase {
                        scenario: model.moe_scenario_name(layer, tokens, gpus, skew),
                        rank,
                        n,
                        k,
                        rows: rt.experts_of(rank).map(|e| rt.expert_load(e)).collect(),
                    });
                }
            }
        }
    }
    Ok(out)
}

/// One case's measurements.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupedRow {
    pub scenario: String,
    pub rank: usize,
    pub n: usize,
    pub k: usize,
    /// Experts (groups), of which `empty` receive nothing.
    pub groups: usize,
    pub empty: usize,
    /// Rows of all experts, and of the largest.
    pub rows: usize,
    pub max_rows: usize,
    /// The chooser's tile ([`crate::hgemm::grouped::grouped_tile`]).
    pub tile_n: TileN,
    /// Persistent CTAs of the grouped launch.
    pub grid: u32,
    pub grouped_ms: f64,
    /// The loop of autotuned cuBLASLt calls.
    pub loop_ms: f64,
    pub grouped_tflops: f64,
    pub loop_tflops: f64,
    /// grouped time / loop time (below 1: the grouped kernel is faster).
    pub ratio_loop: f64,
    /// Grouped output vs the loop's.
    pub rel_err: f64,
    /// The other tile, timed in the same rounds.
    pub alt_tile_n: TileN,
    pub alt_ms: f64,
    pub alt_ratio_loop: f64,
    pub alt_rel_err: f64,
}

/// Aggregates over the rows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupedSummary {
    pub cases: usize,
    /// Geometric mean of grouped / loop time (the chooser's tile).
    pub geomean_ratio_loop: f64,
    pub worst_ratio_loop: f64,
    pub worst_case: String,
    pub best_ratio_loop: f64,
    /// The same geomean with each case's faster tile.
    pub best_tile_geomean_ratio_loop: f64,
    pub max_rel_err: f64,
}

/// Everything one `gemm-bench --grouped` run measured: the JSON document.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupedReport {
    pub device: String,
    pub sms: u32,
    pub compile: crate::hgemm::CompileInfo,
    pub config: super::BenchConfig,
    /// GPUs the routing spreads the experts over (the rank measured gets E/P).
    pub gpus: usize,
    pub rows: Vec<GroupedRow>,
    pub summary: GroupedSummary,
}

impl Bench {
    /// Measures one case: the grouped kernel (both tiles) against the loop.
    pub fn grouped(&mut self, c: &GroupedCase) -> Result<GroupedRow> {
        let (n, k) = (c.n, c.k);
        let total = c.total_rows();
        let e = c.rows.len();
        let ctx = self.ctx.clone();
        let a = DeviceBuffer::alloc(&ctx, total.max(1) * k * 2)?;
        let b = DeviceBuffer::alloc(&ctx, e.max(1) * k * n * 2)?;
        let out = DeviceBuffer::alloc(&ctx, total.max(1) * n * 2)?;
        let reference = DeviceBuffer::alloc(&ctx, total.max(1) * n * 2)?;
        self.seed = self.seed.wrapping_add(2);
        // SAFETY: the buffers hold the element counts filled.
        unsafe {
            self.kernels
                .fill(&self.stream, a.ptr(), (total * k) as u64, self.seed)?;
            self.kernels
                .fill(&self.stream, b.ptr(), (e * k * n) as u64, self.seed + 1)?;
        }
        self.poison(&out, total * n)?;
        self.poison(&reference, total * n)?;
        let mut groups = Vec::with_capacity(e);
        // (key, a, b, c of the timed output, c of the reference) per non-empty expert.
        let mut calls = vec![];
        let mut at = 0;
        for (g, &m) in c.rows.iter().enumerate() {
            let (pa, pb) = (a.ptr().offset(at * k * 2), b.ptr().offset(g * k * n * 2));
            let (pc, pr) = (
                out.ptr().offset(at * n * 2),
                reference.ptr().offset(at * n * 2),
            );
            groups.push(Group {
                m,
                a: TypedPtr::new(pa.raw()),
                lda: k,
                b: TypedPtr::new(pb.raw()),
                ldb: n,
                c: TypedPtr::new(pc.raw()),
                ldc: n,
            });
            if m > 0 {
                let key = GemmKey {
                    m,
                    n,
                    k,
                    lda: k,
                    ldb: n,
                    ldc: n,
                    sm_target: None,
                    b_transposed: false,
                };
                calls.push((key, pa, pb, pc, pr));
            }
            at += m;
        }
        let ws = self.workspace.ptr();
        // The reference: the loop, autotuned per distinct shape as the
        // executor's preparation does.
        let mut tuned = HashSet::new();
        for &(key, pa, pb, _, pr) in &calls {
            if tuned.insert(key) {
                // SAFETY: operands sized for the key, on this device and stream.
                unsafe { self.tuned.tune(key, pa, pb, pr, ws, &self.stream)? };
            }
        }
        self.poison(&reference, total * n)?;
        for &(key, pa, pb, _, pr) in &calls {
            // SAFETY: as above; the calls run in order on one stream.
            unsafe { self.tuned.gemm(key, pa, pb, pr, false, ws, self.cu())? };
        }
        let args = GroupedArgs {
            n,
            k,
            groups,
            sm_budget: None,
            tile_n: None,
        };
        let auto = Rc::new(self.gemm.prepare_grouped(&args)?);
        let tile = auto.shape().tile_n;
        let alt_tile = if tile == TileN::N128 {
            TileN::N256
        } else {
            TileN::N128
        };
        let alt = Rc::new(self.gemm.prepare_grouped(&GroupedArgs {
            tile_n: Some(alt_tile),
            ..args
        })?);
        let mut errs = [0.0; 2];
        for (i, g) in [&auto, &alt].into_iter().enumerate() {
            self.poison(&out, total * n)?;
            // SAFETY: the table's operands are alive and sized; one stream.
            unsafe { self.gemm.launch_grouped(self.cu(), g)? };
            errs[i] = self.rel_err(out.ptr(), reference.ptr(), total * n)?;
        }
        let engines = [
            BenchEngine::Grouped(auto.clone()),
            BenchEngine::Loop(
                calls
                    .iter()
                    .map(|&(key, pa, pb, pc, _)| (key, pa, pb, pc))
                    .collect(),
            ),
            BenchEngine::Grouped(alt),
        ];
        // SAFETY: as above.
        let t = unsafe { self.time_interleaved(&engines)? };
        self.sync()?;
        let (grouped_ms, loop_ms, alt_ms) = (t[0], t[1], t[2]);
        let flop_m: usize = total;
        Ok(GroupedRow {
            scenario: c.scenario.clone(),
            rank: c.rank,
            n,
            k,
            groups: e,
            empty: c.empty(),
            rows: total,
            max_rows: c.max_rows(),
            tile_n: tile,
            grid: auto.shape().grid,
            grouped_ms,
            loop_ms,
            grouped_tflops: tflops(flop_m, n, k, grouped_ms),
            loop_tflops: tflops(flop_m, n, k, loop_ms),
            ratio_loop: grouped_ms / loop_ms,
            rel_err: errs[0],
            alt_tile_n: alt_tile,
            alt_ms,
            alt_ratio_loop: alt_ms / loop_ms,
            alt_rel_err: errs[1],
        })
    }
}

/// Geomeans, extremes and the largest error over the rows.
pub fn grouped_summary(rows: &[GroupedRow]) -> GroupedSummary {
    let n = rows.len().max(1) as f64;
    let geo =
        |f: &dyn Fn(&GroupedRow) -> f64| (rows.iter().map(|r| f(r).ln()).sum::<f64>() / n).exp();
    let worst = rows
        .iter()
        .max_by(|a, b| a.ratio_loop.total_cmp(&b.ratio_loop));
    GroupedSummary {
        cases: rows.len(),
        geomean_ratio_loop: geo(&|r| r.ratio_loop),
        worst_ratio_loop: worst.map_or(f64::NAN, |r| r.ratio_loop),
        worst_case: worst.map(|r| r.scenario.clone()).unwrap_or_default(),
        best_ratio_loop: rows
            .iter()
            .map(|r| r.ratio_loop)
            .min_by(f64::total_cmp)
            .unwrap_or(f64::NAN),
        best_tile_geomean_ratio_loop: geo(&|r| r.ratio_loop.min(r.alt_ratio_loop)),
        max_rel_err: rows
            .iter()
            .map(|r| r.rel_err.max(r.alt_rel_err))
            .fold(0.0, f64::max),
    }
}

/// The table's header (`#` lines).
pub fn grouped_header(
    device: &str,
    sms: u32,
    compile: &crate::hgemm::CompileInfo,
    cases: usize,
    gpus: usize,
    cfg: super::BenchConfig,
) -> String {
    let mut s = format!(
        "# ficco gemm-bench --grouped: ficco's grouped GEMM (one launch) vs a loop of autotuned cuBLASLt calls (one per expert)\n\
         # device: {device}, {sms} SMs; ficco cubin: {:.1} ms, NVRTC {}.{}\n\
         # {cases} cases: the expert GEMMs of {} for {} tokens, skew {}, moe_up and moe_down; the busiest rank of {gpus} GPU(s)\n\
         # time: median of {} after {} warm-up, engines interleaved; ratio = grouped time / loop time (< 1: grouped faster)\n\
         # err: relative L2 error vs the loop on fresh random data, outputs poisoned with NaN first\n",
        compile.ms,
        compile.nvrtc.0,
        compile.nvrtc.1,
        MODELS.join(", "),
        TOKENS.map(|t| t.to_string()).join(" and "),
        SKEWS.map(|s| s.name()).join(" and "),
        cfg.iters,
        cfg.warmup,
    );
    s += &format!(
        "#{:<44} {:>5} {:>5} {:>6} {:>6} {:>6} {:>4} {:>9} {:>7} {:>9} {:>7} {:>6} {:>8} {:>4} {:>9} {:>6} {:>8}\n",
        "scenario", "N", "K", "groups", "rows", "max", "tile", "grouped", "TFLOP/s", "loop", "TFLOP/s",
        "ratio", "err", "alt", "alt", "r_alt", "err_alt"
    );
    let units = format!(
        "#{:<44} {:>5} {:>5} {:>6} {:>6} {:>6} {:>4} {:>9} {:>7} {:>9}",
        "", "", "", "(empty)", "", "", "", "(ms)", "", "(ms)"
    );
    s += units.trim_end();
    s.push('\n');
    s
}

/// One case's table line.
pub fn grouped_table_row(r: &GroupedRow) -> String {
    format!(
        " {:<44} {:>5} {:>5} {:>6} {:>6} {:>6} {:>4} {:>9.4} {:>7.1} {:>9.4} {:>7.1} {:>6.3} {:>8.1e} {:>4} {:>9.4} {:>6.3} {:>8.1e}\n",
        r.scenario,
        r.n,
        r.k,
        format!("{}({})", r.groups, r.empty),
        r.rows,
        r.max_rows,
        r.tile_n.label(),
        r.grouped_ms,
        r.grouped_tflops,
        r.loop_ms,
        r.loop_tflops,
        r.ratio_loop,
        r.rel_err,
        r.alt_tile_n.label(),
        r.alt_ms,
        r.alt_ratio_loop,
        r.alt_rel_err,
    )
}

/// The summary lines after the rows.
pub fn grouped_footer(s: &GroupedSummary) -> String {
    format!(
        "# grouped / loop over {} cases: geomean {:.3}, worst {:.3} ({}), best {:.3}; with each case's faster tile: geomean {:.3}\n\
         # max rel err {:.1e}\n",
        s.cases,
        s.geomean_ratio_loop,
        s.worst_ratio_loop,
        s.worst_case,
        s.best_ratio_loop,
        s.best_tile_geomean_ratio_loop,
        s.max_rel_err,
    )
}

/// The whole table of a report.
pub fn grouped_table(r: &GroupedReport) -> String {
    let mut t = grouped_header(&r.device, r.sms, &r.compile, r.rows.len(), r.gpus, r.config);
    for row in &r.rows {
        t += &grouped_table_row(row);
    }
    t + &grouped_footer(&r.summary)
}

/// The cases as a table (no GPU): scenario, rank, N, K, experts, rows.
pub fn grouped_list(cases: &[GroupedCase]) -> String {
    let mut s = format!(
        "# {} grouped GEMM cases of gemm-bench --grouped (expert row counts of the busiest rank)\n",
        cases.len()
    );
    s += &format!(
        "#{:<44} {:>4} {:>5} {:>5} {:>7} {:>5} {:>6} {:>6}\n",
        "scenario", "rank", "N", "K", "experts", "empty", "rows", "max"
    );
    for c in cases {
        s += &format!(
            " {:<44} {:>4} {:>5} {:>5} {:>7} {:>5} {:>6} {:>6}\n",
            c.scenario,
            c.rank,
            c.n,
            c.k,
            c.rows.len(),
            c.empty(),
            c.total_rows(),
            c.max_rows()
        );
    }
    s
}

/// Runs every case on `device`, reporting each row through `on` as it is
/// measured (`None` first, once the kernel is loaded).
pub fn run_grouped(
    device: usize,
    gpus: usize,
    cases: &[GroupedCase],
    cfg: super::BenchConfig,
    on: &mut dyn FnMut(GroupedEvent<'_>),
) -> Result<GroupedReport> {
    let (ctx, name) = super::open_device(device)?;
    let mut bench = Bench::new(&ctx, cfg)?;
    let compile = bench.gemm().compile_info().clone();
    let sms = bench.gemm().sms();
    on(GroupedEvent::Loaded {
        device: &name,
        sms,
        compile: &compile,
    });
    let mut rows = Vec::with_capacity(cases.len());
    for (i, c) in cases.iter().enumerate() {
        let r = bench.grouped(c)?;
        on(GroupedEvent::Row(i, cases.len(), &r));
        rows.push(r);
    }
    Ok(GroupedReport {
        device: name,
        sms,
        compile,
        config: cfg,
        gpus,
        summary: grouped_summary(&rows),
        rows,
    })
}

/// Progress of [`run_grouped`].
pub enum GroupedEvent<'a> {
    Loaded {
        device: &'a str,
        sms: u32,
        compile: &'a crate::hgemm::CompileInfo,
    },
    /// Row i of n.
    Row(usize, usize, &'a GroupedRow),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cases_are_the_presets_expert_gemms() {
        let cases = grouped_cases(1).unwrap();
        assert_eq!(cases.len(), 3 * 2 * 2 * 2);
        let c = &cases[0];
        assert_eq!(c.scenario, "mixtral-8x7b.moe_up.t4096.p1.none");
        // moe_up: K = hidden, N = 2 x FFN; every expert on the one GPU.
        assert_eq!((c.k, c.n, c.rows.len(), c.rank), (4096, 2 * 14336, 8, 0));
        // Every token goes to top_k experts.
        assert_eq!(c.total_rows(), 4096 * 2);
        let down = &cases[1];
        assert_eq!(down.scenario, "mixtral-8x7b.moe_down.t4096.p1.none");
        assert_eq!((down.k, down.n), (14336, 4096));
        let q = cases
            .iter()
            .find(|c| c.scenario == "qwen3-30b-a3b.moe_up.t16384.p1.heavy")
            .unwrap();
        assert_eq!((q.rows.len(), q.total_rows()), (128, 16384 * 8));
        // Heavy skew: the hottest expert well above its fair share.
        assert!(q.max_rows() > 2 * q.total_rows() / 128, "{}", q.max_rows());
        // On 4 GPUs the busiest rank's E/P experts.
        let p4 = grouped_cases(4).unwrap();
        let d = p4
            .iter()
            .find(|c| c.scenario == "deepseek-v2-lite.moe_down.t4096.p4.heavy")
            .unwrap();
        assert_eq!(d.rows.len(), 16);
        assert!(d.total_rows() >= 4096 * 6 / 4);
        // Mixtral's 8 experts do not spread over 3 GPUs.
        assert!(grouped_cases(3).is_err());
    }

    fn row(s: &str, ratio: f64, alt: f64, err: f64) -> GroupedRow {
        GroupedRow {
            scenario: s.into(),
            rank: 0,
            n: 4096,
            k: 1024,
            groups: 8,
            empty: 1,
            rows: 8192,
            max_rows: 3000,
            tile_n: TileN::N256,
            grid: 132,
            grouped_ms: ratio,
            loop_ms: 1.0,
            grouped_tflops: 100.0,
            loop_tflops: 90.0,
            ratio_loop: ratio,
            rel_err: err,
            alt_tile_n: TileN::N128,
            alt_ms: alt,
            alt_ratio_loop: alt,
            alt_rel_err: 1e-3,
        }
    }

    #[test]
    fn summary_and_table() {
        let rows = [row("a", 0.5, 0.4, 2e-3), row("b", 2.0, 3.0, 1e-3)];
        let s = grouped_summary(&rows);
        assert_eq!(s.cases, 2);
        assert!((s.geomean_ratio_loop - 1.0).abs() < 1e-12);
        assert_eq!((s.worst_ratio_loop, s.worst_case.as_str()), (2.0, "b"));
        assert_eq!(s.best_ratio_loop, 0.5);
        // min(0.5, 0.4) = 0.4 and min(2, 3) = 2: sqrt(0.8).
        assert!((s.best_tile_geomean_ratio_loop - 0.8f64.sqrt()).abs() < 1e-12);
        assert_eq!(s.max_rel_err, 2e-3);
        let line = grouped_table_row(&rows[0]);
        assert!(line.contains(" a "), "{line}");
        assert!(line.contains("8(1)") && line.contains("0.500"), "{line}");
        let f = grouped_footer(&s);
        assert!(f.contains("worst 2.000 (b)"), "{f}");
    }

    #[test]
    fn list_names_every_case() {
        let cases = grouped_cases(1).unwrap();
        let l = grouped_list(&cases);
        assert_eq!(l.lines().count(), 2 + cases.len());
        assert!(l.contains("deepseek-v2-lite.moe_down.t16384.p1.heavy"));
    }
}
