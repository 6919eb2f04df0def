//! GPU integration tests on 2 GPUs with CUDA, cuBLASLt, NCCL and NVRTC:
//! each such test ends in `_2gpus` and is `#[ignore]`d, so `cargo test`
//! without GPUs lists it as ignored; where it runs without 2 usable GPUs it
//! fails (see `ficco_testkit` for the policy). Run on the device with
//! `--include-ignored --test-threads=1 --nocapture` (`bench/gpu-tests.sh`).
//!
//! The hand-built plans are built by functions of their own, so that a CPU
//! test (`hand_built_plans_are_valid`) checks each against the validator
//! the executor runs first: these tests need 2 GPUs, and plans the
//! validator had come to refuse went unnoticed until they ran on 4.
#![allow(clippy::needless_range_loop)]

use common::{b2f, f2b, gate, gpu_required, rand, rel_err, GpuAvailability};
use ficco_core::plan::interp::{interpret, reference, Inputs};
use ficco_core::plan::lower::{comm_only, gemm_only, lower};
use ficco_core::plan::validate::validate;
use ficco_core::plan::{
    Buffer, BufferRole, NcclOp, Plan, RankPlan, RankView, StreamRole, StreamSpec, Task, TaskId,
    TaskKind, View,
};
use ficco_core::problem::workload::{Collective, Op, Problem};
use ficco_core::run::Backend;
use ficco_core::space::{enumerate, Priority, Schedule, SpaceOptions};
use ficco_cuda::{CudaError, GpuBackend};
use ficco_testkit as common;
use std::sync::{Mutex, MutexGuard, OnceLock};

const GPUS: usize = 2;

/// Initial contents per rank per buffer (`None`: poisoned with NaN).
type Init = Vec<Vec<Option<Vec<u16>>>>;

/// Why the shared backend is not there.
enum Missing {
    /// No usable GPU at all.
    NoGpu(String),
    /// Fewer GPUs than [`GPUS`].
    TooFew(usize),
}

/// One backend for the whole test binary (NCCL init takes ~0.5 s); fails
/// `test` where there are not [`GPUS`] usable GPUs.
fn gpu(test: &str) -> MutexGuard<'static, Result<GpuBackend, Missing>> {
    static B: OnceLock<Mutex<Result<GpuBackend, Missing>>> = OnceLock::new();
    let m = B.get_or_init(|| {
        Mutex::new(match GpuBackend::open(GPUS) {
            Ok(b) => {
                eprintln!("{}", b.info());
                Ok(b)
            }
            Err(CudaError::NotEnoughGpus { found, .. }) if found > 0 => Err(Missing::TooFew(found)),
            Err(
                e @ (CudaError::LibraryMissing { .. }
                | CudaError::LibraryUnusable { .. }
                | CudaError::NoGpu(_)
                | CudaError::DriverInit { .. }),
            ) => Err(Missing::NoGpu(e.to_string())),
            Err(CudaError::NotEnoughGpus { .. }) => Err(Missing::NoGpu("no GPU found".into())),
            Err(e) => panic!("GpuBackend::open failed on a GPU machine: {e}"),
        })
    });
    let g = m.lock().unwrap_or_else(|p| p.into_inner());
    let found = match &*g {
        Ok(_) => GpuAvailability::Found(GPUS),
        Err(Missing::TooFew(n)) => GpuAvailability::Found(*n),
        Err(Missing::NoGpu(e)) => GpuAvailability::Unusable(e.clone()),
    };
    gate(test, GPUS, found);
    g
}

/// The backend, after [`gpu`] (which fails the test where it is not open).
fn backend<'a>(g: &'a mut MutexGuard<'static, Result<GpuBackend, Missing>>) -> &'a mut GpuBackend {
    match &mut **g {
        Ok(b) => b,
        Err(_) => unreachable!("gpu() returned the guard only for an open backend"),
    }
}

fn buf(name: &str, role: BufferRole, rows: usize, cols: usize) -> Buffer {
    Buffer {
        name: name.into(),
        role,
        rows,
        cols,
        peer_visible: true,
    }
}

fn streams() -> Vec<StreamSpec> {
    vec![
        StreamSpec {
            name: "compute".into(),
            role: StreamRole::Compute,
            priority: Priority::Normal,
        },
        StreamSpec {
            name: "comm".into(),
            role: StreamRole::Comm,
            priority: Priority::High,
        },
    ]
}

