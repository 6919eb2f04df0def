//! Preparing a problem (inputs and the sequential reference) and measuring
//! a plan against it: bind, load inputs, a checked run, the timed runs.

use super::{GpuBackend, Prepared};
use crate::error::{CudaError, Result};
use crate::exec::{self, RunSpec};
use crate::mem::DevicePtr;
use ficco_core::plan::{BufferRole, Plan};
use ficco_core::problem::workload::{Op, ELEM_BYTES};
use ficco_core::run::timeline::{Span, Timeline};
use ficco_core::run::Measured;
use ficco_core::settings::trace;
use ficco_core::stats::median;

impl GpuBackend {
    /// Copies the prepared inputs into the plan's input buffers, or fills them
    /// with fresh random data when nothing is prepared for this problem; poisons
    /// outputs and scratch when `poison`.
    pub(super) fn load_inputs(
        &mut self,
        plan: &Plan,
        ptrs: &[Vec<DevicePtr>],
        poison: bool,
        strict: bool,
    ) -> Result<()> {
        let seed = self.config.seed;
        let prepared = self.prepared.as_ref().filter(|p| p.problem == plan.problem);
        for (i, rank) in self.ranks.iter().enumerate() {
            let r = rank.rank;
            let rp = &plan.ranks[r];
            for (b, buf) in rp.buffers.iter().enumerate() {
                let n = buf.rows * buf.cols;
                match buf.role {
                    BufferRole::InputA | BufferRole::InputB | BufferRole::InputX => {
                        let src = prepared.and_then(|p| {
                            p.inputs.get(i)?.iter().find(|(role, _)| *role == buf.role)
                        });
                        match src {
                            Some((_, d)) if d.bytes() == buf.bytes() => {
                                exec::copy_d2d(rank, ptrs[r][b], d.ptr(), buf.bytes())?
                            }
                            Some(_) if strict => {
                                return Err(CudaError::Plan(format!(
                                    "input buffer '{}' of rank {r} has a different size than the prepared input",
                                    buf.name
                                )))
                            }
                            // SAFETY: the pool allocation holds n bf16.
                            _ => unsafe {
                                rank.kernels.fill(
                                    rank.control(),
                                    ptrs[r][b],
                                    n as u64,
                                    seed ^ ((r as u32) << 8) ^ (buf.role as u32),
                                )?
                            },
                        }
                    }
                    BufferRole::Output | BufferRole::Scratch if poison => {
                        exec::poison(rank, ptrs[r][b], n)?
                    }
                    _ => {}
                }
            }
        }
        self.sync_all()
    }

    pub(super) fn output_of(plan: &Plan, r: usize) -> Result<usize> {
        plan.ranks[r]
            .buffer_with(BufferRole::Output)
            .ok_or_else(|| CudaError::Plan(format!("rank {r} has no Output buffer")))
    }

    /// Draws fresh inputs, runs the sequential plan once and keeps its outputs
    /// as the reference for `plan.problem`.
    pub fn prepare_plan(&mut self, seq: &Plan) -> Result<()> {
        let res = self.prepare_inner(seq);
        self.job_result(res)
    }

    pub(super) fn prepare_inner(&mut self, seq: &Plan) -> Result<()> {
        let copy_form = self.runnable(seq)?;
        let seq = copy_form.as_ref().unwrap_or(seq);
        self.prepared = None;
        self.config.seed = self
            .config
            .seed
            .wrapping_mul(747796405)
            .wrapping_add(2891336453);
        let ptrs = self.bind(seq, &[])?;
        // Inputs: own allocations, filled with ~U(-1, 1).
        let mut inputs = vec![];
        for rank in &self.ranks {
            let r = rank.rank;
            let rp = &seq.ranks[r];
            let mut ins = vec![];
            for buf in rp.buffers.iter().filter(|b| {
                matches!(
                    b.role,
                    BufferRole::InputA | BufferRole::InputB | BufferRole::InputX
                )
            }) {
                let d = rank.alloc(buf.bytes())?;
                // SAFETY: d holds the buffer's elements.
                unsafe {
                    rank.kernels.fill(
                        rank.control(),
                        d.ptr(),
                        (buf.rows * buf.cols) as u64,
                        self.config.seed ^ ((r as u32) << 8) ^ (buf.role as u32),
                    )?;
                }
                ins.push((buf.role, d));
            }
            inputs.push(ins);
        }
        self.prepared = Some(Prepared {
            problem: seq.problem,
            inputs,
            reference: vec![],
        });
        self.load_inputs(seq, &ptrs, true, true)?;
        self.run(seq, &ptrs, RunSpec::ONCE)?;
        let mut reference = vec![];
        for rank in &self.ranks {
            let r = rank.rank;
            let o = Self::output_of(seq, r)?;
            let bytes = seq.ranks[r].buffers[o].bytes();
            let d = rank.alloc(bytes)?;
            exec::copy_d2d(rank, d.ptr(), ptrs[r][o], bytes)?;
            let (_, _, nans) = exec::compare(rank, d.ptr(), d.ptr(), bytes / ELEM_BYTES)?;
            if nans > 0 {
                return Err(CudaError::Plan(format!(
                    "sequential plan left {nans} unwritten (NaN) outputs on rank {r}"
                )));
            }
            reference.push(d);
        }
        if let Some(p) = self.prepared.as_mut() {
            p.reference = reference;
        }
        Ok(())
    }

    /// Checks (when `check`) and times `plan`; see `Backend::measure`.
    pub fn measure_plan(&mut self, plan: &Plan, check: bool, timeline: bool) -> Result<Measured> {
        let res = self.measure_inner(plan, check, timeline);
        self.job_result(res)
    }

