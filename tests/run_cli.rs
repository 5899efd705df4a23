//! `autopar run` through the real binary: a planned run reports finite
//! losses per step, more ranks train to the same losses as one, and bad
//! input (a plan for another model or rank count, a corrupt plan, an
//! unavailable backend, a missing data file) is one clear error line.

mod common;

use common::{
    assert_error, assert_error_with, autopar, autopar_with, free_port, launch_all, launched, run_json,
};
use std::path::Path;

const GPT2_TINY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/models/gpt2-tiny.ts.onnx");
/// A zoo model small enough to plan and lower in milliseconds.
const ZOO: &str = "gpt:layers=2,hidden=32,heads=4,vocab=64,seq=8";

fn numbers(v: &serde_json::Value, key: &str) -> Vec<f64> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("no '{key}' in {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// Runs `autopar run args…`, expecting a clean failure: exit 2, no panic,
/// one `error:` line on stderr that contains every one of `needles`.
fn assert_run_fails(args: &[&str], needles: &[&str]) {
    let mut all = vec!["run"];
    all.extend_from_slice(args);
    assert_error(&all, 2, needles);
}

#[test]
fn a_planned_run_reports_every_step() {
    let v = run_json(&[
        GPT2_TINY,
        "--plan",
        "auto",
        "--backend",
        "cpu",
        "--ranks",
        "2",
        "--steps",
        "3",
        "--global-batch",
        "4",
    ]);
    assert_eq!(v["ranks"], 2);
    let losses = numbers(&v, "losses");
    assert_eq!(losses.len(), 3);
    assert!(losses.iter().all(|l| l.is_finite() && *l > 0.0), "{losses:?}");
    let times = numbers(&v, "step_times_s");
    assert_eq!(times.len(), 3);
    assert!(times.iter().all(|t| t.is_finite() && *t > 0.0), "{times:?}");
    assert_eq!(v["per_rank"].as_array().unwrap().len(), 2);
}

#[test]
fn a_run_writes_its_timeline() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("trace.json");
    let trace = path.to_str().unwrap();
    run_json(&[
        GPT2_TINY,
        "--plan",
        "auto",
        "--ranks",
        "2",
        "--steps",
        "1",
        "--global-batch",
        "4",
        "--trace",
        trace,
    ]);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let events = v["traceEvents"].as_array().unwrap();
    for rank in 0..2 {
        let named = |ph: &str| events.iter().any(|e| e["pid"] == rank && e["ph"] == ph);
        assert!(named("X") && named("C") && named("M"), "rank {rank}");
    }
}

/// The losses of two steps on `ranks` ranks at `precision`, same seed and batch.
fn losses(ranks: &str, precision: &str) -> Vec<f64> {
    losses_with(ranks, precision, &[])
}

fn losses_with(ranks: &str, precision: &str, extra: &[&str]) -> Vec<f64> {
    let mut args = vec![
        GPT2_TINY,
        "--plan",
        "auto",
        "--ranks",
        ranks,
        "--steps",
        "2",
        "--global-batch",
        "8",
        "--seed",
        "11",
        "--precision",
        precision,
    ];
    args.extend_from_slice(extra);
    numbers(&run_json(&args), "losses")
}

/// Gradient reductions run where they are issued under `--no-overlap`,
/// with the same algorithms: the losses are bit for bit the same.
#[test]
fn no_overlap_changes_when_not_what() {
    let (beside, inline) = (losses("2", "f32"), losses_with("2", "f32", &["--no-overlap"]));
    assert_eq!(beside.len(), 2);
    assert_eq!(beside, inline);
}

#[test]
fn two_ranks_train_like_one() {
    for (precision, tol) in [("f32", 1e-4), ("f64", 1e-9)] {
        let (one, two) = (losses("1", precision), losses("2", precision));
        assert_eq!(one.len(), 2);
        for (a, b) in one.iter().zip(&two) {
            assert!(((a - b) / a).abs() <= tol, "{precision}: {one:?} vs {two:?}");
        }
    }
}

