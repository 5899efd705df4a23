//! Absurd and malformed input through the real binary, each case as it was
//! reported: exit 2 within seconds, one `error:` line naming the flag, file
//! or field and, for a size, the limit it is over. Nothing panics, hangs or
//! tries to allocate what no machine has.

mod common;

use common::{assert_error, autopar, binary, scratch, scratch_dir};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A small zoo GPT whose fixed position table holds 16 positions.
const MODEL: &str = "gpt:layers=2,hidden=64,heads=4,vocab=128,seq=16";

/// What a refusal may take, on a busy two-core CI machine; each takes
/// milliseconds where nothing hangs.
const QUICK: Duration = Duration::from_secs(5);

/// [`assert_error`] with exit 2, within [`QUICK`].
fn refused(args: &[&str], needles: &[&str]) {
    let start = Instant::now();
    assert_error(args, 2, needles);
    let took = start.elapsed();
    assert!(took < QUICK, "{args:?} took {took:?}");
}

/// A plan file for [`MODEL`] on two CPU ranks (written once per test
/// binary), with `edit` applied, saved as `name`.
fn plan_with(name: &str, edit: impl Fn(&mut serde_json::Value)) -> String {
    let base = scratch("base-plan.json");
    if !base.exists() {
        let out = scratch("base-plan.tmp.json");
        let (code, _, err) = autopar(&[
            "plan",
            MODEL,
            "--cluster",
            "cpu",
            "--gpus",
            "2",
            "--global-batch",
            "4",
            "-o",
            out.to_str().unwrap(),
        ]);
        assert_eq!(code, 0, "{err}");
        // Tests run in parallel: the first to finish puts the plan in place.
        let _ = std::fs::rename(&out, &base);
    }
    let mut plan: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&base).unwrap()).unwrap();
    edit(&mut plan);
    let path = scratch(name);
    std::fs::write(&path, plan.to_string()).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn a_stage_that_ends_before_it_starts_names_the_field() {
    let plan = plan_with("layers.json", |p| {
        p["stages"][0]["layers"] = serde_json::json!([3, 1])
    });
    let needles = [
        "layers.json",
        "plan field 'stages[0].layers'",
        "[3, 1] ends before it starts",
    ];
    refused(&["run", &plan, "--ranks", "2", "--steps", "1"], &needles);
    refused(&["simulate", &plan], &needles);
}

#[test]
fn absurd_micro_batches_in_a_plan_name_the_field_and_the_limit() {
    for field in ["micro_batches", "micro_batch"] {
        let plan = plan_with(&format!("{field}.json"), |p| {
            p["parallel"][field] = 1_000_000_000_000u64.into()
        });
        let needles = [
            format!("plan field 'parallel.{field}'"),
            "1000000000000 is above the limit of 1048576 (MAX_GLOBAL_BATCH)".into(),
        ];
        let needles: Vec<&str> = needles.iter().map(String::as_str).collect();
        refused(&["run", &plan, "--ranks", "2", "--steps", "1"], &needles);
        refused(&["simulate", &plan], &needles);
    }
    // Within the limits, the micro-batches must still make up the batch.
    let plan = plan_with("rows.json", |p| p["parallel"]["micro_batches"] = 3.into());
    refused(
        &["simulate", &plan],
        &["plan field 'parallel.micro_batches'", "is not global_batch 4"],
    );
}

#[test]
fn absurd_sizes_on_the_command_line_name_the_flag_and_the_limit() {
    let plan_out = scratch("never.json");
    let o = plan_out.to_str().unwrap();
    let huge_batch = "1000000000000";
    let batch_limit = ["--global-batch 1000000000000 is above the limit of 1048576 (MAX_GLOBAL_BATCH)"];
    refused(
        &[
            "plan",
            MODEL,
            "--cluster",
            "cpu",
            "--gpus",
            "2",
            "--global-batch",
            huge_batch,
            "-o",
            o,
        ],
        &batch_limit,
    );
    refused(
        &[
            "run",
            MODEL,
            "--plan",
            "auto",
            "--ranks",
            "2",
            "--global-batch",
            huge_batch,
        ],
        &batch_limit,
    );
    refused(
        &["run", MODEL, "--plan", "auto", "--ranks", "100000"],
        &["--ranks 100000 is above the limit of 1024 (MAX_LOCAL_RANKS)"],
    );
    let gpus = (u64::MAX - 7).to_string();
    let gpus_limit = format!("--gpus {gpus} is above the limit of 262144 (MAX_GPUS)");
    refused(
        &[
            "plan",
            MODEL,
            "--cluster",
            "dgx-h100",
            "--gpus",
            &gpus,
            "--global-batch",
            "16",
            "-o",
            o,
        ],
        &[&gpus_limit],
    );
    refused(
        &[
            "estimate",
            MODEL,
            "--cluster",
            "dgx-h100",
            "--gpus",
            &gpus,
            "--global-batch",
            "16",
        ],
        &[&gpus_limit],
    );
    let deep = "gpt:layers=100000,hidden=512,heads=8,vocab=8192,seq=256";
    let layers_limit = [
        "key 'layers'",
        "layers=100000 is above the limit of 1024 layers (MAX_LAYERS)",
    ];
    refused(
        &[
            "plan",
            deep,
            "--cluster",
            "dgx-h100",
            "--gpus",
            "8",
            "--global-batch",
            "16",
            "-o",
            o,
        ],
        &layers_limit,
    );
    refused(&["inspect", deep], &layers_limit);
    assert!(!plan_out.exists());
}

