//! Shared plumbing for the op families: argument access with clear errors,
//! axis normalisation, constant-input reading, the generic float trait the
//! kernels are written against, a safe wrapper around `matrixmultiply`, and
//! cost helpers.

use super::{InferInput, OpError, TensorType};
use crate::{round_float, DType, Data, Dim, Shape, Value};

/// An `OpError::Invalid` for `op`.
pub(crate) fn invalid(op: &str, message: impl Into<String>) -> OpError {
    OpError::Invalid {
        op: op.to_string(),
        message: message.into(),
    }
}

/// An `OpError::Unsupported` for `op`.
pub(crate) fn unsupported(op: &str, what: impl Into<String>) -> OpError {
    OpError::Unsupported {
        op: op.to_string(),
        what: what.into(),
    }
}

/// Normalises a possibly negative `axis` into `0..rank`.
pub(crate) fn norm_axis(op: &str, axis: i64, rank: usize) -> Result<usize, OpError> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        return Err(invalid(
            op,
            format!("axis {axis} is out of range for rank {rank}"),
        ));
    }
    Ok(a as usize)
}

/// Normalises a list of axes, rejecting duplicates.
pub(crate) fn norm_axes(op: &str, axes: &[i64], rank: usize) -> Result<Vec<usize>, OpError> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = norm_axis(op, a, rank)?;
        if out.contains(&n) {
            return Err(invalid(op, format!("axis {a} is repeated in {axes:?}")));
        }
        out.push(n);
    }
    Ok(out)
}

/// A tensor type from a dtype and dims.
pub(crate) fn tensor(dtype: DType, dims: Vec<Dim>) -> TensorType {
    TensorType {
        dtype,
        shape: Shape(dims),
    }
}

/// Shape-inference view of one node's inputs, with the op name for errors.
pub(crate) struct InferCtx<'a, 'b> {
    pub op: &'b str,
    pub inputs: &'b [Option<InferInput<'a>>],
}

impl<'a> InferCtx<'a, '_> {
    /// Checks the positional input count (trailing absent inputs count too).
    pub fn arity(&self, min: usize, max: usize) -> Result<(), OpError> {
        let n = self.inputs.len();
        if n < min || n > max {
            let expected = if min == max {
                min.to_string()
            } else if max == usize::MAX {
                format!("at least {min}")
            } else {
                format!("{min} to {max}")
            };
            return Err(OpError::Arity {
                op: self.op.to_string(),
                expected,
                got: n,
            });
        }
        Ok(())
    }

    /// A required input.
    pub fn input(&self, i: usize) -> Result<InferInput<'a>, OpError> {
        self.opt(i)
            .ok_or_else(|| invalid(self.op, format!("required input {i} is missing")))
    }

    /// A required input's type.
    pub fn ty(&self, i: usize) -> Result<&'a TensorType, OpError> {
        Ok(self.input(i)?.ty)
    }

    /// An optional input (absent when out of range or empty).
    pub fn opt(&self, i: usize) -> Option<InferInput<'a>> {
        self.inputs.get(i).copied().flatten()
    }

    /// The integer values of constant input `i` (`NotConstant` without a value).
    pub fn ints(&self, i: usize) -> Result<Vec<i64>, OpError> {
        let input = self.input(i)?;
        let value = input.value.ok_or_else(|| OpError::NotConstant {
            op: self.op.to_string(),
            input: i,
        })?;
        int_values(self.op, value, i)
    }

    /// Like [`InferCtx::ints`] for an optional input: `None` when absent.
    pub fn opt_ints(&self, i: usize) -> Result<Option<Vec<i64>>, OpError> {
        match self.opt(i) {
            None => Ok(None),
            Some(_) => self.ints(i).map(Some),
        }
    }

    /// Requires input `i` to be of a floating-point type.
    pub fn float(&self, i: usize) -> Result<&'a TensorType, OpError> {
        let t = self.ty(i)?;
        if !t.dtype.is_float() {
            return Err(invalid(
                self.op,
                format!("input {i} must be floating point, got {}", t.dtype),
            ));
        }
        Ok(t)
    }

    /// Requires input `i` to be of an integer type.
    pub fn int(&self, i: usize) -> Result<&'a TensorType, OpError> {
        let t = self.ty(i)?;
        if !t.dtype.is_int() {
            return Err(invalid(
                self.op,
                format!("input {i} must be an integer tensor, got {}", t.dtype),
            ));
        }
        Ok(t)
    }

    /// Requires inputs `i` and `j` to share a dtype.
    pub fn same_dtype(&self, i: usize, j: usize) -> Result<(), OpError> {
        let (a, b) = (self.ty(i)?.dtype, self.ty(j)?.dtype);
        if a != b {
            return Err(invalid(
                self.op,
                format!("inputs {i} and {j} differ in type ({a} vs {b})"),
            ));
        }
        Ok(())
    }

    /// Requires input `i` to have `rank` dims.
    pub fn rank(&self, i: usize, rank: usize) -> Result<&'a [Dim], OpError> {
        let t = self.ty(i)?;
        if t.shape.rank() != rank {
            return Err(invalid(
                self.op,
                format!("input {i} must have rank {rank}, got shape {}", t.shape),
            ));
        }
        Ok(&t.shape.0)
    }
}

