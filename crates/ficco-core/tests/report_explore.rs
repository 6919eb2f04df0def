//! The explore driver with a fake predictor and mock backends.

#![allow(clippy::field_reassign_with_default)]

use ficco_core::choose::explore::{explore, schedules_for, ExploreOptions, Lowering};
use ficco_core::error::{Error, Result};
use ficco_core::plan::{Buffer, BufferRole, Plan, RankPlan};
use ficco_core::problem::workload::{Op, Problem, Scenario};
use ficco_core::run::timeline::{Span, Timeline};
use ficco_core::run::{Backend, BackendError, Measured};
use ficco_core::space::{Schedule, SpaceOptions};
use std::collections::HashMap;

fn scenario() -> Scenario {
    Scenario {
        name: "tiny".into(),
        problem: Problem::new(Op::AgGemm, 64, 32, 16, 4).unwrap(),
    }
}

/// Predicted time: a fixed table by plan name (unknown names: 1.0 ms).
fn table_predict(times: HashMap<&'static str, f64>) -> impl Fn(&Plan) -> Result<Timeline> {
    move |plan: &Plan| {
        let t = times.get(plan.name.as_str()).copied().unwrap_or(1.0);
        Ok(Timeline {
            name: plan.name.clone(),
            spans: vec![Span {
                rank: 0,
                stream: 0,
                task: 0,
                label: plan.name.clone(),
                kind: "gemm".into(),
                start_ms: 0.0,
                end_ms: t,
            }],
            total_ms: t,
        })
    }
}

/// A deterministic backend that returns the predictor's times, like the
/// simulator does.
struct Predicted<F>(F);

impl<F: Fn(&Plan) -> Result<Timeline>> Backend for Predicted<F> {
    fn name(&self) -> &str {
        "sim"
    }
    fn deterministic(&self) -> bool {
        true
    }
    fn device(&self) -> String {
        "h200-nvlink".into()
    }
    fn prepare(&mut self, _: &Plan) -> Result<(), BackendError> {
        Ok(())
    }
    fn measure(&mut self, plan: &Plan, _: bool, timeline: bool) -> Result<Measured, BackendError> {
        let tl = (self.0)(plan)?;
        Ok(Measured {
            time_ms: tl.total_ms,
            max_rel_err: None,
            correct: true,
            timeline: timeline.then_some(tl),
            launch_us: None,
            range_ms: None,
        })
    }
}

fn sched(name: &str) -> Schedule {
    name.parse().unwrap()
}

#[derive(Default)]
struct Mock {
    prepared: Vec<String>,
    calls: Vec<(String, bool, bool)>,
    times: HashMap<String, f64>,
    wrong: Vec<String>,
    fail: Vec<String>,
}

impl Backend for Mock {
    fn name(&self) -> &str {
        "gpu"
    }
    fn device(&self) -> String {
        "4x Mock GPU".into()
    }
    fn prepare(&mut self, seq: &Plan) -> Result<(), BackendError> {
        self.prepared.push(seq.name.clone());
        Ok(())
    }
    fn measure(
        &mut self,
        plan: &Plan,
        check: bool,
        timeline: bool,
    ) -> Result<Measured, BackendError> {
        self.calls.push((plan.name.clone(), check, timeline));
        if self.fail.contains(&plan.name) {
            return Err("out of memory".into());
        }
        let time_ms = self.times.get(&plan.name).copied().unwrap_or(2.0);
        let wrong = self.wrong.contains(&plan.name);
        Ok(Measured {
            time_ms,
            max_rel_err: check.then_some(if wrong { 0.5 } else { 1e-3 }),
            correct: !wrong,
            timeline: timeline.then(|| Timeline {
                name: format!("measured {}", plan.name),
                spans: vec![],
                total_ms: time_ms,
            }),
            launch_us: Some(12.0),
            range_ms: None,
        })
    }
}

