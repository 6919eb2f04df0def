//! What `auto` runs for a call of the session: the schedule it picks
//! (the tuning cache's winner, else the rule selector's, among those that
//! can run where the ranks are) and, for an operator call in a model, the
//! decision between that schedule and the sequential reference
//! ([`ficco_core::choose::call`]). Rank 0 decides; every rank follows.

use super::{bad, Session};
use crate::error::Result;
use crate::exec::shared::graph_safe;
use crate::runtime::job::needs_one_node;
use ficco_core::choose::autotune::{self, Advice};
use ficco_core::choose::call::{self, CallDecision};
use ficco_core::choose::select::{self, select_model_among, select_rules_among, Selector};
use ficco_core::choose::tune::{self, TuneCache, TuneEntry};
use ficco_core::plan::lower::lower;
use ficco_core::plan::{Plan, TaskKind};
use ficco_core::problem::workload::{Op, Problem};
use ficco_core::sim::profile::HwProfile;
use ficco_core::space::Schedule;

/// The hardware profile the selector and the simulator use for `auto`.
const SELECT_HW: &str = ficco_core::sim::profile::DEFAULT_PROFILE;
/// Whether `plan` can run where every rank shares one GPU: no NCCL (it
/// refuses two ranks on one GPU), no tile GEMM (its blocks spin on flags
/// that another process's copies set; processes on one GPU time-slice).
pub(super) fn runs_in_loopback(plan: &Plan) -> bool {
    !plan.has_task(|k| matches!(k, TaskKind::Nccl { .. } | TaskKind::TileGemm(_)))
}

/// Whether a test lets `plan` run in loopback although it has tile GEMMs
/// (`FICCO_TEST_LOOPBACK_TILE=1`: the op path's tests on one GPU; NCCL is
/// still refused).
pub(super) fn test_tile_in_loopback(plan: &Plan) -> bool {
    ficco_core::settings::Settings::current()
        .faults
        .loopback_tile
        && !plan.has_task(|k| matches!(k, TaskKind::Nccl { .. }))
}

/// Whether a call of `s` on `p` can be captured in a CUDA graph: no tile
/// GEMM whose blocks wait on flags ([`graph_safe`]). A model's calls may be
/// captured (`torch.cuda.graph`, `torch.compile`'s CUDA graphs), so `auto`
/// in a model picks only these.
fn capturable(p: &Problem, s: &Schedule) -> bool {
    lower(p, s).is_ok_and(|plan| graph_safe(&plan))
}

/// `first` where a call of it can be captured; else the fastest capturable
/// schedule `entry` measured that runs at `at`; else the rule selector's
/// pick among the capturable schedules that run there (`seq` is one).
pub(crate) fn capturable_pick(
    p: &Problem,
    first: Schedule,
    entry: Option<&TuneEntry>,
    hw: &HwProfile,
    at: Placement,
) -> Result<Schedule> {
    if capturable(p, &first) {
        return Ok(first);
    }
    let mut measured: Vec<(Schedule, f64)> = entry
        .map(|e| {
            e.measured
                .iter()
                .filter_map(|(n, t)| Some((n.parse::<Schedule>().ok()?, *t)))
                .filter(|(s, _)| capturable(p, s) && at.runs(p, s))
                .collect()
        })
        .unwrap_or_default();
    measured.sort_by(|a, b| a.1.total_cmp(&b.1));
    if let Some((s, _)) = measured.first() {
        return Ok(*s);
    }
    let among: Vec<Schedule> = select::candidates(p)
        .into_iter()
        .filter(|s| capturable(p, s) && at.runs(p, s))
        .collect();
    Ok(select_rules_among(p, hw, &among).map_err(bad)?.schedule)
}

/// Where a job's ranks are, as far as schedules care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    /// Every rank on one GPU: no NCCL, no tile GEMMs (`seq` runs as copies).
    pub loopback: bool,
    /// The ranks span several nodes: NCCL schedules only.
    pub multi_node: bool,
}

impl Placement {
    /// Whether `s` can run on `p` here.
    fn runs(self, p: &Problem, s: &Schedule) -> bool {
        lower(p, s).is_ok_and(|plan| {
            (!self.loopback || s.is_seq() || runs_in_loopback(&plan))
                && (!self.multi_node || !needs_one_node(&plan))
        })
    }
}

/// `first` where it can run at `at`; else the rule selector's pick among
/// the schedules that can, when that pick can (its rules do not choose the
/// communication engine by where the ranks are); else the model selector's
/// fastest of them (`seq` is always among them).
pub(crate) fn runnable_pick(
    p: &Problem,
    first: Schedule,
    hw: &HwProfile,
    at: Placement,
) -> Result<Schedule> {
    if at.runs(p, &first) {
        return Ok(first);
    }
    let among: Vec<Schedule> = select::candidates(p)
        .into_iter()
        .filter(|s| at.runs(p, s))
        .collect();
    let s = select_rules_among(p, hw, &among).map_err(bad)?.schedule;
    if at.runs(p, &s) {
        return Ok(s);
    }
    let s = select_model_among(p, hw, &among).map_err(bad)?.schedule;
    if at.runs(p, &s) {
        Ok(s)
    } else {
        Ok(Schedule::SEQ)
    }
}

