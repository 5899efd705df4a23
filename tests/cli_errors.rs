//! Bad input through the real binary: one clear `error:` line, non-zero exit,
//! no panic, no partial output file.

mod common;

use common::{assert_error, autopar, binary, scratch, scratch_file, FIXTURES};
use std::path::Path;

/// Asserts that `inspect path` is a clean failure: exit 2, one `error:` line
/// naming the file and saying `why`.
fn assert_clean_error(path: &Path, why: &str) {
    let file = path.file_name().unwrap().to_str().unwrap();
    assert_error(&["inspect", path.to_str().unwrap()], 2, &[file, why]);
}

fn gpt2_tiny() -> Vec<u8> {
    std::fs::read(format!("{FIXTURES}/models/gpt2-tiny.ts.onnx")).unwrap()
}

#[test]
fn truncated_onnx_file() {
    let bytes = gpt2_tiny();
    let p = scratch_file("truncated.onnx", &bytes[..bytes.len() / 3]);
    assert_clean_error(&p, "not an ONNX file: protobuf decoding failed");
}

#[test]
fn wrong_magic_and_random_bytes() {
    let p = scratch_file("png.onnx", b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR");
    assert_clean_error(&p, "not an ONNX file: protobuf decoding failed");
    let mut x: u64 = 0x9e3779b97f4a7c15;
    let random: Vec<u8> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let p = scratch_file("random.onnx", &random);
    assert_clean_error(&p, "not an ONNX file");
}

/// A small valid JSON graph to corrupt.
fn json_graph() -> serde_json::Value {
    serde_json::json!({
        "format": "autopar-graph", "version": 1, "name": "t",
        "tensors": [
            {"name": "x", "dtype": "f32", "shape": [2, 3], "role": "input"},
            {"name": "y", "dtype": "f32", "shape": [2, 3], "role": "activation"}
        ],
        "nodes": [{"name": "act", "op": {"op": "Unary", "func": "Tanh"}, "inputs": [0], "outputs": [1]}],
        "inputs": [0], "outputs": [1]
    })
}

#[test]
fn valid_json_graph_inspects() {
    let p = scratch_file("ok.json", json_graph().to_string().as_bytes());
    let (code, out, err) = autopar(&["inspect", p.to_str().unwrap(), "--json"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("\"parameters\""));
}

#[test]
fn json_dangling_edge_unknown_op_and_shape_mismatch() {
    use serde_json::json;
    // (file, field to corrupt, its new value, what the error must say)
    let cases = [
        (
            "dangling.json",
            "/nodes/0/inputs/0",
            json!(7),
            "node 'act': an input refers to tensor #7, which does not exist",
        ),
        (
            "unknown.json",
            "/nodes/0/op",
            json!({"op": "Frobnicate"}),
            "node 'act': bad op: unknown variant `Frobnicate`",
        ),
        (
            "mismatch.json",
            "/tensors/1/shape",
            json!([3, 2]),
            "node 'act': output 0 ('y') is recorded as f32[3, 2] but the op gives f32[2, 3]",
        ),
    ];
    for (file, field, value, needle) in cases {
        let mut g = json_graph();
        *g.pointer_mut(field).unwrap() = value;
        let p = scratch_file(file, g.to_string().as_bytes());
        assert_error(&["inspect", p.to_str().unwrap()], 2, &[file, needle]);
    }
}

#[test]
fn onnx_with_unknown_ops_lists_them_all() {
    // Rename two op types inside the file: same length keeps the protobuf valid.
    let bytes = gpt2_tiny();
    let text = unsafe_replace(&bytes, b"Softmax", b"Sofmaxx");
    let p = scratch_file("unknown_op.onnx", &text);
    assert_clean_error(&p, "unsupported ONNX ops: Sofmaxx (node '");
}

fn unsafe_replace(hay: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = hay.to_vec();
    let mut i = 0;
    while i + from.len() <= out.len() {
        if &out[i..i + from.len()] == from {
            out[i..i + from.len()].copy_from_slice(to);
            i += from.len();
        } else {
            i += 1;
        }
    }
    out
}

#[test]
fn convert_leaves_no_partial_file_on_error() {
    let bad = scratch_file("bad_for_convert.onnx", b"not a model");
    let out = scratch("never_written.json");
    assert_error(
        &["convert", bad.to_str().unwrap(), "-o", out.to_str().unwrap()],
        2,
        &["bad_for_convert.onnx"],
    );
    assert!(!out.exists());
}

#[test]
fn check_exit_codes() {
    let model = format!("{FIXTURES}/models/gpt2-tiny.ts.onnx");
    let data = format!("{FIXTURES}/reference/gpt2-tiny.ts/test_data_set_0");
    let (code, out, err) = autopar(&["check", &model, "--data", &data]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("PASS"));
    // Same inputs, but another model's logits as the reference: a mismatch, exit 1.
    let wrong = common::scratch_dir("check-mismatch");
    for i in 0..2 {
        let f = format!("input_{i}.pb");
        std::fs::copy(format!("{data}/{f}"), wrong.join(&f)).unwrap();
    }
    std::fs::copy(
        format!("{FIXTURES}/reference/llama-tiny.ts/test_data_set_0/output_0.pb"),
        wrong.join("output_0.pb"),
    )
    .unwrap();
    let (code, out, err) = autopar(&["check", &model, "--data", wrong.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("FAIL"));
}

#[test]
fn closed_stdout_pipe_is_not_a_crash() {
    use std::process::Stdio;
    let mut child = binary()
        .args(["schema"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take()); // the reader goes away, like `| head -0`
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(out.status.success(), "{err}");
}

#[test]
fn error_lines_say_each_thing_once() {
    let missing = std::env::temp_dir().join("autopar-no-such-model.onnx");
    let (code, _, err) = autopar(&["inspect", missing.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert_eq!(err.matches("autopar-no-such-model.onnx").count(), 1, "{err}");
    let bytes = gpt2_tiny();
    let p = scratch_file("truncated_once.onnx", &bytes[..bytes.len() / 2]);
    let (_, _, err) = autopar(&["inspect", p.to_str().unwrap()]);
    assert_eq!(err.matches("failed to decode").count(), 1, "{err}");
}