#[test]
fn sim_reports_predictions_best_and_selected() {
    let predict = table_predict(HashMap::from([
        ("seq", 2.0),
        ("gemm-only", 1.2),
        ("comm-only", 0.8),
        ("shard-copy-all", 1.6),
        ("fine2-copy-all", 1.4),
    ]));
    let schedules = [
        Schedule::SEQ,
        sched("shard-copy-all"),
        sched("fine2-copy-all"),
        sched("fine8-copy-all"),  // 64 rows / (4 x 8): fits
        sched("fine32-copy-all"), // does not fit
    ];
    let mut opts = ExploreOptions::default();
    opts.timelines = true;
    let ex = explore(
        &scenario(),
        &schedules,
        &predict,
        &mut Predicted(&predict),
        &opts,
    )
    .unwrap();
    let r = &ex.report;
    assert_eq!(r.backend, "sim");
    assert_eq!(r.hardware, "h200-nvlink");
    assert_eq!(r.reference.sequential_ms, 2.0);
    assert_eq!(r.reference.ideal_ms, 1.2);
    assert_eq!(r.schedules.len(), 5);
    let fine2 = r.row("fine2-copy-all").unwrap();
    assert_eq!(fine2.time_ms, Some(1.4));
    assert_eq!(fine2.predicted_ms, Some(1.4));
    assert!(fine2.max_rel_err.is_none());
    assert!((fine2.speedup.unwrap() - 2.0 / 1.4).abs() < 1e-12);
    assert!((fine2.efficiency.unwrap() - 0.6 / 0.8).abs() < 1e-12);
    let skipped = r.row("fine32-copy-all").unwrap();
    assert!(skipped.skipped.as_ref().unwrap().contains("not divisible"));
    assert!(skipped.time_ms.is_none() && skipped.predicted_ms.is_none());
    // fine8 is predicted at 1.0 ms (the default), so it is both best and selected.
    assert_eq!(r.best.as_deref(), Some("fine8-copy-all"));
    assert_eq!(r.selected.as_deref(), Some("fine8-copy-all"));
    let seq = ex.seq.unwrap();
    assert_eq!(seq.plan.name, "seq");
    assert_eq!(ex.best.unwrap().timeline.total_ms, 1.0);
}

