//! The JSON of `ficco explore --json`: one scenario's report as itself,
//! several as `{"scenarios": [...]}` (the schema is in the [module
//! doc](super)).

use super::ScenarioReport;
use serde::Serialize;

/// `{"scenarios": [...]}` without copying the reports.
#[derive(Serialize)]
struct Suite<'a> {
    scenarios: &'a [ScenarioReport],
}

/// Pretty-printed JSON of `reports`, ending in a newline: the report itself
/// when there is exactly one, else `{"scenarios": [...]}` (as
/// [`super::SuiteReport`] serializes).
pub fn to_json(reports: &[ScenarioReport]) -> serde_json::Result<String> {
    let text = match reports {
        [one] => serde_json::to_string_pretty(one)?,
        all => serde_json::to_string_pretty(&Suite { scenarios: all })?,
    };
    Ok(text + "\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::workload::{Op, Problem, Scenario};
    use crate::report::{Reference, SuiteReport};

    fn report(name: &str) -> ScenarioReport {
        let sc = Scenario {
            name: name.into(),
            problem: Problem::new(Op::AgGemm, 64, 32, 16, 2).unwrap(),
        };
        ScenarioReport::new(&sc, "sim", "h200-nvlink", Reference::new(1.0, 0.7, 0.4))
    }

    #[test]
    fn one_report_is_itself_several_are_a_suite() {
        let one = vec![report("a")];
        assert_eq!(
            to_json(&one).unwrap(),
            serde_json::to_string_pretty(&one[0]).unwrap() + "\n"
        );
        let two = vec![report("a"), report("b")];
        let suite = SuiteReport {
            scenarios: two.clone(),
        };
        assert_eq!(
            to_json(&two).unwrap(),
            serde_json::to_string_pretty(&suite).unwrap() + "\n"
        );
    }
}
