//! `autopar run` for every training objective through the real binary:
//! each model of the fixtures trains with falling loss (the objective
//! inferred or chosen with `--objective`), arrays from `.npy` and
//! `.safetensors` files feed features and labels alike and two ranks train
//! on them as one, and a model, flag or file that does not fit is one
//! error line naming it.

mod common;

use common::{assert_error, autopar, FIXTURES};
use npyz::WriterBuilder;
use std::path::{Path, PathBuf};

fn model(file: &str) -> String {
    format!("{FIXTURES}/models/{file}")
}

/// `autopar run model --plan auto` with `args` and `--json`, which must succeed.
fn run_json(model: &str, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["run", model, "--plan", "auto", "--json"];
    all.extend_from_slice(args);
    let (code, stdout, err) = autopar(&all);
    assert_eq!(code, 0, "{all:?}: {err}");
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn losses(v: &serde_json::Value) -> Vec<f64> {
    v["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// Every fixture trains for its objective on two ranks with a loss that
/// falls clearly over 20 steps of synthetic data at a learning rate of
/// 3e-3 (the acceptance run; one test, as it is the suite's heaviest).
/// These fixtures are tiny: the default rate, chosen so wider models do not
/// diverge, moves them only slowly.
#[test]
fn every_objective_trains_with_falling_loss() {
    let cases: [(&str, Option<&str>, &str, f64); 7] = [
        // (model, --objective, objective run, most the last loss may keep of the first)
        ("mlp.ts.onnx", None, "classify", 0.1),
        ("mlp.dynamo.onnx", None, "classify", 0.1),
        ("mlp.ts.onnx", Some("regress"), "regress", 0.6),
        ("bart.ts.onnx", None, "seq2seq", 0.6),
        ("bart.dynamo.onnx", None, "seq2seq", 0.6),
        ("bert-tiny.ts.onnx", Some("mlm"), "mlm", 0.7),
        ("bert-tiny.dynamo.onnx", Some("mlm"), "mlm", 0.7),
    ];
    for (file, flag, objective, keeps) in cases {
        let mut args = vec!["--ranks", "2", "--steps", "20", "--lr", "3e-3"];
        if let Some(o) = flag {
            args.extend(["--objective", o]);
        }
        let v = run_json(&model(file), &args);
        assert_eq!(v["objective"], objective, "{file}");
        let l = losses(&v);
        assert_eq!(l.len(), 20, "{file}");
        assert!(
            l[19] < keeps * l[0],
            "{file} {objective}: {:.4} → {:.4}",
            l[0],
            l[19]
        );
        let unit = match objective {
            "classify" | "regress" => "samples",
            _ => "tokens",
        };
        assert_eq!(v["throughput_unit"], unit, "{file}");
    }
}

/// A `.npy` array of `shape` holding `values`, written as `dir/name`.
fn npy<T: npyz::AutoSerialize + Copy>(dir: &Path, name: &str, shape: &[u64], values: &[T]) -> PathBuf {
    let path = dir.join(name);
    let mut w = npyz::WriteOptions::new()
        .default_dtype()
        .shape(shape)
        .writer(std::fs::File::create(&path).unwrap())
        .begin_nd()
        .unwrap();
    w.extend(values.iter().copied()).unwrap();
    w.finish().unwrap();
    path
}

/// 40 examples of 64 features for the MLP fixture and their classes: the
/// features hold their class as a spike, so they are learnable.
fn examples() -> (Vec<f32>, Vec<i64>) {
    let labels: Vec<i64> = (0..40).map(|e| (e * 7 % 10) as i64).collect();
    let features = (0..40 * 64)
        .map(|i| {
            let (e, f) = (i / 64, i % 64);
            (f == labels[e] as usize) as u8 as f32 * 3.0 + ((i * 13 % 17) as f32 / 17.0 - 0.5)
        })
        .collect();
    (features, labels)
}

/// The same examples fed from `.npy` files or one `.safetensors` file are
/// the same rows, and two data-parallel ranks train on them as one rank.
#[test]
fn arrays_feed_features_and_labels() {
    let dir = tempfile::tempdir().unwrap();
    let (x, y) = examples();
    let features = npy(dir.path(), "x.npy", &[40, 64], &x);
    let labels = npy(dir.path(), "y.npy", &[40], &y);
    let st = dir.path().join("xy.safetensors");
    let xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let yb: Vec<u8> = y.iter().flat_map(|v| v.to_le_bytes()).collect();
    let views = [
        (
            "x",
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![40, 64], &xb).unwrap(),
        ),
        (
            "labels",
            safetensors::tensor::TensorView::new(safetensors::Dtype::I64, vec![40], &yb).unwrap(),
        ),
    ];
    std::fs::write(&st, safetensors::serialize(views, None).unwrap()).unwrap();
    let mlp = model("mlp.ts.onnx");
    let run = |data: &[&str], ranks: &str| {
        let mut args = vec![
            "--ranks",
            ranks,
            "--steps",
            "4",
            "--global-batch",
            "8",
            "--precision",
            "f64",
        ];
        args.extend_from_slice(data);
        losses(&run_json(&mlp, &args))
    };
    let from_npy = run(
        &[
            "--data",
            features.to_str().unwrap(),
            "--labels",
            labels.to_str().unwrap(),
        ],
        "2",
    );
    let from_st = run(&["--data", st.to_str().unwrap()], "2");
    let one = run(&["--data", st.to_str().unwrap()], "1");
    assert_eq!(from_npy, from_st);
    for (a, b) in one.iter().zip(&from_st) {
        assert!(((a - b) / a).abs() <= 1e-9, "{one:?} vs {from_st:?}");
    }
    assert!(from_st[3] < from_st[0], "{from_st:?}");
}

/// A model, objective or file that does not fit is one error line (exit
/// 2) naming the output, input, flag or file.
#[test]
fn misfits_are_named_with_the_flag_that_fits() {
    let dir = tempfile::tempdir().unwrap();
    let narrow = npy(dir.path(), "narrow.npy", &[8, 32], &[0f32; 8 * 32]);
    let labels = npy(dir.path(), "labels.npy", &[8], &[1i64; 8]);
    let (narrow, labels) = (narrow.to_str().unwrap(), labels.to_str().unwrap());
    let (mlp, bart) = (model("mlp.ts.onnx"), model("bart.ts.onnx"));
    let tokens = common::scratch_file("tokens.bin", &[1, 0, 2, 0, 3, 0]);
    let tokens = tokens.to_str().unwrap();
    let cases: [(&[&str], &[&str]); 6] = [
        (
            &["--objective", "lm"],
            &[
                "--objective lm trains one float output of shape [batch, seq, vocab]",
                "'output' f32 [2, 10]",
            ],
        ),
        (
            &["--data", narrow, "--labels", labels],
            &[narrow, "input 'x' takes rows of [64]"],
        ),
        (
            &["--data", tokens],
            &[tokens, "--objective classify reads features from .npy"],
        ),
        (&["--data", narrow], &[narrow, "give --labels LABELS.npy"]),
        (
            &["--objective", "seq2seq"],
            &["--objective seq2seq trains one float output"],
        ),
        (
            &["--objective", "mlm"],
            &["--objective mlm trains one float output"],
        ),
    ];
    let refused = |model: &str, extra: &[&str], needles: &[&str]| {
        let mut args = vec!["run", model, "--plan", "auto", "--ranks", "1", "--steps", "1"];
        args.extend_from_slice(extra);
        assert_error(&args, 2, needles);
    };
    for (extra, needles) in cases {
        refused(&mlp, extra, needles);
    }
    let bart_cases: [(&[&str], &[&str]); 3] = [
        (
            &["--objective", "lm"],
            &[
                "input 'decoder_input_ids'",
                "decoder inputs are fed under --objective seq2seq",
            ],
        ),
        (
            &["--labels", labels],
            &["--labels", "labels go with --data FEATURES.npy"],
        ),
        (
            &["--data", narrow],
            &["--objective seq2seq trains on a uint16 token file"],
        ),
    ];
    for (extra, needles) in bart_cases {
        refused(&bart, extra, needles);
    }
    // An unknown objective is refused by the flag's parser, listing the names.
    let (code, _, err) = autopar(&[
        "run",
        &mlp,
        "--plan",
        "auto",
        "--ranks",
        "1",
        "--objective",
        "ranking",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("unknown objective 'ranking' (expected lm, seq2seq, mlm, classify, regress)"),
        "{err}"
    );
}

/// `--help` documents the objectives and the arrays `--data` reads.
#[test]
fn help_names_the_objectives() {
    let (code, out, _) = autopar(&["run", "--help"]);
    assert_eq!(code, 0);
    for needle in [
        "--objective",
        "seq2seq",
        "mlm",
        "classify",
        "regress",
        ".safetensors",
        "--labels",
    ] {
        assert!(out.contains(needle), "{needle} missing from:\n{out}");
    }
}

/// A plan is made for an objective (inferred, or `--objective`), prices
/// its loss and records it; a run of the plan trains it without the flag,
/// and a run asking for an objective of another loss is refused with the
/// flag that fits.
#[test]
fn plans_record_the_objective_whose_loss_they_price() {
    let dir = tempfile::tempdir().unwrap();
    let mlp = model("mlp.ts.onnx");
    let mut files = Vec::new();
    for (flag, objective) in [(None, "classify"), (Some("regress"), "regress")] {
        let file = dir.path().join(format!("{objective}.json"));
        let mut args = vec![
            "plan",
            &mlp,
            "--cluster",
            "cpu",
            "--gpus",
            "2",
            "--global-batch",
            "8",
        ];
        let out = file.to_str().unwrap();
        args.extend(["-o", out, "--json"]);
        if let Some(o) = flag {
            args.extend(["--objective", o]);
        }
        let (code, stdout, err) = autopar(&args);
        assert_eq!(code, 0, "{err}");
        let plan: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(plan["inputs"]["objective"], objective);
        files.push(file);
    }
    let regress = files[1].to_str().unwrap();
    let run = ["run", &mlp, "--plan", regress, "--ranks", "2", "--steps", "1"];
    let (code, stdout, err) = autopar(&[&run[..], &["--json"]].concat());
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["objective"], "regress");
    let classify = [&run[..], &["--objective", "classify"]].concat();
    assert_error(
        &classify,
        2,
        &["regress", "squared_error", "classify", "--objective"],
    );
}