#[test]
fn measurer_is_prepared_once_and_wrong_results_are_never_best() {
    let predict = table_predict(HashMap::from([
        ("seq", 2.0),
        ("gemm-only", 1.2),
        ("comm-only", 0.8),
        ("shard-copy-all", 1.1),
        ("fine2-copy-all", 1.5),
        ("fine4-copy-all", 1.3),
    ]));
    let mut mock = Mock {
        times: HashMap::from([
            ("seq".to_string(), 2.1),
            ("gemm-only".to_string(), 1.3),
            ("comm-only".to_string(), 0.9),
            ("shard-copy-all".to_string(), 1.0),
            ("fine2-copy-all".to_string(), 1.5),
            ("fine4-copy-all".to_string(), 1.4),
        ]),
        wrong: vec!["shard-copy-all".into()],
        fail: vec!["fine4-copy-all".into()],
        ..Default::default()
    };
    let schedules = schedules_for(
        Op::AgGemm,
        SpaceOptions::default(),
        &[
            sched("shard-copy-all"),
            sched("fine2-copy-all"),
            sched("fine4-copy-all"),
        ],
    );
    assert_eq!(schedules[0], Schedule::SEQ);
    let mut opts = ExploreOptions::default();
    opts.timelines = true;
    let ex = explore(&scenario(), &schedules, &predict, &mut mock, &opts).unwrap();
    let r = &ex.report;
    assert_eq!(mock.prepared, vec!["seq".to_string()]);
    // References: seq checked, gemm-only and comm-only unchecked.
    assert!(mock.calls.contains(&("seq".into(), true, true)));
    assert!(mock.calls.contains(&("gemm-only".into(), false, false)));
    assert!(mock.calls.contains(&("comm-only".into(), false, false)));
    assert!(mock.calls.contains(&("fine2-copy-all".into(), true, false)));
    assert_eq!(r.backend, "gpu");
    assert_eq!(r.hardware, "4x Mock GPU");
    assert_eq!(r.reference.sequential_ms, 2.1);
    assert_eq!(r.reference.ideal_ms, 1.3);

    let wrong = r.row("shard-copy-all").unwrap();
    assert!(wrong.wrong);
    assert_eq!(wrong.time_ms, Some(1.0));
    assert_eq!(wrong.max_rel_err, Some(0.5));
    let failed = r.row("fine4-copy-all").unwrap();
    assert!(failed.skipped.as_ref().unwrap().contains("out of memory"));
    // The fastest is wrong: best is the fastest correct one; selection is by prediction.
    assert_eq!(r.best.as_deref(), Some("fine2-copy-all"));
    assert_eq!(r.selected.as_deref(), Some("shard-copy-all"));
    let fine2 = r.row("fine2-copy-all").unwrap();
    assert_eq!((fine2.time_ms, fine2.predicted_ms), (Some(1.5), Some(1.5)));
    assert_eq!(fine2.max_rel_err, Some(1e-3));
    // The best timeline was measured again with a timeline.
    assert!(mock.calls.contains(&("fine2-copy-all".into(), false, true)));
    assert_eq!(ex.best.unwrap().timeline.name, "measured fine2-copy-all");
    assert_eq!(ex.seq.unwrap().timeline.name, "measured seq");

    let json = serde_json::to_value(r).unwrap();
    let rows = json["schedules"].as_array().unwrap();
    assert_eq!(rows[1]["wrong"], true);
    assert!(rows[2].get("wrong").is_none());
}

/// A plan with one empty rank per GPU (valid: nothing to check).
/// A plan with no tasks whose content differs by `name` (one scratch
/// buffer of `name.len()` rows): plans of different names are different.
fn tiny_plan(problem: &Problem, name: &str) -> Plan {
    tiny_plan_rows(problem, name, name.len())
}

fn tiny_plan_rows(problem: &Problem, name: &str, rows: usize) -> Plan {
    Plan {
        problem: *problem,
        name: name.into(),
        schedule: None,
        resources: Default::default(),
        ranks: vec![
            RankPlan {
                buffers: vec![Buffer {
                    name: "scratch".into(),
                    role: BufferRole::Scratch,
                    rows,
                    cols: 1,
                    peer_visible: false,
                }],
                streams: vec![],
                tasks: vec![],
            };
            problem.gpus
        ],
    }
}

#[test]
fn driver_works_with_hand_built_plans() {
    fn lower(p: &Problem, s: &Schedule) -> Result<Plan> {
        match s.name().as_str() {
            "shard-nccl-ring" => Err(Error::InvalidPlan("boom".into())),
            "shard-nccl-all" => Err(Error::DoesNotFit {
                schedule: s.name(),
                reason: "no room".into(),
            }),
            n => Ok(tiny_plan(p, n)),
        }
    }
    let mut opts = ExploreOptions::default();
    opts.lowering = Lowering {
        lower,
        gemm_only: |p| tiny_plan(p, "gemm-only"),
        comm_only: |p| tiny_plan(p, "comm-only"),
    };
    let predict = |plan: &Plan| -> Result<Timeline> {
        if plan.name == "shard-copy-ring" {
            return Err(Error::InvalidPlan("cannot simulate".into()));
        }
        let t = match plan.name.as_str() {
            "seq" => 3.0,
            "gemm-only" => 2.0,
            "comm-only" => 1.0,
            _ => 2.5,
        };
        Ok(Timeline {
            name: plan.name.clone(),
            spans: vec![],
            total_ms: t,
        })
    };
    let schedules: Vec<Schedule> = [
        "seq",
        "shard-nccl-ring",
        "shard-nccl-all",
        "shard-copy-ring",
        "shard-copy-all",
    ]
    .iter()
    .map(|s| sched(s))
    .collect();
    let r = explore(
        &scenario(),
        &schedules,
        &predict,
        &mut Predicted(&predict),
        &opts,
    )
    .unwrap()
    .report;
    let reason = |n: &str| r.row(n).unwrap().skipped.clone().unwrap_or_default();
    assert!(reason("shard-nccl-ring").contains("lowering failed"));
    assert_eq!(reason("shard-nccl-all"), "no room");
    assert!(reason("shard-copy-ring").contains("prediction failed"));
    assert_eq!(r.best.as_deref(), Some("shard-copy-all"));
    assert_eq!(r.row("shard-copy-all").unwrap().efficiency, Some(0.5));
    assert_eq!(r.row("seq").unwrap().efficiency, Some(0.0));
}

