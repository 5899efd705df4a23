//! The checks every op shares around shape inference, cost and evaluation;
//! the per-op routing to the family modules is generated from the op table
//! (`define.rs`). Evaluation first re-runs shape inference on the concrete input
//! values, so every kernel sees validated inputs and fixed output shapes.

use super::context::{invalid, unsupported, EvalCtx, InferCtx};
use super::geometry::bytes;
use super::threads::kernel_row_ways;
use super::{BinaryOp, Cost, InferInput, Op, OpError, TensorType};
use crate::{DType, Data, Shape, Value};

impl Op {
    /// Output types from input types (and constant input values). Works
    /// with symbolic dims wherever the result is still determined; ops whose
    /// output shape depends on a value return `OpError::NotConstant` without it.
    pub fn infer(&self, inputs: &[Option<InferInput>]) -> Result<Vec<TensorType>, OpError> {
        let name = self.name();
        let cx = InferCtx { op: &name, inputs };
        let is_string = |t: &Option<InferInput>| t.is_some_and(|t| t.ty.dtype == DType::String);
        if let Some(i) = inputs
            .iter()
            .position(is_string)
            .filter(|_| !self.takes_strings())
        {
            return Err(unsupported(
                &name,
                format!("string input {i} (only Equal, Shape and Size take strings)"),
            ));
        }
        self.family_infer(&cx)
    }

    /// The ops defined on string tensors: comparing them for equality, and
    /// reading their shape.
    fn takes_strings(&self) -> bool {
        matches!(
            self,
            Op::Binary {
                func: BinaryOp::Equal
            } | Op::Shape { .. }
                | Op::Size
        )
    }

    /// Forward/backward FLOPs and bytes at concrete input and output shapes.
    /// Shapes must be fixed (bind symbols first); a symbolic dim counts as 0.
    /// Pure views (`Reshape`, `Squeeze`, `Unsqueeze`, `Flatten`) and
    /// metadata ops (`Shape`, `Size`) move no bytes.
    pub fn cost(&self, inputs: &[Option<&TensorType>], outputs: &[&TensorType]) -> Cost {
        let (forward_flops, backward_flops) = self.family_flops(inputs, outputs);
        let (bytes_read, bytes_written) = if self.moves_bytes() {
            (
                inputs.iter().flatten().map(|t| bytes(t)).sum(),
                outputs.iter().map(|t| bytes(t)).sum(),
            )
        } else {
            (0.0, 0.0)
        };
        Cost {
            forward_flops,
            backward_flops,
            bytes_read,
            bytes_written,
        }
    }

    /// Reference evaluation on host values. Inputs are checked (storage
    /// class against dtype, element count against shape) and typed through
    /// [`Op::infer`] before the kernel runs.
    pub fn eval(&self, inputs: &[Option<&Value>]) -> Result<Vec<Value>, OpError> {
        let name = self.name();
        let types = inputs
            .iter()
            .enumerate()
            .map(|(i, v)| v.map(|v| checked_type(&name, i, v)).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        let infer_inputs: Vec<Option<InferInput>> = types
            .iter()
            .zip(inputs)
            .map(|(t, v)| t.as_ref().map(|ty| InferInput { ty, value: *v }))
            .collect();
        let out = self.infer(&infer_inputs)?;
        let row_ways = kernel_row_ways(self, out.first(), inputs.iter().flatten().map(|v| v.dtype));
        let cx = EvalCtx {
            op: &name,
            inputs,
            out: &out,
            row_ways,
        };
        self.family_eval(&cx)
    }
}

/// The type of an input value, after checking that its storage class fits
/// its dtype and its element count its shape.
fn checked_type(op: &str, i: usize, v: &Value) -> Result<TensorType, OpError> {
    let class_ok = match &v.data {
        Data::F32(_) => v.dtype.is_float() && v.dtype != DType::F64,
        Data::F64(_) => v.dtype == DType::F64,
        Data::Bool(_) => v.dtype == DType::Bool,
        Data::I64(_) => v.dtype.is_int(),
        Data::Str(_) => v.dtype == DType::String,
    };
    if !class_ok {
        return Err(invalid(
            op,
            format!("input {i}: {} value has the wrong storage class", v.dtype),
        ));
    }
    let want: usize = v.shape.iter().product();
    if v.data.len() != want {
        return Err(invalid(
            op,
            format!("input {i}: {} elements for shape {:?}", v.data.len(), v.shape),
        ));
    }
    Ok(TensorType {
        dtype: v.dtype,
        shape: Shape::fixed(&v.shape),
    })
}
