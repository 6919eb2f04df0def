//! [`Session`]: one process's rank of a job, the runtime behind
//! `ficco explore --procs N`, `torchrun ... ficco explore` and the Python
//! ops. It joins the rendezvous, drives this process's GPU (or GPU 0 for
//! every rank, in loopback), keeps the plan buffers and signal flags in
//! memory shared with the node's other ranks, and runs plans: whole
//! measurements ([`Session::backend`]) or one operator on the caller's
//! device memory ([`Session::run_op`]).

mod choose;

/// Where the host time of this thread's operator calls went since the
/// last report: each phase's name, mean microseconds and count.
pub use crate::exec::op::clock::take as host_times;
/// The native clock's marks for a binding's entry and return.
pub use crate::exec::op::clock::{enter as clock_enter, leave as clock_leave};
use choose::{runs_in_loopback, test_tile_in_loopback};

use crate::backend::{GpuBackend, Operand};
use crate::error::{CudaError, Result};
use crate::exec::op::clock::{self, Phase};
use crate::mem::DevicePtr;
use crate::runtime::job::Job;
use crate::runtime::shared::SymmetricMem;
use ficco_core::choose::call::CallDecision;
use ficco_core::choose::explore::check_named;
use ficco_core::choose::tune::TuneCache;
use ficco_core::plan::lower::lower;
use ficco_core::plan::{BufferRole, Plan, TaskKind};
use ficco_core::problem::workload::{Op, Problem, ELEM_BYTES};
use ficco_core::space::{GemmEngine, Schedule, SpaceOptions};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::runtime::LaunchEnv;

/// How a process joins its job.
#[derive(Debug, Clone)]
pub struct SessionOpts {
    /// Every rank on GPU 0 (several processes on one GPU). `None`: loopback
    /// exactly when this node has more ranks than GPUs.
    pub loopback: Option<bool>,
    /// The GPU this rank drives; `None`: `LOCAL_RANK`, or 0 in loopback
    /// (a PyTorch rank passes its current device).
    pub device: Option<usize>,
    /// Bound of every rendezvous wait.
    pub timeout: Duration,
}

impl Default for SessionOpts {
    fn default() -> Self {
        SessionOpts {
            loopback: None,
            device: None,
            timeout: crate::runtime::timeout_from_env(),
        }
    }
}

/// One call of an operator on device memory the caller owns (a PyTorch
/// tensor's storage), all bf16, row-major and contiguous, on this rank's
/// device. Shapes follow `ficco_core::problem::workload::Problem` (P ranks):
///
/// | op | `a` | `b` | `out` |
/// |---|---|---|---|
/// | `ag-gemm` | `[m/P, k]` this rank's shard | `[k, n]` | `[m, n]` = all_gather(a) @ b |
/// | `gemm-rs` | `[m, k]` | `[k, n]` | `[m/P, n]` = reduce_scatter(a @ b), rank r's rows |
/// | `gemm-ar` | `[m, k]` | `[k, n]` | `[m, n]` = all_reduce(a @ b) |
#[derive(Debug, Clone)]
pub struct OpCall<'a> {
    pub op: Op,
    pub m: usize,
    pub k: usize,
    pub n: usize,
    /// A schedule name (`ficco schedules`), or `None` for the tuning cache's
    /// winner, else the rule selector's pick.
    pub schedule: Option<&'a str>,
    /// Device addresses of the operands.
    pub a: u64,
    pub b: u64,
    pub out: u64,
    /// The caller's stream (`CUstream`, 0 for the legacy default stream):
    /// the operator starts after the work queued on it and the caller's
    /// later work on it starts after the operator.
    pub stream: u64,
    /// `b` holds B transposed: `[n, k]` row-major (a weight `W` of
    /// `a @ W^T`). Only schedules whose GEMMs are plain cuBLASLt ones take
    /// it (not `tile`, grouped or ficco's own GEMM); cuBLASLt reads it
    /// transposed, with no copy.
    pub b_transposed: bool,
    /// ag-gemm only: where to also write the gathered A (`[m, k]`), or 0.
    /// Written in the stream order like the output (NCCL schedules gather
    /// straight into it; the others copy it out of their shared buffer).
    pub gathered: u64,
}

