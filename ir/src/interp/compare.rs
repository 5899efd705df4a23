//! Comparing a computed tensor with a reference one.

use crate::Value;

/// Agreement between a computed and a reference tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Comparison {
    /// Largest element-wise `|actual − expected|`.
    pub max_abs: f64,
    /// `max_abs / max |expected|`: relative to the reference's scale, so
    /// elements near zero do not dominate (a pure element-wise ratio would).
    pub max_rel: f64,
}

impl Comparison {
    /// True when the relative error is within `tol` (NaN never is).
    pub fn within(&self, tol: f64) -> bool {
        self.max_rel <= tol
    }
}

/// Compares two tensors; `None` when their shapes differ. NaNs count as equal
/// only where both sides have them, infinities only when identical.
pub fn compare(actual: &Value, expected: &Value) -> Option<Comparison> {
    if actual.shape != expected.shape {
        return None;
    }
    let (a, e) = (actual.to_f64_vec(), expected.to_f64_vec());
    let mut max_abs: f64 = 0.0;
    let mut scale: f64 = 0.0;
    let mut unmatched_nan = false;
    for (&x, &y) in a.iter().zip(&e) {
        if x.is_nan() && y.is_nan() || x == y {
            continue;
        }
        let diff = (x - y).abs();
        unmatched_nan |= diff.is_nan();
        max_abs = max_abs.max(diff);
    }
    for &y in &e {
        if y.is_finite() {
            scale = scale.max(y.abs());
        }
    }
    if unmatched_nan {
        max_abs = f64::NAN;
    }
    let max_rel = if max_abs == 0.0 {
        0.0
    } else {
        max_abs / scale.max(f64::MIN_POSITIVE)
    };
    Some(Comparison { max_abs, max_rel })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_error_is_scaled_by_the_reference() {
        let e = Value::f32(vec![3], vec![10.0, -20.0, 0.0]).unwrap();
        let a = Value::f32(vec![3], vec![10.0, -20.0, 1.0 / 512.0]).unwrap();
        let c = compare(&a, &e).unwrap();
        assert_eq!(c.max_abs, 1.0 / 512.0);
        assert_eq!(c.max_rel, 1.0 / 512.0 / 20.0);
        assert!(c.within(1e-4));
        assert!(!c.within(9e-5));
    }

    #[test]
    fn nan_matches_only_nan_and_shapes_must_agree() {
        let e = Value::f32(vec![2], vec![f32::NAN, 1.0]).unwrap();
        assert!(compare(&e, &e).unwrap().within(0.0));
        let a = Value::f32(vec![2], vec![0.0, 1.5]).unwrap();
        assert!(
            !compare(&a, &e).unwrap().within(1.0),
            "a NaN mismatch is never within tolerance"
        );
        assert!(compare(&Value::f32(vec![1], vec![1.0]).unwrap(), &e).is_none());
    }
}
