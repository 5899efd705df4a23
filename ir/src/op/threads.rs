//! How a rank's kernels split over its share of the host's cores: the
//! threads a rank's thread may use, and the one rule per kind of kernel
//! for how many ways it runs — a product's rows ([`split_ways`]),
//! attention's head groups ([`attention_ways`]) and the row-wise kernels'
//! rows ([`row_ways`], [`row_split`]). The kernels run these rules and the
//! simulator prices them. Every rule splits work whose elements are each
//! computed as on one thread, so the bits never depend on the thread count.

use super::geometry::prod;
use super::{Op, OpError, UnaryOp};
use std::cell::{Cell, RefCell};
use std::sync::Arc;

thread_local! {
    /// Threads this thread's kernels may use: a rank's share of the host.
    static KERNEL_THREADS: Cell<usize> = const { Cell::new(1) };
    /// The pool of this thread's kernel threads other than itself.
    static KERNEL_POOL: RefCell<Option<Arc<rayon::ThreadPool>>> = const { RefCell::new(None) };
}

/// Lets the kernels evaluated on this thread split their work over
/// `threads` threads (at least 1): this one and a pool of `threads − 1`
/// of its own. The CPU backend sets it on each rank's thread. A rank's
/// threads are never more than its cores, so the pool's idle threads,
/// which spin a while before they sleep, take no core from the rank's.
pub fn set_kernel_threads(threads: usize) {
    let threads = threads.max(1);
    KERNEL_THREADS.with(|t| t.set(threads));
    let pool = (threads > 1)
        .then(|| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads - 1)
                .thread_name(|i| format!("autopar-kernel-{i}"))
                .build()
                .ok()
        })
        .flatten()
        .map(Arc::new);
    KERNEL_POOL.with(|p| *p.borrow_mut() = pool);
}

/// Runs `jobs` on this thread's kernel threads: the first here, the rest
/// on its pool ([`set_kernel_threads`]; rayon's global pool where none
/// was set), returning when all are done.
pub fn on_kernel_threads<'s, F: FnOnce() + Send + 's>(jobs: Vec<F>) {
    let mut jobs = jobs.into_iter();
    let Some(first) = jobs.next() else {
        return;
    };
    let run = |s: &rayon::Scope<'s>| {
        for job in jobs {
            s.spawn(move |_| job());
        }
        first();
    };
    match KERNEL_POOL.with(|p| p.borrow().clone()) {
        Some(pool) => pool.in_place_scope(run),
        None => rayon::in_place_scope(run),
    }
}

/// The threads this thread's kernels may use.
pub fn kernel_threads() -> usize {
    KERNEL_THREADS.with(Cell::get)
}

/// Whether `op`'s kernel splits its product over this thread's
/// [`kernel_threads`] ([`split_ways`]): the plain products, whose kernels
/// call `gemm_threaded`. Attention splits by heads instead
/// ([`attention_ways`]); convolutions and experts run their products on
/// the rank's own thread. The simulator prices by these.
pub fn splits_over_threads(op: &Op) -> bool {
    matches!(op, Op::MatMul | Op::Linear | Op::Gemm { .. })
}

/// Multiply-adds a thread must be handed before a product is split for it:
/// about 50 µs of one core's work, well above waking a pool thread.
pub const MIN_MACS_PER_WAY: usize = 1 << 21;
/// Rows of `C` a thread must be handed.
const MIN_ROWS_PER_WAY: usize = 48;
/// The `gemm` crate runs a product of at most this many rows and columns
/// (and one of at most 256 elements, or of one row) on paths of its own,
/// which block or order the sum over `k` otherwise than its general
/// kernel; a wider product's rows all take the general kernel, whose `k`
/// blocks depend on `k` and the caches alone.
const MAX_SMALL_COLUMNS: usize = 64;

/// Whether a product of `n` columns computes each row of `C` to the same
/// bits however its rows are grouped into calls: split over threads
/// ([`split_ways`]) or a batch's matrices joined into one
/// ([`super::matmul_rows`]). Narrower products run as they come.
pub(crate) fn rows_group_alike(n: usize) -> bool {
    n > MAX_SMALL_COLUMNS
}

/// Ways hold whole multiples of this many rows, so none ends on a sliver.
const ROW_TILE: usize = 16;

/// How many ways a product `[m, k] · [k, n]` runs over `threads` threads:
/// as many as have [`MIN_MACS_PER_WAY`] and 48 rows each, at most
/// `threads`, each way whole multiples of [`ROW_TILE`] rows, and none for
/// a product narrower than [`rows_group_alike`] allows. Every way computes
/// its rows of `C` exactly as the whole product would (the same `k` order
/// per element), so the result is the same bits however many ways it runs.
pub fn split_ways(m: usize, n: usize, k: usize, threads: usize) -> usize {
    m.div_ceil(way_rows(m, n, k, threads).max(1)).max(1)
}

