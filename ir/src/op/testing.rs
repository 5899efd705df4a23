//! Helpers for the op families' unit tests: value builders, symbolic shape
//! parsing, one-line infer/eval calls, and node views and lookups for the
//! sharding rules.

use super::sharding::{Layout, NodeView, Strategy};
use super::{InferInput, Op, OpError, TensorType};
use crate::{DType, Data, Dim, Shape, Value};

/// An `f32` value.
pub(crate) fn f32s(shape: &[usize], data: &[f32]) -> Value {
    Value::f32(shape.to_vec(), data.to_vec()).unwrap()
}

/// An `i64` value.
pub(crate) fn i64s(shape: &[usize], data: &[i64]) -> Value {
    Value::i64(shape.to_vec(), data.to_vec()).unwrap()
}

/// A value of integer type `dtype`.
pub(crate) fn ints(dtype: DType, shape: &[usize], data: &[i64]) -> Value {
    Value::ints(dtype, shape.to_vec(), data.to_vec()).unwrap()
}

/// A bool value.
pub(crate) fn bools(shape: &[usize], data: &[bool]) -> Value {
    Value::new(DType::Bool, shape.to_vec(), Data::Bool(data.to_vec())).unwrap()
}

/// A type from a shape written like `"b s 64"` (names are symbols).
pub(crate) fn ty(dtype: DType, dims: &str) -> TensorType {
    let dims = dims
        .split_whitespace()
        .map(|d| {
            d.parse::<usize>()
                .map_or_else(|_| Dim::Sym(d.to_string()), Dim::Fixed)
        })
        .collect();
    TensorType {
        dtype,
        shape: Shape(dims),
    }
}

/// Shape inference from types only.
pub(crate) fn infer(op: &Op, types: &[TensorType]) -> Result<Vec<TensorType>, OpError> {
    let inputs: Vec<Option<InferInput>> = types
        .iter()
        .map(|ty| Some(InferInput { ty, value: None }))
        .collect();
    op.infer(&inputs)
}

/// Shape inference where some inputs carry constant values.
pub(crate) fn infer_with(
    op: &Op,
    inputs: &[(TensorType, Option<Value>)],
) -> Result<Vec<TensorType>, OpError> {
    let inputs: Vec<Option<InferInput>> = inputs
        .iter()
        .map(|(ty, value)| {
            Some(InferInput {
                ty,
                value: value.as_ref(),
            })
        })
        .collect();
    op.infer(&inputs)
}

/// Evaluates with all inputs present.
pub(crate) fn eval(op: &Op, inputs: &[&Value]) -> Result<Vec<Value>, OpError> {
    let inputs: Vec<Option<&Value>> = inputs.iter().map(|&v| Some(v)).collect();
    op.eval(&inputs)
}

/// Evaluates and returns the single output's elements as `f64` with its shape.
pub(crate) fn eval1(op: &Op, inputs: &[&Value]) -> (Vec<usize>, Vec<f64>) {
    let out = eval(op, inputs).unwrap();
    (out[0].shape.clone(), out[0].to_f64_vec())
}

/// Asserts element-wise closeness.
pub(crate) fn assert_close(got: &[f64], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "length: got {got:?}, want {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol,
            "element {i}: got {g}, want {w} (all: {got:?})"
        );
    }
}

/// Asserts that `result` failed for the reason the test means: an error of
/// op `op` (every [`OpError`] names its op) whose message contains
/// `needle`, so that a test of one bad input cannot pass on another error.
#[track_caller]
pub(crate) fn assert_op_err<T: std::fmt::Debug>(result: Result<T, OpError>, op: &str, needle: &str) {
    let err = match result {
        Ok(v) => panic!("expected an error of {op} containing '{needle}', got Ok({v:?})"),
        Err(e) => e,
    };
    let named = match &err {
        OpError::Arity { op, .. }
        | OpError::Invalid { op, .. }
        | OpError::NotConstant { op, .. }
        | OpError::Unsupported { op, .. } => op,
    };
    assert_eq!(named, op, "{err}");
    assert!(err.to_string().contains(needle), "expected '{needle}' in: {err}");
}

/// What the sharding rules see of a node with all `inputs` present and a
/// float output, on `tp` ranks.
pub(crate) fn view<'a>(inputs: &[&[usize]], outputs: &[&[usize]], tp: usize) -> NodeView<'a> {
    NodeView {
        inputs: inputs.iter().map(|s| Some(s.to_vec())).collect(),
        values: vec![None; inputs.len()],
        outputs: outputs.iter().map(|s| s.to_vec()).collect(),
        float_out: true,
        tp,
    }
}

/// The strategy called `name`; panics listing the others when absent.
pub(crate) fn find<'a>(all: &'a [Strategy], name: &str) -> &'a Strategy {
    all.iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no {name} in {all:?}"))
}

/// The strategies' names, in order.
pub(crate) fn names(all: &[Strategy]) -> Vec<&str> {
    all.iter().map(|s| s.name.as_str()).collect()
}

/// Name, first input's and first output's layout of each strategy.
pub(crate) fn layouts(all: &[Strategy]) -> Vec<(&str, Option<Layout>, Layout)> {
    all.iter()
        .map(|s| (s.name.as_str(), s.inputs[0], s.outputs[0]))
        .collect()
}
