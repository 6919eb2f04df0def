//! The three parsers a user's text reaches (suite TOML, profile TOML,
//! schedule names) on arbitrary input: an `Err` or a valid value, never a
//! panic. `fuzz/` runs the same property under cargo-fuzz.

use ficco_core::problem::suite;
use ficco_core::problem::workload::MAX_GPUS;
use ficco_core::sim::profile::HwProfile;
use ficco_core::space::{Schedule, SpaceOptions};
use proptest::prelude::*;

const H200: &str = include_str!("../profiles/h200-nvlink.toml");

/// Suite-like TOML: a few entries with plausible and extreme values.
fn suite_text() -> impl Strategy<Value = String> {
    let value = prop_oneof![
        any::<i64>().prop_map(|v| v.to_string()),
        (0i64..100_000).prop_map(|v| v.to_string()),
        Just("\"ag-gemm\"".to_string()),
        Just("\"concurrent\"".to_string()),
        Just("\"all-reduce\"".to_string()),
        "\"[a-z./ -]{0,12}\"".prop_map(|s| s),
        Just("1e400".to_string()),
    ];
    let key = prop_oneof![
        Just("name"),
        Just("op"),
        Just("m"),
        Just("k"),
        Just("n"),
        Just("gpus"),
        Just("gemms"),
        Just("collective"),
        Just("bytes"),
        Just("extra"),
    ];
    let table = prop_oneof![Just("scenario"), Just("concurrent"), Just("senario")];
    prop::collection::vec((table, prop::collection::vec((key, value), 0..9)), 0..4).prop_map(
        |entries| {
            let mut s = String::new();
            for (t, kvs) in entries {
                s += &format!("[[{t}]]\n");
                for (k, v) in kvs {
                    s += &format!("{k} = {v}\n");
                }
            }
            s
        },
    )
}

/// The built-in profile with one numeric line replaced.
fn profile_text() -> impl Strategy<Value = String> {
    let lines: Vec<(usize, String)> = H200
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains(" = ") && !l.starts_with('#') && !l.contains('"'))
        .map(|(i, l)| (i, l.split(" = ").next().unwrap().to_string()))
        .collect();
    let value = prop_oneof![
        any::<f64>().prop_map(|v| format!("{v:?}")),
        any::<i64>().prop_map(|v| v.to_string()),
        Just("nan".to_string()),
        Just("inf".to_string()),
        Just("-0.0".to_string()),
        Just("1e-300".to_string()),
        Just("[]".to_string()),
    ];
    (prop::sample::select(lines), value).prop_map(|((i, key), v)| {
        H200.lines()
            .enumerate()
            .map(|(j, l)| {
                if j == i {
                    format!("{key} = {v}")
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n")
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn suite_toml_is_err_or_valid(text in suite_text()) {
        if let Ok(s) = suite::parse(&text, "prop") {
            for sc in &s.scenarios {
                prop_assert!(sc.problem.validate().is_ok(), "{:?}", sc);
                prop_assert!(sc.problem.gpus <= MAX_GPUS);
            }
        }
    }

    #[test]
    fn arbitrary_text_is_not_a_panic(text in "\\PC{0,200}") {
        let _ = suite::parse(&text, "prop");
        let _ = HwProfile::from_toml(&text);
        let _ = text.parse::<Schedule>();
    }

    #[test]
    fn profile_toml_is_err_or_valid(text in profile_text()) {
        if let Ok(hw) = HwProfile::from_toml(&text) {
            prop_assert!(hw.check().is_ok());
            // A valid profile simulates a small problem without overflow.
            let p = ficco_core::problem::workload::Problem::new(
                ficco_core::problem::workload::Op::AgGemm, 1024, 256, 256, 2).unwrap();
            let plan = ficco_core::plan::lower::lower(&p, &Schedule::SEQ).unwrap();
            let t = ficco_core::sim::simulate(&plan, &hw);
            if let Ok(t) = t {
                prop_assert!(t.total_ms.is_finite() && t.total_ms >= 0.0);
            }
        }
    }

    #[test]
    fn schedule_names_are_err_or_round_trip(
        name in prop_oneof![
            "[a-z0-9-]{0,40}",
            "(seq|shard|bulk|fine[0-9]{1,20})-(nccl|copy)-(ring|all)(-2s)?(-acc)?(-own)?(-sm[0-9]{1,22})?(-gc[0-9]{1,22})?(-occ[0-9]{1,22})?(-cta[0-9]{1,22})?(-hi)?",
        ]
    ) {
        if let Ok(s) = name.parse::<Schedule>() {
            prop_assert_eq!(s.name().parse::<Schedule>().unwrap(), s);
            let space = SpaceOptions { controls: true, sm_count: 132, nccl_sms: 16 };
            for op in ficco_core::problem::workload::Op::ALL {
                let _ = s.outside(op, space);
            }
        }
    }
}
