//! `ficco characterize`, the measuring loop: opens the GPUs, runs the probe
//! plans of every step ([`ficco_core::sim::calibrate::plans`]) through
//! [`GpuBackend`] and collects a [`Characterization`].
//!
//! What is measured and why, the data types, the fit to a hardware profile,
//! the profile TOML and the tables are pure and live in the core's
//! calibration stage, [`ficco_core::sim::calibrate`].

use crate::backend::GpuBackend;
use crate::error::{CudaError, Result};
use ficco_core::plan::lower::probe::actual_bytes;
use ficco_core::plan::Plan;
use ficco_core::sim::calibrate::plans::{
    alone_plan, contention_plan, curve_plan, decomp_cuts, decomp_plan, pull_bytes, pull_plan,
};
use ficco_core::sim::calibrate::{
    jobs, victim_durations, CalibrationJob, CharOptions, Characterization, ContentionPoint,
    CurvePoint, DecompShape, DecompSplit, SplitDim, Traffic, Victim,
};
use std::collections::HashMap;

/// (victim is the GEMM, GEMM shape, traffic, bytes).
type AloneKey = (bool, (usize, usize, usize), Traffic, usize);

struct Runner<'a> {
    o: &'a CharOptions,
    be: GpuBackend,
    /// (victim is gemm, gemm, traffic, bytes) -> per-task alone ms.
    alone: HashMap<AloneKey, f64>,
}

impl Runner<'_> {
    fn iters(&mut self, job: &CalibrationJob) {
        let (warmup, iters) = job.iters(self.o.quick);
        self.be.config.warmup = warmup;
        self.be.config.iters = iters;
    }

    fn time(&mut self, p: &Plan) -> Result<f64> {
        Ok(self.be.measure_plan(p, false, false)?.time_ms)
    }

    fn victim_ms(&mut self, p: &Plan, stream: usize) -> Result<(f64, usize)> {
        let m = self.be.measure_plan(p, false, true)?;
        let tl = m
            .timeline
            .ok_or_else(|| CudaError::Plan("no timeline measured".into()))?;
        let d = victim_durations(&tl, stream);
        // NaN when no victim task ran (the caller reports the count).
        Ok((ficco_core::stats::median(&d).unwrap_or(f64::NAN), d.len()))
    }

    fn decomp(&mut self, shape: (usize, usize, usize)) -> Result<DecompShape> {
        let g = self.be.gpus();
        let whole = self.time(&decomp_plan(g, shape, SplitDim::M, 1))?;
        let (m, k, n) = shape;
        let mut splits = vec![];
        for (d, c) in decomp_cuts(self.o, shape) {
            let t = self.time(&decomp_plan(g, shape, d, c))?;
            splits.push(DecompSplit {
                split: d,
                chunks: c,
                time_ms: t,
                ratio: t / whole,
            });
        }
        Ok(DecompShape {
            m,
            k,
            n,
            whole_ms: whole,
            whole_tflops: 2.0 * (m * k * n) as f64 / whole / 1e9,
            splits,
        })
    }

    /// Alone per-task time of the victim, cached.
    fn alone(
        &mut self,
        gemm_victim: bool,
        gemm: (usize, usize, usize),
        traffic: Traffic,
        bytes: usize,
    ) -> Result<f64> {
        let key = if gemm_victim {
            (true, gemm, Traffic::Copy, 0)
        } else {
            (false, (0, 0, 0), traffic, bytes)
        };
        if let Some(v) = self.alone.get(&key) {
            return Ok(*v);
        }
        let g = self.be.gpus();
        let p = alone_plan(g, gemm_victim, gemm, traffic, bytes);
        let (t, _) = self.victim_ms(&p, 0)?;
        self.alone.insert(key, t);
        Ok(t)
    }

    fn contention(
        &mut self,
        gemm: (usize, usize, usize),
        traffic: Traffic,
        bytes: usize,
    ) -> Result<Vec<ContentionPoint>> {
        let g = self.be.gpus();
        let tg = self.alone(true, gemm, traffic, bytes)?;
        let tc = self.alone(false, gemm, traffic, bytes)?;
        let mut out = vec![];
        for (victim, alone, other) in [(Victim::Gemm, tg, tc), (Victim::Comm, tc, tg)] {
            let (p, stream) = contention_plan(g, victim, gemm, traffic, bytes, alone, other);
            let (t, s) = self.victim_ms(&p, stream)?;
            out.push(ContentionPoint {
                victim,
                traffic,
                gpus: g,
                gemm: [gemm.0, gemm.1, gemm.2],
                comm_bytes: actual_bytes(traffic, bytes, g),
                alone_ms: alone,
                together_ms: t,
                slowdown: t / alone,
                samples: s,
            });
        }
        Ok(out)
    }

    fn curve(&mut self, traffic: Traffic) -> Result<Vec<CurvePoint>> {
        let g = self.be.gpus();
        let mut out = vec![];
        for bytes in self.o.curve_sizes() {
            let t = self.time(&curve_plan(g, traffic, bytes))?;
            let b = actual_bytes(traffic, bytes, g);
            out.push(CurvePoint::measured(traffic, g, g - 1, b, t));
        }
        Ok(out)
    }

    fn pull(&mut self, peers: usize) -> Result<Vec<CurvePoint>> {
        let g = self.be.gpus();
        let mut out = vec![];
        for bytes in self.o.curve_sizes() {
            let b = pull_bytes(bytes);
            let t = self.time(&pull_plan(g, peers, b))?;
            out.push(CurvePoint::measured(Traffic::Copy, g, peers, b, t));
        }
        Ok(out)
    }
}

