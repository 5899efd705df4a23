//! ONNX import against the fixture models: every model imports, validates
//! and keeps exactly the float parameters `index.json` records; malformed
//! files give clear errors instead of panics.

use autopar_import::onnx::proto::{
    attribute_type, AttributeProto, Dimension, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
    TensorProto, TensorShapeProto, TypeProto, TypeProtoTensor, ValueInfoProto,
};
use autopar_import::onnx::{import_model_bytes, load_model, read_tensor_file, ImportOptions, OnnxError};
use autopar_ir::{Bindings, DType, Dim, Op, Role, Shape, Value};
use prost::Message;
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures"))
}

fn index() -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(fixtures().join("models/index.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["models"].as_array().unwrap().clone()
}

#[test]
fn every_fixture_imports_with_its_recorded_parameter_count() {
    for entry in index() {
        let file = entry["file"].as_str().unwrap();
        let graph =
            load_model(&fixtures().join("models").join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        graph.validate().unwrap_or_else(|e| panic!("{file}: {e}"));
        // An exporter's tied copies read the weight they copy, and the
        // buffers and scalars it folded are constants: neither is counted
        // (the index records how many elements they hold).
        let want =
            entry["float_param_count"].as_u64().unwrap() - entry["not_parameter_elements"].as_u64().unwrap();
        assert_eq!(
            graph.float_parameter_elements(&Bindings::new()),
            want,
            "{file}: float parameter elements"
        );
        let inputs = entry["inputs"].as_object().unwrap();
        assert_eq!(graph.inputs.len(), inputs.len(), "{file}: inputs");
        for &t in &graph.inputs {
            let tensor = graph.tensor(t);
            let dims: Vec<usize> = inputs[&tensor.name]["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            assert_eq!(
                tensor.ty.shape,
                Shape::fixed(&dims),
                "{file}: input {}",
                tensor.name
            );
        }
        assert_eq!(
            graph.outputs.len(),
            entry["outputs"].as_object().unwrap().len(),
            "{file}: outputs"
        );
        println!(
            "{file}: {} ONNX nodes -> {} nodes after folding; {:?}",
            entry["num_nodes"],
            graph.node_count(),
            graph.op_histogram()
        );
    }
}

#[test]
fn external_data_imports_weightless() {
    let graph = load_model(&fixtures().join("models/gpt2-full.dynamo.weightless.onnx")).unwrap();
    let params: Vec<_> = graph
        .tensors()
        .filter(|(_, t)| t.role == Role::Parameter)
        .collect();
    let big: Vec<_> = params
        .iter()
        .filter(|(_, t)| t.ty.shape.numel(&Bindings::new()) > Some(1000))
        .collect();
    assert!(!big.is_empty());
    assert!(
        big.iter().all(|(_, t)| t.data.is_none()),
        "external weights carry no data"
    );
    assert!(big.iter().any(|(_, t)| t.ty.shape == Shape::fixed(&[768, 2304])));
}

fn expect_err(bytes: &[u8]) -> OnnxError {
    match import_model_bytes(bytes, &ImportOptions::default()) {
        Ok(g) => panic!("imported {} nodes from garbage", g.node_count()),
        Err(e) => e,
    }
}

#[test]
fn malformed_files_are_clear_errors() {
    let bytes = std::fs::read(fixtures().join("models/bert-tiny.ts.onnx")).unwrap();
    let truncated = expect_err(&bytes[..bytes.len() / 2]);
    assert!(matches!(truncated, OnnxError::Decode(_)), "{truncated}");
    assert!(truncated.to_string().contains("protobuf decoding failed"));

    let empty = expect_err(&[]);
    assert!(matches!(empty, OnnxError::MissingGraph), "{empty}");
    assert!(empty.to_string().contains("not an ONNX model"));

    // A fixed pseudo-random stream: never a panic, always an error.
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for len in [1usize, 7, 64, 1000, 10_000] {
        let noise: Vec<u8> = (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        expect_err(&noise);
    }

    let missing = load_model(Path::new("/nonexistent/model.onnx")).unwrap_err();
    assert!(
        missing.to_string().contains("/nonexistent/model.onnx"),
        "{missing}"
    );
}

fn tensor_input(name: &str, dtype: DType, dims: &[i64]) -> ValueInfoProto {
    ValueInfoProto {
        name: name.into(),
        r#type: Some(TypeProto {
            tensor_type: Some(TypeProtoTensor {
                elem_type: dtype.onnx_code(),
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| Dimension {
                            dim_value: Some(d),
                            ..Default::default()
                        })
                        .collect(),
                }),
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn node(op_type: &str, domain: &str, name: &str, inputs: &[&str], outputs: &[&str]) -> NodeProto {
    NodeProto {
        op_type: op_type.into(),
        domain: domain.into(),
        name: name.into(),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: outputs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn model(nodes: Vec<NodeProto>, initializer: Vec<TensorProto>, output: &str) -> Vec<u8> {
    model_at(17, nodes, initializer, vec![output_info(output, None)])
}

fn output_info(name: &str, dims: Option<&[i64]>) -> ValueInfoProto {
    match dims {
        Some(dims) => tensor_input(name, DType::F32, dims),
        None => ValueInfoProto {
            name: name.into(),
            ..Default::default()
        },
    }
}

/// A model over input `x: f32[2, 3]` at ai.onnx `opset`.
fn model_at(
    opset: i64,
    nodes: Vec<NodeProto>,
    initializer: Vec<TensorProto>,
    output: Vec<ValueInfoProto>,
) -> Vec<u8> {
    ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: opset,
        }],
        graph: Some(GraphProto {
            name: "test".into(),
            node: nodes,
            initializer,
            input: vec![tensor_input("x", DType::F32, &[2, 3])],
            output,
            ..Default::default()
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

#[test]
fn unknown_ops_are_all_listed_in_one_error() {
    let bytes = model(
        vec![
            node("Relu", "", "ok", &["x"], &["a"]),
            node("FooBar", "", "foo_1", &["a"], &["b"]),
            node("FooBar", "", "foo_2", &["b"], &["c"]),
            node("Einsum", "", "", &["c"], &["d"]),
            node("FusedMatMul", "com.microsoft", "fused", &["d"], &["e"]),
        ],
        vec![],
        "e",
    );
    match expect_err(&bytes) {
        OnnxError::UnsupportedOps(ops) => assert_eq!(
            ops,
            vec![
                ("FooBar".to_string(), "foo_1".to_string()),
                ("Einsum".to_string(), "Einsum_3".to_string()),
                ("com.microsoft:FusedMatMul".to_string(), "fused".to_string()),
            ]
        ),
        other => panic!("{other}"),
    }
}

#[test]
fn bad_attribute_names_the_node() {
    let mut cast = node("Cast", "", "to_string", &["x"], &["y"]);
    cast.attribute.push(AttributeProto {
        name: "to".into(),
        r#type: attribute_type::INT,
        i: 14, // complex64: not modelled
        ..Default::default()
    });
    let err = expect_err(&model(vec![cast], vec![], "y")).to_string();
    assert!(
        err.contains("node 'to_string' (Cast)") && err.contains("code 14"),
        "{err}"
    );
}

/// An `i64` initializer of `dims` holding `v`.
fn ints(name: &str, dims: &[i64], v: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        data_type: DType::I64.onnx_code(),
        dims: dims.to_vec(),
        int64_data: v.to_vec(),
        ..Default::default()
    }
}

/// The weight `w: f32[3]` of ones, which the test models scale `x` by.
fn ones_weight() -> TensorProto {
    TensorProto {
        name: "w".into(),
        data_type: DType::F32.onnx_code(),
        dims: vec![3],
        float_data: vec![1.0; 3],
        ..Default::default()
    }
}

#[test]
fn shape_arithmetic_folds_to_constants() {
    // y = Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), [-1])): all but
    // the Reshape folds; the weight stays a parameter, never folded.
    let weight = ones_weight();
    let mut concat = node("Concat", "", "cat", &["d0u", "minus1"], &["shape"]);
    concat.attribute.push(AttributeProto {
        name: "axis".into(),
        r#type: attribute_type::INT,
        i: 0,
        ..Default::default()
    });
    let bytes = model(
        vec![
            node("Shape", "", "shape_of", &["x"], &["s"]),
            node("Gather", "", "first", &["s", "zero"], &["d0"]),
            node("Unsqueeze", "", "unsq", &["d0", "axes"], &["d0u"]),
            concat,
            node("Reshape", "", "reshape", &["x", "shape"], &["r"]),
            node("Flatten", "", "flat", &["r"], &["f"]),
            node("Mul", "", "scale", &["f", "w"], &["y"]),
        ],
        vec![
            ints("zero", &[], &[0]),
            ints("axes", &[1], &[0]),
            ints("minus1", &[1], &[-1]),
            weight,
        ],
        "y",
    );
    let graph = import_model_bytes(&bytes, &ImportOptions::default()).unwrap();
    let ops: Vec<String> = graph.node_indices().map(|n| graph.node(n).op.name()).collect();
    assert_eq!(ops, ["Reshape", "Flatten", "Mul"]);
    assert_eq!(graph.float_parameter_elements(&Bindings::new()), 3);

    // Feeding x turns every node into a constant, except the one reading the
    // parameter.
    let feeds = [("x".to_string(), Value::f32(vec![2, 3], vec![0.5; 6]).unwrap())].into();
    let graph = import_model_bytes(
        &bytes,
        &ImportOptions {
            feeds,
            ..Default::default()
        },
    )
    .unwrap();
    let ops: Vec<Op> = graph.node_indices().map(|n| graph.node(n).op.clone()).collect();
    assert_eq!(ops.len(), 1);
    assert!(graph.inputs.is_empty());
}

#[test]
fn reference_tensor_files_read() {
    for entry in index() {
        let stem = entry["file"].as_str().unwrap().trim_end_matches(".onnx");
        let dir = fixtures().join("reference").join(stem).join("test_data_set_0");
        if !dir.exists() {
            continue;
        }
        let inputs = entry["inputs"].as_object().unwrap();
        for (i, (name, spec)) in inputs.iter().enumerate() {
            let (pb_name, value) = read_tensor_file(&dir.join(format!("input_{i}.pb"))).unwrap();
            assert!(
                inputs.contains_key(&pb_name),
                "{stem}: input_{i}.pb is '{pb_name}'"
            );
            let dims: Vec<usize> = spec["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            assert_eq!(value.shape, dims, "{stem}: {name}");
            assert_eq!(value.dtype, DType::I64);
        }
        let (_, out) = read_tensor_file(&dir.join("output_0.pb")).unwrap();
        assert_eq!(out.dtype, DType::F32);
        assert!(out.to_f64_vec().iter().all(|x| x.is_finite()), "{stem}");
    }
}

fn op_names(bytes: &[u8]) -> Vec<String> {
    let graph = import_model_bytes(bytes, &ImportOptions::default()).unwrap();
    graph.node_indices().map(|n| graph.node(n).op.name()).collect()
}

#[test]
fn recorded_output_types_are_checked() {
    let relu = node("Relu", "", "act", &["x"], &["y"]);
    let bytes = model_at(17, vec![relu], vec![], vec![output_info("y", Some(&[2, 4]))]);
    let err = expect_err(&bytes).to_string();
    assert!(
        err.contains("node 'act'") && err.contains("f32[2, 4]") && err.contains("f32[2, 3]"),
        "{err}"
    );
}

#[test]
fn opset_dependent_forms() {
    // Softmax before opset 13 normalises over the flattened tail.
    let mut softmax = node("Softmax", "", "sm", &["x"], &["y"]);
    softmax.attribute.push(AttributeProto {
        name: "axis".into(),
        r#type: attribute_type::INT,
        i: 0,
        ..Default::default()
    });
    let old = model_at(
        11,
        vec![softmax.clone()],
        vec![],
        vec![output_info("y", Some(&[2, 3]))],
    );
    assert_eq!(op_names(&old), ["Flatten", "Softmax", "Reshape"]);
    let new = model_at(13, vec![softmax], vec![], vec![output_info("y", Some(&[2, 3]))]);
    assert_eq!(op_names(&new), ["Softmax"]);

    // Variadic Max is a chain; inference-mode Dropout an identity whose mask
    // folds to a constant.
    let max = node("Max", "", "m", &["x", "x", "x"], &["y"]);
    assert_eq!(op_names(&model(vec![max], vec![], "y")), ["Max", "Max"]);
    let dropout = node("Dropout", "", "d", &["x"], &["y", "mask"]);
    let bytes = model_at(
        13,
        vec![dropout],
        vec![],
        vec![output_info("y", None), output_info("mask", None)],
    );
    let graph = import_model_bytes(&bytes, &ImportOptions::default()).unwrap();
    let mask = graph.tensor(graph.outputs[1]);
    assert_eq!((mask.role, mask.ty.dtype), (Role::Constant, DType::Bool));
    assert_eq!(op_names(&bytes), ["Identity"]);
}

/// xorshift64: a fixed pseudo-random stream for corruption tests.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

#[test]
fn corrupted_models_never_panic() {
    // Deterministic corruptions of a real model's structure (attribute values,
    // constant contents, input wiring): each import succeeds or errors.
    let bytes = std::fs::read(fixtures().join("models/gpt2-tiny.ts.onnx")).unwrap();
    let original = ModelProto::decode(bytes.as_slice()).unwrap();
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut panics = vec![];
    for _ in 0..400 {
        let mut m = original.clone();
        let g = m.graph.as_mut().unwrap();
        let k = next(&mut state) as usize % g.node.len();
        let r = next(&mut state);
        let small = (r >> 16) as i64 % 7 - 3;
        let earlier = g.node[(r >> 24) as usize % k.max(1)].output[0].clone();
        let node = &mut g.node[k];
        match r % 4 {
            0 => node.attribute.iter_mut().for_each(|a| {
                a.i = small;
                a.ints.iter_mut().for_each(|v| *v = small);
            }),
            1 => node
                .attribute
                .iter_mut()
                .filter_map(|a| a.t.as_mut())
                .for_each(|t| {
                    t.dims.iter_mut().for_each(|d| *d = small);
                    t.raw_data.truncate(t.raw_data.len() / 2);
                }),
            2 if !node.input.is_empty() => {
                let j = (r >> 8) as usize % node.input.len();
                node.input[j] = earlier;
            }
            _ => {
                node.input.pop();
            }
        }
        let label = format!("node {k} mutation {}", r % 4);
        let result = std::panic::catch_unwind(|| {
            import_model_bytes(&m.encode_to_vec(), &ImportOptions::default()).err()
        });
        if result.is_err() {
            panics.push(label);
        }
    }
    assert!(panics.is_empty(), "panicked on: {panics:?}");
}

/// Pad and Tile, built from gathers and broadcasts, train: the gradient of
/// the summed output for each weight column counts the copies of that
/// column the output holds (x all ones).
#[test]
fn pad_and_tile_carry_gradients_to_every_copy() {
    let weight = ones_weight();
    let ints = |name: &str, v: &[i64]| ints(name, &[v.len() as i64], v);
    // Columns of the padded [2, 6]: edge [0,0,1,2,2,2]; reflect [1,0,1,2,1,0];
    // wrap [2,0,1,2,0,1]. Then tiled twice along the columns, two rows each.
    for (mode, copies) in [
        ("edge", [8.0, 4.0, 12.0]),
        ("reflect", [8.0, 12.0, 4.0]),
        ("wrap", [8.0, 8.0, 8.0]),
    ] {
        let mut pad = node("Pad", "", "pad", &["xw", "pads"], &["p"]);
        pad.attribute.push(AttributeProto {
            name: "mode".into(),
            r#type: attribute_type::STRING,
            s: mode.as_bytes().to_vec(),
            ..Default::default()
        });
        let bytes = model(
            vec![
                node("Mul", "", "scale", &["x", "w"], &["xw"]),
                pad,
                node("Tile", "", "tile", &["p", "repeats"], &["y"]),
            ],
            vec![
                ints("pads", &[0, 1, 0, 2]),
                ints("repeats", &[1, 2]),
                weight.clone(),
            ],
            "y",
        );
        let graph = import_model_bytes(&bytes, &ImportOptions::default()).unwrap();
        let d = autopar_ir::autodiff::differentiate(&graph).unwrap();
        let mut feeds: std::collections::BTreeMap<String, Value> = std::collections::BTreeMap::new();
        feeds.insert("x".into(), Value::f32(vec![2, 3], vec![1.0; 6]).unwrap());
        for (_, cotangent) in &d.cotangents {
            feeds.insert(cotangent.clone(), Value::f32(vec![2, 12], vec![1.0; 24]).unwrap());
        }
        let outs = autopar_ir::interp::run(&d.graph, &feeds, autopar_ir::interp::Precision::F32).unwrap();
        let grads = autopar_ir::autodiff::gradients_by_name(&d, &outs);
        assert_eq!(grads["w"].to_f64_vec(), copies.to_vec(), "{mode}");
    }
}

/// Batch normalisation in its inference form trains its scale and bias but
/// not its running statistics, which stay buffers: with mean 1 and
/// variance 3 (ε 1), `y = (x − 1) / 2 · scale + bias`, so for x = 3 the
/// summed output's gradient is 1 per sample for each scale element.
#[test]
fn batch_norm_freezes_its_running_statistics() {
    let floats = |name: &str, v: f32| TensorProto {
        name: name.into(),
        data_type: DType::F32.onnx_code(),
        dims: vec![3],
        float_data: vec![v; 3],
        ..Default::default()
    };
    let mut bn = node(
        "BatchNormalization",
        "",
        "bn",
        &["x", "w", "b", "mean", "var"],
        &["y"],
    );
    bn.attribute.push(AttributeProto {
        name: "epsilon".into(),
        r#type: attribute_type::FLOAT,
        f: 1.0,
        ..Default::default()
    });
    let bytes = model(
        vec![bn],
        vec![
            ones_weight(),
            floats("b", 0.5),
            floats("mean", 1.0),
            floats("var", 3.0),
        ],
        "y",
    );
    let graph = import_model_bytes(&bytes, &ImportOptions::default()).unwrap();
    let params: Vec<&str> = graph
        .tensors()
        .filter(|(_, t)| t.role == autopar_ir::Role::Parameter)
        .map(|(_, t)| t.name.as_str())
        .collect();
    assert_eq!(params, vec!["w", "b"]);
    let d = autopar_ir::autodiff::differentiate(&graph).unwrap();
    let mut feeds = std::collections::BTreeMap::new();
    feeds.insert("x".to_string(), Value::f32(vec![2, 3], vec![3.0; 6]).unwrap());
    for (_, cotangent) in &d.cotangents {
        feeds.insert(cotangent.clone(), Value::f32(vec![2, 3], vec![1.0; 6]).unwrap());
    }
    let outs = autopar_ir::interp::run(&d.graph, &feeds, autopar_ir::interp::Precision::F32).unwrap();
    assert_eq!(outs[0].to_f64_vec(), vec![1.5; 6]);
    let grads = autopar_ir::autodiff::gradients_by_name(&d, &outs);
    assert_eq!(grads["w"].to_f64_vec(), vec![2.0; 3]);
    assert_eq!(grads["b"].to_f64_vec(), vec![2.0; 3]);
    assert!(!grads.contains_key("mean") && !grads.contains_key("var"));
}

/// A dynamic axis that no shape arithmetic reads stays symbolic, renamed
/// to its role (`batch`: dim 0 of an input), so a plan can bind it; bound
/// through the options, it is fixed.
#[test]
fn dynamic_axes_take_their_role_names_or_their_bound_sizes() {
    let mut proto = ModelProto::decode(
        model(
            vec![node("Mul", "", "scale", &["x", "w"], &["y"])],
            vec![ones_weight()],
            "y",
        )
        .as_slice(),
    )
    .unwrap();
    let input = &mut proto.graph.as_mut().unwrap().input[0];
    let dims = &mut input
        .r#type
        .as_mut()
        .unwrap()
        .tensor_type
        .as_mut()
        .unwrap()
        .shape
        .as_mut()
        .unwrap()
        .dim;
    dims[0] = Dimension {
        dim_param: Some("N".into()),
        ..Default::default()
    };
    let bytes = proto.encode_to_vec();
    let graph = import_model_bytes(&bytes, &ImportOptions::default()).unwrap();
    let x = graph.tensor(graph.inputs[0]);
    assert_eq!(
        x.ty.shape.to_string(),
        Shape(vec![Dim::Sym("batch".into()), Dim::Fixed(3)]).to_string()
    );
    let opts = ImportOptions {
        dims: [("batch".to_string(), 5)].into(),
        ..Default::default()
    };
    let graph = import_model_bytes(&bytes, &opts).unwrap();
    assert_eq!(
        graph.tensor(graph.inputs[0]).ty.shape.as_fixed(),
        Some(vec![5, 3])
    );
}

/// What the exporter records decides what trains, and folded copies of a
/// weight train as that weight: a tagged buffer and a constant folded from
/// shape arithmetic (a mask) stay constants though they are float
/// initializers; a value folded from module state and repeated over the
/// batch is one slice; a matrix whose leading columns copy another weight
/// is that weight joined to a parameter of the rest. The graph still
/// computes what the file does.
#[test]
fn exporter_records_decide_what_trains() {
    use autopar_import::onnx::proto::StringStringEntryProto;
    let floats = |name: &str, dims: &[i64], v: Vec<f32>| TensorProto {
        name: name.into(),
        data_type: DType::F32.onnx_code(),
        dims: dims.to_vec(),
        float_data: v,
        ..Default::default()
    };
    let tagged = |name: &str, key: &str, value: &str| ValueInfoProto {
        name: name.into(),
        metadata_props: vec![StringStringEntryProto {
            key: key.into(),
            value: value.into(),
        }],
        ..Default::default()
    };
    let w: Vec<f32> = (0..9).map(|i| 0.1 * i as f32 - 0.3).collect();
    let cls = [0.5, -0.25, 0.125];
    // head = [w | own column]: its leading 3 columns are w.
    let head: Vec<f32> = (0..3)
        .flat_map(|r| [w[3 * r], w[3 * r + 1], w[3 * r + 2], 0.7 + r as f32])
        .collect();
    let nodes = vec![
        node("MatMul", "", "mm", &["x", "w"], &["h"]),
        node("Add", "", "a1", &["h", "buf"], &["h1"]),
        node("Add", "", "a2", &["h1", "mask"], &["h2"]),
        node("Add", "", "a3", &["h2", "cls"], &["h3"]),
        node("MatMul", "", "out", &["h3", "head"], &["y"]),
    ];
    let initializer = vec![
        floats("w", &[3, 3], w.clone()),
        floats("buf", &[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
        floats("mask", &[2, 3], vec![0.0, -1e30, 0.0, 0.0, 0.0, -1e30]),
        floats("cls", &[2, 3], cls.iter().chain(&cls).copied().collect()),
        floats("head", &[3, 4], head),
    ];
    let kind = "pkg.torch.export.graph_signature.InputSpec.kind";
    let folded = "pkg.onnxscript.optimizer.folded_from";
    let mut proto = ModelProto::decode(model(nodes, initializer, "y").as_slice()).unwrap();
    let graph = proto.graph.as_mut().unwrap();
    graph.value_info = vec![
        tagged("w", kind, "PARAMETER"),
        tagged("buf", kind, "BUFFER"),
        tagged("mask", folded, "['arange', 'val_3']"),
        tagged("cls", folded, "['m.cls_token', 'val_7']"),
    ];
    let graph = import_model_bytes(&proto.encode_to_vec(), &ImportOptions::default()).unwrap();
    let params: Vec<(&str, Vec<usize>)> = graph
        .tensors()
        .filter(|(_, t)| t.role == Role::Parameter)
        .map(|(_, t)| (t.name.as_str(), t.ty.shape.as_fixed().unwrap()))
        .collect();
    assert_eq!(
        params,
        vec![("w", vec![3, 3]), ("cls", vec![1, 3]), ("head", vec![3, 1])]
    );

    // The file's computation, by hand, for x = 1.
    let x = Value::f32(vec![2, 3], vec![1.0; 6]).unwrap();
    let mut feeds = std::collections::BTreeMap::new();
    feeds.insert("x".to_string(), x);
    let got = autopar_ir::interp::run(&graph, &feeds, autopar_ir::interp::Precision::F64).unwrap();
    let buf = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let mask = [0.0, -1e30, 0.0, 0.0, 0.0, -1e30];
    let h3: Vec<f64> = (0..6)
        .map(|i| {
            let c = i % 3;
            let h: f64 = (0..3).map(|k| f64::from(w[3 * k + c])).sum();
            h + buf[i] + mask[i] + f64::from(cls[c])
        })
        .collect();
    let want: Vec<f64> = (0..2)
        .flat_map(|r| {
            let h3 = &h3;
            let w = &w;
            (0..4).map(move |c| {
                (0..3)
                    .map(|k| {
                        let head = if c < 3 {
                            f64::from(w[3 * k + c])
                        } else {
                            0.7 + k as f64
                        };
                        h3[3 * r + k] * head
                    })
                    .sum::<f64>()
            })
        })
        .collect();
    let got = got[0].to_f64_vec();
    for (g, e) in got.iter().zip(&want) {
        assert!((g - e).abs() <= 1e-6 * e.abs().max(1.0), "{got:?} vs {want:?}");
    }
}
