//! ONNX's own operator conformance tests (backend node tests), run through the
//! importer and the CPU interpreter. Prints the pass count per op and overall;
//! asserts that every op a fixture model uses passes all of its tests.
//!
//! A test belongs to the op its name starts with (`test_layer_normalization_*`,
//! expanded function bodies included). Outputs are compared as ONNX's runner
//! does: `|actual − expected| ≤ 1e-7 + 1e-3·|expected|` element-wise, exact for
//! integers and booleans.

use autopar_import::onnx::{import_model_bytes, read_tensor_file, ImportOptions};
use autopar_ir::interp::{self, Precision};
use autopar_ir::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures");

/// Test-name prefixes that differ from the snake-cased op name, and ops that
/// appear only as expanded function bodies (so no test lists them).
const ALIASES: [(&str, &str); 16] = [
    ("batchnorm", "BatchNormalization"),
    ("basic_conv", "Conv"),
    ("training_dropout", "Dropout"),
    ("reduce_l1", "ReduceL1"),
    ("reduce_l2", "ReduceL2"),
    ("reduce_log_sum_exp", "ReduceLogSumExp"),
    ("reduce_log_sum", "ReduceLogSum"),
    ("reduce_sum_square", "ReduceSumSquare"),
    ("group_normalization", "GroupNormalization"),
    ("mvn", "MeanVarianceNormalization"),
    ("greater_equal", "GreaterOrEqual"),
    ("less_equal", "LessOrEqual"),
    ("sce", "SoftmaxCrossEntropyLoss"),
    ("nllloss", "NegativeLogLikelihoodLoss"),
    ("top_k", "TopK"),
    ("gathernd", "GatherND"),
];

/// Ops that must pass all of their tests whether or not a fixture model
/// uses them: those the importer builds from others (so every facet is the
/// others'), and the convolutions and pools vision and audio models need.
const REQUIRED: [&str; 11] = [
    "IsNaN",
    "IsInf",
    "Tile",
    "Pad",
    "GlobalAveragePool",
    "GlobalMaxPool",
    "Conv",
    "ConvTranspose",
    "MaxPool",
    "AveragePool",
    "BatchNormalization",
];

/// `RMSNormalization` → `rms_normalization`, `ReduceL1` → `reduce_l1`.
fn snake(op: &str) -> String {
    let chars: Vec<char> = op.chars().collect();
    let mut s = String::new();
    for (i, &c) in chars.iter().enumerate() {
        let prev_lower = i > 0 && !chars[i - 1].is_ascii_uppercase();
        let acronym_end = i > 0
            && chars[i - 1].is_ascii_uppercase()
            && chars.get(i + 1).is_some_and(|n| n.is_ascii_lowercase());
        if c.is_ascii_uppercase() && (prev_lower || acronym_end) {
            s.push('_');
        }
        s.push(c.to_ascii_lowercase());
    }
    s
}

/// The op a test checks: the longest known op name (snake-cased, or with
/// underscores dropped) that prefixes the test name.
fn owner(test: &str, ops: &BTreeSet<String>) -> String {
    let name = test.trim_start_matches("test_");
    let mut candidates: Vec<(String, String)> = ALIASES
        .iter()
        .map(|(p, o)| (p.to_string(), o.to_string()))
        .collect();
    for op in ops {
        candidates.push((snake(op), op.clone()));
        candidates.push((op.to_lowercase(), op.clone()));
    }
    candidates
        .into_iter()
        .filter(|(prefix, _)| {
            // `test_or2d`, `test_and_bcast3v1d`: a digit may follow directly.
            name.strip_prefix(prefix.as_str()).is_some_and(|rest| {
                rest.is_empty() || rest.starts_with('_') || rest.starts_with(|c: char| c.is_ascii_digit())
            })
        })
        .max_by_key(|(prefix, _)| prefix.len())
        .map(|(_, op)| op)
        .unwrap_or_else(|| name.split('_').next().unwrap_or(name).to_string())
}

fn read_set(dir: &Path, prefix: &str) -> Result<Vec<(String, Value)>, String> {
    let mut out = vec![];
    loop {
        let p = dir.join(format!("{prefix}_{}.pb", out.len()));
        if !p.exists() {
            return Ok(out);
        }
        out.push(read_tensor_file(&p).map_err(|e| format!("{}: {e}", p.display()))?);
    }
}

fn close(actual: &Value, expected: &Value) -> Result<(), String> {
    if actual.shape != expected.shape {
        return Err(format!("shape {:?}, expected {:?}", actual.shape, expected.shape));
    }
    if actual.dtype != expected.dtype {
        return Err(format!("dtype {}, expected {}", actual.dtype, expected.dtype));
    }
    let exact = !expected.dtype.is_float();
    for (i, (a, e)) in actual.to_f64_vec().iter().zip(expected.to_f64_vec()).enumerate() {
        let ok = if exact {
            *a == e
        } else {
            (a.is_nan() && e.is_nan()) || a == &e || (a - e).abs() <= 1e-7 + 1e-3 * e.abs()
        };
        if !ok {
            return Err(format!("element {i}: {a}, expected {e}"));
        }
    }
    Ok(())
}

