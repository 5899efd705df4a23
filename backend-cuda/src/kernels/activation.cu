// GELU (exact or tanh approximation) and SiLU, forward and backward
// (grid-stride; any grid and block up to 1024 threads).

#define GELU_SQRT_2_OVER_PI 0.7978845608028654f
#define GELU_INV_SQRT_2 0.7071067811865476f
#define GELU_INV_SQRT_2PI 0.3989422804014327f

__device__ __forceinline__ float gelu(float x, int tanh_approx) {
    if (tanh_approx) {
        return 0.5f * x * (1.0f + tanhf(GELU_SQRT_2_OVER_PI * (x + 0.044715f * x * x * x)));
    }
    return 0.5f * x * (1.0f + erff(x * GELU_INV_SQRT_2));
}

// d gelu / dx
__device__ __forceinline__ float gelu_grad(float x, int tanh_approx) {
    if (tanh_approx) {
        const float u = GELU_SQRT_2_OVER_PI * (x + 0.044715f * x * x * x);
        const float t = tanhf(u);
        const float du = GELU_SQRT_2_OVER_PI * (1.0f + 3.0f * 0.044715f * x * x);
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
    }
    const float cdf = 0.5f * (1.0f + erff(x * GELU_INV_SQRT_2));
    return cdf + x * GELU_INV_SQRT_2PI * expf(-0.5f * x * x);
}

__device__ __forceinline__ float silu(float x) { return x * stable_sigmoid(x); }
__device__ __forceinline__ float silu_grad(float x) {
    const float s = stable_sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}

#define ACTIVATION_KERNELS(T, S)                                                                  \
    KERNEL gelu_fwd_##S(T* y, const T* x, long long n, int tanh_approx) {                         \
        GRID_STRIDE(i, n) y[i] = from_float<T>(gelu(to_float(x[i]), tanh_approx));               \
    }                                                                                             \
    KERNEL gelu_bwd_##S(T* dx, const T* dy, const T* x, long long n, int tanh_approx) {           \
        GRID_STRIDE(i, n) dx[i] = from_float<T>(to_float(dy[i]) * gelu_grad(to_float(x[i]), tanh_approx)); \
    }                                                                                             \
    KERNEL silu_fwd_##S(T* y, const T* x, long long n) {                                          \
        GRID_STRIDE(i, n) y[i] = from_float<T>(silu(to_float(x[i])));                             \
    }                                                                                             \
    KERNEL silu_bwd_##S(T* dx, const T* dy, const T* x, long long n) {                            \
        GRID_STRIDE(i, n) dx[i] = from_float<T>(to_float(dy[i]) * silu_grad(to_float(x[i])));     \
    }
FOR_EACH_TYPE(ACTIVATION_KERNELS)
