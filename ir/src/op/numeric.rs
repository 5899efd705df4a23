//! The numbers kernels compute with: the [`Real`] float trait they are
//! generic over, the macros that dispatch on a value's storage class
//! (`float_kernel!`, `map_data!`, `zip_data!`), and the integer semantics
//! of the narrow and unsigned dtypes.

use super::threads::rows_in_runs;
use crate::{DType, Data, Value};

/// The float types kernels are generic over (`f32` storage also carries
/// `f16`/`bf16`). Adds what `num_traits::Float` lacks.
pub(crate) trait Real:
    num_traits::Float
    + std::iter::Sum
    + std::ops::AddAssign
    + std::ops::MulAssign
    + Default
    + Send
    + Sync
    + 'static
{
    /// Type name for messages.
    const NAME: &'static str;
    /// Conversion from an `f64` literal or attribute.
    fn lit(v: f64) -> Self;
    /// The error function.
    fn erf(self) -> Self;
    /// `eˣ` as loops can vectorize it: for `f32` a branch-free polynomial
    /// ([`exp_f32`], within 1 ulp), for `f64` libm's, which the f64 oracle
    /// keeps.
    fn exp_v(self) -> Self;
    /// The value's data if stored in this class.
    fn slice(v: &Value) -> Option<&[Self]>;
    /// `C ← αAB + βC` through the `gemm` crate ([`crate_gemm`]).
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
    ($t:ty, $name:literal, $variant:ident, $erf:path, $exp:path, $gemm:path) => {
        impl Real for $t {
            const NAME: &'static str = $name;
            fn lit(v: f64) -> Self {
                v as $t
            }
            fn erf(self) -> Self {
                $erf(self)
            }
            #[inline(always)]
            fn exp_v(self) -> Self {
                $exp(self)
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

impl_real!(f32, "f32", F32, libm::erff, exp_f32, crate_gemm::<f32>);
impl_real!(f64, "f64", F64, libm::erf, f64::exp, crate_gemm::<f64>);

/// `C ← αAB + βC` (strides in elements, `C` not read when `β = 0`) by the
/// `gemm` crate on the calling thread: the rank's threads split products
/// themselves ([`super::threads::split_ways`]).
///
/// # Safety
/// As [`Real::raw_gemm`].
#[allow(clippy::too_many_arguments)]
unsafe fn crate_gemm<T: 'static + Copy + num_traits::Zero>(
    m: usize,
    k: usize,
    n: usize,
    alpha: T,
    a: *const T,
    rsa: isize,
    csa: isize,
    b: *const T,
    rsb: isize,
    csb: isize,
    beta: T,
    c: *mut T,
    rsc: isize,
    csc: isize,
) {
    // The crate's `dst ← α·dst + β·lhs·rhs` names the scales the other way
    // round, and takes column strides first.
    let read_dst = !beta.is_zero();
    // SAFETY: forwarded contract; see `Real::raw_gemm`.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            csc,
            rsc,
            read_dst,
            a,
            csa,
            rsa,
            b,
            csb,
            rsb,
            beta,
            alpha,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// `eˣ` in `f32` without a call or a branch, so a loop over a slice
/// vectorizes (libm's `expf` is a call per element, the largest cost of a
/// small model's softmax and GELU passes): `x = n·ln 2 + r` with `|r| ≤
/// ln 2 / 2` (ln 2 split in two so `r` is exact), `eʳ` by Cephes' degree-6
/// minimax polynomial, and `2ⁿ` built from exponent bits in two halves so
/// results down to the subnormals stay right. Within 1 ulp of the true
/// value; `inf`, `-inf` and NaN map as `expf` maps them.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    // Adding 1.5·2²³ rounds to an integer, kept in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let c = x.clamp(-104.0, 89.0);
    let t = c * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    let r = c - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let p = (((((1.987_569_1e-4 * r + 1.398_199_9e-3) * r + 8.333_452e-3) * r + 4.166_579_6e-2) * r
        + 1.666_666_5e-1)
        * r
        + 0.5)
        * (r * r)
        + r
        + 1.0;
    let n = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let half = n >> 1;
    let low = f32::from_bits(((half + 127) << 23) as u32);
    let high = f32::from_bits(((n - half + 127) << 23) as u32);
    let y = p * low * high;
    if x.is_nan() {
        x
    } else {
        y
    }
}

/// Runs `f` in code built for AVX2 and FMA where the CPU has them: the
/// baseline x86-64 build has SSE2 only, and element-wise loops inlined
/// into `f` (activations, their adjoints, softmax rows) then run 8 lanes
/// wide. Rust never fuses a multiply and an add on its own, so both builds
/// give the same bits.
#[inline(always)]
pub(crate) fn vectorized<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has the features the function is compiled for.
        return unsafe { run_avx2(f) };
    }
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn run_avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// `f` over `xs` ([`vectorized`]), in `ways` runs over the rank's
/// threads ([`rows_in_runs`]): each element is computed as on one thread.
#[inline(always)]
pub(crate) fn map_v<T: Copy + Default + Send + Sync, F: Fn(T) -> T + Sync>(
    xs: &[T],
    ways: usize,
    f: F,
) -> Vec<T> {
    if ways <= 1 {
        return vectorized(|| map_in_place(xs, f));
    }
    rows_in_runs(xs.len(), 1, ways, |rows, out| {
        vectorized(|| {
            for (o, &x) in out.iter_mut().zip(&xs[rows]) {
                *o = f(x);
            }
        })
    })
}

/// The loop of [`map_v`], over a copy written in place: a plain loop
/// inlines into the code built for AVX2, where `collect` would run in code
/// built for the baseline.
#[inline(always)]
fn map_in_place<T: Copy, F: Fn(T) -> T>(xs: &[T], f: F) -> Vec<T> {
    let mut out = xs.to_vec();
    in_place(&mut out, &f);
    out
}

#[inline(always)]
fn in_place<T: Copy, F: Fn(T) -> T>(out: &mut [T], f: &F) {
    for o in out.iter_mut() {
        *o = f(*o);
    }
}

/// `f` over `xs` and `ys`, of one length, element by element
/// ([`vectorized`]), in `ways` runs as [`map_v`].
#[inline(always)]
pub(crate) fn zip_map_v<T: Copy + Default + Send + Sync, F: Fn(T, T) -> T + Sync>(
    xs: &[T],
    ys: &[T],
    ways: usize,
    f: F,
) -> Vec<T> {
    if ways <= 1 {
        let mut out = xs.to_vec();
        vectorized(|| zip_in_place(&mut out, ys, &f));
        return out;
    }
    rows_in_runs(xs.len(), 1, ways, |rows, out| {
        vectorized(|| {
            for ((o, &x), &y) in out.iter_mut().zip(&xs[rows.clone()]).zip(&ys[rows]) {
                *o = f(x, y);
            }
        })
    })
}

/// The loop of [`zip_map_v`], as [`map_in_place`]'s.
#[inline(always)]
fn zip_in_place<T: Copy, F: Fn(T, T) -> T>(out: &mut [T], ys: &[T], f: &F) {
    for (o, &y) in out.iter_mut().zip(ys) {
        *o = f(*o, y);
    }
}

/// Lanes of [`lane_sum`] and [`lane_max`].
const LANES: usize = 8;

/// `Σ xs` as eight interleaved partial sums (element `i` into partial
/// `i mod 8`, the partials then added pairwise in a fixed tree), so the
/// adds need not wait on each other and vectorize. One order for a row
/// however it is stored or split, unlike a sum left to right, whose adds
/// each wait for the last (a softmax row of 8,192 took 8,192 of them).
#[inline(always)]
pub(crate) fn lane_sum<T: Real>(xs: impl IntoIterator<Item = T>) -> T {
    let mut lanes = [T::zero(); LANES];
    for (i, x) in xs.into_iter().enumerate() {
        lanes[i % LANES] += x;
    }
    fold_lanes(lanes, |a, b| a + b)
}

/// [`lane_sum`] of a contiguous row, in whole chunks of lanes.
#[inline(always)]
pub(crate) fn lane_sum_slice<T: Real>(xs: &[T]) -> T {
    lane_sum_by(xs, |x| x)
}

/// [`lane_sum`] of `f` over a contiguous row, in whole chunks of lanes.
#[inline(always)]
pub(crate) fn lane_sum_by<T: Real>(xs: &[T], f: impl Fn(T) -> T) -> T {
    fold_lanes(lanes_of(xs, T::zero(), |l, x| l + f(x)), |a, b| a + b)
}

/// `step` folding element `i` of a contiguous row into lane `i mod 8`,
/// in whole chunks of lanes, each lane starting at `init`.
#[inline(always)]
fn lanes_of<T: Copy>(xs: &[T], init: T, step: impl Fn(T, T) -> T) -> [T; LANES] {
    let mut lanes = [init; LANES];
    let chunks = xs.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l = step(*l, x);
        }
    }
    for (l, &x) in lanes.iter_mut().zip(rest) {
        *l = step(*l, x);
    }
    lanes
}