/// What a call ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpDone {
    /// The schedule that ran (its canonical name).
    pub schedule: String,
}

/// One process's rank of a job.
pub struct Session {
    backend: GpuBackend,
    /// Schedules already chosen for `auto`, by problem.
    picks: HashMap<Problem, Schedule>,
    /// Call decisions already made for `auto` in a model, by problem.
    decisions: HashMap<Problem, CallDecision>,
    /// The tuning cache (loaded once; `FICCO_TUNE_CACHE` or the default path).
    cache: Option<TuneCache>,
    /// Shared allocations handed to the caller ([`Session::alloc`]).
    heap: Vec<SymmetricMem>,
    /// Operator calls and allocations so far (names each exchange).
    calls: u64,
    /// Shared allocations ever made (collective, so alike on every rank:
    /// while it is 0 no operand can be in shared memory and the exchange
    /// that finds out is skipped).
    allocs: u64,
    /// Lowered plans by call, so a repeated call neither parses nor
    /// lowers again, with the canonical name of their schedule (formatted
    /// once, not per call).
    plans: HashMap<PlanKey, (String, Arc<Plan>)>,
}

/// A call's problem, schedule name (`None`: auto) and whether B comes
/// transposed.
type PlanKey = (Problem, Option<String>, bool);

/// Call shapes whose lowered plan a session keeps (then it forgets them all).
const PLANS_KEPT: usize = 256;

pub(super) fn bad(e: impl std::fmt::Display) -> CudaError {
    CudaError::Plan(e.to_string())
}

impl Session {
    /// Joins the job that `env` describes (see [`LaunchEnv::from_env`]):
    /// rendezvous, this rank's GPU (`LOCAL_RANK`, or 0 in loopback), the
    /// shared signal memory. Every rank of the job calls it.
    pub fn join(env: LaunchEnv, opts: SessionOpts) -> Result<Self> {
        let mut backend = GpuBackend::open_job(env, opts.loopback, opts.device, opts.timeout)?;
        // `FICCO_OP_SYNC=1` on any rank puts every rank on the full path:
        // ranks on different paths would wait at different barriers.
        if let Some(job) = backend.job_mut() {
            let mine = u8::from(crate::exec::op::sync_from_env());
            let votes = job.rv.all_gather("opsync", &[mine])?;
            job.op.sync = votes.iter().any(|v| v.first() == Some(&1));
            job.op.peer_wait = opts.timeout;
        }
        Ok(Session {
            backend,
            picks: HashMap::new(),
            decisions: HashMap::new(),
            cache: None,
            heap: vec![],
            calls: 0,
            allocs: 0,
            plans: HashMap::new(),
        })
    }

    fn job(&self) -> Result<&Job> {
        self.backend
            .job()
            .ok_or_else(|| CudaError::Plan("the session has no job".into()))
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.job().map_or(0, |j| j.rank())
    }

    /// Ranks in the job.
    pub fn world(&self) -> usize {
        self.backend.gpus()
    }

    /// Whether every rank runs on one GPU.
    pub fn loopback(&self) -> bool {
        self.backend.is_loopback()
    }

    /// Whether every rank is on this node (copy and tile schedules need it).
    pub fn single_node(&self) -> bool {
        self.job().is_ok_and(|j| j.rv.single_node())
    }

    /// The CUDA device ordinal this rank drives.
    pub fn device(&self) -> usize {
        self.job().map_or(0, |j| j.ordinal)
    }

    /// The measuring backend of this rank (every rank calls the same
    /// `prepare`/`measure` sequence; every rank gets the job's results).
    pub fn backend(&mut self) -> &mut GpuBackend {
        &mut self.backend
    }

