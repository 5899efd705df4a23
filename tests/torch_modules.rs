//! Models written with torch.nn's own modules (`fixtures/torch-modules/`,
//! made by its `make.py`): ONNX `Mod` on activations, and
//! `nn.TransformerEncoder` through the TorchScript exporter, whose
//! attention computes a `Mod` of two constants. Each gives onnxruntime's
//! outputs; the encoder also PyTorch's gradients and parameter count, and
//! it trains.

mod common;

use autopar::{check, model};
use autopar_ir::interp::Precision;
use common::run_json;
use std::path::PathBuf;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/torch-modules");

fn path(stem: &str) -> String {
    format!("{DIR}/{stem}.onnx")
}

#[test]
fn each_matches_onnxruntime_with_and_without_rewrites() {
    for stem in ["mod", "encoder.ts"] {
        let data = PathBuf::from(format!("{DIR}/{stem}/test_data_set_0"));
        for rewrite in [false, true] {
            let r = check::run(&path(stem), &data, rewrite, Precision::F32, None).unwrap();
            assert!(r.ok, "{stem} rewrite={rewrite}: {}", check::render(&r));
        }
    }
}

#[test]
fn the_encoder_has_pytorchs_parameters_and_gradients() {
    let m = model::load_with(&path("encoder.ts"), model::Axes::default()).unwrap();
    let bindings = model::bindings(&m.graph, None, None);
    assert_eq!(m.graph.float_parameter_elements(&bindings), 21_248);
    let data = PathBuf::from(format!("{DIR}/encoder.ts/test_data_set_0"));
    let grads = PathBuf::from(format!("{DIR}/encoder.ts/grads"));
    let r = check::run(&path("encoder.ts"), &data, true, Precision::F64, Some(&grads)).unwrap();
    assert!(r.ok, "{}", check::render(&r));
    assert_eq!(r.gradients.len(), 27);
}

#[test]
fn the_encoder_trains_on_two_ranks() {
    let model = path("encoder.ts");
    let r = run_json(&[&model, "--plan", "auto", "--ranks", "2", "--steps", "20"]);
    let losses: Vec<f64> = r["losses"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_f64().unwrap())
        .collect();
    assert_eq!(losses.len(), 20);
    // Synthetic tokens are noisy step to step: compare the ends' means.
    let mean = |l: &[f64]| l.iter().sum::<f64>() / l.len() as f64;
    assert!(mean(&losses[16..]) < 0.95 * mean(&losses[..4]), "{losses:?}");
}
