// Shared by every kernel source: the Rust side prepends this file to each
// `.cu` before handing it to NVRTC (which has no include path for it).
// The kernel names each source exports are listed in `backend-cuda/src/kernels.rs`;
// each source states its launch geometry and argument conventions at its top.
#include <cuda_bf16.h>

#define MAX_RANK 8

// A strided tensor: element i (row-major over dims) lives at view_offset(v, i).
// Passed by value; the Rust twin is `cuda::module::View` (136 bytes).
struct View {
    int rank;
    long long dims[MAX_RANK];
    long long strides[MAX_RANK];
};

// Offset of the i-th element. Unrolled over MAX_RANK so that every access to
// the by-value kernel parameter uses a constant index (no local-memory copy).
__device__ __forceinline__ long long view_offset(const View& v, long long i) {
    long long off = 0;
#pragma unroll
    for (int d = MAX_RANK - 1; d >= 0; --d) {
        if (d < v.rank) {
            const long long n = v.dims[d];
            long long q;
            if ((((unsigned long long)i | (unsigned long long)n) >> 32) == 0) {
                q = (unsigned)i / (unsigned)n;  // 32-bit division when both fit
            } else {
                q = i / n;
            }
            off += (i - q * n) * v.strides[d];
            i = q;
        }
    }
    return off;
}

// True when the view is plain row-major (offset(i) == i): kernels test this
// once per thread and skip the divisions.
__device__ __forceinline__ bool view_is_contiguous(const View& v) {
    long long expect = 1;
    bool ok = true;
#pragma unroll
    for (int d = MAX_RANK - 1; d >= 0; --d) {
        if (d < v.rank) {
            ok = ok && (v.dims[d] == 1 || v.strides[d] == expect);
            expect *= v.dims[d];
        }
    }
    return ok;
}

__device__ __forceinline__ long long view_index(const View& v, bool contiguous, long long i) {
    return contiguous ? i : view_offset(v, i);
}

// Storage <-> compute conversions: math is always float.
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16(x);
}

#define F32_INF __int_as_float(0x7f800000)
#define F32_NAN __int_as_float(0x7fffffff)

// max/min that propagate NaN, as the reference kernels do (fmaxf drops it).
// The remainder with the divisor's sign (Python's %, ONNX Mod).
__device__ __forceinline__ float floor_mod(float a, float b) {
    const float r = fmodf(a, b);
    return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;
}
__device__ __forceinline__ float nan_max(float a, float b) { return (a != a || b != b) ? F32_NAN : fmaxf(a, b); }
__device__ __forceinline__ float nan_min(float a, float b) { return (a != a || b != b) ? F32_NAN : fminf(a, b); }

// The CPU oracle's two-branch sigmoid (no overflow for large |x|).
__device__ __forceinline__ float stable_sigmoid(float x) {
    if (x >= 0.0f) return 1.0f / (1.0f + expf(-x));
    const float e = expf(x);
    return e / (1.0f + e);
}

// Instantiates M(T, suffix) for every storage type.
#define FOR_EACH_TYPE(M) M(float, f32) M(__nv_bfloat16, bf16)

// Grid-stride loop over [0, n).
#define GRID_STRIDE(i, n)                                                              \
    _Pragma("unroll 1") for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (n);     \
         i += (long long)gridDim.x * blockDim.x)

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

// Block-wide reductions (blockDim.x a multiple of 32, at most 1024); every
// thread gets the result. Safe to call repeatedly: the leading barrier keeps a
// call from overwriting partials that the previous call is still reading.
__device__ __forceinline__ float block_sum(float x) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    x = warp_sum(x);
    __syncthreads();
    if (lane == 0) partial[warp] = x;
    __syncthreads();
    x = lane < (int)(blockDim.x >> 5) ? partial[lane] : 0.0f;
    return warp_sum(x);
}

__device__ __forceinline__ float block_max(float x) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    x = warp_max(x);
    __syncthreads();
    if (lane == 0) partial[warp] = x;
    __syncthreads();
    x = lane < (int)(blockDim.x >> 5) ? partial[lane] : -F32_INF;
    return warp_max(x);
}

// Row and element-wise kernels accept any block of up to 1024 threads.
#define KERNEL extern "C" __global__ void __launch_bounds__(1024)

// Row kernels: one block per row; also correct when the grid has fewer
// blocks than rows (each block then takes every gridDim.x-th row).
#define ROW_LOOP(r, rows) for (long long r = blockIdx.x; r < (rows); r += gridDim.x)
