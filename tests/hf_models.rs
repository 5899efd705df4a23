//! The development set's vision models, dynamic-axes export and folded
//! tied head (`fixtures/hf-models/`: a CNN and a ViT from both exporters,
//! Qwen2 with dynamic batch and sequence axes, MobileBERT's legacy export,
//! Falcon's grouped-query layout)
//! import, give onnxruntime's outputs, have PyTorch's parameter count, and
//! plan on a GPU node and on this host.

mod common;

use autopar::{check, model};
use autopar_ir::interp::Precision;
use common::{autopar, scratch};
use std::path::PathBuf;

const MODELS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/hf-models");
const STEMS: [&str; 7] = [
    "convnet3.ts",
    "convnet3.dynamo",
    "vit.ts",
    "vit.dynamo",
    "qwen2_dynamic.ts",
    "mobilebert.ts",
    "falcon-gqa.ts",
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

/// The trainable elements are PyTorch's `parameters()`, recorded beside
/// each export: the ViT's dynamo export folds its class token expanded over
/// the batch (one weight) and its attention mask (a constant), and
/// MobileBERT's legacy export folds the tied embedding into its LM head.
/// The CNN is left out: both exporters fold its batch norms' scales and
/// shifts into the convolutions (eval mode), so those 32 are not there.
#[test]
fn parameter_counts_are_pytorchs() {
    for stem in ["vit.ts", "vit.dynamo", "mobilebert.ts", "falcon-gqa.ts"] {
        let meta: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(format!("{MODELS}/{stem}.meta.json")).unwrap())
                .unwrap();
        let m = model::load_with(
            &path(stem),
            model::Axes {
                batch: Some(2),
                seq: Some(16),
                ..Default::default()
            },
        )
        .unwrap();
        let ours = m
            .graph
            .float_parameter_elements(&model::bindings(&m.graph, Some(2), Some(16)));
        assert_eq!(ours, meta["torch_params"].as_u64().unwrap(), "{stem}");
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
/// transposed copy of GPT-2's tied embedding reads the embedding, the
/// rotary tables and scalars the dynamo exporter folded from Llama's
/// buffers stay constants, and the ViT's folded class token and mask are
/// one weight and a constant, so the two exports give one loss curve.
#[test]
fn both_exports_train_the_same_losses() {
    let losses = |stem: &str| -> Vec<f64> {
        let args = [
            "run", stem, "--plan", "auto", "--ranks", "1", "--steps", "3", "--json",
        ];
        let (code, stdout, err) = autopar(&args);
        assert_eq!(code, 0, "{stem}: {err}");
        let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
        v["losses"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l.as_f64().unwrap())
            .collect()
    };
    let fixture = |model: &str, export: &str| {
        format!(
            "{}/fixtures/models/{model}.{export}.onnx",
            env!("CARGO_MANIFEST_DIR")
        )
    };
    let pairs = [
        (fixture("gpt2-tiny", "ts"), fixture("gpt2-tiny", "dynamo")),
        (fixture("llama-tiny", "ts"), fixture("llama-tiny", "dynamo")),
        (path("vit.ts"), path("vit.dynamo")),
    ];
    for (a, b) in pairs {
        let (ts, dynamo) = (losses(&a), losses(&b));
        assert_eq!(ts.len(), 3);
        for (x, y) in ts.iter().zip(&dynamo) {
            assert!((x - y).abs() <= 1e-5 * y.abs(), "{a}: {ts:?} vs {dynamo:?}");
        }
    }
}