/// The integer elements of a value used as shape/axes data.
pub(crate) fn int_values(op: &str, value: &Value, input: usize) -> Result<Vec<i64>, OpError> {
    value.as_i64().map(<[i64]>::to_vec).ok_or_else(|| {
        invalid(
            op,
            format!("input {input} must be an integer tensor, got {}", value.dtype),
        )
    })
}

/// Reads a one-element integer input (e.g. TopK's `k`, CumSum's `axis`).
pub(crate) fn scalar_int(op: &str, values: &[i64], input: usize) -> Result<i64, OpError> {
    match values {
        [v] => Ok(*v),
        _ => Err(invalid(
            op,
            format!("input {input} must hold exactly one value, got {}", values.len()),
        )),
    }
}

/// Evaluation view of a node's input values and the output types that shape
/// inference gave for them (always fixed-shape).
pub(crate) struct EvalCtx<'a> {
    pub op: &'a str,
    pub inputs: &'a [Option<&'a Value>],
    pub out: &'a [TensorType],
}

impl<'a> EvalCtx<'a> {
    /// A required input value (presence was checked by inference).
    pub fn input(&self, i: usize) -> Result<&'a Value, OpError> {
        self.opt(i)
            .ok_or_else(|| invalid(self.op, format!("required input {i} is missing")))
    }

    /// An optional input value.
    pub fn opt(&self, i: usize) -> Option<&'a Value> {
        self.inputs.get(i).copied().flatten()
    }

    /// The concrete shape of output `i`.
    pub fn out_shape(&self, i: usize) -> Result<Vec<usize>, OpError> {
        let t = self
            .out
            .get(i)
            .ok_or_else(|| invalid(self.op, format!("no output {i}")))?;
        t.shape
            .as_fixed()
            .ok_or_else(|| invalid(self.op, format!("output {i} has symbolic shape {}", t.shape)))
    }

    /// The dtype of output `i`.
    pub fn out_dtype(&self, i: usize) -> DType {
        self.out.get(i).map_or(DType::F32, |t| t.dtype)
    }

    /// The float slice of input `i` as `T` (its storage class must match).
    pub fn floats<T: Real>(&self, i: usize) -> Result<&'a [T], OpError> {
        let v = self.input(i)?;
        T::slice(v).ok_or_else(|| {
            invalid(
                self.op,
                format!("input {i} ({}) is not stored as {}", v.dtype, T::NAME),
            )
        })
    }
}

/// Builds a value, rounding `F32` storage to `f16`/`bf16` when `dtype` says so.
pub(crate) fn finish(dtype: DType, shape: Vec<usize>, data: Data) -> Value {
    let data = match data {
        Data::F32(mut v) if dtype.is_float() && dtype != DType::F32 => {
            for x in &mut v {
                *x = round_float(dtype, *x);
            }
            Data::F32(v)
        }
        Data::I64(mut v) if dtype.is_int() => {
            for x in &mut v {
                *x = crate::wrap_int(dtype, *x);
            }
            Data::I64(v)
        }
        other => other,
    };
    Value { dtype, shape, data }
}