#[test]
fn invalid_problems_are_errors() {
    let sc = Scenario {
        name: "bad".into(),
        problem: Problem {
            op: Op::GemmRs,
            m: 2,
            k: 8,
            n: 8,
            gpus: 4,
            side: None,
            moe: None,
        },
    };
    let predict = table_predict(HashMap::new());
    let err = explore(
        &sc,
        &[Schedule::SEQ],
        &predict,
        &mut Predicted(&predict),
        &ExploreOptions::default(),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("smaller than the GPU count"),
        "{err}"
    );
}

#[test]
fn names_lowering_to_one_plan_are_measured_once() {
    // `shard-copy-ring` and `shard-copy-all` lower to the same plan here (as
    // they do with one peer); `bulk-copy-ring` to another.
    fn lower(p: &Problem, s: &Schedule) -> Result<Plan> {
        let rows = match s.name().as_str() {
            "shard-copy-ring" | "shard-copy-all" => 1,
            "bulk-copy-ring" => 2,
            _ => 3,
        };
        Ok(tiny_plan_rows(p, &s.name(), rows))
    }
    let mut opts = ExploreOptions::default();
    opts.lowering = Lowering {
        lower,
        gemm_only: |p| tiny_plan_rows(p, "gemm-only", 4),
        comm_only: |p| tiny_plan_rows(p, "comm-only", 5),
    };
    let mut mock = Mock::default();
    mock.times.insert("shard-copy-ring".into(), 1.5);
    mock.times.insert("shard-copy-all".into(), 1.0);
    mock.times.insert("bulk-copy-ring".into(), 1.8);
    let schedules: Vec<Schedule> = ["seq", "shard-copy-ring", "shard-copy-all", "bulk-copy-ring"]
        .iter()
        .map(|s| sched(s))
        .collect();
    let predict = table_predict(HashMap::new());
    let r = explore(&scenario(), &schedules, &predict, &mut mock, &opts)
        .unwrap()
        .report;
    let measured: Vec<&str> = mock
        .calls
        .iter()
        .filter(|c| c.1)
        .map(|c| c.0.as_str())
        .collect();
    assert_eq!(measured, ["seq", "shard-copy-ring", "bulk-copy-ring"]);
    let twin = r.row("shard-copy-all").unwrap();
    assert_eq!(twin.same_plan_as.as_deref(), Some("shard-copy-ring"));
    assert_eq!(twin.time_ms, Some(1.5));
    assert_eq!(twin.launch_us, Some(12.0));
    assert_eq!(r.best.as_deref(), Some("shard-copy-ring"));
    assert_eq!(r.launch_us(), Some((12.0, 12.0)));
    let table = r.table();
    assert!(table.contains("(same plan as shard-copy-ring)"), "{table}");
    assert!(
        table.contains("# host launch per operator: median 12.0 us"),
        "{table}"
    );
    let json = serde_json::to_value(&r).unwrap();
    assert_eq!(json["schedules"][2]["same_plan_as"], "shard-copy-ring");
    assert!(json["schedules"][3].get("same_plan_as").is_none());
}