    /// In a job, tells every other rank about this rank's failure (they
    /// would otherwise wait for it until their timeout).
    pub(super) fn job_result<T>(&self, res: Result<T>) -> Result<T> {
        match (res, self.job.as_ref()) {
            (Err(e), Some(j)) => Err(j.fail(e)),
            (res, _) => res,
        }
    }

    pub(super) fn measure_inner(
        &mut self,
        plan: &Plan,
        check: bool,
        timeline: bool,
    ) -> Result<Measured> {
        let copy_form = self.runnable(plan)?;
        let plan = copy_form.as_ref().unwrap_or(plan);
        let tr = |what: &str| trace(|| format!("measure {}: {what}", plan.name));
        tr("bind");
        let ptrs = self.bind(plan, &[])?;
        let mut max_rel_err = None;
        let mut correct = true;
        if check {
            if !self
                .prepared
                .as_ref()
                .is_some_and(|p| p.problem == plan.problem)
            {
                return Err(CudaError::NotPrepared(plan.problem.label()));
            }
            tr("load inputs (checked run)");
            self.load_inputs(plan, &ptrs, true, true)?;
            tr("checked run");
            self.run(plan, &ptrs, RunSpec::ONCE)?;
            tr("check outputs");
            let (err, ok) = self.check_outputs(plan, &ptrs)?;
            let (err, ok) = match self.job.as_mut() {
                Some(j) => j.gather_check(err, ok)?,
                None => (err, ok),
            };
            max_rel_err = Some(err);
            correct = ok;
        } else {
            self.load_inputs(plan, &ptrs, false, false)?;
        }
        tr("timed run");
        let times = self.run(
            plan,
            &ptrs,
            RunSpec {
                warmup: self.config.warmup,
                timed: self.config.iters.max(1),
                timeline,
            },
        )?;
        let times = match (self.job.as_mut(), times.first()) {
            (Some(j), Some(mine)) => j.gather_times(mine)?,
            _ => times,
        };
        self.last_graphed = Some(times.iter().all(|t| t.graphed));
        self.last_graph_error = times.iter().find_map(|t| t.graph_error.clone());
        let iters = self.config.iters.max(1);
        let per_iter: Vec<f64> = (0..iters)
            .map(|k| times.iter().map(|t| t.iters[k]).fold(0.0, f64::max))
            .collect();
        let range_ms = per_iter
            .iter()
            .copied()
            .fold(None, |r: Option<(f64, f64)>, t| {
                Some(r.map_or((t, t), |(lo, hi)| (lo.min(t), hi.max(t))))
            });
        let time_ms = median(&per_iter).unwrap_or(0.0);
        let host: Vec<f64> = (0..iters)
            .filter_map(|k| {
                times
                    .iter()
                    .map(|t| t.host_us.get(k).copied())
                    .try_fold(0.0, |acc: f64, x| x.map(|x| acc.max(x)))
            })
            .collect();
        let launch_us = median(&host);
        let timeline = timeline.then(|| {
            let mut spans = vec![];
            for (r, t) in times.iter().enumerate() {
                for (i, &(s, e)) in t.tasks.iter().enumerate() {
                    let task = &plan.ranks[r].tasks[i];
                    spans.push(Span {
                        rank: r,
                        stream: task.stream,
                        task: i,
                        label: task.label.clone(),
                        kind: task.kind.short().to_string(),
                        start_ms: s,
                        end_ms: e,
                    });
                }
            }
            Timeline {
                name: plan.name.clone(),
                spans,
                total_ms: 0.0,
            }
            .finish()
        });
        Ok(Measured {
            time_ms,
            max_rel_err,
            correct,
            timeline,
            launch_us,
            range_ms,
        })
    }

    /// Max relative error over ranks and whether the outputs are right.
    #[allow(clippy::needless_range_loop)]
    pub(super) fn check_outputs(
        &self,
        plan: &Plan,
        ptrs: &[Vec<DevicePtr>],
    ) -> Result<(f64, bool)> {
        let Some(prep) = self.prepared.as_ref() else {
            return Err(CudaError::NotPrepared(plan.problem.label()));
        };
        let mut max_err: f64 = 0.0;
        let mut ok = true;
        for (i, rank) in self.ranks.iter().enumerate() {
            let r = rank.rank;
            let o = Self::output_of(plan, r)?;
            let buf = &plan.ranks[r].buffers[o];
            let Some(reference) = prep.reference.get(i) else {
                return Err(CudaError::NotPrepared(plan.problem.label()));
            };
            if reference.bytes() != buf.bytes() {
                return Err(CudaError::Plan(format!(
                    "output of rank {r} has {} bytes, the reference {}",
                    buf.bytes(),
                    reference.bytes()
                )));
            }
            let n = buf.rows * buf.cols;
            let (sd, sr, nans) = exec::compare(rank, ptrs[r][o], reference.ptr(), n)?;
            let err = if nans > 0 {
                f64::INFINITY
            } else if sr > 0.0 {
                (sd / sr).sqrt()
            } else {
                sd.sqrt()
            };
            if err.is_nan() || err > self.config.tolerance {
                ok = false;
            }
            max_err = max_err.max(err);
            if plan.problem.op == Op::GemmAr && r > 0 {
                let o0 = Self::output_of(plan, 0)?;
                let (sd0, _, nans0) = exec::compare(rank, ptrs[r][o], ptrs[0][o0], n)?;
                if sd0 != 0.0 || nans0 > 0 {
                    ok = false;
                }
            }
        }
        Ok((max_err, ok))
    }
}
