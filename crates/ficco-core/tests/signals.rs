//! Device-side signalling in the plan: every schedule of the design space,
//! with its cross-rank dependencies rewritten into Signal/Wait flags
//! (`with_signals`), is a valid plan whose exact interpretation equals the
//! sequential reference, at P = 2, 4 and 8; the validator names waits that are
//! never signalled and other flag errors; the simulator and the trace
//! exporters accept the new kinds.

use ficco_core::plan::interp::{interpret, reference, Inputs};
use ficco_core::plan::lower::lower;
use ficco_core::plan::signal::{cross_rank_edges, with_signals};
use ficco_core::plan::validate::validate;
use ficco_core::plan::{Plan, Task, TaskId, TaskKind};
use ficco_core::problem::workload::{Collective, Op, Problem};
use ficco_core::report::{chrome_trace, stream_names, svg_gantt, TracePanel};
use ficco_core::sim::profile::HwProfile;
use ficco_core::sim::simulate;
use ficco_core::space::{enumerate, Schedule, SpaceOptions};
use proptest::prelude::*;

fn space() -> SpaceOptions {
    SpaceOptions {
        controls: true,
        sm_count: 132,
        nccl_sms: 16,
    }
}

fn count(plan: &Plan, kind: &str) -> usize {
    plan.ranks
        .iter()
        .flat_map(|r| &r.tasks)
        .filter(|t| t.kind.short() == kind)
        .count()
}

/// The plan without task `id`: later indices of its rank shift down, and
/// dependencies on it are dropped.
fn remove_task(plan: &Plan, id: TaskId) -> Plan {
    let mut p = plan.clone();
    p.ranks[id.rank].tasks.remove(id.index);
    for rp in &mut p.ranks {
        for t in &mut rp.tasks {
            t.deps.retain(|d| *d != id);
            for d in &mut t.deps {
                if d.rank == id.rank && d.index > id.index {
                    d.index -= 1;
                }
            }
        }
    }
    p
}

fn signals_of(plan: &Plan) -> Vec<TaskId> {
    let mut out = vec![];
    for (r, rp) in plan.ranks.iter().enumerate() {
        for (i, t) in rp.tasks.iter().enumerate() {
            if matches!(t.kind, TaskKind::Signal { .. }) {
                out.push(TaskId { rank: r, index: i });
            }
        }
    }
    out
}

/// Every schedule of `problem` with signals: valid, exact, one Signal per
/// (producer, consumer rank), no cross-rank dependency left, and removing a
/// Signal (the `pick`-th) is caught as a never-signalled wait. Returns how
/// many schedules ran.
fn check_all(problem: &Problem, seed: u64, pick: usize) -> Result<usize, TestCaseError> {
    let inputs = Inputs::random(problem, seed);
    let want = reference(problem, &inputs);
    let mut ran = 0;
    for s in enumerate(problem.op, space()) {
        if s.misfit(problem).is_some() {
            continue;
        }
        let what = format!("{} {s}", problem.label());
        let plan = lower(problem, &s).map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
        let sig = with_signals(&plan);
        validate(&sig).map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
        let got =
            interpret(&sig, &inputs).map_err(|e| TestCaseError::fail(format!("{what}: {e}")))?;
        prop_assert_eq!(&got, &want, "{}", what);
        prop_assert_eq!(count(&sig, "signal"), cross_rank_edges(&plan), "{}", what);
        prop_assert_eq!(
            sig.signal_words().iter().sum::<usize>(),
            cross_rank_edges(&plan),
            "{}",
            what
        );
        prop_assert_eq!(
            sig.task_count(),
            plan.task_count() + count(&sig, "signal") + count(&sig, "wait"),
            "{}",
            what
        );
        for (r, rp) in sig.ranks.iter().enumerate() {
            for t in &rp.tasks {
                prop_assert!(t.deps.iter().all(|d| d.rank == r), "{} {}", what, t.label);
            }
        }
        let signals = signals_of(&sig);
        if !signals.is_empty() {
            let broken = remove_task(&sig, signals[pick % signals.len()]);
            let err = validate(&broken)
                .err()
                .ok_or_else(|| TestCaseError::fail(format!("{what}: a missing signal validated")))?
                .to_string();
            prop_assert!(err.contains("is never signalled"), "{}: {}", what, err);
        }
        ran += 1;
    }
    Ok(ran)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, .. ProptestConfig::default() })]

    #[test]
    fn every_schedule_with_signals_matches_the_reference(
        op in prop::sample::select(vec![Op::AgGemm, Op::GemmRs, Op::GemmAr]),
        gpus in prop::sample::select(vec![2usize, 4, 8]),
        rows_per_chunk in 1usize..=2,
        chunk_mult in prop::sample::select(vec![1usize, 2, 4, 8]),
        k in 1usize..=4,
        n in 1usize..=4,
        seed in any::<u64>(),
        pick in any::<usize>(),
    ) {
        let m = gpus * chunk_mult * rows_per_chunk;
        let problem = Problem::new(op, m, k, n, gpus).unwrap();
        check_all(&problem, seed, pick)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, .. ProptestConfig::default() })]

    #[test]
    fn every_concurrent_schedule_with_signals_matches_the_reference(
        collective in prop::sample::select(Collective::ALL.to_vec()),
        gpus in prop::sample::select(vec![2usize, 4, 8]),
        gemms in 1usize..=2,
        m in 1usize..=3,
        k in 1usize..=3,
        n in 1usize..=3,
        blocks in 1usize..=2,
        seed in any::<u64>(),
        pick in any::<usize>(),
    ) {
        let bytes = 2 * n * gpus * blocks;
        let problem = Problem::concurrent(gemms, m, k, n, collective, bytes, gpus).unwrap();
        check_all(&problem, seed, pick)?;
    }
}

