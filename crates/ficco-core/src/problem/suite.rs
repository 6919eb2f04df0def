//! Suite files: TOML lists of named scenarios, as in `suites/llama3.toml`.
//!
//! ```toml
//! [[scenario]]
//! name = "llama3-8b.qkv.t2048.p2"
//! op = "ag-gemm"
//! m = 2048
//! k = 4096
//! n = 3072
//! gpus = 2
//! ```
//!
//! Expert-parallel scenarios (`a2a-gemm`, `gemm-a2a`) are `[[scenario]]`
//! entries whose `m` is the token count, with the routing's `experts` and
//! `top_k`, and optionally `skew` (`"none"`, `"moderate"`, `"heavy"` or a
//! Zipf exponent; default none) and `seed` (default 1):
//!
//! ```toml
//! [[scenario]]
//! name = "mixtral-8x7b.moe_up.t4096.p2.heavy"
//! op = "a2a-gemm"
//! m = 4096
//! k = 4096
//! n = 28672
//! gpus = 2
//! experts = 8
//! top_k = 2
//! skew = "heavy"
//! ```
//!
//! `[[concurrent]]` entries (independent GEMMs beside a collective) load as
//! `concurrent` scenarios:
//!
//! ```toml
//! [[concurrent]]
//! name = "dp.balanced.p4"
//! gemms = 4
//! m = 4096
//! k = 4096
//! n = 4096
//! collective = "all-reduce"
//! bytes = 268435456
//! gpus = 4
//! ```
//!
//! A `[[scenario]]` whose `op` is not an operator of this version is
//! returned as a [`Skipped`] entry with a reason, so that a newer suite still
//! runs what it can; an `op` within two edits of a known one is a typo and
//! an error that names the operator meant. A file that cannot be read or is not a valid suite is an
//! [`Error::Suite`] naming the file and the problem.

use crate::error::{Error, Result, OP_NAMES};
use crate::problem::routing::{MoeSpec, Skew, DEFAULT_SEED};
use crate::problem::workload::{Op, Problem, Scenario};
use serde::{Deserialize, Serialize};
use std::collections::HashSet;
use std::path::Path;

/// A suite entry that was not loaded, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    /// The table it came from, e.g. "concurrent" or "scenario".
    pub kind: String,
    /// Its `name`, or "#i" (index in its table) when it has none.
    pub name: String,
    pub reason: String,
}

/// The scenarios of one suite file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Suite {
    /// Where it was read from (for messages).
    pub origin: String,
    pub scenarios: Vec<Scenario>,
    pub skipped: Vec<Skipped>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    name: String,
    op: String,
    m: i64,
    k: i64,
    n: i64,
    gpus: i64,
    /// a2a-gemm / gemm-a2a: the routing.
    experts: Option<i64>,
    top_k: Option<i64>,
    skew: Option<Skew>,
    seed: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConcurrent {
    name: String,
    gemms: i64,
    m: i64,
    k: i64,
    n: i64,
    collective: String,
    bytes: i64,
    gpus: i64,
}

/// Reads a suite file.
pub fn load(path: &Path) -> Result<Suite> {
    let origin = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Suite(format!("cannot read '{origin}': {e}")))?;
    parse(&text, &origin)
}