fn task(label: &str, stream: usize, kind: TaskKind, deps: Vec<TaskId>) -> Task {
    Task {
        label: label.into(),
        stream,
        kind,
        deps,
    }
}

fn plan(op: Op, m: usize, k: usize, n: usize, ranks: Vec<RankPlan>) -> Plan {
    Plan {
        problem: Problem {
            op,
            m,
            k,
            n,
            gpus: GPUS,
            side: None,
            moe: None,
        },
        name: "hand".into(),
        schedule: None,
        resources: Default::default(),
        ranks,
    }
}

/// Host row-major GEMM of bf16 inputs in f32.
fn host_gemm(
    a: &[u16],
    b: &[u16],
    m: usize,
    k: usize,
    n: usize,
    lda: usize,
    ldb: usize,
) -> Vec<f32> {
    let mut c = vec![0f32; m * n];
    for i in 0..m {
        for p in 0..k {
            let x = b2f(a[i * lda + p]);
            for j in 0..n {
                c[i * n + j] += x * b2f(b[p * ldb + j]);
            }
        }
    }
    c
}

/// (m, k, n) of the strided GEMM; A is columns `STRIDED_A.1..` of a buffer
/// `STRIDED_A.0` columns wide (lda 100, column offset 8).
const STRIDED: (usize, usize, usize) = (96, 72, 80);
const STRIDED_A: (usize, usize) = (100, 8);

/// Per rank one GEMM whose A is a view of the middle columns of a wider
/// buffer; rank 1's GEMM has an SM target.
fn strided_gemm_plan() -> (Plan, Init) {
    let (m, k, n) = STRIDED;
    let (acols, aoff) = STRIDED_A;
    let mut ranks = vec![];
    let mut init = vec![];
    for r in 0..GPUS {
        let a = rand(m * acols, 1 + r as u64);
        let b = rand(k * n, 10 + r as u64);
        ranks.push(RankPlan {
            buffers: vec![
                buf("a", BufferRole::InputA, m, acols),
                buf("b", BufferRole::InputB, k, n),
                buf("c", BufferRole::Output, m, n),
            ],
            streams: streams(),
            tasks: vec![task(
                "gemm",
                0,
                TaskKind::Gemm {
                    a: View {
                        buf: 0,
                        row: 0,
                        col: aoff,
                        rows: m,
                        cols: k,
                    },
                    b: View::whole(1, k, n),
                    c: View::whole(2, m, n),
                    sm_target: if r == 1 { Some(66) } else { None },
                    accumulate: false,
                    occupancy: None,
                },
                vec![],
            )],
        });
        init.push(vec![Some(a), Some(b), None]);
    }
    (plan(Op::GemmAr, m, k, n, ranks), init)
}

#[test]
#[ignore = "needs 2 GPUs (bench/gpu-tests.sh runs it where there are: --include-ignored)"]
fn gemm_matches_host_reference_including_strided_views_2gpus() {
    let mut g = gpu("gemm_matches_host_reference_including_strided_views_2gpus");
    let be = backend(&mut g);
    let (m, k, n) = STRIDED;
    let (acols, aoff) = STRIDED_A;
    let (p, init) = strided_gemm_plan();
    let out = be.run_host(&p, &init).expect("run");
    for r in 0..GPUS {
        let a = init[r][0].as_ref().expect("a");
        let b = init[r][1].as_ref().expect("b");
        let reference = host_gemm(&a[aoff..], b, m, k, n, acols, n);
        let got: Vec<f32> = out[r][2].iter().map(|&h| b2f(h)).collect();
        let e = rel_err(&got, &reference);
        eprintln!("gemm rank {r}: rel err {e:.2e}");
        assert!(e < 1e-2, "rank {r} rel err {e}");
    }
}

/// Rows and columns of every buffer of [`copy_plan`].
const COPY: (usize, usize) = (64, 128);

