//! Per-op dispatch of shape inference, cost and evaluation to the family files.
//! (Filled in by the kernel work.)

use super::{Cost, InferInput, Op, OpError, TensorType};
use crate::Value;

impl Op {
    /// Output types from input types (and constant input values).
    pub fn infer(&self, _inputs: &[Option<InferInput>]) -> Result<Vec<TensorType>, OpError> {
        Err(OpError::Unsupported {
            op: self.name(),
            what: "shape inference".into(),
        })
    }

    /// Forward/backward FLOPs and bytes at concrete input and output shapes.
    pub fn cost(&self, _inputs: &[Option<&TensorType>], _outputs: &[&TensorType]) -> Cost {
        Cost::default()
    }

    /// Reference evaluation on host values.
    pub fn eval(&self, _inputs: &[Option<&Value>]) -> Result<Vec<Value>, OpError> {
        Err(OpError::Unsupported {
            op: self.name(),
            what: "evaluation".into(),
        })
    }
}
