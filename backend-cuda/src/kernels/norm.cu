// LayerNorm and RMSNorm over the last dimension, ONE BLOCK PER ROW
// (blockDim.x a power of two in [32, 1024]). Statistics in float:
// y = (x − mean)·rstd·gamma (+ beta), rstd = 1/sqrt(var + eps) with the
// biased variance; RMSNorm is the same with mean = 0.

// A row's mean (0 for RMSNorm) and rstd, as the forward and backward passes
// both compute them (the whole block takes part).
template <bool Centre, typename T>
__device__ __forceinline__ float2 row_stats(const T* xr, long long cols, float eps) {
    float mean = 0.0f;
    if (Centre) {
        float s = 0.0f;
        for (long long c = threadIdx.x; c < cols; c += blockDim.x) s += to_float(xr[c]);
        mean = block_sum(s) / (float)cols;
    }
    float ss = 0.0f;
    for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
        const float d = to_float(xr[c]) - mean;
        ss += d * d;
    }
    return make_float2(mean, 1.0f / sqrtf(block_sum(ss) / (float)cols + eps));
}

template <bool Centre, typename T>
__device__ __forceinline__ void norm_fwd(T* y, float* mean_out, float* rstd_out, const T* x, const T* gamma,
                                         const T* beta, long long rows, long long cols, float eps) {
    ROW_LOOP(r, rows) {
        const T* xr = x + r * cols;
        T* yr = y + r * cols;
        const float2 st = row_stats<Centre>(xr, cols, eps);
        const float mean = st.x, rstd = st.y;
        for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
            float v = (to_float(xr[c]) - mean) * rstd * to_float(gamma[c]);
            if (beta) v += to_float(beta[c]);
            yr[c] = from_float<T>(v);
        }
        if (threadIdx.x == 0) {
            if (mean_out) mean_out[r] = mean;
            if (rstd_out) rstd_out[r] = rstd;
        }
    }
}

// The adjoint (the IR's NormGrad), statistics recomputed as the forward
// computes them: dx = rstd·(g − x̂·mean(g·x̂) − mean(g)) with g = dy·gamma and
// x̂ = (x − mean)·rstd (RMSNorm: no mean(g) term), and gx = dy·x̂, whose sums
// over rows are dgamma (a separate reduction: deterministic, no atomics).
// gx may be null (not computed).
template <bool Centre, typename T>
__device__ __forceinline__ void norm_bwd(T* dx, T* gx, const T* dy, const T* x, const T* gamma, long long rows,
                                         long long cols, float eps) {
    ROW_LOOP(r, rows) {
        const T* xr = x + r * cols;
        const T* dyr = dy + r * cols;
        const float2 st = row_stats<Centre>(xr, cols, eps);
        const float mean = st.x, rstd = st.y;
        float sum_g = 0.0f, sum_gx = 0.0f;
        for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
            const float xhat = (to_float(xr[c]) - mean) * rstd, d = to_float(dyr[c]);
            const float g = d * to_float(gamma[c]);
            sum_g += g;
            sum_gx += g * xhat;
            if (gx) gx[r * cols + c] = from_float<T>(d * xhat);
        }
        const float mean_g = Centre ? block_sum(sum_g) / (float)cols : 0.0f;
        const float mean_gx = block_sum(sum_gx) / (float)cols;
        T* dxr = dx + r * cols;
        for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
            const float xhat = (to_float(xr[c]) - mean) * rstd;
            const float g = to_float(dyr[c]) * to_float(gamma[c]);
            dxr[c] = from_float<T>(rstd * (g - xhat * mean_gx - mean_g));
        }
    }
}

#define NORM_KERNELS(T, S)                                                                             \
    KERNEL layernorm_fwd_##S(T* y, float* mean, float* rstd, const T* x, const T* gamma,               \
                             const T* beta_or_null, long long rows, long long cols, float eps) {       \
        norm_fwd<true>(y, mean, rstd, x, gamma, beta_or_null, rows, cols, eps);                        \
    }                                                                                                  \
    KERNEL layernorm_bwd_##S(T* dx, T* gx_or_null, const T* dy, const T* x, const T* gamma,            \
                             long long rows, long long cols, float eps) {                              \
        norm_bwd<true>(dx, gx_or_null, dy, x, gamma, rows, cols, eps);                                 \
    }                                                                                                  \
    KERNEL rmsnorm_fwd_##S(T* y, float* rstd, const T* x, const T* gamma, long long rows, long long cols, \
                           float eps) {                                                                \
        norm_fwd<false>(y, (float*)0, rstd, x, gamma, (const T*)0, rows, cols, eps);                   \
    }                                                                                                  \
    KERNEL rmsnorm_bwd_##S(T* dx, T* gx_or_null, const T* dy, const T* x, const T* gamma,              \
                           long long rows, long long cols, float eps) {                                \
        norm_bwd<false>(dx, gx_or_null, dy, x, gamma, rows, cols, eps);                                \
    }
FOR_EACH_TYPE(NORM_KERNELS)