impl Session {
    /// The schedule `auto` runs for `p`: the tuning cache's measured
    /// winner for this device, else the rule selector's pick; where that
    /// cannot run here (NCCL or tile GEMMs in loopback, copies across
    /// nodes), one that can (`runnable_pick`). Rank 0's pick, sent to
    /// every rank through the store (once per problem); every rank calls it.
    pub fn pick(&mut self, p: &Problem) -> Result<Schedule> {
        if let Some(s) = self.picks.get(p) {
            return Ok(*s);
        }
        let (mine, _) = self.local_pick(p)?;
        // Rank 0's pick for everybody: another node's tuning cache may
        // name another winner, and ranks running different plans would
        // wait for each other forever.
        let name = self.rank0_value("pick", mine.name().into_bytes())?;
        let s: Schedule = String::from_utf8_lossy(&name).parse().map_err(|e| {
            bad(format!(
                "rank 0 picked a schedule this rank cannot read: {e}"
            ))
        })?;
        self.picks.insert(*p, s);
        Ok(s)
    }

    /// What `auto` runs for an operator call of `p` in a model
    /// ([`ficco_core::choose::call`]): [`Session::pick`]'s schedule where its
    /// measured (or discounted predicted) gain over `seq` covers the call's
    /// own cost, else `seq`. Rank 0's decision, sent to every rank (once per
    /// problem); every rank calls it.
    pub fn decide(&mut self, p: &Problem) -> Result<CallDecision> {
        if let Some(d) = self.decisions.get(p) {
            return Ok(d.clone());
        }
        let (first, entry) = self.local_pick(p)?;
        let hw = HwProfile::builtin(SELECT_HW).map_err(bad)?;
        let (candidate, entry) = if capturable(p, &first) {
            (first, entry)
        } else {
            // The tuned winner has a tile GEMM that waits on flags: the fastest capturable one
            // it measured (times are looked up by name), else the rules'.
            let raw = self.tuned_entry(p);
            let s = capturable_pick(p, first, raw.as_ref(), &hw, self.placement())?;
            (s, raw)
        };
        let plan = lower(p, &candidate).map_err(bad)?;
        let time_of = |name: &str| {
            entry
                .as_ref()
                .and_then(|e| e.measured.iter().find(|(n, _)| n == name))
                .map(|(_, t)| *t)
        };
        let measured = time_of("seq").zip(time_of(&candidate.name()));
        let predicted = (
            select::predict_ms(p, &Schedule::SEQ, &hw).map_err(bad)?,
            select::predict_ms(p, &candidate, &hw).map_err(bad)?,
        );
        let mine = call::decide(&plan, &hw, measured, predicted);
        let text = serde_json::to_vec(&mine).map_err(bad)?;
        let got = self.rank0_value("decide", text)?;
        let d: CallDecision = serde_json::from_slice(&got)
            .map_err(|e| bad(format!("rank 0's decision cannot be read here: {e}")))?;
        self.decisions.insert(*p, d.clone());
        Ok(d)
    }

    /// [`Session::decide`] for an operator call of `op` on `m x k x n`.
    pub fn decide_op(&mut self, op: Op, m: usize, k: usize, n: usize) -> Result<CallDecision> {
        if !matches!(op, Op::AgGemm | Op::GemmRs | Op::GemmAr) {
            return Err(bad(format!(
                "{op} is not an operator call (ag-gemm, gemm-rs or gemm-ar)"
            )));
        }
        let p = Problem::new(op, m, k, n, self.world()).map_err(bad)?;
        self.decide(&p)
    }

    /// This rank's own `auto` candidate for `p` and the tuning entry it came
    /// from, if any (see [`Session::pick`]).
    fn local_pick(&mut self, p: &Problem) -> Result<(Schedule, Option<TuneEntry>)> {
        let entry = self.tuned_entry(p);
        let hw = HwProfile::builtin(SELECT_HW).map_err(bad)?;
        let first = match entry
            .as_ref()
            .and_then(|e| e.schedule.parse::<Schedule>().ok())
        {
            Some(s) => s,
            None => {
                select::select(p, &hw, Selector::Rules)
                    .map_err(bad)?
                    .schedule
            }
        };
        let s = runnable_pick(p, first, &hw, self.placement())?;
        // The entry's times describe its own winner's field, not a
        // replacement's.
        Ok((s, entry.filter(|_| s == first)))
    }

