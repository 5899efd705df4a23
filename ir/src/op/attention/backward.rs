//! Backward rules: attention. `Attention` emits the fused adjoint
//! `AttentionGrad`, which recomputes the probabilities with the forward's
//! exact masking; `RotaryEmbedding` is a rotation by `θ`, so its adjoint is
//! the same op rotating by `−θ` (the sine cache negated).

use crate::autodiff::{AutodiffError, Ctx};
use crate::{Node, Op, TensorId, UnaryOp};

/// Input gradients of `Attention` or `RotaryEmbedding`.
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
        Op::Attention { scale, causal } => {
            let (q, k, v) = (Ctx::input(node, 0)?, Ctx::input(node, 1)?, Ctx::input(node, 2)?);
            let mask = node.inputs.get(3).copied().flatten();
            let positions = node.inputs.get(4).copied().flatten();
            let mut inputs = vec![Some(q), Some(k), Some(v), Some(dy), mask, positions];
            while inputs.last() == Some(&None) {
                inputs.pop();
            }
            let op = Op::AttentionGrad {
                scale,
                causal,
                mask_grad: Ctx::wanted(wants, 3),
            };
            let adjoint = ctx.emit(op, &inputs)?;
            for (i, g) in adjoint.into_iter().enumerate() {
                out[i] = Ctx::wanted(wants, i).then_some(g);
            }
        }
        Op::RotaryEmbedding { .. } => {
            if Ctx::wanted(wants, 1) || Ctx::wanted(wants, 2) {
                return Err(ctx.unsupported("with cos/sin caches that depend on a parameter"));
            }
            if Ctx::wanted(wants, 0) {
                let (cos, sin) = (Ctx::input(node, 1)?, Ctx::input(node, 2)?);
                let neg_sin = ctx.emit1(Op::Unary { func: UnaryOp::Neg }, &[sin])?;
                let positions = node.inputs.get(3).copied().flatten();
                let inputs = [Some(dy), Some(cos), Some(neg_sin), positions];
                out[0] = Some(ctx.emit(node.op.clone(), &inputs)?[0]);
            }
        }
        ref other => return Err(ctx.unsupported(&format!("(second order through {})", other.name()))),
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use crate::autodiff::testing::{check_op, check_op_with_constants, random};
    use crate::autodiff::{differentiate, AutodiffError};
    use crate::{DType, Data, Graph, Op, Role, Shape, TensorType, Value};
    use std::sync::Arc;

    fn attention(causal: bool, scale: Option<f64>, q: &[usize], kv: &[usize], mask: Option<Value>) {
        let op = Op::Attention { scale, causal };
        let mut inputs = vec![Some(random(q, 1)), Some(random(kv, 2)), Some(random(kv, 3))];
        inputs.extend(mask.map(Some));
        check_op_with_constants(&op, &inputs, &[3], 1e-6);
    }

    #[test]
    fn attention_plain_causal_and_grouped() {
        attention(false, None, &[2, 2, 3, 4], &[2, 2, 5, 4], None);
        attention(true, Some(0.3), &[1, 2, 4, 3], &[1, 2, 4, 3], None);
        // Grouped query: four query heads share two key/value heads, and
        // more keys than queries (causal stays upper-left aligned).
        attention(true, None, &[1, 4, 3, 2], &[1, 2, 5, 2], None);
    }

    #[test]
    fn attention_bool_and_float_masks() {
        // A keep-mask hiding every key from query 2 (whose output is zero)
        // and one key from query 0, broadcast over batch and heads.
        let keep = [true, false, true, true, true, true, false, false, false];
        let bool_mask = Value::new(DType::Bool, vec![3, 3], Data::Bool(keep.to_vec())).expect("mask");
        attention(false, None, &[2, 2, 3, 4], &[2, 2, 3, 4], Some(bool_mask.clone()));
        attention(true, None, &[1, 2, 3, 4], &[1, 1, 3, 4], Some(bool_mask));
        // An additive float mask per batch, shorter than the keys (the
        // missing key is masked), with a -inf entry.
        let float_mask = Value::f64(
            vec![2, 1, 1, 3],
            vec![0.0, -1.5, 0.5, f64::NEG_INFINITY, 0.0, 0.3],
        )
        .expect("mask");
        attention(
            false,
            None,
            &[2, 1, 3, 4],
            &[2, 1, 4, 4],
            Some(float_mask.clone()),
        );
        // The same mask as a parameter gets its gradient too.
        let inputs = [
            Some(random(&[2, 1, 3, 4], 1)),
            Some(random(&[2, 1, 4, 4], 2)),
            Some(random(&[2, 1, 4, 4], 3)),
            Some(float_mask),
        ];
        check_op(
            &Op::Attention {
                scale: None,
                causal: true,
            },
            &inputs,
            1e-6,
        );
    }

    #[test]
    fn attention_with_query_positions() {
        // A context-parallel rank's queries: the first and last two of
        // eight positions, against every key.
        let positions = Value::i64(vec![4], vec![0, 1, 6, 7]).expect("positions");
        let op = Op::Attention {
            scale: None,
            causal: true,
        };
        let inputs = [
            Some(random(&[1, 2, 4, 3], 1)),
            Some(random(&[1, 1, 8, 3], 2)),
            Some(random(&[1, 1, 8, 3], 3)),
            None,
            Some(positions),
        ];
        check_op_with_constants(&op, &inputs, &[4], 1e-6);
    }

    #[test]
    fn rotary_caches_needing_a_gradient_are_refused() {
        let mut g = Graph::new("rope");
        let mut param = |name: &str, dims: &[usize]| {
            let ty = TensorType {
                dtype: DType::F64,
                shape: Shape::fixed(dims),
            };
            let value = Arc::new(random(dims, 1));
            g.add_tensor(name, ty, Role::Parameter, Some(value))
        };
        let (x, cos, sin) = (
            param("x", &[1, 1, 1, 2]),
            param("cos", &[1, 1, 1]),
            param("sin", &[1, 1, 1]),
        );
        let out = g.add_tensor("out", g.tensor(x).ty.clone(), Role::Activation, None);
        let op = Op::RotaryEmbedding {
            interleaved: false,
            rotary_dim: 0,
            num_heads: 0,
        };
        g.add_node("rope", op, vec![Some(x), Some(cos), Some(sin)], vec![out])
            .expect("node");
        g.outputs = vec![out];
        let err = differentiate(&g).expect_err("refused");
        assert!(
            matches!(&err, AutodiffError::Rule { node, .. } if node == "rope"),
            "{err}"
        );
    }

    #[test]
    fn rotary_both_layouts() {
        for interleaved in [false, true] {
            // 4-D [b, heads, s, d] with position ids into a 5-row cache,
            // rotating only the first 4 of 6 dims.
            let op = Op::RotaryEmbedding {
                interleaved,
                rotary_dim: 4,
                num_heads: 0,
            };
            let pos = Value::i64(vec![2, 3], vec![0, 4, 2, 1, 1, 3]).expect("ids");
            let inputs = [
                Some(random(&[2, 2, 3, 6], 1)),
                Some(random(&[5, 2], 2)),
                Some(random(&[5, 2], 3)),
                Some(pos),
            ];
            check_op_with_constants(&op, &inputs, &[1, 2], 1e-6);
            // 3-D [b, s, heads·d] with per-token caches [b, s, d/2].
            let op = Op::RotaryEmbedding {
                interleaved,
                rotary_dim: 0,
                num_heads: 2,
            };
            let inputs = [
                Some(random(&[2, 3, 8], 4)),
                Some(random(&[2, 3, 2], 5)),
                Some(random(&[2, 3, 2], 6)),
            ];
            check_op_with_constants(&op, &inputs, &[1, 2], 1e-6);
        }
    }
}
