//! Simulates the whole public suite (`suites/llama3.toml`): every scenario,
//! every enumerated schedule that fits (with the resource controls), plus the
//! gemm-only and comm-only references. Prints how long it took; in release
//! builds it must take under 5 s (`cargo test --release -p ficco-core --test
//! sim_suite -- --nocapture`).

use ficco_core::plan::lower::{comm_only, gemm_only, lower};
use ficco_core::problem::workload::{Problem, Scenario};
use ficco_core::sim::profile::HwProfile;
use ficco_core::sim::simulate;
use ficco_core::space::{enumerate, SpaceOptions};
use serde::Deserialize;
use std::time::Instant;

#[derive(Deserialize)]
struct Flat {
    name: String,
    #[serde(flatten)]
    problem: Problem,
}

#[derive(Deserialize)]
struct Suite {
    scenario: Vec<Flat>,
}

fn scenarios() -> Vec<Scenario> {
    parse(include_str!("../../../suites/llama3.toml"))
}

fn parse(text: &str) -> Vec<Scenario> {
    toml::from_str::<Suite>(text)
        .expect("suite parses")
        .scenario
        .into_iter()
        .map(|f| Scenario {
            name: f.name,
            problem: f.problem,
        })
        .collect()
}

#[test]
fn whole_suite_simulates_fast() {
    let hw = HwProfile::builtin("h200-nvlink").unwrap();
    let opts = SpaceOptions {
        controls: true,
        sm_count: hw.sm_count,
        nccl_sms: hw.nccl_sms,
    };
    let scenarios = scenarios();
    assert!(scenarios.len() >= 48, "{}", scenarios.len());
    // Lower first, so that only simulation is timed.
    let mut plans = Vec::new();
    for sc in &scenarios {
        let p = &sc.problem;
        plans.push(gemm_only(p));
        plans.push(comm_only(p));
        for s in enumerate(p.op, opts) {
            if s.misfit(p).is_none() {
                plans.push(lower(p, &s).unwrap());
            }
        }
    }
    let tasks: usize = plans.iter().map(|p| p.task_count()).sum();
    let max_tasks = plans.iter().map(|p| p.task_count()).max().unwrap();
    let t0 = Instant::now();
    let mut total = 0.0;
    for plan in &plans {
        let tl = simulate(plan, &hw).unwrap_or_else(|e| panic!("{}: {e}", plan.name));
        assert!(tl.total_ms > 0.0);
        total += tl.total_ms;
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "simulated {} plans of {} scenarios ({tasks} tasks, at most {max_tasks} per plan) in {secs:.3} s \
         ({:.1} µs per plan); sum of predicted times {total:.1} ms",
        plans.len(),
        scenarios.len(),
        1e6 * secs / plans.len() as f64
    );
    if !cfg!(debug_assertions) {
        assert!(secs < 5.0, "suite simulation took {secs:.2} s");
    }
}

/// Issue 30's held-out validation set (`bench/validation_suite.py`): four
/// families not in the llama3 suite, every site at 2 token counts and P = 4
/// and 2; every scenario has schedules that fit and simulates.
#[test]
fn validation_suite_holds_other_families_and_every_scenario_simulates() {
    let hw = HwProfile::builtin("h200-nvlink").unwrap();
    let scenarios = parse(include_str!("../../../suites/validation.toml"));
    assert_eq!(scenarios.len(), 4 * 5 * 2 * 2);
    let opts = SpaceOptions {
        controls: false,
        sm_count: hw.sm_count,
        nccl_sms: hw.nccl_sms,
    };
    for sc in &scenarios {
        let p = &sc.problem;
        assert!(
            !sc.name.starts_with("llama3"),
            "{}: the validation set holds other families",
            sc.name
        );
        let fitting: Vec<_> = enumerate(p.op, opts)
            .into_iter()
            .filter(|s| s.misfit(p).is_none())
            .collect();
        assert!(
            fitting.len() > 1,
            "{}: no overlapped schedule fits",
            sc.name
        );
        for s in fitting.iter().take(4) {
            let plan = lower(p, s).unwrap_or_else(|e| panic!("{}: {e}", sc.name));
            let tl = simulate(&plan, &hw).unwrap_or_else(|e| panic!("{}: {e}", sc.name));
            assert!(tl.total_ms > 0.0);
        }
    }
}
