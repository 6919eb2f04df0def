//! The explore driver: one scenario, a list of schedules, a predictor and a
//! [`Backend`] in; a [`ScenarioReport`] out.
//!
//! The driver knows nothing of the simulator's or the GPU backend's
//! internals: the predictor is any `Fn(&Plan) -> Result<Timeline>` (the
//! simulator) and the backend any [`Backend`] (the simulator again, or the
//! GPUs). For each schedule it records why it was skipped (it does not fit
//! the shape, lowering or prediction failed), or its predicted time and the
//! backend's time and error.
//!
//! References: `seq` gives T_seq, `gemm-only` T_comp and `comm-only` T_comm.
//! `prepare` runs once with the seq plan; reference-only plans are run
//! unchecked, `seq` and every schedule checked.
//!
//! Clocks and power drift over a sweep: one plan timed twice minutes apart
//! differs by up to ~9% on H200 (measured under two names of one plan). So
//! the contenders, every schedule within [`CONTENDER_MARGIN`] of the
//! fastest, are timed again in [`ExploreOptions::retime_rounds`] rounds,
//! interleaved and in rotating order, after the sweep; the references (seq,
//! GEMM alone, collective alone) as many times again. Every one of them keeps
//! the fastest of its 1 + rounds medians: one estimator for all, so neither
//! the references nor the schedules are favoured. Names that lower to the
//! same plan are measured once.

use crate::choose::select;
use crate::error::{Error, Result};
use crate::plan::lower;
use crate::plan::validate;
use crate::plan::Plan;
use crate::problem::workload::{Op, Problem, Scenario};
use crate::report::{Reference, ScenarioReport, ScheduleResult};
use crate::run::timeline::Timeline;
use crate::run::{Backend, BackendError, Measured};
use crate::sim::profile::HwProfile;
use crate::space::{enumerate, Schedule, SpaceOptions};

/// How plans are made; [`Lowering::STANDARD`] is [`crate::plan::lower`]. Tests and
/// experiments can substitute hand-built plans.
#[derive(Debug, Clone, Copy)]
pub struct Lowering {
    pub lower: fn(&Problem, &Schedule) -> Result<Plan>,
    pub gemm_only: fn(&Problem) -> Plan,
    pub comm_only: fn(&Problem) -> Plan,
}

impl Lowering {
    pub const STANDARD: Lowering = Lowering {
        lower: lower::lower,
        gemm_only: lower::gemm_only,
        comm_only: lower::comm_only,
    };
}

impl Default for Lowering {
    fn default() -> Self {
        Lowering::STANDARD
    }
}

/// Options of [`explore`].
#[derive(Debug, Clone)]
pub struct ExploreOptions {
    /// Keep the timelines of seq and of the best schedule (for traces and SVGs).
    pub timelines: bool,
    pub lowering: Lowering,
    /// With a profile, `selected` is the pick of [`select::DEFAULT_SELECTOR`]
    /// (when that schedule ran); without one, the best by prediction.
    pub select_hw: Option<HwProfile>,
    /// With a measurer: rounds in which the contenders are timed again.
    pub retime_rounds: usize,
    /// The backend is the simulator the predictor is (one profile): its
    /// measurement of a plan is the prediction, so each plan is simulated
    /// once, not twice.
    pub measure_is_prediction: bool,
    /// Threads that lower, validate and predict the schedules (the backend
    /// still measures them one at a time, in order); 0 is one per core.
    pub threads: usize,
}

/// Schedules measured within this fraction of the fastest are re-timed.
pub const CONTENDER_MARGIN: f64 = 0.10;

impl Default for ExploreOptions {
    fn default() -> Self {
        ExploreOptions {
            timelines: false,
            lowering: Lowering::STANDARD,
            select_hw: None,
            retime_rounds: 2,
            measure_is_prediction: false,
            threads: 0,
        }
    }
}

/// A plan and its timeline (measured where there was a measurer, else predicted).
#[derive(Debug, Clone)]
pub struct PlanRun {
    pub plan: Plan,
    pub timeline: Timeline,
}

/// What [`explore`] found.
#[derive(Debug, Clone)]
pub struct Explored {
    pub report: ScenarioReport,
    /// The sequential reference, when timelines were asked for.
    pub seq: Option<PlanRun>,
    /// The best schedule, when timelines were asked for and one ran.
    pub best: Option<PlanRun>,
}

/// The schedules to explore for `op`: `seq` first, then either `only` (when
/// not empty) or the whole enumerated design space.
pub fn schedules_for(op: Op, space: SpaceOptions, only: &[Schedule]) -> Vec<Schedule> {
    if only.is_empty() {
        return enumerate(op, space);
    }
    let mut out = vec![Schedule::SEQ];
    for s in only {
        if !out.contains(s) {
            out.push(*s);
        }
    }
    out
}

