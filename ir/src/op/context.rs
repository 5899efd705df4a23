//! What an op family's shape inference and kernel receive: views of a
//! node's inputs ([`InferCtx`], [`EvalCtx`]) with errors that name the op,
//! axis normalisation, constant-input reading, and [`finish`], which rounds
//! a kernel's result to its output type.

use super::numeric::Real;
use super::{InferInput, OpError, TensorType};
use crate::{round_float, DType, Data, Dim, Shape, Value};

/// An `OpError::Invalid` for `op`.
pub(crate) fn invalid(op: &str, message: impl Into<String>) -> OpError {
    OpError::Invalid {
        op: op.to_string(),
        message: message.into(),
    }
}

/// An `OpError::Unsupported` for `op`.
pub(crate) fn unsupported(op: &str, what: impl Into<String>) -> OpError {
    OpError::Unsupported {
        op: op.to_string(),
        what: what.into(),
    }
}

/// Normalises a possibly negative `axis` into `0..rank`.
pub(crate) fn norm_axis(op: &str, axis: i64, rank: usize) -> Result<usize, OpError> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        return Err(invalid(
            op,
            format!("axis {axis} is out of range for rank {rank}"),
        ));
    }
    Ok(a as usize)
}

/// Normalises a list of axes, rejecting duplicates.
pub(crate) fn norm_axes(op: &str, axes: &[i64], rank: usize) -> Result<Vec<usize>, OpError> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = norm_axis(op, a, rank)?;
        if out.contains(&n) {
            return Err(invalid(op, format!("axis {a} is repeated in {axes:?}")));
        }
        out.push(n);
    }
    Ok(out)
}

/// A tensor type from a dtype and dims.
pub(crate) fn tensor(dtype: DType, dims: Vec<Dim>) -> TensorType {
    TensorType {
        dtype,
        shape: Shape(dims),
    }
}

/// Shape-inference view of one node's inputs, with the op name for errors.
pub(crate) struct InferCtx<'a, 'b> {
    pub op: &'b str,
    pub inputs: &'b [Option<InferInput<'a>>],
}

impl<'a> InferCtx<'a, '_> {
    /// Checks the positional input count (trailing absent inputs count too).
    pub fn arity(&self, min: usize, max: usize) -> Result<(), OpError> {
        let n = self.inputs.len();
        if n < min || n > max {
            let expected = if min == max {
                min.to_string()
            } else if max == usize::MAX {
                format!("at least {min}")
            } else {
                format!("{min} to {max}")
            };
            return Err(OpError::Arity {
                op: self.op.to_string(),
                expected,
                got: n,
            });
        }
        Ok(())
    }

    /// A required input.
    pub fn input(&self, i: usize) -> Result<InferInput<'a>, OpError> {
        self.opt(i)
            .ok_or_else(|| invalid(self.op, format!("required input {i} is missing")))
    }

    /// A required input's type.
    pub fn ty(&self, i: usize) -> Result<&'a TensorType, OpError> {
        Ok(self.input(i)?.ty)
    }

    /// An optional input (absent when out of range or empty).
    pub fn opt(&self, i: usize) -> Option<InferInput<'a>> {
        self.inputs.get(i).copied().flatten()
    }

    /// The integer values of constant input `i` (`NotConstant` without a value).
    pub fn ints(&self, i: usize) -> Result<Vec<i64>, OpError> {
        let input = self.input(i)?;
        let value = input.value.ok_or_else(|| OpError::NotConstant {
            op: self.op.to_string(),
            input: i,
        })?;
        int_values(self.op, value, i)
    }

    /// Like [`InferCtx::ints`] for an optional input: `None` when absent.
    pub fn opt_ints(&self, i: usize) -> Result<Option<Vec<i64>>, OpError> {
        match self.opt(i) {
            None => Ok(None),
            Some(_) => self.ints(i).map(Some),
        }
    }

    /// Requires input `i` to be of a floating-point type.
    pub fn float(&self, i: usize) -> Result<&'a TensorType, OpError> {
        let t = self.ty(i)?;
        if !t.dtype.is_float() {
            return Err(invalid(
                self.op,
                format!("input {i} must be floating point, got {}", t.dtype),
            ));
        }
        Ok(t)
    }

    /// Requires input `i` to be of an integer type.
    pub fn int(&self, i: usize) -> Result<&'a TensorType, OpError> {
        let t = self.ty(i)?;
        if !t.dtype.is_int() {
            return Err(invalid(
                self.op,
                format!("input {i} must be an integer tensor, got {}", t.dtype),
            ));
        }
        Ok(t)
    }

    /// Requires inputs `i` and `j` to share a dtype.
    pub fn same_dtype(&self, i: usize, j: usize) -> Result<(), OpError> {
        let (a, b) = (self.ty(i)?.dtype, self.ty(j)?.dtype);
        if a != b {
            return Err(invalid(
                self.op,
                format!("inputs {i} and {j} differ in type ({a} vs {b})"),
            ));
        }
        Ok(())
    }

    /// Requires input `i` to have `rank` dims.
    pub fn rank(&self, i: usize, rank: usize) -> Result<&'a [Dim], OpError> {
        let t = self.ty(i)?;
        if t.shape.rank() != rank {
            return Err(invalid(
                self.op,
                format!("input {i} must have rank {rank}, got shape {}", t.shape),
            ));
        }
        Ok(&t.shape.0)
    }
}