/// The float types kernels are generic over (`f32` storage also carries
/// `f16`/`bf16`). Adds what `num_traits::Float` lacks.
pub(crate) trait Real:
    num_traits::Float + std::iter::Sum + std::ops::AddAssign + std::ops::MulAssign + Default + 'static
{
    /// Type name for messages.
    const NAME: &'static str;
    /// Conversion from an `f64` literal or attribute.
    fn lit(v: f64) -> Self;
    /// The error function.
    fn erf(self) -> Self;
    /// The value's data if stored in this class.
    fn slice(v: &Value) -> Option<&[Self]>;
    /// `C ← αAB + βC` through `matrixmultiply`.
    ///
    /// # Safety
    /// The strides must keep every accessed element inside the pointed-to
    /// buffers; [`gemm`] checks this before calling.
    #[allow(clippy::too_many_arguments)]
    unsafe fn raw_gemm(
        m: usize,
        k: usize,
        n: usize,
        alpha: Self,
        a: *const Self,
        rsa: isize,
        csa: isize,
        b: *const Self,
        rsb: isize,
        csb: isize,
        beta: Self,
        c: *mut Self,
        rsc: isize,
        csc: isize,
    );
}

macro_rules! impl_real {
    ($t:ty, $name:literal, $variant:ident, $erf:path, $gemm:path) => {
        impl Real for $t {
            const NAME: &'static str = $name;
            fn lit(v: f64) -> Self {
                v as $t
            }
            fn erf(self) -> Self {
                $erf(self)
            }
            fn slice(v: &Value) -> Option<&[Self]> {
                match &v.data {
                    Data::$variant(d) => Some(d),
                    _ => None,
                }
            }
            unsafe fn raw_gemm(
                m: usize,
                k: usize,
                n: usize,
                alpha: Self,
                a: *const Self,
                rsa: isize,
                csa: isize,
                b: *const Self,
                rsb: isize,
                csb: isize,
                beta: Self,
                c: *mut Self,
                rsc: isize,
                csc: isize,
            ) {
                // SAFETY: forwarded contract; see the trait method.
                unsafe { $gemm(m, k, n, alpha, a, rsa, csa, b, rsb, csb, beta, c, rsc, csc) }
            }
        }
    };
}

impl_real!(f32, "f32", F32, libm::erff, matrixmultiply::sgemm);
impl_real!(f64, "f64", F64, libm::erf, matrixmultiply::dgemm);

/// A strided matrix view: element `(i, j)` is `data[off + i·rs + j·cs]`.
#[derive(Clone, Copy)]
pub(crate) struct Mat<'a, T> {
    pub data: &'a [T],
    pub off: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a, T> Mat<'a, T> {
    /// A matrix stored row-major with row length `ld` from `off`; when
    /// `transposed`, the view is the transpose of the stored matrix.
    pub fn row_major(data: &'a [T], off: usize, ld: usize, transposed: bool) -> Self {
        if transposed {
            Mat {
                data,
                off,
                rs: 1,
                cs: ld,
            }
        } else {
            Mat {
                data,
                off,
                rs: ld,
                cs: 1,
            }
        }
    }

    /// True when a `rows × cols` view stays inside the buffer.
    fn fits(&self, rows: usize, cols: usize) -> bool {
        rows == 0 || cols == 0 || self.off + (rows - 1) * self.rs + (cols - 1) * self.cs < self.data.len()
    }
}

/// `C[m, n] (row-major at c_off) ← α·A[m, k]·B[k, n] + β·C`, via `matrixmultiply`.
/// Returns an error instead of touching memory out of bounds.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<T: Real>(
    op: &str,
    m: usize,
    k: usize,
    n: usize,
    alpha: T,
    a: Mat<T>,
    b: Mat<T>,
    beta: T,
    c: &mut [T],
    c_off: usize,
) -> Result<(), OpError> {
    if m == 0 || n == 0 {
        return Ok(());
    }
    if !a.fits(m, k) || !b.fits(k, n) || c_off + m * n > c.len() {
        return Err(invalid(op, "internal error: matrix view out of bounds"));
    }
    let cm = &mut c[c_off..c_off + m * n];
    if k == 0 {
        for x in cm.iter_mut() {
            *x = if beta == T::zero() { T::zero() } else { *x * beta };
        }
        return Ok(());
    }
    // SAFETY: `fits` checked that every element (i, l) of A, (l, j) of B and
    // (i, j) of C lies within its slice; C is a distinct `&mut` borrow.
    unsafe {
        T::raw_gemm(
            m,
            k,
            n,
            alpha,
            a.data.as_ptr().add(a.off),
            a.rs as isize,
            a.cs as isize,
            b.data.as_ptr().add(b.off),
            b.rs as isize,
            b.cs as isize,
            beta,
            cm.as_mut_ptr(),
            n as isize,
            1,
        );
    }
    Ok(())
}

