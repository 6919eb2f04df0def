//! The simulator against hand-computed cases on small hand-built plans.

use ficco_core::error::Error;
use ficco_core::plan::{
    Buffer, BufferRole, NcclOp, Plan, RankPlan, RankView, StreamRole, StreamSpec, Task, TaskId,
    TaskKind, View,
};
use ficco_core::problem::workload::{Collective, Op, Problem};
use ficco_core::sim::cost;
use ficco_core::sim::profile::HwProfile;
use ficco_core::sim::simulate;
use ficco_core::space::{GemmEngine, Priority};

const MB: usize = 1 << 20;

/// The built-in profile with the tile-level GEMM model (blocks end tile by
/// tile, high-priority kernels resident at once) and symmetric copies, which
/// the hand arithmetic below assumes; `persistent_gemm_*` tests the rest.
fn hw() -> HwProfile {
    let mut hw = HwProfile::builtin("h200-nvlink").unwrap();
    hw.gemm.persistent = false;
    hw.gemm.full_grid = false;
    hw.copy_engine.pull_bw_gbs = None;
    hw.copy_engine.pull_latency_us = None;
    hw.contention.gemm_slowdown_gemm = 1.0;
    hw
}

/// The profile without contention multipliers (for exact hand arithmetic).
fn hw_quiet() -> HwProfile {
    let mut hw = hw();
    let c = &mut hw.contention;
    c.gemm_slowdown_nccl = 1.0;
    c.gemm_slowdown_copy = 1.0;
    c.nccl_slowdown_gemm = 1.0;
    c.copy_slowdown_gemm = 1.0;
    hw
}

fn close(a: f64, b: f64, what: &str) {
    assert!(
        (a - b).abs() <= 1e-9 * b.abs().max(1.0),
        "{what}: {a} vs {b}"
    );
}

/// Buffer 0 is a big scratch buffer on every rank; views are rows of it.
struct B {
    ranks: Vec<RankPlan>,
}

const COLS: usize = 8192;

impl B {
    fn new(p: usize) -> Self {
        let rank = RankPlan {
            buffers: vec![Buffer {
                name: "x".into(),
                role: BufferRole::Scratch,
                rows: 1 << 16,
                cols: COLS,
                peer_visible: true,
            }],
            streams: vec![
                StreamSpec {
                    name: "compute".into(),
                    role: StreamRole::Compute,
                    priority: Priority::Normal,
                },
                StreamSpec {
                    name: "comm".into(),
                    role: StreamRole::Comm,
                    priority: Priority::Normal,
                },
            ],
            tasks: vec![],
        };
        B {
            ranks: vec![rank; p],
        }
    }

    fn hi_comm(mut self) -> Self {
        for r in &mut self.ranks {
            r.streams[1].priority = Priority::High;
        }
        self
    }

    fn push(&mut self, rank: usize, stream: usize, kind: TaskKind, deps: &[TaskId]) -> TaskId {
        let tasks = &mut self.ranks[rank].tasks;
        tasks.push(Task {
            label: format!("t{}", tasks.len()),
            stream,
            kind,
            deps: deps.to_vec(),
        });
        TaskId {
            rank,
            index: tasks.len() - 1,
        }
    }

    fn plan(self) -> Plan {
        let p = self.ranks.len();
        Plan {
            problem: Problem::new(Op::AgGemm, 1024 * p, 1024, 1024, p).unwrap(),
            name: "hand".into(),
            schedule: None,
            resources: Default::default(),
            ranks: self.ranks,
        }
    }
}

fn v(row: usize, rows: usize, cols: usize) -> View {
    View {
        buf: 0,
        row,
        col: 0,
        rows,
        cols,
    }
}

fn gemm(m: usize, k: usize, n: usize, sm_target: Option<usize>) -> TaskKind {
    TaskKind::Gemm {
        a: v(0, m, k),
        b: v(0, k, n),
        c: v(0, m, n),
        sm_target,
        accumulate: false,
        occupancy: None,
    }
}

