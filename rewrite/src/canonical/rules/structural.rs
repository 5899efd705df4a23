//! Identities that expose the canonical patterns: commutativity, casts to
//! the type a value already has, division rewritten as multiplication by a
//! reciprocal, and transpose/reshape chains collapsed.

use super::{add, dtype, info, rule, scalar, v, Rw};
use crate::canonical::analysis::EG;
use crate::canonical::lang::ONode;
use crate::canonical::RewriteError;
use autopar_ir::op::{BinaryOp, Op, UnaryOp};
use egg::{Id, Pattern, Rewrite};

pub(super) fn rules() -> Result<Vec<Rw>, RewriteError> {
    let mut rules = Vec::new();
    for name in ["Add", "Mul"] {
        let lhs: Pattern<ONode> = format!("({name} ?a ?b)").parse().map_err(|e| bad(name, e))?;
        let rhs: Pattern<ONode> = format!("({name} ?b ?a)").parse().map_err(|e| bad(name, e))?;
        let rw = Rewrite::new(format!("{name}-commute"), lhs, rhs).map_err(|message| RewriteError::Rule {
            rule: name.to_string(),
            message,
        })?;
        rules.push(rw);
    }
    for dt in autopar_ir::DType::ALL {
        rules.push(rule(
            &format!("cast-noop-{}", dt.name()),
            &format!("(Cast:{} ?x)", dt.name()),
            move |eg, _, s| (dtype(eg, s, "?x")? == dt).then(|| s[v("?x")]),
        )?);
    }
    rules.push(rule("one-over", "(Div ?one ?y)", |eg, _, s| {
        let float = dtype(eg, s, "?y")?.is_float();
        (float && scalar(eg, s, "?one")? == 1.0).then(|| unary(eg, UnaryOp::Reciprocal, s[v("?y")]))
    })?);
    rules.push(rule("div-sqrt", "(Div ?x (Sqrt ?y))", |eg, _, s| {
        let float = dtype(eg, s, "?x")?.is_float();
        let sqrt = unary(eg, UnaryOp::Sqrt, s[v("?y")]);
        let recip = unary(eg, UnaryOp::Reciprocal, sqrt);
        float.then(|| add(eg, Op::Binary { func: BinaryOp::Mul }, vec![s[v("?x")], recip]))
    })?);
    rules.push(rule(
        "reshape-reshape",
        "(Reshape (Reshape ?x ?s1) ?s2)",
        |eg, _, s| {
            let shape = info(eg, s, "?s2").value.as_ref()?.as_i64()?.to_vec();
            (!shape.contains(&0)).then(|| {
                add(
                    eg,
                    Op::Reshape { allowzero: false },
                    vec![s[v("?x")], s[v("?s2")]],
                )
            })
        },
    )?);
    rules.push(rule("reshape-noop", "(Reshape ?x ?s)", |eg, id, s| {
        let same = info(eg, s, "?x").ty().is_some() && info(eg, s, "?x").ty() == eg[id].data.ty();
        same.then(|| s[v("?x")])
    })?);
    rules.push(rule("transpose-fold", "(Transpose:* ?y)", fold_transpose)?);
    Ok(rules)
}

fn bad(name: &str, e: impl std::fmt::Debug) -> RewriteError {
    RewriteError::Rule {
        rule: name.to_string(),
        message: format!("{e:?}"),
    }
}

fn unary(eg: &mut EG, func: UnaryOp, x: Id) -> Id {
    add(eg, Op::Unary { func }, vec![x])
}

/// The perms of the Transpose nodes in class `id` reading class `child`.
fn perms(eg: &EG, id: Id, child: Id) -> Vec<Vec<usize>> {
    eg[id]
        .nodes
        .iter()
        .filter(|n| n.children.len() == 1 && eg.find(n.children[0]) == eg.find(child))
        .filter_map(|n| match n.as_op() {
            Some(Op::Transpose { perm: Some(p) }) => Some(p.clone()),
            _ => None,
        })
        .collect()
}

/// `Transpose(p)` with the identity `p` is its input; `Transpose(p2) ∘
/// Transpose(p1)` is `Transpose(i ↦ p1[p2[i]])` of the inner input.
fn fold_transpose(eg: &mut EG, id: Id, s: &egg::Subst) -> Option<Id> {
    let y = s[v("?y")];
    let outer = perms(eg, id, y);
    if outer.iter().any(|p| p.iter().enumerate().all(|(i, &d)| i == d)) {
        return Some(y);
    }
    let inner: Vec<(Vec<usize>, Id)> = eg[y]
        .nodes
        .iter()
        .filter_map(|n| match n.as_op() {
            Some(Op::Transpose { perm: Some(p) }) => Some((p.clone(), n.children[0])),
            _ => None,
        })
        .collect();
    let (p2, (p1, x)) = outer.first().zip(inner.first())?;
    if p1.len() != p2.len() {
        return None;
    }
    let composed: Vec<usize> = p2.iter().map(|&i| p1.get(i).copied()).collect::<Option<_>>()?;
    if composed.iter().enumerate().all(|(i, &d)| i == d) {
        return Some(*x);
    }
    Some(add(eg, Op::Transpose { perm: Some(composed) }, vec![*x]))
}
