//! Recognisers for the canonical ops: Linear, Embedding, Gelu, Silu,
//! RmsNorm, LayerNorm (expanded form), Attention and MoeRouter. Each
//! exporter spelling is one pattern; commutativity (in `structural`) covers
//! operand order, so only the bracketings are listed.

use super::{add, consts, dims, dtype, info, is_weight, rule, scalar, v, Rw};
use crate::canonical::analysis::EG;
use crate::canonical::lang::ONode;
use crate::canonical::RewriteError;
use autopar_ir::op::{GeluApprox, Op};
use autopar_ir::Role;
use egg::{Id, Subst};
use std::f64::consts::{FRAC_1_SQRT_2, SQRT_2};

pub(super) fn rules() -> Result<Vec<Rw>, RewriteError> {
    let mut rules = linear()?;
    rules.push(rule("embedding", "(Gather:0 ?t ?ids)", |eg, _, s| {
        let table = info(eg, s, "?t");
        let ok = matches!(table.role, Some(Role::Parameter))
            && table.ty()?.dtype.is_float()
            && table.ty()?.shape.rank() == 2
            && dtype(eg, s, "?ids")?.is_int();
        ok.then(|| add(eg, Op::Embedding, vec![s[v("?t")], s[v("?ids")]]))
    })?);
    rules.extend(activations()?);
    rules.extend(norms()?);
    rules.extend(attention()?);
    rules.push(rule(
        "moe-router",
        "(Div (Get:0 (TopK:-1 (Softmax:-1 ?l) ?k)) (ReduceSum:-1 (Get:0 (TopK:-1 (Softmax:-1 ?l) ?k))))",
        moe_router,
    )?);
    Ok(rules)
}

/// Whether `?x` is computed (not a stored tensor) and `?w` a 2-D float weight.
fn activation_by_weight(eg: &EG, s: &Subst) -> Option<bool> {
    let x_stored = matches!(info(eg, s, "?x").role, Some(Role::Parameter | Role::Constant));
    let w = info(eg, s, "?w").ty()?;
    Some(!x_stored && w.shape.rank() == 2 && w.dtype.is_float() && is_weight(eg, s[v("?w")]))
}

/// Whether `?b` is a stored 1-D bias matching the output width of `?w`.
fn bias_fits(eg: &EG, s: &Subst, out: usize) -> bool {
    is_weight(eg, s[v("?b")]) && dims(eg, s, "?b") == Some(vec![out])
}

fn linear() -> Result<Vec<Rw>, RewriteError> {
    let mut rules = vec![
        rule("matmul-weight", "(MatMul ?x ?w)", |eg, _, s| {
            activation_by_weight(eg, s)?.then(|| add(eg, Op::Linear, vec![s[v("?x")], s[v("?w")]]))
        })?,
        rule("linear-bias", "(Add (Linear ?x ?w) ?b)", |eg, _, s| {
            let out = *dims(eg, s, "?w")?.last()?;
            bias_fits(eg, s, out).then(|| add(eg, Op::Linear, vec![s[v("?x")], s[v("?w")], s[v("?b")]]))
        })?,
    ];
    for (mode, trans) in [("nn", false), ("nt", true)] {
        for bias in [false, true] {
            let pattern = format!("(Gemm:{mode} ?x ?w{})", if bias { " ?b" } else { "" });
            rules.push(rule(
                &format!("gemm-{mode}-{bias}"),
                &pattern,
                move |eg, _, s| {
                    if !activation_by_weight(eg, s)? || dims(eg, s, "?x")?.len() != 2 {
                        return None;
                    }
                    let w = dims(eg, s, "?w")?;
                    let out = if trans { w[0] } else { w[1] };
                    if bias && !bias_fits(eg, s, out) {
                        return None;
                    }
                    let mut weight = s[v("?w")];
                    if trans {
                        weight = add(
                            eg,
                            Op::Transpose {
                                perm: Some(vec![1, 0]),
                            },
                            vec![weight],
                        );
                    }
                    let mut inputs = vec![s[v("?x")], weight];
                    inputs.extend(bias.then(|| s[v("?b")]));
                    Some(add(eg, Op::Linear, inputs))
                },
            )?);
        }
    }
    for bias in ["", " ?b"] {
        let pattern = format!("(Reshape (Linear (Reshape ?x ?s0) ?w{bias}) ?s)");
        rules.push(rule(
            &format!("linear-flattened{bias}"),
            &pattern,
            move |eg, id, s| {
                let x = dims(eg, s, "?x")?;
                let w = dims(eg, s, "?w")?;
                let out = eg[id].data.ty()?.shape.as_fixed()?;
                let mut want = x.clone();
                *want.last_mut()? = w[1];
                if x.len() < 2 || *x.last()? != w[0] || out != want {
                    return None;
                }
                let mut inputs = vec![s[v("?x")], s[v("?w")]];
                inputs.extend((!bias.is_empty()).then(|| s[v("?b")]));
                Some(add(eg, Op::Linear, inputs))
            },
        )?);
    }
    Ok(rules)
}

