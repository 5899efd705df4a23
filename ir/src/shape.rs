//! Tensor shapes whose dimensions are either known sizes or named symbols
//! (`batch`, `seq`) that are bound later, so one graph serves every batch size.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// One dimension: a fixed size or a symbol bound at planning time.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum Dim {
    Fixed(usize),
    Sym(String),
}

impl Dim {
    /// The size if fixed.
    pub fn fixed(&self) -> Option<usize> {
        match self {
            Dim::Fixed(n) => Some(*n),
            Dim::Sym(_) => None,
        }
    }

    /// The size under `bindings`; `None` for an unbound symbol.
    pub fn resolve(&self, bindings: &Bindings) -> Option<usize> {
        match self {
            Dim::Fixed(n) => Some(*n),
            Dim::Sym(s) => bindings.get(s).copied(),
        }
    }
}

impl From<usize> for Dim {
    fn from(n: usize) -> Self {
        Dim::Fixed(n)
    }
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Fixed(n) => write!(f, "{n}"),
            Dim::Sym(s) => f.write_str(s),
        }
    }
}

/// Values for symbolic dimensions, e.g. `{"batch": 8, "seq": 2048}`.
pub type Bindings = BTreeMap<String, usize>;

/// A tensor shape (outermost dimension first).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(transparent)]
pub struct Shape(pub Vec<Dim>);

impl Shape {
    /// A shape of fixed sizes.
    pub fn fixed(dims: &[usize]) -> Shape {
        Shape(dims.iter().map(|&d| Dim::Fixed(d)).collect())
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// The sizes if every dimension is fixed.
    pub fn as_fixed(&self) -> Option<Vec<usize>> {
        self.0.iter().map(Dim::fixed).collect()
    }

    /// The sizes under `bindings`; `None` if a symbol is unbound.
    pub fn resolve(&self, bindings: &Bindings) -> Option<Vec<usize>> {
        self.0.iter().map(|d| d.resolve(bindings)).collect()
    }

    /// Element count under `bindings` (1 for a scalar).
    pub fn numel(&self, bindings: &Bindings) -> Option<u64> {
        self.0
            .iter()
            .map(|d| d.resolve(bindings).map(|n| n as u64))
            .product()
    }

    /// True if any dimension is symbolic.
    pub fn is_symbolic(&self) -> bool {
        self.0.iter().any(|d| matches!(d, Dim::Sym(_)))
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{d}")?;
        }
        write!(f, "]")
    }
}

impl From<Vec<usize>> for Shape {
    fn from(v: Vec<usize>) -> Self {
        Shape::fixed(&v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symbolic_dims_resolve_under_bindings() {
        let s = Shape(vec![Dim::Sym("batch".into()), Dim::Sym("seq".into()), 64.into()]);
        assert_eq!(s.to_string(), "[batch, seq, 64]");
        assert_eq!(s.as_fixed(), None);
        let b: Bindings = [("batch".to_string(), 2), ("seq".to_string(), 16)].into();
        assert_eq!(s.resolve(&b), Some(vec![2, 16, 64]));
        assert_eq!(s.numel(&b), Some(2048));
    }

    #[test]
    fn dims_serialize_as_numbers_or_names() {
        let s = Shape(vec![Dim::Sym("batch".into()), 3.into()]);
        let j = serde_json::to_string(&s).unwrap();
        assert_eq!(j, r#"["batch",3]"#);
        assert_eq!(serde_json::from_str::<Shape>(&j).unwrap(), s);
    }
}
