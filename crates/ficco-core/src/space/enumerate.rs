//! The enumerated design space: every schedule that applies to an operator,
//! with or without resource-control variants ([`SpaceOptions`]).

use super::{Engine, Granularity, Order, Priority, Schedule, FINE_CHUNKS};
use crate::problem::workload::Op;

/// Which optional controls the enumeration includes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpaceOptions {
    /// Add resource-control variants (see [`enumerate`]). `concurrent`
    /// always has them: they are its design space.
    pub controls: bool,
    /// SMs of the device (for SM targets and green contexts).
    pub sm_count: usize,
    /// SMs NCCL kernels occupy (SM targets and green contexts leave these free).
    pub nccl_sms: usize,
}

/// NCCL `maxCTAs` of the enumerated `-ctaN` variants: a quarter of NCCL's
/// usual channel count on NVLink, so the collective leaves SMs to compute.
pub const CONTROL_NCCL_CTAS: usize = 8;

/// Pipeline stages of the enumerated `-occS` variants: 2 is the one setting
/// that frees shared memory (the default is 3 stages plus the epilogue's
/// staging buffer; 4 stages use more).
pub const CONTROL_OCCUPANCY: [usize; 1] = [2];

/// Green contexts are made of whole groups of this many SMs on Hopper.
pub const GREEN_SM_GRANULE: usize = 8;

impl SpaceOptions {
    /// The SM count a GEMM keeps under `-smN`: all but NCCL's.
    pub fn sm_target(&self) -> Option<usize> {
        (self.sm_count > self.nccl_sms && self.nccl_sms > 0).then(|| self.sm_count - self.nccl_sms)
    }

    /// The compute green context's SMs under `-gcN`: all but NCCL's, rounded
    /// down to the driver's granularity.
    pub fn green_sms(&self) -> Option<usize> {
        self.sm_target()
            .map(|n| n / GREEN_SM_GRANULE * GREEN_SM_GRANULE)
            .filter(|&n| n > 0)
    }
}

/// Every schedule of the design space that applies to `op`, `seq` first.
/// Size-dependent fit is not checked here: see [`Schedule::misfit`].
///
/// With `controls`, each base schedule of a dependent operator also comes
/// with `-own` and `-hi`; NCCL ones also with `-smN`, `-smN-hi`, `-gcN` and
/// `-ctaN`. `concurrent` gets every combination that makes sense: one
/// compute-side control (none, `-own`, `-smN`, `-gcN`, `-occ2`) x NCCL CTAs
/// (default or `-cta8`) x priority for NCCL; none, `-own` or `-gcN` for copy
/// engines (their transfers take no SMs; the reduce kernel already runs at
/// high priority).
pub fn enumerate(op: Op, opts: SpaceOptions) -> Vec<Schedule> {
    if op == Op::Concurrent {
        return enumerate_concurrent(opts);
    }
    let mut out = vec![Schedule::SEQ];
    let grans = [Granularity::Shard, Granularity::Bulk]
        .into_iter()
        .chain(FINE_CHUNKS.iter().map(|&c| Granularity::Fine(c)))
        .chain([Granularity::Tile]);
    for granularity in grans {
        for engine in [Engine::Nccl, Engine::Copy] {
            for order in [Order::Ring, Order::All] {
                for (compute_streams, fused_reduce) in
                    [(1, false), (2, false), (1, true), (2, true)]
                {
                    let base = Schedule {
                        compute_streams,
                        fused_reduce,
                        ..Schedule::base(granularity, engine, order)
                    };
                    if !base.applies_to(op) {
                        continue;
                    }
                    out.push(base);
                    if !opts.controls {
                        continue;
                    }
                    let hi = Schedule {
                        comm_priority: Priority::High,
                        ..base
                    };
                    out.push(hi);
                    out.push(base.with_own_gemm());
                    if engine == Engine::Nccl {
                        if let Some(sm) = opts.sm_target() {
                            out.push(base.with_sm_target(sm));
                            out.push(hi.with_sm_target(sm));
                        }
                        if let Some(gc) = opts.green_sms() {
                            out.push(Schedule {
                                green_sms: Some(gc),
                                ..base
                            });
                        }
                        out.push(Schedule {
                            nccl_ctas: Some(CONTROL_NCCL_CTAS),
                            ..base
                        });
                    }
                }
            }
        }
    }
    // Controls are added per base schedule; some do not exist for every op
    // (the expert-parallel ops keep their grouped GEMMs on cuBLASLt).
    out.retain(|s| s.applies_to(op));
    out
}

fn enumerate_concurrent(opts: SpaceOptions) -> Vec<Schedule> {
    let mut out = vec![Schedule::SEQ];
    let nccl = Schedule::base(Granularity::Shard, Engine::Nccl, Order::Ring);
    let mut compute_side = vec![nccl, nccl.with_own_gemm()];
    if let Some(sm) = opts.sm_target() {
        compute_side.push(nccl.with_sm_target(sm));
    }
    let green = opts.green_sms();
    if let Some(gc) = green {
        compute_side.push(Schedule {
            green_sms: Some(gc),
            ..nccl
        });
    }
    for stages in CONTROL_OCCUPANCY {
        compute_side.push(nccl.with_occupancy(stages));
    }
    for side in compute_side {
        for nccl_ctas in [None, Some(CONTROL_NCCL_CTAS)] {
            for comm_priority in [Priority::Normal, Priority::High] {
                out.push(Schedule {
                    nccl_ctas,
                    comm_priority,
                    ..side
                });
            }
        }
    }
    for order in [Order::Ring, Order::All] {
        let copy = Schedule::base(Granularity::Shard, Engine::Copy, order);
        out.push(copy);
        out.push(copy.with_own_gemm());
        if let Some(gc) = green {
            out.push(Schedule {
                green_sms: Some(gc),
                ..copy
            });
        }
    }
    out
}