/// Runs one test folder.
fn run_test(dir: &Path) -> Result<(), String> {
    let bytes = std::fs::read(dir.join("model.onnx")).map_err(|e| e.to_string())?;
    let data = dir.join("test_data_set_0");
    let inputs = read_set(&data, "input")?;
    let expected = read_set(&data, "output")?;
    let feeds: BTreeMap<String, Value> = inputs.into_iter().collect();
    // Import as a program first; a graph whose shapes depend on input values
    // (a Reshape target fed at run time, say) is imported with the inputs bound.
    let (graph, run_feeds) = match import_model_bytes(&bytes, &ImportOptions::default()) {
        Ok(g) => (g, feeds),
        Err(first) => {
            let opts = ImportOptions {
                feeds: feeds.clone(),
                ..Default::default()
            };
            let g = import_model_bytes(&bytes, &opts)
                .map_err(|e| format!("import: {first}; with inputs bound: {e}"))?;
            (g, BTreeMap::new())
        }
    };
    let actual = interp::run(&graph, &run_feeds, Precision::F32).map_err(|e| format!("run: {e}"))?;
    if actual.len() != expected.len() {
        return Err(format!("{} outputs, expected {}", actual.len(), expected.len()));
    }
    for (i, (a, (_, e))) in actual.iter().zip(&expected).enumerate() {
        close(a, e).map_err(|m| format!("output {i}: {m}"))?;
    }
    Ok(())
}

fn fixture_ops() -> BTreeSet<String> {
    let text = std::fs::read_to_string(format!("{FIXTURES}/models/index.json")).unwrap();
    let index: serde_json::Value = serde_json::from_str(&text).unwrap();
    index["models"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["op_histogram"].as_object().unwrap().keys().cloned())
        .collect()
}

#[test]
fn onnx_node_tests() {
    let root = PathBuf::from(format!("{FIXTURES}/onnx-node-tests"));
    let index: BTreeMap<String, Vec<String>> =
        serde_json::from_str(&std::fs::read_to_string(root.join("index.json")).unwrap()).unwrap();
    let all_ops: BTreeSet<String> = index.values().flatten().cloned().collect();
    let mut per_op: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    let mut failures: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for test in index.keys() {
        let op = owner(test, &all_ops);
        let entry = per_op.entry(op.clone()).or_default();
        entry.1 += 1;
        match std::panic::catch_unwind(|| run_test(&root.join(test))) {
            Ok(Ok(())) => entry.0 += 1,
            Ok(Err(e)) => failures.entry(op).or_default().push(format!("{test}: {e}")),
            Err(_) => failures.entry(op).or_default().push(format!("{test}: PANICKED")),
        }
    }
    let (passed, total) = per_op.values().fold((0, 0), |(p, t), (a, b)| (p + a, t + b));
    println!("ONNX node tests per op (passed/total):");
    for (op, (p, t)) in &per_op {
        println!("  {op:<28} {p:>4}/{t:<4}{}", if p == t { "" } else { "  *" });
    }
    println!(
        "ONNX node tests: {passed}/{total} passed ({:.1} %)",
        100.0 * passed as f64 / total as f64
    );
    let mut must_pass = vec![];
    for op in fixture_ops().into_iter().chain(REQUIRED.map(String::from)) {
        if let Some(f) = failures.get(&op) {
            must_pass.push(format!("{op}:\n    {}", f.join("\n    ")));
        }
    }
    for (op, f) in &failures {
        if !fixture_ops().contains(op) {
            println!("not required ({op}): {} failing, e.g. {}", f.len(), f[0]);
        }
    }
    assert!(
        must_pass.is_empty(),
        "ops used by fixture models fail node tests:\n{}",
        must_pass.join("\n")
    );
}

#[test]
fn test_names_map_to_their_ops() {
    let ops: BTreeSet<String> = [
        "Greater",
        "GreaterOrEqual",
        "LayerNormalization",
        "ReduceSum",
        "Reshape",
        "Cast",
        "CastLike",
        "TopK",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(owner("test_greater_equal_int16_expanded", &ops), "GreaterOrEqual");
    assert_eq!(owner("test_greater_int16", &ops), "Greater");
    assert_eq!(
        owner("test_layer_normalization_2d_axis0_expanded", &ops),
        "LayerNormalization"
    );
    assert_eq!(owner("test_reduce_sum_keepdims_random", &ops), "ReduceSum");
    assert_eq!(owner("test_castlike_FLOAT_to_DOUBLE", &ops), "CastLike");
    assert_eq!(owner("test_cast_FLOAT_to_DOUBLE", &ops), "Cast");
    assert_eq!(owner("test_top_k_uint64", &ops), "TopK");
    let ops: BTreeSet<String> = ["Or", "RMSNormalization"].iter().map(|s| s.to_string()).collect();
    assert_eq!(owner("test_or2d", &ops), "Or");
    assert_eq!(
        owner("test_rms_normalization_2d_axis0_expanded", &ops),
        "RMSNormalization"
    );
    assert_eq!(owner("test_reduce_l1_empty_set_expanded", &ops), "ReduceL1");
}