    /// A shared allocation of `bytes` on this rank's device (like PyTorch's
    /// `symm_mem.empty`): every rank calls it with the same size and gets
    /// its own buffer, which the node's other ranks map too. Operands that
    /// lie in such buffers (at the same offset on every rank) are read and
    /// written in place by [`Session::run_op`] instead of copied. Returns
    /// the device address; [`Session::free`] releases it.
    pub fn alloc(&mut self, bytes: usize) -> Result<u64> {
        if bytes == 0 {
            return Err(bad("a shared allocation needs at least one byte"));
        }
        let (ctx, ordinal) = self.backend.rank_context()?;
        self.calls += 1;
        let job = self.job()?;
        let m = SymmetricMem::exchange(
            &job.rv,
            &format!("heap{}", self.calls),
            &ctx,
            ordinal,
            bytes,
        )?;
        let addr = m.ptr(job.rank()).map_or(0, |p| p.raw());
        self.heap.push(m);
        self.allocs += 1;
        Ok(addr)
    }

    /// Releases this rank's shared allocation at `addr` (local: peers keep
    /// the memory mapped until they release theirs), once this rank's
    /// operator calls finished (one may still use it). Unknown addresses
    /// are an error.
    pub fn free(&mut self, addr: u64) -> Result<()> {
        let synced = self.backend.wait_ops();
        let me = self.rank();
        let i = self
            .heap
            .iter()
            .position(|m| m.ptr(me).is_some_and(|p| p.raw() == addr))
            .ok_or_else(|| {
                bad(format!(
                    "0x{addr:x} is not a shared allocation of this session"
                ))
            })?;
        // A failed call leaves nothing running (its hang was released):
        // the memory goes either way, and the failure is reported.
        self.heap.swap_remove(i);
        synced
    }

    /// Waits until every operator call this rank issued finished on its
    /// device (the caller's stream need not be synchronized). A call that
    /// hung (a peer died) is reported here, or by the next call.
    pub fn synchronize(&mut self) -> Result<()> {
        self.backend.sync_ops()
    }

    /// Where `[addr, addr + bytes)` lies in a shared allocation: its index
    /// and offset (16-byte aligned, as TMA loads want), if it does.
    fn in_heap(&self, addr: u64, bytes: usize) -> Option<(usize, u64)> {
        let me = self.rank();
        self.heap.iter().enumerate().find_map(|(i, m)| {
            let base = m.ptr(me)?.raw();
            let off = addr.checked_sub(base)?;
            (off + bytes as u64 <= m.bytes() as u64 && off % 16 == 0).then_some((i, off))
        })
    }

    /// The operands of a call: each in shared memory at the same place on
    /// every rank is bound in place (decided alike on every rank through one
    /// exchange), the others are copied.
    fn operands(&mut self, ops: &[(BufferRole, u64, usize)]) -> Result<Vec<Operand>> {
        if self.allocs == 0 {
            return Ok(ops
                .iter()
                .map(|&(role, addr, bytes)| Operand {
                    role,
                    addr,
                    bytes,
                    shared: None,
                    gathered: false,
                })
                .collect());
        }
        let mine: Vec<u8> = ops
            .iter()
            .flat_map(|&(_, addr, bytes)| {
                let (i, off) = self
                    .in_heap(addr, bytes)
                    .map_or((u64::MAX, 0), |(i, o)| (i as u64, o));
                [i.to_le_bytes(), off.to_le_bytes()].concat()
            })
            .collect();
        self.calls += 1;
        let job = self.job()?;
        let all = job
            .rv
            .all_gather(&format!("operands/{}", self.calls), &mine)?;
        let world = job.world();
        Ok(ops
            .iter()
            .enumerate()
            .map(|(j, &(role, addr, bytes))| {
                let at = &mine[j * 16..j * 16 + 16];
                let agreed = at[..8] != u64::MAX.to_le_bytes()
                    && all.iter().all(|v| v.get(j * 16..j * 16 + 16) == Some(at));
                let shared = agreed.then(|| {
                    let i = u64::from_le_bytes(at[..8].try_into().unwrap_or([0; 8])) as usize;
                    let off = u64::from_le_bytes(at[8..].try_into().unwrap_or([0; 8])) as usize;
                    (0..world)
                        .map(|q| {
                            self.heap
                                .get(i)
                                .and_then(|m| m.ptr(q))
                                .map_or(DevicePtr::NULL, |p| p.offset(off))
                        })
                        .collect::<Vec<_>>()
                });
                // Memory of another node's rank is not mapped here: copy.
                let shared = shared.filter(|v| v.iter().all(|p| !p.is_null()));
                Operand {
                    role,
                    addr,
                    bytes,
                    shared,
                    gathered: false,
                }
            })
            .collect())
    }