/// Opens `opts.gpus` GPUs and measures everything (see
/// [`ficco_core::sim::calibrate`]); `progress(done, total, what)` is called
/// before each step and at the end. The result has no fit yet
/// ([`ficco_core::sim::calibrate::fit_profile`]).
pub fn characterize(
    opts: &CharOptions,
    progress: &mut dyn FnMut(usize, usize, &str),
) -> Result<Characterization> {
    let start = std::time::Instant::now();
    let all = jobs(opts);
    let total = all.len();
    let first = GpuBackend::open(opts.gpus)?;
    let device = {
        let gi = first.info().gpus.first();
        format!(
            "{}x {}",
            opts.gpus,
            gi.map(|g| g.name.clone()).unwrap_or_else(|| "GPU".into())
        )
    };
    let sm_count = first.info().gpus.first().map(|g| g.sms).unwrap_or(0);
    let copy_engines = first
        .info()
        .gpus
        .first()
        .map(|g| g.copy_engines)
        .unwrap_or(0);
    let mut runner = Runner {
        o: opts,
        be: first,
        alone: HashMap::new(),
    };
    let mut ch = Characterization {
        device,
        options: opts.clone(),
        sm_count,
        copy_engines,
        decomposition: vec![],
        contention: vec![],
        curves: vec![],
        elapsed_s: 0.0,
        fit: None,
    };
    for (i, job) in all.iter().enumerate() {
        progress(i, total, &job.label());
        let g = job.gpus(opts.gpus);
        if runner.be.gpus() != g {
            // One set of communicators at a time: drop the old one first.
            let old = std::mem::replace(&mut runner.be, GpuBackend::open(g)?);
            drop(old);
            runner.alone.clear();
        }
        runner.iters(job);
        match job {
            CalibrationJob::Decomp { shape } => ch.decomposition.push(runner.decomp(*shape)?),
            CalibrationJob::Contention {
                gemm,
                traffic,
                bytes,
            } => ch
                .contention
                .extend(runner.contention(*gemm, *traffic, *bytes)?),
            CalibrationJob::Curve { traffic, .. } => ch.curves.extend(runner.curve(*traffic)?),
            CalibrationJob::Pull { peers } => ch.curves.extend(runner.pull(*peers)?),
        }
    }
    progress(total, total, "done");
    ch.elapsed_s = start.elapsed().as_secs_f64();
    Ok(ch)
}