/// A plan for [`ZOO`] on two host cores, written into `dir`.
fn zoo_plan(dir: &Path) -> String {
    let out = dir.join("zoo-plan.json");
    let out = out.to_str().unwrap();
    let (code, _, err) = autopar(&[
        "plan",
        ZOO,
        "--cluster",
        "cpu",
        "--gpus",
        "2",
        "--global-batch",
        "4",
        "-o",
        out,
    ]);
    assert_eq!(code, 0, "{err}");
    out.to_string()
}

#[test]
fn a_plan_runs_only_its_own_model() {
    let dir = tempfile::tempdir().unwrap();
    let plan = zoo_plan(dir.path());
    assert_run_fails(
        &[GPT2_TINY, "--plan", &plan, "--ranks", "2", "--steps", "1"],
        &["different model", &plan],
    );
}

#[test]
fn a_plan_runs_only_on_its_rank_count() {
    let dir = tempfile::tempdir().unwrap();
    let plan = zoo_plan(dir.path());
    assert_run_fails(
        &[&plan, "--ranks", "3", "--steps", "1"],
        &["the plan has 2 ranks", "--ranks is 3"],
    );
}

#[test]
fn a_truncated_plan_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let plan = zoo_plan(dir.path());
    let text = std::fs::read_to_string(&plan).unwrap();
    let broken = dir.path().join("broken-plan.json");
    std::fs::write(&broken, &text[..text.len() / 3]).unwrap();
    assert_run_fails(
        &[broken.to_str().unwrap(), "--ranks", "2", "--steps", "1"],
        &["broken-plan.json", "not a plan file"],
    );
}

#[test]
fn cuda_without_a_gpu_is_refused_in_one_line() {
    if autopar_cuda::probe(0).is_ok() {
        eprintln!("skipped cuda_without_a_gpu_is_refused_in_one_line: this machine has a GPU");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let plan = zoo_plan(dir.path());
    assert_run_fails(
        &[&plan, "--ranks", "2", "--steps", "1", "--backend", "cuda"],
        &["--backend cuda"],
    );
}

#[test]
fn bf16_needs_the_cuda_backend() {
    assert_run_fails(
        &[ZOO, "--plan", "auto", "--ranks", "1", "--precision", "bf16"],
        &["bf16", "--backend cuda"],
    );
}

#[test]
fn a_missing_data_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.bin");
    let missing = missing.to_str().unwrap();
    assert_run_fails(
        &[
            ZOO, "--plan", "auto", "--ranks", "2", "--steps", "1", "--data", missing,
        ],
        &["cannot read token file", missing],
    );
}

#[test]
fn launched_processes_train_like_threads() {
    let dir = tempfile::tempdir().unwrap();
    let plan = zoo_plan(dir.path());
    let threads = run_json(&[&plan, "--ranks", "2", "--steps", "3"]);
    let trace = dir.path().join("run.json");
    let args = [
        "run",
        plan.as_str(),
        "--steps",
        "3",
        "--json",
        "--trace",
        trace.to_str().unwrap(),
    ];
    let outputs = launch_all(2, &args);
    assert!(outputs[1].stdout.is_empty(), "only rank 0 reports");
    let report: serde_json::Value = serde_json::from_slice(&outputs[0].stdout).unwrap();
    assert_eq!(report["processes"], 2);
    assert_eq!(threads["processes"], 1);
    // Bit for bit: the same programs, the same collectives, over TCP.
    assert_eq!(report["losses"], threads["losses"]);
    let bytes = |v: &serde_json::Value| {
        v["per_rank"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["bytes_sent"].as_u64().unwrap())
            .collect::<Vec<_>>()
    };
    assert_eq!(bytes(&report), bytes(&threads));
    // Each process writes its own rank's timeline beside the path asked for.
    assert!(!trace.exists());
    for rank in 0..2u64 {
        let text = std::fs::read_to_string(dir.path().join(format!("run.rank{rank}.json"))).unwrap();
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let events = json["traceEvents"].as_array().unwrap();
        assert!(events.iter().any(|e| e["ph"] == "X"), "rank {rank}: no spans");
        assert!(
            events.iter().all(|e| e["pid"] == rank),
            "rank {rank}: another rank's events"
        );
    }
}

