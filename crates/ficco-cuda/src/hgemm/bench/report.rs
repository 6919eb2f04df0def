//! What `gemm-bench` reports, without any device work: the shapes it
//! measures ([`bench_shapes`]), its rows and summary (the JSON document,
//! [`Report`]), the hook settings' names and the human table. Kept apart
//! from the measuring so that it is testable on any machine.

use super::super::schedule::schedule_label;
use super::super::{CacheOutcome, CompileInfo, TileN};
use serde::Serialize;

/// One GEMM shape of the bench and where it comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BenchShape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// "whole", "chunk", "whole+chunk" or "square" (8192³).
    pub kind: &'static str,
    /// The scenarios and schedules that use it, e.g. "llama3-8b.qkv.t2048.p2 fine4".
    pub uses: Vec<String>,
}

/// The throughput target shape, measured first.
pub const SQUARE: usize = 8192;

/// 8192³ first, then every distinct GEMM the core lowers for `scenarios`
/// (whole per-rank GEMMs and the chunk GEMMs of `shard`, `bulk`, `fine2`,
/// `fine4`, `fine8`), each once.
pub fn bench_shapes(scenarios: &[ficco_core::problem::workload::Scenario]) -> Vec<BenchShape> {
    use ficco_core::plan::shapes::{gemm_shapes, BENCH_GRANULARITIES};
    let mut out = vec![BenchShape {
        m: SQUARE,
        n: SQUARE,
        k: SQUARE,
        kind: "square",
        uses: vec!["8192^3".into()],
    }];
    for s in gemm_shapes(scenarios, &BENCH_GRANULARITIES) {
        if (s.m, s.n, s.k) == (SQUARE, SQUARE, SQUARE) {
            out[0].uses.extend(s.uses);
            continue;
        }
        out.push(BenchShape {
            m: s.m,
            n: s.n,
            k: s.k,
            kind: s.kind(),
            uses: s.uses,
        });
    }
    out
}

/// Timing settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BenchConfig {
    pub warmup: usize,
    pub iters: usize,
    /// Also time the other schedules of ficco's kernel on every shape
    /// ([`schedule_variants`](crate::hgemm::tune::schedule_variants)) and report the fastest.
    pub variants: bool,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            warmup: 5,
            iters: 25,
            variants: true,
        }
    }
}

/// One shape's measurements.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShapeRow {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub kind: &'static str,
    /// How many (scenario, granularity) places use it.
    pub uses: usize,
    /// The first of them.
    pub first_use: String,
    /// K splits ficco's kernel used.
    pub splits: u32,
    /// Tile width ficco's kernel used.
    pub tile_n: TileN,
    pub ficco_ms: f64,
    pub tuned_ms: f64,
    pub default_ms: f64,
    pub ficco_tflops: f64,
    pub tuned_tflops: f64,
    pub default_tflops: f64,
    /// ficco time / tuned cuBLASLt time (below 1: ficco faster).
    pub ratio_tuned: f64,
    /// ficco time / default cuBLASLt time.
    pub ratio_default: f64,
    /// ficco output vs tuned cuBLASLt output.
    pub rel_err: f64,
    /// default cuBLASLt output vs tuned cuBLASLt output.
    pub default_rel_err: f64,
    /// The other schedules of ficco's kernel, timed in the same interleaved
    /// rounds (empty without [`BenchConfig::variants`]).
    pub variants: Vec<VariantRow>,
    /// The fastest correct schedule measured (the chooser's own or a
    /// variant), as "tile/splits", and its time.
    pub best: String,
    pub best_ms: f64,
    /// best time / tuned cuBLASLt time.
    pub best_ratio_tuned: f64,
    /// The schedule [`HopperGemm::autotune`] picked ("tile/splits"), timed
    /// in the same interleaved rounds, its time, ratio and error.
    ///
    /// [`HopperGemm::autotune`]: crate::hgemm::HopperGemm::autotune
    pub auto: String,
    pub auto_ms: f64,
    pub auto_ratio_tuned: f64,
    pub auto_rel_err: f64,
}

