//! [`Job`]: what a [`crate::GpuBackend`] that drives one rank of a
//! multi-process job keeps besides its GPU: the rendezvous, the plan
//! buffers and signal flags in memory shared with the node's other ranks,
//! this rank's NCCL communicators, and the exchange of results.
//!
//! Every rank runs the same sequence of plans, so every collective step
//! here is decided identically on every rank from the plan alone: buffer
//! offsets are computed for every rank (no exchange), and the shared arena
//! grows, collectively, exactly when the plan needs more than it holds.

use super::nccl::communicator;
use super::shared::{abort_on, SymmetricMem};
use super::{DistError, Rendezvous};
use crate::comm::{NcclComm, NcclLimits};
use crate::error::{CudaError, Result};
use crate::exec::op::OpRunner;
use crate::exec::run::{JobRun, RankTimes};
use crate::exec::shared::CommHandle;
use crate::exec::Rank;
use crate::mem::DevicePtr;
use cudarc::driver::CudaContext;
use ficco_core::plan::{Plan, TaskKind};
use std::collections::HashMap;
use std::sync::Arc;

/// Buffers start at multiples of this inside the arena (TMA and vector
/// loads want 128-byte alignment; 512 keeps every row pitch's start apart).
const ALIGN: usize = 512;
/// The arena grows in steps of this many bytes (fewer collective regrowths).
const ARENA_STEP: usize = 64 << 20;

/// One rank's part in a job of one process per rank.
pub struct Job {
    pub rv: Rendezvous,
    /// Every rank of the job is on GPU 0 of one node.
    pub loopback: bool,
    /// The CUDA device this rank drives.
    pub ordinal: usize,
    ctx: Arc<CudaContext>,
    arena: Option<SymmetricMem>,
    flags: Option<SymmetricMem>,
    /// This rank's communicators over the job, by `maxCTAs` limit.
    comms: HashMap<Option<u32>, NcclComm>,
    /// Runs so far (names each run's barriers).
    runs: u64,
    /// Shared-memory exchanges so far (names each exchange).
    exchanges: u64,
    /// Operator calls: the flag epoch carried between runs, the cached call
    /// shapes ([`crate::exec::op`]).
    pub(crate) op: OpRunner,
    /// Quiet barriers so far (names each).
    quiets: u64,
}

/// `bytes` rounded up to a multiple of `to`.
fn round_up(bytes: usize, to: usize) -> usize {
    bytes.div_ceil(to) * to
}

/// Offsets of every buffer of every rank in its rank's arena, and the
/// largest arena any rank needs.
///
/// `skip` (per rank per buffer; empty for a run): for an operator call, the
/// operands it binds in place whatever they are ([`crate::exec::op::call_local`]:
/// A, B and the output where no peer touches them), which take no room:
/// they are the caller's memory. (An ag-gemm at 8192 tokens on 2 ranks
/// held 448 MiB of its B and output here, outside PyTorch's allocator,
/// never used.)
pub(crate) fn arena_layout(plan: &Plan, skip: &[Vec<bool>]) -> (Vec<Vec<usize>>, usize) {
    let mut need = 0;
    let offsets = plan
        .ranks
        .iter()
        .enumerate()
        .map(|(r, rp)| {
            let mut at = 0;
            let offs = rp
                .buffers
                .iter()
                .enumerate()
                .map(|(b, buf)| {
                    let o = at;
                    let local = skip.get(r).and_then(|s| s.get(b)).copied().unwrap_or(false);
                    if !local {
                        at += round_up(buf.bytes().max(1), ALIGN);
                    }
                    o
                })
                .collect();
            need = need.max(at);
            offs
        })
        .collect();
    (offsets, need)
}

/// Whether `plan` moves data between ranks by other means than NCCL
/// (copies, tile GEMM pushes, signal flags between tasks): such plans need
/// every rank on one node.
pub(crate) fn needs_one_node(plan: &Plan) -> bool {
    plan.ranks.iter().enumerate().any(|(r, rp)| {
        rp.tasks.iter().any(|t| match &t.kind {
            TaskKind::Copy { src, dst } => src.rank != r || dst.rank != r,
            TaskKind::Signal { .. } | TaskKind::Wait { .. } | TaskKind::TileGemm(_) => true,
            _ => t.deps.iter().any(|d| d.rank != r),
        })
    })
}

/// Encodes one rank's times for the exchange: counts, then f64s.
fn encode_times(t: &RankTimes) -> Vec<u8> {
    let mut out = vec![];
    let mut put = |v: f64| out.extend_from_slice(&v.to_le_bytes());
    put(t.iters.len() as f64);
    t.iters.iter().for_each(|&v| put(v));
    put(t.tasks.len() as f64);
    for &(s, e) in &t.tasks {
        put(s);
        put(e);
    }
    put(t.host_us.len() as f64);
    t.host_us.iter().for_each(|&v| put(v));
    put(if t.graphed { 1.0 } else { 0.0 });
    out
}