/// The integer elements of a value used as shape/axes data.
pub(crate) fn int_values(op: &str, value: &Value, input: usize) -> Result<Vec<i64>, OpError> {
    value.as_i64().map(<[i64]>::to_vec).ok_or_else(|| {
        invalid(
            op,
            format!("input {input} must be an integer tensor, got {}", value.dtype),
        )
    })
}

/// Reads a one-element integer input (e.g. TopK's `k`, CumSum's `axis`).
pub(crate) fn scalar_int(op: &str, values: &[i64], input: usize) -> Result<i64, OpError> {
    match values {
        [v] => Ok(*v),
        _ => Err(invalid(
            op,
            format!("input {input} must hold exactly one value, got {}", values.len()),
        )),
    }
}

/// Evaluation view of a node's input values and the output types that shape
/// inference gave for them (always fixed-shape).
pub(crate) struct EvalCtx<'a> {
    pub op: &'a str,
    pub inputs: &'a [Option<&'a Value>],
    pub out: &'a [TensorType],
    /// Ways a row-wise kernel splits its rows over this thread's kernel
    /// threads (`threads::row_split`'s rule; 1 for the others).
    pub row_ways: usize,
}

impl<'a> EvalCtx<'a> {
    /// A required input value (presence was checked by inference).
    pub fn input(&self, i: usize) -> Result<&'a Value, OpError> {
        self.opt(i)
            .ok_or_else(|| invalid(self.op, format!("required input {i} is missing")))
    }

    /// An optional input value.
    pub fn opt(&self, i: usize) -> Option<&'a Value> {
        self.inputs.get(i).copied().flatten()
    }

    /// The concrete shape of output `i`.
    pub fn out_shape(&self, i: usize) -> Result<Vec<usize>, OpError> {
        let t = self
            .out
            .get(i)
            .ok_or_else(|| invalid(self.op, format!("no output {i}")))?;
        t.shape
            .as_fixed()
            .ok_or_else(|| invalid(self.op, format!("output {i} has symbolic shape {}", t.shape)))
    }

    /// The dtype of output `i`.
    pub fn out_dtype(&self, i: usize) -> DType {
        self.out.get(i).map_or(DType::F32, |t| t.dtype)
    }

    /// The float slice of input `i` as `T` (its storage class must match).
    pub fn floats<T: Real>(&self, i: usize) -> Result<&'a [T], OpError> {
        let v = self.input(i)?;
        T::slice(v).ok_or_else(|| {
            invalid(
                self.op,
                format!("input {i} ({}) is not stored as {}", v.dtype, T::NAME),
            )
        })
    }
}

/// Builds a value, rounding `F32` storage to `f16`/`bf16` when `dtype` says so.
pub(crate) fn finish(dtype: DType, shape: Vec<usize>, data: Data) -> Value {
    let data = match data {
        Data::F32(mut v) if dtype.is_float() && dtype != DType::F32 => {
            for x in &mut v {
                *x = round_float(dtype, *x);
            }
            Data::F32(v)
        }
        Data::I64(mut v) if dtype.is_int() => {
            for x in &mut v {
                *x = crate::wrap_int(dtype, *x);
            }
            Data::I64(v)
        }
        other => other,
    };
    Value { dtype, shape, data }
}

#[cfg(test)]
mod tests {
    use super::super::testing::assert_op_err;
    use super::*;

    #[test]
    fn axes_normalise_and_reject_out_of_range() {
        assert_eq!(norm_axis("X", -1, 3), Ok(2));
        assert_op_err(norm_axis("X", 3, 3), "X", "axis 3 is out of range for rank 3");
        assert_op_err(norm_axes("X", &[0, -3], 3), "X", "axis -3 is repeated in [0, -3]");
    }
}
