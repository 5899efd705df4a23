//! `autopar simulate` through the real binary: the JSON keys scripts rely
//! on, a trace file, and a clear error for a missing plan.

mod common;

use common::{assert_error, autopar};

const ZOO: &str = "gpt:layers=4,hidden=32,heads=4,vocab=64,seq=8";

#[test]
fn a_plan_simulates_with_the_documented_keys_and_a_trace() {
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.json");
    let plan = plan.to_str().unwrap();
    let (code, _, err) = autopar(&[
        "plan",
        ZOO,
        "--cluster",
        "cpu",
        "--gpus",
        "4",
        "--global-batch",
        "16",
        "-o",
        plan,
    ]);
    assert_eq!(code, 0, "{err}");
    let trace = dir.path().join("sim.json");
    let (code, out, err) = autopar(&["simulate", plan, "--json", "--trace", trace.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let step = v["step_time_s"].as_f64().unwrap();
    let analytic = v["analytic_step_time_s"].as_f64().unwrap();
    assert!(step > 0.0 && analytic > 0.0);
    let bubble = v["bubble_fraction"].as_f64().unwrap();
    assert!((0.0..1.0).contains(&bubble));
    assert!(!v["per_rank"].as_array().unwrap().is_empty());
    let events: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).unwrap();
    assert!(!events["traceEvents"].as_array().unwrap().is_empty());
    // The text report names the terms and draws the timeline.
    let (code, out, _) = autopar(&["simulate", plan]);
    assert_eq!(code, 0);
    assert!(
        out.contains("analytic") && out.contains("compute") && out.contains("timeline"),
        "{out}"
    );
}

#[test]
fn a_missing_plan_is_one_clear_error() {
    assert_error(
        &["simulate", "no-such-plan.json"],
        2,
        &["no-such-plan.json: cannot read"],
    );
}
