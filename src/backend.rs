//! Wiring of the hardware profile, the predictor and the GPU measurer.
//!
//! TODO(lead): this file holds TEMPORARY stand-ins until the `sim` and `gpu`
//! branches are merged:
//! * [`Hw::load`] → `ficco_core::profile::HwProfile::load(&str)`;
//! * [`predict`] → `ficco_core::sim::simulate(&Plan, &HwProfile)`;
//! * [`gpu_measurer`] → the `ficco-cuda` measurer.
//!
//! Only these three functions (and the `Hw` type) need swapping; `main.rs`
//! uses nothing else from here.

use anyhow::{anyhow, Result};
use ficco_core::measure::Measurer;
use ficco_core::plan::{Plan, TaskKind};
use ficco_core::timeline::{Span, Timeline};
use ficco_core::Error;

/// TEMPORARY hardware profile: the few numbers the stand-in predictor needs.
/// TODO(lead): replace with `ficco_core::profile::HwProfile`.
#[derive(Debug, Clone)]
pub struct Hw {
    pub name: String,
    pub sm_count: usize,
    pub nccl_sms: usize,
    gemm_tflops: f64,
    link_gbs: f64,
    nccl_gbs: f64,
    hbm_gbs: f64,
    launch_us: f64,
}

const BUILTIN: [&str; 2] = ["h200-nvlink", "h100-nvlink"];

impl Hw {
    /// TODO(lead): `HwProfile::load(spec)` (built-in name or TOML path).
    pub fn load(spec: &str) -> Result<Hw> {
        let (tflops, hbm) = match spec {
            "h200-nvlink" => (700.0, 4300.0),
            "h100-nvlink" => (650.0, 3000.0),
            _ => {
                return Err(Error::Profile(format!(
                    "unknown hardware profile '{spec}' (built-in: {}; profile files need the simulator, not merged yet)",
                    BUILTIN.join(", ")
                ))
                .into())
            }
        };
        Ok(Hw {
            name: spec.to_string(),
            sm_count: 132,
            nccl_sms: 16,
            gemm_tflops: tflops,
            link_gbs: 390.0,
            nccl_gbs: 290.0,
            hbm_gbs: hbm,
            launch_us: 5.0,
        })
    }

    fn duration_ms(&self, plan: &Plan, kind: &TaskKind) -> f64 {
        let launch = self.launch_us * 1e-3;
        launch
            + match kind {
                TaskKind::Gemm {
                    a, c, sm_target, ..
                } => {
                    let flops = 2.0 * c.rows as f64 * c.cols as f64 * a.cols as f64;
                    let share = sm_target
                        .map(|s| s.min(self.sm_count) as f64 / self.sm_count as f64)
                        .unwrap_or(1.0);
                    flops / (self.gemm_tflops * 1e12 * share) * 1e3
                }
                TaskKind::Copy { src, .. } => src.view.bytes() as f64 / (self.link_gbs * 1e9) * 1e3,
                TaskKind::Nccl { op, .. } => {
                    op.bytes_sent(plan.problem.gpus) as f64 / (self.nccl_gbs * 1e9) * 1e3
                }
                TaskKind::Reduce { srcs, dst } => {
                    (srcs.len() + 1) as f64 * dst.bytes() as f64 / (self.hbm_gbs * 1e9) * 1e3
                }
            }
    }
}