/// Buffers per rank: x (input), y (output), z (scratch), w (scratch), b.
/// Rank 0 pulls rank 1's x into y; rank 1 pushes its x[:, 0..64] into rank
/// 0's z[:, 32..96] (strided ends); rank 1 runs a GEMM into w, which rank 0
/// then pulls (a cross-rank dependency). Rank 1 pulls rank 0's x into its
/// own y, so that every rank's output is written (the validator refuses a
/// plan whose output is not fully written).
fn copy_plan() -> (Plan, Init) {
    let (rows, cols) = COPY;
    let whole = |rank, buf| RankView {
        rank,
        view: View::whole(buf, rows, cols),
    };
    let mut ranks = vec![];
    let mut init = vec![];
    for r in 0..GPUS {
        let x = rand(rows * cols, 100 + r as u64);
        let copy = |src, dst| TaskKind::Copy { src, dst };
        let tasks = if r == 0 {
            vec![
                task("pull x", 1, copy(whole(1, 0), whole(0, 1)), vec![]),
                task(
                    "pull w",
                    1,
                    copy(whole(1, 3), whole(0, 3)),
                    vec![TaskId { rank: 1, index: 0 }],
                ),
            ]
        } else {
            let x_cols = |rank, buf, col| RankView {
                rank,
                view: View {
                    buf,
                    row: 0,
                    col,
                    rows,
                    cols: 64,
                },
            };
            vec![
                task(
                    "gemm w",
                    0,
                    TaskKind::Gemm {
                        a: View::whole(0, rows, cols),
                        b: View::whole(4, cols, cols),
                        c: View::whole(3, rows, cols),
                        sm_target: None,
                        accumulate: false,
                        occupancy: None,
                    },
                    vec![],
                ),
                task(
                    "push x strided",
                    1,
                    copy(x_cols(1, 0, 0), x_cols(0, 2, 32)),
                    vec![],
                ),
                task("pull x", 1, copy(whole(0, 0), whole(1, 1)), vec![]),
            ]
        };
        ranks.push(RankPlan {
            buffers: vec![
                buf("x", BufferRole::InputA, rows, cols),
                buf("y", BufferRole::Output, rows, cols),
                buf("z", BufferRole::Scratch, rows, cols),
                buf("w", BufferRole::Scratch, rows, cols),
                buf("b", BufferRole::InputB, cols, cols),
            ],
            streams: streams(),
            tasks,
        });
        let bmat = rand(cols * cols, 200 + r as u64);
        init.push(vec![
            Some(x),
            None,
            Some(vec![0; rows * cols]),
            None,
            Some(bmat),
        ]);
    }
    (plan(Op::AgGemm, rows * GPUS, cols, cols, ranks), init)
}

#[test]
#[ignore = "needs 2 GPUs (bench/gpu-tests.sh runs it where there are: --include-ignored)"]
fn copy_pull_push_and_cross_rank_dependency_2gpus() {
    let mut g = gpu("copy_pull_push_and_cross_rank_dependency_2gpus");
    let be = backend(&mut g);
    let (rows, cols) = COPY;
    let (p, init) = copy_plan();
    let out = be.run_host(&p, &init).expect("run");
    let x0 = init[0][0].as_ref().expect("x0");
    let x1 = init[1][0].as_ref().expect("x1");
    assert_eq!(&out[0][1], x1, "rank 0's pulled buffer differs");
    assert_eq!(&out[1][1], x0, "rank 1's pulled buffer differs");
    for i in 0..rows {
        for j in 0..cols {
            let want = if (32..96).contains(&j) {
                x1[i * cols + j - 32]
            } else {
                0
            };
            assert_eq!(out[0][2][i * cols + j], want, "strided push at {i},{j}");
        }
    }
    assert_eq!(
        out[0][3], out[1][3],
        "pulled GEMM result differs (cross-rank dependency)"
    );
    assert!(out[1][3].iter().all(|&h| !b2f(h).is_nan()));
}

fn nccl_plan(op: NcclOp, send_rows: usize, recv_rows: usize, cols: usize) -> (Plan, Init) {
    let mut ranks = vec![];
    let mut init = vec![];
    for r in 0..GPUS {
        ranks.push(RankPlan {
            buffers: vec![
                buf("send", BufferRole::InputA, send_rows, cols),
                buf("recv", BufferRole::Output, recv_rows, cols),
            ],
            streams: streams(),
            tasks: vec![task(
                "nccl",
                1,
                TaskKind::Nccl {
                    group: 0,
                    op: op.clone(),
                },
                vec![],
            )],
        });
        init.push(vec![Some(rand(send_rows * cols, 300 + r as u64)), None]);
    }
    (
        plan(Op::AgGemm, 2 * send_rows.max(recv_rows), cols, cols, ranks),
        init,
    )
}