/// Rows of `C` each way of [`split_ways`] computes (the last fewer).
pub(crate) fn way_rows(m: usize, n: usize, k: usize, threads: usize) -> usize {
    if !rows_group_alike(n) {
        return m;
    }
    let macs = m.saturating_mul(n).saturating_mul(k);
    let ways = threads
        .min(macs / MIN_MACS_PER_WAY)
        .min(m / MIN_ROWS_PER_WAY)
        .max(1);
    m.div_ceil(ways).next_multiple_of(ROW_TILE)
}

/// How many ways attention (or its adjoint) over queries `q` `[b, hq, sq,
/// d]` and keys `k` `[b, hk, sk, d]` runs over `threads` threads: its
/// (batch, key/value head) groups in contiguous runs, as many as have
/// [`MIN_MACS_PER_WAY`] multiply-adds of the score product each, at most
/// `threads` and the groups. Each group is computed as on one thread, so
/// the bits do not depend on the ways. An adjoint that wants the mask's
/// gradient (`mask_grad`), which every group adds to, runs on one thread.
pub fn attention_ways(q: &[usize], k: &[usize], mask_grad: bool, threads: usize) -> usize {
    let ([b, hq, sq, d], [_, hk, sk, _], false) = (q, k, mask_grad) else {
        return 1;
    };
    let macs = [b, hq, sq, sk, d]
        .into_iter()
        .fold(1usize, |m, &x| m.saturating_mul(x));
    threads.min(b * hk).min(macs / MIN_MACS_PER_WAY).max(1)
}

/// Elements a thread must be handed before a row-wise kernel is split for
/// it: half a MiB of f32, about 50-100 µs of streaming on one core, well
/// above waking a pool thread.
pub const MIN_ELEMENTS_PER_WAY: usize = 1 << 17;

/// How many ways a kernel over `rows` independent rows, `elements` in all,
/// runs over `threads` threads: as many as have [`MIN_ELEMENTS_PER_WAY`]
/// elements each, at most `threads` and the rows. Each row is computed as
/// on one thread.
pub fn row_ways(rows: usize, elements: usize, threads: usize) -> usize {
    threads.min(rows).min(elements / MIN_ELEMENTS_PER_WAY).max(1)
}

/// The independent rows a row-wise kernel splits over threads, and its
/// elements in all, for `op` giving `out` from inputs all of one float
/// type or not (`float`): the float maps whose arithmetic, not memory,
/// bounds them (exponentials, activations and their adjoints) split
/// anywhere (a row is an element); softmax and its adjoint over the last
/// axis, and the norms and their adjoints, their rows; a transpose of the
/// last two axes its output's rows. `None` for a kernel that runs on the
/// rank's own thread, as streaming arithmetic (`Add`, `Mul`, a copy) does:
/// a second thread there buys less than the pass that sizes its buffer
/// costs. The kernels split by it and the simulator prices it.
pub fn row_split(op: &Op, out: &[usize], float: bool) -> Option<(usize, usize)> {
    let elements = prod(out);
    let last_axis = |axis: i64| axis == -1 || axis == out.len() as i64 - 1;
    let rows = match op {
        Op::Unary { func } if float && transcendental(*func) => elements,
        Op::Silu | Op::Gelu { .. } | Op::ActivationGrad { .. } if float => elements,
        Op::Softmax { axis } | Op::LogSoftmax { axis } | Op::SoftmaxGrad { axis, .. } if last_axis(*axis) => {
            elements / out.last().copied().unwrap_or(1).max(1)
        }
        Op::LayerNorm { axis, .. } | Op::RmsNorm { axis, .. } | Op::NormGrad { axis, .. } => {
            let a = if *axis < 0 {
                *axis + out.len() as i64
            } else {
                *axis
            };
            prod(out.get(..usize::try_from(a).ok()?)?)
        }
        Op::Transpose { perm } if swaps_last_two(perm.as_deref(), out.len()) => {
            elements / out.last().copied().unwrap_or(1).max(1)
        }
        _ => return None,
    };
    Some((rows, elements))
}

/// [`row_ways`] of `op` ([`row_split`]) giving `out` from inputs of
/// `dtypes`, over this thread's [`kernel_threads`]; 1 for a kernel that
/// does not split, and at once on one thread (every op's evaluation asks).
pub(crate) fn kernel_row_ways(
    op: &Op,
    out: Option<&super::TensorType>,
    dtypes: impl Iterator<Item = crate::DType>,
) -> usize {
    let threads = kernel_threads();
    if threads == 1 {
        return 1;
    }
    let Some(shape) = out.and_then(|t| t.shape.as_fixed()) else {
        return 1;
    };
    row_split(op, &shape, one_float_type(dtypes))
        .map_or(1, |(rows, elements)| row_ways(rows, elements, threads))
}