/// Returns, per plan name, the next of a list of times (the last repeats).
struct Drifting {
    times: HashMap<String, Vec<f64>>,
    calls: HashMap<String, usize>,
}

impl Backend for Drifting {
    fn name(&self) -> &str {
        "gpu"
    }
    fn device(&self) -> String {
        "drifting".into()
    }
    fn prepare(&mut self, _: &Plan) -> Result<(), BackendError> {
        Ok(())
    }
    fn measure(&mut self, plan: &Plan, check: bool, _: bool) -> Result<Measured, BackendError> {
        let n = self.calls.entry(plan.name.clone()).or_default();
        let list = self.times.get(&plan.name).cloned().unwrap_or(vec![5.0]);
        let time_ms = list[(*n).min(list.len() - 1)];
        *n += 1;
        Ok(Measured {
            time_ms,
            max_rel_err: check.then_some(1e-3),
            correct: true,
            timeline: None,
            launch_us: None,
            range_ms: None,
        })
    }
}

#[test]
fn contenders_are_retimed_and_keep_their_fastest() {
    let times = HashMap::from([
        // Slow at first (a clock dip), then 1.0 ms.
        ("shard-copy-ring".to_string(), vec![1.09, 1.0, 1.05]),
        // Steady at 1.02 ms.
        ("shard-copy-all".to_string(), vec![1.02]),
        // seq: slow at first, then 1.5; gemm-only 0.8 then 0.7.
        ("seq".to_string(), vec![1.6, 1.5]),
        ("gemm-only".to_string(), vec![0.8, 0.7]),
        // Far behind: measured once.
        ("shard-nccl-ring".to_string(), vec![2.0]),
    ]);
    let mut m = Drifting {
        times,
        calls: HashMap::new(),
    };
    let schedules: Vec<Schedule> = [
        "seq",
        "shard-copy-ring",
        "shard-copy-all",
        "shard-nccl-ring",
    ]
    .iter()
    .map(|s| sched(s))
    .collect();
    let predict = table_predict(HashMap::new());
    let opts = ExploreOptions::default();
    assert_eq!(opts.retime_rounds, 2);
    let r = explore(&scenario(), &schedules, &predict, &mut m, &opts)
        .unwrap()
        .report;
    assert_eq!(r.row("shard-copy-ring").unwrap().time_ms, Some(1.0));
    assert_eq!(r.row("shard-copy-all").unwrap().time_ms, Some(1.02));
    assert_eq!(r.row("shard-nccl-ring").unwrap().time_ms, Some(2.0));
    assert_eq!(r.best.as_deref(), Some("shard-copy-ring"));
    assert_eq!(m.calls["shard-copy-ring"], 3);
    assert_eq!(m.calls["shard-nccl-ring"], 1);
    // The references: 1 + 2 measurements each (seq also once more, checked).
    assert_eq!(m.calls["gemm-only"], 3);
    assert_eq!(r.reference.sequential_ms, 1.5);
    assert_eq!(r.row("seq").unwrap().time_ms, Some(1.5));
    assert_eq!(r.reference.compute_ms, 0.7);
}

