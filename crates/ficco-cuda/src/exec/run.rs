//! The run loop: [`run_plan`] picks the plan's communicators, prepares every
//! rank (streams, GEMM warm-up, shaped GEMM), then runs one host thread per
//! rank through warm-up, timed and timeline iterations ([`run_rank`]), with
//! cross-rank dependencies through [`CrossRankSync`] and per-iteration times
//! from CUDA events.

use super::check::precheck;
use super::issue::issue;
use super::rank::Rank;
use crate::comm::{CommCache, CommSet, NcclLimits};
use crate::driver::nccl::RawComm;
use crate::error::{drv, CudaError, Result};
use crate::mem::DevicePtr;
use crate::sync::{CrossRankSync, InProcessSync, Point};
use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};
use ficco_core::plan::graph::Graph;
use ficco_core::plan::Plan;
use std::sync::Arc;

/// How to run a plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunSpec {
    /// Iterations run before the timed ones.
    pub warmup: usize,
    /// Timed iterations (0: run `warmup` iterations only, no timing).
    pub timed: usize,
    /// Record per-task events in one extra iteration after the timed ones.
    pub timeline: bool,
}

impl RunSpec {
    /// Run the plan once, untimed (reference runs and correctness checks).
    pub const ONCE: RunSpec = RunSpec {
        warmup: 1,
        timed: 0,
        timeline: false,
    };
}

/// What one rank's thread measured.
#[derive(Debug, Clone, Default)]
pub struct RankTimes {
    /// Per timed iteration, ms from start to end on this rank.
    pub iters: Vec<f64>,
    /// Per task (start, end) in ms from the iteration start, when asked.
    pub tasks: Vec<(f64, f64)>,
    /// Per timed iteration, host µs this thread spent issuing the plan: every
    /// launch, copy, event record and cross-rank wait, from the start event
    /// to the end event (no CUDA graphs).
    pub host_us: Vec<f64>,
}

/// The tasks whose completion another stream or rank waits for. Dependencies
/// on an earlier task of the same stream are already kept by stream order, so
/// neither their record nor their wait is issued: each costs host time on
/// every launch of the plan. The plan's one dependency graph says which.
pub fn cross_stream_points(plan: &Plan) -> Result<Vec<Vec<bool>>> {
    let g = Graph::new(plan).map_err(|e| CudaError::Plan(e.to_string()))?;
    Ok(g.cross_stream_points(plan))
}

/// The communicators of `ranks`' GPUs under `limits` (created once per
/// process and limits, see [`CommCache`]).
fn comm_set(ranks: &[Rank], limits: NcclLimits) -> Result<Arc<CommSet>> {
    let gpus: Vec<usize> = ranks.iter().map(|r| r.ctx.ordinal()).collect();
    CommCache::global().get(&gpus, limits)
}

/// Creates and warms the default communicators of GPUs `ctxs` (ordinals in
/// rank order) up front, so the first plan does not pay for them.
pub fn open_comms(ctxs: &[Arc<CudaContext>]) -> Result<()> {
    let gpus: Vec<usize> = ctxs.iter().map(|c| c.ordinal()).collect();
    CommCache::global()
        .get(&gpus, NcclLimits::default())?
        .warm()
}

/// The NCCL communicator a rank uses for one plan.
#[derive(Clone, Copy)]
pub(crate) struct CommHandle(pub(crate) RawComm);
// SAFETY: each handle is used by its rank's thread only during a run.
unsafe impl Send for CommHandle {}
// SAFETY: as above; the handle is only read.
unsafe impl Sync for CommHandle {}

/// Everything the rank threads share for one run.
pub(crate) struct Shared<'a> {
    pub plan: &'a Plan,
    /// Base pointers per rank per buffer.
    pub ptrs: &'a [Vec<DevicePtr>],
    /// Raw context of each rank (peer copies name both).
    pub ctxs: &'a [Arc<CudaContext>],
    pub sync: &'a dyn CrossRankSync,
    /// Each rank's communicator for this plan (its NCCL limits).
    pub comms: &'a [CommHandle],
    /// Per rank per task: another stream (of any rank) waits for it, so its
    /// completion must be recorded. See [`cross_stream_points`].
    pub recorded: &'a [Vec<bool>],
    pub spec: RunSpec,
    /// Every rank thread passes it once its events exist.
    pub start: &'a std::sync::Barrier,
}