/// Whether `func` costs a polynomial or a libm call per element.
fn transcendental(func: UnaryOp) -> bool {
    use UnaryOp::*;
    matches!(func, Exp | Log | Tanh | Erf | Sigmoid | Sin | Cos)
}

/// Whether `dtypes` (a kernel's inputs') are all one float type, which
/// [`row_split`] asks.
pub fn one_float_type(mut dtypes: impl Iterator<Item = crate::DType>) -> bool {
    match dtypes.next() {
        Some(first) => first.is_float() && dtypes.all(|d| d == first),
        None => false,
    }
}

/// Whether a permutation of `rank` axes swaps the last two and keeps the
/// rest (`None` reverses the axes: for two axes, a swap).
pub(crate) fn swaps_last_two(perm: Option<&[usize]>, rank: usize) -> bool {
    match perm {
        None => rank == 2,
        Some(p) => {
            rank >= 2
                && p.len() == rank
                && p[rank - 2] == rank - 1
                && p[rank - 1] == rank - 2
                && (0..rank - 2).all(|a| p[a] == a)
        }
    }
}

/// Runs `f` over `groups` groups in `ways` contiguous runs on this
/// thread's kernel threads ([`on_kernel_threads`]): each run gets its range of groups
/// and its part of each of `outputs`, which hold `per_group[i]` elements
/// per group.
pub(crate) fn in_group_runs<T: Send>(
    groups: usize,
    ways: usize,
    outputs: Vec<&mut [T]>,
    per_group: &[usize],
    f: impl Fn(std::ops::Range<usize>, Vec<&mut [T]>) -> Result<(), OpError> + Sync,
) -> Result<(), OpError> {
    if ways <= 1 || groups <= 1 || per_group.contains(&0) {
        return f(0..groups, outputs);
    }
    let per_run = groups.div_ceil(ways);
    let mut runs: Vec<Vec<&mut [T]>> = (0..groups.div_ceil(per_run)).map(|_| Vec::new()).collect();
    for (out, &n) in outputs.into_iter().zip(per_group) {
        for (run, part) in runs.iter_mut().zip(out.chunks_mut((per_run * n).max(1))) {
            run.push(part);
        }
    }
    let mut results: Vec<Result<(), OpError>> = runs.iter().map(|_| Ok(())).collect();
    let f = &f;
    let jobs = runs
        .into_iter()
        .enumerate()
        .zip(results.iter_mut())
        .map(|((i, parts), result)| {
            let range = i * per_run..((i + 1) * per_run).min(groups);
            move || *result = f(range, parts)
        })
        .collect();
    on_kernel_threads(jobs);
    results.into_iter().collect()
}

/// `rows` rows of `row_len` elements written into a new buffer by `f(rows
/// range, their part of the buffer)`, in `ways` runs ([`in_group_runs`]).
pub(crate) fn rows_in_runs<T: Copy + Default + Send>(
    rows: usize,
    row_len: usize,
    ways: usize,
    f: impl Fn(std::ops::Range<usize>, &mut [T]) + Sync,
) -> Vec<T> {
    let mut out = vec![T::default(); rows * row_len];
    let run = |range: std::ops::Range<usize>, mut parts: Vec<&mut [T]>| {
        f(range, parts[0]);
        Ok(())
    };
    // The closure never fails.
    let _ = in_group_runs(rows, ways, vec![&mut out[..]], &[row_len], run);
    out
}

#[cfg(test)]
mod tests {
    use super::super::testing::{eval, f32s};
    use super::super::{Activation, BinaryOp, GeluApprox, UnaryOp};
    use super::*;
    use crate::Value;