#[test]
fn a_sequence_the_model_cannot_hold_is_refused_before_training() {
    refused(
        &["run", MODEL, "--plan", "auto", "--ranks", "1", "--seq", "0"],
        &["--seq must be at least 1"],
    );
    refused(
        &["run", MODEL, "--plan", "auto", "--ranks", "1", "--seq", "64"],
        &["--seq 64", "has 16 positions", "--seq must be at most 16"],
    );
    let onnx = format!("{}/models/gpt2-tiny.ts.onnx", common::FIXTURES);
    refused(
        &["run", &onnx, "--plan", "auto", "--ranks", "1", "--seq", "64"],
        &[
            "gpt2-tiny.ts.onnx",
            "fixed sequence length of 16",
            "--seq must be 16, not 64",
        ],
    );
}

#[test]
fn estimate_refuses_what_the_model_cannot_run() {
    let estimate = [
        "estimate",
        MODEL,
        "--cluster",
        "dgx-h100",
        "--gpus",
        "8",
        "--global-batch",
        "16",
    ];
    refused(
        &[&estimate[..], &["--ep", "2"]].concat(),
        &["expert parallelism (ep 2) needs a mixture-of-experts model"],
    );
    refused(
        &[&estimate[..], &["--seq", "0"]].concat(),
        &["--seq must be at least 1"],
    );
}

#[test]
fn a_learning_rate_out_of_range_is_refused() {
    for lr in ["NaN", "inf", "-1"] {
        refused(
            &[
                "run",
                MODEL,
                "--plan",
                "auto",
                "--ranks",
                "1",
                &format!("--lr={lr}"),
            ],
            &[
                "--lr",
                &format!("lr = {lr} is out of range (a finite number ≥ 0)"),
            ],
        );
    }
}

/// `run --help` gives the learning rates the optimizers default to.
#[test]
fn run_help_states_the_default_learning_rates() {
    use autopar_exec::train::{DEFAULT_ADAMW_LR, DEFAULT_SGD_LR};
    let (code, out, err) = autopar(&["run", "--help"]);
    assert_eq!(code, 0, "{err}");
    let said = format!("(default: {DEFAULT_ADAMW_LR:e} for AdamW, {DEFAULT_SGD_LR:e} for SGD)");
    assert!(out.contains(&said), "expected '{said}' in:\n{out}");
}

/// Files in `dir` other than `keep`.
fn others(dir: &PathBuf, keep: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != keep)
        .collect()
}

/// `convert` killed the moment anything appears in its output folder
/// leaves no temporary file there, only the finished file or nothing: the
/// contents are written to an unnamed file, named only once complete.
#[test]
fn a_killed_convert_leaves_no_temporary_file() {
    // About 3 MB of JSON, written in milliseconds, which the watcher sees.
    let model = "gpt:layers=256,hidden=64,heads=4,vocab=128,seq=16";
    for attempt in 0..3 {
        let dir = scratch_dir(&format!("convert-{attempt}"));
        let out = dir.join("graph.json");
        let mut child = binary()
            .args(["convert", model, "-o", out.to_str().unwrap()])
            .spawn()
            .unwrap();
        let start = Instant::now();
        loop {
            let seen = std::fs::read_dir(&dir).unwrap().next().is_some();
            if seen || child.try_wait().unwrap().is_some() {
                break;
            }
            assert!(start.elapsed() < QUICK * 2, "convert did not finish");
        }
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(
            others(&dir, "graph.json"),
            Vec::<String>::new(),
            "attempt {attempt}"
        );
        if out.exists() {
            let text = std::fs::read_to_string(&out).unwrap();
            assert!(
                serde_json::from_str::<serde_json::Value>(&text).is_ok(),
                "a partial graph.json"
            );
        }
    }
}