/// Every schedule but `tile` runs (none misfits) when M divides into the
/// finest chunks, so the whole design space is covered at P = 2, 4 and 8.
#[test]
fn the_whole_space_runs_with_signals_at_2_4_and_8_ranks() {
    for op in [Op::AgGemm, Op::GemmRs, Op::GemmAr] {
        for gpus in [2, 4, 8] {
            // N and K multiples of 8: ficco's own GEMM fits too.
            let problem = Problem::new(op, gpus * 8, 8, 8, gpus).unwrap();
            let ran = check_all(&problem, 11, 5).unwrap();
            // `tile` needs 128-row blocks and has its flags already (tests/tile.rs).
            let tiles = enumerate(op, space())
                .iter()
                .filter(|s| s.granularity == ficco_core::space::Granularity::Tile)
                .count();
            assert_eq!(
                ran + tiles,
                enumerate(op, space()).len(),
                "{}",
                problem.label()
            );
        }
    }
}

#[test]
fn copy_schedules_use_signals_and_nccl_ones_need_none() {
    let problem = Problem::new(Op::GemmRs, 32, 3, 2, 4).unwrap();
    let copy = lower(&problem, &"fine2-copy-ring".parse::<Schedule>().unwrap()).unwrap();
    assert!(count(&with_signals(&copy), "signal") > 0);
    let nccl = lower(&problem, &"fine2-nccl-ring".parse::<Schedule>().unwrap()).unwrap();
    assert_eq!(with_signals(&nccl), nccl);
}

fn signalled(op: Op, name: &str, gpus: usize) -> Plan {
    let problem = Problem::new(op, 8 * gpus, 3, 2, gpus).unwrap();
    with_signals(&lower(&problem, &name.parse::<Schedule>().unwrap()).unwrap())
}

fn first_signal(p: &Plan) -> (TaskId, usize, usize) {
    let id = signals_of(p)[0];
    let TaskKind::Signal { to_rank, flag } = p.task(id).unwrap().kind else {
        unreachable!()
    };
    (id, to_rank, flag)
}

#[test]
fn a_missing_signal_names_rank_task_and_flag() {
    let p = signalled(Op::GemmRs, "shard-copy-ring", 2);
    let (id, to_rank, flag) = first_signal(&p);
    let err = validate(&remove_task(&p, id)).unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "wait on flag {flag} of rank {to_rank} is never signalled"
        )),
        "{err}"
    );
    assert!(err.contains(&format!("rank {to_rank} task ")), "{err}");
}

#[test]
fn a_flag_signalled_twice_is_rejected() {
    let mut p = signalled(Op::GemmRs, "fine2-copy-ring", 2);
    let (id, _, _) = first_signal(&p);
    let dup = p.task(id).unwrap().clone();
    p.ranks[id.rank].tasks.push(dup);
    let err = validate(&p).unwrap_err().to_string();
    assert!(err.contains("signalled twice"), "{err}");
}

#[test]
fn a_signal_nobody_waits_on_is_rejected() {
    let mut p = signalled(Op::GemmRs, "fine2-copy-ring", 2);
    let (id, to_rank, _) = first_signal(&p);
    // One more signal, of a flag that no wait names.
    let flag = p.signal_words()[to_rank];
    let mut extra = p.task(id).unwrap().clone();
    extra.kind = TaskKind::Signal { to_rank, flag };
    p.ranks[id.rank].tasks.push(extra);
    let err = validate(&p).unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "signals flag {flag} of rank {to_rank}, which no task waits on"
        )),
        "{err}"
    );
}

#[test]
fn a_signal_to_a_missing_rank_is_rejected() {
    let mut p = signalled(Op::GemmRs, "fine2-copy-ring", 2);
    let (id, _, flag) = first_signal(&p);
    p.ranks[id.rank].tasks[id.index].kind = TaskKind::Signal { to_rank: 7, flag };
    let err = validate(&p).unwrap_err().to_string();
    assert!(
        err.contains("signals rank 7, which does not exist"),
        "{err}"
    );
}

