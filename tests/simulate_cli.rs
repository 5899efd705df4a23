//! `autopar simulate` through the real binary: the JSON keys scripts rely
//! on, a trace file, and a clear error for a missing plan.

use std::process::Command;

const ZOO: &str = "gpt:layers=4,hidden=32,heads=4,vocab=64,seq=8";

fn autopar(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_autopar"))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

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
    let (code, _, err) = autopar(&["simulate", "no-such-plan.json"]);
    assert_ne!(code, 0);
    assert!(!err.contains("panicked"), "{err}");
    assert!(err.contains("no-such-plan.json"), "{err}");
}