/// Parses suite text; `origin` names it in errors.
pub fn parse(text: &str, origin: &str) -> Result<Suite> {
    let bad = |msg: String| Error::Suite(format!("'{origin}': {msg}"));
    let doc: toml::Table = toml::from_str(text).map_err(|e| {
        // toml's message spans several lines (it quotes the source); keep one.
        bad(format!(
            "not valid TOML: {}",
            crate::error::toml_error(text, &e)
        ))
    })?;
    let mut suite = Suite {
        origin: origin.to_string(),
        scenarios: vec![],
        skipped: vec![],
    };
    let mut names = HashSet::new();
    for (key, value) in &doc {
        let Some(entries) = value.as_array() else {
            return Err(bad(format!(
                "top-level key '{key}' is not an array of tables ([[{key}]])"
            )));
        };
        for (i, entry) in entries.iter().enumerate() {
            let Some(table) = entry.as_table() else {
                return Err(bad(format!("entry {i} of '{key}' is not a table")));
            };
            let name = table
                .get("name")
                .and_then(|v| v.as_str())
                .map(str::to_string)
                .unwrap_or_else(|| format!("#{i}"));
            let dim = |what: &str, v: i64| -> Result<usize> {
                usize::try_from(v)
                    .ok()
                    .filter(|&v| v > 0)
                    .ok_or_else(|| bad(format!("{key} '{name}': {what} must be positive, got {v}")))
            };
            if key == "concurrent" {
                let raw: RawConcurrent =
                    entry.clone().try_into().map_err(|e: toml::de::Error| {
                        bad(format!("concurrent '{name}': {}", one_line(&e)))
                    })?;
                let problem = raw
                    .collective
                    .parse()
                    .and_then(|c| {
                        Problem::concurrent(
                            dim("gemms", raw.gemms)?,
                            dim("m", raw.m)?,
                            dim("k", raw.k)?,
                            dim("n", raw.n)?,
                            c,
                            dim("bytes", raw.bytes)?,
                            dim("gpus", raw.gpus)?,
                        )
                    })
                    .map_err(|e| match e {
                        Error::Suite(_) => e,
                        e => bad(format!("concurrent '{name}': {e}")),
                    })?;
                if !names.insert(raw.name.clone()) {
                    return Err(bad(format!("scenario name '{}' appears twice", raw.name)));
                }
                suite.scenarios.push(Scenario {
                    name: raw.name,
                    problem,
                });
                continue;
            }
            if key != "scenario" {
                return Err(bad(format!(
                    "unknown table [[{key}]] (entry '{name}'): a suite has [[scenario]] and [[concurrent]] entries{}",
                    crate::suggest::did_you_mean(key, ["scenario", "concurrent"])
                )));
            }
            if let Some(op) = table.get("op").and_then(|v| v.as_str()) {
                if op.parse::<Op>().is_err() {
                    // A near miss of a known name is a typo, not an
                    // operator of a newer ficco.
                    if crate::suggest::closest(op, OP_NAMES).is_some() {
                        return Err(bad(format!(
                            "scenario '{name}': {}",
                            Error::UnknownOp(op.to_string())
                        )));
                    }
                    suite.skipped.push(Skipped {
                        kind: key.clone(),
                        name,
                        reason: format!(
                            "operator '{op}' is not one this version of ficco knows ({})",
                            OP_NAMES.join(", ")
                        ),
                    });
                    continue;
                }
            }
            let raw: RawScenario = entry.clone().try_into().map_err(|e: toml::de::Error| {
                bad(format!("scenario '{name}': {}", one_line(&e)))
            })?;
            let op: Op = raw.op.parse()?;
            let routed = raw.experts.is_some()
                || raw.top_k.is_some()
                || raw.skew.is_some()
                || raw.seed.is_some();
            let problem = if op.is_moe() {
                let (Some(experts), Some(top_k)) = (raw.experts, raw.top_k) else {
                    return Err(bad(format!(
                        "scenario '{name}': {op} needs experts and top_k"
                    )));
                };
                let spec = MoeSpec::new(
                    dim("experts", experts)?,
                    dim("top_k", top_k)?,
                    raw.skew.unwrap_or(Skew::NONE),
                    raw.seed.unwrap_or(DEFAULT_SEED),
                );
                Problem::moe(
                    op,
                    dim("m", raw.m)?,
                    dim("k", raw.k)?,
                    dim("n", raw.n)?,
                    dim("gpus", raw.gpus)?,
                    spec,
                )
            } else if routed {
                Err(Error::Shape(format!(
                    "experts, top_k, skew and seed belong to a2a-gemm and gemm-a2a, not {op}"
                )))
            } else {
                Problem::new(
                    op,
                    dim("m", raw.m)?,
                    dim("k", raw.k)?,
                    dim("n", raw.n)?,
                    dim("gpus", raw.gpus)?,
                )
            }
            .map_err(|e| bad(format!("scenario '{name}': {e}")))?;
            if !names.insert(raw.name.clone()) {
                return Err(bad(format!("scenario name '{}' appears twice", raw.name)));
            }
            suite.scenarios.push(Scenario {
                name: raw.name,
                problem,
            });
        }
    }
    if suite.scenarios.is_empty() && suite.skipped.is_empty() {
        return Err(bad("no [[scenario]] entries".into()));
    }
    Ok(suite)
}