/// TEMPORARY predictor: list-schedules the plan with fixed per-task times
/// (roofline GEMMs, bandwidth-only transfers, no contention); NCCL tasks of
/// one group start together. TODO(lead): `ficco_core::sim::simulate(plan, hw)`.
pub fn predict(plan: &Plan, hw: &Hw) -> ficco_core::Result<Timeline> {
    let ranks = plan.ranks.len();
    // end[rank][task], once scheduled.
    let mut end: Vec<Vec<Option<f64>>> = plan
        .ranks
        .iter()
        .map(|r| vec![None; r.tasks.len()])
        .collect();
    let mut stream_free: Vec<Vec<f64>> = plan
        .ranks
        .iter()
        .map(|r| vec![0.0; r.streams.len().max(1)])
        .collect();
    // Per rank and stream: task indices in issue order, and a cursor.
    let queues: Vec<Vec<Vec<usize>>> = plan
        .ranks
        .iter()
        .map(|r| {
            let mut q = vec![vec![]; r.streams.len().max(1)];
            for (i, t) in r.tasks.iter().enumerate() {
                if t.stream >= q.len() {
                    q.resize(t.stream + 1, vec![]);
                }
                q[t.stream].push(i);
            }
            q
        })
        .collect();
    let mut cursor: Vec<Vec<usize>> = queues.iter().map(|q| vec![0; q.len()]).collect();
    for (r, q) in queues.iter().enumerate() {
        stream_free[r].resize(q.len(), 0.0);
    }
    let mut spans = vec![];
    let total: usize = plan.task_count();
    let ready = |end: &Vec<Vec<Option<f64>>>, free: &Vec<Vec<f64>>, r: usize, i: usize| {
        let t = &plan.ranks[r].tasks[i];
        let mut at = free[r][t.stream];
        for d in &t.deps {
            at = at.max(end.get(d.rank)?.get(d.index).copied().flatten()?);
        }
        Some(at)
    };
    while spans.len() < total {
        let mut progress = false;
        for r in 0..ranks {
            for s in 0..queues[r].len() {
                let Some(&i) = queues[r][s].get(cursor[r][s]) else {
                    continue;
                };
                let Some(mut start) = ready(&end, &stream_free, r, i) else {
                    continue;
                };
                let task = &plan.ranks[r].tasks[i];
                // An NCCL rendezvous: every member must be at the head of its stream and ready.
                let mut members = vec![(r, i)];
                if let TaskKind::Nccl { group, .. } = task.kind {
                    let mut all = true;
                    for (r2, rp) in plan.ranks.iter().enumerate() {
                        if r2 == r {
                            continue;
                        }
                        let Some(i2) = rp.tasks.iter().position(
                            |t| matches!(t.kind, TaskKind::Nccl { group: g, .. } if g == group),
                        ) else {
                            continue;
                        };
                        let s2 = rp.tasks[i2].stream;
                        let at_head = queues[r2][s2].get(cursor[r2][s2]) == Some(&i2);
                        match ready(&end, &stream_free, r2, i2) {
                            Some(t) if at_head => {
                                start = start.max(t);
                                members.push((r2, i2));
                            }
                            _ => all = false,
                        }
                    }
                    if !all {
                        continue;
                    }
                }
                for (r2, i2) in members {
                    let t = &plan.ranks[r2].tasks[i2];
                    let stop = start + hw.duration_ms(plan, &t.kind);
                    end[r2][i2] = Some(stop);
                    stream_free[r2][t.stream] = stop;
                    cursor[r2][t.stream] += 1;
                    spans.push(Span {
                        rank: r2,
                        stream: t.stream,
                        task: i2,
                        label: t.label.clone(),
                        kind: t.kind.short().to_string(),
                        start_ms: start,
                        end_ms: stop,
                    });
                }
                progress = true;
            }
        }
        if !progress {
            return Err(Error::InvalidPlan(format!(
                "plan '{}' cannot make progress (dependency cycle or unmatched NCCL group)",
                plan.name
            )));
        }
    }
    Ok(Timeline {
        name: plan.name.clone(),
        spans,
        total_ms: 0.0,
    }
    .finish())
}

/// The GPU backend's measurer for `gpus` GPUs.
/// TODO(lead): construct the `ficco-cuda` measurer here once the gpu branch lands.
pub fn gpu_measurer(_gpus: usize) -> Result<Box<dyn Measurer>> {
    Err(anyhow!(
        "GPU backend not available: the CUDA executor is not wired into this build yet"
    ))
}
