//! Eight GPUs (issue 6): every P=8 path runs in the simulator and the exact
//! interpreter on the CPU, so the one device call on an 8-GPU machine only
//! has to measure.

use ficco_core::plan::interp::{interpret, reference, Inputs};
use ficco_core::plan::lower::{comm_only, gemm_only, lower};
use ficco_core::plan::validate::validate;
use ficco_core::problem::workload::{Op, Problem};
use ficco_core::sim::profile::HwProfile;
use ficco_core::sim::simulate;
use ficco_core::space::{enumerate, SpaceOptions};

fn space(hw: &HwProfile) -> SpaceOptions {
    SpaceOptions {
        controls: true,
        sm_count: hw.sm_count,
        nccl_sms: hw.nccl_sms,
    }
}

#[test]
fn the_p8_suite_simulates_every_schedule() {
    let hw = HwProfile::builtin("h200-nvlink").unwrap();
    let suite = ficco_core::problem::suite::parse(
        include_str!("../../../suites/llama3-p8.toml"),
        "llama3-p8.toml",
    )
    .unwrap();
    assert_eq!(suite.scenarios.len(), 30);
    for sc in &suite.scenarios {
        let p = sc.problem;
        assert_eq!(p.gpus, 8);
        let seq = simulate(&gemm_only(&p), &hw).unwrap().total_ms
            + simulate(&comm_only(&p), &hw).unwrap().total_ms;
        let mut ran = 0;
        for s in enumerate(p.op, space(&hw)) {
            if s.misfit(&p).is_some() {
                continue;
            }
            let plan = lower(&p, &s).unwrap();
            validate(&plan).unwrap_or_else(|e| panic!("{} {s}: {e}", sc.name));
            let t = simulate(&plan, &hw).unwrap_or_else(|e| panic!("{} {s}: {e}", sc.name));
            // fine8 over NCCL at P=8 is 64 latency-bound calls: slow, but bounded.
            assert!(
                t.total_ms > 0.0 && t.total_ms < 50.0 * seq,
                "{} {s}: {}",
                sc.name,
                t.total_ms
            );
            ran += 1;
        }
        assert!(ran > 20, "{}: only {ran} schedules fit", sc.name);
    }
}

#[test]
fn every_schedule_is_exact_at_p8() {
    let hw = HwProfile::builtin("h200-nvlink").unwrap();
    for op in Op::ALL {
        // 8 GPUs x 8 chunks: every granularity fits; N and K multiples of 8
        // for ficco's own GEMM.
        let p = Problem::new(op, 64, 8, 8, 8).unwrap();
        let inputs = Inputs::random(&p, 8);
        let want = reference(&p, &inputs);
        for s in enumerate(op, space(&hw)) {
            // `tile` needs 128-row blocks: tests/tile.rs proves it at P = 8.
            if s.granularity == ficco_core::space::Granularity::Tile {
                continue;
            }
            let plan = lower(&p, &s).unwrap();
            validate(&plan).unwrap();
            assert_eq!(interpret(&plan, &inputs).unwrap(), want, "{op} {s}");
        }
    }
}
