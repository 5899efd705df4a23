//! Sharding rules of the element-wise ops: every output dim `tp` divides,
//! operands sharded where they have the dim at full size and replicated
//! where they broadcast; partial sums pass through the operands an op is
//! linear in.

use crate::op::define::misrouted;
use crate::op::sharding::{aligned, Layout, NodeView, Strategy};
use crate::op::{BinaryOp, Op, UnaryOp};

/// Strategies of an element-wise op beyond `replicate`.
pub(in crate::op) fn strategies(op: &Op, v: &NodeView) -> Vec<Strategy> {
    match op {
        Op::Binary { func } => elementwise(v, linear_operands(*func)),
        // Linear in their one operand: a partial sum passes through.
        Op::Unary {
            func: UnaryOp::Neg | UnaryOp::Identity,
        }
        | Op::Cast { .. } => elementwise(v, &[&[0]]),
        Op::Unary { .. } | Op::Where | Op::Clip | Op::Silu | Op::Gelu { .. } => elementwise(v, &[]),
        // An adjoint runs where its forward op ran: replicated only.
        Op::ActivationGrad { .. } => vec![],
        other => misrouted(other, "element-wise"),
    }
}

/// Element-wise ops: every output dim `tp` divides, operands sharded where
/// they have the dim at full size and replicated where they broadcast; and
/// partial sums through each set of operands in `linear_in` (the op is
/// linear in each set together).
fn elementwise(v: &NodeView, linear_in: &[&[usize]]) -> Vec<Strategy> {
    let Some(out) = v.out() else { return vec![] };
    let mut all: Vec<Strategy> = (0..out.len())
        .filter(|&j| v.splits(out[j]))
        .map(|j| {
            let inputs = v.slots(|_, s| aligned(s, out.len(), j, out[j]));
            Strategy::new(format!("dim{j}"), inputs, v.all_out(Layout::Shard(j)), v.tp)
        })
        .collect();
    for (n, partial) in linear_in.iter().enumerate() {
        if let Some(mut s) = v.partial_through(partial) {
            if partial.len() == 1 && v.inputs.len() == 2 {
                let other = 1 - partial[0];
                s = s.grad(other, true);
            }
            if n > 0 {
                s.name = format!("partial{n}");
            }
            all.push(s);
        }
    }
    all
}

/// The operand sets a binary function is linear in.
fn linear_operands(func: BinaryOp) -> &'static [&'static [usize]] {
    match func {
        BinaryOp::Add | BinaryOp::Sub => &[&[0, 1]],
        // A partial times a replicated factor: the factor's gradient pairs
        // the replicated output gradient with the partial operand.
        BinaryOp::Mul => &[&[0], &[1]],
        BinaryOp::Div => &[&[0]],
        BinaryOp::Pow
        | BinaryOp::Mod
        | BinaryOp::Fmod
        | BinaryOp::Max
        | BinaryOp::Min
        | BinaryOp::And
        | BinaryOp::Or
        | BinaryOp::Xor
        | BinaryOp::Equal
        | BinaryOp::Less
        | BinaryOp::LessOrEqual
        | BinaryOp::Greater
        | BinaryOp::GreaterOrEqual => &[],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::op::sharding::strategies;
    use crate::op::testing::{find, names, view};
    use Layout::*;

    #[test]
    fn elementwise_broadcasts_and_passes_partial_sums_through_add() {
        let add = Op::Binary { func: BinaryOp::Add };
        let v = view(&[&[2, 16, 64], &[64]], &[&[2, 16, 64]], 2);
        let all = strategies(&add, &v);
        assert_eq!(names(&all), ["replicate", "dim0", "dim1", "dim2", "partial"]);
        assert_eq!(find(&all, "dim0").inputs, [Some(Shard(0)), Some(Replicate)]);
        assert_eq!(find(&all, "dim2").inputs, [Some(Shard(2)), Some(Shard(0))]);
        assert_eq!(find(&all, "partial").outputs, [Partial]);
        let mul = Op::Binary { func: BinaryOp::Mul };
        let all = strategies(&mul, &v);
        let p = find(&all, "partial1");
        assert_eq!((p.inputs[1], p.grad_partial[0]), (Some(Partial), true));
    }
}