/// A copy of `bytes` (whole rows of COLS bf16) from `src` to `dst`.
fn copy(src: usize, dst: usize, bytes: usize) -> TaskKind {
    let rows = bytes / (COLS * 2);
    TaskKind::Copy {
        src: RankView {
            rank: src,
            view: v(0, rows, COLS),
        },
        dst: RankView {
            rank: dst,
            view: v(0, rows, COLS),
        },
    }
}

fn all_reduce(group: usize, bytes: usize) -> TaskKind {
    let view = v(0, bytes / (COLS * 2), COLS);
    TaskKind::Nccl {
        group,
        op: NcclOp::AllReduce {
            send: view,
            recv: view,
        },
    }
}

#[test]
fn lone_gemm_takes_the_cost_model_time() {
    let hw = hw();
    for (m, k, n, sm) in [
        (8192, 8192, 2560, None),
        (256, 8192, 2560, None),
        (4096, 4096, 4096, Some(100)),
        (1, 1, 1, None),
    ] {
        let mut b = B::new(2);
        b.push(0, 0, gemm(m, k, n, sm), &[]);
        let tl = simulate(&b.plan(), &hw).unwrap();
        let want = cost::gemm_ms(&hw, m, k, n, sm.unwrap_or(hw.sm_count));
        close(tl.total_ms, want, &format!("{m}x{k}x{n}"));
        assert_eq!(tl.spans[0].kind, "gemm");
        close(tl.spans[0].start_ms, 0.0, "start");
    }
}

#[test]
fn lone_copy_is_latency_plus_bytes_over_bandwidth() {
    let hw = hw();
    let mut b = B::new(2);
    b.push(0, 1, copy(1, 0, 256 * MB), &[]); // pull
    let tl = simulate(&b.plan(), &hw).unwrap();
    let want = hw.copy_engine.latency_us * 1e-3 + (256 * MB) as f64 / (390.0 * 1e6);
    close(tl.total_ms, want, "copy");
    close(tl.total_ms, cost::copy_ms(&hw, 256 * MB), "cost model");
    assert!(
        (tl.total_ms - 0.69).abs() < 0.01,
        "a 256 MiB peer copy took 0.69 ms on H200"
    );
}

#[test]
fn two_pushes_into_one_gpu_share_its_ingress() {
    let hw = hw();
    let bytes = 64 * MB;
    let mut b = B::new(3);
    b.push(1, 1, copy(1, 0, bytes), &[]);
    b.push(2, 1, copy(2, 0, bytes), &[]);
    let tl = simulate(&b.plan(), &hw).unwrap();
    let lat = hw.copy_engine.latency_us * 1e-3;
    let shared = lat + bytes as f64 / (hw.nvlink.usable_gbs / 2.0 * 1e6);
    for s in &tl.spans {
        close(s.end_ms, shared, "each copy at half the ingress");
    }
    let alone = cost::copy_ms(&hw, bytes);
    let ratio = (tl.total_ms - lat) / (alone - lat);
    assert!((ratio - 2.0 * 390.0 / 400.0).abs() < 1e-9, "{ratio}");
    // Pushes to two different GPUs do not interfere.
    let mut b = B::new(3);
    b.push(1, 1, copy(1, 0, bytes), &[]);
    b.push(2, 1, copy(2, 1, bytes), &[]);
    close(
        simulate(&b.plan(), &hw).unwrap().total_ms,
        alone,
        "disjoint",
    );
}

