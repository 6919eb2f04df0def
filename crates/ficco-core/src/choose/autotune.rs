//! The tune algorithm and the tuning-cache policy ([`super::tune`] is the
//! cache file itself).
//!
//! Tuning measures a few candidates on a backend and keeps the fastest that
//! computed the right result: `seq`, the rule selector's pick, and the
//! top-K schedules by the simulator's prediction. A cache entry is used only
//! for the device and software versions it was measured on; entries that
//! cannot be checked (no GPU here to compare with) are ignored with a
//! warning, never trusted.

use crate::choose::select;
use crate::choose::tune::{Lookup, TuneCache, TuneEntry, TuneKey};
use crate::error::{Error, Result};
use crate::plan::lower;
use crate::problem::workload::Problem;
use crate::run::Backend;
use crate::sim::profile::HwProfile;
use crate::space::Schedule;

/// The schedules tuning measures: `seq`, the rule pick, then the best
/// predicted until `top` besides `seq` are chosen.
pub fn candidates(p: &Problem, hw: &HwProfile, top: usize) -> Result<Vec<Schedule>> {
    let mut ranked: Vec<(f64, Schedule)> = select::candidates(p)
        .into_iter()
        .filter(|s| !s.is_seq())
        .map(|s| Ok((select::predict_ms(p, &s, hw)?, s)))
        .collect::<Result<_>>()?;
    ranked.sort_by(|a, b| a.0.total_cmp(&b.0));
    let rules = select::select_rules(p, hw)?.schedule;
    let mut chosen = vec![Schedule::SEQ];
    if !rules.is_seq() {
        chosen.push(rules);
    }
    for (_, s) in ranked {
        if chosen.len() > top {
            break;
        }
        if !chosen.contains(&s) {
            chosen.push(s);
        }
    }
    Ok(chosen)
}

/// What tuning one problem found.
#[derive(Debug, Clone, PartialEq)]
pub struct Tuned {
    /// The fastest correct candidate and its time.
    pub best: String,
    pub time_ms: f64,
    /// Every candidate that ran correctly: (name, ms).
    pub measured: Vec<(String, f64)>,
    /// One line per candidate that failed or computed a wrong result.
    pub warnings: Vec<String>,
}

/// Measures [`candidates`] of `p` on `backend` and returns the fastest correct one.
pub fn tune(p: &Problem, hw: &HwProfile, top: usize, backend: &mut dyn Backend) -> Result<Tuned> {
    let chosen = candidates(p, hw, top)?;
    let seq_plan = lower::lower(p, &Schedule::SEQ)?;
    backend.prepare(&seq_plan).map_err(|e| {
        Error::Io(format!(
            "{} backend: preparing {}: {e}",
            backend.name(),
            p.label()
        ))
    })?;
    let mut measured = vec![];
    let mut warnings = vec![];
    for s in &chosen {
        let plan = lower::lower(p, s)?;
        match backend.measure(&plan, true, false) {
            Ok(x) if x.correct => measured.push((s.name(), x.time_ms)),
            Ok(_) => warnings.push(format!("{} gave a wrong result; not a candidate", s.name())),
            Err(e) => warnings.push(format!("{} failed: {e}", s.name())),
        }
    }
    let (best, time_ms) = measured
        .iter()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .cloned()
        .ok_or_else(|| Error::Io(format!("{}: no candidate could be measured", p.label())))?;
    Ok(Tuned {
        best,
        time_ms,
        measured,
        warnings,
    })
}

/// What the cache says about one problem here.
#[derive(Debug, Clone, PartialEq)]
pub enum Advice {
    /// A measured winner for this device and these software versions.
    Hit(TuneEntry),
    /// Nothing usable; warnings to print (stale or unverifiable entries).
    Miss(Vec<String>),
}

/// Consults `cache` for `p`. `here` is (device, software) of this machine,
/// or `None` when no GPU is visible: then entries for `p` cannot be checked
/// against the device and are ignored with a warning.
pub fn consult(cache: &TuneCache, p: &Problem, here: Option<(&str, &str)>) -> Advice {
    match here {
        Some((device, software)) => match cache.lookup(&TuneKey::new(p, device, software)) {
            Lookup::Hit(e) => Advice::Hit(e),
            Lookup::Stale(w) => Advice::Miss(vec![w]),
            Lookup::Miss => Advice::Miss(vec![]),
        },
        None => {
            let any = cache.entries.iter().any(|e| e.key.problem == *p);
            Advice::Miss(if any {
                vec![format!(
                    "ignoring tuning entries for {}: no GPU here to check that they match this device",
                    p.label()
                )]
            } else {
                vec![]
            })
        }
    }
}