/// Rows (per rank) and columns of the NCCL tests.
const NCCL: (usize, usize) = (16, 64);

fn all_gather_plan() -> (Plan, Init) {
    let (rows, cols) = NCCL;
    let op = NcclOp::AllGather {
        send: View::whole(0, rows, cols),
        recv: View::whole(1, rows * GPUS, cols),
    };
    nccl_plan(op, rows, rows * GPUS, cols)
}

fn reduce_scatter_plan() -> (Plan, Init) {
    let (rows, cols) = NCCL;
    let op = NcclOp::ReduceScatter {
        send: View::whole(0, rows * GPUS, cols),
        recv: View::whole(1, rows, cols),
    };
    nccl_plan(op, rows * GPUS, rows, cols)
}

/// An all-reduce in place (send and receive the same memory, as lowered
/// gemm-ar plans run it): a local copy fills the output from the input,
/// then the all-reduce reads and overwrites the output. (It used to run in
/// place on the input, which left the output unwritten and wrote an input:
/// the validator refuses that plan.)
fn all_reduce_in_place_plan() -> (Plan, Init) {
    let (rows, cols) = NCCL;
    let (mut p, init) = nccl_plan(
        NcclOp::AllReduce {
            send: View::whole(1, rows, cols),
            recv: View::whole(1, rows, cols),
        },
        rows,
        rows,
        cols,
    );
    for (r, rp) in p.ranks.iter_mut().enumerate() {
        let at = |buf| RankView {
            rank: r,
            view: View::whole(buf, rows, cols),
        };
        let fill = task(
            "fill",
            1,
            TaskKind::Copy {
                src: at(0),
                dst: at(1),
            },
            vec![],
        );
        rp.tasks.insert(0, fill);
        rp.tasks[1].deps = vec![TaskId { rank: r, index: 0 }];
    }
    (p, init)
}

#[test]
#[ignore = "needs 2 GPUs (bench/gpu-tests.sh runs it where there are: --include-ignored)"]
fn nccl_all_gather_2gpus() {
    let mut g = gpu("nccl_all_gather_2gpus");
    let be = backend(&mut g);
    let (p, init) = all_gather_plan();
    let out = be.run_host(&p, &init).expect("run");
    let want: Vec<u16> = (0..GPUS)
        .flat_map(|r| init[r][0].clone().expect("send"))
        .collect();
    for r in 0..GPUS {
        assert_eq!(out[r][1], want, "rank {r}");
    }
}

#[test]
#[ignore = "needs 2 GPUs (bench/gpu-tests.sh runs it where there are: --include-ignored)"]
fn nccl_reduce_scatter_and_all_reduce_2gpus() {
    let mut g = gpu("nccl_reduce_scatter_and_all_reduce_2gpus");
    let be = backend(&mut g);
    let (rows, cols) = NCCL;
    let (p, init) = reduce_scatter_plan();
    let out = be.run_host(&p, &init).expect("run");
    for r in 0..GPUS {
        let want: Vec<f32> = (0..rows * cols)
            .map(|i| {
                (0..GPUS)
                    .map(|q| b2f(init[q][0].as_ref().expect("s")[r * rows * cols + i]))
                    .sum()
            })
            .collect();
        let got: Vec<f32> = out[r][1].iter().map(|&h| b2f(h)).collect();
        let e = rel_err(&got, &want);
        assert!(e < 1e-2, "reduce-scatter rank {r}: {e}");
    }
    let (p, init) = all_reduce_in_place_plan();
    let out = be.run_host(&p, &init).expect("run");
    let want: Vec<f32> = (0..rows * cols)
        .map(|i| {
            (0..GPUS)
                .map(|q| b2f(init[q][0].as_ref().expect("s")[i]))
                .sum()
        })
        .collect();
    for r in 0..GPUS {
        let got: Vec<f32> = out[r][1].iter().map(|&h| b2f(h)).collect();
        assert!(rel_err(&got, &want) < 1e-2, "all-reduce rank {r}");
        assert_eq!(out[r][1], out[0][1], "all-reduce ranks disagree");
        assert_eq!(out[r][0], init[r][0].clone().expect("s"), "input written");
    }
}

