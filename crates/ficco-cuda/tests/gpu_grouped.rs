//! GPU tests of the grouped mode of ficco's Hopper GEMM
//! ([`ficco_cuda::hgemm::grouped`]) and of the executor's grouped GEMM route:
//!
//! * the grouped kernel against a per-group host reference, for several
//!   group counts and sizes: empty groups, row counts that are not
//!   multiples of 128, a heavily skewed group list, padded leading
//!   dimensions, both tiles, and SM budgets small enough that each CTA
//!   walks tiles of several groups; outputs poisoned with NaN first, and
//!   padding columns must stay poisoned;
//! * the grouped kernel against the loop of per-expert cuBLASLt calls at an
//!   MoE size (32 experts, Zipf-like skew, some empty);
//! * the executor: a `GroupedGemm` task runs on the grouped kernel by
//!   default and on the cuBLASLt loop under `FICCO_GROUPED=loop`, both
//!   matching the host reference; groups the kernel does not support (N not
//!   a multiple of 8) stay on the loop and are exact too.
//!
//! They need a Hopper GPU, so they are `#[ignore]`d and fail where they run
//! without one (see `ficco_testkit` for the policy); `executor_test_plans_are_valid`
//! runs on the CPU. The executor test sets `FICCO_GROUPED`: run with
//! `--include-ignored --test-threads=1 --nocapture` (`bench/gpu-tests.sh`).

use common::{b2f, no_gpu, rand, rel_err};
use cudarc::driver::CudaContext;
use ficco_core::plan::{
    Buffer, BufferRole, GemmGroup, Plan, RankPlan, StreamRole, StreamSpec, Task, TaskKind, View,
};
use ficco_core::problem::workload::{Op, Problem};
use ficco_core::settings::Grouped as Route;
use ficco_core::space::Priority;
use ficco_cuda::gemm::{GemmKey, Gemms, WORKSPACE_BYTES};
use ficco_cuda::hgemm::grouped::{Group, GroupedArgs};
use ficco_cuda::hgemm::{Bf16, HopperGemm, TileN, TypedPtr};
use ficco_cuda::mem::DeviceBuffer;
use ficco_cuda::{CudaError, GpuBackend};
use ficco_testkit as common;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

const NAN: u16 = 0x7fc0;

type Gpu = (Arc<CudaContext>, HopperGemm);

/// The loaded kernel on GPU 0, shared by the tests; fails `test` where
/// there is no usable Hopper GPU.
fn gpu(test: &str) -> MutexGuard<'static, Gpu> {
    static G: OnceLock<Result<Mutex<Gpu>, String>> = OnceLock::new();
    let g = G.get_or_init(|| {
        ficco_cuda::loader::require().map_err(|e| e.to_string())?;
        let n = CudaContext::device_count().map_err(|e| format!("{e:?}"))?;
        if n < 1 {
            return Err("no GPU".into());
        }
        let ctx = CudaContext::new(0).map_err(|e| format!("{e:?}"))?;
        let g = HopperGemm::load(&ctx).map_err(|e| e.to_string())?;
        Ok(Mutex::new((ctx, g)))
    });
    match g {
        Ok(m) => m.lock().unwrap_or_else(|p| p.into_inner()),
        Err(e) => no_gpu(test, e),
    }
}

