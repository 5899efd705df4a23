// Softmax / log-softmax and cross-entropy over the last dimension, ONE BLOCK
// PER ROW (blockDim.x a power of two in [32, 1024]). Max and sum of
// exponentials are found in one pass (online rescaling), then combined
// across the block.

// Running (max, sum of exp(x − max)) of a stream of values.
struct MaxSum {
    float m, s;
};

__device__ __forceinline__ void max_sum_add(MaxSum& a, float v) {
    if (v > a.m) {
        a.s = a.s * expf(a.m - v) + 1.0f;
        a.m = v;
    } else if (v != -F32_INF) {
        a.s += expf(v - a.m);  // NaN stays NaN
    }
}

// Every thread gets the row's max and sum of exp(x − max).
template <typename T>
__device__ __forceinline__ MaxSum row_max_sum(const T* row, long long cols) {
    MaxSum a{-F32_INF, 0.0f};
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) max_sum_add(a, to_float(row[c]));
    const float m = block_max(a.m);
    const float s = block_sum(a.m == -F32_INF ? 0.0f : a.s * expf(a.m - m));
    return MaxSum{m, s};
}

template <typename T>
__device__ __forceinline__ void softmax_fwd(T* y, const T* x, long long rows, long long cols, int log) {
    ROW_LOOP(r, rows) {
        const T* xr = x + r * cols;
        T* yr = y + r * cols;
        const MaxSum ms = row_max_sum(xr, cols);
        const float log_s = logf(ms.s), inv_s = 1.0f / ms.s;
        for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
            const float d = to_float(xr[c]) - ms.m;
            yr[c] = from_float<T>(log ? d - log_s : expf(d) * inv_s);
        }
    }
}

// softmax: dx = y·(dy − Σ dy·y); log-softmax: dx = dy − exp(y)·Σ dy.
template <typename T>
__device__ __forceinline__ void softmax_bwd(T* dx, const T* dy, const T* y, long long rows, long long cols,
                                            int log) {
    ROW_LOOP(r, rows) {
        const T* dyr = dy + r * cols;
        const T* yr = y + r * cols;
        float acc = 0.0f;
        for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
            acc += log ? to_float(dyr[c]) : to_float(dyr[c]) * to_float(yr[c]);
        }
        const float total = block_sum(acc);
        T* dxr = dx + r * cols;
        for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
            const float g = to_float(dyr[c]), v = to_float(yr[c]);
            dxr[c] = from_float<T>(log ? g - expf(v) * total : v * (g - total));
        }
    }
}

// loss[r] = lse[r] − logits[r, t]; t < 0 is ignored (loss 0), t ≥ vocab gives
// NaN. lse may be null (not stored).
template <typename T>
__device__ __forceinline__ void cross_entropy_fwd(float* loss, float* lse, const T* logits,
                                                  const long long* targets, long long rows, long long vocab) {
    ROW_LOOP(r, rows) {
        const T* row = logits + r * vocab;
        const MaxSum ms = row_max_sum(row, vocab);
        if (threadIdx.x == 0) {
            const float l = ms.m + logf(ms.s);
            const long long t = targets[r];
            loss[r] = t < 0 ? 0.0f : t >= vocab ? F32_NAN : l - to_float(row[t]);
            if (lse) lse[r] = l;
        }
    }
}

// dlogits = (softmax − onehot(t))·dloss[r]; ignored rows (t < 0) get 0, t ≥ vocab NaN.
template <typename T>
__device__ __forceinline__ void cross_entropy_bwd(T* dlogits, const T* logits, const float* lse,
                                                  const long long* targets, const float* dloss, long long rows,
                                                  long long vocab) {
    ROW_LOOP(r, rows) {
        const T* row = logits + r * vocab;
        T* out = dlogits + r * vocab;
        const long long t = targets[r];
        const float l = lse[r], g = t < 0 ? 0.0f : t >= vocab ? F32_NAN : dloss[r];
        for (long long c = threadIdx.x; c < vocab; c += blockDim.x) {
            const float p = expf(to_float(row[c]) - l);
            out[c] = from_float<T>((p - (c == t ? 1.0f : 0.0f)) * g);
        }
    }
}

#define SOFTMAX_KERNELS(T, S)                                                                         \
    KERNEL softmax_fwd_##S(T* y, const T* x, long long rows, long long cols, int log) {               \
        softmax_fwd(y, x, rows, cols, log);                                                           \
    }                                                                                                 \
    KERNEL softmax_bwd_##S(T* dx, const T* dy, const T* y, long long rows, long long cols, int log) { \
        softmax_bwd(dx, dy, y, rows, cols, log);                                                      \
    }                                                                                                 \
    KERNEL cross_entropy_fwd_##S(float* loss, float* lse, const T* logits, const long long* targets,  \
                                 long long rows, long long vocab) {                                   \
        cross_entropy_fwd(loss, lse, logits, targets, rows, vocab);                                   \
    }                                                                                                 \
    KERNEL cross_entropy_bwd_##S(T* dlogits, const T* logits, const float* lse,                       \
                                 const long long* targets, const float* dloss, long long rows,        \
                                 long long vocab) {                                                   \
        cross_entropy_bwd(dlogits, logits, lse, targets, dloss, rows, vocab);                         \
    }
FOR_EACH_TYPE(SOFTMAX_KERNELS)
