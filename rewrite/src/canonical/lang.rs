//! The e-graph language: one e-node per graph value producer.
//!
//! An e-node is a [`Head`] plus child e-classes. Ops keep their attributes in
//! the head (hashed through their serialised form, since `Op` holds floats),
//! so two nodes are equal exactly when op, attributes and inputs are equal.
//! Multi-output ops are tuples read through `Get(i)`; absent optional inputs
//! are the `Absent` leaf.
//!
//! Rules are written as egg pattern strings over a small op syntax (see
//! [`parse_head`]): `Mul`, `Softmax:-1`, `Transpose:0,2,1,3`, `Gemm:nt`,
//! `Cast:f32`, `Get:0`, and `Name:*` for "this op with any attributes".

use autopar_ir::op::{BinaryOp, Op, ReduceKind, UnaryOp};
use autopar_ir::DType;
use egg::{FromOp, Id, Language};
use std::fmt;
use std::sync::Arc;

/// An op as an e-node head: the op plus its serialised form as the identity.
#[derive(Debug, Clone)]
pub struct OpHead {
    /// Display name ([`Op::name`]): what a wildcard pattern matches on.
    pub name: Arc<str>,
    /// Serialised op; `None` in a wildcard pattern head.
    key: Option<Arc<str>>,
    op: Option<Arc<Op>>,
}

impl OpHead {
    /// The head for a concrete op.
    pub fn new(op: Op) -> OpHead {
        let key = serde_json::to_string(&op).unwrap_or_else(|_| format!("{op:?}"));
        OpHead {
            name: op.name().into(),
            key: Some(key.into()),
            op: Some(Arc::new(op)),
        }
    }

    /// The op (`None` only for wildcard pattern heads).
    pub fn op(&self) -> Option<&Op> {
        self.op.as_deref()
    }

    fn ident(&self) -> (&str, Option<&str>) {
        (&self.name, self.key.as_deref())
    }
}

impl PartialEq for OpHead {
    fn eq(&self, other: &Self) -> bool {
        self.ident() == other.ident()
    }
}
impl Eq for OpHead {}
impl PartialOrd for OpHead {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OpHead {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.ident().cmp(&other.ident())
    }
}
impl std::hash::Hash for OpHead {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.ident().hash(state)
    }
}

/// What an e-node is.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Head {
    /// A tensor that no node computes (input, parameter, constant), by its
    /// index in the analysis' leaf table.
    Leaf(u32),
    /// An absent optional input.
    Absent,
    /// Output `i` of a multi-output op (the single child).
    Get(usize),
    /// An op applied to its children.
    Op(OpHead),
}

/// Groups e-nodes for egg's matcher; patterns with a wildcard head share the
/// group of every op with that name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Discriminant {
    Leaf(u32),
    Absent,
    Get(usize),
    Op(Arc<str>),
}

/// An e-node: head and children.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ONode {
    pub head: Head,
    pub children: Vec<Id>,
}

impl ONode {
    /// An op node.
    pub fn op(op: Op, children: Vec<Id>) -> ONode {
        ONode {
            head: Head::Op(OpHead::new(op)),
            children,
        }
    }

    /// Output `i` of the tuple `of`.
    pub fn get(i: usize, of: Id) -> ONode {
        ONode {
            head: Head::Get(i),
            children: vec![of],
        }
    }

    /// A leaf by its table index.
    pub fn leaf(index: u32) -> ONode {
        ONode {
            head: Head::Leaf(index),
            children: vec![],
        }
    }

    /// The absent-input leaf.
    pub fn absent() -> ONode {
        ONode {
            head: Head::Absent,
            children: vec![],
        }
    }

    /// The op of an op node.
    pub fn as_op(&self) -> Option<&Op> {
        match &self.head {
            Head::Op(h) => h.op(),
            _ => None,
        }
    }
}

impl Language for ONode {
    type Discriminant = Discriminant;

    fn discriminant(&self) -> Discriminant {
        match &self.head {
            Head::Leaf(i) => Discriminant::Leaf(*i),
            Head::Absent => Discriminant::Absent,
            Head::Get(i) => Discriminant::Get(*i),
            Head::Op(h) => Discriminant::Op(h.name.clone()),
        }
    }

    /// `self` is the pattern side: a wildcard head matches any op of its name.
    fn matches(&self, other: &Self) -> bool {
        if self.children.len() != other.children.len() {
            return false;
        }
        match (&self.head, &other.head) {
            (Head::Op(a), Head::Op(b)) if a.key.is_none() => a.name == b.name,
            (a, b) => a == b,
        }
    }

    fn children(&self) -> &[Id] {
        &self.children
    }

    fn children_mut(&mut self) -> &mut [Id] {
        &mut self.children
    }
}

impl fmt::Display for ONode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.head {
            Head::Leaf(i) => write!(f, "leaf{i}"),
            Head::Absent => f.write_str("Absent"),
            Head::Get(i) => write!(f, "Get:{i}"),
            Head::Op(h) => match &h.key {
                Some(_) => f.write_str(&h.name),
                None => write!(f, "{}:*", h.name),
            },
        }
    }
}

