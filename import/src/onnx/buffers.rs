//! Initializers that hold no trainable weight, though stored beside the
//! weights: the dynamo exporter folds a model's buffers and scalar
//! constants into initializers. Trained as parameters they would drift
//! (and count), so the two exports of one model would train differently.
//! Recognised by what their data is, not by name (the exporter names
//! folded weights and folded buffers alike, `val_44`, `unsqueeze_14`):
//!
//! - **scalars** (rank 0): norm epsilons, exponents, attention scales, mask
//!   fills, embedding scales. A model's trainable tensors are vectors or
//!   more; a learned scalar (a temperature) would train frozen.
//! - **rotary tables**: `cos(p·θ_j)` or `sin(p·θ_j)` over positions `p`
//!   (rows) and frequencies `θ_j` (columns), which RoPE models compute
//!   from their `inv_freq` buffer. No trained or randomly initialised
//!   matrix starts every column at cos 0 = 1 (or sin 0 = 0) and follows
//!   one phase per column.

use autopar_ir::Value;

/// Largest deviation from an exact rotary table that still counts as one
/// (the tables are computed in f32, and phases grow with the position).
const TOLERANCE: f64 = 1e-4;

/// Whether an initializer's data is a constant of the model, not a weight.
pub(super) fn is_buffer(v: &Value) -> bool {
    v.dtype.is_float() && (v.shape.is_empty() || rotary_table(v))
}

/// `[1, …, positions, columns]` with at least three positions, every
/// column `cos(p·θ)` or `sin(p·θ)` of its own `θ` (tables that put the
/// sines beside the cosines, as GPT-J's, included), some `θ` not zero (an
/// all-zero or all-one matrix is a weight at its initial value).
fn rotary_table(v: &Value) -> bool {
    let rank = v.shape.len();
    if rank < 2 || v.shape[..rank - 2].iter().any(|&d| d != 1) {
        return false;
    }
    let (positions, columns) = (v.shape[rank - 2], v.shape[rank - 1]);
    if positions < 3 || columns == 0 {
        return false;
    }
    let t = v.to_f64_vec();
    let at = |p: usize, j: usize| t[p * columns + j];
    let follows = |j: usize, wave: fn(f64) -> f64, theta: f64| {
        (0..positions).all(|p| (at(p, j) - wave(p as f64 * theta)).abs() <= TOLERANCE)
    };
    // The phase step of column `j` if it is a cosine or a sine wave.
    let phase = |j: usize| {
        let cos = at(1, j).clamp(-1.0, 1.0).acos();
        if follows(j, f64::cos, cos) {
            return Some(cos);
        }
        // sin(θ) does not say whether θ is past π/2: either may fit.
        let sin = at(1, j).clamp(-1.0, 1.0).asin();
        [sin, std::f64::consts::PI - sin]
            .into_iter()
            .find(|&theta| follows(j, f64::sin, theta))
    };
    let phases: Option<Vec<f64>> = (0..columns).map(phase).collect();
    phases.is_some_and(|p| p.iter().any(|theta| theta.abs() > 1e-3))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(wave: fn(f64) -> f64, positions: usize, thetas: &[f64]) -> Value {
        let data: Vec<f32> = (0..positions)
            .flat_map(|p| thetas.iter().map(move |&t| wave(p as f64 * t) as f32))
            .collect();
        Value::f32(vec![1, 1, positions, thetas.len()], data).unwrap()
    }

    #[test]
    fn scalars_and_rotary_tables_are_buffers_but_weights_are_not() {
        let thetas = [1.0, 0.1, 0.01, 2.5];
        assert!(is_buffer(&table(f64::cos, 16, &thetas)));
        assert!(is_buffer(&table(f64::sin, 16, &thetas)));
        assert!(is_buffer(&Value::f32(vec![], vec![1e-6]).unwrap()));
        // A weight that merely starts at one, and a table too short to tell.
        let mut w = table(f64::cos, 16, &thetas);
        if let autopar_ir::Data::F32(d) = &mut w.data {
            d[40] += 0.01;
        }
        assert!(!is_buffer(&w));
        assert!(!is_buffer(&table(f64::cos, 2, &thetas)));
        assert!(!is_buffer(
            &Value::f32(vec![2, 2], vec![1.0, 1.0, 0.3, 0.2]).unwrap()
        ));
        assert!(!is_buffer(&Value::f32(vec![3], vec![1.0, 1.0, 1.0]).unwrap()));
        // Sines beside cosines (GPT-J's layout) are a table; zeros and ones are not.
        let (sin, cos) = (table(f64::sin, 8, &[0.5, 0.05]), table(f64::cos, 8, &[0.5, 0.05]));
        let (s, c) = (sin.to_f64_vec(), cos.to_f64_vec());
        let both: Vec<f32> = (0..8)
            .flat_map(|p| [s[2 * p], s[2 * p + 1], c[2 * p], c[2 * p + 1]])
            .map(|x| x as f32)
            .collect();
        assert!(is_buffer(&Value::f32(vec![8, 4], both).unwrap()));
        assert!(!is_buffer(&Value::f32(vec![4, 3], vec![0.0; 12]).unwrap()));
        assert!(!is_buffer(&Value::f32(vec![4, 3], vec![1.0; 12]).unwrap()));
    }
}
