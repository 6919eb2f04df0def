//! Where a run is, for reports of a stuck one: each rank's issuing
//! position ([`Issuing`]), optionally a host word per task its stream sets
//! when it passes the task (`FICCO_TASK_PROGRESS=1`). The phases of every
//! measurement and run go to stderr through [`ficco_core::settings::trace`]
//! (`FICCO_TRACE=1`).

use crate::driver::cuda as cu;
use crate::error::Result;
use crate::signal::HostWords;
use ficco_core::plan::Plan;
use std::sync::atomic::{AtomicU64, Ordering};

/// Where each rank's issuing thread is: the iteration and the step it is
/// issuing (a task index, or one of the `Issuing::*` steps). A thread stuck
/// inside a driver call stays at that step, so the watchdog's report tells a
/// blocked host thread from a blocked device.
pub(crate) struct Issuing {
    at: Vec<AtomicU64>,
    /// With `FICCO_TASK_PROGRESS=1`: per task of every rank, a mapped host
    /// word its stream sets to the iteration (1-based) after the task, so
    /// the report names the tasks the device has not finished.
    tasks: Option<(HostWords, Vec<usize>)>,
}

impl Issuing {
    /// Not started (events and graphs are being made).
    pub const PREP: u32 = u32::MAX;
    /// The start of an iteration (barrier waits, fork).
    pub const BEGIN: u32 = u32::MAX - 1;
    /// The end of an iteration (join, end signals).
    pub const END: u32 = u32::MAX - 2;
    /// Launching the iteration's CUDA graph.
    pub const GRAPH: u32 = u32::MAX - 3;
    /// The iteration is issued (the thread goes on to the next one).
    pub const ISSUED: u32 = u32::MAX - 4;
    /// Every iteration is issued; waiting for the device.
    pub const SYNC: u32 = u32::MAX - 5;

    /// Positions for `ranks` ranks, without task words.
    pub fn new(ranks: usize) -> Self {
        Issuing {
            at: (0..ranks)
                .map(|_| AtomicU64::new(u64::from(Self::PREP)))
                .collect(),
            tasks: None,
        }
    }

    /// Positions for every rank of `plan`, with task words where
    /// `FICCO_TASK_PROGRESS=1` asks for them (a context must be current).
    pub fn for_plan(plan: &Plan) -> Result<Self> {
        let mut me = Self::new(plan.ranks.len());
        if ficco_core::settings::Settings::current().task_progress {
            let mut base = vec![];
            let mut n = 0;
            for rp in &plan.ranks {
                base.push(n);
                n += rp.tasks.len();
            }
            me.tasks = Some((HostWords::new(n)?, base));
        }
        Ok(me)
    }

    pub fn set(&self, rank: usize, iteration: usize, step: u32) {
        if let Some(w) = self.at.get(rank) {
            w.store(
                ((iteration as u64) << 32) | u64::from(step),
                Ordering::Release,
            );
        }
    }

    /// On `stream`, after task `index` of `rank`: its word := iteration + 1.
    pub fn task_done(
        &self,
        stream: cudarc::driver::sys::CUstream,
        rank: usize,
        index: usize,
        iteration: usize,
    ) -> Result<()> {
        let Some((words, base)) = &self.tasks else {
            return Ok(());
        };
        // SAFETY: the word is inside the live mapped host allocation.
        unsafe {
            cu::stream_write_value32(
                stream,
                words.device(base[rank] + index),
                iteration as u32 + 1,
            )
        }
    }

    /// The tasks of `rank` its device has not finished in `iteration` (1-based).
    pub(crate) fn unfinished(&self, plan: &Plan, rank: usize, iteration: u32) -> Option<String> {
        let (words, base) = self.tasks.as_ref()?;
        let rp = plan.ranks.get(rank)?;
        let open: Vec<String> = rp
            .tasks
            .iter()
            .enumerate()
            .filter(|(i, _)| words.get(base[rank] + i) < iteration)
            .map(|(i, t)| format!("{i} '{}' (stream {})", t.label, t.stream))
            .collect();
        Some(format!(
            "unfinished tasks of iteration {iteration}: {}",
            open.join(", ")
        ))
    }

    pub(crate) fn describe(&self, plan: &Plan, rank: usize) -> String {
        let Some(v) = self.at.get(rank).map(|w| w.load(Ordering::Acquire)) else {
            return "?".into();
        };
        let (it, step) = ((v >> 32) + 1, v as u32);
        match step {
            Self::PREP => "preparing".into(),
            Self::BEGIN => format!("issuing the start of iteration {it}"),
            Self::END => format!("issuing the end of iteration {it}"),
            Self::GRAPH => format!("launching the graph of iteration {it}"),
            Self::ISSUED => format!("issued iteration {it}"),
            Self::SYNC => "issued every iteration, waiting for its device".into(),
            i => {
                let label = plan
                    .ranks
                    .get(rank)
                    .and_then(|rp| rp.tasks.get(i as usize))
                    .map_or("?", |t| t.label.as_str());
                format!("issuing task {i} '{label}' of iteration {it}")
            }
        }
    }
}
