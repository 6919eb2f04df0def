//! The distinct GEMM shapes that plans run: what `ficco gemm-bench` measures.
//!
//! A GEMM engine is only as good as it is on the GEMMs schedules issue, so
//! the shapes come from lowering, not from a list: the whole per-rank GEMM of
//! each scenario ([`gemm_only`]) and every GEMM task of its overlapped
//! schedules of the given granularities (every engine, order, stream count
//! and fusion the space has for the operator, without resource controls:
//! controls change how a GEMM runs, not its shape). Each shape is listed
//! once, with every place it comes from.

use crate::plan::lower::{gemm_only, lower};
use crate::plan::{Plan, TaskKind};
use crate::problem::workload::Scenario;
use crate::space::{enumerate, Granularity, SpaceOptions};
use serde::Serialize;

/// One distinct GEMM shape (row-major `[m,k]·[k,n]`) and where plans run it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GemmShape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// Some scenario's whole per-rank GEMM has this shape.
    pub whole: bool,
    /// Some overlapped schedule issues a GEMM of this shape (a chunk, a
    /// shard, or coalesced peers' rows).
    pub chunk: bool,
    /// Where it comes from, first seen first: `SCENARIO whole` or
    /// `SCENARIO GRAN` (e.g. `llama3-8b.qkv.t2048.p2 fine4`).
    pub uses: Vec<String>,
}

impl GemmShape {
    /// `whole`, `chunk`, or `whole+chunk`.
    pub fn kind(&self) -> &'static str {
        match (self.whole, self.chunk) {
            (true, true) => "whole+chunk",
            (true, false) => "whole",
            _ => "chunk",
        }
    }

    /// Floating-point operations of one run.
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

/// The granularities whose chunk GEMMs `ficco gemm-bench` measures.
pub const BENCH_GRANULARITIES: [Granularity; 5] = [
    Granularity::Shard,
    Granularity::Bulk,
    Granularity::Fine(2),
    Granularity::Fine(4),
    Granularity::Fine(8),
];

/// Every distinct GEMM shape of `scenarios`: whole per-rank GEMMs, then the
/// GEMMs of their schedules of granularity `grans`, in first-seen order.
/// Schedules that do not fit a scenario (M not divisible) add nothing.
pub fn gemm_shapes(scenarios: &[Scenario], grans: &[Granularity]) -> Vec<GemmShape> {
    let mut out: Vec<GemmShape> = vec![];
    let mut add = |m: usize, n: usize, k: usize, whole: bool, use_: String| {
        if m == 0 || n == 0 || k == 0 {
            return;
        }
        let i = match out.iter().position(|s| (s.m, s.n, s.k) == (m, n, k)) {
            Some(i) => i,
            None => {
                out.push(GemmShape {
                    m,
                    n,
                    k,
                    whole: false,
                    chunk: false,
                    uses: vec![],
                });
                out.len() - 1
            }
        };
        let s = &mut out[i];
        s.whole |= whole;
        s.chunk |= !whole;
        if !s.uses.contains(&use_) {
            s.uses.push(use_);
        }
    };
    let space = SpaceOptions::default();
    for sc in scenarios {
        let p = &sc.problem;
        for (m, n, k) in gemms(&gemm_only(p)) {
            add(m, n, k, true, format!("{} whole", sc.name));
        }
        for s in enumerate(p.op, space) {
            if !grans.contains(&s.granularity) {
                continue;
            }
            let Ok(plan) = lower(p, &s) else { continue };
            for (m, n, k) in gemms(&plan) {
                add(
                    m,
                    n,
                    k,
                    false,
                    format!("{} {}", sc.name, s.granularity.name()),
                );
            }
        }
    }
    out
}

/// The (m, n, k) of every GEMM task of `plan`, every rank, in issue order.
fn gemms(plan: &Plan) -> Vec<(usize, usize, usize)> {
    plan.ranks
        .iter()
        .flat_map(|r| &r.tasks)
        .filter_map(|t| match &t.kind {
            TaskKind::Gemm { a, b, .. } => Some((a.rows, b.cols, a.cols)),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::suite::parse;

    fn suite(text: &str) -> Vec<Scenario> {
        parse(text, "test.toml").unwrap().scenarios
    }

    #[test]
    fn whole_and_chunk_shapes_of_one_ag_gemm() {
        let sc = suite(
            "[[scenario]]\nname = \"x\"\nop = \"ag-gemm\"\nm = 2048\nk = 4096\nn = 3072\ngpus = 2\n",
        );
        let shapes = gemm_shapes(&sc, &BENCH_GRANULARITIES);
        let find = |m| shapes.iter().find(|s| (s.m, s.n, s.k) == (m, 3072, 4096));
        // Whole: the gathered 2048 rows; shard: 1024 per peer; fine8: 128.
        let whole = find(2048).unwrap();
        assert!(whole.whole);
        assert_eq!(whole.uses[0], "x whole");
        let shard = find(1024).unwrap();
        assert!(shard.chunk && !shard.whole);
        assert!(shard.uses.contains(&"x shard".to_string()));
        assert!(
            shard.uses.contains(&"x bulk".to_string()),
            "{:?}",
            shard.uses
        );
        for (m, g) in [(512, "fine2"), (256, "fine4"), (128, "fine8")] {
            let s = find(m).unwrap();
            assert!(s.uses.contains(&format!("x {g}")), "{m}: {:?}", s.uses);
        }
        // Each shape once, and nothing but these five (bulk at P=2 is shard).
        assert_eq!(shapes.len(), 5, "{shapes:?}");
        // Only the granularities asked for.
        let only = gemm_shapes(&sc, &[Granularity::Shard]);
        assert_eq!(only.len(), 2);
    }

    #[test]
    fn llama3_suite_shapes_are_distinct_and_aligned() {
        let text = include_str!("../../../../suites/llama3.toml");
        let sc = suite(text);
        let shapes = gemm_shapes(&sc, &BENCH_GRANULARITIES);
        let mut seen = std::collections::HashSet::new();
        for s in &shapes {
            assert!(seen.insert((s.m, s.n, s.k)), "duplicate {s:?}");
            assert!(s.n % 8 == 0 && s.k % 8 == 0, "{s:?}");
            assert!(!s.uses.is_empty());
        }
        assert!(shapes.iter().any(|s| s.whole) && shapes.iter().any(|s| s.chunk));
        // gemm-rs 8192 x 7168 x 8192 at P=4, fine8: 8192 / 4 / 8 = 256 rows.
        assert!(shapes
            .iter()
            .any(|s| (s.m, s.n, s.k) == (256, 8192, 7168) && s.chunk));
    }
}
