//! The simulator's tile GEMM against hand-computed cases: one persistent
//! GEMM whose blocks wait for their rows (a copy and its flag), and whose
//! block counters release the copy streams that drain them.

use ficco_core::plan::{
    Buffer, BufferRole, Plan, RankPlan, RankView, StreamRole, StreamSpec, Task, TaskKind, TileGemm,
    View,
};
use ficco_core::problem::workload::{Op, Problem};
use ficco_core::sim::cost;
use ficco_core::sim::profile::HwProfile;
use ficco_core::sim::simulate;
use ficco_core::space::Priority;

/// 128 x 128 tiles only, no split-K, persistent GEMMs, no contention: the
/// arithmetic below is then exact.
fn hw() -> HwProfile {
    let mut hw = HwProfile::builtin("h200-nvlink").unwrap();
    hw.gemm.tile_shapes = vec![[128, 128]];
    hw.gemm.max_split_k = 1;
    hw.gemm.persistent = true;
    hw.gemm.full_grid = false;
    hw.copy_engine.pull_bw_gbs = None;
    hw.copy_engine.pull_latency_us = None;
    // Dependencies seen at once, Waits free, no push fan-out limit.
    hw.nvlink.flag_wait_us = None;
    hw.copy_engine.fanout_gbs = None;
    let c = &mut hw.contention;
    c.gemm_slowdown_nccl = 1.0;
    c.gemm_slowdown_copy = 1.0;
    c.gemm_slowdown_gemm = 1.0;
    c.nccl_slowdown_gemm = 1.0;
    c.copy_slowdown_gemm = 1.0;
    // ficco's kernel as fast as the wave model, no hook costs.
    hw.own_gemm.points.clear();
    hw.own_gemm.tile_slowdown = 1.0;
    hw.own_gemm.tile_acc_slowdown = 1.0;
    hw
}

const K: usize = 8192;
/// 132 tiles of 128 columns: one block of 128 rows is exactly one wave.
const N: usize = 132 * 128;

fn close(a: f64, b: f64, what: &str) {
    assert!(
        (a - b).abs() <= 1e-9 * b.abs().max(1.0),
        "{what}: {a} vs {b}"
    );
}

fn buf(name: &str, rows: usize, cols: usize) -> Buffer {
    Buffer {
        name: name.into(),
        role: BufferRole::Scratch,
        rows,
        cols,
        peer_visible: true,
    }
}

fn stream(name: &str, role: StreamRole) -> StreamSpec {
    StreamSpec {
        name: name.into(),
        role,
        priority: Priority::Normal,
    }
}

fn task(label: &str, stream: usize, kind: TaskKind) -> Task {
    Task {
        label: label.into(),
        stream,
        kind,
        deps: vec![],
    }
}

/// Rank 0 runs `tasks` (streams: 0 compute, 1 comm); rank 1 is idle.
/// Buffers: 0 = A [blocks·128, K], 1 = B [K, N], 2 = C [blocks·128, N], 3 =
/// a copy source/target [4096, K].
fn plan(blocks: usize, tasks: Vec<Task>) -> Plan {
    let m = blocks * 128;
    let rank = |tasks| RankPlan {
        buffers: vec![
            buf("a", m, K),
            buf("b", K, N),
            buf("c", m, N),
            buf("x", 4096, K),
        ],
        streams: vec![
            stream("compute", StreamRole::Compute),
            stream("comm", StreamRole::Comm),
        ],
        tasks,
    };
    Plan {
        problem: Problem::new(Op::AgGemm, 2 * m, K, N, 2).unwrap(),
        name: "hand".into(),
        schedule: None,
        resources: Default::default(),
        ranks: vec![rank(tasks), rank(vec![])],
    }
}

fn tile(blocks: usize, first_block: usize, wait: Option<usize>, signal: Option<usize>) -> TaskKind {
    let m = blocks * 128;
    TaskKind::TileGemm(TileGemm {
        a: View::whole(0, m, K),
        b: View::whole(1, K, N),
        c: View::whole(2, m, N),
        block_rows: 128,
        first_block,
        wait,
        signal,
        dest: vec![],
        dest_add: false,
        sm_target: None,
    })
}

/// A local copy of `rows` rows of x (rank 0 to rank 0).
fn copy(rows: usize) -> TaskKind {
    let v = View::whole(3, rows, K);
    TaskKind::Copy {
        src: RankView { rank: 0, view: v },
        dst: RankView { rank: 0, view: v },
    }
}

struct Times {
    tile_ms: f64,
    launch_ms: f64,
    flag_ms: f64,
}

fn times(hw: &HwProfile, blocks: usize) -> Times {
    let c = cost::gemm_cost(hw, blocks * 128, K, N, hw.sm_count);
    assert_eq!(c.tiles, blocks * 132);
    Times {
        tile_ms: c.effective_wave_ms(),
        launch_ms: c.launch_ms,
        flag_ms: hw.nvlink.latency_us * 1e-3,
    }
}

/// (start, end) of rank 0's task labelled `label`.
fn span(t: &ficco_core::run::timeline::Timeline, label: &str) -> (f64, f64) {
    let s = t
        .spans
        .iter()
        .find(|s| s.rank == 0 && s.label == label)
        .unwrap_or_else(|| panic!("no span {label}"));
    (s.start_ms, s.end_ms)
}