/// Dispatches on a value's float storage class: binds `$T` to `f32` or `f64`
/// and wraps the `Vec<$T>` that `$body` yields as `Data`.
macro_rules! float_kernel {
    ($op:expr, $x:expr, $T:ident => $body:expr) => {
        match &$x.data {
            $crate::Data::F32(_) => {
                type $T = f32;
                $crate::Data::F32($body)
            }
            $crate::Data::F64(_) => {
                type $T = f64;
                $crate::Data::F64($body)
            }
            _ => {
                return Err($crate::op::kernel_util::invalid(
                    $op,
                    format!("expects a floating-point input, got {}", $x.dtype),
                ))
            }
        }
    };
}
pub(crate) use float_kernel;

/// Applies `$body` to whichever storage vector `$data` holds, keeping the class.
macro_rules! map_data {
    ($data:expr, $v:ident => $body:expr) => {
        match $data {
            $crate::Data::F32($v) => $crate::Data::F32($body),
            $crate::Data::F64($v) => $crate::Data::F64($body),
            $crate::Data::I64($v) => $crate::Data::I64($body),
            $crate::Data::Bool($v) => $crate::Data::Bool($body),
            $crate::Data::Str($v) => $crate::Data::Str($body),
        }
    };
}
pub(crate) use map_data;

/// Applies `$body` to the storage vectors of two values of the same class.
macro_rules! zip_data {
    ($op:expr, $x:expr, $y:expr, ($a:ident, $b:ident) => $body:expr) => {
        match (&$x.data, &$y.data) {
            ($crate::Data::F32($a), $crate::Data::F32($b)) => $crate::Data::F32($body),
            ($crate::Data::F64($a), $crate::Data::F64($b)) => $crate::Data::F64($body),
            ($crate::Data::I64($a), $crate::Data::I64($b)) => $crate::Data::I64($body),
            ($crate::Data::Bool($a), $crate::Data::Bool($b)) => $crate::Data::Bool($body),
            _ => {
                return Err($crate::op::kernel_util::invalid(
                    $op,
                    format!("inputs differ in type ({} vs {})", $x.dtype, $y.dtype),
                ))
            }
        }
    };
}
pub(crate) use zip_data;

/// Picks elements by flat index (indices come from validated shapes).
pub(crate) fn take<T: Clone>(data: &[T], idx: &[usize]) -> Vec<T> {
    idx.iter().map(|&i| data[i].clone()).collect()
}

/// Row-major strides of `shape`.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Product of `dims[range]` (1 for empty).
pub(crate) fn prod(dims: &[usize]) -> usize {
    dims.iter().product()
}

/// Row geometry along one axis: `outer · inner` rows of `n` elements, each
/// starting at one of [`Rows::starts`] with elements `inner` apart.
pub(crate) struct Rows {
    pub outer: usize,
    pub n: usize,
    pub inner: usize,
}

impl Rows {
    /// The rows of `shape` along `axis` (which must be in range).
    pub fn along(shape: &[usize], axis: usize) -> Rows {
        Rows {
            outer: prod(&shape[..axis]),
            n: shape[axis],
            inner: prod(&shape[axis + 1..]),
        }
    }

    /// Flat index of every row's first element, in row-major order of the
    /// remaining dims.
    pub fn starts(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.outer).flat_map(move |o| (0..self.inner).map(move |i| o * self.n * self.inner + i))
    }

    /// Flat index of element `j` of the row whose rank among [`Rows::starts`]
    /// is `r`, in a tensor whose axis has length `len` instead of `n`.
    pub fn at(&self, r: usize, j: usize, len: usize) -> usize {
        let (o, i) = (r / self.inner.max(1), r % self.inner.max(1));
        (o * len + j) * self.inner + i
    }
}