/// One alternative schedule of ficco's kernel on one shape.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VariantRow {
    pub tile_n: TileN,
    pub splits: u32,
    /// Only the last partial wave's tiles split ([`Hooks::split_tail_only`]).
    ///
    /// [`Hooks::split_tail_only`]: crate::hgemm::Hooks::split_tail_only
    pub tail_only: bool,
    /// Median time; `None` when the variant could not run (see `error`).
    pub ms: Option<f64>,
    pub ratio_tuned: Option<f64>,
    /// Output vs tuned cuBLASLt.
    pub rel_err: Option<f64>,
    /// Why the variant was not measured (rejected or failed to launch).
    pub error: Option<String>,
}

/// Largest relative error a variant may have and still count as the best.
pub const VARIANT_MAX_REL_ERR: f64 = 1e-2;

/// One hook setting's cost on one shape.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HookRow {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub setting: String,
    pub ms: f64,
    pub tflops: f64,
    /// time / plain time − 1, the plain launch timed in interleaved pairs
    /// with this setting.
    pub cost: f64,
    /// Output vs the plain launch's output (0: identical).
    pub rel_err: f64,
    /// Why the setting was not measured (rejected or failed to launch).
    pub error: Option<String>,
}

/// Aggregates over the shape rows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub shapes: usize,
    /// Geometric mean of ficco / tuned cuBLASLt time.
    pub geomean_ratio_tuned: f64,
    pub geomean_ratio_default: f64,
    pub worst_ratio_tuned: f64,
    pub worst_shape: String,
    /// Σ ficco time / Σ tuned time over the chunk shapes.
    pub chunk_time_ratio: f64,
    pub max_rel_err: f64,
    /// 8192³ TFLOP/s of ficco's kernel, tuned and default cuBLASLt, if measured.
    pub square_tflops: Option<[f64; 3]>,
    /// What a chooser that picked each shape's fastest measured schedule
    /// ([`ShapeRow::best`]) would achieve: geomean, worst (and where), and
    /// the chunk time ratio; shapes where the best is not the chooser's.
    pub best_geomean_ratio_tuned: f64,
    pub best_worst_ratio_tuned: f64,
    pub best_worst_shape: String,
    pub best_chunk_time_ratio: f64,
    pub best_differs: usize,
    /// The same for ficco's autotuned pick ([`ShapeRow::auto`]), the
    /// schedule the executor launches: geomean, worst (and where), chunk
    /// time ratio, shapes where it is not the chooser's.
    pub auto_geomean_ratio_tuned: f64,
    pub auto_worst_ratio_tuned: f64,
    pub auto_worst_shape: String,
    pub auto_chunk_time_ratio: f64,
    pub auto_differs: usize,
}

/// Everything one `gemm-bench` run measured: the JSON document.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub device: String,
    pub sms: u32,
    /// Clusters of 2 CTAs resident at once (the cluster tiles' grid).
    pub clusters: u32,
    /// Obtaining ficco's cubin: compile time (or disk-cache read) and hit or miss.
    pub compile: CompileInfo,
    pub config: BenchConfig,
    /// The suite the shapes were derived from.
    pub suite: String,
    pub rows: Vec<ShapeRow>,
    pub hooks: Vec<HookRow>,
    pub summary: Summary,
}

/// TFLOP/s of an M × N × K GEMM that took `ms` (0 for no time).
pub(super) fn tflops(m: usize, n: usize, k: usize, ms: f64) -> f64 {
    if ms <= 0.0 {
        0.0
    } else {
        2.0 * m as f64 * n as f64 * k as f64 / (ms * 1e-3) / 1e12
    }
}

/// The fastest of the chooser's schedule and the correct measured variants:
/// ("tile/splits", ms). Ties keep the chooser's.
pub fn best_schedule(tile: TileN, splits: u32, ms: f64, variants: &[VariantRow]) -> (String, f64) {
    let mut best = (schedule_label((tile, splits, false)), ms);
    for v in variants {
        let ok = v.rel_err.is_some_and(|e| e < VARIANT_MAX_REL_ERR);
        if let (Some(t), true) = (v.ms, ok) {
            if t < best.1 {
                best = (schedule_label((v.tile_n, v.splits, v.tail_only)), t);
            }
        }
    }
    best
}