/// Each rank sends its buffer to the next rank and receives from it.
fn send_recv_plan() -> (Plan, Init) {
    let (rows, cols) = (8, 256);
    let mut ranks = vec![];
    let mut init = vec![];
    for r in 0..GPUS {
        let peer = (r + 1) % GPUS;
        ranks.push(RankPlan {
            buffers: vec![
                buf("send", BufferRole::InputA, rows, cols),
                buf("recv", BufferRole::Output, rows, cols),
            ],
            streams: streams(),
            tasks: vec![task(
                "sendrecv",
                1,
                TaskKind::Nccl {
                    group: 0,
                    op: NcclOp::SendRecv {
                        sends: vec![(peer, View::whole(0, rows, cols))],
                        recvs: vec![(peer, View::whole(1, rows, cols))],
                    },
                },
                vec![],
            )],
        });
        init.push(vec![Some(rand(rows * cols, 400 + r as u64)), None]);
    }
    (plan(Op::AgGemm, 2 * rows, cols, cols, ranks), init)
}

#[test]
#[ignore = "needs 2 GPUs (bench/gpu-tests.sh runs it where there are: --include-ignored)"]
fn nccl_grouped_send_recv_2gpus() {
    let mut g = gpu("nccl_grouped_send_recv_2gpus");
    let be = backend(&mut g);
    let (p, init) = send_recv_plan();
    let out = be.run_host(&p, &init).expect("run");
    for r in 0..GPUS {
        let peer = (r + 1) % GPUS;
        assert_eq!(Some(&out[r][1]), init[peer][0].as_ref(), "rank {r}");
    }
}

/// (rows, cols, column offset) of the reduce: a vectorized shape, and a
/// small unaligned one that takes the scalar path.
const REDUCES: [(usize, usize, usize); 2] = [(32, 64, 0), (17, 13, 3)];

/// Per rank one reduce of three strided sources (views at a column offset
/// of buffers 5 columns wider still) into d. The third source is an input
/// too (`InputX`): as scratch memory that no task writes, the validator
/// refuses to let the reduce read it.
fn reduce_plan(rows: usize, cols: usize, col_off: usize) -> (Plan, Init) {
    let bc = cols + col_off + 5;
    let mut ranks = vec![];
    let mut init = vec![];
    for r in 0..GPUS {
        let srcs: Vec<View> = (0..3)
            .map(|j| View {
                buf: j,
                row: 0,
                col: col_off,
                rows,
                cols,
            })
            .collect();
        ranks.push(RankPlan {
            buffers: vec![
                buf("s0", BufferRole::InputA, rows, bc),
                buf("s1", BufferRole::InputB, rows, bc),
                buf("s2", BufferRole::InputX, rows, bc),
                buf("d", BufferRole::Output, rows, cols),
            ],
            streams: streams(),
            tasks: vec![task(
                "reduce",
                0,
                TaskKind::Reduce {
                    srcs,
                    dst: View::whole(3, rows, cols),
                },
                vec![],
            )],
        });
        init.push(
            (0..3)
                .map(|j| Some(rand(rows * bc, 500 + 10 * r as u64 + j)))
                .chain(std::iter::once(None))
                .collect::<Vec<_>>(),
        );
    }
    (plan(Op::GemmRs, 2 * rows, cols, cols, ranks), init)
}

#[test]
#[ignore = "needs 2 GPUs (bench/gpu-tests.sh runs it where there are: --include-ignored)"]
fn reduce_kernel_vector_and_scalar_paths_2gpus() {
    let mut g = gpu("reduce_kernel_vector_and_scalar_paths_2gpus");
    let be = backend(&mut g);
    for (rows, cols, col_off) in REDUCES {
        let bc = cols + col_off + 5;
        let (p, init) = reduce_plan(rows, cols, col_off);
        let out = be.run_host(&p, &init).expect("run");
        for r in 0..GPUS {
            for i in 0..rows {
                for c in 0..cols {
                    let s: f32 = (0..3)
                        .map(|j| b2f(init[r][j].as_ref().expect("src")[i * bc + col_off + c]))
                        .sum();
                    assert_eq!(
                        out[r][3][i * cols + c],
                        f2b(s),
                        "reduce {rows}x{cols} at {i},{c}"
                    );
                }
            }
        }
    }
}

