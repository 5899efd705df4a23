//! Training objectives: which one a model's inputs and outputs call for,
//! what the training graph feeds and how it counts its loss for each, and
//! the errors naming the input, the output and the flag when a model does
//! not fit the objective asked for.

use autopar_ir::{DType, Graph, Op, Role, Shape, TensorType};
use autopar_lower::{bidirectional, training_graph, Feed, Objective, Task};

fn fixture(file: &str) -> Graph {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/models/").to_string() + file;
    autopar_import::onnx::load_model(std::path::Path::new(&path)).unwrap()
}

fn zoo(spec: &str) -> Graph {
    autopar_import::zoo::build(spec).unwrap()
}

/// A float input `x` of `input` dims through a linear map to an output of
/// `output` dims (a regression or classification head).
fn linear(input: &[usize], output: &[usize]) -> Graph {
    let mut g = Graph::new("linear");
    let ty = |dtype, dims: &[usize]| TensorType {
        dtype,
        shape: Shape::fixed(dims),
    };
    let x = g.add_tensor("x", ty(DType::F32, input), Role::Input, None);
    g.inputs.push(x);
    let w_dims = [*input.last().unwrap(), *output.last().unwrap()];
    let w = g.add_tensor("w", ty(DType::F32, &w_dims), Role::Parameter, None);
    let wide = g.add_tensor(
        "wide",
        ty(DType::F32, &[input[0], w_dims[1]]),
        Role::Activation,
        None,
    );
    g.add_node("matmul", Op::MatMul, vec![Some(x), Some(w)], vec![wide])
        .unwrap();
    let y = if output.len() == 2 {
        wide
    } else {
        let y = g.add_tensor("y", ty(DType::F32, output), Role::Activation, None);
        let shape = g.add_constant("shape", autopar_ir::Value::i64(vec![1], vec![-1]).unwrap());
        g.add_node(
            "flatten",
            Op::Reshape { allowzero: false },
            vec![Some(wide), Some(shape)],
            vec![y],
        )
        .unwrap();
        y
    };
    g.outputs.push(y);
    g
}

#[test]
fn objectives_are_inferred_from_inputs_and_outputs() {
    let cases: Vec<(&str, Graph, Option<Objective>)> = vec![
        (
            "zoo gpt",
            zoo("gpt:layers=1,hidden=16,heads=2,vocab=32,seq=8"),
            Some(Objective::Lm),
        ),
        // An encoder is not guessed to be one: lm unless asked for mlm.
        (
            "zoo bert",
            zoo("bert:layers=1,hidden=16,heads=2,vocab=32,seq=8"),
            Some(Objective::Lm),
        ),
        ("bert-tiny.ts", fixture("bert-tiny.ts.onnx"), Some(Objective::Lm)),
        ("bart.ts", fixture("bart.ts.onnx"), Some(Objective::Seq2Seq)),
        (
            "bart.dynamo",
            fixture("bart.dynamo.onnx"),
            Some(Objective::Seq2Seq),
        ),
        ("mlp.ts", fixture("mlp.ts.onnx"), Some(Objective::Classify)),
        (
            "mlp.dynamo",
            fixture("mlp.dynamo.onnx"),
            Some(Objective::Classify),
        ),
        (
            "[batch, 1] output",
            linear(&[2, 4], &[2, 1]),
            Some(Objective::Regress),
        ),
        ("[batch] output", linear(&[2, 4], &[2]), Some(Objective::Regress)),
        (
            "[batch, 3] output",
            linear(&[2, 4], &[2, 3]),
            Some(Objective::Classify),
        ),
        ("per-position output", linear(&[2, 5, 4], &[2, 5, 3]), None),
    ];
    for (name, g, want) in cases {
        match (autopar_lower::infer_objective(&g), want) {
            (Ok(got), Some(want)) => assert_eq!(got, want, "{name}"),
            (Err(e), None) => assert!(
                e.to_string()
                    .contains("--objective lm|seq2seq|mlm|classify|regress"),
                "{name}: {e}"
            ),
            (got, want) => panic!("{name}: {got:?}, expected {want:?}"),
        }
    }
}

