//! `gemm-bench`: ficco's Hopper GEMM against cuBLASLt on one GPU, side by side.
//!
//! Three engines per shape, on the same fresh random operands (outputs
//! poisoned with NaN first): ficco's kernel ([`super::HopperGemm`]), cuBLASLt
//! with the autotuned algorithm the executor uses ([`crate::gemm::Gemms::tune`]),
//! and cuBLASLt's first heuristic algorithm. Times are CUDA-event medians
//! after a warm-up. Relative errors are ‖x − tuned cuBLASLt‖ / ‖tuned cuBLASLt‖.
//!
//! The shapes ([`bench_shapes`]) are 8192³ and every distinct GEMM that the
//! core's lowering issues for a suite ([`ficco_core::plan::shapes`]): each
//! scenario's whole per-rank GEMM and the GEMM tasks of its `shard`, `bulk`,
//! `fine2`, `fine4` and `fine8` schedules. [`Bench::hook_costs`] measures each
//! hook; [`table`] and [`Report`] are the command's two outputs.

pub mod grouped;

use super::tune::{schedule_label, schedule_variants};
use super::{
    Bf16, DestHook, DevPtr, GemmArgs, Hooks, HopperGemm, Occupancy, SignalHook, TileN, WaitHook,
    BLOCK_M,
};
use crate::controls::{median, time_ms};
use crate::driver::cuda::{memcpy_dtod_async, memset_d8_async};
use crate::error::{drv, CudaError, Result};
use crate::gemm::{GemmKey, Gemms, WORKSPACE_BYTES};
use crate::kernels::Kernels;
use crate::mem::{memset_d16_async, DeviceBuffer, DevicePtr};
use cudarc::driver::{sys, CudaContext, CudaStream};
use serde::Serialize;
use std::sync::Arc;

/// bf16 quiet NaN: the poison written into outputs before each run.
pub const POISON: u16 = 0x7fc0;

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
    /// ([`schedule_variants`]) and report the fastest.
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
    pub compile: super::CompileInfo,
    pub config: BenchConfig,
    /// The suite the shapes were derived from.
    pub suite: String,
    pub rows: Vec<ShapeRow>,
    pub hooks: Vec<HookRow>,
    pub summary: Summary,
}

fn tflops(m: usize, n: usize, k: usize, ms: f64) -> f64 {
    if ms <= 0.0 {
        0.0
    } else {
        2.0 * m as f64 * n as f64 * k as f64 / (ms * 1e-3) / 1e12
    }
}

/// Device state shared by the bench runs.
pub struct Bench {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    gemm: HopperGemm,
    tuned: Gemms,
    default: Gemms,
    kernels: Kernels,
    workspace: DeviceBuffer,
    scratch: DeviceBuffer,
    cfg: BenchConfig,
    seed: u32,
}

impl std::fmt::Debug for Bench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bench({:?})", self.cfg)
    }
}

/// Timing rounds per measurement (engines interleaved).
pub const ROUNDS: usize = 5;

/// One thing to time.
#[derive(Clone)]
enum Engine {
    Ficco(GemmArgs),
    /// cuBLASLt, autotuned: key, a, b, c.
    Tuned(GemmKey, DevicePtr, DevicePtr, DevicePtr),
    /// cuBLASLt, first heuristic algorithm.
    Default(GemmKey, DevicePtr, DevicePtr, DevicePtr),
    /// ficco's grouped kernel, one launch ([`grouped`]).
    Grouped(std::rc::Rc<super::grouped::GroupedLaunch>),
    /// Autotuned cuBLASLt calls in order, one per group: (key, a, b, c).
    Loop(Vec<(GemmKey, DevicePtr, DevicePtr, DevicePtr)>),
}

/// Operands of one shape.
struct Operands {
    a: DeviceBuffer,
    b: DeviceBuffer,
    c: DeviceBuffer,
    r: DeviceBuffer,
}

impl Bench {
    /// Loads ficco's kernel (reporting its compile), cuBLASLt and the helper kernels.
    pub fn new(ctx: &Arc<CudaContext>, cfg: BenchConfig) -> Result<Self> {
        let gemm = HopperGemm::load(ctx)?;
        ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        let stream = ctx.new_stream().map_err(drv("cuStreamCreate"))?;
        Ok(Bench {
            ctx: ctx.clone(),
            stream,
            tuned: Gemms::new()?,
            default: Gemms::new()?,
            kernels: Kernels::load(ctx)?,
            workspace: DeviceBuffer::alloc(ctx, WORKSPACE_BYTES)?,
            scratch: DeviceBuffer::alloc(ctx, 64)?,
            gemm,
            cfg,
            seed: 1,
        })
    }

