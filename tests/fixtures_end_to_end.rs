//! End-to-end checks of the CLI library over every fixture model: import,
//! parameter counts, interpreter outputs vs onnxruntime (with and without
//! rewrites, f32 and f64), JSON round trips, and `inspect` snapshots.

use autopar::{check, inspect, model};
use autopar_ir::interp::Precision;
use autopar_ir::json;
use std::path::PathBuf;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures");

fn index() -> serde_json::Value {
    let text = std::fs::read_to_string(format!("{FIXTURES}/models/index.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// (file name, parameter elements) of every fixture model: the file's
/// float initializer elements less those of an exporter's tied copies
/// (which read the weight they copy) and of the buffers and scalars it
/// folded (constants).
fn fixture_models() -> Vec<(String, u64)> {
    index()["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let count =
                m["float_param_count"].as_u64().unwrap() - m["not_parameter_elements"].as_u64().unwrap();
            (m["file"].as_str().unwrap().to_string(), count)
        })
        .collect()
}

/// Stems with reference data (`fixtures/reference/<stem>/test_data_set_0`).
fn reference_stems() -> Vec<String> {
    let mut stems: Vec<String> = std::fs::read_dir(format!("{FIXTURES}/reference"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    stems.sort();
    stems
}

fn model_path(file: &str) -> String {
    format!("{FIXTURES}/models/{file}")
}

#[test]
fn every_fixture_reports_its_float_initializer_elements() {
    let models = fixture_models();
    assert_eq!(models.len(), 14);
    for (file, float_params) in models {
        let r = inspect::report(&model_path(&file), None, None).unwrap();
        assert_eq!(r.float_initializer_elements, float_params, "{file}");
        assert_eq!(r.weightless, file.contains("weightless"), "{file}");
    }
}

#[test]
fn check_passes_on_every_reference_with_and_without_rewrites() {
    let stems = reference_stems();
    assert_eq!(stems.len(), 8);
    for stem in stems {
        let data = PathBuf::from(format!("{FIXTURES}/reference/{stem}/test_data_set_0"));
        for rewrite in [false, true] {
            let r = check::run(
                &model_path(&format!("{stem}.onnx")),
                &data,
                rewrite,
                Precision::F32,
                None,
            )
            .unwrap();
            println!("{}", check::render(&r));
            assert!(r.ok, "{stem} rewrite={rewrite}: {:?}", r.outputs);
        }
    }
}

#[test]
fn f64_runs_agree_with_the_f32_reference() {
    let stem = "llama-tiny.dynamo";
    let data = PathBuf::from(format!("{FIXTURES}/reference/{stem}/test_data_set_0"));
    let r = check::run(
        &model_path(&format!("{stem}.onnx")),
        &data,
        true,
        Precision::F64,
        None,
    )
    .unwrap();
    assert!(r.ok, "{:?}", r.outputs);
}

#[test]
fn json_round_trip_is_identical_for_every_fixture() {
    for (file, _) in fixture_models() {
        let m = model::load(&model_path(&file)).unwrap();
        let text = json::to_json(&m.graph);
        let back = json::from_json(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(json::to_doc(&back), json::to_doc(&m.graph), "{file}");
    }
}

#[test]
fn inspect_snapshots() {
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path("../snapshots");
    settings.set_prepend_module_to_snapshot(false);
    settings.bind(|| {
        for (file, _) in fixture_models() {
            let mut r = inspect::report(&model_path(&file), None, None).unwrap();
            r.model = file.clone();
            insta::assert_snapshot!(format!("inspect__{file}"), inspect::render(&r));
        }
        for spec in [
            "gpt:layers=24,hidden=2304,heads=24,vocab=51200,seq=2048",
            "llama:layers=32,hidden=4096,ffn=11008,heads=32,vocab=32000,seq=4096",
            "moe:layers=32,hidden=4096,ffn=14336,heads=32,kv_heads=8,experts=8,top_k=2,vocab=32000,seq=4096",
            "bert:layers=12,hidden=768,heads=12,ffn=3072,vocab=30522,seq=512",
        ] {
            let r = inspect::report(spec, None, None).unwrap();
            let family = spec.split(':').next().unwrap();
            insta::assert_snapshot!(format!("inspect__zoo_{family}"), inspect::render(&r));
        }
    });
}