/// Checks schedules named by the user against the design space of `op` on
/// a device (`space`): a name may differ from the enumerated ones in its
/// options, but every option must be one the device can run (see
/// [`Schedule::outside`]).
pub fn check_named(op: Op, space: SpaceOptions, named: &[Schedule]) -> Result<()> {
    for s in named {
        if let Some(reason) = s.outside(op, space) {
            return Err(Error::BadSchedule {
                name: s.name(),
                reason,
            });
        }
    }
    Ok(())
}

fn backend_err(backend: &str, what: &str, e: BackendError) -> Error {
    Error::Io(format!("{backend} backend: {what}: {e}"))
}

/// Times every valid schedule within [`CONTENDER_MARGIN`] of the fastest
/// `rounds` more times, interleaved (round r starts at contender r), and
/// sets each one's time, and its twins' (`same_plan_as`), to the fastest of
/// all its times (`seq` is re-timed with the references).
fn retime_contenders(
    m: &mut dyn Backend,
    rows: &mut [ScheduleResult],
    ran: &[Option<(Plan, Timeline, Option<Timeline>)>],
    rounds: usize,
) -> std::result::Result<(), BackendError> {
    let time = |r: &ScheduleResult| r.time_ms.filter(|_| r.is_valid());
    let Some(best) = rows.iter().filter_map(time).min_by(f64::total_cmp) else {
        return Ok(());
    };
    let contenders: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].name != "seq" && rows[i].same_plan_as.is_none())
        .filter(|&i| time(&rows[i]).is_some_and(|t| t <= best * (1.0 + CONTENDER_MARGIN)))
        .filter(|&i| ran.get(i).is_some_and(Option::is_some))
        .collect();
    if contenders.len() < 2 || rounds == 0 {
        return Ok(());
    }
    let mut times: Vec<Vec<f64>> = contenders
        .iter()
        .map(|&i| time(&rows[i]).into_iter().collect())
        .collect();
    // The range of every timed iteration of every round.
    let mut ranges: Vec<Option<(f64, f64)>> = contenders
        .iter()
        .map(|&i| rows[i].min_ms.zip(rows[i].max_ms))
        .collect();
    for round in 0..rounds {
        for j in 0..contenders.len() {
            let c = (round + j) % contenders.len();
            if let Some(Some((plan, _, _))) = ran.get(contenders[c]) {
                let got = m.measure(plan, false, false)?;
                times[c].push(got.time_ms);
                ranges[c] = match (ranges[c], got.range_ms) {
                    (Some(a), Some(b)) => Some((a.0.min(b.0), a.1.max(b.1))),
                    (a, b) => a.or(b),
                };
            }
        }
    }
    for (c, &i) in contenders.iter().enumerate() {
        let t = times[c].iter().copied().fold(f64::INFINITY, f64::min);
        let name = rows[i].name.clone();
        for row in rows.iter_mut() {
            if row.name == name || row.same_plan_as.as_deref() == Some(name.as_str()) {
                row.time_ms = Some(t);
                row.min_ms = ranges[c].map(|r| r.0);
                row.max_ms = ranges[c].map(|r| r.1);
            }
        }
    }
    Ok(())
}

/// A schedule lowered, validated and predicted, or why it was skipped.
struct Ready {
    /// The plan, unless nothing after the prediction needs it (see
    /// [`keeps_plans`]).
    plan: Option<Plan>,
    /// [`Plan::work_digest`], to find plans of the same work.
    digest: u64,
    pred: Timeline,
}

type Prepared = std::result::Result<Ready, String>;

/// Whether the plans are needed after their prediction: to measure them
/// (and re-time the contenders), or to draw the best's timeline. The
/// simulator's measurement is its prediction: without traces, a plan is
/// dropped once predicted, so memory holds a plan per thread, not the whole
/// design space's.
fn keeps_plans(opts: &ExploreOptions) -> bool {
    !opts.measure_is_prediction || opts.timelines
}

/// Lowers, validates and predicts one schedule (pure: any thread may).
fn prepare(
    problem: &Problem,
    schedule: &Schedule,
    predict: &(dyn Fn(&Plan) -> Result<Timeline> + Sync),
    opts: &ExploreOptions,
) -> Prepared {
    if let Some(reason) = schedule.misfit(problem) {
        return Err(reason);
    }
    let plan = (opts.lowering.lower)(problem, schedule)
        .and_then(|p| {
            validate::validate(&p)?;
            Ok(p)
        })
        .map_err(|e| match e {
            Error::DoesNotFit { reason, .. } => reason,
            e => format!("lowering failed: {e}"),
        })?;
    let mut pred = predict(&plan).map_err(|e| format!("prediction failed: {e}"))?;
    if !opts.timelines {
        // Predicted timelines are only kept for the trace of the best: at
        // large GPU counts each has tens of thousands of spans.
        pred.spans = Vec::new();
    }
    Ok(Ready {
        digest: plan.work_digest(),
        plan: keeps_plans(opts).then_some(plan),
        pred,
    })
}