    /// The schedule and plan of `call` on `p` (checked, lowered).
    fn plan_of(&mut self, p: &Problem, call: &OpCall<'_>) -> Result<(Schedule, Plan)> {
        let schedule = match call.schedule {
            Some(name) => {
                let s: Schedule = name.parse().map_err(bad)?;
                check_named(call.op, SpaceOptions::default(), std::slice::from_ref(&s))
                    .map_err(bad)?;
                if let Some(why) = s.misfit(p) {
                    return Err(bad(format!(
                        "schedule {name} does not fit {}: {why}",
                        p.label()
                    )));
                }
                s
            }
            None => self.pick(p)?,
        };
        let plan = lower(p, &schedule).map_err(bad)?;
        if self.loopback()
            && !schedule.is_seq()
            && !runs_in_loopback(&plan)
            && !test_tile_in_loopback(&plan)
        {
            return Err(CudaError::Skipped(format!(
                "schedule {} needs NCCL or tile GEMMs, which cannot run with every rank on one GPU (loopback); use a copy schedule",
                schedule.name()
            )));
        }
        Ok((schedule, plan))
    }

    /// Runs one operator on the caller's memory (see [`OpCall`]); every
    /// rank of the job calls it with the same op, shapes and schedule.
    /// Returns once it is queued on the caller's stream (the first call of
    /// a call shape, and a few others, return once it ran: see
    /// `crate::exec::op`).
    pub fn run_op(&mut self, call: &OpCall<'_>) -> Result<OpDone> {
        clock::begin();
        if !matches!(call.op, Op::AgGemm | Op::GemmRs | Op::GemmAr) {
            return Err(bad(format!(
                "{} is not an operator call (ag-gemm, gemm-rs or gemm-ar)",
                call.op
            )));
        }
        if call.gathered != 0 && call.op != Op::AgGemm {
            return Err(bad(format!(
                "a gathered A is an output of ag-gemm only, not of {}",
                call.op
            )));
        }
        let p = Problem::new(call.op, call.m, call.k, call.n, self.world()).map_err(bad)?;
        let key = (p, call.schedule.map(str::to_owned), call.b_transposed);
        let (name, plan) = match self.plans.get(&key) {
            Some((name, plan)) => (name.clone(), plan.clone()),
            None => {
                let (s, mut plan) = self.plan_of(&p, call)?;
                if call.b_transposed {
                    if let Some(why) = refuses_transposed_b(&plan) {
                        return Err(bad(format!(
                            "schedule {} cannot take a transposed b: {why}; use a schedule whose \
                             GEMMs run on cuBLASLt (not tile, grouped, -own, -smN or -occS)",
                            s.name()
                        )));
                    }
                    plan.resources.b_transposed = true;
                }
                let plan = Arc::new(plan);
                if self.plans.len() >= PLANS_KEPT {
                    self.plans.clear();
                }
                let name = s.name();
                self.plans.insert(key, (name.clone(), plan.clone()));
                (name, plan)
            }
        };
        clock::lap(Phase::Plan);
        let e = ELEM_BYTES;
        let shard = p.m / p.gpus;
        let (a_rows, out_rows) = match call.op {
            Op::AgGemm => (shard, p.m),
            Op::GemmRs => (p.m, shard),
            _ => (p.m, p.m),
        };
        let mut operands = self.operands(&[
            (BufferRole::InputA, call.a, a_rows * p.k * e),
            (BufferRole::InputB, call.b, p.k * p.n * e),
            (BufferRole::Output, call.out, out_rows * p.n * e),
        ])?;
        if call.gathered != 0 {
            operands.push(Operand {
                role: BufferRole::Scratch,
                addr: call.gathered,
                bytes: p.m * p.k * e,
                shared: None,
                gathered: true,
            });
        }
        clock::lap(Phase::Operands);
        self.backend.run_on(&plan, &operands, call.stream)?;
        Ok(OpDone { schedule: name })
    }

