//! The training graph that lowering builds from a model, run through the
//! reference interpreter: its loss is the mean cross-entropy of the logits,
//! and inputs it cannot classify are named. (Zoo models import weightless,
//! so the test initializes them with the training crate's initializer.)

use autopar_exec::train::initialize;
use autopar_ir::interp::{run, Precision};
use autopar_ir::{DType, Graph, Value};
use autopar_lower::{training_graph, Objective};
use std::collections::BTreeMap;

fn tiny_gpt() -> Graph {
    let mut g = autopar_import::zoo::build("gpt:layers=2,hidden=16,heads=2,vocab=32,seq=8").unwrap();
    initialize(&mut g, 1).unwrap();
    g
}

#[test]
fn loss_is_the_mean_cross_entropy() {
    let model = tiny_gpt();
    let t = training_graph(&model, 2, 8, 2, Objective::Lm).unwrap();
    assert_eq!(t.loss, "loss/mean");
    assert!(t.gradients.len() > 4);
    assert!(t.forward.iter().any(|n| n == "loss/mean"));
    // Feed uniform tokens; compare the loss with log-softmax computed by hand on the logits.
    let tokens: Vec<i64> = (0..16).map(|i| i % 32).collect();
    let targets: Vec<i64> = (0..16).map(|i| (i * 3 + 1) % 32).collect();
    let mut feeds = BTreeMap::new();
    feeds.insert(
        "input_ids".to_string(),
        Value::i64(vec![2, 8], tokens.clone()).unwrap(),
    );
    let positions: Vec<i64> = (0..16).map(|i| i % 8).collect();
    feeds.insert(
        "position_ids".to_string(),
        Value::i64(vec![2, 8], positions).unwrap(),
    );
    let logits = run(&model_bound(&model), &feeds, Precision::F64)
        .unwrap()
        .remove(0)
        .to_f64_vec();
    let mut expected = 0.0;
    for (row, &target) in targets.iter().enumerate() {
        let l = &logits[row * 32..(row + 1) * 32];
        let max = l.iter().cloned().fold(f64::MIN, f64::max);
        let lse = max + l.iter().map(|x| (x - max).exp()).sum::<f64>().ln();
        expected += lse - l[target as usize];
    }
    expected /= 16.0;
    feeds.insert("targets".to_string(), Value::i64(vec![2, 8], targets).unwrap());
    feeds.insert(
        "loss/mean.cotangent".to_string(),
        Value::f32(vec![], vec![1.0]).unwrap(),
    );
    let outs = run(&t.graph, &feeds, Precision::F64).unwrap();
    let loss = outs[0].to_f64_vec()[0];
    assert!(
        (loss - expected).abs() < 1e-12 * expected.abs(),
        "{loss} vs {expected}"
    );
}

fn model_bound(model: &Graph) -> Graph {
    let mut g = model.clone();
    g.bindings.insert("batch".into(), 2);
    g.bindings.insert("seq".into(), 8);
    g
}

#[test]
fn unknown_inputs_and_fixed_dims_are_named() {
    let mut model = tiny_gpt();
    let t = model.inputs[0];
    model.tensor_mut(t).name = "pixels".into();
    model.tensor_mut(t).ty.dtype = DType::F32;
    let err = training_graph(&model, 2, 8, 2, Objective::Lm)
        .unwrap_err()
        .to_string();
    assert!(err.contains("'pixels'"), "{err}");
}