fn decode_times(bytes: &[u8]) -> Option<RankTimes> {
    let vals: Vec<f64> = bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect();
    let mut it = vals.into_iter();
    let count = |it: &mut std::vec::IntoIter<f64>| -> Option<usize> {
        let n = it.next()?;
        (n >= 0.0 && n.fract() == 0.0 && n < 1e9).then_some(n as usize)
    };
    let n = count(&mut it)?;
    let iters: Vec<f64> = it.by_ref().take(n).collect();
    let n_tasks = count(&mut it)?;
    let mut tasks = Vec::with_capacity(n_tasks);
    for _ in 0..n_tasks {
        tasks.push((it.next()?, it.next()?));
    }
    let n_host = count(&mut it)?;
    let host_us: Vec<f64> = it.by_ref().take(n_host).collect();
    let graphed = it.next()? != 0.0;
    (iters.len() == n && host_us.len() == n_host).then_some(RankTimes {
        iters,
        tasks,
        host_us,
        graphed,
        graph_error: None,
    })
}

impl Job {
    pub(crate) fn new(
        rv: Rendezvous,
        loopback: bool,
        ordinal: usize,
        ctx: Arc<CudaContext>,
    ) -> Self {
        Job {
            rv,
            loopback,
            ordinal,
            ctx,
            arena: None,
            flags: None,
            comms: HashMap::new(),
            runs: 0,
            exchanges: 0,
            op: OpRunner::new(crate::exec::op::sync_from_env(), super::timeout_from_env()),
            quiets: 0,
        }
    }

    /// Before anything that resets flags or replaces shared memory: when
    /// operator calls were issued without a final barrier, wait for this
    /// rank's device, then for every rank's (a store barrier), so that no
    /// write of those calls is in flight anywhere. Every rank calls it at
    /// the same point (the same calls in the same order).
    pub(crate) fn quiesce(&mut self, rank: &Rank) -> Result<()> {
        if !self.op.epoch.needs_quiet() {
            return Ok(());
        }
        rank.synchronize()?;
        self.op.failure()?;
        self.quiets += 1;
        self.rv.barrier(&format!("quiet/{}", self.quiets))?;
        self.op.epoch.quiet();
        Ok(())
    }

    /// Whether an operator call whose buffers need `need` bytes of the
    /// shared arena ([`arena_layout`]) and `flag_words` flag words needs a
    /// larger arena or more flag words than the job holds (then its run
    /// replaces them, collectively).
    pub(crate) fn grows(&self, need: usize, flag_words: usize) -> bool {
        self.arena.as_ref().is_none_or(|a| a.bytes() < need)
            || self
                .flags
                .as_ref()
                .is_none_or(|f| f.bytes() < flag_words * 4)
    }

    /// Every rank's buffers at `offsets` of the current arena, which holds
    /// their `need` bytes ([`Job::grows`] said no; both from
    /// [`arena_layout`]).
    pub(crate) fn arena_ptrs(
        &self,
        offsets: &[Vec<usize>],
        need: usize,
    ) -> Result<Vec<Vec<DevicePtr>>> {
        let arena = self
            .arena
            .as_ref()
            .filter(|a| a.bytes() >= need)
            .ok_or_else(|| CudaError::Plan("the shared arena is smaller than the plan".into()))?;
        Ok(offsets
            .iter()
            .enumerate()
            .map(|(q, offs)| {
                let base = arena.ptr(q);
                offs.iter()
                    .map(|&o| base.map_or(DevicePtr::NULL, |b| b.offset(o)))
                    .collect()
            })
            .collect())
    }

    /// Every rank's current flag memory as mapped here, and its capacity in
    /// words (empty before the first run).
    pub(crate) fn flag_view(&self) -> (Vec<DevicePtr>, usize) {
        match self.flags.as_ref() {
            Some(f) => (
                (0..self.world())
                    .map(|q| f.ptr(q).unwrap_or(DevicePtr::NULL))
                    .collect(),
                f.bytes() / 4,
            ),
            None => (vec![DevicePtr::NULL; self.world()], 0),
        }
    }

    pub fn rank(&self) -> usize {
        self.rv.env.rank
    }

    pub fn world(&self) -> usize {
        self.rv.env.world_size
    }

    /// Passes `e` on after telling every other rank (see [`abort_on`]).
    pub(crate) fn fail(&self, e: CudaError) -> CudaError {
        abort_on(&self.rv, e)
    }

