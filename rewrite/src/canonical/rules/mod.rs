//! The rewrite rules: egg patterns plus Rust appliers that check constants,
//! roles and shapes through the analysis before adding the canonical form.
//!
//! `structural` holds identities and folds (commutativity, identity casts,
//! transpose/reshape chains); `fuse` the canonical-op recognisers.

mod fuse;
mod structural;

use super::analysis::{Info, EG};
use super::lang::ONode;
use super::RewriteError;
use autopar_ir::op::Op;
use autopar_ir::{DType, Role};
use egg::{Applier, Id, Pattern, PatternAst, Rewrite, Subst, Symbol, Var};

/// A rule of this language.
pub type Rw = Rewrite<ONode, Meta>;
use super::analysis::Meta;

/// Every rule, structural first.
pub fn all() -> Result<Vec<Rw>, RewriteError> {
    let mut rules = structural::rules()?;
    rules.extend(fuse::rules()?);
    Ok(rules)
}

/// An applier from a function that builds the replacement (or declines with
/// `None`); the result is unioned with the matched class.
struct Build<F>(F);

impl<F> Applier<ONode, Meta> for Build<F>
where
    F: Fn(&mut EG, Id, &Subst) -> Option<Id>,
{
    fn apply_one(
        &self,
        egraph: &mut EG,
        eclass: Id,
        subst: &Subst,
        _: Option<&PatternAst<ONode>>,
        _: Symbol,
    ) -> Vec<Id> {
        match (self.0)(egraph, eclass, subst) {
            Some(id) if egraph.union(eclass, id) => vec![id],
            _ => vec![],
        }
    }
}

/// A rule: `pattern` (egg syntax over [`super::lang::parse_head`] ops) and a
/// builder for the equivalent expression.
fn rule<F>(name: &str, pattern: &str, build: F) -> Result<Rw, RewriteError>
where
    F: Fn(&mut EG, Id, &Subst) -> Option<Id> + Send + Sync + 'static,
{
    let searcher: Pattern<ONode> = pattern.parse().map_err(|e| RewriteError::Rule {
        rule: name.to_string(),
        message: format!("{e:?}"),
    })?;
    Rewrite::new(name, searcher, Build(build)).map_err(|message| RewriteError::Rule {
        rule: name.to_string(),
        message,
    })
}

/// The pattern variable `name` (with its `?`).
fn v(name: &str) -> Var {
    name.parse()
        .unwrap_or_else(|_| panic!("bad pattern variable {name}"))
}

/// The analysis data of the class bound to `name`.
fn info<'a>(egraph: &'a EG, s: &Subst, name: &str) -> &'a Info {
    &egraph[s[v(name)]].data
}

/// The value of a scalar constant bound to `name`.
fn scalar(egraph: &EG, s: &Subst, name: &str) -> Option<f64> {
    info(egraph, s, name).scalar()
}

/// Whether `got` equals `want` to a relative 1e-5 (constants are stored in
/// f32, rules state them exactly).
fn close(got: f64, want: f64) -> bool {
    (got - want).abs() <= 1e-5 * want.abs().max(1.0)
}

/// Whether every named scalar constant has its expected value.
fn consts(egraph: &EG, s: &Subst, want: &[(&str, f64)]) -> bool {
    want.iter()
        .all(|&(name, w)| scalar(egraph, s, name).is_some_and(|g| close(g, w)))
}

/// Static sizes of the class bound to `name`, if fixed.
fn dims(egraph: &EG, s: &Subst, name: &str) -> Option<Vec<usize>> {
    info(egraph, s, name).ty()?.shape.as_fixed()
}

/// Element type of the class bound to `name`.
fn dtype(egraph: &EG, s: &Subst, name: &str) -> Option<DType> {
    Some(info(egraph, s, name).ty()?.dtype)
}

/// Whether a class holds data rather than a computed activation: a
/// parameter or constant leaf, or a transpose of one (an exporter's
/// pre-transposed weight).
fn is_weight(egraph: &EG, id: Id) -> bool {
    let stored = |id: Id| matches!(egraph[id].data.role, Some(Role::Parameter | Role::Constant));
    stored(id)
        || egraph[id]
            .nodes
            .iter()
            .any(|n| matches!(n.as_op(), Some(Op::Transpose { .. })) && stored(n.children[0]))
}

/// Adds an op node.
fn add(egraph: &mut EG, op: Op, children: Vec<Id>) -> Id {
    egraph.add(ONode::op(op, children))
}
