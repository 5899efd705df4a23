//! The development set's vision models and dynamic-axes export
//! (`fixtures/hf-models/`: a CNN and a ViT from both exporters, Qwen2 with
//! dynamic batch and sequence axes) import, give onnxruntime's outputs,
//! and plan on a GPU node and on this host.

mod common;

use autopar::{check, model};
use autopar_ir::interp::Precision;
use common::{autopar, scratch};
use std::path::PathBuf;

const MODELS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/hf-models");
const STEMS: [&str; 5] = [
    "convnet3.ts",
    "convnet3.dynamo",
    "vit.ts",
    "vit.dynamo",
    "qwen2_dynamic.ts",
];

fn path(stem: &str) -> String {
    format!("{MODELS}/{stem}.onnx")
}

#[test]
fn each_matches_onnxruntime_with_and_without_rewrites() {
    for stem in STEMS {
        let data = PathBuf::from(format!("{MODELS}/{stem}/test_data_set_0"));
        for rewrite in [false, true] {
            let r = check::run(&path(stem), &data, rewrite, Precision::F32, None).unwrap();
            assert!(r.ok, "{stem} rewrite={rewrite}: {}", check::render(&r));
        }
    }
}

#[test]
fn each_plans_on_a_gpu_node_and_on_this_host() {
    for stem in STEMS {
        for (cluster, gpus) in [("dgx-h100", "8"), ("cpu", "4")] {
            let out = scratch("plan.json");
            let model = path(stem);
            let args = [
                "plan",
                model.as_str(),
                "--cluster",
                cluster,
                "--gpus",
                gpus,
                "--global-batch",
                "16",
                "-o",
                out.to_str().unwrap(),
                "--json",
            ];
            let (code, stdout, err) = autopar(&args);
            assert_eq!(code, 0, "{stem} on {cluster}: {err}");
            let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
            assert!(v["predicted"]["fits"].as_bool().unwrap(), "{stem} on {cluster}");
            assert!(
                !v["sharding"].as_array().unwrap().is_empty(),
                "{stem} on {cluster}"
            );
        }
    }
}

#[test]
fn dynamic_axes_bind_to_the_flags_or_name_them() {
    let model = path("qwen2_dynamic.ts");
    let (code, _, err) = autopar(&["inspect", model.as_str()]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("dynamic axes batch, seq") && err.contains("--batch and --seq"),
        "{err}"
    );
    let bound = model::load_with(
        &model,
        model::Axes {
            batch: Some(3),
            seq: Some(24),
            ..Default::default()
        },
    )
    .unwrap();
    let tokens = bound.graph.tensor(bound.graph.inputs[0]);
    assert_eq!(tokens.ty.shape.as_fixed(), Some(vec![3, 24]));
}

/// Both exports of a model train one set of weights: the legacy exporter's
/// transposed copy of GPT-2's tied embedding reads the embedding, and the
/// rotary tables and scalars the dynamo exporter folded from Llama's
/// buffers stay constants, so the two exports give one loss curve.
#[test]
fn both_exports_train_the_same_losses() {
    let losses = |model: &str, export: &str| -> Vec<f64> {
        let path = format!(
            "{}/fixtures/models/{model}.{export}.onnx",
            env!("CARGO_MANIFEST_DIR")
        );
        let args = [
            "run",
            path.as_str(),
            "--plan",
            "auto",
            "--ranks",
            "1",
            "--steps",
            "3",
            "--json",
        ];
        let (code, stdout, err) = autopar(&args);
        assert_eq!(code, 0, "{model}.{export}: {err}");
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        v["losses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l.as_f64().unwrap())
            .collect()
    };
    for model in ["gpt2-tiny", "llama-tiny"] {
        let (ts, dynamo) = (losses(model, "ts"), losses(model, "dynamo"));
        assert_eq!(ts.len(), 3);
        for (a, b) in ts.iter().zip(&dynamo) {
            assert!((a - b).abs() <= 1e-5 * b.abs(), "{model}: {ts:?} vs {dynamo:?}");
        }
    }
}