    /// Every row-wise kernel gives one thread's bits in three runs, and
    /// the rule does split it three ways (shapes of 64 rows of 8,192).
    #[test]
    fn row_kernels_give_one_threads_bits_on_three() {
        let (rows, n) = (64usize, 8192usize);
        let data = |seed: usize, len: usize| -> Vec<f32> {
            (0..len)
                .map(|i| ((i * 7919 + seed * 104_729) % 2003) as f32 / 331.0 - 3.0)
                .collect()
        };
        let x = f32s(&[rows, n], &data(1, rows * n));
        let y = f32s(&[rows, n], &data(2, rows * n));
        let bias = f32s(&[n], &data(4, n));
        let stack = f32s(&[2, rows / 2, n], &data(5, rows * n));
        let scale = f32s(&[n], &data(6, n));
        let cases: Vec<(Op, Vec<&Value>)> = vec![
            (Op::Unary { func: UnaryOp::Exp }, vec![&x]),
            (Op::Unary { func: UnaryOp::Tanh }, vec![&x]),
            (
                Op::Gelu {
                    approximate: GeluApprox::Tanh,
                },
                vec![&x],
            ),
            (Op::Silu, vec![&x]),
            (
                Op::ActivationGrad {
                    activation: Activation::Gelu,
                },
                vec![&x, &y],
            ),
            (Op::Softmax { axis: -1 }, vec![&x]),
            (Op::LogSoftmax { axis: 1 }, vec![&x]),
            (Op::SoftmaxGrad { axis: -1, log: true }, vec![&x, &y]),
            (Op::SoftmaxGrad { axis: -1, log: false }, vec![&x, &y]),
            (
                Op::LayerNorm {
                    axis: -1,
                    epsilon: 1e-5,
                },
                vec![&x, &scale, &bias],
            ),
            (
                Op::RmsNorm {
                    axis: -1,
                    epsilon: 1e-5,
                },
                vec![&x, &scale],
            ),
            (
                Op::NormGrad {
                    axis: -1,
                    epsilon: 1e-5,
                    centre: true,
                },
                vec![&x, &scale, &y],
            ),
            (Op::Transpose { perm: None }, vec![&x]),
            (
                Op::Transpose {
                    perm: Some(vec![0, 2, 1]),
                },
                vec![&stack],
            ),
        ];
        let bits = |vs: Vec<Value>| -> Vec<Vec<u64>> {
            vs.iter()
                .map(|v| v.to_f64_vec().iter().map(|f| f.to_bits()).collect())
                .collect()
        };
        for (op, inputs) in cases {
            let out = eval(&op, &inputs).unwrap();
            let (r, e) = row_split(&op, &out[0].shape, true).expect("a row-wise kernel");
            assert_eq!(row_ways(r, e, 3), 3, "{op:?} splits three ways");
            set_kernel_threads(1);
            let one = bits(eval(&op, &inputs).unwrap());
            set_kernel_threads(3);
            let three = bits(eval(&op, &inputs).unwrap());
            set_kernel_threads(1);
            assert!(one == three, "{op:?} on three threads");
        }
    }

    #[test]
    fn small_products_are_not_split() {
        assert_eq!(split_ways(32, 384, 128, 8), 1);
        assert_eq!(split_ways(8, 4096, 4096, 8), 1, "too few rows");
        assert_eq!(split_ways(512, 512, 512, 2), 2);
        assert_eq!(split_ways(512, 2048, 512, 64), 8, "48 rows a way at least");
        assert_eq!(split_ways(1000, 70, 64, 2), 2);
        assert_eq!(split_ways(1000, 64, 4096, 2), 1, "too narrow to split alike");
        assert_eq!(split_ways(512, 2048, 512, 1), 1);
        assert_eq!(way_rows(256, 2048, 512, 2), 128, "two even ways");
    }

    #[test]
    fn row_kernels_split_whole_rows_of_enough_elements() {
        assert_eq!(row_ways(512, 512 * 8192, 2), 2);
        assert_eq!(row_ways(512, 512 * 8192, 64), 32, "half a MiB of f32 a way");
        assert_eq!(row_ways(1, 1 << 22, 4), 1, "one row");
        assert_eq!(row_ways(1000, 1000, 4), 1, "too few elements");
        let softmax = Op::LogSoftmax { axis: -1 };
        assert_eq!(row_split(&softmax, &[2, 256, 8192], true), Some((512, 1 << 22)));
        let inner = Op::Softmax { axis: 1 };
        assert_eq!(row_split(&inner, &[2, 256, 8192], true), None);
        let norm = Op::LayerNorm {
            axis: -1,
            epsilon: 1e-5,
        };
        assert_eq!(row_split(&norm, &[2, 256, 512], true), Some((512, 1 << 18)));
        let t = Op::Transpose { perm: None };
        assert_eq!(row_split(&t, &[2048, 512], false), Some((2048, 1 << 20)));
        let exp = Op::Unary { func: UnaryOp::Exp };
        assert_eq!(row_split(&exp, &[512, 4096], true), Some((1 << 21, 1 << 21)));
        assert_eq!(row_split(&exp, &[512, 4096], false), None, "integers");
        let add = Op::Binary { func: BinaryOp::Add };
        assert_eq!(row_split(&add, &[512, 4096], true), None, "streaming");
        let heads = Op::Transpose {
            perm: Some(vec![0, 2, 1, 3]),
        };
        assert_eq!(row_split(&heads, &[2, 4, 3, 5], true), None);
    }
}