/// Geomean, worst and chunk aggregate over the rows.
pub fn summarize(rows: &[ShapeRow]) -> Summary {
    let n = rows.len().max(1) as f64;
    let geo = |f: &dyn Fn(&ShapeRow) -> f64| {
        (rows.iter().map(|r| f(r).max(1e-12).ln()).sum::<f64>() / n).exp()
    };
    let worst = rows
        .iter()
        .max_by(|a, b| a.ratio_tuned.total_cmp(&b.ratio_tuned));
    let (cf, ct) = rows
        .iter()
        .filter(|r| r.kind.contains("chunk"))
        .fold((0.0, 0.0), |(f, t), r| (f + r.ficco_ms, t + r.tuned_ms));
    let best_worst = rows
        .iter()
        .max_by(|a, b| a.best_ratio_tuned.total_cmp(&b.best_ratio_tuned));
    let auto_worst = rows
        .iter()
        .max_by(|a, b| a.auto_ratio_tuned.total_cmp(&b.auto_ratio_tuned));
    let ca = rows
        .iter()
        .filter(|r| r.kind.contains("chunk"))
        .map(|r| r.auto_ms)
        .sum::<f64>();
    let cb = rows
        .iter()
        .filter(|r| r.kind.contains("chunk"))
        .map(|r| r.best_ms)
        .sum::<f64>();
    Summary {
        shapes: rows.len(),
        geomean_ratio_tuned: geo(&|r| r.ratio_tuned),
        geomean_ratio_default: geo(&|r| r.ratio_default),
        worst_ratio_tuned: worst.map_or(0.0, |r| r.ratio_tuned),
        worst_shape: worst.map_or(String::new(), |r| format!("{}x{}x{}", r.m, r.n, r.k)),
        chunk_time_ratio: if ct > 0.0 { cf / ct } else { 0.0 },
        max_rel_err: rows.iter().map(|r| r.rel_err).fold(0.0, f64::max),
        square_tflops: rows
            .iter()
            .find(|r| (r.m, r.n, r.k) == (SQUARE, SQUARE, SQUARE))
            .map(|r| [r.ficco_tflops, r.tuned_tflops, r.default_tflops]),
        best_geomean_ratio_tuned: geo(&|r| r.best_ratio_tuned),
        best_worst_ratio_tuned: best_worst.map_or(0.0, |r| r.best_ratio_tuned),
        best_worst_shape: best_worst.map_or(String::new(), |r| format!("{}x{}x{}", r.m, r.n, r.k)),
        best_chunk_time_ratio: if ct > 0.0 { cb / ct } else { 0.0 },
        best_differs: rows
            .iter()
            .filter(|r| r.best != format!("{}/{}", r.tile_n.label(), r.splits))
            .count(),
        auto_geomean_ratio_tuned: geo(&|r| r.auto_ratio_tuned),
        auto_worst_ratio_tuned: auto_worst.map_or(0.0, |r| r.auto_ratio_tuned),
        auto_worst_shape: auto_worst.map_or(String::new(), |r| format!("{}x{}x{}", r.m, r.n, r.k)),
        auto_chunk_time_ratio: if ct > 0.0 { ca / ct } else { 0.0 },
        auto_differs: rows
            .iter()
            .filter(|r| r.auto != format!("{}/{}", r.tile_n.label(), r.splits))
            .count(),
    }
}

/// The human table's header (`#` lines: scenario, units, columns).
pub fn table_header(
    device: &str,
    sms: u32,
    clusters: u32,
    compile: &CompileInfo,
    shapes: usize,
    suite: &str,
    cfg: BenchConfig,
) -> String {
    let mut s = format!(
        "# ficco gemm-bench: ficco's Hopper GEMM vs cuBLASLt (autotuned, as the executor runs it) vs cuBLASLt (default heuristic)\n\
         # device: {device}, {sms} SMs, {clusters} clusters of 2 resident; ficco cubin: {:.1} ms ({}), NVRTC {}.{}\n\
         # {shapes} shapes: 8192^3 and every whole and chunk GEMM of {suite}; bf16 in, f32 accumulate, bf16 out\n\
         # time: median of {} after {} warm-up, engines interleaved; ratio = ficco time / cuBLASLt time (< 1: ficco faster)\n\
         # err: relative L2 error vs autotuned cuBLASLt on fresh random data, outputs poisoned with NaN first\n",
        compile.ms,
        match compile.cache {
            CacheOutcome::Memory => "in memory",
            CacheOutcome::Hit => "disk cache hit",
            CacheOutcome::Stored => "compiled, cached",
            CacheOutcome::Uncached => "compiled, not cached",
        },
        compile.nvrtc.0,
        compile.nvrtc.1,
        cfg.iters,
        cfg.warmup,
    );
    s += &format!(
        "#{:>6} {:>6} {:>6} {:>11} {:>7} {:>9} {:>7} {:>9} {:>7} {:>9} {:>7} {:>6} {:>6} {:>8} {:>8} {:>7} {:>6} {:>7} {:>6}  {}\n",
        "M", "N", "K", "kind", "tile/S", "ficco", "TFLOP/s", "cublasLt", "TFLOP/s", "default", "TFLOP/s", "r_tun",
        "r_dflt", "err", "err_dflt", "best", "r_best", "auto", "r_auto", "first use (+ more)"
    );
    let units = format!(
        "#{:>6} {:>6} {:>6} {:>11} {:>7} {:>9} {:>7} {:>9} {:>7} {:>9}",
        "", "", "", "", "", "(ms)", "", "(ms)", "", "(ms)"
    );
    s += units.trim_end();
    s.push('\n');
    s
}

