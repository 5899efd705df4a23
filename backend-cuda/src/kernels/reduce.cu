// Row reductions, ONE BLOCK PER ROW (blockDim.x a power of two in [32, 1024]):
// out[r] = op over in[r*cols .. (r+1)*cols], accumulated in float.

struct reduce_sum {
    static __device__ __forceinline__ float init() { return 0.0f; }
    static __device__ __forceinline__ float combine(float a, float b) { return a + b; }
    static __device__ __forceinline__ float block(float x) { return block_sum(x); }
    static __device__ __forceinline__ float finish(float acc, long long) { return acc; }
};
struct reduce_mean : reduce_sum {
    static __device__ __forceinline__ float finish(float acc, long long cols) { return acc / (float)cols; }
};
struct reduce_max {
    static __device__ __forceinline__ float init() { return -F32_INF; }
    static __device__ __forceinline__ float combine(float a, float b) { return nan_max(a, b); }
    static __device__ __forceinline__ float block(float x) { return block_max(x); }
    static __device__ __forceinline__ float finish(float acc, long long) { return acc; }
};
struct reduce_min {
    static __device__ __forceinline__ float init() { return F32_INF; }
    static __device__ __forceinline__ float combine(float a, float b) { return nan_min(a, b); }
    static __device__ __forceinline__ float block(float x) { return -block_max(-x); }
    static __device__ __forceinline__ float finish(float acc, long long) { return acc; }
};

template <typename Op, typename T>
__device__ __forceinline__ void reduce_rows(T* out, const T* in, long long rows, long long cols) {
    ROW_LOOP(r, rows) {
        const T* row = in + r * cols;
        float acc = Op::init();
        for (long long c = threadIdx.x; c < cols; c += blockDim.x) acc = Op::combine(acc, to_float(row[c]));
        acc = Op::block(acc);
        if (threadIdx.x == 0) out[r] = from_float<T>(Op::finish(acc, cols));
    }
}

#define REDUCE_KERNEL(OP, T, S)                                                            \
    KERNEL reduce_rows_##OP##_##S(T* out, const T* in, long long rows, long long cols) {   \
        reduce_rows<reduce_##OP>(out, in, rows, cols);                                     \
    }
#define REDUCE_KERNELS(T, S) \
    REDUCE_KERNEL(sum, T, S) REDUCE_KERNEL(mean, T, S) REDUCE_KERNEL(max, T, S) REDUCE_KERNEL(min, T, S)
FOR_EACH_TYPE(REDUCE_KERNELS)