/// [`lane_sum`] of `a[i]·b[i]` over two contiguous rows of one length.
#[inline(always)]
pub(crate) fn lane_dot<T: Real>(a: &[T], b: &[T]) -> T {
    let mut lanes = [T::zero(); LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for ((l, &x), &y) in lanes.iter_mut().zip(x).zip(y) {
            *l += x * y;
        }
    }
    for ((l, &x), &y) in lanes.iter_mut().zip(ra).zip(rb) {
        *l += x * y;
    }
    fold_lanes(lanes, |a, b| a + b)
}

/// The largest of `xs` that compares greater than −∞ (NaNs are skipped,
/// as a fold keeping `v` where `v > m` skips them), in eight lanes as
/// [`lane_sum_slice`].
#[inline(always)]
pub(crate) fn lane_max_slice<T: Real>(xs: &[T]) -> T {
    let pick = |m: T, v: T| if v > m { v } else { m };
    fold_lanes(lanes_of(xs, T::neg_infinity(), pick), pick)
}

/// [`lane_max_slice`] over any order of elements.
#[inline(always)]
pub(crate) fn lane_max<T: Real>(xs: impl IntoIterator<Item = T>) -> T {
    let pick = |m: T, v: T| if v > m { v } else { m };
    let mut lanes = [T::neg_infinity(); LANES];
    for (i, x) in xs.into_iter().enumerate() {
        lanes[i % LANES] = pick(lanes[i % LANES], x);
    }
    fold_lanes(lanes, pick)
}

