//! Schedules in words, for listings (`ficco schedules`): every part of the
//! name, controls included, becomes a phrase.

use super::{Engine, GemmEngine, Granularity, Order, Priority, Schedule};

impl Schedule {
    /// A short description on `gpus` GPUs that names every part of the
    /// schedule, e.g. "4 chunks per shard (32 steps), copy engines (no SMs),
    /// all peers at once, 2 compute streams". Each option of the name
    /// (`-2s`, `-acc`, `-own`, `-smN`, `-gcN`, `-occS`, `-ctaN`, `-hi`) adds
    /// one phrase, in the name's order.
    pub fn describe(&self, gpus: usize) -> String {
        let gran = match self.granularity {
            Granularity::Seq => {
                return "sequential reference: the whole collective, then the GEMM (or the reverse)"
                    .into()
            }
            Granularity::Shard => format!("one step per shard ({gpus} steps)"),
            Granularity::Bulk => {
                "transfers per shard, peer GEMMs coalesced (<= 3 GEMMs)".to_string()
            }
            Granularity::Fine(c) => format!("{c} chunks per shard ({} steps)", c * gpus),
            Granularity::Tile => {
                "one persistent GEMM launch, row blocks gated and drained by device flags"
                    .to_string()
            }
        };
        let engine = match self.engine {
            Engine::Nccl => "NCCL kernels",
            Engine::Copy => "copy engines (no SMs)",
        };
        let order = match self.order {
            Order::Ring => "one peer per step, staggered",
            Order::All => "all peers at once",
        };
        let mut d = format!("{gran}, {engine}, {order}");
        if self.compute_streams == 2 {
            d += ", 2 compute streams";
        }
        if self.fused_reduce {
            d += ", reduction fused into the own block's GEMM (C += A·B, no reduce kernel)";
        }
        if self.gemm == GemmEngine::Own && self.sm_target.is_none() && self.occupancy.is_none() {
            d += ", GEMMs on ficco's own kernel";
        }
        if let Some(sm) = self.sm_target {
            d += &format!(", GEMMs on ficco's own kernel on at most {sm} SMs (SM budget)");
        }
        if let Some(n) = self.green_sms {
            d += &format!(", green contexts: compute on {n} SMs, communication on the rest");
        }
        if let Some(st) = self.occupancy {
            let own = if self.sm_target.is_some() {
                ""
            } else {
                " on ficco's own kernel"
            };
            d += &format!(", occupancy shaping: GEMMs{own} with {st} pipeline stages");
        }
        if let Some(n) = self.nccl_ctas {
            d += &format!(", NCCL limited to {n} CTAs (maxCTAs)");
        }
        if self.comm_priority == Priority::High {
            d += ", high comm priority";
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use crate::problem::workload::Op;
    use crate::space::{enumerate, Schedule, SpaceOptions};

    /// Every option of the name, with the words that must describe it.
    fn phrases(s: &Schedule) -> Vec<&'static str> {
        let mut want = vec![];
        if s.compute_streams == 2 {
            want.push("2 compute streams");
        }
        if s.fused_reduce {
            want.push("reduction fused");
        }
        if s.gemm == crate::space::GemmEngine::Own {
            want.push("ficco's own kernel");
        }
        if s.sm_target.is_some() {
            want.push("SM budget");
        }
        if s.green_sms.is_some() {
            want.push("green context");
        }
        if s.occupancy.is_some() {
            want.push("occupancy shaping");
        }
        if s.nccl_ctas.is_some() {
            want.push("CTAs");
        }
        if s.comm_priority == crate::space::Priority::High {
            want.push("high comm priority");
        }
        want
    }

    #[test]
    fn every_control_is_named() {
        let opts = SpaceOptions {
            controls: true,
            sm_count: 132,
            nccl_sms: 16,
        };
        for op in Op::ALL.into_iter().chain([Op::Concurrent]).chain(Op::MOE) {
            for s in enumerate(op, opts) {
                let d = s.describe(4);
                for p in phrases(&s) {
                    assert!(d.contains(p), "{}: {d:?} lacks {p:?}", s.name());
                }
            }
        }
    }

    #[test]
    fn concurrent_controls_in_words() {
        let s: Schedule = "shard-nccl-ring-gc112-cta8-hi".parse().unwrap();
        let d = s.describe(4);
        assert!(d.contains("compute on 112 SMs"), "{d}");
        assert!(d.contains("8 CTAs"), "{d}");
        let s: Schedule = "shard-nccl-ring-occ2".parse().unwrap();
        assert!(s.describe(2).contains("own kernel with 2 pipeline stages"));
        let s: Schedule = "shard-nccl-ring-sm100-occ2".parse().unwrap();
        let d = s.describe(2);
        assert!(
            d.contains("at most 100 SMs") && d.contains("GEMMs with 2 pipeline stages"),
            "{d}"
        );
        let s: Schedule = "shard-copy-all-own".parse().unwrap();
        assert!(s
            .describe(2)
            .ends_with("all peers at once, GEMMs on ficco's own kernel"));
        let s: Schedule = "fine2-copy-ring-acc".parse().unwrap();
        assert!(s.describe(2).contains("fused"));
    }
}