/// One GELU formula: the `(1 + f(x))` factor, its constants, which GELU.
struct GeluCore {
    pattern: &'static str,
    consts: &'static [(&'static str, f64)],
    approximate: GeluApprox,
}

const GELU_CORES: [GeluCore; 3] = [
    GeluCore {
        pattern: "(Add (Erf (Div ?x ?r)) ?one)",
        consts: &[("?r", SQRT_2), ("?one", 1.0), ("?half", 0.5)],
        approximate: GeluApprox::None,
    },
    GeluCore {
        pattern: "(Add (Erf (Mul ?x ?r)) ?one)",
        consts: &[("?r", FRAC_1_SQRT_2), ("?one", 1.0), ("?half", 0.5)],
        approximate: GeluApprox::None,
    },
    GeluCore {
        pattern: "(Add (Tanh (Mul (Add ?x (Mul (Pow ?x ?three) ?c)) ?k)) ?one)",
        // √(2/π)
        consts: &[
            ("?three", 3.0),
            ("?c", 0.044715),
            ("?k", 0.7978845608028654),
            ("?one", 1.0),
            ("?half", 0.5),
        ],
        approximate: GeluApprox::Tanh,
    },
];

fn activations() -> Result<Vec<Rw>, RewriteError> {
    let mut rules = Vec::new();
    for (
        i,
        GeluCore {
            pattern: core,
            consts: want,
            approximate,
        },
    ) in GELU_CORES.into_iter().enumerate()
    {
        let brackets = [
            format!("(Mul (Mul ?x {core}) ?half)"),
            format!("(Mul ?x (Mul ?half {core}))"),
            format!("(Mul (Mul ?x ?half) {core})"),
        ];
        for (j, pattern) in brackets.iter().enumerate() {
            rules.push(rule(&format!("gelu-{i}-{j}"), pattern, move |eg, _, s| {
                consts(eg, s, want).then(|| add(eg, Op::Gelu { approximate }, vec![s[v("?x")]]))
            })?);
        }
    }
    rules.push(rule("silu", "(Mul ?x (Sigmoid ?x))", |eg, _, s| {
        dtype(eg, s, "?x")?
            .is_float()
            .then(|| add(eg, Op::Silu, vec![s[v("?x")]]))
    })?);
    Ok(rules)
}

/// Whether `?w` is a stored vector as wide as the last dim of `?x`.
fn norm_weight(eg: &EG, s: &Subst, name: &str) -> Option<bool> {
    let width = *dims(eg, s, "?x")?.last()?;
    Some(is_weight(eg, s[v(name)]) && dims(eg, s, name)? == vec![width])
}

fn norms() -> Result<Vec<Rw>, RewriteError> {
    let rms = "(Mul ?w (Mul ?x (Reciprocal (Sqrt (Add (ReduceMean:-1 (Pow ?x ?two)) ?eps)))))";
    let centred = "(Sub ?x (ReduceMean:-1 ?x))";
    let layer =
        format!("(Add (Mul (Div {centred} (Sqrt (Add (ReduceMean:-1 (Pow {centred} ?two)) ?eps))) ?w) ?b)");
    Ok(vec![
        rule("rms-norm", rms, |eg, _, s| {
            let epsilon = scalar(eg, s, "?eps")?;
            (consts(eg, s, &[("?two", 2.0)]) && norm_weight(eg, s, "?w")?).then(|| {
                add(
                    eg,
                    Op::RmsNorm { axis: -1, epsilon },
                    vec![s[v("?x")], s[v("?w")]],
                )
            })
        })?,
        rule("layer-norm", &layer, |eg, _, s| {
            let epsilon = scalar(eg, s, "?eps")?;
            let ok =
                consts(eg, s, &[("?two", 2.0)]) && norm_weight(eg, s, "?w")? && norm_weight(eg, s, "?b")?;
            ok.then(|| {
                add(
                    eg,
                    Op::LayerNorm { axis: -1, epsilon },
                    vec![s[v("?x")], s[v("?w")], s[v("?b")]],
                )
            })
        })?,
    ])
}

