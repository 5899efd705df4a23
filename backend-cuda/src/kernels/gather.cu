// Gathers and their gradients (grid-stride). Tensors are viewed as
// [outer, axis, inner] (contiguous). An index below zero wraps once by
// +axis_len (ONNX); one still outside [0, axis_len) reads 0, its gradient is
// dropped, and the first such index sets *fault to `code` (the node's
// number), which the executor reads back and reports: kernels cannot fail.
// Gradients accumulate in float with atomicAdd into a buffer the executor zeroes.

// Element i of an [outer, mid, inner] tensor, split into its coordinates.
struct Coord3 {
    long long o, j, k;
};
__device__ __forceinline__ Coord3 split3(long long i, long long mid, long long inner) {
    const long long t = i / inner;
    return Coord3{t / mid, t - (t / mid) * mid, i - t * inner};
}

// Records an index out of range (the first one wins).
__device__ __forceinline__ void report_fault(int* fault, int code) {
    if (fault) atomicCAS(fault, 0, code);
}

// Offset into [outer, axis_len, inner] data for index value `ix`, or -1.
__device__ __forceinline__ long long axis_offset(Coord3 c, long long ix, long long axis_len, long long inner) {
    if (ix < 0) ix += axis_len;
    if (ix < 0 || ix >= axis_len) return -1;
    return (c.o * axis_len + ix) * inner + c.k;
}

// out[o, j, i] = data[o, idx(o, j, i), i] where idx is per j (gather) or per
// element (gather_elements).
template <bool PerElement, typename T>
__device__ __forceinline__ void gather(T* out, const T* data, const long long* idx, long long outer, long long mid,
                                       long long axis_len, long long inner, int* fault, int code) {
    GRID_STRIDE(i, outer * mid * inner) {
        const Coord3 c = split3(i, mid, inner);
        const long long at = axis_offset(c, idx[PerElement ? i : c.j], axis_len, inner);
        if (at < 0) report_fault(fault, code);
        out[i] = at < 0 ? from_float<T>(0.0f) : data[at];
    }
}

template <bool PerElement, typename T>
__device__ __forceinline__ void gather_grad(float* acc, const T* grad, const long long* idx, long long outer,
                                            long long mid, long long axis_len, long long inner, int* fault,
                                            int code) {
    GRID_STRIDE(i, outer * mid * inner) {
        const Coord3 c = split3(i, mid, inner);
        const long long at = axis_offset(c, idx[PerElement ? i : c.j], axis_len, inner);
        if (at >= 0) {
            atomicAdd(acc + at, to_float(grad[i]));
        } else {
            report_fault(fault, code);
        }
    }
}

#define GATHER_KERNELS(T, S)                                                                            \
    KERNEL gather_##S(T* out, const T* data, const long long* idx, long long outer, long long n_idx,     \
                      long long axis_len, long long inner, int* fault, int code) {                      \
        gather<false>(out, data, idx, outer, n_idx, axis_len, inner, fault, code);                      \
    }                                                                                                   \
    KERNEL gather_grad_##S(float* acc, const T* grad, const long long* idx, long long outer,             \
                           long long n_idx, long long axis_len, long long inner, int* fault, int code) { \
        gather_grad<false>(acc, grad, idx, outer, n_idx, axis_len, inner, fault, code);                 \
    }                                                                                                   \
    KERNEL gather_elements_##S(T* out, const T* data, const long long* idx, long long outer,             \
                               long long j_len, long long axis_len, long long inner, int* fault,        \
                               int code) {                                                              \
        gather<true>(out, data, idx, outer, j_len, axis_len, inner, fault, code);                       \
    }                                                                                                   \
    KERNEL gather_elements_grad_##S(float* acc, const T* grad, const long long* idx, long long outer,    \
                                    long long j_len, long long axis_len, long long inner, int* fault,   \
                                    int code) {                                                         \
        gather_grad<true>(acc, grad, idx, outer, j_len, axis_len, inner, fault, code);                  \
    }
FOR_EACH_TYPE(GATHER_KERNELS)