fn to_bytes(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn upload(ctx: &Arc<CudaContext>, v: &[u16]) -> DeviceBuffer {
    let b = DeviceBuffer::alloc(ctx, v.len().max(1) * 2).expect("alloc");
    b.upload(&to_bytes(v)).expect("upload");
    b
}

fn download(b: &DeviceBuffer, n: usize) -> Vec<u16> {
    let mut out = vec![0u8; n * 2];
    b.download(&mut out).expect("download");
    out.chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
        .collect()
}

/// A grouped problem on the host: the groups' A rows back to back in one
/// [rows, lda] buffer, every group's B at rows g·k of one [G·k, ldb]
/// buffer, C rows back to back in one [rows, ldc] buffer.
struct Grouped {
    n: usize,
    k: usize,
    rows: Vec<usize>,
    lda: usize,
    ldb: usize,
    ldc: usize,
    a: Vec<u16>,
    b: Vec<u16>,
}

impl Grouped {
    fn new(n: usize, k: usize, rows: &[usize], pad: (usize, usize, usize), seed: u64) -> Self {
        let (lda, ldb, ldc) = (k + pad.0, n + pad.1, n + pad.2);
        let total: usize = rows.iter().sum();
        Grouped {
            n,
            k,
            rows: rows.to_vec(),
            lda,
            ldb,
            ldc,
            a: rand(total * lda, seed),
            b: rand(rows.len() * k * ldb, seed + 7),
        }
    }

    fn total(&self) -> usize {
        self.rows.iter().sum()
    }

    /// f32 reference of every group's A·B: [rows, n].
    fn reference(&self) -> Vec<f32> {
        let (n, k) = (self.n, self.k);
        let mut out = vec![0f32; self.total() * n];
        let mut at = 0;
        for (g, &m) in self.rows.iter().enumerate() {
            for i in at..at + m {
                let row = &mut out[i * n..(i + 1) * n];
                for p in 0..k {
                    let av = b2f(self.a[i * self.lda + p]);
                    let b0 = (g * k + p) * self.ldb;
                    for (o, &bv) in row.iter_mut().zip(&self.b[b0..b0 + n]) {
                        *o += av * b2f(bv);
                    }
                }
            }
            at += m;
        }
        out
    }

    /// The launch arguments over device copies at `a`, `b`, `c`.
    fn args(&self, a: &DeviceBuffer, b: &DeviceBuffer, c: &DeviceBuffer) -> GroupedArgs {
        let mut groups = vec![];
        let mut at = 0;
        for (g, &m) in self.rows.iter().enumerate() {
            groups.push(Group {
                m,
                a: TypedPtr::<Bf16>::new(a.ptr().raw() + (at * self.lda * 2) as u64),
                lda: self.lda,
                b: TypedPtr::new(b.ptr().raw() + (g * self.k * self.ldb * 2) as u64),
                ldb: self.ldb,
                c: TypedPtr::new(c.ptr().raw() + (at * self.ldc * 2) as u64),
                ldc: self.ldc,
            });
            at += m;
        }
        GroupedArgs {
            n: self.n,
            k: self.k,
            groups,
            sm_budget: None,
            tile_n: None,
        }
    }
}

/// Runs `args` once on a fresh stream and waits.
fn run(ctx: &Arc<CudaContext>, g: &HopperGemm, args: &GroupedArgs) {
    let launch = g.prepare_grouped(args).expect("prepare");
    let stream = ctx.new_stream().expect("stream");
    // SAFETY: the args' buffers are alive and sized for the views.
    unsafe { g.launch_grouped(stream.cu_stream(), &launch) }.expect("launch");
    stream.synchronize().expect("sync (kernel fault?)");
}

/// (N, K, rows per group, (lda, ldb, ldc) padding).
type Case = (usize, usize, Vec<usize>, (usize, usize, usize));

#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn grouped_matches_per_group_host_reference() {
    let test = "grouped_matches_per_group_host_reference";
    let guard = gpu(test);
    let (ctx, g) = (&guard.0, &guard.1);
    // (N, K, rows per group, (lda, ldb, ldc) padding).
    let many: Vec<usize> = (0..40).map(|i| (i * 37) % 150).collect();
    let cases: Vec<Case> = vec![
        // Empty groups, rows not multiples of 128, a 1-row group.
        (264, 136, vec![300, 0, 128, 5, 1], (0, 0, 0)),
        // Heavy skew: one group holds almost every row.
        (512, 64, vec![1000, 3, 0, 0, 17, 129], (0, 0, 0)),
        // One group, padded leading dimensions (padding must stay poisoned).
        (1032, 200, vec![257], (8, 16, 24)),
        // 40 groups (several empty), N below one narrow tile.
        (120, 256, many, (0, 0, 0)),
        // Every group empty but one at the end.
        (256, 128, vec![0, 0, 0, 64], (0, 8, 8)),
    ];
    for (i, (n, k, rows, pad)) in cases.into_iter().enumerate() {
        let p = Grouped::new(n, k, &rows, pad, 300 + i as u64);
        let reference = p.reference();
        let total = p.total();
        let (da, db) = (upload(ctx, &p.a), upload(ctx, &p.b));
        for tile in [TileN::N256, TileN::N128] {
            // Budgets: one CTA per SM, and so few that every CTA walks
            // tiles of several groups (the scan over the prefix sums).
            for budget in [None, Some(3), Some(1)] {
                let dc = upload(ctx, &vec![NAN; total * p.ldc]);
                let args = GroupedArgs {
                    tile_n: Some(tile),
                    sm_budget: budget,
                    ..p.args(&da, &db, &dc)
                };
                run(ctx, g, &args);
                let c = download(&dc, total * p.ldc);
                let got: Vec<f32> = (0..total)
                    .flat_map(|r| c[r * p.ldc..r * p.ldc + n].iter().map(|&x| b2f(x)))
                    .collect();
                let err = rel_err(&got, &reference);
                let pad_ok =
                    (0..total).all(|r| c[r * p.ldc + n..(r + 1) * p.ldc].iter().all(|&x| x == NAN));
                eprintln!(
                    "grouped {tile:?} budget {budget:?} N={n} K={k} groups {rows:?}: rel err {err:.2e}, padding untouched {pad_ok}"
                );
                assert!(err < 1e-2, "case {i} {tile:?} {budget:?}: rel err {err}");
                assert!(
                    pad_ok,
                    "case {i} {tile:?} {budget:?}: wrote outside the views"
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn grouped_matches_the_cublaslt_loop_at_moe_size() {
    let test = "grouped_matches_the_cublaslt_loop_at_moe_size";
    let guard = gpu(test);
    let (ctx, g) = (&guard.0, &guard.1);
    // 32 experts, Zipf-like loads (1/rank), every fourth of the tail empty.
    let (n, k) = (768, 1024);
    let rows: Vec<usize> = (0..32)
        .map(|e| {
            if e > 16 && e % 4 == 0 {
                0
            } else {
                8192 / (e + 1)
            }
        })
        .collect();
    let p = Grouped::new(n, k, &rows, (0, 0, 0), 77);
    let total = p.total();
    let (da, db) = (upload(ctx, &p.a), upload(ctx, &p.b));
    let dc = upload(ctx, &vec![NAN; total * n]);
    let dr = upload(ctx, &vec![NAN; total * n]);
    let args = p.args(&da, &db, &dc);
    run(ctx, g, &args);
    // The loop of cuBLASLt calls into dr.
    let mut gemms = Gemms::new().expect("cuBLASLt");
    let ws = DeviceBuffer::alloc(ctx, WORKSPACE_BYTES).expect("workspace");
    let stream = ctx.new_stream().expect("stream");
    for grp in &args.groups {
        let key = GemmKey {
            m: grp.m,
            n,
            k,
            lda: k,
            ldb: n,
            ldc: n,
            sm_target: None,
            b_transposed: false,
        };
        let c = grp.c.addr() - dc.ptr().raw() + dr.ptr().raw();
        // SAFETY: the views lie inside the live buffers; one stream.
        unsafe {
            gemms.gemm(
                key,
                ficco_cuda::mem::DevicePtr(grp.a.addr()),
                ficco_cuda::mem::DevicePtr(grp.b.addr()),
                ficco_cuda::mem::DevicePtr(c),
                false,
                ws.ptr(),
                stream.cu_stream(),
            )
        }
        .expect("cuBLASLt");
    }
    stream.synchronize().expect("sync");
    let to_f = |v: Vec<u16>| -> Vec<f32> { v.into_iter().map(b2f).collect() };
    let got = to_f(download(&dc, total * n));
    let want = to_f(download(&dr, total * n));
    let err = rel_err(&got, &want);
    eprintln!(
        "grouped vs cuBLASLt loop: {} experts ({} empty), {total} rows, N={n} K={k}, tile {:?}: rel err {err:.2e}",
        rows.len(),
        rows.iter().filter(|&&m| m == 0).count(),
        g.grouped_shape(&args).expect("shape").tile_n
    );
    assert!(err < 1e-2, "rel err {err}");
}

/// A one-rank plan of one grouped GEMM task over x [rows, k], w [E·k, n],
/// y [rows, n]; empty experts are left out, as the lowering does.
fn grouped_plan(rows: &[usize], n: usize, k: usize) -> Plan {
    let total: usize = rows.iter().sum();
    let buf = |name: &str, role, rows, cols| Buffer {
        name: name.into(),
        role,
        rows,
        cols,
        peer_visible: false,
    };
    let mut groups = vec![];
    let mut at = 0;
    for (e, &m) in rows.iter().enumerate() {
        if m > 0 {
            groups.push(GemmGroup {
                a: View::whole(0, total, k).rows(at, m),
                b: View::whole(1, rows.len() * k, n).rows(e * k, k),
                c: View::whole(2, total, n).rows(at, m),
            });
        }
        at += m;
    }
    Plan {
        problem: Problem {
            op: Op::A2aGemm,
            m: total,
            k,
            n,
            gpus: 1,
            side: None,
            moe: None,
        },
        name: "grouped".into(),
        schedule: None,
        resources: Default::default(),
        ranks: vec![RankPlan {
            buffers: vec![
                buf("x", BufferRole::InputA, total, k),
                buf("w", BufferRole::InputB, rows.len() * k, n),
                buf("y", BufferRole::Output, total, n),
            ],
            streams: vec![StreamSpec {
                name: "compute".into(),
                role: StreamRole::Compute,
                priority: Priority::Normal,
            }],
            tasks: vec![Task {
                label: "grouped-gemm".into(),
                stream: 0,
                kind: TaskKind::GroupedGemm {
                    groups,
                    sm_target: None,
                },
                deps: vec![],
            }],
        }],
    }
}

/// (rows per expert, N, K) of the executor tests: the grouped kernel's
/// shapes with 5 and 20 non-empty experts (below and above the `auto`
/// threshold), and N = 100 (not a multiple of 8), which stays on the loop.
fn executor_cases() -> Vec<(Vec<usize>, usize, usize)> {
    let many: Vec<usize> = (0..22)
        .map(|e| if e % 11 == 3 { 0 } else { 17 * e + 9 })
        .collect();
    vec![
        (vec![300, 0, 5, 129, 1000, 0, 64], 384, 256),
        (many, 256, 128),
        (vec![70, 0, 200], 100, 64),
    ]
}

#[test]
#[ignore = "needs a GPU (bench/gpu-tests.sh runs it: --include-ignored)"]
fn executor_routes_grouped_gemm_to_the_grouped_kernel_or_the_loop() {
    let test = "executor_routes_grouped_gemm_to_the_grouped_kernel_or_the_loop";
    let mut be = match GpuBackend::open(1) {
        Ok(b) => b,
        Err(e @ (CudaError::LibraryMissing { .. } | CudaError::NoGpu(_))) => {
            no_gpu(test, &e.to_string())
        }
        Err(CudaError::NotEnoughGpus { .. }) => no_gpu(test, "no GPU found"),
        Err(e) => panic!("{test}: open failed on a GPU machine: {e}"),
    };
    for (rows, n, k) in executor_cases() {
        let plan = grouped_plan(&rows, n, k);
        let total: usize = rows.iter().sum();
        let x = rand(total * k, 11);
        let w = rand(rows.len() * k * n, 12);
        let init = vec![vec![Some(x.clone()), Some(w.clone()), None]];
        let host = Grouped {
            n,
            k,
            rows: rows.clone(),
            lda: k,
            ldb: n,
            ldc: n,
            a: x,
            b: w,
        };
        let reference = host.reference();
        let experts = rows.iter().filter(|&&m| m > 0).count();
        for (route, grouped) in [
            ("own", Route::Own),
            ("loop", Route::Loop),
            ("auto", Route::Auto),
        ] {
            be.run_opts.grouped = grouped;
            let before = be.grouped_launches();
            let out = be.run_host(&plan, &init);
            let launched = be.grouped_launches() - before;
            be.run_opts.grouped = Route::default();
            let out = out.expect("run the grouped plan");
            let y: Vec<f32> = out[0][2].iter().map(|&h| b2f(h)).collect();
            let err = rel_err(&y, &reference);
            eprintln!(
                "executor FICCO_GROUPED={route} N={n} K={k} groups {rows:?}: rel err {err:.2e}"
            );
            assert!(err < 1e-2, "{route} N={n}: rel err {err}");
            // The route that ran: the grouped kernel exactly where it
            // supports the shape (N a multiple of 8) and was asked for, by
            // name or (`auto`) by the expert count.
            let asked = match route {
                "own" => true,
                "auto" => experts >= ficco_core::sim::cost::GROUPED_KERNEL_MIN_GROUPS,
                _ => false,
            };
            let want_kernel = asked && n % 8 == 0;
            assert_eq!(
                launched > 0,
                want_kernel,
                "{route} N={n}: {launched} grouped-kernel launches"
            );
        }
    }
}

/// The executor test's plans pass the core's validator (no GPU needed), so
/// on the device only the route can fail.
#[test]
fn executor_test_plans_are_valid() {
    for (rows, n, k) in executor_cases() {
        let plan = grouped_plan(&rows, n, k);
        ficco_core::plan::validate::validate(&plan).expect("valid plan");
        let TaskKind::GroupedGemm { groups, .. } = &plan.ranks[0].tasks[0].kind else {
            panic!("not a grouped GEMM");
        };
        assert_eq!(groups.len(), rows.iter().filter(|&&m| m > 0).count());
    }
}