/// [`prepare`] for every schedule but `seq`, spread over `opts.threads`
/// threads; in the order of `schedules` (`None` for `seq`).
fn prepare_all(
    problem: &Problem,
    schedules: &[Schedule],
    predict: &(dyn Fn(&Plan) -> Result<Timeline> + Sync),
    opts: &ExploreOptions,
) -> Vec<Option<Prepared>> {
    let threads = match opts.threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
    .min(schedules.len())
    .max(1);
    let one = |s: &Schedule| (!s.is_seq()).then(|| prepare(problem, s, predict, opts));
    if threads == 1 {
        return schedules.iter().map(one).collect();
    }
    // Schedules differ in cost by 100x: each thread takes the next one left,
    // the finest (the most tasks) first, so that no big one starts last.
    let mut by_cost: Vec<usize> = (0..schedules.len()).collect();
    by_cost.sort_by_key(|&i| {
        std::cmp::Reverse(match schedules[i].granularity {
            crate::space::Granularity::Fine(c) => c,
            crate::space::Granularity::Tile => 4,
            _ => 1,
        })
    });
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut done: Vec<(usize, Option<Prepared>)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = vec![];
                    loop {
                        let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(&i) = by_cost.get(k) else { break };
                        mine.push((i, one(&schedules[i])));
                    }
                    mine
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| match w.join() {
                Ok(v) => v,
                // A panic in a worker is a bug: raise it here.
                Err(e) => std::panic::resume_unwind(e),
            })
            .collect()
    });
    done.sort_by_key(|(i, _)| *i);
    done.into_iter().map(|(_, p)| p).collect()
}

