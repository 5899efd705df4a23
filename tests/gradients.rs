//! Gradients against PyTorch: for every reference model, the backward pass
//! autodiff builds matches every saved float64 gradient (relative error
//! ≤ 1e-6 in f64, ≤ 1e-4 in f32), with and without rewrites.

use autopar::check;
use autopar_ir::interp::Precision;
use std::path::PathBuf;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures");

fn stems() -> Vec<String> {
    let mut stems: Vec<String> = std::fs::read_dir(format!("{FIXTURES}/reference"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|s| PathBuf::from(format!("{FIXTURES}/reference/{s}/grads/manifest.json")).exists())
        .collect();
    stems.sort();
    stems
}

fn check_model(stem: &str, rewrite: bool, precision: Precision) -> check::CheckReport {
    let data = PathBuf::from(format!("{FIXTURES}/reference/{stem}/test_data_set_0"));
    let grads = PathBuf::from(format!("{FIXTURES}/reference/{stem}/grads"));
    let model = format!("{FIXTURES}/models/{stem}.onnx");
    check::run(&model, &data, rewrite, precision, Some(&grads))
        .unwrap_or_else(|e| panic!("{stem} rewrite={rewrite}: {e:#}"))
}

#[test]
fn every_reference_gradient_matches_in_f64_and_f32() {
    let stems = stems();
    assert_eq!(stems.len(), 7);
    let mut failures = vec![];
    for stem in &stems {
        for rewrite in [false, true] {
            for precision in [Precision::F64, Precision::F32] {
                let r = check_model(stem, rewrite, precision);
                println!("{}", check::render(&r));
                assert!(!r.gradients.is_empty(), "{stem}: no gradients checked");
                if !r.ok {
                    failures.push(format!("{stem} rewrite={rewrite} {precision:?}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "gradient mismatches: {failures:?}");
}
