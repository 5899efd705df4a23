//! `autopar estimate` through the real binary: the JSON contract, the
//! human report (snapshot), and clear errors for bad input.

mod common;

use common::{assert_error, autopar};

const GPT: &str = "gpt:layers=8,hidden=1024,heads=16,vocab=50304,seq=1024,dtype=bf16";

fn estimate(extra: &[&str]) -> (i32, String, String) {
    autopar(&estimate_args(extra))
}

/// `autopar estimate` of [`GPT`] on A100s, with `extra`.
fn estimate_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec!["estimate", GPT, "--cluster", "dgx-a100-80g"];
    args.extend_from_slice(extra);
    args
}

/// Each `(extra flags, needle)` case is refused with exit 2 in one line
/// naming the needle.
fn assert_refused(cases: &[(&[&str], &str)]) {
    for (extra, needle) in cases {
        assert_error(&estimate_args(extra), 2, &[needle]);
    }
}

#[test]
fn json_has_the_contract_keys() {
    let (code, out, err) = estimate(&[
        "--gpus",
        "16",
        "--tp",
        "2",
        "--pp",
        "2",
        "--global-batch",
        "64",
        "--json",
    ]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    for key in [
        "step_time_s",
        "model_tflops_per_gpu",
        "hardware_tflops_per_gpu",
        "mfu",
        "hfu",
        "memory_per_gpu_bytes",
        "fits",
        "breakdown",
    ] {
        assert!(v.get(key).is_some(), "missing {key}: {out}");
    }
    let b = &v["breakdown"];
    for key in [
        "compute_s",
        "tp_comm_s",
        "dp_comm_s",
        "bubble_s",
        "p2p_s",
        "optimizer_s",
    ] {
        assert!(b[key].as_f64().is_some(), "breakdown lacks {key}: {b}");
    }
    assert_eq!(v["config"]["dp"], 4);
    assert_eq!(v["config"]["micro_batches"], 16);
    assert!(v["fits"].as_bool().unwrap());
    let mfu = v["mfu"].as_f64().unwrap();
    assert!(mfu > 0.0 && mfu < 1.0, "{mfu}");
}

#[test]
fn human_report() {
    let (code, out, err) = estimate(&[
        "--gpus",
        "16",
        "--tp",
        "2",
        "--pp",
        "2",
        "--global-batch",
        "64",
        "--recompute",
        "selective",
        "--schedule",
        "interleaved",
        "--zero",
        "1",
        "--sp",
    ]);
    assert_eq!(code, 0, "{err}");
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("../snapshots");
    settings.bind(|| insta::assert_snapshot!("estimate__gpt_16_gpus", out));
}

#[test]
fn onnx_models_with_fixed_shapes_estimate_at_their_batch() {
    let model = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/models/llama-tiny.ts.onnx");
    let args = [
        "estimate",
        model,
        "--cluster",
        "dgx-h100",
        "--gpus",
        "4",
        "--tp",
        "2",
        "--global-batch",
        "8",
    ];
    let (code, out, err) = autopar(&args);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("micro-batches of 2"), "{out}");
    let mut with_mb = args.to_vec();
    with_mb.extend(["--micro-batch", "4"]);
    assert_error(&with_mb, 2, &["fixed micro-batch of 2"]);
}

#[test]
fn unknown_preset() {
    assert_error(
        &[
            "estimate",
            GPT,
            "--cluster",
            "dgx-z900",
            "--gpus",
            "8",
            "--global-batch",
            "8",
        ],
        2,
        &["unknown cluster preset 'dgx-z900'", "dgx-a100-80g"],
    );
}

#[test]
fn tp_not_dividing_heads() {
    let llama = "llama:layers=2,hidden=512,ffn=1024,heads=8,kv_heads=2,vocab=1000,seq=128";
    assert_error(
        &[
            "estimate",
            llama,
            "--cluster",
            "dgx-h100",
            "--gpus",
            "4",
            "--tp",
            "4",
            "--global-batch",
            "4",
        ],
        2,
        &["--tp 4 does not divide the attention's 2 key/value heads"],
    );
    assert_refused(&[(
        &["--gpus", "6", "--tp", "6", "--global-batch", "8"],
        "--tp 6 does not divide the attention's 16 query heads",
    )]);
}

#[test]
fn gpus_not_divisible_by_tp_times_pp() {
    assert_refused(&[
        (
            &["--gpus", "8", "--tp", "2", "--pp", "3", "--global-batch", "8"],
            "--gpus 8 is not divisible by tp·pp·cp",
        ),
        (&["--gpus", "12", "--global-batch", "12"], "--gpus 12"),
    ]);
}

