//! `ficco soak`: runs every schedule of the default design space, plus the
//! `-hi` and `-2s` variants of every `tile` and `copy-all` schedule, on a
//! model's layers at several token counts, with CUDA graphs on and off, each
//! on fresh data checked against the sequential reference, many iterations
//! each, so that a rare hang or a wrong result shows. Prints one line per
//! run (and JSON lines to `--out`), then the counts: runs, hangs (watchdog
//! aborts), wrong results, other errors. Exit status 1 when any run hung,
//! was wrong or failed.

use crate::output::one_line;
use anyhow::{anyhow, bail, Result};
use clap::Args;
use ficco_core::plan::lower::lower;
use ficco_core::problem::models::preset;
use ficco_core::space::{enumerate, Engine, Granularity, Order, Priority, Schedule, SpaceOptions};
use ficco_cuda::{CudaError, GpuBackend, MeasureConfig};
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Args, Debug)]
pub struct SoakArgs {
    #[command(flatten)]
    pub verbose: crate::args::VerboseArg,
    /// Number of GPUs (ranks), one process driving them all.
    #[arg(long)]
    gpus: i64,
    /// Model presets whose layers are run (comma-separated).
    #[arg(long, default_value = "llama3-8b,llama3-70b", value_delimiter = ',')]
    models: Vec<String>,
    /// Token counts (comma-separated).
    #[arg(long, default_value = "2048,16384", value_delimiter = ',')]
    tokens: Vec<i64>,
    /// Timed iterations per run (after the checked run and the warm-up).
    #[arg(long, default_value_t = 20)]
    iters: i64,
    /// Untimed iterations per run before the timed ones.
    #[arg(long, default_value_t = 2)]
    warmup: i64,
    /// Graph modes to run each schedule in: both, on or off.
    #[arg(long, default_value = "both")]
    graphs: String,
    /// Stop starting new runs after this many seconds (the counts say how
    /// many of the planned runs were made).
    #[arg(long, value_name = "SECONDS")]
    time_limit: Option<u64>,
    /// Only schedules whose name contains one of these (comma-separated).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Write one JSON object per run to this file.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Print each run's phases to stderr as they start, with the seconds
    /// since the soak began (to find where a process stalls).
    #[arg(long)]
    trace: bool,
}

/// The default space of `op` plus the `-hi` and `-2s` variants of its
/// `tile` and `copy-all` schedules, each name once.
fn soak_schedules(op: ficco_core::problem::workload::Op) -> Vec<Schedule> {
    let mut out: Vec<Schedule> = vec![];
    let base = enumerate(op, SpaceOptions::default());
    let add = |s: Schedule, out: &mut Vec<Schedule>| {
        if s.applies_to(op) && !out.contains(&s) {
            out.push(s);
        }
    };
    for s in &base {
        add(*s, &mut out);
    }
    for s in &base {
        let stressed = s.granularity == Granularity::Tile
            || (s.engine == Engine::Copy && s.order == Order::All);
        if !stressed || s.is_seq() {
            continue;
        }
        add(s.with_comm_priority(Priority::High), &mut out);
        if s.granularity != Granularity::Tile {
            let two = s.with_compute_streams(2);
            add(two, &mut out);
            add(two.with_comm_priority(Priority::High), &mut out);
        }
    }
    out
}

#[derive(Default)]
struct Counts {
    runs: usize,
    ok: usize,
    hangs: usize,
    wrong: usize,
    errors: usize,
    skipped: usize,
}

