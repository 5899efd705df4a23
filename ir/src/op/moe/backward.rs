//! Backward rules: mixture of experts. `MoeRouter`'s weights are a softmax
//! over the selected experts' logits (the full softmax's normaliser cancels
//! in the renormalisation), so `dlogits = w ⊙ (dw − Σ dw ⊙ w)` at the
//! selected experts, scattered into the experts dim, and zero elsewhere.
//! `MoeExperts` emits the fused adjoint `MoeExpertsGrad`.

use crate::autodiff::{AutodiffError, Ctx};
use crate::{BinaryOp, Node, Op, ReduceKind, TensorId};

/// Input gradients of `MoeRouter` or `MoeExperts`.
pub fn backward(
    ctx: &mut Ctx,
    node: &Node,
    grads: &[Option<TensorId>],
    wants: &[bool],
) -> Result<Vec<Option<TensorId>>, AutodiffError> {
    let Some((mut out, dy)) = Ctx::seed(node, grads) else {
        return Ok(Ctx::no_grads(node));
    };
    match node.op {
        Op::MoeRouter { .. } if Ctx::wanted(wants, 0) => out[0] = Some(router(ctx, node, dy)?),
        Op::MoeRouter { .. } => {}
        Op::MoeExperts { activation, sources } => {
            let w_gate = node.inputs.get(5).copied().flatten();
            let mut inputs: Vec<Option<TensorId>> = (0..5)
                .map(|i| Ctx::input(node, i).map(Some))
                .collect::<Result<_, _>>()?;
            inputs.push(Some(dy));
            inputs.push(w_gate);
            let op = Op::MoeExpertsGrad {
                activation,
                gated: w_gate.is_some(),
                sources,
            };
            let adjoint = ctx.emit(op, &inputs)?;
            // Gradients of x, weights, w_in, w_out and w_gate; indices get none.
            for (slot, g) in [0, 1, 3, 4, 5].into_iter().zip(adjoint) {
                out[slot] = Ctx::wanted(wants, slot).then_some(g);
            }
        }
        ref other => return Err(ctx.unsupported(&format!("(second order through {})", other.name()))),
    }
    Ok(out)
}

/// `dlogits` from the weights' gradient `dw`: `w ⊙ (dw − Σ_k dw ⊙ w)`
/// scattered to the selected experts (`GatherElementsGrad` along the
/// experts dim: the adjoint of picking them).
fn router(ctx: &mut Ctx, node: &Node, dw: TensorId) -> Result<TensorId, AutodiffError> {
    let logits = Ctx::input(node, 0)?;
    let (Some(&w), Some(&indices)) = (node.outputs.first(), node.outputs.get(1)) else {
        return Err(ctx.unsupported("without its weights and indices outputs"));
    };
    let binary = |func| Op::Binary { func };
    let gw = ctx.emit1(binary(BinaryOp::Mul), &[dw, w])?;
    let last = ctx.ints(&[-1]);
    let sum = Op::Reduce {
        kind: ReduceKind::Sum,
        axes: None,
        keepdims: true,
        noop_with_empty_axes: false,
    };
    let total = ctx.emit1(sum, &[gw, last])?;
    let w_total = ctx.emit1(binary(BinaryOp::Mul), &[w, total])?;
    let selected = ctx.emit1(binary(BinaryOp::Sub), &[gw, w_total])?;
    let shape: Vec<i64> = ctx.dims(logits)?.into_iter().map(|d| d as i64).collect();
    let shape = ctx.ints(&shape);
    ctx.emit1(Op::GatherElementsGrad { axis: -1 }, &[selected, indices, shape])
}

#[cfg(test)]
mod tests {
    use crate::autodiff::testing::{check_op, random};
    use crate::{Activation, Op, Value};

    #[test]
    fn router_top_k() {
        for top_k in [1, 2, 3] {
            check_op(&Op::MoeRouter { top_k }, &[Some(random(&[2, 3, 5], 1))], 1e-6);
        }
    }

    #[test]
    fn experts_gated_and_ungated() {
        let (e, h, f) = (3, 4, 5);
        // Six tokens, two assignments each; token 2 picks expert 0 twice and
        // expert 2 gets no token.
        let ids = Value::i64(vec![2, 3, 2], vec![0, 1, 1, 0, 0, 0, 1, 0, 0, 1, 1, 0]).expect("ids");
        for activation in [
            Activation::Silu,
            Activation::Gelu,
            Activation::GeluTanh,
            Activation::Relu,
        ] {
            let op = Op::MoeExperts {
                activation,
                sources: 1,
            };
            let mut inputs = vec![
                Some(random(&[2, 3, h], 1)),
                Some(random(&[2, 3, 2], 2)),
                Some(ids.clone()),
                Some(random(&[e, h, f], 3)),
                Some(random(&[e, f, h], 4)),
            ];
            check_op(&op, &inputs, 1e-6);
            inputs.push(Some(random(&[e, h, f], 5)));
            check_op(&op, &inputs, 1e-6);
        }
    }
}