/// One shape's table line.
pub fn table_row(r: &ShapeRow) -> String {
    let more = if r.uses > 1 {
        format!(" (+{})", r.uses - 1)
    } else {
        String::new()
    };
    format!(
        " {:>6} {:>6} {:>6} {:>11} {:>7} {:>9.4} {:>7.1} {:>9.4} {:>7.1} {:>9.4} {:>7.1} {:>6.3} {:>6.3} {:>8.1e} {:>8.1e} {:>7} {:>6.3} {:>7} {:>6.3}  {}{more}\n",
        r.m,
        r.n,
        r.k,
        r.kind,
        format!("{}/{}", r.tile_n.label(), r.splits),
        r.ficco_ms,
        r.ficco_tflops,
        r.tuned_ms,
        r.tuned_tflops,
        r.default_ms,
        r.default_tflops,
        r.ratio_tuned,
        r.ratio_default,
        r.rel_err,
        r.default_rel_err,
        r.best,
        r.best_ratio_tuned,
        r.auto,
        r.auto_ratio_tuned,
        r.first_use,
    )
}

/// The hook-cost section: one line per (shape, setting).
pub fn hook_table(rows: &[HookRow]) -> String {
    let mut s = String::from(
        "# hooks: each setting timed in interleaved pairs with the plain launch; cost = time / plain - 1; err vs the plain output\n",
    );
    s += &format!(
        "#{:>6} {:>6} {:>6} {:>30} {:>9} {:>7} {:>8} {:>8}\n",
        "M", "N", "K", "setting", "ms", "TFLOP/s", "cost", "err"
    );
    for h in rows {
        if let Some(e) = &h.error {
            s += &format!(
                " {:>6} {:>6} {:>6} {:>30} failed: {e}\n",
                h.m, h.n, h.k, h.setting
            );
            continue;
        }
        s += &format!(
            " {:>6} {:>6} {:>6} {:>30} {:>9.4} {:>7.1} {:>+7.1}% {:>8.1e}\n",
            h.m,
            h.n,
            h.k,
            h.setting,
            h.ms,
            h.tflops,
            100.0 * h.cost,
            h.rel_err
        );
    }
    s
}