#[test]
fn copy_engines_queue_beyond_their_count() {
    let hw = hw();
    let bytes = 8 * MB;
    let mut b = B::new(2);
    // Four copies on four streams of rank 0: three engines, so one waits.
    for s in 0..4 {
        if s >= 2 {
            b.ranks[0].streams.push(StreamSpec {
                name: format!("c{s}"),
                role: StreamRole::Comm,
                priority: Priority::Normal,
            });
        }
        b.push(0, s, copy(0, 0, bytes), &[]);
    }
    let tl = simulate(&b.plan(), &hw).unwrap();
    let starts: Vec<f64> = tl.spans.iter().map(|s| s.start_ms).collect();
    assert_eq!(
        starts.iter().filter(|&&t| t == 0.0).count(),
        3,
        "{starts:?}"
    );
    assert!(starts[3] > 0.0);
}

#[test]
fn two_step_pipeline_overlaps_copy_and_gemm() {
    let hw = hw_quiet();
    let (m, k, n) = (2048, 8192, 4096);
    let bytes = m * k * 2;
    let mut b = B::new(2);
    let c0 = b.push(0, 1, copy(1, 0, bytes), &[]);
    let c1 = b.push(0, 1, copy(1, 0, bytes), &[]);
    b.push(0, 0, gemm(m, k, n, None), &[c0]);
    b.push(0, 0, gemm(m, k, n, None), &[c1]);
    let tl = simulate(&b.plan(), &hw).unwrap();
    let tc = cost::copy_ms(&hw, bytes);
    let tg = cost::gemm_ms(&hw, m, k, n, hw.sm_count);
    let want = (tc + tg).max(2.0 * tc) + tg;
    close(tl.total_ms, want, "pipeline");
    assert!(tl.total_ms < 2.0 * (tc + tg));

    // With contention on, the overlapped part is slower, by at most the factors.
    let hw = self::hw();
    let mut b = B::new(2);
    let c0 = b.push(0, 1, copy(1, 0, bytes), &[]);
    let c1 = b.push(0, 1, copy(1, 0, bytes), &[]);
    b.push(0, 0, gemm(m, k, n, None), &[c0]);
    b.push(0, 0, gemm(m, k, n, None), &[c1]);
    let t = simulate(&b.plan(), &hw).unwrap().total_ms;
    assert!(t > want && t < want * 1.05, "{t} vs {want}");
}

#[test]
fn rendezvous_starts_when_the_late_rank_is_ready() {
    let hw = hw();
    let bytes = 32 * MB;
    let (m, k, n) = (4096, 4096, 4096);
    let mut b = B::new(2);
    b.push(0, 1, all_reduce(7, bytes), &[]);
    let g = b.push(1, 0, gemm(m, k, n, None), &[]);
    b.push(1, 1, all_reduce(7, bytes), &[g]);
    let tl = simulate(&b.plan(), &hw).unwrap();
    let tg = cost::gemm_ms(&hw, m, k, n, hw.sm_count);
    let tar = cost::collective_ms(
        &hw,
        ficco_core::problem::workload::Collective::AllReduce,
        bytes,
        2,
    );
    let early = &tl.spans[0];
    let late = &tl.spans[2];
    close(early.start_ms, 0.0, "early rank resident at once");
    close(late.start_ms, tg, "late rank after its GEMM");
    close(early.end_ms, tg + tar, "ends together");
    close(late.end_ms, tg + tar, "ends together");
}

/// Rank r: a GEMM holding every SM, and on the comm stream a short local copy
/// then an all-reduce that is launched while the GEMM runs.
fn gemm_then_collective(hi: bool, sm_target: Option<usize>) -> (Plan, f64) {
    let (m, k, n) = (8192, 8192, 8192);
    let mut b = B::new(2);
    if hi {
        b = b.hi_comm();
    }
    for r in 0..2 {
        b.push(r, 0, gemm(m, k, n, sm_target), &[]);
        let c = b.push(r, 1, copy(r, r, MB), &[]);
        b.push(r, 1, all_reduce(1, 16 * MB), &[c]);
    }
    // Local copy at copy-engine speed, no contention in `hw_quiet`.
    (b.plan(), cost::copy_ms(&hw_quiet(), MB))
}