/// How the exporter scaled `q·kᵀ`: the pattern and the scale it implies.
type ScaleOf = fn(&EG, &Subst) -> Option<f64>;

fn attention() -> Result<Vec<Rw>, RewriteError> {
    let scores: [(&str, ScaleOf); 4] = [
        ("(Mul (MatMul ?q ?kt) ?s)", |eg, s| scalar(eg, s, "?s")),
        ("(Div (MatMul ?q ?kt) ?s)", |eg, s| {
            Some(1.0 / scalar(eg, s, "?s")?)
        }),
        ("(MatMul ?q ?kt)", |_, _| Some(1.0)),
        ("(MatMul (Mul ?q ?sq) (Mul ?kt ?sk))", |eg, s| {
            Some(scalar(eg, s, "?sq")? * scalar(eg, s, "?sk")?)
        }),
    ];
    let mut rules = Vec::new();
    for (i, (score, scale_of)) in scores.into_iter().enumerate() {
        let masks = [
            (score.to_string(), None),
            (format!("(Add {score} ?m)"), Some("?m")),
            (format!("(Where ?m {score} ?min)"), Some("?m")),
        ];
        for (j, (logits, mask)) in masks.into_iter().enumerate() {
            let pattern = format!("(MatMul (Softmax:-1 {logits}) ?v)");
            let keep_mask = j == 2;
            rules.push(rule(&format!("attention-{i}-{j}"), &pattern, move |eg, _, s| {
                let rank4 = ["?q", "?kt", "?v"]
                    .iter()
                    .all(|n| dims(eg, s, n).is_some_and(|d| d.len() == 4));
                if !rank4 {
                    return None;
                }
                if keep_mask {
                    // Where(keep, scores, lowest): masked logits become the most
                    // negative float, as a boolean keep-mask does.
                    let lowest = scalar(eg, s, "?min")? <= f32::MIN as f64 * 0.5;
                    if !lowest || dtype(eg, s, "?m")? != autopar_ir::DType::Bool {
                        return None;
                    }
                }
                let scale = scale_of(eg, s)?;
                let k = add(
                    eg,
                    Op::Transpose {
                        perm: Some(vec![0, 1, 3, 2]),
                    },
                    vec![s[v("?kt")]],
                );
                let mut inputs = vec![s[v("?q")], k, s[v("?v")]];
                inputs.extend(mask.map(|m| s[v(m)]));
                let op = Op::Attention {
                    scale: Some(scale),
                    causal: false,
                };
                Some(add(eg, op, inputs))
            })?);
        }
    }
    Ok(rules)
}

/// `TopK(Softmax(l), k).values / ReduceSum(values)` is the router's weight
/// output; its index output is TopK's.
fn moe_router(eg: &mut EG, _: Id, s: &Subst) -> Option<Id> {
    let k = scalar(eg, s, "?k")?;
    if k < 1.0 || k.fract() != 0.0 {
        return None;
    }
    let l = s[v("?l")];
    let softmax = add(eg, Op::Softmax { axis: -1 }, vec![l]);
    let topk = add(
        eg,
        Op::TopK {
            axis: -1,
            largest: true,
            sorted: true,
        },
        vec![softmax, s[v("?k")]],
    );
    let router = add(eg, Op::MoeRouter { top_k: k as usize }, vec![l]);
    let indices = eg.add(ONode::get(1, topk));
    let router_indices = eg.add(ONode::get(1, router));
    eg.union(indices, router_indices);
    Some(eg.add(ONode::get(0, router)))
}
