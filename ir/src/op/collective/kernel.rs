//! The reference interpreter refuses communication: only a backend that
//! knows the rank group can run it.

use super::super::context::{unsupported, EvalCtx};
use super::super::{CommKind, OpError};
use crate::Value;

/// The reference interpreter has no group to talk to.
pub(super) fn eval(cx: &EvalCtx, _kind: CommKind) -> Result<Vec<Value>, OpError> {
    Err(unsupported(
        cx.op,
        "tensor-parallel communication runs only on a parallel backend (autopar run)",
    ))
}