/// Without waits a tile GEMM is a plain persistent GEMM: launch + one tile
/// time per wave.
#[test]
fn ungated_tile_gemm_is_a_plain_gemm() {
    let hw = hw();
    let x = times(&hw, 3);
    let t = simulate(&plan(3, vec![task("g", 0, tile(3, 1, None, None))]), &hw).unwrap();
    close(t.total_ms, x.launch_ms + 3.0 * x.tile_ms, "total");
    close(
        t.total_ms,
        cost::gemm_ms(&hw, 384, K, N, 132),
        "as the cost model",
    );
}

/// The profile's hook cost stretches every tile (the launch stays).
#[test]
fn tile_slowdown_stretches_the_tiles() {
    let mut hw = hw();
    let x = times(&hw, 3);
    hw.own_gemm.tile_slowdown = 1.25;
    let t = simulate(&plan(3, vec![task("g", 0, tile(3, 1, None, None))]), &hw).unwrap();
    close(t.total_ms, x.launch_ms + 3.0 * 1.25 * x.tile_ms, "total");
}

/// Block 0 is ready before the launch (a flag set on the compute stream);
/// block 1's rows arrive with a copy. With a long copy block 1's tiles wait
/// for its flag, then take one tile time; with a short one the GEMM runs
/// straight through (block 0's wave, then block 1's).
#[test]
fn a_block_waits_for_its_rows() {
    let hw = hw();
    let x = times(&hw, 2);
    for rows in [4096usize, 128] {
        let bytes = (rows * K * 2) as f64;
        let copy_ms = hw.copy_engine.latency_us * 1e-3
            + bytes / cost::bytes_per_ms(hw.copy_engine.bw_gbs.min(hw.hbm_gbs / 2.0));
        let p = plan(
            2,
            vec![
                task(
                    "ready0",
                    0,
                    TaskKind::Signal {
                        to_rank: 0,
                        flag: 0,
                    },
                ),
                task("g", 0, tile(2, 0, Some(0), None)),
                task("copy", 1, copy(rows)),
                task(
                    "arrived1",
                    1,
                    TaskKind::Signal {
                        to_rank: 0,
                        flag: 1,
                    },
                ),
            ],
        );
        let t = simulate(&p, &hw).unwrap();
        close(span(&t, "copy").1, copy_ms, "copy");
        let gemm_start = x.flag_ms;
        let block0_done = gemm_start + x.launch_ms + x.tile_ms;
        let arrived = copy_ms + x.flag_ms;
        let want = block0_done.max(arrived) + x.tile_ms;
        close(span(&t, "g").0, gemm_start, "launch");
        close(
            span(&t, "g").1,
            want,
            &format!("gemm end, copy of {rows} rows"),
        );
        if rows == 4096 {
            assert!(arrived > block0_done, "the long copy must gate block 1");
        } else {
            assert!(arrived < block0_done, "the short copy must not");
        }
    }
}

/// A Wait on a block's counter ends when that block is stored, not when the
/// GEMM ends: the GEMM starts at block 1 (first wave), so the copy that
/// drains block 1 starts after one tile time while block 0 still computes.
#[test]
fn a_block_counter_releases_its_drain_early() {
    let hw = hw();
    let x = times(&hw, 2);
    let p = plan(
        2,
        vec![
            task("g", 0, tile(2, 1, None, Some(0))),
            task("drain1", 1, TaskKind::Wait { flag: 1 }),
            task("push1", 1, copy(128)),
            task("drain0", 1, TaskKind::Wait { flag: 0 }),
            task("push0", 1, copy(128)),
        ],
    );
    let t = simulate(&p, &hw).unwrap();
    close(
        span(&t, "push1").0,
        x.launch_ms + x.tile_ms,
        "block 1 drained",
    );
    close(span(&t, "g").1, x.launch_ms + 2.0 * x.tile_ms, "gemm end");
    let copy_ms = hw.copy_engine.latency_us * 1e-3
        + (128 * K * 2) as f64 / cost::bytes_per_ms(hw.copy_engine.bw_gbs.min(hw.hbm_gbs / 2.0));
    close(
        span(&t, "push0").0,
        (x.launch_ms + x.tile_ms + copy_ms).max(x.launch_ms + 2.0 * x.tile_ms),
        "block 0 drained after push 1 and its own block",
    );
}

/// With SMs for both blocks at once (264), block 1's 132 SMs take its
/// tiles at launch and spin on its flag while block 0 computes; they start
/// when the rows arrive, so the GEMM ends one tile time after the arrival.
#[test]
fn spinning_sms_start_when_the_flag_arrives() {
    let mut hw = hw();
    hw.sm_count = 264;
    let p = plan(
        2,
        vec![
            task(
                "ready0",
                0,
                TaskKind::Signal {
                    to_rank: 0,
                    flag: 0,
                },
            ),
            task("g", 0, tile(2, 0, Some(0), None)),
            task("copy", 1, copy(4096)),
            task(
                "arrived1",
                1,
                TaskKind::Signal {
                    to_rank: 0,
                    flag: 1,
                },
            ),
        ],
    );
    let t = simulate(&p, &hw).unwrap();
    let c = cost::gemm_cost(&hw, 256, K, N, 264);
    let copy_ms = hw.copy_engine.latency_us * 1e-3
        + (4096 * K * 2) as f64 / cost::bytes_per_ms(hw.copy_engine.bw_gbs.min(hw.hbm_gbs / 2.0));
    let flag = hw.nvlink.latency_us * 1e-3;
    let want =
        (flag + c.launch_ms + c.effective_wave_ms()).max(copy_ms + flag + c.effective_wave_ms());
    close(span(&t, "g").1, want, "gemm end");
}