/// The footer: the summary against the targets.
pub fn table_footer(s: &Summary, hooks: &[HookRow]) -> String {
    let mut t = String::new();
    if let Some([f, tu, de]) = s.square_tflops {
        t += &format!(
            "# 8192^3: ficco {f:.0} TFLOP/s, cuBLASLt autotuned {tu:.0}, default {de:.0} (target >= 760)\n"
        );
    }
    t += &format!(
        "# {} shapes: geomean ficco/cuBLASLt {:.3} (target <= 1.03), vs default heuristic {:.3}; worst {:.3} at {} (target <= 1.15)\n",
        s.shapes,
        s.geomean_ratio_tuned,
        s.geomean_ratio_default,
        s.worst_ratio_tuned,
        s.worst_shape
    );
    t += &format!(
        "# chunk shapes together: sum ficco time / sum cuBLASLt time {:.3} (target < 1); max rel err {:.1e}\n",
        s.chunk_time_ratio, s.max_rel_err
    );
    t += &format!(
        "# ficco autotuned (the executor's pick; differs from the chooser's on {}): geomean {:.3} (target <= 1.03), worst {:.3} at {} (target <= 1.15), chunk shapes {:.3} (target < 1)\n",
        s.auto_differs,
        s.auto_geomean_ratio_tuned,
        s.auto_worst_ratio_tuned,
        s.auto_worst_shape,
        s.auto_chunk_time_ratio
    );
    if s.best_differs > 0 {
        t += &format!(
            "# fastest measured schedule per shape (differs from the chooser's on {}): geomean {:.3}, worst {:.3} at {}, chunk shapes {:.3}\n",
            s.best_differs,
            s.best_geomean_ratio_tuned,
            s.best_worst_ratio_tuned,
            s.best_worst_shape,
            s.best_chunk_time_ratio
        );
    }
    for (setting, label) in [
        (HOOKS_3_TO_6, "hooks 3-6"),
        (HOOKS_3_TO_6_REGISTER, "hooks 3-6, register epilogue"),
        (HOOKS_3_TO_6_PINGPONG, "hooks 3-6, ping-pong tile"),
        (
            HOOKS_3_TO_6_MAPS,
            "hooks 3-6, destination through tensor maps",
        ),
        (
            HOOKS_3_TO_6_PINGPONG_MAPS,
            "hooks 3-6, ping-pong tile, destination through tensor maps",
        ),
    ] {
        let h36: Vec<String> = hooks
            .iter()
            .filter(|h| h.setting == setting && h.error.is_none())
            .map(|h| format!("{:+.1}% at {}x{}x{}", 100.0 * h.cost, h.m, h.n, h.k))
            .collect();
        if !h36.is_empty() {
            t += &format!("# {label} (flags set): {} (target <= 3%)\n", h36.join(", "));
        }
    }
    // Hooks 3-6 on the ping-pong tile against the plain ping-pong tile.
    let cost_of = |setting: &str, m, n, k| {
        hooks
            .iter()
            .find(|h| h.setting == setting && (h.m, h.n, h.k) == (m, n, k) && h.error.is_none())
            .map(|h| h.cost)
    };
    let pp: Vec<String> = hooks
        .iter()
        .filter(|h| h.setting == PINGPONG && h.error.is_none())
        .filter_map(|h| {
            let hooked = cost_of(HOOKS_3_TO_6_PINGPONG, h.m, h.n, h.k)?;
            Some(format!(
                "{:+.1}% at {}x{}x{} (plain ping-pong {:+.1}% vs the plain launch)",
                100.0 * ((1.0 + hooked) / (1.0 + h.cost) - 1.0),
                h.m,
                h.n,
                h.k,
                100.0 * h.cost
            ))
        })
        .collect();
    if !pp.is_empty() {
        t += &format!(
            "# hooks 3-6 on the ping-pong tile vs the plain ping-pong tile: {}\n",
            pp.join(", ")
        );
    }
    t
}

/// The whole human table of a report.
pub fn table(r: &Report) -> String {
    let mut t = table_header(
        &r.device,
        r.sms,
        r.clusters,
        &r.compile,
        r.rows.len(),
        &r.suite,
        r.config,
    );
    for row in &r.rows {
        t += &table_row(row);
    }
    if !r.hooks.is_empty() {
        t += &hook_table(&r.hooks);
    }
    t + &table_footer(&r.summary, &r.hooks)
}

/// The hook setting with the tile order, input wait, output signal and
/// destination hooks all on.
pub const HOOKS_3_TO_6: &str = "hooks 3-6";
/// [`HOOKS_3_TO_6`] with the register epilogue ([`Hooks::register_epilogue`])
/// instead of the staged one (the default).
///
/// [`Hooks::register_epilogue`]: crate::hgemm::Hooks::register_epilogue
pub const HOOKS_3_TO_6_REGISTER: &str = "hooks 3-6 register";
/// The plain ping-pong tile ([`TileN::Pp128`]).
pub const PINGPONG: &str = "pingpong";
/// [`HOOKS_3_TO_6`] on the ping-pong tile.
pub const HOOKS_3_TO_6_PINGPONG: &str = "hooks 3-6 pingpong";
/// [`HOOKS_3_TO_6`] with the destination hook's tensor maps ([`DestHook::maps`]).
///
/// [`DestHook::maps`]: crate::hgemm::DestHook::maps
pub const HOOKS_3_TO_6_MAPS: &str = "hooks 3-6 maps";
/// [`HOOKS_3_TO_6_PINGPONG`] with the destination hook's tensor maps.
pub const HOOKS_3_TO_6_PINGPONG_MAPS: &str = "hooks 3-6 pingpong maps";