    /// ficco's kernel.
    pub fn gemm(&self) -> &HopperGemm {
        &self.gemm
    }

    fn cu(&self) -> sys::CUstream {
        self.stream.cu_stream()
    }

    fn sync(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(drv("cuStreamSynchronize"))
    }

    fn operands(&mut self, m: usize, n: usize, k: usize) -> Result<Operands> {
        let ctx = self.ctx.clone();
        let o = Operands {
            a: DeviceBuffer::alloc(&ctx, m * k * 2)?,
            b: DeviceBuffer::alloc(&ctx, k * n * 2)?,
            c: DeviceBuffer::alloc(&ctx, m * n * 2)?,
            r: DeviceBuffer::alloc(&ctx, m * n * 2)?,
        };
        self.seed = self.seed.wrapping_add(2);
        // SAFETY: the buffers hold the element counts filled.
        unsafe {
            self.kernels
                .fill(&self.stream, o.a.ptr(), (m * k) as u64, self.seed)?;
            self.kernels
                .fill(&self.stream, o.b.ptr(), (k * n) as u64, self.seed + 1)?;
        }
        self.poison(&o.c, m * n)?;
        self.poison(&o.r, m * n)?;
        Ok(o)
    }

    fn poison(&self, buf: &DeviceBuffer, n: usize) -> Result<()> {
        // SAFETY: `buf` holds `n` bf16.
        unsafe { memset_d16_async(buf.ptr(), POISON, n, self.cu()) }
    }