#[test]
fn normal_priority_nccl_waits_for_the_gemm_to_dispatch_its_tiles() {
    let hw = hw_quiet();
    let (plan, copy_end) = gemm_then_collective(false, None);
    let tl = simulate(&plan, &hw).unwrap();
    let g = cost::gemm_cost(&hw, 8192, 8192, 8192, hw.sm_count);
    let wave = g.effective_wave_ms();
    let nccl = &tl.spans[2];
    let last = g.tiles - (g.waves - 1) * hw.sm_count;
    // Resident once the GEMM's last wave is dispatched and leaves room.
    let dispatch_done = g.launch_ms + (g.waves - 1) as f64 * wave;
    let want = if hw.sm_count - last >= hw.nccl_sms {
        dispatch_done
    } else {
        dispatch_done + wave
    };
    assert!(copy_end < want);
    close(nccl.start_ms, want, "normal-priority NCCL start");
    // The GEMM alone was not slowed before the NCCL transfer began.
    assert!(
        tl.spans[0].end_ms >= g.total_ms() - 1e-9,
        "{} vs {}",
        tl.spans[0].end_ms,
        g.total_ms()
    );
}

#[test]
fn high_priority_or_an_sm_target_lets_nccl_in_at_once() {
    let hw = hw_quiet();
    let (plan, copy_end) = gemm_then_collective(true, None);
    let tl_hi = simulate(&plan, &hw).unwrap();
    close(tl_hi.spans[2].start_ms, copy_end, "high priority: at once");
    let (plan, _) = gemm_then_collective(false, Some(hw.sm_count - hw.nccl_sms));
    let tl_sm = simulate(&plan, &hw).unwrap();
    close(tl_sm.spans[2].start_ms, copy_end, "SM target leaves room");
    let (plan, _) = gemm_then_collective(false, None);
    let tl_lo = simulate(&plan, &hw).unwrap();
    // The collective finishes much earlier; the GEMM is no faster (here the
    // SMs NCCL borrows are absorbed by the GEMM's partial last wave).
    assert!(tl_hi.spans[2].end_ms < 0.5 * tl_lo.spans[2].end_ms);
    assert!(tl_hi.spans[0].end_ms >= tl_lo.spans[0].end_ms - 1e-12);
    // With a GEMM whose waves are all full, borrowing SMs costs time.
    let mut b = B::new(2).hi_comm();
    // 33 x 32 = 1056 tiles of 128x256 = 8 full waves on 132 SMs.
    for r in 0..2 {
        b.push(r, 0, gemm(128 * 33, 8192, 256 * 32, None), &[]);
        b.push(r, 1, all_reduce(2, 64 * MB), &[]);
    }
    let tl = simulate(&b.plan(), &hw).unwrap();
    let alone = cost::gemm_ms(&hw, 128 * 33, 8192, 256 * 32, hw.sm_count);
    assert!(
        tl.spans[0].end_ms > alone * 1.05,
        "{} vs {alone}",
        tl.spans[0].end_ms
    );
}

#[test]
fn gemm_beside_a_copy_is_slowed_by_the_contention_factor() {
    let hw = hw();
    let (m, k, n) = (1024, 4096, 4096);
    let mut b = B::new(2);
    b.push(0, 1, copy(1, 0, 512 * MB), &[]);
    b.push(0, 0, gemm(m, k, n, None), &[]);
    let tl = simulate(&b.plan(), &hw).unwrap();
    let g = cost::gemm_cost(&hw, m, k, n, hw.sm_count);
    // The copy's latency (6 µs) ends during the launch overhead? No: launch
    // is 2 µs, so the first wave runs 4 µs unslowed.
    let lat = hw.copy_engine.latency_us * 1e-3;
    let work = g.waves as f64 * g.effective_wave_ms();
    let unslowed = lat - g.launch_ms;
    let want = lat + (work - unslowed) * hw.contention.gemm_slowdown_copy;
    close(tl.spans[1].end_ms, want, "slowed GEMM");
    assert!(tl.spans[0].end_ms > cost::copy_ms(&hw, 512 * MB));
}

