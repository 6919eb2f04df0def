//! Operator calls on caller memory (the Python ops' path): a call on the
//! caller's stream, its synchronization, and the full path's run.

use super::{GpuBackend, Operand};
use crate::error::{drv, CudaError, Result};
use crate::exec::op::clock::{self, Phase};
use crate::exec::{self, RunSpec};
use crate::runtime::job::arena_layout;
use ficco_core::plan::Plan;

impl GpuBackend {
    /// Runs `plan` once on caller memory (a rank of a job: this process's
    /// rank), ordered after the work queued on the caller's `stream` and
    /// before the caller's later work on it. Every input operand is copied
    /// into the plan's buffer of its role, and the plan's output into the
    /// output operand, unless it lives in shared memory
    /// ([`Operand::shared`]) or its buffer no other rank's task touches
    /// (and, an input, no task writes): then it is bound in place. Sizes
    /// must match the plan's buffers exactly.
    ///
    /// The first call of a call shape, and a few others, take the full path
    /// (flags reset, store barriers, host synchronize); the others return
    /// once issued ([`exec::op`]).
    pub(crate) fn run_on(&mut self, plan: &Plan, operands: &[Operand], stream: u64) -> Result<()> {
        let res = self.run_on_inner(plan, operands, stream);
        if let Err(CudaError::Capture(_)) = res {
            // Refused before anything ran: the job is as it was.
            return res;
        }
        if res.is_err() {
            if let Some(j) = self.job.as_mut() {
                j.op.epoch.failed();
            }
        }
        self.job_result(res)
    }

    /// Waits until every operator call issued here finished on this rank's
    /// device; the hang of one of them, if one was found.
    pub(crate) fn sync_ops(&mut self) -> Result<()> {
        let res = match self.job.as_mut() {
            Some(j) => j.op.synchronize(),
            None => Ok(()),
        };
        self.job_result(res)
    }

    /// Waits until every operator call issued here finished on this rank's
    /// device, leaving a hang for the next call to report.
    pub(crate) fn wait_ops(&self) -> Result<()> {
        self.job.as_ref().map_or(Ok(()), |j| j.op.wait_idle())
    }

    pub(super) fn run_on_inner(
        &mut self,
        plan: &Plan,
        operands: &[Operand],
        stream: u64,
    ) -> Result<()> {
        if self.ranks.len() != 1 || self.job.is_none() {
            return Err(CudaError::Plan(
                "an operator call runs one rank per process, in a job".into(),
            ));
        }
        let copy_form = self.runnable(plan)?;
        let plan = copy_form.as_ref().unwrap_or(plan);
        let r = self.ranks[0].rank;
        let Some(job) = self.job.as_mut() else {
            return Err(CudaError::Plan("the session has no job".into()));
        };
        // A hang of an earlier call, found since: its results were not valid.
        job.op.failure()?;
        let key = exec::op::OpKey::of(plan);
        let (flags, flag_words) = job.flag_view();
        let cached = job.op.cache.get(&key);
        let facts = exec::op::CallFacts {
            sync: job.op.sync,
            // A shape not cached takes the full path, which lays it out.
            grows: cached.is_none_or(|st| job.grows(st.arena.1, st.layout_words())),
            cached: cached.is_some_and(|st| st.flags == flags),
            // A cached shape was made by a fast-capable plan.
            capable: cached.is_some() || exec::op::fast_capable(plan),
        };
        if let exec::op::Path::Fast { parity } = job.op.epoch.path(facts) {
            clock::lap(Phase::Path);
            let st = job
                .op
                .cache
                .get(&key)
                .ok_or_else(|| CudaError::Plan("a fast call of a shape never run".into()))?;
            let ptrs = job.arena_ptrs(&st.arena.0, st.arena.1)?;
            let bound = job.op.bind(&key, r, ptrs, operands)?;
            clock::lap(Phase::Bind);
            let watchdog_ms = self.run_opts.watchdog_ms;
            return job.op.issue_fast(
                &mut self.ranks[0],
                &key,
                &bound,
                parity,
                stream,
                (flags[r], flag_words),
                watchdog_ms,
            );
        }
        self.ranks[0]
            .ctx
            .bind_to_thread()
            .map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: the caller's stream handle on this rank's (primary)
        // context, current on this thread.
        if unsafe {
            crate::driver::cuda::stream_is_capturing(stream as cudarc::driver::sys::CUstream)?
        } {
            let known = self.job.as_ref().is_some_and(|j| j.op.epoch.known());
            return Err(CudaError::Capture(capture_refusal(plan, facts, known)));
        }
        self.run_full(plan, operands, stream, facts.capable)?;
        clock::lap(Phase::Full);
        Ok(())
    }