#[test]
fn a_missing_process_is_named_after_the_rendezvous_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let plan = zoo_plan(dir.path());
    let port = free_port().to_string();
    // Rank 0 of two, whose rank 1 never starts.
    for (wait, want) in [
        ("soon", "AUTOPAR_RENDEZVOUS_TIMEOUT='soon' is invalid"),
        ("1", "rank(s) 1 of world size 2 never joined"),
    ] {
        let env = [
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", port.as_str()),
            ("AUTOPAR_RENDEZVOUS_TIMEOUT", wait),
        ];
        assert_error_with(&["run", &plan, "--steps", "1"], &env, 2, &[want]);
    }
}

#[test]
fn a_launched_run_checks_its_world_before_connecting() {
    let dir = tempfile::tempdir().unwrap();
    let plan = zoo_plan(dir.path());
    // Rank 0 of three processes, for a plan of two ranks.
    let env = [
        ("RANK", "0"),
        ("WORLD_SIZE", "3"),
        ("LOCAL_RANK", "0"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "1"),
    ];
    let cases: [(&[&str], &str); 2] = [
        (
            &["run", &plan, "--steps", "1"],
            "the plan has 2 ranks but the launcher started 3 processes",
        ),
        (
            &["run", &plan, "--steps", "1", "--ranks", "2"],
            "--ranks 2, but the launcher started 3 processes",
        ),
    ];
    for (args, want) in cases {
        assert_error_with(args, &env, 2, &[want]);
    }
}

/// A model the planner runs tensor-parallel on four host cores.
const TP_ZOO: &str = "gpt:layers=2,hidden=256,heads=4,vocab=512,seq=64";

/// The plan's per-op sharding is what runs: a plan file whose one linear
/// is edited from column-parallel to replicated trains to the same losses
/// (and one rank's) while its ranks send other bytes; a strategy the op
/// does not have is one error line naming the node.
#[test]
fn an_edited_plans_sharding_is_what_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("plan.json");
    let plan_file = path.to_str().unwrap();
    let args = [
        "--cluster",
        "cpu",
        "--gpus",
        "4",
        "--global-batch",
        "4",
        "-o",
        plan_file,
    ];
    let (code, _, err) = autopar(&[&["plan", TP_ZOO][..], &args].concat());
    assert_eq!(code, 0, "{err}");
    let mut plan: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(
        plan["parallel"]["tp"].as_u64().unwrap() > 1,
        "the planner no longer picks tp here"
    );
    let run = |plan: &serde_json::Value, name: &str| {
        let file = dir.path().join(name);
        std::fs::write(&file, serde_json::to_string_pretty(plan).unwrap()).unwrap();
        let v = run_json(&[
            file.to_str().unwrap(),
            "--ranks",
            "4",
            "--steps",
            "2",
            "--seed",
            "5",
        ]);
        (
            numbers(&v, "losses"),
            v["per_rank"][0]["bytes_sent"].as_u64().unwrap(),
        )
    };
    let (losses, sent) = run(&plan, "as-planned.json");
    let one = numbers(
        &run_json(&[
            TP_ZOO,
            "--plan",
            "auto",
            "--ranks",
            "1",
            "--steps",
            "2",
            "--seed",
            "5",
            "--global-batch",
            "4",
        ]),
        "losses",
    );
    let entry = plan["sharding"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|e| e["op"] == "Linear" && e["strategy"] == "column")
        .expect("a column-parallel linear");
    let node = entry["node"].as_str().unwrap().to_string();
    entry["strategy"] = "replicate".into();
    for key in ["inputs", "outputs"] {
        for spec in entry[key]
            .as_array_mut()
            .unwrap()
            .iter_mut()
            .filter_map(|s| s.as_object_mut())
        {
            spec.remove("partial");
            for d in spec["dims"].as_array_mut().unwrap() {
                *d = "Replicate".into();
            }
        }
    }
    let (edited, edited_sent) = run(&plan, "edited.json");
    assert_ne!(edited_sent, sent, "replicating {node} changed no traffic");
    for (a, b) in [(&one, &losses), (&one, &edited)] {
        for (x, y) in a.iter().zip(b) {
            assert!(((x - y) / x).abs() <= 1e-4, "{a:?} vs {b:?}");
        }
    }
    let entry = plan["sharding"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|e| e["node"] == node.as_str());
    entry.unwrap()["strategy"] = "diagonal".into();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, serde_json::to_string(&plan).unwrap()).unwrap();
    assert_run_fails(
        &[bad.to_str().unwrap(), "--ranks", "4", "--steps", "1"],
        &[&format!("'{node}'"), "no strategy 'diagonal'"],
    );
}