/// Attention without a causal mask is what the CLI's note about
/// next-token prediction on encoders looks for.
#[test]
fn encoders_are_told_from_decoders_by_their_attention() {
    let bert = zoo("bert:layers=1,hidden=16,heads=2,vocab=32,seq=8");
    let gpt = zoo("gpt:layers=1,hidden=16,heads=2,vocab=32,seq=8");
    assert!(bidirectional(&bert));
    assert!(!bidirectional(&gpt));
    assert!(!bidirectional(&fixture("mlp.ts.onnx")), "no attention at all");
}

fn feeds(g: &Graph, objective: Objective) -> Vec<(String, Feed)> {
    training_graph(g, 2, 16, 4, objective)
        .unwrap()
        .feeds
        .into_iter()
        .filter(|(_, f)| *f != Feed::Seed)
        .collect()
}

fn named(pairs: &[(&str, Feed)]) -> Vec<(String, Feed)> {
    pairs.iter().map(|(n, f)| (n.to_string(), *f)).collect()
}

#[test]
fn each_objective_feeds_its_inputs_and_targets() {
    use Feed::*;
    let bart = fixture("bart.ts.onnx");
    assert_eq!(
        feeds(&bart, Objective::Seq2Seq),
        named(&[
            ("input_ids", Tokens),
            ("attention_mask", Ones),
            ("decoder_input_ids", DecoderTokens),
            ("targets", Targets)
        ])
    );
    let bert = fixture("bert-tiny.ts.onnx");
    assert_eq!(
        feeds(&bert, Objective::Mlm),
        named(&[
            ("input_ids", Tokens),
            ("attention_mask", Ones),
            ("targets", Targets),
            ("masked", Masked)
        ])
    );
    let mlp = fixture("mlp.ts.onnx");
    assert_eq!(
        feeds(&mlp, Objective::Classify),
        named(&[("x", Features), ("targets", Targets)])
    );
    assert_eq!(
        feeds(&mlp, Objective::Regress),
        named(&[("x", Features), ("targets", Values)])
    );
}

/// What one row holds, and so what the loss divides by: the global batch
/// (4 rows here) times the row's terms.
#[test]
fn tasks_say_what_a_row_holds() {
    let task = |g: &Graph, o| training_graph(g, 2, 16, 4, o).unwrap().task;
    assert_eq!(
        task(&fixture("bart.dynamo.onnx"), Objective::Seq2Seq),
        Task::Seq2Seq {
            source: 16,
            target: 16,
            vocab: 512
        }
    );
    // 15 % of 16 tokens, rounded; the mask token is the last id of the
    // output's vocabulary (bert-tiny's output is its 128-wide hidden state).
    assert_eq!(
        task(&fixture("bert-tiny.dynamo.onnx"), Objective::Mlm),
        Task::Mlm {
            seq: 16,
            vocab: 128,
            masked: 2,
            mask_token: 127
        }
    );
    let mlp = task(&fixture("mlp.dynamo.onnx"), Objective::Regress);
    let Task::Regress { inputs, outputs: 10 } = &mlp else {
        panic!("{mlp:?}")
    };
    assert_eq!(
        (inputs[0].name.as_str(), inputs[0].row.as_slice()),
        ("x", &[64][..])
    );
    for (t, terms) in [
        (task(&fixture("mlp.ts.onnx"), Objective::Classify), 1),
        (mlp, 10),
        (task(&fixture("bert-tiny.ts.onnx"), Objective::Mlm), 2),
        (task(&fixture("bart.ts.onnx"), Objective::Seq2Seq), 16),
    ] {
        assert_eq!(t.terms_per_row(), terms, "{t:?}");
    }
    // The cross-entropy's count is negated (it sums log-probabilities).
    for (g, objective, count) in [
        (fixture("mlp.ts.onnx"), Objective::Classify, -4.0),
        (fixture("mlp.ts.onnx"), Objective::Regress, 40.0),
        (fixture("bert-tiny.ts.onnx"), Objective::Mlm, -8.0),
    ] {
        let g = training_graph(&g, 2, 16, 4, objective).unwrap().graph;
        let (_, t) = g.tensors().find(|(_, x)| x.name == "loss/count").unwrap();
        assert_eq!(t.data.as_ref().unwrap().to_f64_vec(), [count], "{objective}");
    }
}

