//! `define_ops!`: the op list, declared once. Each line names a variant with
//! its attribute fields, then the family module that holds its shape
//! inference, cost and kernel, its [`super::OpClass`], its output count (an
//! expression over the fields) and whether it moves bytes (`io`) or only
//! reads metadata (`meta`: views and shape queries). From that the macro
//! generates the `Op` enum and every per-variant match that used to be
//! written by hand: `class`, `num_outputs`, the variant name, and the
//! routing of `infer`, `cost`, `eval` (`dispatch.rs`) and the sharding rules
//! (`sharding.rs`) to the family.
//!
//! Each family module provides `infer_op(&InferCtx, &Op)`,
//! `flops_op(&Op, inputs, outputs) -> (forward, backward)`,
//! `eval_op(&EvalCtx, &Op)` and `shard::strategies(&Op, &NodeView)`,
//! matching on its own variants only.

/// Generates `Op` and its per-variant tables from one line per op.
macro_rules! define_ops {
    (
        $(#[$enum_meta:meta])*
        pub enum Op {
            $(
                $(#[$meta:meta])*
                $variant:ident $({ $($(#[$field_meta:meta])* $field:ident : $field_ty:ty),* $(,)? })?
                    => $family:ident, $class:ident, $outputs:expr, $traffic:ident;
            )*
        }
    ) => {
        $(#[$enum_meta])*
        pub enum Op {
            $(
                $(#[$meta])*
                $variant $({ $($(#[$field_meta])* $field: $field_ty),* })?,
            )*
        }

        impl Op {
            /// The class of this op; see [`OpClass`].
            pub fn class(&self) -> OpClass {
                match self {
                    $(Op::$variant { .. } => OpClass::$class,)*
                }
            }

            /// Number of outputs the op produces.
            #[allow(unused_variables)]
            pub fn num_outputs(&self) -> usize {
                match self {
                    $(Op::$variant $({ $($field),* })? => $outputs,)*
                }
            }

            /// The variant's name, as serde writes it in the `op` tag.
            pub fn variant_name(&self) -> &'static str {
                match self {
                    $(Op::$variant { .. } => stringify!($variant),)*
                }
            }

            /// False for views and shape queries, which move no bytes.
            pub(crate) fn moves_bytes(&self) -> bool {
                match self {
                    $(Op::$variant { .. } => define_ops!(@moves $traffic),)*
                }
            }

            /// Shape inference of the op's family.
            fn family_infer(&self, cx: &InferCtx) -> Result<Vec<TensorType>, OpError> {
                match self {
                    $(Op::$variant { .. } => $family::infer_op(cx, self),)*
                }
            }

            /// Forward and backward FLOPs from the op's family.
            fn family_flops(
                &self,
                inputs: &[Option<&TensorType>],
                outputs: &[&TensorType],
            ) -> (f64, f64) {
                match self {
                    $(Op::$variant { .. } => $family::flops_op(self, inputs, outputs),)*
                }
            }

            /// The sharding rules of the op's family (`shard.rs` in its
            /// folder), without `replicate`.
            fn family_strategies(&self, v: &sharding::NodeView) -> Vec<sharding::Strategy> {
                match self {
                    $(Op::$variant { .. } => $family::shard::strategies(self, v),)*
                }
            }

            /// The reference kernel of the op's family.
            fn family_eval(&self, cx: &EvalCtx) -> Result<Vec<Value>, OpError> {
                match self {
                    $(Op::$variant { .. } => $family::eval_op(cx, self),)*
                }
            }
        }
    };
    (@moves io) => { true };
    (@moves meta) => { false };
}

pub(super) use define_ops;

use super::context::invalid;
use super::{Op, OpError};

/// The error a family's `infer_op`/`eval_op` returns for another family's
/// op. The op table routes every op to its own family, so reaching this is
/// an internal error; it names the op and the family.
pub(super) fn not_in_family(name: &str, op: &Op, family: &str) -> OpError {
    invalid(
        name,
        format!("internal error: {} is not a {family} op", op.variant_name()),
    )
}

/// `flops_op` given another family's op: the op table rules it out.
pub(super) fn misrouted(op: &Op, family: &str) -> ! {
    unreachable!(
        "the op table routes {} to its own family, not {family}",
        op.variant_name()
    )
}