/// The planner's context-parallel pick for a long-sequence BERT (cp 2 on two
/// host cores) trains to one rank's losses through the binary. (Under a
/// causal mask lowering's context parallelism skips no masked keys, so the
/// planner rightly prefers tensor parallelism for a causal model this size.)
#[test]
fn a_context_parallel_plan_trains_like_one_rank() {
    let spec = "bert:layers=1,hidden=32,heads=2,vocab=128,seq=4096";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cp.json");
    let file = path.to_str().unwrap();
    let args = [
        "--cluster",
        "cpu",
        "--gpus",
        "2",
        "--global-batch",
        "1",
        "-o",
        file,
    ];
    let (code, _, err) = autopar(&[&["plan", spec][..], &args].concat());
    assert_eq!(code, 0, "{err}");
    let plan: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(plan["parallel"]["cp"], 2, "the planner no longer picks cp here");
    let common = ["--steps", "3", "--seed", "5", "--precision", "f64"];
    let two = numbers(
        &run_json(&[&[file, "--ranks", "2"][..], &common].concat()),
        "losses",
    );
    let one = numbers(
        &run_json(
            &[
                &[spec, "--plan", "auto", "--ranks", "1", "--global-batch", "1"][..],
                &common,
            ]
            .concat(),
        ),
        "losses",
    );
    assert_eq!(one.len(), 3);
    for (a, b) in one.iter().zip(&two) {
        assert!(((a - b) / a).abs() <= 1e-9, "{one:?} vs {two:?}");
    }
}