    /// The full path of an operator call (see [`Self::run_on`]); then, when
    /// the plan can run fast, the call shape's state for its next calls.
    pub(super) fn run_full(
        &mut self,
        plan: &Plan,
        operands: &[Operand],
        stream: u64,
        capable: bool,
    ) -> Result<()> {
        let uses = ficco_core::plan::validate::buffer_use(plan);
        let local = exec::op::call_local(plan, &uses);
        let ptrs = self.bind(plan, &local)?;
        let r = self.ranks[0].rank;
        let bound = exec::op::bind_operands(plan, r, &uses, ptrs, operands)?;
        let rank = &self.ranks[0];
        rank.ctx.bind_to_thread().map_err(drv("cuCtxSetCurrent"))?;
        // SAFETY: the caller's stream handle on this rank's (primary) context.
        unsafe {
            crate::driver::cuda::stream_synchronize(stream as cudarc::driver::sys::CUstream)?
        };
        for &(dst, src, bytes) in &bound.copy_in {
            exec::copy_d2d(rank, dst, src, bytes)?;
        }
        rank.synchronize()?;
        // One call: capturing graphs would cost more than it saves.
        let graphs = std::mem::replace(&mut self.run_opts.graphs, false);
        let ran = self.run(plan, &bound.ptrs, RunSpec::ONCE);
        self.run_opts.graphs = graphs;
        ran?;
        let rank = &self.ranks[0];
        for &(dst, src, bytes) in &bound.copy_out {
            exec::copy_d2d(rank, dst, src, bytes)?;
        }
        rank.synchronize()?;
        let Some(job) = self.job.as_mut() else {
            return Ok(());
        };
        if capable && !job.op.sync {
            let (flags, _) = job.flag_view();
            let comm = job.plan_comm(plan)?;
            let watchdog_ms = self.run_opts.watchdog_ms;
            let loopback = self.loopback;
            job.op.prepare(
                &mut self.ranks[0],
                plan.clone(),
                arena_layout(plan, &local),
                flags,
                comm,
                watchdog_ms,
                loopback,
            )?;
        }
        Ok(())
    }
}

/// Why a call on a capturing stream cannot be captured, and what to do.
fn capture_refusal(plan: &Plan, facts: exec::op::CallFacts, known: bool) -> String {
    let why = if facts.sync {
        "FICCO_OP_SYNC=1 puts every call on the synchronizing path".to_string()
    } else if !facts.capable {
        format!(
            "schedule {} runs only on the synchronizing path (grouped GEMMs); pick another schedule for captured code",
            plan.name
        )
    } else if !known {
        "this is the job's first call, or the first after a failure: it resets the job's flags and synchronizes".to_string()
    } else if !facts.cached {
        format!(
            "this is the first call of {} with schedule {} (or the first since the shape cache was cleared): it sets up streams, GEMMs and buffers and synchronizes",
            plan.problem.label(),
            plan.name
        )
    } else {
        "the call needs more shared buffer or flag memory than the job holds, which grows only outside capture".to_string()
    };
    format!(
        "ficco: an operator call cannot be captured in a CUDA graph: {why}. Run the same calls once eagerly (a warm-up step) before capturing; see the README, \"CUDA graphs\""
    )
}
