//! Sharding rules of normalisation and softmax: shard any dim the op does
//! not normalise over.

use crate::op::define::misrouted;
use crate::op::sharding::{axis, keep_dims, NodeView, Strategy};
use crate::op::Op;

/// Strategies of a normalisation or softmax op beyond `replicate`.
pub(in crate::op) fn strategies(op: &Op, v: &NodeView) -> Vec<Strategy> {
    match op {
        Op::LayerNorm { axis: a, .. } | Op::RmsNorm { axis: a, .. } => {
            keep_dims(v, |j, r| Some(j) < axis(*a, r))
        }
        Op::Softmax { axis: a } | Op::LogSoftmax { axis: a } => keep_dims(v, |j, r| Some(j) != axis(*a, r)),
        // Adjoints run where their forward op ran: replicated only.
        Op::NormGrad { .. } | Op::SoftmaxGrad { .. } => vec![],
        other => misrouted(other, "normalisation"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::sharding::strategies;
    use crate::op::testing::{names, view};

    #[test]
    fn norms_keep_the_normalised_dims_whole() {
        let ln = Op::LayerNorm {
            axis: -1,
            epsilon: 1e-5,
        };
        let v = view(&[&[2, 16, 64], &[64], &[64]], &[&[2, 16, 64]], 2);
        assert_eq!(names(&strategies(&ln, &v)), ["replicate", "dim0", "dim1"]);
        let sm = Op::Softmax { axis: 1 };
        let v = view(&[&[2, 16, 64]], &[&[2, 16, 64]], 2);
        assert_eq!(names(&strategies(&sm, &v)), ["replicate", "dim0", "dim2"]);
    }
}