/// Every `stride`-th enumerated schedule (controls included) of small
/// problems, checked against the sequential reference. The whole space (about
/// 1,050 plans at P = 2, 0.5 s each on H100) takes 9 minutes, past
/// `bench/gpu-tests.sh`'s bound per binary: the default stride 8 checks about
/// 130 plans spread over each operator's space; `FICCO_TEST_SPACE_STRIDE=1`
/// checks them all (`ficco soak` runs whole spaces of real shapes).
#[test]
#[ignore = "needs 2 GPUs (bench/gpu-tests.sh runs it where there are: --include-ignored)"]
fn every_enumerated_schedule_is_correct_2gpus() {
    let mut g = gpu("every_enumerated_schedule_is_correct_2gpus");
    let be = backend(&mut g);
    be.config.warmup = 1;
    be.config.iters = 2;
    let opts = SpaceOptions {
        controls: true,
        sm_count: 132,
        nccl_sms: 16,
    };
    let mut failures = vec![];
    let mut problems: Vec<Problem> = Op::ALL
        .into_iter()
        .map(|op| Problem::new(op, 512, 256, 384, GPUS).expect("problem"))
        .collect();
    for c in Collective::ALL {
        let bytes = 2 * 384 * GPUS * 64;
        problems.push(Problem::concurrent(2, 512, 256, 384, c, bytes, GPUS).expect("problem"));
    }
    let stride: usize = std::env::var("FICCO_TEST_SPACE_STRIDE")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(8);
    for problem in problems {
        let op = problem.op;
        let seq = lower(&problem, &Schedule::SEQ).expect("seq");
        eprintln!("preparing {}", problem.label());
        be.prepare(&seq).expect("prepare");
        let mut n = 0;
        for s in enumerate(op, opts).into_iter().step_by(stride) {
            let Ok(p) = lower(&problem, &s) else { continue };
            eprintln!("measuring {op} {}", s.name());
            let m = be.measure(&p, true, s.is_seq()).expect("measure");
            n += 1;
            eprintln!(
                "{} {:<24} correct={} err={:.2e} time={:.3} ms",
                op,
                s.name(),
                m.correct,
                m.max_rel_err.unwrap_or(f64::NAN),
                m.time_ms
            );
            if let Some(t) = &m.timeline {
                assert_eq!(t.spans.len(), p.task_count());
            }
            if !m.correct {
                failures.push(format!("{op} {}", s.name()));
            }
        }
        assert!(n > 1, "{op}: no schedule lowered");
    }
    be.config = Default::default();
    assert!(failures.is_empty(), "wrong schedules: {failures:?}");
}

/// `seq` of ag-gemm without its all-gather: each rank copies its own shard
/// into every slot of the gathered A and multiplies that. A valid plan
/// (every read ordered after its write, the output fully written) that
/// skips the communication, so its output is wrong wherever the shards
/// differ. (A plan that leaves its output unwritten, such as `seq` without
/// its GEMM, the validator refuses before anything runs.)
fn without_the_all_gather(seq: &Plan) -> Plan {
    let mut bad = seq.clone();
    bad.name = "seq without its all-gather".into();
    bad.schedule = None;
    let p = seq.problem.gpus;
    for (r, rp) in bad.ranks.iter_mut().enumerate() {
        let gather = rp.tasks.remove(0);
        let TaskKind::Nccl {
            op: NcclOp::AllGather { send, recv },
            ..
        } = gather.kind
        else {
            panic!("ag-gemm seq starts with its all-gather: {:?}", gather.kind);
        };
        let copies: Vec<Task> = (0..p)
            .map(|q| {
                let slot = View {
                    row: recv.row + q * send.rows,
                    rows: send.rows,
                    ..recv
                };
                task(
                    &format!("own shard to slot {q}"),
                    gather.stream,
                    TaskKind::Copy {
                        src: RankView {
                            rank: r,
                            view: send,
                        },
                        dst: RankView {
                            rank: r,
                            view: slot,
                        },
                    },
                    vec![],
                )
            })
            .collect();
        for t in &mut rp.tasks {
            t.deps = (0..p).map(|i| TaskId { rank: r, index: i }).collect();
        }
        rp.tasks.splice(0..0, copies);
    }
    bad
}