    /// ‖out − reference‖ / ‖reference‖ over `n` bf16 (infinite if `out` has a NaN).
    fn rel_err(&self, out: DevicePtr, reference: DevicePtr, n: usize) -> Result<f64> {
        let acc = self.scratch.ptr();
        // SAFETY: scratch holds 2 f64 + 1 u64; out/reference hold n bf16.
        unsafe {
            memset_d8_async(acc, 0, 24, self.cu())?;
            self.kernels
                .check(&self.stream, out, reference, n as u64, acc, acc.offset(16))?;
        }
        self.sync()?;
        let mut raw = [0u8; 24];
        self.scratch.download(&mut raw)?;
        let f = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&raw[i..i + 8]);
            b
        };
        let (d, r, nans) = (
            f64::from_le_bytes(f(0)),
            f64::from_le_bytes(f(8)),
            u64::from_le_bytes(f(16)),
        );
        if nans > 0 || d.is_nan() {
            return Ok(f64::INFINITY);
        }
        Ok((d / r.max(1e-30)).sqrt())
    }

    /// Enqueues one run of an engine.
    ///
    /// # Safety
    /// The engine's operands must be alive and sized for it.
    unsafe fn enqueue(&mut self, e: &Engine) -> Result<()> {
        let cu = self.cu();
        match e {
            Engine::Ficco(args) => self.gemm.launch(cu, args),
            Engine::Tuned(key, a, b, c) => {
                let ws = self.workspace.ptr();
                self.tuned.gemm(*key, *a, *b, *c, false, ws, cu)
            }
            Engine::Default(key, a, b, c) => {
                let ws = self.workspace.ptr();
                self.default.gemm(*key, *a, *b, *c, false, ws, cu)
            }
            Engine::Grouped(g) => self.gemm.launch_grouped(cu, g),
            Engine::Loop(calls) => {
                let ws = self.workspace.ptr();
                for &(key, a, b, c) in calls {
                    self.tuned.gemm(key, a, b, c, false, ws, cu)?;
                }
                Ok(())
            }
        }
    }

    /// Median times (ms) of the engines, measured in [`ROUNDS`] interleaved
    /// rounds (each round: every engine, warm-up then its share of the
    /// iterations), so that clock drift hits every engine alike.
    ///
    /// # Safety
    /// As [`Bench::enqueue`].
    unsafe fn time_interleaved(&mut self, engines: &[Engine]) -> Result<Vec<f64>> {
        let ctx = self.ctx.clone();
        let cu = self.cu();
        let per = self.cfg.iters.div_ceil(ROUNDS).max(3);
        let warm = self.cfg.warmup.div_ceil(ROUNDS).max(1);
        let mut all: Vec<Vec<f32>> = vec![vec![]; engines.len()];
        for _ in 0..ROUNDS {
            for (i, e) in engines.iter().enumerate() {
                let t = time_ms(&ctx, cu, warm, per, || self.enqueue(e))?;
                all[i].extend(t);
            }
        }
        Ok(all
            .into_iter()
            .map(|mut t| {
                t.sort_by(f32::total_cmp);
                median(&t) as f64
            })
            .collect())
    }

    /// Measures one shape with all three engines.
    pub fn shape(&mut self, s: &BenchShape) -> Result<ShapeRow> {
        let (m, n, k) = (s.m, s.n, s.k);
        let o = self.operands(m, n, k)?;
        let key = GemmKey {
            m,
            n,
            k,
            lda: k,
            ldb: n,
            ldc: n,
            sm_target: None,
        };
        let mut args = GemmArgs::dense(
            m,
            n,
            k,
            DevPtr::<Bf16>::new(o.a.ptr().raw()),
            DevPtr::new(o.b.ptr().raw()),
            DevPtr::new(o.c.ptr().raw()),
        );
        // The chooser's pick, as given; the autotuned pick beside it.
        args.hooks.untuned = true;
        let auto = self.gemm.autotune(&args)?.schedule;
        let auto_args = super::tune::with_schedule(&args, auto);
        let ws = self.workspace.ptr();
        let (pa, pb, pc, pr) = (o.a.ptr(), o.b.ptr(), o.c.ptr(), o.r.ptr());
        let sched = self.gemm.shape(&args)?;
        let (splits, tile_n) = (sched.splits, sched.tile_n);
        let candidates = if self.cfg.variants {
            schedule_variants(m, n, k, self.gemm.sms(), (tile_n, splits, false))
        } else {
            vec![]
        };
        // Correctness on poisoned outputs first.
        // SAFETY: operands sized for the shape, on this device and stream.
        unsafe {
            self.gemm.launch(self.cu(), &args)?;
            self.tuned.tune(key, pa, pb, pr, ws, &self.stream)?;
            self.poison(&o.r, m * n)?;
            self.tuned.gemm(key, pa, pb, pr, false, ws, self.cu())?;
        }
        let rel_err = self.rel_err(pc, pr, m * n)?;
        self.poison(&o.c, m * n)?;
        // SAFETY: as above.
        unsafe { self.default.gemm(key, pa, pb, pc, false, ws, self.cu())? };
        let default_rel_err = self.rel_err(pc, pr, m * n)?;
        self.poison(&o.c, m * n)?;
        // SAFETY: as above.
        unsafe { self.gemm.launch(self.cu(), &auto_args)? };
        let auto_rel_err = self.rel_err(pc, pr, m * n)?;
        // Each variant's output is checked like the chooser's; one that is
        // rejected or fails to launch is reported, not timed.
        let mut variants = vec![];
        let mut engines = vec![
            Engine::Ficco(args),
            Engine::Tuned(key, pa, pb, pc),
            Engine::Default(key, pa, pb, pc),
            Engine::Ficco(auto_args),
        ];
        for (tile, s, tail) in candidates {
            let v = GemmArgs {
                hooks: Hooks {
                    tile_n: Some(tile),
                    split_k: Some(s),
                    split_tail_only: tail,
                    ..Hooks::default()
                },
                ..args
            };
            self.poison(&o.c, m * n)?;
            // SAFETY: as above.
            let launched = self
                .gemm
                .shape(&v)
                .and_then(|_| unsafe { self.gemm.launch(self.cu(), &v) });
            let row = match launched {
                Ok(()) => {
                    engines.push(Engine::Ficco(v));
                    VariantRow {
                        tile_n: tile,
                        splits: s,
                        tail_only: tail,
                        ms: None,
                        ratio_tuned: None,
                        rel_err: Some(self.rel_err(pc, pr, m * n)?),
                        error: None,
                    }
                }
                Err(e) => VariantRow {
                    tile_n: tile,
                    splits: s,
                    tail_only: tail,
                    ms: None,
                    ratio_tuned: None,
                    rel_err: None,
                    error: Some(e.to_string()),
                },
            };
            variants.push(row);
        }
        // SAFETY: as above.
        let t = unsafe { self.time_interleaved(&engines)? };
        let (ficco_ms, tuned_ms, default_ms, auto_ms) = (t[0], t[1], t[2], t[3]);
        self.sync()?;
        let mut timed = t[4..].iter();
        for v in variants.iter_mut().filter(|v| v.error.is_none()) {
            if let Some(&ms) = timed.next() {
                v.ms = Some(ms);
                v.ratio_tuned = Some(ms / tuned_ms);
            }
        }
        let (best, best_ms) = best_schedule(tile_n, splits, ficco_ms, &variants);
        Ok(ShapeRow {
            m,
            n,
            k,
            kind: s.kind,
            uses: s.uses.len(),
            first_use: s.uses.first().cloned().unwrap_or_default(),
            splits,
            tile_n,
            ficco_ms,
            tuned_ms,
            default_ms,
            ficco_tflops: tflops(m, n, k, ficco_ms),
            tuned_tflops: tflops(m, n, k, tuned_ms),
            default_tflops: tflops(m, n, k, default_ms),
            ratio_tuned: ficco_ms / tuned_ms,
            ratio_default: ficco_ms / default_ms,
            rel_err,
            default_rel_err,
            variants,
            best,
            best_ms,
            best_ratio_tuned: best_ms / tuned_ms,
            auto: schedule_label(auto),
            auto_ms,
            auto_ratio_tuned: auto_ms / tuned_ms,
            auto_rel_err,
        })
    }

    /// Times each hook setting on one shape against the plain launch. Hook
    /// flags are already set (the wait never blocks), the destination table
    /// points back into C, so every setting computes the plain result.
    pub fn hook_costs(&mut self, m: usize, n: usize, k: usize) -> Result<Vec<HookRow>> {
        let o = self.operands(m, n, k)?;
        let ctx = self.ctx.clone();
        let mut plain = GemmArgs::dense(
            m,
            n,
            k,
            DevPtr::new(o.a.ptr().raw()),
            DevPtr::new(o.b.ptr().raw()),
            DevPtr::new(o.c.ptr().raw()),
        );
        plain.hooks.untuned = true;
        // Reference output of the plain launch.
        // SAFETY: operands sized for the shape.
        unsafe { self.gemm.launch(self.cu(), &plain)? };
        // SAFETY: both hold m*n bf16; the stream is live.
        unsafe { memcpy_dtod_async(o.r.ptr(), o.c.ptr(), m * n * 2, self.cu())? };
        let rows = (m / 8).max(1);
        let blocks = m.div_ceil(rows);
        let flags = DeviceBuffer::alloc(&ctx, blocks * 4)?;
        let counters = DeviceBuffer::alloc(&ctx, blocks * 4)?;
        let table = DeviceBuffer::alloc(&ctx, blocks * 8)?;
        let flag_bytes: Vec<u8> = (0..blocks).flat_map(|_| 1u32.to_le_bytes()).collect();
        flags.upload(&flag_bytes)?;
        counters.upload(&vec![0u8; blocks * 4])?;
        let entries: Vec<u64> = (0..blocks)
            .map(|b| o.c.ptr().raw() + (b * rows * n * 2) as u64)
            .collect();
        let tbl: Vec<u8> = entries.iter().flat_map(|e| e.to_le_bytes()).collect();
        table.upload(&tbl)?;
        // The same table as tensor maps (TMA-store epilogue), where the rows
        // per block allow (multiples of 64).
        let maps = self
            .gemm
            .dest_maps(
                &entries,
                n,
                rows as u32,
                m,
                n,
                DevPtr::new(o.c.ptr().raw()),
                n,
            )
            .ok();
        let wait = WaitHook {
            flags: DevPtr::new(flags.ptr().raw()),
            rows_per_flag: rows as u32,
            epoch: 1,
        };
        let signal = SignalHook {
            counters: DevPtr::new(counters.ptr().raw()),
            rows_per_counter: rows as u32,
        };
        let dest = DestHook {
            table: DevPtr::new(table.ptr().raw()),
            ld: n,
            rows_per_block: rows as u32,
            add: false,
            maps: None,
        };
        let dest_maps = maps.as_ref().map(|mp| DestHook {
            maps: Some(mp.ptr()),
            ..dest
        });
        let sms = self.gemm.sms();
        let tiles_m = m.div_ceil(BLOCK_M) as u32;
        let mut settings: Vec<(String, Hooks)> = vec![("plain".into(), Hooks::default())];
        for s in [sms - sms / 8, sms * 3 / 4, (sms / 2).max(1)] {
            settings.push((
                format!("sm_budget={s}"),
                Hooks {
                    sm_budget: Some(s),
                    ..Hooks::default()
                },
            ));
        }
        let base = self.gemm.shape(&plain)?;
        let tile = base.tile_n;
        for st in (super::MIN_STAGES..tile.max_stages()).rev() {
            settings.push((
                format!("stages={st}"),
                Hooks {
                    occupancy: Occupancy {
                        stages: st,
                        extra_smem: 0,
                    },
                    ..Hooks::default()
                },
            ));
        }
        let extra = self.gemm.max_extra_smem(tile, tile.max_stages()) / 1024 * 1024;
        settings.push((
            format!(
                "stages={}+extra_smem={}KiB",
                tile.max_stages(),
                extra / 1024
            ),
            Hooks {
                occupancy: Occupancy {
                    stages: tile.max_stages(),
                    extra_smem: extra,
                },
                ..Hooks::default()
            },
        ));
        for gm in [4, 8, 32] {
            settings.push((
                format!("group_m={gm}"),
                Hooks {
                    group_m: Some(gm),
                    ..Hooks::default()
                },
            ));
        }
        let start = tiles_m / 2;
        let h3 = Hooks {
            m_start_block: start,
            ..Hooks::default()
        };
        settings.push((format!("tile_start={start}"), h3));
        settings.push((
            "wait(flags set)".into(),
            Hooks {
                wait: Some(wait),
                ..Hooks::default()
            },
        ));
        settings.push((
            "signal".into(),
            Hooks {
                signal: Some(signal),
                ..Hooks::default()
            },
        ));
        settings.push((
            "dest(table->C) register".into(),
            Hooks {
                dest: Some(dest),
                register_epilogue: true,
                ..Hooks::default()
            },
        ));
        for delay in [2, 4] {
            settings.push((
                format!("signal delay={delay}"),
                Hooks {
                    signal: Some(signal),
                    signal_delay: delay,
                    ..Hooks::default()
                },
            ));
        }
        settings.push((
            "dest(table->C)".into(),
            Hooks {
                dest: Some(dest),
                ..Hooks::default()
            },
        ));
        let h36 = Hooks {
            m_start_block: start,
            wait: Some(wait),
            signal: Some(signal),
            dest: Some(dest),
            ..Hooks::default()
        };
        settings.push((HOOKS_3_TO_6.into(), h36));
        settings.push((
            HOOKS_3_TO_6_REGISTER.into(),
            Hooks {
                register_epilogue: true,
                ..h36
            },
        ));
        // The ping-pong tile, plain and with hooks 3-6: its epilogue and
        // signals run under the other warpgroup's main loop.
        let pp = Hooks {
            tile_n: Some(TileN::Pp128),
            split_k: Some(1),
            ..Hooks::default()
        };
        settings.push((PINGPONG.into(), pp));
        // Each hook alone on the ping-pong tile.
        for (name, h) in [
            (
                "pingpong wait",
                Hooks {
                    wait: Some(wait),
                    ..pp
                },
            ),
            (
                "pingpong signal",
                Hooks {
                    signal: Some(signal),
                    ..pp
                },
            ),
            (
                "pingpong dest",
                Hooks {
                    dest: Some(dest),
                    ..pp
                },
            ),
            (
                "pingpong dest+signal",
                Hooks {
                    dest: Some(dest),
                    signal: Some(signal),
                    ..pp
                },
            ),
        ] {
            settings.push((name.into(), h));
        }
        settings.push((
            HOOKS_3_TO_6_PINGPONG.into(),
            Hooks {
                tile_n: pp.tile_n,
                split_k: pp.split_k,
                ..h36
            },
        ));
        // The destination hook through per-block tensor maps (TMA stores).
        if let Some(dm) = dest_maps {
            settings.push((
                "dest(maps)".into(),
                Hooks {
                    dest: Some(dm),
                    ..Hooks::default()
                },
            ));
            settings.push((
                "pingpong dest(maps)".into(),
                Hooks {
                    dest: Some(dm),
                    ..pp
                },
            ));
            settings.push((
                HOOKS_3_TO_6_MAPS.into(),
                Hooks {
                    dest: Some(dm),
                    ..h36
                },
            ));
            settings.push((
                HOOKS_3_TO_6_PINGPONG_MAPS.into(),
                Hooks {
                    tile_n: pp.tile_n,
                    split_k: pp.split_k,
                    dest: Some(dm),
                    ..h36
                },
            ));
        }
        // A setting the kernel rejects or cannot launch is reported as
        // failed; the others are still measured.
        let mut checked = vec![];
        for (_, hooks) in &settings {
            // Every setting as given: no tuned schedule (the shape may have
            // been tuned with other hooks), so that only the setting differs.
            let args = GemmArgs {
                hooks: Hooks {
                    untuned: true,
                    ..*hooks
                },
                ..plain
            };
            self.poison(&o.c, m * n)?;
            // SAFETY: operands and hook arrays sized for the shape.
            let launched = unsafe { self.gemm.launch(self.cu(), &args) };
            checked.push(match launched {
                Ok(()) => Ok((args, self.rel_err(o.c.ptr(), o.r.ptr(), m * n)?)),
                Err(e) => Err(e.to_string()),
            });
        }
        // Each setting is timed against the plain launch in interleaved
        // pairs: the GPU's clock follows its power draw, so settings timed
        // apart would compare different clocks.
        let mut rows = vec![];
        for ((setting, _), c) in settings.into_iter().zip(checked) {
            let row = match c {
                Ok((args, rel_err)) => {
                    // SAFETY: as above; the buffers live until the end of this function.
                    let t = unsafe {
                        self.time_interleaved(&[Engine::Ficco(plain), Engine::Ficco(args)])?
                    };
                    let (base, ms) = (t[0], t[1]);
                    HookRow {
                        m,
                        n,
                        k,
                        setting,
                        ms,
                        tflops: tflops(m, n, k, ms),
                        cost: if base > 0.0 { ms / base - 1.0 } else { 0.0 },
                        rel_err,
                        error: None,
                    }
                }
                Err(e) => HookRow {
                    m,
                    n,
                    k,
                    setting,
                    ms: 0.0,
                    tflops: 0.0,
                    cost: 0.0,
                    rel_err: 0.0,
                    error: Some(e),
                },
            };
            rows.push(row);
        }
        self.sync()?;
        Ok(rows)
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

/// What [`run`] reports while it measures.
#[derive(Debug)]
pub enum Event<'a> {
    /// The kernel is loaded: the device's name and SMs, and the cubin's cost.
    Loaded {
        device: &'a str,
        sms: u32,
        /// Clusters of 2 resident at once (the cluster tiles' grid).
        clusters: u32,
        compile: &'a super::CompileInfo,
    },
    /// One shape measured (index, count).
    Row(usize, usize, &'a ShapeRow),
    /// The hook costs of one shape.
    Hooks(&'a [HookRow]),
}

/// The whole benchmark on GPU `device`: every shape with the three engines,
/// then (with `hooks`) every hook setting on [`HOOK_SHAPES`]. Fails with the
/// loader's typed error where there is no GPU or library.
pub fn run(
    device: usize,
    suite: &str,
    shapes: &[BenchShape],
    cfg: BenchConfig,
    hooks: bool,
    on: &mut dyn FnMut(Event<'_>),
) -> Result<Report> {
    let (ctx, name) = open_device(device)?;
    let mut bench = Bench::new(&ctx, cfg)?;
    let compile = bench.gemm().compile_info().clone();
    let sms = bench.gemm().sms();
    let clusters = bench.gemm().max_clusters();
    on(Event::Loaded {
        device: &name,
        sms,
        clusters,
        compile: &compile,
    });
    let mut rows = Vec::with_capacity(shapes.len());
    for (i, s) in shapes.iter().enumerate() {
        let r = bench.shape(s)?;
        on(Event::Row(i, shapes.len(), &r));
        rows.push(r);
    }
    let mut hook_rows = vec![];
    if hooks {
        for (m, n, k) in HOOK_SHAPES {
            let h = bench.hook_costs(m, n, k)?;
            on(Event::Hooks(&h));
            hook_rows.extend(h);
        }
    }
    Ok(Report {
        device: name,
        sms,
        clusters,
        compile,
        config: cfg,
        suite: suite.to_string(),
        summary: summarize(&rows),
        rows,
        hooks: hook_rows,
    })
}

/// A context on GPU `device` and the device's name.
fn open_device(device: usize) -> Result<(Arc<CudaContext>, String)> {
    crate::loader::require()?;
    let found = crate::info::device_count()?;
    if device >= found {
        return Err(CudaError::NotEnoughGpus {
            wanted: device + 1,
            found,
        });
    }
    let ctx = CudaContext::new(device).map_err(drv("cuCtxCreate"))?;
    let name = ctx.name().unwrap_or_else(|_| format!("GPU {device}"));
    Ok((ctx, name))
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
    compile: &super::CompileInfo,
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
            super::CacheOutcome::Memory => "in memory",
            super::CacheOutcome::Hit => "disk cache hit",
            super::CacheOutcome::Stored => "compiled, cached",
            super::CacheOutcome::Uncached => "compiled, not cached",
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

/// The shapes hook costs are measured on: 8192³, a whole MLP-up GEMM and a
/// chunk-sized one.
pub const HOOK_SHAPES: [(usize, usize, usize); 3] =
    [(8192, 8192, 8192), (2048, 14336, 4096), (1024, 4096, 7168)];

/// The hook setting with the tile order, input wait, output signal and
/// destination hooks all on.
pub const HOOKS_3_TO_6: &str = "hooks 3-6";
/// [`HOOKS_3_TO_6`] with the register epilogue ([`Hooks::register_epilogue`])
/// instead of the staged one (the default).
pub const HOOKS_3_TO_6_REGISTER: &str = "hooks 3-6 register";
/// The plain ping-pong tile ([`TileN::Pp128`]).
pub const PINGPONG: &str = "pingpong";
/// [`HOOKS_3_TO_6`] on the ping-pong tile.
pub const HOOKS_3_TO_6_PINGPONG: &str = "hooks 3-6 pingpong";
/// [`HOOKS_3_TO_6`] with the destination hook's tensor maps ([`DestHook::maps`]).
pub const HOOKS_3_TO_6_MAPS: &str = "hooks 3-6 maps";
/// [`HOOKS_3_TO_6_PINGPONG`] with the destination hook's tensor maps.
pub const HOOKS_3_TO_6_PINGPONG_MAPS: &str = "hooks 3-6 pingpong maps";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama3_bench_shapes_come_from_the_core() {
        let text = include_str!("../../../../suites/llama3.toml");
        let suite = ficco_core::problem::suite::parse(text, "llama3.toml").unwrap();
        let shapes = bench_shapes(&suite.scenarios);
        assert_eq!((shapes[0].m, shapes[0].kind), (SQUARE, "square"));
        assert!(shapes.iter().any(|s| s.kind.contains("whole")));
        assert!(shapes.iter().any(|s| s.kind.contains("chunk")));
        // ag-gemm 2048 x 4096 x 3072 at P=2: whole 2048 rows, fine8 128 rows.
        let find = |m, n, k| shapes.iter().find(|s| (s.m, s.n, s.k) == (m, n, k));
        assert!(find(2048, 3072, 4096).unwrap().kind.contains("whole"));
        let fine8 = find(128, 3072, 4096).unwrap();
        assert!(fine8
            .uses
            .contains(&"llama3-8b.qkv.t2048.p2 fine8".to_string()));
        let mut seen = std::collections::HashSet::new();
        for s in &shapes {
            assert!(s.n % 8 == 0 && s.k % 8 == 0, "{s:?}");
            assert!(seen.insert((s.m, s.n, s.k)), "duplicate {s:?}");
        }
    }

    #[test]
    fn summary_math() {
        let row = |r: f64, kind| ShapeRow {
            m: 1,
            n: 8,
            k: 8,
            kind,
            uses: 2,
            first_use: "x whole".into(),
            splits: 1,
            tile_n: TileN::N256,
            ficco_ms: r,
            tuned_ms: 1.0,
            default_ms: 1.0,
            ficco_tflops: 0.0,
            tuned_tflops: 0.0,
            default_tflops: 0.0,
            ratio_tuned: r,
            ratio_default: r,
            rel_err: 0.0,
            default_rel_err: 0.0,
            variants: vec![],
            best: "256/1".into(),
            best_ms: r,
            best_ratio_tuned: r,
            auto: "256/1".into(),
            auto_ms: r,
            auto_ratio_tuned: r,
            auto_rel_err: 0.0,
        };
        let s = summarize(&[row(0.5, "whole"), row(2.0, "chunk")]);
        assert!((s.geomean_ratio_tuned - 1.0).abs() < 1e-12);
        assert_eq!(s.worst_ratio_tuned, 2.0);
        assert_eq!(s.chunk_time_ratio, 2.0);
        assert_eq!(s.square_tflops, None);
        let s = summarize(&[row(2.0, "chunk"), row(1.0, "whole+chunk")]);
        assert_eq!(s.chunk_time_ratio, 1.5);
        assert_eq!(s.best_differs, 0);
        assert_eq!((s.auto_differs, s.auto_chunk_time_ratio), (0, 1.5));
        // The autotuned pick 4x faster on the chunk shape: its columns follow it.
        let mut tuned = row(2.0, "chunk");
        tuned.auto = "128/4t".into();
        tuned.auto_ms = 0.5;
        tuned.auto_ratio_tuned = 0.5;
        let s = summarize(&[tuned, row(1.0, "whole")]);
        assert_eq!(s.auto_differs, 1);
        assert_eq!(s.auto_chunk_time_ratio, 0.5);
        assert!((s.auto_geomean_ratio_tuned - 0.5f64.sqrt()).abs() < 1e-12);
        assert_eq!((s.auto_worst_ratio_tuned, s.worst_ratio_tuned), (1.0, 2.0));
        // A variant twice as fast on the chunk shape: the best columns follow it.
        let mut fast = row(2.0, "chunk");
        fast.best = "128/2".into();
        fast.best_ms = 1.0;
        fast.best_ratio_tuned = 1.0;
        let s = summarize(&[fast, row(1.0, "whole+chunk")]);
        assert_eq!(s.chunk_time_ratio, 1.5);
        assert_eq!(s.best_chunk_time_ratio, 1.0);
        assert_eq!(s.best_geomean_ratio_tuned, 1.0);
        assert_eq!(s.worst_ratio_tuned, 2.0);
        assert_eq!(s.best_worst_ratio_tuned, 1.0);
        assert_eq!(s.best_differs, 1);
    }

    #[test]
    fn best_schedule_skips_failed_and_wrong_variants() {
        let v = |tile, splits, ms: Option<f64>, err: Option<f64>| VariantRow {
            tile_n: tile,
            splits,
            tail_only: splits == 2,
            ms,
            ratio_tuned: None,
            rel_err: err,
            error: ms.is_none().then(|| "rejected".to_string()),
        };
        let vs = [
            v(TileN::N128, 1, None, None),
            v(TileN::N128, 2, Some(0.5), Some(0.3)),
            v(TileN::N256, 2, Some(0.8), Some(1e-4)),
            v(TileN::N256, 3, Some(0.9), Some(1e-4)),
        ];
        assert_eq!(
            best_schedule(TileN::N256, 1, 1.0, &vs),
            ("256/2t".to_string(), 0.8)
        );
        assert_eq!(
            best_schedule(TileN::N256, 1, 0.7, &vs),
            ("256/1".to_string(), 0.7)
        );
    }

    #[test]
    fn the_table_reads_like_nccl_tests() {
        let row = ShapeRow {
            m: 8192,
            n: 8192,
            k: 8192,
            kind: "square",
            uses: 3,
            first_use: "8192^3".into(),
            splits: 1,
            tile_n: TileN::N256,
            ficco_ms: 1.5,
            tuned_ms: 1.6,
            default_ms: 1.6,
            ficco_tflops: 733.0,
            tuned_tflops: 687.2,
            default_tflops: 687.2,
            ratio_tuned: 0.9375,
            ratio_default: 0.9375,
            rel_err: 1e-4,
            default_rel_err: 0.0,
            variants: vec![VariantRow {
                tile_n: TileN::N128,
                splits: 1,
                tail_only: false,
                ms: Some(1.55),
                ratio_tuned: Some(1.55 / 1.6),
                rel_err: Some(1e-4),
                error: None,
            }],
            best: "256/1".into(),
            best_ms: 1.5,
            best_ratio_tuned: 0.9375,
            auto: "128/2".into(),
            auto_ms: 1.4,
            auto_ratio_tuned: 0.875,
            auto_rel_err: 1e-4,
        };
        let hook = HookRow {
            m: 8192,
            n: 8192,
            k: 8192,
            setting: HOOKS_3_TO_6.into(),
            ms: 1.6,
            tflops: 687.0,
            cost: 0.092,
            rel_err: 0.0,
            error: None,
        };
        let failed = HookRow {
            setting: HOOKS_3_TO_6_REGISTER.into(),
            error: Some("ficco hgemm: rejected".into()),
            ..hook.clone()
        };
        let rows = vec![row];
        let report = Report {
            device: "NVIDIA H200".into(),
            sms: 132,
            clusters: 66,
            compile: super::super::CompileInfo {
                ms: 10.4,
                cache: super::super::CacheOutcome::Hit,
                path: None,
                nvrtc: (13, 0),
            },
            config: BenchConfig::default(),
            suite: "suites/llama3.toml".into(),
            summary: summarize(&rows),
            rows,
            hooks: vec![hook, failed],
        };
        let t = table(&report);
        for want in [
            "# device: NVIDIA H200, 132 SMs, 66 clusters of 2 resident; ficco cubin: 10.4 ms (disk cache hit), NVRTC 13.0",
            "  8192   8192   8192      square   256/1",
            "   1.5000   733.0    1.6000   687.2",
            "8192^3 (+2)",
            "# 8192^3: ficco 733 TFLOP/s, cuBLASLt autotuned 687, default 687 (target >= 760)",
            "geomean ficco/cuBLASLt 0.938",
            "# hooks 3-6 (flags set): +9.2% at 8192x8192x8192 (target <= 3%)",
            "hooks 3-6 register failed: ficco hgemm: rejected",
            "1.0e-4    0.0e0   256/1  0.938   128/2  0.875  8192^3 (+2)",
            "# ficco autotuned (the executor's pick; differs from the chooser's on 1): geomean 0.875",
        ] {
            assert!(t.contains(want), "{want:?} not in\n{t}");
        }
        // Every line is a comment, a data row of the same columns, or a failed setting.
        let data: Vec<&str> = t.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(data.len(), 3, "{t}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["rows"][0]["first_use"], "8192^3");
        assert_eq!(json["summary"]["square_tflops"][0], 733.0);
        assert_eq!(json["compile"]["cache"], "Hit");
        assert_eq!(json["rows"][0]["variants"][0]["tile_n"], "N128");
        assert_eq!(json["rows"][0]["best"], "256/1");
        assert_eq!(json["summary"]["best_differs"], 0);
        assert_eq!(json["rows"][0]["auto"], "128/2");
        assert_eq!(json["summary"]["auto_geomean_ratio_tuned"], 0.875);
    }
}
