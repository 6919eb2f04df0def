//! `ficco select`: a schedule without measuring: the tuning cache's measured
//! winner when it applies here, else the rule or model selector.

use crate::args::{load_hw, ProblemArgs, DEFAULT_HW};
use crate::output::print;
use anyhow::Result;
use clap::Args;
use ficco_core::choose::autotune::{self, Advice};
use ficco_core::choose::select::{self, Selector, DEFAULT_SELECTOR};
use ficco_core::choose::tune::{self, TuneCache};
use ficco_core::space::Schedule;
use serde_json::json;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct SelectArgs {
    #[command(flatten)]
    problem: ProblemArgs,
    /// Hardware profile: a built-in name or a TOML path.
    #[arg(long, default_value = DEFAULT_HW)]
    hw: String,
    /// Which selector: rules (the default, better on held-out measurements) or model.
    #[arg(long)]
    selector: Option<String>,
    /// Tuning cache consulted first (default: $XDG_CACHE_HOME/ficco/tune.json).
    #[arg(long, value_name = "FILE")]
    cache: Option<PathBuf>,
    /// Ignore the tuning cache.
    #[arg(long)]
    no_cache: bool,
    /// Print JSON instead of the lines.
    #[arg(long)]
    json: bool,
}

pub fn run(args: SelectArgs) -> Result<()> {
    let selector: Selector = match &args.selector {
        Some(s) => s.parse()?,
        None => DEFAULT_SELECTOR,
    };
    let problems = args.problem.problems()?;
    let hw = load_hw(&args.hw)?;
    for (_, p) in &problems {
        hw.check_fits(p)?;
    }
    let cache = if args.no_cache {
        None
    } else {
        let path = args.cache.clone().unwrap_or_else(tune::default_path);
        let (c, warn) = TuneCache::load(&path);
        if let Some(w) = warn {
            eprintln!("ficco: warning: {w}");
        }
        (!c.entries.is_empty()).then_some(c)
    };
    let mut out = vec![];
    let mut text = String::new();
    for (name, p) in &problems {
        let mut hit = None;
        if let Some(c) = &cache {
            let here = ficco_cuda::info::device_and_software(p.gpus);
            match autotune::consult(c, p, here.as_ref().map(|(d, s)| (d.as_str(), s.as_str()))) {
                Advice::Hit(e) => hit = Some(e),
                Advice::Miss(warnings) => {
                    for w in warnings {
                        eprintln!("ficco: warning: {w}");
                    }
                }
            }
        }
        let (schedule, source, predicted, reason) = match hit {
            Some(e) => {
                let s: Schedule = e.schedule.parse()?;
                let pred = select::predict_ms(p, &s, &hw)?;
                let why = format!(
                    "measured winner in the tuning cache ({:.4} ms on {})",
                    e.time_ms, e.key.device
                );
                (e.schedule, "cache".to_string(), pred, why)
            }
            None => {
                let s = select::select(p, &hw, selector)?;
                (
                    s.schedule.name(),
                    selector.name().to_string(),
                    s.predicted_ms,
                    s.reason,
                )
            }
        };
        text += &format!("{name}: {schedule}  ({source}; predicted {predicted:.4} ms; {reason})\n");
        out.push(json!({
            "scenario": name, "op": p.op, "m": p.m, "k": p.k, "n": p.n, "gpus": p.gpus,
            "schedule": schedule, "selector": source, "predicted_ms": predicted, "reason": reason,
            "hardware": hw.name,
        }));
    }
    if args.json {
        let v = if out.len() == 1 {
            out.pop().unwrap()
        } else {
            json!({ "selections": out })
        };
        print(&(serde_json::to_string_pretty(&v)? + "\n"))
    } else {
        print(&text)
    }
}