    /// The tuning cache's entry for `p` on this device and software, if any.
    fn tuned_entry(&mut self, p: &Problem) -> Option<TuneEntry> {
        let cache = self.cache.get_or_insert_with(|| {
            let path = tune::default_path();
            TuneCache::load(&path).0
        });
        let here = crate::info::device_and_software(p.gpus);
        match autotune::consult(
            cache,
            p,
            here.as_ref().map(|(d, s)| (d.as_str(), s.as_str())),
        ) {
            Advice::Hit(e) => Some(e),
            Advice::Miss(_) => None,
        }
    }

    fn placement(&self) -> Placement {
        Placement {
            loopback: self.loopback(),
            multi_node: !self.single_node(),
        }
    }

    /// Rank 0's `mine` on every rank (one store exchange, named by `what`
    /// and the session's exchange count).
    fn rank0_value(&mut self, what: &str, mine: Vec<u8>) -> Result<Vec<u8>> {
        self.calls += 1;
        let job = self.job()?;
        Ok(job.rv.broadcast(
            &format!("{what}/{}", self.calls),
            0,
            (job.rank() == 0).then_some(mine.as_slice()),
        )?)
    }
}

#[cfg(test)]
mod pick_tests {
    //! CPU: what `auto` may pick where the ranks are.
    use super::*;

    fn problems() -> Vec<Problem> {
        let mut out = vec![];
        for op in [Op::AgGemm, Op::GemmRs, Op::GemmAr] {
            for (m, k, n, gpus) in [
                (8192, 8192, 3584, 4),
                (2048, 4096, 1024, 2),
                (16384, 8192, 7168, 8),
                (512, 1024, 512, 4),
            ] {
                out.push(Problem::new(op, m, k, n, gpus).expect("problem"));
            }
        }
        out
    }

    fn hw() -> HwProfile {
        HwProfile::builtin(SELECT_HW).expect("profile")
    }

    #[test]
    fn loopback_picks_never_need_nccl_or_tile_gemms() {
        let at = Placement {
            loopback: true,
            multi_node: false,
        };
        for p in problems() {
            for first in select::candidates(&p) {
                let s = runnable_pick(&p, first, &hw(), at).expect("a pick");
                let plan = lower(&p, &s).expect("lowers");
                assert!(
                    s.is_seq() || runs_in_loopback(&plan),
                    "{} {}",
                    p.label(),
                    s.name()
                );
            }
        }
    }

    /// `auto` in a model never runs a tile GEMM that waits on flags (a call
    /// of it cannot be captured): such a tuned winner gives way to the
    /// fastest capturable schedule tuning measured, else to the rules' pick
    /// among them.
    #[test]
    fn model_picks_are_capturable() {
        let at = Placement {
            loopback: false,
            multi_node: false,
        };
        // ag-gemm's tile GEMM waits on the pushed rows: not capturable;
        // gemm-rs's waits on nothing: capturable.
        let rs = Problem::new(Op::GemmRs, 8192, 8192, 3584, 4).expect("problem");
        let rs_tile: Schedule = "tile-copy-ring".parse().expect("schedule");
        assert!(capturable(&rs, &rs_tile));
        let p = Problem::new(Op::AgGemm, 8192, 8192, 3584, 4).expect("problem");
        let tile: Schedule = "tile-copy-ring".parse().expect("schedule");
        assert!(!capturable(&p, &tile));
        let entry = TuneEntry {
            key: tune::TuneKey::new(&p, "4x GPU", "sw"),
            schedule: tile.name(),
            time_ms: 1.0,
            measured: vec![
                (tile.name(), 1.0),
                ("fine2-copy-all".into(), 1.3),
                ("shard-copy-ring".into(), 1.2),
                ("seq".into(), 2.0),
            ],
        };
        let s = capturable_pick(&p, tile, Some(&entry), &hw(), at).expect("a pick");
        assert_eq!(s.name(), "shard-copy-ring");
        let shard: Schedule = "shard-copy-ring".parse().expect("schedule");
        assert_eq!(
            capturable_pick(&p, shard, None, &hw(), at).expect("a pick"),
            shard
        );
        for p in problems() {
            for first in select::candidates(&p) {
                let s = capturable_pick(&p, first, None, &hw(), at).expect("a pick");
                assert!(capturable(&p, &s), "{} {}", p.label(), s.name());
            }
        }
    }

    #[test]
    fn picks_across_nodes_use_nccl_only() {
        let at = Placement {
            loopback: false,
            multi_node: true,
        };
        for p in problems() {
            for first in select::candidates(&p) {
                let s = runnable_pick(&p, first, &hw(), at).expect("a pick");
                let plan = lower(&p, &s).expect("lowers");
                assert!(!needs_one_node(&plan), "{} {}", p.label(), s.name());
            }
        }
    }

    #[test]
    fn a_runnable_first_choice_is_kept() {
        let at = Placement {
            loopback: false,
            multi_node: false,
        };
        for p in problems() {
            for first in select::candidates(&p) {
                assert_eq!(runnable_pick(&p, first, &hw(), at).expect("a pick"), first);
            }
        }
    }
}