pub fn run(args: SoakArgs) -> Result<()> {
    let gpus = crate::args::gpu_count(args.gpus)?;
    let iters = crate::args::positive("--iters", args.iters)?;
    let warmup = usize::try_from(args.warmup)
        .map_err(|_| anyhow!("--warmup must be 0 or more, got {}", args.warmup))?;
    let modes: Vec<bool> = match args.graphs.as_str() {
        "both" => vec![true, false],
        "on" => vec![true],
        "off" => vec![false],
        other => bail!("--graphs must be both, on or off, got '{other}'"),
    };
    let mut scenarios = vec![];
    for m in &args.models {
        let spec = preset(m)?;
        for &t in &args.tokens {
            let t = crate::args::positive("--tokens", t)?;
            scenarios.extend(spec.scenarios(t, gpus)?);
        }
    }
    let mut out = match &args.out {
        Some(p) => Some(
            std::fs::File::create(p).map_err(|e| anyhow!("cannot write {}: {e}", p.display()))?,
        ),
        None => None,
    };
    let mut gpu = GpuBackend::open(gpus).map_err(|e| {
        anyhow!(
            "soak runs on GPUs and none is usable: {}",
            super::gpu_reason(&e)
        )
    })?;
    gpu.config = MeasureConfig {
        warmup,
        iters,
        ..MeasureConfig::default()
    };
    let started = Instant::now();
    // The schedules of each scenario, filtered by --only, listed once.
    let wanted = |s: &Schedule| {
        args.only.is_empty() || args.only.iter().any(|o| s.name().contains(o.as_str()))
    };
    let lists: Vec<Vec<Schedule>> = scenarios
        .iter()
        .map(|sc| {
            soak_schedules(sc.problem.op)
                .into_iter()
                .filter(wanted)
                .collect()
        })
        .collect();
    let planned: usize = lists.iter().map(|l| l.len() * modes.len()).sum();
    println!(
        "# soak on {} ({} scenarios, {planned} runs planned: every run is 1 checked + {warmup} warm-up + {iters} timed iterations; watchdog {} ms)",
        ficco_core::run::Backend::device(&gpu),
        scenarios.len(),
        gpu.run_opts.watchdog_ms
    );
    println!(
        "# {:<30} {:<26} {:>6} {:>10}  result",
        "scenario", "schedule", "graphs", "ms"
    );
    let mut c = Counts::default();
    let mut failures = vec![];
    'all: for (sc, list) in scenarios.iter().zip(&lists) {
        let seq = lower(&sc.problem, &Schedule::SEQ)?;
        for &s in list {
            let plan = match lower(&sc.problem, &s) {
                Ok(p) => p,
                Err(e) => {
                    c.skipped += modes.len();
                    println!(
                        "  {:<30} {:<26} {:>6} {:>10}  skipped: {}",
                        sc.name,
                        s.name(),
                        "-",
                        "-",
                        one_line(&e.to_string())
                    );
                    continue;
                }
            };
            for &graphs in &modes {
                if args
                    .time_limit
                    .is_some_and(|l| started.elapsed().as_secs() >= l)
                {
                    println!(
                        "# time limit reached: stopped before {} {}",
                        sc.name,
                        s.name()
                    );
                    break 'all;
                }
                // Fresh inputs for every run (the seed advances per prepare); the
                // checked run also poisons the outputs first.
                let trace = |phase: &str| {
                    if args.trace {
                        eprintln!(
                            "soak {:8.2}s {} {} graphs={graphs}: {phase}",
                            started.elapsed().as_secs_f64(),
                            sc.name,
                            s.name()
                        );
                    }
                };
                trace("prepare");
                if let Err(e) = gpu.prepare_plan(&seq) {
                    bail!(
                        "{}: preparing inputs failed: {}",
                        sc.name,
                        one_line(&e.to_string())
                    );
                }
                gpu.run_opts.graphs = graphs;
                let t0 = Instant::now();
                trace("measure");
                let res = gpu.measure_plan(&plan, true, false);
                let wall = t0.elapsed().as_secs_f64();
                trace("done");
                let graphed = gpu.last_graphed.unwrap_or(false);
                let (result, ms, rel) = match &res {
                    Ok(m) if m.correct => {
                        c.ok += 1;
                        ("ok".to_string(), Some(m.time_ms), m.max_rel_err)
                    }
                    Ok(m) => {
                        c.wrong += 1;
                        (
                            format!("WRONG (rel_err {:?})", m.max_rel_err),
                            Some(m.time_ms),
                            m.max_rel_err,
                        )
                    }
                    Err(CudaError::Skipped(why)) => {
                        c.skipped += 1;
                        (format!("skipped: {why}"), None, None)
                    }
                    Err(e @ CudaError::Hang { .. }) => {
                        c.hangs += 1;
                        (format!("HANG: {}", one_line(&e.to_string())), None, None)
                    }
                    Err(e) => {
                        c.errors += 1;
                        (format!("ERROR: {}", one_line(&e.to_string())), None, None)
                    }
                };
                if !matches!(res, Err(CudaError::Skipped(_))) {
                    c.runs += 1;
                }
                if result != "ok" && !result.starts_with("skipped") {
                    failures.push(format!(
                        "{} {} graphs={graphs}: {result}",
                        sc.name,
                        s.name()
                    ));
                }
                let mode = if !graphs {
                    "off"
                } else if graphed {
                    "on"
                } else {
                    "direct"
                };
                println!(
                    "  {:<30} {:<26} {:>6} {:>10}  {result}",
                    sc.name,
                    s.name(),
                    mode,
                    ms.map_or("-".into(), |t| format!("{t:.4}"))
                );
                if let Some(f) = out.as_mut() {
                    let line = json!({
                        "scenario": sc.name, "schedule": s.name(), "gpus": gpus,
                        "graphs_asked": graphs, "graphed": graphed, "time_ms": ms,
                        "max_rel_err": rel, "result": result, "wall_s": wall,
                    });
                    writeln!(f, "{line}").map_err(|e| anyhow!("cannot write --out: {e}"))?;
                    f.flush().map_err(|e| anyhow!("cannot write --out: {e}"))?;
                }
                std::io::stdout().flush().ok();
            }
        }
    }
    println!(
        "# soak P={gpus}: {} runs ({planned} planned), {} ok, {} hangs, {} wrong, {} errors, {} skipped, {:.0} s",
        c.runs,
        c.ok,
        c.hangs,
        c.wrong,
        c.errors,
        c.skipped,
        started.elapsed().as_secs_f64()
    );
    for f in &failures {
        println!("# FAILED: {f}");
    }
    if !failures.is_empty() {
        bail!(
            "{} of {} runs hung, were wrong or failed",
            failures.len(),
            c.runs
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ficco_core::problem::workload::Op;

    /// The soak space is the default space plus `-hi` of every tile and
    /// copy-all schedule and `-2s` (and `-2s-hi`) of every copy-all one.
    #[test]
    fn soak_space_adds_hi_and_2s_variants() {
        for op in [Op::AgGemm, Op::GemmRs, Op::GemmAr] {
            let s: Vec<String> = soak_schedules(op).iter().map(|s| s.name()).collect();
            let base = enumerate(op, SpaceOptions::default());
            assert!(base.iter().all(|b| s.contains(&b.name())), "{op:?}");
            for want in [
                "tile-copy-all-hi",
                "tile-copy-ring-hi",
                "shard-copy-all-2s-hi",
                "fine8-copy-all-hi",
            ] {
                assert!(s.contains(&want.to_string()), "{op:?} lacks {want}: {s:?}");
            }
            let mut uniq = s.clone();
            uniq.sort();
            uniq.dedup();
            assert_eq!(uniq.len(), s.len(), "a schedule twice");
            eprintln!("{op:?}: {} schedules", s.len());
        }
    }
}