/// Runs one rank's share of `warmup + timed (+1)` iterations. Iteration numbers
/// start at `first_iter` (> 0) and are the generations of the sync points.
pub(crate) fn run_rank(
    rank: &mut Rank,
    sh: &Shared<'_>,
    streams: Vec<Arc<CudaStream>>,
    first_iter: u64,
) -> Result<RankTimes> {
    let r = rank.rank;
    let bound = rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"));
    let rp = &sh.plan.ranks[r];
    let n_ranks = sh.plan.ranks.len();
    let n_tasks = rp.tasks.len();
    let ctx = rank.ctx.clone();
    let timed_ev = || {
        ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .map_err(drv("cuEventCreate"))
    };
    let plain_ev = || ctx.new_event(None).map_err(drv("cuEventCreate"));
    let spec = sh.spec;
    let total = spec.warmup + spec.timed + usize::from(spec.timeline);
    // Create every event before any rank issues work, then start together.
    let prep = (|| -> Result<_> {
        bound?;
        let mut starts: Vec<CudaEvent> = vec![];
        let mut ends: Vec<CudaEvent> = vec![];
        for _ in 0..spec.timed + usize::from(spec.timeline) {
            starts.push(timed_ev()?);
            ends.push(timed_ev()?);
        }
        let mut task_ev: Vec<(CudaEvent, CudaEvent)> = vec![];
        if spec.timeline {
            for _ in 0..n_tasks {
                task_ev.push((timed_ev()?, timed_ev()?));
            }
        }
        let go = plain_ev()?;
        let stream_done: Vec<CudaEvent> =
            streams.iter().map(|_| plain_ev()).collect::<Result<_>>()?;

        Ok((starts, ends, task_ev, go, stream_done))
    })();
    sh.start.wait();
    let (starts, ends, task_ev, go, stream_done) = prep?;
    let mut host_us = Vec::with_capacity(spec.timed);
    for it in 0..total {
        let iter = first_iter + it as u64;
        let control = rank.control().clone();
        // Barrier: wait for every rank's end of the previous iteration.
        if it > 0 {
            for q in 0..n_ranks {
                sh.sync.wait(
                    &control,
                    Point {
                        rank: q,
                        index: sh.plan.ranks[q].tasks.len(),
                    },
                    iter - 1,
                )?;
            }
        }
        let timed_slot = it.checked_sub(spec.warmup);
        let issue_start = std::time::Instant::now();
        if let Some(k) = timed_slot {
            starts[k].record(&control).map_err(drv("cuEventRecord"))?;
        }
        go.record(&control).map_err(drv("cuEventRecord"))?;
        for s in &streams {
            s.wait(&go).map_err(drv("cuStreamWaitEvent"))?;
        }
        let in_timeline = spec.timeline && it + 1 == total;
        for (i, task) in rp.tasks.iter().enumerate() {
            let stream = streams.get(task.stream).ok_or_else(|| {
                CudaError::Plan(format!("task {i} of rank {r} names stream {}", task.stream))
            })?;
            for d in task.deps.iter().filter(|d| {
                // Stream order already keeps a dependency on the same stream.
                !(d.rank == r
                    && sh.plan.ranks[r]
                        .tasks
                        .get(d.index)
                        .is_some_and(|t| t.stream == task.stream))
            }) {
                sh.sync.wait(
                    stream,
                    Point {
                        rank: d.rank,
                        index: d.index,
                    },
                    iter,
                )?;
            }
            if in_timeline {
                task_ev[i].0.record(stream).map_err(drv("cuEventRecord"))?;
            }
            issue(rank, sh, stream, task.stream, &task.kind)?;
            if in_timeline {
                task_ev[i].1.record(stream).map_err(drv("cuEventRecord"))?;
            }
            let waited_on = sh
                .recorded
                .get(r)
                .and_then(|v| v.get(i))
                .copied()
                .unwrap_or(true);
            if waited_on {
                sh.sync.record(Point { rank: r, index: i }, stream, iter)?;
            }
        }
        for (s, ev) in streams.iter().zip(&stream_done) {
            ev.record(s).map_err(drv("cuEventRecord"))?;
            control.wait(ev).map_err(drv("cuStreamWaitEvent"))?;
        }
        if let Some(k) = timed_slot {
            ends[k].record(&control).map_err(drv("cuEventRecord"))?;
            if k < spec.timed {
                host_us.push(issue_start.elapsed().as_secs_f64() * 1e6);
            }
        }
        sh.sync.record(
            Point {
                rank: r,
                index: n_tasks,
            },
            &control,
            iter,
        )?;
    }
    rank.synchronize()?;
    let mut out = RankTimes {
        host_us,
        ..RankTimes::default()
    };
    for k in 0..spec.timed {
        out.iters.push(
            starts[k]
                .elapsed_ms(&ends[k])
                .map_err(drv("cuEventElapsedTime"))? as f64,
        );
    }
    if spec.timeline {
        let st = &starts[spec.timed];
        for (a, b) in &task_ev {
            out.tasks.push((
                st.elapsed_ms(a).map_err(drv("cuEventElapsedTime"))? as f64,
                st.elapsed_ms(b).map_err(drv("cuEventElapsedTime"))? as f64,
            ));
        }
    }
    Ok(out)
}