/// Product of dims that may be symbolic: fixed when all are fixed, the
/// symbol itself when it is the only one and the rest multiply to one,
/// `None` when the product cannot be written as a `Dim`.
pub(crate) fn dim_product(dims: &[Dim]) -> Option<Dim> {
    let mut fixed = 1usize;
    let mut sym = None;
    for d in dims {
        match d {
            Dim::Fixed(n) => fixed = fixed.saturating_mul(*n),
            Dim::Sym(_) if sym.is_some() => return if fixed == 0 { Some(Dim::Fixed(0)) } else { None },
            Dim::Sym(_) => sym = Some(d.clone()),
        }
    }
    match sym {
        None => Some(Dim::Fixed(fixed)),
        Some(_) if fixed == 0 => Some(Dim::Fixed(0)),
        Some(s) if fixed == 1 => Some(s),
        Some(_) => None,
    }
}

/// Element count for costing; shapes must be concrete (callers bind symbols
/// first), a symbolic dim counts as 0.
pub(crate) fn numel(t: &TensorType) -> f64 {
    t.shape.0.iter().map(|d| d.fixed().unwrap_or(0) as f64).product()
}

/// Dim `i` of a type for costing (0 when symbolic or missing).
pub(crate) fn dim(t: &TensorType, i: usize) -> f64 {
    t.shape.0.get(i).and_then(Dim::fixed).unwrap_or(0) as f64
}

/// Bytes of a tensor at concrete shape.
pub(crate) fn bytes(t: &TensorType) -> f64 {
    numel(t) * t.dtype.size_bits() as f64 / 8.0
}

/// The i64 range of an integer dtype (u64 as its i64 bit pattern: min 0, max -1).
pub(crate) fn int_limits(dtype: DType) -> (i64, i64) {
    match dtype {
        DType::I8 => (i8::MIN as i64, i8::MAX as i64),
        DType::U8 => (0, u8::MAX as i64),
        DType::I16 => (i16::MIN as i64, i16::MAX as i64),
        DType::U16 => (0, u16::MAX as i64),
        DType::I32 => (i32::MIN as i64, i32::MAX as i64),
        DType::U32 => (0, u32::MAX as i64),
        DType::U64 => (0, -1),
        DType::I4 => (-8, 7),
        DType::U4 => (0, 15),
        DType::I2 => (-2, 1),
        DType::U2 => (0, 3),
        _ => (i64::MIN, i64::MAX),
    }
}

/// Orders two integers of `dtype` (unsigned 64-bit compares as `u64`).
pub(crate) fn int_cmp(dtype: DType, a: i64, b: i64) -> std::cmp::Ordering {
    if dtype == DType::U64 {
        (a as u64).cmp(&(b as u64))
    } else {
        a.cmp(&b)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::assert_op_err;
    use super::*;

    #[test]
    fn axes_normalise_and_reject_out_of_range() {
        assert_eq!(norm_axis("X", -1, 3), Ok(2));
        assert_op_err(norm_axis("X", 3, 3), "X", "axis 3 is out of range for rank 3");
        assert_op_err(norm_axes("X", &[0, -3], 3), "X", "axis -3 is repeated in [0, -3]");
    }

    #[test]
    fn symbolic_products() {
        let b = Dim::Sym("b".into());
        assert_eq!(dim_product(&[b.clone(), Dim::Fixed(1)]), Some(b.clone()));
        assert_eq!(dim_product(&[Dim::Fixed(2), Dim::Fixed(3)]), Some(Dim::Fixed(6)));
        assert_eq!(dim_product(&[b.clone(), Dim::Fixed(2)]), None);
        assert_eq!(dim_product(&[b, Dim::Fixed(0)]), Some(Dim::Fixed(0)));
    }

    #[test]
    fn gemm_with_transposed_views() {
        // A = [[1,2],[3,4]], Bᵀ stored as [[5,7],[6,8]] → B = [[5,6],[7,8]].
        let a = [1.0f32, 2.0, 3.0, 4.0];
        let bt = [5.0f32, 7.0, 6.0, 8.0];
        let mut c = vec![0.0f32; 4];
        let am = Mat::row_major(&a[..], 0, 2, false);
        let bm = Mat::row_major(&bt[..], 0, 2, true);
        gemm("G", 2, 2, 2, 1.0, am, bm, 0.0, &mut c, 0).unwrap();
        assert_eq!(c, vec![19.0, 22.0, 43.0, 50.0]);
        let short = Mat::row_major(&a[..3], 0, 2, false);
        assert_op_err(
            gemm("G", 2, 2, 2, 1.0, short, bm, 0.0, &mut c, 0),
            "G",
            "internal error: matrix view out of bounds",
        );
    }
}