/// The problem of [`a_wrong_plan_is_reported_incorrect_2gpus`].
fn wrong_plan_problem() -> Problem {
    Problem::new(Op::AgGemm, 512, 256, 384, GPUS).expect("problem")
}

/// A plan that skips work must be reported wrong, not timed as if right:
/// [`without_the_all_gather`] runs, and the output check against the
/// sequential reference catches it.
#[test]
#[ignore = "needs 2 GPUs (bench/gpu-tests.sh runs it where there are: --include-ignored)"]
fn a_wrong_plan_is_reported_incorrect_2gpus() {
    let mut g = gpu("a_wrong_plan_is_reported_incorrect_2gpus");
    let be = backend(&mut g);
    be.config.warmup = 1;
    be.config.iters = 1;
    let problem = wrong_plan_problem();
    let seq = lower(&problem, &Schedule::SEQ).expect("seq");
    be.prepare(&seq).expect("prepare");
    let bad = without_the_all_gather(&seq);
    let m = be.measure(&bad, true, false).expect("measure");
    be.config = Default::default();
    assert!(!m.correct, "a plan without its GEMM passed the check");
}

/// Timing probe on a realistic size: GEMM alone, the collective alone, seq and
/// a few overlapped schedules (ag-gemm m=8192 k=8192 n=5120, P=2 anchor).
/// Every overlapped schedule is checked against the sequential reference on
/// fresh random inputs with poisoned outputs (`measure` with `check`), and
/// every time must be a positive, finite number.
#[test]
#[ignore = "needs 2 GPUs (bench/gpu-tests.sh runs it where there are: --include-ignored)"]
fn timing_probe_2gpus() {
    let mut g = gpu("timing_probe_2gpus");
    let be = backend(&mut g);
    let tolerance = be.config.tolerance;
    let sane = |what: &str, ms: f64| {
        assert!(
            ms.is_finite() && ms > 0.0,
            "{what}: time {ms} ms is not a positive number"
        );
    };
    for (op, m, k, n) in [
        (Op::AgGemm, 8192, 8192, 5120),
        (Op::GemmRs, 8192, 4096, 8192),
    ] {
        let problem = Problem::new(op, m, k, n, GPUS).expect("problem");
        let seq = lower(&problem, &Schedule::SEQ).expect("seq");
        be.prepare(&seq).expect("prepare");
        let gm = be
            .measure(&gemm_only(&problem), false, false)
            .expect("gemm");
        let cm = be
            .measure(&comm_only(&problem), false, false)
            .expect("comm");
        eprintln!(
            "PROBE {} gemm-only {:.3} ms  comm-only {:.3} ms",
            problem.label(),
            gm.time_ms,
            cm.time_ms
        );
        sane("gemm-only", gm.time_ms);
        sane("comm-only", cm.time_ms);
        let mut measured = 0;
        for name in [
            "seq",
            "shard-copy-all",
            "fine2-copy-ring",
            "fine4-copy-all-2s",
            "shard-nccl-ring",
            "fine2-nccl-all-hi",
        ] {
            let s: Schedule = name
                .parse()
                .unwrap_or_else(|e| panic!("schedule {name} no longer parses: {e:?}"));
            let p = match lower(&problem, &s) {
                Ok(p) => p,
                Err(e) if name != "seq" => {
                    eprintln!("PROBE {name} does not lower for {}: {e:?}", problem.label());
                    continue;
                }
                Err(e) => panic!("seq does not lower: {e:?}"),
            };
            eprintln!("PROBE measuring {name}");
            let r = be.measure(&p, true, false).expect("measure");
            let err = r
                .max_rel_err
                .expect("a checked measurement reports its error");
            eprintln!(
                "PROBE {} {:<20} {:.3} ms correct={} err={:.1e} launch={:?} us",
                problem.label(),
                name,
                r.time_ms,
                r.correct,
                err,
                r.launch_us
            );
            assert!(
                r.correct,
                "{} {name}: wrong output (rel err {err:.2e})",
                problem.label()
            );
            assert!(
                err.is_finite() && err <= tolerance,
                "{} {name}: rel err {err:.2e} over {tolerance:.0e}",
                problem.label()
            );
            sane(name, r.time_ms);
            if let Some(us) = r.launch_us {
                assert!(us.is_finite() && us >= 0.0, "{name}: launch time {us} us");
            }
            measured += 1;
        }
        assert!(
            measured >= 2,
            "{}: only {measured} schedules measured",
            problem.label()
        );
    }
}