#[test]
fn deadlocks_are_errors_naming_a_task() {
    let hw = hw();
    // A dependency cycle across streams.
    let mut b = B::new(2);
    b.push(
        0,
        0,
        gemm(128, 128, 128, None),
        &[TaskId { rank: 0, index: 1 }],
    );
    b.push(0, 1, copy(1, 0, MB), &[TaskId { rank: 0, index: 0 }]);
    let e = simulate(&b.plan(), &hw).unwrap_err();
    assert!(matches!(e, Error::InvalidPlan(_)), "{e}");
    assert!(
        e.to_string().contains("deadlock") && e.to_string().contains("'t0'"),
        "{e}"
    );
    // A rendezvous that rank 1 only reaches after rank 0's part of it is done.
    let mut b = B::new(2);
    let a0 = b.push(0, 1, all_reduce(3, MB), &[]);
    b.push(1, 1, all_reduce(3, MB), &[a0]);
    let e = simulate(&b.plan(), &hw).unwrap_err().to_string();
    assert!(e.contains("rendezvous never completes"), "{e}");
    // A dependency on a task that does not exist.
    let mut b = B::new(2);
    b.push(
        0,
        0,
        gemm(128, 128, 128, None),
        &[TaskId { rank: 5, index: 0 }],
    );
    let e = simulate(&b.plan(), &hw).unwrap_err().to_string();
    assert!(e.contains("does not exist"), "{e}");
}

#[test]
fn persistent_gemm_keeps_its_sms_even_from_high_priority_kernels() {
    let mut hw = hw_quiet();
    hw.gemm.persistent = true;
    // Exactly two full waves of 128x128 tiles on every SM: no tail.
    hw.gemm.tile_shapes = vec![[128, 128]];
    let (m, k, n) = (128 * 12, 8192, 128 * 22);
    let g = cost::gemm_cost(&hw, m, k, n, hw.sm_count);
    assert_eq!((g.tiles, g.waves), (2 * hw.sm_count, 2));
    let mut b = B::new(2).hi_comm();
    for r in 0..2 {
        b.push(r, 0, gemm(m, k, n, None), &[]);
        // Launched while the GEMM runs (after a short local copy).
        let c = b.push(r, 1, copy(r, r, MB), &[]);
        b.push(r, 1, all_reduce(1, 16 * MB), &[c]);
    }
    let plan = b.plan();
    let tl = simulate(&plan, &hw).unwrap();
    // The all-reduce is resident only once the GEMM's blocks are done.
    close(
        tl.spans[2].start_ms,
        g.total_ms(),
        "resident after the GEMM",
    );
    close(tl.spans[0].end_ms, g.total_ms(), "GEMM not slowed");
    // Tile-level blocks let it in at once.
    hw.gemm.persistent = false;
    let tl = simulate(&plan, &hw).unwrap();
    assert!(tl.spans[2].start_ms < 0.5 * g.total_ms());
}