/// `autopar run` of the zoo plan in `dir` on 2 ranks with `env`, as text
/// (`json` false) or JSON: exit 0 asserted; stdout and stderr.
fn run_zoo_plan(plan: &str, env: &[(&str, &str)], extra: &[&str]) -> (String, String) {
    let mut args = vec!["run", plan, "--ranks", "2", "--steps", "2"];
    args.extend_from_slice(extra);
    let (code, out, err) = autopar_with(&args, env);
    assert_eq!(code, 0, "{args:?}: {err}");
    (out, err)
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// `autopar simulate plan --calibration cal --json`'s step time.
fn simulated_step(plan: &str, cal: &str) -> f64 {
    let (code, out, err) = autopar(&["simulate", plan, "--calibration", cal, "--json"]);
    assert_eq!(code, 0, "{err}");
    json(&out)["step_time_s"].as_f64().unwrap()
}

fn assert_close(a: f64, b: f64) {
    assert!(((a - b) / b).abs() <= 1e-9, "{a} vs {b}");
}

/// Without a host profile (`AUTOPAR_NOMINAL_CPU=1`, which the tests' binary
/// sets) the prediction is the plan's own estimate from the nominal `cpu`
/// preset, and both the plan line and the report say so.
#[test]
fn a_nominal_prediction_says_that_it_is_nominal() {
    let dir = tempfile::tempdir().unwrap();
    let plan = zoo_plan(dir.path());
    let planned: serde_json::Value = json(&std::fs::read_to_string(&plan).unwrap());
    let (text, _) = run_zoo_plan(&plan, &[], &[]);
    let line = text.lines().next().unwrap();
    assert!(
        line.starts_with("plan: ") && line.ends_with(" per step (nominal cpu figures)"),
        "{text}"
    );
    let (out, _) = run_zoo_plan(&plan, &[], &["--json"]);
    let v = json(&out);
    assert_eq!(v["plan"]["prediction_source"], "nominal", "{v}");
    assert_eq!(
        v["plan"]["predicted_step_time_s"],
        planned["predicted"]["step_time_s"]
    );
    assert!(v["simulated_step_time_s"].is_null(), "{v}");
    // How much of the host training got, to set beside the prediction.
    assert!(v["host"]["cores"].as_u64().is_some_and(|c| c >= 1), "{v}");
    assert!(v["host"]["cores_used"].as_f64().is_some_and(|c| c >= 0.0), "{v}");
}

/// A CPU run predicts from this host's profile in the cache folder,
/// reading it without measuring or rewriting it: the prediction is the
/// plan's programs simulated with that profile.
#[test]
fn a_cached_host_profile_prices_the_prediction() {
    let dir = tempfile::tempdir().unwrap();
    let plan = zoo_plan(dir.path());
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).unwrap();
    let profile = cache.join(autopar::host_profile::HostKey::this_host().file_name());
    let profile = profile.to_str().unwrap();
    let (code, _, err) = autopar(&["profile", "--backend", "cpu", "--quick", "-o", profile]);
    assert_eq!(code, 0, "{err}");
    let cached = std::fs::read(profile).unwrap();
    let env = [
        ("AUTOPAR_NOMINAL_CPU", "0"),
        ("AUTOPAR_CACHE_DIR", cache.to_str().unwrap()),
    ];
    let (out, err) = run_zoo_plan(&plan, &env, &["--json"]);
    assert!(
        !err.contains("measuring"),
        "the cached profile was measured again: {err}"
    );
    let v = json(&out);
    assert_eq!(v["plan"]["prediction_source"], "host-profile", "{v}");
    assert!(v["simulated_step_time_s"].is_null(), "{v}");
    let predicted = v["plan"]["predicted_step_time_s"].as_f64().unwrap();
    assert_close(predicted, simulated_step(&plan, profile));
    assert_eq!(std::fs::read(profile).unwrap(), cached);
    let (text, _) = run_zoo_plan(&plan, &env, &[]);
    assert!(
        text.lines()
            .next()
            .unwrap()
            .ends_with(" per step (this host's profile)"),
        "{text}"
    );
}

/// `--calibration` wins over the host profile and the nominal switch; its
/// simulated step is the prediction.
#[test]
fn a_calibration_file_prices_the_prediction() {
    let dir = tempfile::tempdir().unwrap();
    let plan = zoo_plan(dir.path());
    let cal = dir.path().join("cpu.json");
    let cal = cal.to_str().unwrap();
    let (code, _, err) = autopar(&["profile", "--backend", "cpu", "--quick", "-o", cal]);
    assert_eq!(code, 0, "{err}");
    let (out, _) = run_zoo_plan(&plan, &[], &["--calibration", cal, "--json"]);
    let v = json(&out);
    assert_eq!(v["plan"]["prediction_source"], "calibration-file", "{v}");
    let predicted = v["plan"]["predicted_step_time_s"].as_f64().unwrap();
    assert_eq!(v["simulated_step_time_s"].as_f64(), Some(predicted));
    assert_close(predicted, simulated_step(&plan, cal));
}

#[test]
fn the_nominal_switch_takes_only_1_or_0() {
    let env = [("AUTOPAR_NOMINAL_CPU", "yes")];
    let args = ["run", ZOO, "--plan", "auto", "--ranks", "1", "--steps", "1"];
    assert_error_with(&args, &env, 2, &["AUTOPAR_NOMINAL_CPU='yes' is invalid"]);
}