/// Issue 31 (scale): with the simulator as the backend, each plan is
/// simulated once (its measurement is its prediction), and the schedules
/// are prepared on several threads with the same report as on one.
#[test]
fn the_simulator_backend_simulates_each_plan_once_on_any_thread_count() {
    use ficco_core::sim::profile::HwProfile;
    use ficco_core::sim::Simulator;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let hw = HwProfile::builtin("h200-nvlink").unwrap();
    let sc = Scenario {
        name: "p8".into(),
        problem: Problem::new(Op::GemmRs, 8192, 4096, 4096, 8).unwrap(),
    };
    let space = SpaceOptions {
        controls: false,
        sm_count: hw.sm_count,
        nccl_sms: hw.nccl_sms,
    };
    let schedules = schedules_for(Op::GemmRs, space, &[]);
    let sim = Simulator::new(hw.clone());
    let predicted = AtomicUsize::new(0);
    let predict = |plan: &Plan| {
        predicted.fetch_add(1, Ordering::Relaxed);
        sim.predict(plan)
    };
    let mut reports = vec![];
    for threads in [1, 2, 5] {
        predicted.store(0, Ordering::Relaxed);
        let mut backend = sim.clone();
        let opts = ExploreOptions {
            measure_is_prediction: true,
            threads,
            select_hw: Some(hw.clone()),
            ..Default::default()
        };
        let ex = explore(&sc, &schedules, &predict, &mut backend, &opts).unwrap();
        let ran = ex
            .report
            .schedules
            .iter()
            .filter(|r| r.skipped.is_none() && r.name != "seq")
            .count();
        assert!(ran > 20, "{ran}");
        // seq and every schedule that lowered, once each.
        assert_eq!(
            predicted.load(Ordering::Relaxed),
            ran + 1,
            "{threads} threads"
        );
        reports.push(ex.report);
    }
    // The predictions are what the simulator measures, on any thread count.
    let mut backend = sim.clone();
    let twice = explore(
        &sc,
        &schedules,
        &predict,
        &mut backend,
        &ExploreOptions {
            select_hw: Some(hw.clone()),
            ..Default::default()
        },
    )
    .unwrap()
    .report;
    for r in &reports {
        assert_eq!(r, &twice);
    }
}

/// Issue 31: a measurer's iteration range reaches the report, and a
/// re-timed contender keeps the range of all its rounds.
#[test]
fn iteration_ranges_reach_the_report_and_span_every_round() {
    struct Ranged {
        calls: usize,
    }
    impl Backend for Ranged {
        fn name(&self) -> &str {
            "gpu"
        }
        fn device(&self) -> String {
            "4x Ranged".into()
        }
        fn prepare(&mut self, _: &Plan) -> Result<(), BackendError> {
            Ok(())
        }
        fn measure(&mut self, plan: &Plan, check: bool, _: bool) -> Result<Measured, BackendError> {
            self.calls += 1;
            let t = if plan.name == "seq" { 3.0 } else { 1.0 };
            // Each call a little wider than the last.
            let w = 0.01 * self.calls as f64;
            Ok(Measured {
                time_ms: t,
                max_rel_err: check.then_some(1e-3),
                correct: true,
                timeline: None,
                launch_us: None,
                range_ms: Some((t - w, t + w)),
            })
        }
    }
    let schedules = vec![
        Schedule::SEQ,
        sched("shard-copy-all"),
        sched("fine2-copy-all"),
    ];
    let predict = table_predict(HashMap::new());
    let mut b = Ranged { calls: 0 };
    let r = explore(
        &scenario(),
        &schedules,
        &predict,
        &mut b,
        &ExploreOptions::default(),
    )
    .unwrap()
    .report;
    for row in &r.schedules {
        let (lo, hi) = (row.min_ms.unwrap(), row.max_ms.unwrap());
        assert!(
            lo <= row.time_ms.unwrap() && row.time_ms.unwrap() <= hi,
            "{row:?}"
        );
    }
    // The two contenders were re-timed twice more: their range is the
    // widest of their three measurements, wider than their first.
    let width = |n: &str| r.row(n).unwrap().max_ms.unwrap() - r.row(n).unwrap().min_ms.unwrap();
    assert!(
        width("shard-copy-all") > 2.0 * 0.04,
        "{:?}",
        r.row("shard-copy-all")
    );
}

#[test]
fn the_simulator_does_not_take_iterations() {
    use ficco_core::run::Iterations;
    use ficco_core::sim::profile::HwProfile;
    let mut sim = ficco_core::sim::Simulator::new(HwProfile::builtin("h200-nvlink").unwrap());
    assert!(!sim.set_iterations(Iterations {
        warmup: 1,
        timed: 3
    }));
}