    /// A fresh symmetric allocation of `bytes` (every rank calls it with
    /// the same size, which the plan decides).
    fn exchange(&mut self, what: &str, bytes: usize) -> Result<SymmetricMem> {
        self.exchanges += 1;
        SymmetricMem::exchange(
            &self.rv,
            &format!("{what}{}", self.exchanges),
            &self.ctx,
            self.ordinal,
            bytes,
        )
    }

    /// Every rank's buffers of `plan` as this process sees them (NULL for a
    /// rank of another node). Grows the shared arena when the plan needs
    /// more (collectively; the caller has no work in flight).
    pub(crate) fn bind(&mut self, plan: &Plan, skip: &[Vec<bool>]) -> Result<Vec<Vec<DevicePtr>>> {
        let (offsets, need) = arena_layout(plan, skip);
        if self.arena.as_ref().is_none_or(|a| a.bytes() < need) {
            self.arena = None;
            let bytes = round_up(need.max(1), ARENA_STEP);
            self.arena = Some(self.exchange("arena", bytes)?);
        }
        self.arena_ptrs(&offsets, need)
    }

    /// Every rank's signal flags (at least `words` words each) as mapped
    /// here, and their capacity in words.
    fn flags(&mut self, words: usize) -> Result<(Vec<DevicePtr>, usize)> {
        if self.flags.as_ref().is_none_or(|f| f.bytes() < words * 4) {
            // The cached call shapes' flag operations name the old memory.
            self.op.cache.clear();
            self.flags = None;
            let bytes = round_up((words * 4).max(1), 1 << 21);
            self.flags = Some(self.exchange("flags", bytes)?);
        }
        let Some(f) = self.flags.as_ref() else {
            return Err(CudaError::Plan("the job's signal flags are missing".into()));
        };
        let ptrs = (0..self.world())
            .map(|q| f.ptr(q).unwrap_or(DevicePtr::NULL))
            .collect();
        Ok((ptrs, f.bytes() / 4))
    }

    /// This rank's communicator under `limits` (created collectively on
    /// first use).
    fn comm(&mut self, limits: NcclLimits) -> Result<CommHandle> {
        let key = limits.max_ctas;
        if !self.comms.contains_key(&key) {
            let name = format!("comm{}", self.comms.len());
            let c = communicator(&self.rv, &name, &self.ctx, limits)?;
            self.comms.insert(key, c);
        }
        self.comms
            .get(&key)
            .map(|c| CommHandle(c.raw()))
            .ok_or_else(|| CudaError::Plan("NCCL communicator missing".into()))
    }

    /// This rank's communicator for `plan` (its NCCL limits), if it has
    /// NCCL tasks and the job is not in loopback.
    pub(crate) fn plan_comm(&mut self, plan: &Plan) -> Result<Option<CommHandle>> {
        let has_nccl = plan.has_task(|k| matches!(k, TaskKind::Nccl { .. }));
        if !has_nccl || self.loopback {
            return Ok(None);
        }
        let limits = NcclLimits {
            max_ctas: plan.resources.nccl_ctas.map(|c| c as u32),
            ..NcclLimits::default()
        };
        Ok(Some(self.comm(limits)?))
    }