#[test]
fn zero_or_indivisible_batch() {
    assert_refused(&[
        (
            &["--gpus", "8", "--global-batch", "0"],
            "--global-batch must be at least 1",
        ),
        (
            &["--gpus", "8", "--global-batch", "12"],
            "--global-batch 12 is not divisible by dp · micro-batch",
        ),
        (
            &["--gpus", "8", "--global-batch", "8", "--micro-batch", "0"],
            "--micro-batch",
        ),
    ]);
}

#[test]
fn other_bad_configurations() {
    assert_refused(&[
        (&["--gpus", "8", "--global-batch", "8", "--zero", "4"], "--zero 4"),
        (
            &[
                "--gpus",
                "8",
                "--pp",
                "8",
                "--virtual-stages",
                "2",
                "--schedule",
                "interleaved",
                "--global-batch",
                "8",
            ],
            "exceeds the model's 8 layers",
        ),
        (
            &["--gpus", "8", "--global-batch", "8", "--virtual-stages", "2"],
            "needs --schedule interleaved",
        ),
        (
            &[
                "--gpus",
                "8",
                "--pp",
                "2",
                "--schedule",
                "interleaved",
                "--global-batch",
                "12",
            ],
            "micro-batches per step (3) to be a multiple of --pp 2",
        ),
        (
            &["--gpus", "8", "--global-batch", "8", "--dp", "4"],
            "differs from --gpus 8",
        ),
        (
            &[
                "--gpus",
                "8",
                "--global-batch",
                "8",
                "--zero",
                "3",
                "--overlap-param-gather",
            ],
            "with --zero 3 there is none",
        ),
        (
            &["--gpus", "6", "--cp", "3", "--global-batch", "6"],
            "--cp 3 cuts the sequence into 6 chunks",
        ),
    ]);
    common::assert_usage_error(
        &estimate_args(&["--gpus", "8", "--global-batch", "8", "--recompute", "some"]),
        &["some", "none, selective, full"],
    );
}

#[test]
fn bad_calibration_file_is_named() {
    let path = common::scratch_file(
        "cal.json",
        br#"{"format": "autopar-calibration/1", "memory": {"bandwidth_fraction": 2}}"#,
    );
    let p = path.to_str().unwrap();
    assert_error(
        &estimate_args(&["--gpus", "8", "--global-batch", "8", "--calibration", p]),
        2,
        &["cal.json", "memory.bandwidth_fraction"],
    );
}

/// `--grad-compression` prices 16-bit gradient reductions: on f32 weights
/// a ZeRO-0 rank sends half the gradient bytes; other methods are refused
/// with the ones there are.
#[test]
fn grad_compression_halves_f32_gradient_bytes() {
    let f32_gpt = "gpt:layers=2,hidden=256,heads=4,vocab=1024,seq=128";
    let bytes = |extra: &[&str]| {
        let mut args = vec!["estimate", f32_gpt, "--cluster", "dgx-a100-80g"];
        args.extend_from_slice(&["--gpus", "16", "--global-batch", "16", "--json"]);
        args.extend_from_slice(extra);
        let (code, out, err) = autopar(&args);
        assert_eq!(code, 0, "{err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["comm_bytes_per_gpu"].as_f64().unwrap()
    };
    let plain = bytes(&[]);
    for method in ["bf16", "fp16"] {
        let packed = bytes(&["--grad-compression", method]);
        assert!(
            (packed - plain / 2.0).abs() <= 1e-9 * plain,
            "{method}: {packed} vs {plain}"
        );
    }
    // The lossy methods send fewer bytes still; under ZeRO they are refused.
    for method in ["powersgd:4", "topk:0.01"] {
        let sent = bytes(&["--grad-compression", method]);
        assert!(sent < 0.25 * plain, "{method}: {sent} vs {plain}");
        assert_error(
            &estimate_args(&[
                "--gpus",
                "8",
                "--global-batch",
                "8",
                "--grad-compression",
                method,
                "--zero",
                "1",
            ]),
            2,
            &[method, "ZeRO 1 reduce-scatters"],
        );
    }
    common::assert_usage_error(
        &estimate_args(&["--gpus", "8", "--global-batch", "8", "--grad-compression", "int8"]),
        &["int8", "bf16, fp16, powersgd:R or topk:F"],
    );
}