/// ficco's own GEMM (`-own`, `-smN`, `-occS`): the wave model with every
/// tile `cuBLASLt TFLOP/s / ficco TFLOP/s` of the measured shape as long,
/// on a persistent grid of at most the SM budget. By hand: 4096³ in 128x128
/// tiles is 32 x 32 = 1024 tiles; on 132 SMs 100 CTAs run 8 tiles and 32
/// run 7, so the GEMM takes launch + 8 tile times; on a budget of 66 SMs,
/// 1024 = 66 x 15 + 34: launch + 16 tile times.
#[test]
fn own_gemm_runs_the_measured_ratio_on_its_sm_budget() {
    let mut hw = hw_quiet();
    hw.gemm.tile_shapes = vec![[128, 128]];
    hw.gemm.max_split_k = 1;
    // ficco at 500 TFLOP/s where cuBLASLt ran 600: 1.2x the time.
    hw.own_gemm.points = vec![[4096.0, 4096.0, 4096.0, 500.0, 600.0]];
    hw.own_gemm.stage_slowdown = vec![[2.0, 1.5]];
    let per_sm_flops_per_ms = hw.gemm.sustained_tflops * 1e9 / hw.sm_count as f64;
    let tile = 2.0 * 128.0 * 128.0 * (4096.0 + hw.gemm.k_overhead) / per_sm_flops_per_ms;
    let launch = (hw.launch_us + hw.gemm.fixed_us) * 1e-3;
    let run = |engine: GemmEngine, sm: Option<usize>, stages: Option<usize>| {
        let mut b = B::new(2);
        let mut kind = gemm(4096, 4096, 4096, sm);
        if let TaskKind::Gemm { occupancy, .. } = &mut kind {
            *occupancy = stages;
        }
        b.push(0, 0, kind, &[]);
        let mut plan = b.plan();
        plan.resources.gemm = engine;
        simulate(&plan, &hw).unwrap().total_ms
    };
    close(
        run(GemmEngine::Cublas, None, None),
        launch + 8.0 * tile,
        "cuBLASLt",
    );
    close(
        run(GemmEngine::Own, None, None),
        launch + 8.0 * tile * 1.2,
        "own",
    );
    close(
        run(GemmEngine::Own, Some(66), None),
        launch + 16.0 * tile * 1.2,
        "own, 66 SMs",
    );
    close(
        run(GemmEngine::Own, None, Some(2)),
        launch + 8.0 * tile * 1.2 * 1.5,
        "own, 2 stages",
    );
    // The same as the cost model alone.
    close(
        run(GemmEngine::Own, Some(66), None),
        ficco_core::sim::own::gemm_ms(&hw, 4096, 4096, 4096, 66, None),
        "own::gemm_ms",
    );
}

/// A lone all-reduce of 64 MiB on 4 GPUs under `resources`.
fn lone_all_reduce(hw: &HwProfile, green_sms: Option<usize>, nccl_ctas: Option<usize>) -> f64 {
    let mut b = B::new(4);
    for r in 0..4 {
        b.push(r, 1, all_reduce(0, 64 * MB), &[]);
    }
    let mut plan = b.plan();
    plan.resources.green_sms = green_sms;
    plan.resources.nccl_ctas = nccl_ctas;
    simulate(&plan, hw).unwrap().total_ms
}

#[test]
fn a_collective_whose_ctas_outnumber_its_green_partition_runs_in_rounds() {
    let hw = hw_quiet();
    assert_eq!(hw.nccl.channels, Some(24));
    let free = lone_all_reduce(&hw, None, None);
    // 132 - 112 = 20 SMs for 24 CTAs: two rounds, half the bandwidth.
    let gc112 = lone_all_reduce(&hw, Some(112), None);
    // 132 - 100 = 32 SMs hold all 24 at once: as without the split.
    let gc100 = lone_all_reduce(&hw, Some(100), None);
    // 8 CTAs fit the 20 SMs: only the CTA limit's own factor (8 of 16).
    let gc112_cta8 = lone_all_reduce(&hw, Some(112), Some(8));
    let cta8 = lone_all_reduce(&hw, None, Some(8));
    let (l, bw) = cost::collective_protocol(&hw, Collective::AllReduce, 64 * MB, 4);
    let bytes = 2.0 * (64 * MB) as f64 * 3.0 / 4.0;
    close(free, l + bytes / bw, "free");
    close(gc112, l + 2.0 * bytes / bw, "gc112");
    close(gc100, free, "gc100");
    close(gc112_cta8, cta8, "gc112-cta8");
    close(cta8, l + 2.0 * bytes / bw, "cta8");
    // Without the profile's channel count the split is not modelled.
    let mut unknown = hw.clone();
    unknown.nccl.channels = None;
    close(
        lone_all_reduce(&unknown, Some(112), None),
        free,
        "no channels",
    );
}