/// A frozen process (SIGSTOP: alive, silent) is noticed by its heartbeats
/// stopping: the others fail within the timeout, each naming it, not the
/// rank that waits for it.
#[test]
fn a_frozen_process_is_named_within_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let ck = dir.path().join("ck");
    let ck = ck.to_str().unwrap();
    let args = [
        "run",
        ZOO,
        "--plan",
        "auto",
        "--steps",
        "1000000",
        "--timeout",
        "2",
        "--save",
        ck,
        "--save-every",
        "1",
        "--keep",
        "1",
    ];
    let port = free_port();
    let mut children: Vec<_> = (0..4).map(|rank| launched(rank, 4, port, &args)).collect();
    let began = std::time::Instant::now();
    while !Path::new(ck).join("latest").exists() {
        assert!(began.elapsed().as_secs() < 120, "training never started");
        assert!(
            children[0].try_wait().unwrap().is_none(),
            "rank 0 ended before training"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let frozen = children[3].id().to_string();
    let stop = std::process::Command::new("kill")
        .args(["-STOP", &frozen])
        .status()
        .unwrap();
    assert!(stop.success());
    let stopped = std::time::Instant::now();
    let frozen_child = children.pop().unwrap();
    let outputs: Vec<_> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let waited = stopped.elapsed().as_secs_f64();
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &frozen])
        .status();
    let _ = frozen_child.wait_with_output();
    assert!(waited < 6.0, "the others took {waited:.1} s to give up");
    for (rank, out) in outputs.iter().enumerate() {
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "rank {rank} went on");
        assert!(
            err.contains("rank 3") && err.contains("heartbeat"),
            "rank {rank} blames another: {err}"
        );
    }
}

/// One rank on this host splits its large products over all its cores by
/// default, `--threads` sets the count, and the bits do not depend on it;
/// the predicted step is the plan's programs simulated with the same split
/// (`simulate --threads`), whose price depends on the count.
#[test]
fn a_rank_splits_its_products_over_its_share_of_the_host() {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("tp.json");
    let plan = plan.to_str().unwrap();
    let args = [
        "plan",
        TP_ZOO,
        "--cluster",
        "cpu",
        "--gpus",
        "1",
        "--global-batch",
        "4",
        "-o",
        plan,
    ];
    let (code, _, err) = autopar(&args);
    assert_eq!(code, 0, "{err}");
    let cal = dir.path().join("cpu.json");
    let cal = cal.to_str().unwrap();
    let (code, _, err) = autopar(&["profile", "--backend", "cpu", "--quick", "-o", cal]);
    assert_eq!(code, 0, "{err}");
    let ran = |extra: &[&str]| {
        let mut args = vec![
            "run",
            plan,
            "--ranks",
            "1",
            "--steps",
            "2",
            "--calibration",
            cal,
            "--json",
        ];
        args.extend_from_slice(extra);
        let (code, out, err) = autopar(&args);
        assert_eq!(code, 0, "{err}");
        json(&out)
    };
    let (default, one, three) = (ran(&[]), ran(&["--threads", "1"]), ran(&["--threads", "3"]));
    assert_eq!(default["host"]["threads_per_rank"], cores, "{default}");
    assert_eq!(one["host"]["threads_per_rank"], 1);
    assert_eq!(default["losses"], one["losses"]);
    assert_eq!(three["losses"], one["losses"]);
    let predicted = |v: &serde_json::Value| v["simulated_step_time_s"].as_f64().unwrap();
    let simulated = |threads: &str| {
        let args = [
            "simulate",
            plan,
            "--calibration",
            cal,
            "--threads",
            threads,
            "--json",
        ];
        let (code, out, err) = autopar(&args);
        assert_eq!(code, 0, "{err}");
        json(&out)["step_time_s"].as_f64().unwrap()
    };
    assert_close(predicted(&one), simulated("1"));
    assert_close(predicted(&three), simulated("3"));
    // Whether three threads are faster depends on the host (on two cores
    // they take turns, and the profile prices that); that the split is
    // priced at all does not.
    assert_ne!(predicted(&three), predicted(&one), "{three} vs {one}");
    assert_error(
        &["run", plan, "--ranks", "1", "--threads", "0"],
        2,
        &["--threads"],
    );
}