fn one_line(e: &toml::de::Error) -> String {
    e.message().lines().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_repo_suite() {
        let suite = load(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../suites/llama3.toml"
        )))
        .unwrap();
        assert_eq!(suite.scenarios.len(), 60);
        assert!(suite.skipped.is_empty());
        let conc = load(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../suites/concurrent.toml"
        )))
        .unwrap();
        assert_eq!(conc.scenarios.len(), 5);
        assert_eq!(conc.scenarios[0].name, "dp.balanced.p4");
        assert_eq!(
            conc.scenarios[0].problem,
            Problem::concurrent(
                4,
                4096,
                4096,
                4096,
                crate::problem::workload::Collective::AllReduce,
                268435456,
                4
            )
            .unwrap()
        );
        let first = &suite.scenarios[0];
        assert_eq!(first.name, "llama3-8b.qkv.t2048.p2");
        assert_eq!(
            first.problem,
            Problem::new(Op::AgGemm, 2048, 4096, 3072, 2).unwrap()
        );
    }

    #[test]
    fn unknown_ops_are_skipped_not_errors() {
        let s = parse(
            "[[scenario]]\nname='x'\nop='moe-fused'\nm=8\nk=8\nn=8\ngpus=2\nimbalance=0.3\n\
             [[scenario]]\nname='y'\nop='gemm-rs'\nm=8\nk=8\nn=8\ngpus=2\n",
            "t",
        )
        .unwrap();
        assert_eq!(s.scenarios.len(), 1);
        assert_eq!(s.skipped[0].name, "x");
        assert!(s.skipped[0].reason.contains("moe-fused"));
        assert!(!s.skipped[0].reason.contains("not supported yet"));
    }

    #[test]
    fn a_mistyped_op_is_an_error_naming_the_op_meant() {
        let e = parse(
            "[[scenario]]\nname='x'\nop='ag-gemmm'\nm=8\nk=8\nn=8\ngpus=2\n",
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("scenario 'x': unknown operator 'ag-gemmm'"),
            "{e}"
        );
        assert!(e.contains("did you mean 'ag-gemm'?"), "{e}");
    }

    #[test]
    fn moe_scenarios_and_their_errors() {
        let s = parse(
            "[[scenario]]\nname='x'\nop='a2a-gemm'\nm=64\nk=8\nn=8\ngpus=2\nexperts=4\ntop_k=2\nskew='heavy'\nseed=7\n\
             [[scenario]]\nname='y'\nop='gemm-a2a'\nm=64\nk=8\nn=8\ngpus=2\nexperts=4\ntop_k=1\nskew=0.8\n",
            "t",
        )
        .unwrap();
        let spec = s.scenarios[0].problem.moe.unwrap();
        assert_eq!(
            (spec.experts, spec.top_k, spec.skew, spec.seed),
            (4, 2, Skew::HEAVY, 7)
        );
        let y = s.scenarios[1].problem.moe.unwrap();
        assert_eq!((y.skew.value(), y.seed), (0.8, DEFAULT_SEED));
        let base = "[[scenario]]\nname='x'\nop='a2a-gemm'\nm=64\nk=8\nn=8\ngpus=2\n";
        for (extra, want) in [
            ("experts=4\n", "needs experts and top_k"),
            (
                "experts=4\ntop_k=5\n",
                "top-k must be between 1 and the expert count 4",
            ),
            ("experts=3\ntop_k=1\n", "not a multiple of the GPU count"),
            ("experts=4\ntop_k=1\nskew=-1\n", "skew must be"),
            ("experts=4\ntop_k=1\nskew='wild'\n", "skew must be"),
        ] {
            let err = parse(&format!("{base}{extra}"), "moe.toml")
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("moe.toml") && err.contains(want),
                "{extra:?}: {err}"
            );
        }
        let err = parse(
            "[[scenario]]\nname='x'\nop='ag-gemm'\nm=64\nk=8\nn=8\ngpus=2\nexperts=4\n",
            "t",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("belong to a2a-gemm"), "{err}");
    }

    #[test]
    fn reads_the_moe_suite() {
        let suite = load(Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../suites/moe.toml"
        )))
        .unwrap();
        assert!(suite.skipped.is_empty());
        assert_eq!(suite.scenarios.len(), 72);
        for sc in &suite.scenarios {
            // MODEL.LAYER.tT.pP.SKEW: the preset expansion gives the same problem.
            let parts: Vec<&str> = sc.name.split('.').collect();
            let model = crate::problem::models::preset(parts[0]).unwrap();
            let tokens: usize = parts[2][1..].parse().unwrap();
            let gpus: usize = parts[3][1..].parse().unwrap();
            let skew: Skew = parts[4].parse().unwrap();
            let found = model
                .scenarios_routed(tokens, gpus, skew, DEFAULT_SEED)
                .unwrap()
                .into_iter()
                .find(|e| e.name == sc.name)
                .unwrap_or_else(|| panic!("{} not in the preset expansion", sc.name));
            assert_eq!(&found, sc);
        }
    }

    #[test]
    fn invalid_files_name_the_file_and_problem() {
        let cases = [
            ("[[scenario]\n", "not valid TOML"),
            (
                "[[scenario]]\nname='x'\nop='ag-gemm'\nm=8\nk=8\ngpus=2\n",
                "missing field `n`",
            ),
            (
                "[[scenario]]\nname='x'\nop='ag-gemm'\nm=0\nk=8\nn=8\ngpus=2\n",
                "m must be positive",
            ),
            (
                "[[scenario]]\nname='x'\nop='ag-gemm'\nm=-4\nk=8\nn=8\ngpus=2\n",
                "m must be positive",
            ),
            (
                "[[scenario]]\nname='x'\nop='ag-gemm'\nm=2\nk=8\nn=8\ngpus=4\n",
                "smaller than the GPU count",
            ),
            (
                "[[scenario]]\nname='x'\nop='ag-gemm'\nm=8\nk=8\nn=8\ngpus=2\nfoo=1\n",
                "unknown field",
            ),
            (
                "[[scenario]]\nname='x'\nop='ag-gemm'\nm=8\nk=8\nn=8\ngpus=2\n\
                 [[scenario]]\nname='x'\nop='ag-gemm'\nm=8\nk=8\nn=8\ngpus=2\n",
                "appears twice",
            ),
            ("title = 'x'\n", "not an array of tables"),
            ("", "no [[scenario]]"),
        ];
        for (text, want) in cases {
            let err = parse(text, "my.toml").unwrap_err();
            let msg = err.to_string();
            assert!(matches!(err, Error::Suite(_)), "{msg}");
            assert!(
                msg.contains("my.toml") && msg.contains(want),
                "{text:?}: {msg}"
            );
            assert!(!msg.contains('\n'), "one line: {msg}");
        }
        let err = load(Path::new("/nonexistent/suite.toml")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/suite.toml"), "{err}");
    }
}
