//! [`Session`]: one process's rank of a job, the runtime behind
//! `ficco explore --procs N`, `torchrun ... ficco explore` and the Python
//! ops. It joins the rendezvous, drives this process's GPU (or GPU 0 for
//! every rank, in loopback), keeps the plan buffers and signal flags in
//! memory shared with the node's other ranks, and runs plans: whole
//! measurements ([`Session::backend`]) or one operator on the caller's
//! device memory ([`Session::run_op`]).

use super::job::{needs_one_node, Job};
use crate::backend::GpuBackend;
use crate::error::{CudaError, Result};
use ficco_core::choose::autotune::{self, Advice};
use ficco_core::choose::explore::check_named;
use ficco_core::choose::select::{self, select_rules_among, Selector};
use ficco_core::choose::tune::{self, TuneCache};
use ficco_core::plan::lower::lower;
use ficco_core::plan::{BufferRole, Plan, TaskKind};
use ficco_core::problem::workload::{Op, Problem, ELEM_BYTES};
use ficco_core::sim::profile::HwProfile;
use ficco_core::space::{Schedule, SpaceOptions};
use std::collections::HashMap;
use std::time::Duration;

use super::LaunchEnv;

/// How a process joins its job.
#[derive(Debug, Clone)]
pub struct SessionOpts {
    /// Every rank on GPU 0 (several processes on one GPU). `None`: loopback
    /// exactly when this node has more ranks than GPUs.
    pub loopback: Option<bool>,
    /// Bound of every rendezvous wait.
    pub timeout: Duration,
}

