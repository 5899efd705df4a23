//! Typed access to a node's attributes with ONNX defaults; every error names
//! the node.

use super::proto::{attribute_type as at, AttributeProto, NodeProto, TensorProto};
use super::OnnxError;
use std::cell::RefCell;
use std::collections::BTreeSet;

/// A node's attributes, looked up by name. Every lookup is recorded so that
/// attributes a converter never reads (new or unsupported features) are
/// reported instead of silently ignored.
pub(crate) struct Attrs<'a> {
    node: String,
    op_type: &'a str,
    list: &'a [AttributeProto],
    read: RefCell<BTreeSet<&'a str>>,
}

impl<'a> Attrs<'a> {
    /// Wraps `proto`'s attributes; `node` is the (unique) node name for errors.
    pub(crate) fn new(node: String, proto: &'a NodeProto) -> Attrs<'a> {
        Attrs {
            node,
            op_type: &proto.op_type,
            list: &proto.attribute,
            read: RefCell::default(),
        }
    }

    /// The node's name.
    pub(crate) fn node(&self) -> &str {
        &self.node
    }

    /// The node's op type.
    pub(crate) fn op_type(&self) -> &'a str {
        self.op_type
    }

    /// An error about this node.
    pub(crate) fn error(&self, message: impl Into<String>) -> OnnxError {
        OnnxError::BadNode {
            node: self.node.clone(),
            op_type: self.op_type.to_string(),
            message: message.into(),
        }
    }

    /// The attribute `name` if present, checking its declared type.
    fn get(&self, name: &str, ty: i32) -> Result<Option<&'a AttributeProto>, OnnxError> {
        let Some(a) = self.find(name) else {
            return Ok(None);
        };
        if a.r#type != ty && a.r#type != 0 {
            return Err(self.error(format!(
                "attribute '{name}' has type code {}, expected {ty}",
                a.r#type
            )));
        }
        Ok(Some(a))
    }

    /// The attribute `name` if present, recorded as read.
    fn find(&self, name: &str) -> Option<&'a AttributeProto> {
        let a = self.list.iter().find(|a| a.name == name)?;
        self.read.borrow_mut().insert(&a.name);
        Some(a)
    }

    /// True if the attribute is present.
    pub(crate) fn has(&self, name: &str) -> bool {
        self.find(name).is_some()
    }

    /// Accepts attributes that do not change the imported computation
    /// (precision hints, seeds, redundant counts).
    pub(crate) fn ignore(&self, names: &[&str]) {
        for name in names {
            self.find(name);
        }
    }

    /// Fails if the node has an attribute the converter never read.
    pub(crate) fn check_all_read(&self) -> Result<(), OnnxError> {
        let read = self.read.borrow();
        let unread: Vec<&str> = self
            .list
            .iter()
            .map(|a| a.name.as_str())
            .filter(|n| !read.contains(n))
            .collect();
        if unread.is_empty() {
            Ok(())
        } else {
            Err(self.error(format!("attribute(s) {unread:?} not supported")))
        }
    }

    /// An `INT` attribute.
    pub(crate) fn int(&self, name: &str) -> Result<Option<i64>, OnnxError> {
        Ok(self.get(name, at::INT)?.map(|a| a.i))
    }

    /// An `INT` attribute or its ONNX default.
    pub(crate) fn int_or(&self, name: &str, default: i64) -> Result<i64, OnnxError> {
        Ok(self.int(name)?.unwrap_or(default))
    }

    /// An `INT` attribute used as a flag (`0`/`1`).
    pub(crate) fn flag(&self, name: &str, default: bool) -> Result<bool, OnnxError> {
        match self.int_or(name, default as i64)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(self.error(format!("attribute '{name}' = {v}, expected 0 or 1"))),
        }
    }

    /// A non-negative `INT` attribute as a count or size.
    pub(crate) fn usize_or(&self, name: &str, default: usize) -> Result<usize, OnnxError> {
        let v = self.int_or(name, default as i64)?;
        usize::try_from(v).map_err(|_| self.error(format!("attribute '{name}' = {v} must not be negative")))
    }

    /// A required `INT` attribute.
    pub(crate) fn required_int(&self, name: &str) -> Result<i64, OnnxError> {
        self.int(name)?
            .ok_or_else(|| self.error(format!("required attribute '{name}' is missing")))
    }

    /// A `FLOAT` attribute.
    pub(crate) fn float(&self, name: &str) -> Result<Option<f32>, OnnxError> {
        Ok(self.get(name, at::FLOAT)?.map(|a| a.f))
    }

    /// A `FLOAT` attribute or its ONNX default.
    pub(crate) fn float_or(&self, name: &str, default: f32) -> Result<f32, OnnxError> {
        Ok(self.float(name)?.unwrap_or(default))
    }

    /// An `INTS` attribute.
    pub(crate) fn ints(&self, name: &str) -> Result<Option<Vec<i64>>, OnnxError> {
        Ok(self.get(name, at::INTS)?.map(|a| a.ints.clone()))
    }

    /// A `FLOATS` attribute.
    pub(crate) fn floats(&self, name: &str) -> Result<Option<Vec<f32>>, OnnxError> {
        Ok(self.get(name, at::FLOATS)?.map(|a| a.floats.clone()))
    }

    /// A `STRING` attribute, decoded as UTF-8.
    pub(crate) fn string(&self, name: &str) -> Result<Option<String>, OnnxError> {
        self.get(name, at::STRING)?
            .map(|a| {
                String::from_utf8(a.s.clone())
                    .map_err(|_| self.error(format!("attribute '{name}' is not UTF-8")))
            })
            .transpose()
    }

    /// A `TENSOR` attribute.
    pub(crate) fn tensor(&self, name: &str) -> Result<Option<&'a TensorProto>, OnnxError> {
        Ok(self.get(name, at::TENSOR)?.and_then(|a| a.t.as_ref()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(attrs: Vec<AttributeProto>) -> NodeProto {
        NodeProto {
            op_type: "Softmax".into(),
            attribute: attrs,
            ..Default::default()
        }
    }

    #[test]
    fn defaults_apply_when_absent_and_types_are_checked() {
        let n = node(vec![
            AttributeProto {
                name: "axis".into(),
                r#type: at::INT,
                i: 2,
                ..Default::default()
            },
            AttributeProto {
                name: "eps".into(),
                r#type: at::FLOAT,
                f: 0.5,
                ..Default::default()
            },
        ]);
        let a = Attrs::new("sm".into(), &n);
        assert_eq!(a.int_or("axis", -1).unwrap(), 2);
        assert_eq!(a.int_or("missing", -1).unwrap(), -1);
        assert_eq!(a.float_or("eps", 1e-5).unwrap(), 0.5);
        let err = a.int("eps").unwrap_err().to_string();
        assert!(
            err.contains("node 'sm' (Softmax)") && err.contains("'eps'"),
            "{err}"
        );
        let err = a.flag("axis", false).unwrap_err().to_string();
        assert!(
            err.contains("node 'sm' (Softmax)") && err.contains("attribute 'axis' = 2, expected 0 or 1"),
            "{err}"
        );
    }

    #[test]
    fn unread_attributes_are_reported() {
        let attr = |name: &str| AttributeProto {
            name: name.into(),
            r#type: at::INT,
            ..Default::default()
        };
        let n = node(vec![attr("axis"), attr("seed"), attr("window")]);
        let a = Attrs::new("sm".into(), &n);
        a.int("axis").unwrap();
        a.ignore(&["seed"]);
        let err = a.check_all_read().unwrap_err().to_string();
        assert!(err.contains(r#"["window"] not supported"#), "{err}");
    }
}