/// Why a pattern op string did not parse.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadHead(pub String);

impl FromOp for ONode {
    type Error = BadHead;

    fn from_op(op: &str, children: Vec<Id>) -> Result<Self, Self::Error> {
        Ok(ONode {
            head: parse_head(op).ok_or_else(|| BadHead(op.to_string()))?,
            children,
        })
    }
}

fn ints(s: &str) -> Option<Vec<i64>> {
    s.split(',').map(|x| x.trim().parse().ok()).collect()
}

/// Parses the pattern op syntax: `Name` (an op without attributes, or with
/// its defaults), `Name:attrs` for the few attributed ops rules need,
/// `Name:*` for any attributes, `Get:i`, `Absent`.
pub fn parse_head(s: &str) -> Option<Head> {
    let (name, attrs) = match s.split_once(':') {
        Some((n, a)) => (n, Some(a)),
        None => (s, None),
    };
    if attrs == Some("*") {
        return Some(Head::Op(OpHead {
            name: name.into(),
            key: None,
            op: None,
        }));
    }
    let reduce = |kind| {
        Some(Op::Reduce {
            kind,
            axes: Some(ints(attrs?)?),
            keepdims: true,
            noop_with_empty_axes: false,
        })
    };
    let op = match (name, attrs) {
        ("Get", Some(i)) => return Some(Head::Get(i.parse().ok()?)),
        ("Absent", None) => return Some(Head::Absent),
        ("Softmax", Some(a)) => Op::Softmax {
            axis: a.parse().ok()?,
        },
        ("Gather", Some(a)) => Op::Gather {
            axis: a.parse().ok()?,
        },
        ("Transpose", Some(p)) => Op::Transpose {
            perm: Some(ints(p)?.into_iter().map(|x| x as usize).collect()),
        },
        ("ReduceMean", _) => reduce(ReduceKind::Mean)?,
        ("ReduceSum", _) => reduce(ReduceKind::Sum)?,
        ("TopK", Some(a)) => Op::TopK {
            axis: a.parse().ok()?,
            largest: true,
            sorted: true,
        },
        ("Gemm", Some(t)) => Op::Gemm {
            alpha: 1.0,
            beta: 1.0,
            trans_a: false,
            trans_b: match t {
                "nn" => false,
                "nt" => true,
                _ => return None,
            },
        },
        ("Cast", Some(t)) => Op::cast(DType::ALL.into_iter().find(|d| d.name() == t)?),
        (n, None) => plain_op(n)?,
        _ => return None,
    };
    Some(Head::Op(OpHead::new(op)))
}

/// Ops named without attributes in patterns.
fn plain_op(name: &str) -> Option<Op> {
    use BinaryOp as B;
    use UnaryOp as U;
    let unary = [
        U::Neg,
        U::Abs,
        U::Sqrt,
        U::Reciprocal,
        U::Exp,
        U::Log,
        U::Tanh,
        U::Erf,
        U::Sigmoid,
        U::Relu,
    ];
    let binary = [B::Add, B::Sub, B::Mul, B::Div, B::Pow];
    if let Some(&func) = unary.iter().find(|f| format!("{f:?}") == name) {
        return Some(Op::Unary { func });
    }
    if let Some(&func) = binary.iter().find(|f| format!("{f:?}") == name) {
        return Some(Op::Binary { func });
    }
    Some(match name {
        "MatMul" => Op::MatMul,
        "Where" => Op::Where,
        "Linear" => Op::Linear,
        "Silu" => Op::Silu,
        "Embedding" => Op::Embedding,
        "Reshape" => Op::Reshape { allowzero: false },
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_parse_to_ops_with_attributes() {
        let h = parse_head("Transpose:0,2,1,3").unwrap();
        let want = Op::Transpose {
            perm: Some(vec![0, 2, 1, 3]),
        };
        assert_eq!(h, Head::Op(OpHead::new(want)));
        assert_eq!(
            parse_head("Mul").unwrap(),
            Head::Op(OpHead::new(Op::Binary { func: BinaryOp::Mul }))
        );
        assert_eq!(
            parse_head("Cast:f32").unwrap(),
            Head::Op(OpHead::new(Op::cast(DType::F32)))
        );
        assert_eq!(parse_head("Get:1"), Some(Head::Get(1)));
        assert_eq!(parse_head("Frobnicate"), None);
        assert_eq!(parse_head("Gemm:tt"), None);
    }

    #[test]
    fn wildcard_matches_any_attributes_but_same_arity() {
        let pat = ONode::from_op("Transpose:*", vec![Id::from(0)]).unwrap();
        let node = ONode::op(
            Op::Transpose {
                perm: Some(vec![1, 0]),
            },
            vec![Id::from(3)],
        );
        assert!(pat.matches(&node));
        assert!(!node.matches(&pat));
        let two = ONode::op(
            Op::Transpose {
                perm: Some(vec![1, 0]),
            },
            vec![Id::from(3), Id::from(4)],
        );
        assert!(!pat.matches(&two));
    }
}