impl Default for SessionOpts {
    fn default() -> Self {
        SessionOpts {
            loopback: None,
            timeout: super::timeout_from_env(),
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
}

/// What a call ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpDone {
    /// The schedule that ran (its canonical name).
    pub schedule: String,
}

/// The hardware profile the selector and the simulator use for `auto`.
const SELECT_HW: &str = "h200-nvlink";

/// One process's rank of a job.
pub struct Session {
    backend: GpuBackend,
    /// Schedules already chosen for `auto`, by problem.
    picks: HashMap<Problem, Schedule>,
    /// The tuning cache (loaded once; `FICCO_TUNE_CACHE` or the default path).
    cache: Option<TuneCache>,
}

/// Whether `plan` can run where every rank shares one GPU: no NCCL (it
/// refuses two ranks on one GPU), no tile GEMM (its blocks spin on flags
/// that another process's copies set; processes on one GPU time-slice).
fn runs_in_loopback(plan: &Plan) -> bool {
    !plan.ranks.iter().any(|rp| {
        rp.tasks
            .iter()
            .any(|t| matches!(t.kind, TaskKind::Nccl { .. } | TaskKind::TileGemm(_)))
    })
}

fn bad(e: impl std::fmt::Display) -> CudaError {
    CudaError::Plan(e.to_string())
}

impl Session {
    /// Joins the job that `env` describes (see [`LaunchEnv::from_env`]):
    /// rendezvous, this rank's GPU (`LOCAL_RANK`, or 0 in loopback), the
    /// shared signal memory. Every rank of the job calls it.
    pub fn join(env: LaunchEnv, opts: SessionOpts) -> Result<Self> {
        let backend = GpuBackend::open_job(env, opts.loopback, opts.timeout)?;
        Ok(Session {
            backend,
            picks: HashMap::new(),
            cache: None,
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

    /// The schedule `auto` runs for `p`: the tuning cache's measured
    /// winner for this device, else the rule selector's pick; where that
    /// cannot run here (NCCL or tile GEMMs in loopback, copies across
    /// nodes), the rule selector among the schedules that can.
    pub fn pick(&mut self, p: &Problem) -> Result<Schedule> {
        if let Some(s) = self.picks.get(p) {
            return Ok(*s);
        }
        let cache = self.cache.get_or_insert_with(|| {
            let path = std::env::var_os("FICCO_TUNE_CACHE")
                .map(std::path::PathBuf::from)
                .unwrap_or_else(tune::default_path);
            TuneCache::load(&path).0
        });
        let here = crate::info::device_and_software(p.gpus);
        let cached = match autotune::consult(
            cache,
            p,
            here.as_ref().map(|(d, s)| (d.as_str(), s.as_str())),
        ) {
            Advice::Hit(e) => e.schedule.parse::<Schedule>().ok(),
            Advice::Miss(_) => None,
        };
        let hw = HwProfile::builtin(SELECT_HW).map_err(bad)?;
        let first = match cached {
            Some(s) => s,
            None => {
                select::select(p, &hw, Selector::Rules)
                    .map_err(bad)?
                    .schedule
            }
        };
        let loopback = self.loopback();
        let multi_node = !self.single_node();
        let fits = |s: &Schedule| -> bool {
            lower(p, s).is_ok_and(|plan| {
                (!loopback || runs_in_loopback(&plan)) && (!multi_node || !needs_one_node(&plan))
            })
        };
        let s = if fits(&first) {
            first
        } else {
            let among: Vec<Schedule> = select::candidates(p).into_iter().filter(fits).collect();
            select_rules_among(p, &hw, &among).map_err(bad)?.schedule
        };
        self.picks.insert(*p, s);
        Ok(s)
    }

    /// Runs one operator on the caller's memory (see [`OpCall`]); every
    /// rank of the job calls it with the same op, shapes and schedule.
    pub fn run_op(&mut self, call: &OpCall<'_>) -> Result<OpDone> {
        if !matches!(call.op, Op::AgGemm | Op::GemmRs | Op::GemmAr) {
            return Err(bad(format!(
                "{} is not an operator call (ag-gemm, gemm-rs or gemm-ar)",
                call.op
            )));
        }
        let p = Problem::new(call.op, call.m, call.k, call.n, self.world()).map_err(bad)?;
        let schedule = match call.schedule {
            Some(name) => {
                let s: Schedule = name.parse().map_err(bad)?;
                check_named(call.op, SpaceOptions::default(), std::slice::from_ref(&s))
                    .map_err(bad)?;
                if let Some(why) = s.misfit(&p) {
                    return Err(bad(format!(
                        "schedule {name} does not fit {}: {why}",
                        p.label()
                    )));
                }
                s
            }
            None => self.pick(&p)?,
        };
        let plan = lower(&p, &schedule).map_err(bad)?;
        if self.loopback() && !runs_in_loopback(&plan) && !schedule.is_seq() {
            return Err(CudaError::Skipped(format!(
                "schedule {} needs NCCL or tile GEMMs, which cannot run with every rank on one GPU (loopback); use a copy schedule",
                schedule.name()
            )));
        }
        let e = ELEM_BYTES;
        let shard = p.m / p.gpus;
        let (a_rows, out_rows) = match call.op {
            Op::AgGemm => (shard, p.m),
            Op::GemmRs => (p.m, shard),
            _ => (p.m, p.m),
        };
        let inputs = [
            (BufferRole::InputA, call.a, a_rows * p.k * e),
            (BufferRole::InputB, call.b, p.k * p.n * e),
        ];
        self.backend
            .run_on(&plan, &inputs, (call.out, out_rows * p.n * e), call.stream)?;
        Ok(OpDone {
            schedule: schedule.name(),
        })
    }

    /// Leaves the job (a last barrier, then the store closes).
    pub fn close(self) -> Result<()> {
        match self.backend.into_job() {
            Some(job) => Ok(job.rv.close()?),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    //! GPU tests: the parent re-runs this test binary as 2 and 4 ranks on
    //! GPU 0 (loopback); each rank calls the three operators on its own
    //! device memory and checks its output against a host reference of
    //! every rank's inputs (regenerated from the ranks' seeds).
    use super::*;
    use crate::mem::DeviceBuffer;
    use crate::test_common::{b2f, gate, rand, rel_err, GpuAvailability};
    use cudarc::driver::CudaContext;

    const CHILD: &str = "FICCO_SESSION_CHILD";
    const TEST: &str = "dist::session::tests::operators_on_caller_memory_match_the_reference";
    const M: usize = 512;
    const K: usize = 256;
    const N: usize = 384;

    #[test]
    fn operators_on_caller_memory_match_the_reference() {
        if std::env::var(CHILD).is_ok() {
            child();
            return;
        }
        let found = match crate::loader::require().and_then(|_| crate::info::device_count()) {
            Ok(n) => GpuAvailability::Found(n),
            Err(e) => GpuAvailability::Unusable(e.to_string()),
        };
        if !gate("operators_on_caller_memory_match_the_reference", 1, found) {
            return;
        }
        for world in [2, 4] {
            let codes =
                crate::dist::run_children(TEST, world, CHILD, std::time::Duration::from_secs(240));
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
            let reference: Vec<f32> = match op {
                Op::AgGemm => {
                    let gathered: Vec<u16> = (0..world).flat_map(a_of).collect();
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
            };
            let (a, b) = (upload(&a_of(me)), upload(&b_of(me)));
            // Poisoned: NaN until the operator writes it.
            let out = upload(&vec![0x7fc0u16; reference.len()]);
            let done = s
                .run_op(&OpCall {
                    op,
                    m: M,
                    k: K,
                    n: N,
                    schedule,
                    a: a.ptr().raw(),
                    b: b.ptr().raw(),
                    out: out.ptr().raw(),
                    stream: 0,
                })
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
        }
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
            })
            .expect_err("m not divisible by the ranks");
        assert!(
            e.to_string().contains("divisible") || e.to_string().contains(&(M + 1).to_string()),
            "{e}"
        );
        s.close().expect("close");
    }
}