/// Runs `plan` on every rank, one host thread per GPU. `first_iter` must be
/// greater than any iteration number used before with the same sync object
/// (a fresh sync is made here, so any value > 0 works).
pub fn run_plan(
    ranks: &mut [Rank],
    plan: &Plan,
    ptrs: &[Vec<DevicePtr>],
    spec: RunSpec,
) -> Result<Vec<RankTimes>> {
    if plan.ranks.len() != ranks.len() {
        return Err(CudaError::Plan(format!(
            "plan has {} ranks but the backend drives {} GPUs",
            plan.ranks.len(),
            ranks.len()
        )));
    }
    for (r, rp) in plan.ranks.iter().enumerate() {
        if rp.streams.is_empty() && !rp.tasks.is_empty() {
            return Err(CudaError::Plan(format!(
                "rank {r} has tasks but no streams"
            )));
        }
    }
    // The one validator (ficco_core::plan::validate) accepted every plan
    // that reaches here; only the binding to device memory is checked.
    precheck(plan, ptrs)?;
    // All allocation and kernel loading happens here, before any rank issues
    // work (either can wait for a device to go idle).
    let mut all_streams = vec![];
    for (r, rank) in ranks.iter_mut().enumerate() {
        rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        all_streams.push(rank.plan_streams(&plan.ranks[r], &plan.resources)?);
        rank.prewarm_gemms(&plan.ranks[r], &ptrs[r])?;
        rank.prepare_shaped(&plan.ranks[r])?;
    }
    let ctxs: Vec<Arc<CudaContext>> = ranks.iter().map(|r| r.ctx.clone()).collect();
    // The communicators under the plan's NCCL limits (default limits when
    // the plan sets none): one set per limits, cached for the process and
    // warmed up at first use.
    let limits = NcclLimits {
        max_ctas: plan.resources.nccl_ctas.map(|c| c as u32),
        ..NcclLimits::default()
    };
    let set = comm_set(ranks, limits)?;
    set.warm()?;
    let comms: Vec<CommHandle> = set.comms().iter().map(|c| CommHandle(c.raw())).collect();
    let start = std::sync::Barrier::new(ranks.len());
    let points: Vec<usize> = plan.ranks.iter().map(|rp| rp.tasks.len() + 1).collect();
    let sync = InProcessSync::new(&ctxs, &points)?;
    let recorded = cross_stream_points(plan)?;
    let sh = Shared {
        recorded: &recorded,
        plan,
        ptrs,
        ctxs: &ctxs,
        sync: &sync,
        comms: &comms,
        spec,
        start: &start,
    };
    let results: Vec<Result<RankTimes>> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter_mut()
            .zip(all_streams)
            .map(|(rank, streams)| {
                let sh = &sh;
                s.spawn(move || {
                    let res = run_rank(rank, sh, streams, 1);
                    if res.is_err() {
                        sh.sync.abort();
                        let _ = rank.synchronize();
                    }
                    res
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(r, h)| h.join().unwrap_or(Err(CudaError::Worker(r))))
            .collect()
    });
    // Report the root cause: a rank's own error before "another rank failed".
    let mut out = Vec::with_capacity(results.len());
    let mut first_err: Option<CudaError> = None;
    for res in results {
        match res {
            Ok(t) => out.push(t),
            Err(e) => {
                let secondary = matches!(&e, CudaError::Plan(m) if m == "another rank failed");
                if first_err.is_none()
                    || (!secondary
                        && matches!(&first_err, Some(CudaError::Plan(m)) if m == "another rank failed"))
                {
                    first_err = Some(e);
                }
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

#[cfg(test)]
mod tests {
    use ficco_core::plan::lower::lower;
    use ficco_core::problem::workload::{Op, Problem};
    use ficco_core::space::{enumerate, SpaceOptions};

    /// Every task another stream waits for is recorded; tasks only their own
    /// stream follows are not (fine-grained plans have many of those).
    #[test]
    fn only_cross_stream_dependencies_are_recorded() {
        let mut skipped = 0;
        for gpus in [2, 4, 8] {
            for op in Op::ALL {
                let problem = Problem::new(op, 4096, 1024, 1024, gpus).expect("problem");
                for s in enumerate(op, SpaceOptions::default()) {
                    let Ok(plan) = lower(&problem, &s) else {
                        continue;
                    };
                    let rec = super::cross_stream_points(&plan).expect("graph");
                    for (r, rp) in plan.ranks.iter().enumerate() {
                        for t in &rp.tasks {
                            for d in &t.deps {
                                let producer = &plan.ranks[d.rank].tasks[d.index];
                                let cross = d.rank != r || producer.stream != t.stream;
                                assert!(!cross || rec[d.rank][d.index], "{}", plan.name);
                            }
                        }
                        skipped += rec[r].iter().filter(|x| !**x).count();
                    }
                }
            }
        }
        assert!(skipped > 0);
    }
}
