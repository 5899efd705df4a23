// Optimizer steps over fp32 master weights (grid-stride). Arithmetic uses
// round-to-nearest intrinsics (never fused into FMAs) in the CPU oracle's
// order (exec/src/train/optim.rs), so results match it to the rounding of
// the hyper-parameters passed in as float.

#define MUL(a, b) __fmul_rn(a, b)
#define ADD(a, b) __fadd_rn(a, b)
#define SUB(a, b) __fsub_rn(a, b)

// PyTorch's two-sided lerp: a + w·(b − a), exact at both ends.
__device__ __forceinline__ float lerp_two_sided(float a, float b, float w, float one_minus_w) {
    return fabsf(w) < 0.5f ? ADD(a, MUL(w, SUB(b, a))) : SUB(b, MUL(SUB(b, a), one_minus_w));
}

// AdamW: p = master·decay; m = lerp(m, g, w1); v = v·b2 + w2·g·g;
// p −= step_size·m / (sqrt(v)/bc2_sqrt + eps). w1 = 1 − β₁, rest1 = 1 − w1 and
// w2 = 1 − β₂ come from the host, formed in f64 and rounded, as the CPU oracle
// forms them. For T = float, param may alias master.
template <typename T>
__device__ __forceinline__ void adamw(float* master, T* param, float* m, float* v, const T* grad, long long n,
                                      float step_size, float bc2_sqrt, float w1, float rest1, float beta2,
                                      float w2, float eps, float decay) {
    GRID_STRIDE(i, n) {
        const float g = to_float(grad[i]);
        float p = MUL(master[i], decay);
        const float mi = lerp_two_sided(m[i], g, w1, rest1);
        const float vi = ADD(MUL(v[i], beta2), MUL(MUL(w2, g), g));
        const float denom = ADD(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
        p = SUB(p, __fdiv_rn(MUL(step_size, mi), denom));
        m[i] = mi;
        v[i] = vi;
        master[i] = p;
        param[i] = from_float<T>(p);
    }
}

// SGD: d = g + wd·p (wd ≠ 0); with a momentum buffer buf = momentum·buf + d, d = buf; p −= lr·d.
template <typename T>
__device__ __forceinline__ void sgd(float* master, T* param, float* buf, const T* grad, long long n, float lr,
                                    float momentum, float weight_decay) {
    GRID_STRIDE(i, n) {
        float p = master[i];
        float d = to_float(grad[i]);
        if (weight_decay != 0.0f) d = ADD(d, MUL(weight_decay, p));
        if (buf) {
            d = ADD(MUL(buf[i], momentum), d);
            buf[i] = d;
        }
        p = SUB(p, MUL(lr, d));
        master[i] = p;
        param[i] = from_float<T>(p);
    }
}

#define OPTIMIZER_KERNELS(T, S)                                                                       \
    KERNEL adamw_##S(float* master, T* param, float* m, float* v, const T* grad, long long n,         \
                     float step_size, float bc2_sqrt, float w1, float rest1, float beta2, float w2,    \
                     float eps, float decay) {                                                        \
        adamw(master, param, m, v, grad, n, step_size, bc2_sqrt, w1, rest1, beta2, w2, eps, decay);   \
    }                                                                                                 \
    KERNEL sgd_##S(float* master, T* param, float* buf_or_null, const T* grad, long long n, float lr,  \
                   float momentum, float weight_decay) {                                              \
        sgd(master, param, buf_or_null, grad, n, lr, momentum, weight_decay);                         \
    }
FOR_EACH_TYPE(OPTIMIZER_KERNELS)