/// Opening the backend gives what the machine allows: without libraries a
/// typed "library missing" error, without a device a typed "no GPU" error,
/// with GPUs success for as many as there are and a typed "not enough GPUs"
/// for more. It runs on every machine (not ignored: the first two are what
/// a machine without a GPU checks); under `FICCO_REQUIRE_GPU=1` (the GPU
/// machine) those two fail the test.
#[test]
fn open_matches_the_environment() {
    let libs = ficco_cuda::Libraries::probe();
    if let Err(missing) = libs.require_all() {
        match GpuBackend::open(1) {
            Err(CudaError::LibraryMissing { .. } | CudaError::LibraryUnusable { .. }) => {}
            Err(e) => panic!("libraries missing ({missing}) but open said: {e}"),
            Ok(_) => panic!("libraries missing ({missing}) but open succeeded"),
        }
        assert!(!gpu_required(), "FICCO_REQUIRE_GPU=1 but {missing}");
        return;
    }
    let found = ficco_cuda::info().gpus.len();
    if found == 0 {
        match GpuBackend::open(1) {
            Err(CudaError::NoGpu(_) | CudaError::DriverInit { .. } | CudaError::Driver { .. }) => {}
            Err(e) => panic!("no GPU listed but open said: {e}"),
            Ok(_) => panic!("no GPU listed but open succeeded"),
        }
        assert!(
            !gpu_required(),
            "FICCO_REQUIRE_GPU=1 but the driver lists no GPU"
        );
        return;
    }
    let b = GpuBackend::open(1).unwrap_or_else(|e| panic!("{found} GPUs but open(1) failed: {e}"));
    assert_eq!(b.gpus(), 1);
    assert_eq!(b.info().gpus.len(), found);
    drop(b);
    match GpuBackend::open(found + 1) {
        Err(CudaError::NotEnoughGpus { wanted, found: f }) => {
            assert_eq!((wanted, f), (found + 1, found))
        }
        Err(e) => panic!("open({}) on {found} GPUs: {e}", found + 1),
        Ok(_) => panic!("open({}) succeeded on {found} GPUs", found + 1),
    }
    match GpuBackend::open(0) {
        Err(CudaError::NotEnoughGpus { .. }) => {}
        other => panic!("open(0): {:?}", other.map(|b| b.gpus())),
    }
}

/// CPU: every hand-built plan of this file passes the validator that the
/// executor runs before anything is issued, and the wrong plan of
/// [`a_wrong_plan_is_reported_incorrect_2gpus`] is valid yet computes
/// something else than the reference (exact interpreter, on a small shape;
/// `seq` itself matches it), so that test checks the output check.
#[test]
fn hand_built_plans_are_valid() {
    let mut plans = vec![
        ("strided gemm", strided_gemm_plan().0),
        ("copies", copy_plan().0),
        ("all-gather", all_gather_plan().0),
        ("reduce-scatter", reduce_scatter_plan().0),
        ("all-reduce in place", all_reduce_in_place_plan().0),
        ("send/recv", send_recv_plan().0),
    ];
    for (rows, cols, col_off) in REDUCES {
        plans.push(("reduce", reduce_plan(rows, cols, col_off).0));
    }
    let seq = lower(&wrong_plan_problem(), &Schedule::SEQ).expect("seq");
    plans.push(("seq without its all-gather", without_the_all_gather(&seq)));
    for (name, p) in &plans {
        validate(p).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let small = Problem::new(Op::AgGemm, 16, 8, 12, GPUS).expect("problem");
    let seq = lower(&small, &Schedule::SEQ).expect("seq");
    let inputs = Inputs::random(&small, 7);
    let want = reference(&small, &inputs);
    assert_eq!(interpret(&seq, &inputs).expect("seq runs"), want);
    let bad = without_the_all_gather(&seq);
    validate(&bad).expect("valid");
    let got = interpret(&bad, &inputs).expect("the wrong plan runs");
    for r in 0..GPUS {
        assert_ne!(
            got[r], want[r],
            "rank {r}: skipping the all-gather went unnoticed"
        );
    }
}