/// A model that does not fit the objective asked for is one error naming
/// the output or input and the flag that would train it.
#[test]
fn misfits_name_the_input_output_and_flag() {
    let mlp = fixture("mlp.ts.onnx");
    let bart = fixture("bart.ts.onnx");
    let bert = fixture("bert-tiny.ts.onnx");
    let mut float_tokens = zoo("gpt:layers=1,hidden=16,heads=2,vocab=32,seq=16");
    let t = float_tokens.inputs[0];
    float_tokens.tensor_mut(t).ty.dtype = DType::F32;
    float_tokens.tensor_mut(t).name = "pixels".into();
    let cases: [(&Graph, Objective, &str); 6] = [
        (
            &mlp,
            Objective::Lm,
            "--objective lm trains one float output of shape [batch, seq, vocab] (logits); the model's outputs: 'output' f32 [2, 10]",
        ),
        (
            &bart,
            Objective::Lm,
            "input 'decoder_input_ids' (i64 [2, 16]): autopar does not know how to feed it under --objective lm; decoder inputs are fed under --objective seq2seq",
        ),
        (
            &bart,
            Objective::Classify,
            "--objective classify trains one float output of shape [batch, classes] with two classes or more",
        ),
        (&bert, Objective::Seq2Seq, "--objective seq2seq needs a decoder input"),
        (
            &float_tokens,
            Objective::Mlm,
            "input 'pixels' (f32 [batch, seq]): autopar does not know how to feed it under --objective mlm; float features are fed under --objective classify or --objective regress",
        ),
        (
            &mlp,
            Objective::Seq2Seq,
            "--objective seq2seq trains one float output of shape [batch, target seq, vocab]",
        ),
    ];
    for (g, objective, want) in cases {
        let err = training_graph(g, 2, 16, 4, objective).unwrap_err().to_string();
        assert!(err.contains(want), "{objective}: {err}");
    }
}

/// One truth for the loss: for every kind of loss, the kernels the cost
/// model prices are the `loss/…` nodes lowering appends to the training
/// graph, one for one (but views: the targets' reshape runs no kernel).
#[test]
fn the_cost_model_prices_the_loss_lowering_appends() {
    use autopar_cost_models::workload::{Workload, WorkloadOptions};
    let gpt = "gpt:layers=1,hidden=16,heads=2,vocab=32,seq=8";
    let bert = "bert:layers=1,hidden=16,heads=2,vocab=32,seq=8";
    let cases = [
        ("gpt", zoo(gpt), Objective::Lm),
        ("bert", zoo(bert), Objective::Mlm),
        ("classifier", linear(&[4, 3], &[4, 5]), Objective::Classify),
        ("regressor", linear(&[4, 3], &[4, 1]), Objective::Regress),
    ];
    for (name, g, objective) in cases {
        let t = training_graph(&g, 4, 8, 4, objective).unwrap();
        let tg = &t.graph;
        let mut appended: Vec<String> = tg
            .node_indices()
            .map(|i| tg.node(i))
            .filter(|n| t.forward.contains(&n.name) && n.name.starts_with("loss/"))
            .filter(|n| !matches!(n.op, Op::Reshape { .. }))
            .map(|n| n.name.clone())
            .collect();
        let opts = WorkloadOptions {
            micro_batch: Some(4),
            seq: objective.on_tokens().then_some(8),
            loss: objective.loss(),
            ..WorkloadOptions::default()
        };
        let w = Workload::build(&g, &opts).unwrap();
        let mut priced: Vec<String> = w.loss.iter().map(|k| k.node.clone()).collect();
        appended.sort();
        priced.sort();
        assert_eq!(priced, appended, "{name} ({objective})");
    }
}
