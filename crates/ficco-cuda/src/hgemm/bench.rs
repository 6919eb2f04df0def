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
//!
//! This file is the measuring (device state, engines, one shape, the whole
//! run); `bench/hooks.rs` the hook rows, `bench/report.rs` the shapes, rows,
//! summary and table (no device work), `bench/grouped.rs` the grouped mode.

pub mod grouped;
mod hooks;
mod report;

#[cfg(test)]
mod tests;

pub use hooks::HOOK_SHAPES;
pub use report::{
    bench_shapes, best_schedule, hook_table, summarize, table, table_footer, table_header,
    table_row, BenchConfig, BenchShape, HookRow, Report, ShapeRow, Summary, VariantRow,
    HOOKS_3_TO_6, HOOKS_3_TO_6_MAPS, HOOKS_3_TO_6_PINGPONG, HOOKS_3_TO_6_PINGPONG_MAPS,
    HOOKS_3_TO_6_REGISTER, PINGPONG, SQUARE, VARIANT_MAX_REL_ERR,
};

use super::tune::{schedule_label, schedule_variants};
use super::{Bf16, GemmArgs, Hooks, HopperGemm, TypedPtr};
use crate::controls::time_ms;
use crate::driver::cuda::memset_d8_async;
use crate::error::{drv, CudaError, Result};
use crate::gemm::{GemmKey, Gemms, WORKSPACE_BYTES};
use crate::kernels::Kernels;
use crate::mem::{memset_d16_async, DeviceBuffer, DevicePtr};
use cudarc::driver::{sys, CudaContext, CudaStream};
use report::tflops;
use std::sync::Arc;

/// bf16 quiet NaN: the poison written into outputs before each run.
pub const POISON: u16 = 0x7fc0;

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
enum BenchEngine {
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
    unsafe fn enqueue(&mut self, e: &BenchEngine) -> Result<()> {
        let cu = self.cu();
        match e {
            BenchEngine::Ficco(args) => self.gemm.launch(cu, args),
            BenchEngine::Tuned(key, a, b, c) => {
                let ws = self.workspace.ptr();
                self.tuned.gemm(*key, *a, *b, *c, false, ws, cu)
            }
            BenchEngine::Default(key, a, b, c) => {
                let ws = self.workspace.ptr();
                self.default.gemm(*key, *a, *b, *c, false, ws, cu)
            }
            BenchEngine::Grouped(g) => self.gemm.launch_grouped(cu, g),
            BenchEngine::Loop(calls) => {
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
    unsafe fn time_interleaved(&mut self, engines: &[BenchEngine]) -> Result<Vec<f64>> {
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
            .map(|t| ficco_core::stats::median(&t).unwrap_or(0.0))
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
            b_transposed: false,
        };
        let mut args = GemmArgs::dense(
            m,
            n,
            k,
            TypedPtr::<Bf16>::new(o.a.ptr().raw()),
            TypedPtr::new(o.b.ptr().raw()),
            TypedPtr::new(o.c.ptr().raw()),
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
            BenchEngine::Ficco(args),
            BenchEngine::Tuned(key, pa, pb, pc),
            BenchEngine::Default(key, pa, pb, pc),
            BenchEngine::Ficco(auto_args),
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
                    engines.push(BenchEngine::Ficco(v));
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