/// Explores `schedules` on `scenario`; see the module doc.
pub fn explore(
    scenario: &Scenario,
    schedules: &[Schedule],
    predict: &(dyn Fn(&Plan) -> Result<Timeline> + Sync),
    backend: &mut dyn Backend,
    opts: &ExploreOptions,
) -> Result<Explored> {
    let problem = &scenario.problem;
    problem.validate()?;
    let low = opts.lowering;
    let seq_plan = (low.lower)(problem, &Schedule::SEQ)?;
    let gemm_plan = (low.gemm_only)(problem);
    let comm_plan = (low.comm_only)(problem);
    let seq_pred = predict(&seq_plan)?;

    let name = backend.name().to_string();
    let hardware = backend.device();
    let err = |what: &'static str| {
        let name = name.clone();
        move |e: BackendError| backend_err(&name, what, e)
    };
    backend
        .prepare(&seq_plan)
        .map_err(err("preparing inputs"))?;
    let seq_run = backend
        .measure(&seq_plan, true, opts.timelines)
        .map_err(err("measuring seq"))?;
    let comp = backend
        .measure(&gemm_plan, false, false)
        .map_err(err("measuring gemm-only"))?;
    let comm = backend
        .measure(&comm_plan, false, false)
        .map_err(err("measuring comm-only"))?;
    let reference = Reference::new(seq_run.time_ms, comp.time_ms, comm.time_ms);

    let mut report = ScenarioReport::new(scenario, &name, &hardware, reference);
    // Plans and predicted timelines of the rows that ran, by row index
    // (where the plans are kept), and the digests of their work.
    let mut ran: Vec<Option<(Plan, Timeline, Option<Timeline>)>> = vec![];
    let mut digests: Vec<Option<u64>> = vec![];
    let prepared = prepare_all(problem, schedules, predict, opts);
    for (schedule, prep) in schedules.iter().zip(prepared) {
        let sname = schedule.name();
        let Some(prep) = prep else {
            // seq: measured above with the references.
            report.schedules.push(ScheduleResult {
                min_ms: seq_run.range_ms.map(|r| r.0),
                max_ms: seq_run.range_ms.map(|r| r.1),
                ..ScheduleResult::ran(
                    sname,
                    seq_run.time_ms,
                    seq_pred.total_ms,
                    seq_run.max_rel_err,
                    !seq_run.correct,
                )
            });
            ran.push(Some((
                seq_plan.clone(),
                seq_pred.clone(),
                seq_run.timeline.clone(),
            )));
            digests.push(Some(seq_plan.work_digest()));
            continue;
        };
        let Ready { plan, digest, pred } = match prep {
            Ok(p) => p,
            Err(reason) => {
                report
                    .schedules
                    .push(ScheduleResult::skipped(sname, reason));
                ran.push(None);
                digests.push(None);
                continue;
            }
        };
        // Names that lower to one plan (e.g. `shard`/`bulk` and `ring`/`all`
        // with a single peer) are one schedule: measure it once, so run-to-run
        // noise cannot rank a plan against itself. Where both plans are kept
        // they are compared in full; else their digests are.
        let twin = (0..digests.len()).find(|&i| {
            digests[i] == Some(digest)
                && match (&ran[i], &plan) {
                    (Some((p, _, _)), Some(plan)) => p.same_work(plan),
                    _ => true,
                }
        });
        // (A plan not kept is one whose measurement is its prediction.)
        let mut measure = |plan: Option<&Plan>| match plan {
            Some(plan) if !opts.measure_is_prediction => backend.measure(plan, true, false),
            _ => Ok(Measured {
                time_ms: pred.total_ms,
                max_rel_err: None,
                correct: true,
                timeline: None,
                launch_us: None,
                range_ms: None,
            }),
        };
        let row = match twin {
            Some(i) => {
                let first = &report.schedules[i];
                ScheduleResult {
                    name: sname.clone(),
                    same_plan_as: Some(first.same_plan_as.clone().unwrap_or(first.name.clone())),
                    ..first.clone()
                }
            }
            None => match measure(plan.as_ref()) {
                Ok(Measured {
                    time_ms,
                    max_rel_err,
                    correct,
                    launch_us,
                    range_ms,
                    ..
                }) => ScheduleResult {
                    launch_us,
                    min_ms: range_ms.map(|r| r.0),
                    max_ms: range_ms.map(|r| r.1),
                    ..ScheduleResult::ran(&sname, time_ms, pred.total_ms, max_rel_err, !correct)
                },
                Err(e) => match crate::run::skip_reason(&e) {
                    Some(reason) => ScheduleResult::skipped(&sname, reason.to_string()),
                    None => ScheduleResult::skipped(&sname, format!("measurement failed: {e}")),
                },
            },
        };
        let ok = row.skipped.is_none();
        report.schedules.push(row);
        ran.push(plan.filter(|_| ok).map(|p| (p, pred, None)));
        digests.push(ok.then_some(digest));
    }
    if !backend.deterministic() {
        retime_contenders(backend, &mut report.schedules, &ran, opts.retime_rounds)
            .map_err(err("re-timing the contenders"))?;
        // The references again, as often as the contenders (module doc):
        // each keeps the fastest of its medians.
        let mut again = |plan: &Plan, what: &'static str| {
            let mut best = f64::INFINITY;
            for _ in 0..opts.retime_rounds.max(1) {
                let t = backend.measure(plan, false, false).map_err(err(what))?;
                best = best.min(t.time_ms);
            }
            Ok::<f64, Error>(best)
        };
        let seq = again(&seq_plan, "re-measuring seq")?;
        let comp = again(&gemm_plan, "re-measuring gemm-only")?;
        let comm = again(&comm_plan, "re-measuring comm-only")?;
        let r = report.reference;
        report.reference = Reference::new(
            r.sequential_ms.min(seq),
            r.compute_ms.min(comp),
            r.comm_ms.min(comm),
        );
        if let Some(row) = report.schedules.iter_mut().find(|x| x.name == "seq") {
            row.time_ms = Some(report.reference.sequential_ms);
        }
    }
    report.finish();
    if let Some(hw) = &opts.select_hw {
        // The rules are for the dependent operators; `concurrent` is chosen
        // by the model over its controls.
        let selector = if problem.op == Op::Concurrent {
            select::Selector::Model
        } else {
            select::DEFAULT_SELECTOR
        };
        if let Ok(sel) = select::select(problem, hw, selector) {
            let name = sel.schedule.name();
            if !report.set_selection(&name, sel.selector.name()) {
                // Say so rather than switch selectors silently.
                report.selection_note = Some(format!(
                    "the {} selector picks {name}, which did not run here; \
                     selected is the best predicted of the schedules that ran",
                    sel.selector.name()
                ));
            }
        }
    }

    let mut explored = Explored {
        report,
        seq: None,
        best: None,
    };
    if opts.timelines {
        explored.seq = Some(PlanRun {
            plan: seq_plan,
            timeline: seq_run.timeline.unwrap_or_else(|| seq_pred.clone()),
        });
        let best_idx = explored
            .report
            .best
            .as_ref()
            .and_then(|b| explored.report.schedules.iter().position(|r| &r.name == b));
        if let Some((plan, pred, measured_tl)) = best_idx.and_then(|i| ran[i].take()) {
            // Run the best once more with a per-task timeline.
            let measured_tl = match measured_tl {
                Some(t) => Some(t),
                // The prediction is the measurement: `pred` is it.
                None if opts.measure_is_prediction => None,
                None => {
                    backend
                        .measure(&plan, false, true)
                        .map_err(err("recording the best timeline"))?
                        .timeline
                }
            };
            explored.best = Some(PlanRun {
                plan,
                timeline: measured_tl.unwrap_or(pred),
            });
        }
    }
    Ok(explored)
}