/// The lanes combined pairwise: `((0·1)·(2·3))·((4·5)·(6·7))`.
#[inline(always)]
fn fold_lanes<T: Copy>(l: [T; LANES], f: impl Fn(T, T) -> T) -> T {
    f(f(f(l[0], l[1]), f(l[2], l[3])), f(f(l[4], l[5]), f(l[6], l[7])))
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

#[cfg(test)]
mod tests {
    use super::{
        exp_f32, lane_dot, lane_max, lane_max_slice, lane_sum, lane_sum_by, lane_sum_slice, map_v, zip_map_v,
    };

    /// Within 1 ulp of `e^x` rounded to f32, for every 97th f32 from the
    /// smallest normal result to overflow, and as `expf` at the ends.
    #[test]
    fn exp_f32_is_within_one_ulp() {
        let (lo, hi) = (-87.3f32, 88.7f32);
        let mut worst = 0;
        for bits in (0..u32::MAX).step_by(97) {
            let x = f32::from_bits(bits);
            if !(x >= lo && x <= hi) {
                continue;
            }
            let want = (x as f64).exp() as f32;
            let ulps = (want.to_bits() as i64 - exp_f32(x).to_bits() as i64).abs();
            worst = worst.max(ulps);
        }
        assert!(worst <= 1, "{worst} ulp");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(89.0), f32::INFINITY);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-104.0), 0.0);
        assert!(exp_f32(f32::NAN).is_nan());
        // Subnormal results are the nearest subnormal, within one.
        for x in [-88.0f32, -95.5, -100.0, -103.0] {
            let want = (x as f64).exp() as f32;
            assert!(
                (want.to_bits() as i64 - exp_f32(x).to_bits() as i64).abs() <= 1,
                "{x}"
            );
        }
    }

    /// A contiguous row's lane sums and maxima equal the same lanes taken
    /// in any order of iteration (the strided rows' path), and are close to
    /// the plain sum.
    #[test]
    fn lane_sums_are_one_order_however_a_row_is_read() {
        for n in [0usize, 1, 7, 8, 9, 100, 8192] {
            let xs: Vec<f32> = (0..n).map(|i| ((i * 7919) % 2003) as f32 / 331.0 - 3.0).collect();
            assert_eq!(
                lane_sum_slice(&xs).to_bits(),
                lane_sum(xs.iter().copied()).to_bits(),
                "{n}"
            );
            let squares = lane_sum(xs.iter().map(|&x| x * x));
            assert_eq!(lane_sum_by(&xs, |x| x * x).to_bits(), squares.to_bits(), "{n}");
            assert_eq!(lane_dot(&xs, &xs).to_bits(), squares.to_bits(), "{n}");
            assert_eq!(
                lane_max_slice(&xs).to_bits(),
                lane_max(xs.iter().copied()).to_bits(),
                "{n}"
            );
            let plain: f64 = xs.iter().map(|&x| x as f64).sum();
            assert!(
                (lane_sum_slice(&xs) as f64 - plain).abs() <= 1e-3 * (1.0 + plain.abs()),
                "{n}"
            );
            let top = xs.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(lane_max_slice(&xs), top, "{n}");
        }
        assert_eq!(lane_max_slice(&[1.0f32, f32::NAN, 3.0]), 3.0, "NaNs are skipped");
    }

    /// The loops built for AVX2 give the bits the plain loops give, on
    /// one thread and in runs over three.
    #[test]
    fn vectorized_maps_give_the_plain_bits() {
        let xs: Vec<f32> = (0..1003)
            .map(|i| ((i * 7919) % 2001) as f32 / 97.0 - 10.0)
            .collect();
        let ys: Vec<f32> = xs.iter().map(|x| x * 0.37 + 1.0).collect();
        let f = |x: f32| x * exp_f32(-x * x) + 0.5 * x;
        let g = |x: f32, y: f32| y / (1.0 + exp_f32(-x)) - x * y;
        let plain: Vec<f32> = xs.iter().map(|&x| f(x)).collect();
        let plain2: Vec<f32> = xs.iter().zip(&ys).map(|(&x, &y)| g(x, y)).collect();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for ways in [1, 3] {
            assert_eq!(bits(&map_v(&xs, ways, f)), bits(&plain));
            assert_eq!(bits(&zip_map_v(&xs, &ys, ways, g)), bits(&plain2));
        }
    }
}
