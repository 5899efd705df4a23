//! The numbers kernels compute with: the [`Real`] float trait they are
//! generic over, the macros that dispatch on a value's storage class
//! (`float_kernel!`, `map_data!`, `zip_data!`), and the integer semantics
//! of the narrow and unsigned dtypes.

use crate::{DType, Data, Value};

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
                return Err($crate::op::context::invalid(
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
                return Err($crate::op::context::invalid(
                    $op,
                    format!("inputs differ in type ({} vs {})", $x.dtype, $y.dtype),
                ))
            }
        }
    };
}
pub(crate) use zip_data;

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