    /// Everything a run of `plan` needs from the job (flag memory, the
    /// communicator, a fresh tag for its barriers).
    pub(crate) fn run_view(&mut self, plan: &Plan) -> Result<JobRun<'_>> {
        if !self.rv.single_node() && needs_one_node(plan) {
            return Err(CudaError::Skipped(format!(
                "copy-engine and fused schedules need every rank on one node; this job spans {} hosts",
                {
                    let mut h = self.rv.hosts().to_vec();
                    h.sort();
                    h.dedup();
                    h.len()
                }
            )));
        }
        let words = crate::signal::SignalLayout::new(plan)
            .words
            .iter()
            .copied()
            .max()
            .unwrap_or(1);
        let (flags, flag_words) = self.flags(words)?;
        let comm = self.plan_comm(plan)?;
        self.runs += 1;
        Ok(JobRun {
            rv: &self.rv,
            flags,
            flag_words,
            loopback: self.loopback,
            comm,
            tag: self.runs,
        })
    }

    /// Every rank's times of the run just done, by rank.
    pub(crate) fn gather_times(&mut self, mine: &RankTimes) -> Result<Vec<RankTimes>> {
        self.runs += 1;
        let all = self
            .rv
            .all_gather(&format!("times/{}", self.runs), &encode_times(mine))?;
        all.iter()
            .enumerate()
            .map(|(q, b)| {
                decode_times(b).ok_or_else(|| {
                    self.fail(
                        DistError::Mismatch(format!("rank {q} sent malformed run times")).into(),
                    )
                })
            })
            .collect()
    }

    /// Every rank's (max relative error, correct) of the check just done.
    pub(crate) fn gather_check(&mut self, err: f64, ok: bool) -> Result<(f64, bool)> {
        self.runs += 1;
        let mut mine = err.to_le_bytes().to_vec();
        mine.push(u8::from(ok));
        let all = self.rv.all_gather(&format!("check/{}", self.runs), &mine)?;
        let mut max_err: f64 = 0.0;
        let mut all_ok = true;
        for (q, b) in all.iter().enumerate() {
            if b.len() != 9 {
                return Err(self.fail(
                    DistError::Mismatch(format!("rank {q} sent a malformed check result")).into(),
                ));
            }
            let e = f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
            max_err = if e.is_nan() { f64::NAN } else { max_err.max(e) };
            all_ok &= b[8] == 1;
        }
        Ok((max_err, all_ok))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ficco_core::plan::lower::lower;
    use ficco_core::plan::BufferRole;
    use ficco_core::problem::workload::{Op, Problem};
    use ficco_core::space::Schedule;

    fn plan(op: Op, schedule: &str) -> Plan {
        let p = Problem::new(op, 1024, 512, 256, 4).expect("problem");
        let s: Schedule = schedule.parse().expect("schedule");
        lower(&p, &s).expect("lower")
    }

    #[test]
    fn times_survive_the_exchange_encoding() {
        let t = RankTimes {
            iters: vec![1.5, 2.25],
            tasks: vec![(0.0, 0.5), (0.5, 1.25), (1.0, 2.0)],
            host_us: vec![17.0],
            graphed: true,
            graph_error: None,
        };
        let bytes = encode_times(&t);
        assert!(decode_times(&bytes[..20]).is_none());
        let d = decode_times(&bytes).expect("decodes");
        assert_eq!(
            (d.iters, d.tasks, d.host_us, d.graphed),
            (t.iters, t.tasks, t.host_us, true)
        );
        assert!(decode_times(&[]).is_none());
    }

    #[test]
    fn arena_offsets_are_aligned_disjoint_and_cover_the_largest_rank() {
        for (op, s) in [
            (Op::AgGemm, "shard-copy-ring"),
            (Op::GemmRs, "seq"),
            (Op::GemmAr, "fine2-nccl-ring"),
        ] {
            let plan = plan(op, s);
            let (offs, need) = arena_layout(&plan, &[]);
            for (rp, o) in plan.ranks.iter().zip(&offs) {
                let mut end = 0;
                for (b, &at) in rp.buffers.iter().zip(o) {
                    assert_eq!(at % ALIGN, 0);
                    assert!(at >= end, "{op:?} {s}: overlapping buffers");
                    end = at + b.bytes();
                }
                assert!(end <= need);
            }
        }
    }

    #[test]
    fn a_calls_arena_leaves_out_exactly_the_operands_bound_in_place() {
        for (op, s) in [
            (Op::AgGemm, "shard-copy-ring"),
            (Op::AgGemm, "shard-nccl-ring"),
            (Op::GemmRs, "fine2-copy-all"),
            (Op::GemmAr, "shard-copy-ring"),
        ] {
            let plan = plan(op, s);
            let uses = ficco_core::plan::validate::buffer_use(&plan);
            let local = crate::exec::op::call_local(&plan, &uses);
            let (full, need_full) = arena_layout(&plan, &[]);
            let (offs, need) = arena_layout(&plan, &local);
            let mut saved = 0;
            for (r, rp) in plan.ranks.iter().enumerate() {
                let mut end = 0;
                for (b, buf) in rp.buffers.iter().enumerate() {
                    if local[r][b] {
                        saved += 1;
                        continue;
                    }
                    let at = offs[r][b];
                    assert_eq!(at % ALIGN, 0);
                    assert!(at >= end, "{op:?} {s}: overlapping buffers");
                    end = at + buf.bytes();
                }
                assert!(end <= need);
                // B never reaches a peer in these plans: it takes no room.
                let b = rp.buffer_with(BufferRole::InputB).expect("B");
                assert!(local[r][b], "{op:?} {s}: rank {r}'s B");
                assert!(full[r].len() == offs[r].len());
            }
            assert!(
                saved > 0 && need < need_full,
                "{op:?} {s}: {need} of {need_full}"
            );
        }
    }

    #[test]
    fn only_nccl_plans_may_span_nodes() {
        assert!(!needs_one_node(&plan(Op::AgGemm, "seq")));
        assert!(!needs_one_node(&plan(Op::GemmRs, "fine2-nccl-ring")));
        assert!(needs_one_node(&plan(Op::AgGemm, "shard-copy-ring")));
    }
}