#[test]
fn a_wait_ahead_of_its_own_signal_is_a_cycle() {
    // Rank 0 waits on a flag and only then, on the same stream, signals it.
    let mut p = signalled(Op::GemmRs, "fine2-copy-ring", 2);
    let flag = p.signal_words()[0];
    for kind in [
        TaskKind::Wait { flag },
        TaskKind::Signal { to_rank: 0, flag },
    ] {
        p.ranks[0].tasks.push(Task {
            label: kind.short().into(),
            stream: 0,
            kind,
            deps: vec![],
        });
    }
    let err = validate(&p).unwrap_err().to_string();
    assert!(err.contains("cycle"), "{err}");
}

#[test]
fn waits_add_no_host_edges() {
    // With signals, no task of a rank depends on another rank: the issue
    // order is per rank, and the validator accepts a wait issued before the
    // peer even issues its signal (the signal is last on its rank here).
    let p = signalled(Op::GemmRs, "fine4-copy-all", 4);
    assert!(count(&p, "wait") > 0);
    validate(&p).unwrap();
    for (r, rp) in p.ranks.iter().enumerate() {
        assert!(rp.tasks.iter().all(|t| t.deps.iter().all(|d| d.rank == r)));
    }
}

#[test]
fn plans_round_trip_through_json_with_signals() {
    let p = signalled(Op::GemmAr, "fine2-copy-ring", 4);
    let back: Plan = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
    assert_eq!(back, p);
    assert!(back.same_work(&p));
    let plain = lower(
        &Problem::new(Op::GemmAr, 32, 3, 2, 4).unwrap(),
        &"fine2-copy-ring".parse::<Schedule>().unwrap(),
    )
    .unwrap();
    assert!(!plain.same_work(&p));
}

fn hw() -> HwProfile {
    HwProfile::builtin("h200-nvlink").unwrap()
}

#[test]
fn the_simulator_runs_every_schedule_with_signals() {
    let hw = hw();
    for op in [Op::AgGemm, Op::GemmRs, Op::GemmAr] {
        let problem = Problem::new(op, 8192, 4096, 4096, 4).unwrap();
        for s in enumerate(op, space()) {
            if s.misfit(&problem).is_some() {
                continue;
            }
            let plain = lower(&problem, &s).unwrap();
            let sig = with_signals(&plain);
            let a = simulate(&plain, &hw).unwrap();
            let b = simulate(&sig, &hw).unwrap();
            assert_eq!(b.spans.len(), sig.task_count());
            // A signal adds a few µs on a path; the time moves little (it
            // may even drop a little: a later start can meet less contention).
            assert!(
                (b.total_ms - a.total_ms).abs() <= 0.1 * a.total_ms + 0.02,
                "{s}: {} vs {}",
                b.total_ms,
                a.total_ms
            );
            for span in &b.spans {
                // A Wait takes at most the flag's wake-up (none when its
                // flag was seen before it started).
                let (lo, hi) = match span.kind.as_str() {
                    "signal" => (hw.nvlink.latency_us / 1000.0, hw.nvlink.latency_us / 1000.0),
                    "wait" => (0.0, hw.nvlink.flag_wait_us.unwrap_or(0.0) / 1000.0),
                    _ => continue,
                };
                let d = span.end_ms - span.start_ms;
                assert!(d >= lo - 1e-9 && d <= hi + 1e-9, "{s} {}", span.label);
            }
        }
    }
}

#[test]
fn a_wait_ends_after_its_signal_in_the_simulation() {
    let p = signalled(Op::GemmAr, "fine2-copy-ring", 4);
    assert!(count(&p, "wait") > 0);
    let tl = simulate(&p, &hw()).unwrap();
    let end = |r: usize, i: usize| {
        tl.spans
            .iter()
            .find(|s| s.rank == r && s.task == i)
            .unwrap()
            .end_ms
    };
    let mut signal_end = std::collections::HashMap::new();
    for (r, rp) in p.ranks.iter().enumerate() {
        for (i, t) in rp.tasks.iter().enumerate() {
            if let TaskKind::Signal { to_rank, flag } = t.kind {
                signal_end.insert((to_rank, flag), end(r, i));
            }
        }
    }
    for (r, rp) in p.ranks.iter().enumerate() {
        for (i, t) in rp.tasks.iter().enumerate() {
            if let TaskKind::Wait { flag } = t.kind {
                assert!(end(r, i) >= signal_end[&(r, flag)]);
            }
        }
    }
}

#[test]
fn traces_label_signals_and_waits() {
    let p = signalled(Op::GemmRs, "fine2-copy-ring", 2);
    let tl = simulate(&p, &hw()).unwrap();
    let names = stream_names(&p);
    let panel = TracePanel {
        title: "signals",
        timeline: &tl,
        stream_names: &names,
    };
    let trace = chrome_trace(&[panel]).to_string();
    assert!(trace.contains("\"cat\":\"signal\""), "{trace}");
    assert!(trace.contains("\"cat\":\"wait\""), "{trace}");
    let svg = svg_gantt(&[panel]);
    assert!(svg.contains(">signal<") || svg.contains("signal"), "{svg}");
    assert!(svg.contains("wait"));
    assert_ne!(
        ficco_core::report::kind_color("signal"),
        ficco_core::report::kind_color("wait")
    );
}