    /// Leaves the job (this rank's calls finish, a last barrier, then the
    /// store closes).
    pub fn close(mut self) -> Result<()> {
        let synced = self.backend.sync_ops();
        self.heap.clear();
        synced?;
        match self.backend.into_job() {
            Some(job) => Ok(job.rv.close()?),
            None => Ok(()),
        }
    }
}

/// Why `plan` cannot read its B operand transposed, if it cannot: only plain
/// GEMM tasks on cuBLASLt can ([`crate::gemm`]).
fn refuses_transposed_b(plan: &Plan) -> Option<&'static str> {
    if plan.resources.gemm != GemmEngine::Cublas {
        return Some("its GEMMs run on ficco's own kernel");
    }
    plan.ranks
        .iter()
        .flat_map(|r| &r.tasks)
        .find_map(|t| match t.kind {
            TaskKind::GroupedGemm { .. } => Some("it has grouped GEMM tasks"),
            TaskKind::TileGemm(_) => Some("it has tile GEMM tasks"),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    //! GPU test (one GPU, `#[ignore]`d; see `ficco-testkit` for the policy):
    //! the parent re-runs this test binary as 2 and 4 ranks on GPU 0
    //! (loopback); each rank calls the three operators on its own device
    //! memory and checks its output against a host reference of every
    //! rank's inputs (regenerated from the ranks' seeds).
    //!
    //! The ranks see only GPU 0 (`ChildGpus::First`), as on a one-GPU
    //! machine: on four GPUs this test took 76 s against about 10 s on one.
    //! Each rank process started the driver on all four GPUs, and its
    //! `info` (at open and, before `info` kept its result, at every `auto`
    //! pick's device lookup) created and destroyed a context on each.
    use super::*;
    use crate::mem::DeviceBuffer;
    use cudarc::driver::CudaContext;
    use ficco_testkit::{b2f, gate, rand, rel_err, GpuAvailability};

    const CHILD: &str = "FICCO_SESSION_CHILD";
    const TEST: &str = "session::tests::operators_on_caller_memory_match_the_reference";
    const M: usize = 512;
    const K: usize = 256;
    const N: usize = 384;

    #[test]
    #[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
    fn operators_on_caller_memory_match_the_reference() {
        if std::env::var(CHILD).is_ok() {
            child();
            return;
        }
        let found = match crate::loader::require().and_then(|_| crate::info::device_count()) {
            Ok(n) => GpuAvailability::Found(n),
            Err(e) => GpuAvailability::Unusable(e.to_string()),
        };
        gate("operators_on_caller_memory_match_the_reference", 1, found);
        for world in [2, 4] {
            let codes = crate::runtime::run_children(
                TEST,
                world,
                CHILD,
                crate::runtime::ChildGpus::First,
                // About 5 s per world; a failing rank ends the others within
                // their 30 s rendezvous bound, well before this one.
                std::time::Duration::from_secs(60),
            );
            assert_eq!(
                codes,
                vec![Some(0); world],
                "rank exit codes, {world} ranks"
            );
        }
    }

    /// Row-major f32 product of bf16 matrices [m, k] x [k, n].
    fn matmul(a: &[u16], b: &[u16], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut c = vec![0f32; m * n];
        for i in 0..m {
            for l in 0..k {
                let x = b2f(a[i * k + l]);
                for j in 0..n {
                    c[i * n + j] += x * b2f(b[l * n + j]);
                }
            }
        }
        c
    }

    /// What rank `me` of `world` gets from `op` ([`OpCall`]'s table) when
    /// rank r's operands are `a_of(r)` and `b_of(r)`, in f32.
    fn op_reference(
        op: Op,
        world: usize,
        me: usize,
        a_of: impl Fn(usize) -> Vec<u16>,
        b_of: impl Fn(usize) -> Vec<u16>,
    ) -> Vec<f32> {
        let shard = M / world;
        match op {
            Op::AgGemm => {
                let gathered: Vec<u16> = (0..world).flat_map(&a_of).collect();
                matmul(&gathered, &b_of(me), M, K, N)
            }
            _ => {
                let mut sum = vec![0f32; M * N];
                for r in 0..world {
                    for (s, x) in sum.iter_mut().zip(matmul(&a_of(r), &b_of(r), M, K, N)) {
                        *s += x;
                    }
                }
                if op == Op::GemmRs {
                    sum[me * shard * N..(me + 1) * shard * N].to_vec()
                } else {
                    sum
                }
            }
        }
    }

    fn child() {
        let env = LaunchEnv::from_env().expect("launcher variables");
        let (me, world) = (env.rank, env.world_size);
        let mut s = Session::join(
            env,
            SessionOpts {
                loopback: Some(true),
                ..Default::default()
            },
        )
        .expect("join");
        assert!(s.loopback() && s.single_node());
        let ctx = CudaContext::new(s.device()).expect("context");
        let upload = |v: &[u16]| {
            let d = DeviceBuffer::alloc(&ctx, v.len() * 2).expect("alloc");
            let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
            d.upload(&bytes).expect("upload");
            d
        };
        let download = |d: &DeviceBuffer| -> Vec<f32> {
            let mut bytes = vec![0u8; d.bytes()];
            d.download(&mut bytes).expect("download");
            bytes
                .chunks_exact(2)
                .map(|c| b2f(u16::from_le_bytes([c[0], c[1]])))
                .collect()
        };
        let shard = M / world;
        for (op, schedule) in [
            (Op::AgGemm, Some("shard-copy-ring")),
            (Op::AgGemm, None),
            (Op::GemmRs, Some("fine2-copy-all")),
            (Op::GemmRs, None),
            (Op::GemmAr, Some("shard-copy-ring")),
            (Op::GemmAr, None),
        ] {
            let a_rows = if op == Op::AgGemm { shard } else { M };
            // Every rank's inputs, regenerated from its seed.
            let a_of = |r: usize| rand(a_rows * K, 100 + r as u64 + 10 * op as u64);
            let b_of = |r: usize| rand(K * N, 200 + r as u64 + 10 * op as u64);
            let reference = op_reference(op, world, me, a_of, b_of);
            let (a, b) = (upload(&a_of(me)), upload(&b_of(me)));
            // Poisoned: NaN until the operator writes it.
            let poison = vec![0x7fc0u16; reference.len()];
            let out = upload(&poison);
            let call = |a: u64, b: u64, out: u64| OpCall {
                op,
                m: M,
                k: K,
                n: N,
                schedule,
                a,
                b,
                out,
                stream: 0,
                b_transposed: false,
                gathered: 0,
            };
            let done = s
                .run_op(&call(a.ptr().raw(), b.ptr().raw(), out.ptr().raw()))
                .unwrap_or_else(|e| panic!("rank {me} {op} {schedule:?}: {e}"));
            let err = rel_err(&download(&out), &reference);
            eprintln!(
                "rank {me}/{world} {op} {}: rel err {err:.2e}",
                done.schedule
            );
            assert!(
                err < 2e-2,
                "rank {me} {op} {}: rel err {err}",
                done.schedule
            );
            if let Some(name) = schedule {
                assert_eq!(done.schedule, name);
            }
            // B given transposed ([n, k] row-major): the same result, on a
            // schedule that forces cuBLASLt-only GEMMs.
            let bt: Vec<u16> = {
                let b = b_of(me);
                (0..N * K).map(|i| b[(i % K) * N + i / K]).collect()
            };
            let bt = upload(&bt);
            let out_t = upload(&poison);
            s.run_op(&OpCall {
                schedule: Some(schedule.unwrap_or("shard-copy-ring")),
                b_transposed: true,
                ..call(a.ptr().raw(), bt.ptr().raw(), out_t.ptr().raw())
            })
            .unwrap_or_else(|e| panic!("rank {me} {op} b transposed: {e}"));
            let err = rel_err(&download(&out_t), &reference);
            eprintln!("rank {me}/{world} {op} b transposed: rel err {err:.2e}");
            assert!(err < 2e-2, "rank {me} {op} b transposed: rel err {err}");
            if op == Op::AgGemm {
                // The gathered A handed back: every rank's shard, exact.
                let all: Vec<f32> = (0..world)
                    .flat_map(|q| a_of(q).into_iter().map(b2f))
                    .collect();
                let gathered = upload(&vec![0x7fc0u16; M * K]);
                let out_g = upload(&poison);
                let done = s
                    .run_op(&OpCall {
                        gathered: gathered.ptr().raw(),
                        ..call(a.ptr().raw(), b.ptr().raw(), out_g.ptr().raw())
                    })
                    .unwrap_or_else(|e| panic!("rank {me} {op} gathered: {e}"));
                assert_eq!(
                    download(&gathered),
                    all,
                    "rank {me} {} gathered A",
                    done.schedule
                );
                let err = rel_err(&download(&out_g), &reference);
                assert!(err < 2e-2, "rank {me} {op} gathered: rel err {err}");
            }
            // The same operands in shared allocations: bound in place. The
            // output sits at an offset, so offsets are exercised too.
            let bytes = |v: &[u16]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
            let sa = s.alloc(a.bytes()).expect("alloc a");
            let sb = s.alloc(b.bytes()).expect("alloc b");
            let so = s.alloc(out.bytes() + 4096).expect("alloc out") + 4096;
            ctx.bind_to_thread().expect("bind");
            // SAFETY: each allocation holds the bytes written (ctx is current).
            unsafe {
                crate::driver::cuda::memcpy_htod(DevicePtr(sa), &bytes(&a_of(me))).expect("a");
                crate::driver::cuda::memcpy_htod(DevicePtr(sb), &bytes(&b_of(me))).expect("b");
                crate::driver::cuda::memcpy_htod(DevicePtr(so), &bytes(&poison)).expect("out");
            }
            s.run_op(&call(sa, sb, so))
                .unwrap_or_else(|e| panic!("rank {me} {op} in place: {e}"));
            let mut raw = vec![0u8; out.bytes()];
            // SAFETY: as above.
            unsafe { crate::driver::cuda::memcpy_dtoh(&mut raw, DevicePtr(so)).expect("read") };
            let got: Vec<f32> = raw
                .chunks_exact(2)
                .map(|c| b2f(u16::from_le_bytes([c[0], c[1]])))
                .collect();
            let err = rel_err(&got, &reference);
            eprintln!("rank {me}/{world} {op} in place: rel err {err:.2e}");
            assert!(err < 2e-2, "rank {me} {op} in place: rel err {err}");
            for p in [sa, sb, so - 4096] {
                s.free(p).expect("free");
            }
        }
        // Repeated calls (their fast path after each shape's first call),
        // fresh data each, ops alternating so that consecutive calls use
        // different cached plans, all issued before any result is read.
        let reference_of = |op: Op, seed: u64| -> Vec<f32> {
            let a_rows = if op == Op::AgGemm { shard } else { M };
            let a_of = |r: usize| rand(a_rows * K, seed + r as u64);
            let b_of = |r: usize| rand(K * N, seed + 50 + r as u64);
            op_reference(op, world, me, a_of, b_of)
        };
        let mut issued = vec![];
        for round in 0..3u64 {
            for (j, op) in [Op::AgGemm, Op::GemmRs, Op::GemmAr].into_iter().enumerate() {
                let seed = 10_000 + 1000 * round + 100 * j as u64;
                let a_rows = if op == Op::AgGemm { shard } else { M };
                let out_rows = if op == Op::GemmRs { shard } else { M };
                let a = upload(&rand(a_rows * K, seed + me as u64));
                let b = upload(&rand(K * N, seed + 50 + me as u64));
                let out = upload(&vec![0x7fc0u16; out_rows * N]);
                s.run_op(&OpCall {
                    op,
                    m: M,
                    k: K,
                    n: N,
                    schedule: Some("fine2-copy-all"),
                    a: a.ptr().raw(),
                    b: b.ptr().raw(),
                    out: out.ptr().raw(),
                    stream: 0,
                    b_transposed: false,
                    gathered: 0,
                })
                .unwrap_or_else(|e| panic!("rank {me} repeat {round} {op}: {e}"));
                issued.push((op, seed, a, b, out));
            }
        }
        s.synchronize().expect("every call finished");
        for (op, seed, _a, _b, out) in &issued {
            let err = rel_err(&download(out), &reference_of(*op, *seed));
            assert!(
                err < 2e-2,
                "rank {me} repeated {op} seed {seed}: rel err {err}"
            );
        }
        eprintln!("rank {me}/{world}: {} repeated calls match", issued.len());
        // Calls at one address set, replayed from a graph from the fourth
        // on: each round's inputs are copied in and its output out on the
        // caller's stream around the call, everything queued before
        // anything is read, so a replay out of the stream's order reads
        // another round's inputs or is read before it ran.
        let rounds = 8u64;
        let cases: Vec<(Op, usize, usize)> = [Op::AgGemm, Op::GemmRs]
            .into_iter()
            .map(|op| {
                let a_rows = if op == Op::AgGemm { shard } else { M };
                let out_rows = if op == Op::GemmRs { shard } else { M };
                (op, a_rows, out_rows)
            })
            .collect();
        let fixed: Vec<_> = cases
            .iter()
            .map(|&(_, a_rows, out_rows)| {
                (
                    upload(&vec![0u16; a_rows * K]),
                    upload(&vec![0u16; K * N]),
                    upload(&vec![0x7fc0u16; out_rows * N]),
                )
            })
            .collect();
        // Made before the first call: an allocation or a synchronous copy
        // would drain the queue between rounds.
        let mut rounds_data = vec![];
        for round in 0..rounds {
            for (j, &(op, a_rows, out_rows)) in cases.iter().enumerate() {
                let seed = 50_000 + 1000 * round + 100 * j as u64;
                rounds_data.push((
                    j,
                    op,
                    seed,
                    upload(&rand(a_rows * K, seed + me as u64)),
                    upload(&rand(K * N, seed + 50 + me as u64)),
                    upload(&vec![0x7fc0u16; out_rows * N]),
                ));
            }
        }
        // Stream-ordered on stream 0, the calls' stream.
        let copy = |dst: &DeviceBuffer, src: &DeviceBuffer| {
            ctx.bind_to_thread().expect("bind");
            // SAFETY: both hold dst.bytes() on this device (equal sizes).
            unsafe {
                crate::driver::cuda::memcpy_dtod_async(
                    dst.ptr(),
                    src.ptr(),
                    dst.bytes(),
                    std::ptr::null_mut(),
                )
            }
            .expect("stream-ordered copy");
        };
        for (j, op, seed, a_src, b_src, dst) in &rounds_data {
            let (a, b, out) = &fixed[*j];
            copy(a, a_src);
            copy(b, b_src);
            s.run_op(&OpCall {
                op: *op,
                m: M,
                k: K,
                n: N,
                schedule: Some("shard-copy-ring"),
                a: a.ptr().raw(),
                b: b.ptr().raw(),
                out: out.ptr().raw(),
                stream: 0,
                b_transposed: false,
                gathered: 0,
            })
            .unwrap_or_else(|e| panic!("rank {me} replay {op} seed {seed}: {e}"));
            copy(dst, out);
        }
        s.synchronize().expect("every replay finished");
        for (_, op, seed, _, _, dst) in &rounds_data {
            let err = rel_err(&download(dst), &reference_of(*op, *seed));
            assert!(
                err < 2e-2,
                "rank {me} replayed {op} seed {seed}: rel err {err}"
            );
        }
        eprintln!(
            "rank {me}/{world}: {} calls at one address set match",
            rounds_data.len()
        );
        // A bad call is an error on every rank, not a crash.
        let e = s
            .run_op(&OpCall {
                op: Op::AgGemm,
                m: M + 1,
                k: K,
                n: N,
                schedule: None,
                a: 0,
                b: 0,
                out: 0,
                stream: 0,
                b_transposed: false,
                gathered: 0,
            })
            .expect_err("m not divisible by the ranks");
        assert!(
            e.to_string().contains("divisible") || e.to_string().contains(&(M + 1).to_string()),
            "{e}"
        );
        s.close().expect("close");
    }
}
