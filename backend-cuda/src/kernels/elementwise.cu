// Element-wise kernels (grid-stride; any grid and block up to 1024 threads).
// Strided operands are read through `View`s; a view that turns out to be
// row-major skips the index arithmetic.

// ---- strided copy (transpose, expand, slice, concat/split pieces) ----
template <typename T>
__device__ __forceinline__ void copy_view(T* out, const View& ov, const T* in, const View& iv, long long n) {
    const bool oc = view_is_contiguous(ov), ic = view_is_contiguous(iv);
    GRID_STRIDE(i, n) out[view_index(ov, oc, i)] = in[view_index(iv, ic, i)];
}

// ---- unary ----
// X(name, expression of x): one list drives both the functors and the kernels.
#define UNARY_OPS(X, T, S)                                                                   \
    X(neg, -x, T, S) X(exp, expf(x), T, S) X(log, logf(x), T, S) X(sqrt, sqrtf(x), T, S)       \
    X(rsqrt, rsqrtf(x), T, S) X(reciprocal, 1.0f / x, T, S) X(tanh, tanhf(x), T, S)          \
    X(sigmoid, stable_sigmoid(x), T, S) X(relu, x < 0.0f ? 0.0f : x, T, S) X(abs, fabsf(x), T, S)  \
    X(erf, erff(x), T, S) X(sin, sinf(x), T, S) X(cos, cosf(x), T, S) X(identity, x, T, S)

#define DEFINE_UNARY_OP(NAME, EXPR, T, S) \
    struct unary_op_##NAME {              \
        static __device__ __forceinline__ float f(float x) { return EXPR; } \
    };
UNARY_OPS(DEFINE_UNARY_OP, , )

template <typename Op, typename T>
__device__ __forceinline__ void unary(T* out, const T* in, long long n) {
    GRID_STRIDE(i, n) out[i] = from_float<T>(Op::f(to_float(in[i])));
}

// ---- binary and comparisons (broadcast through views; out contiguous) ----
#define BINARY_OPS(X, T, S)                                                               \
    X(add, a + b, T, S) X(sub, a - b, T, S) X(mul, a * b, T, S) X(div, a / b, T, S)         \
    X(pow, (powf(a, b)), T, S) X(mod, (floor_mod(a, b)), T, S) X(fmod, (fmodf(a, b)), T, S)  \
    X(max, (nan_max(a, b)), T, S) X(min, (nan_min(a, b)), T, S)
#define COMPARE_OPS(X, T, S) X(eq, a == b, T, S) X(lt, a < b, T, S) X(gt, a > b, T, S)

#define DEFINE_BINARY_OP(NAME, EXPR, T, S) \
    struct binary_op_##NAME {              \
        static __device__ __forceinline__ float f(float a, float b) { return EXPR; } \
    };
BINARY_OPS(DEFINE_BINARY_OP, , )
COMPARE_OPS(DEFINE_BINARY_OP, , )

template <> __device__ __forceinline__ unsigned char from_float<unsigned char>(float x) { return x != 0.0f; }

// out[i] = a[i] op b[i] with a, b read through broadcast views; out (T, or
// 0/1 bytes for comparisons) is contiguous.
template <typename Op, typename O, typename T>
__device__ __forceinline__ void binary(O* out, const T* a, const View& av, const T* b, const View& bv,
                                       long long n) {
    const bool ac = view_is_contiguous(av), bc = view_is_contiguous(bv);
    GRID_STRIDE(i, n) {
        const float x = to_float(a[view_index(av, ac, i)]);
        const float y = to_float(b[view_index(bv, bc, i)]);
        out[i] = from_float<O>(Op::f(x, y));
    }
}

template <typename T>
__device__ __forceinline__ void where_select(T* out, const unsigned char* c, const View& cv, const T* a,
                                             const View& av, const T* b, const View& bv, long long n) {
    const bool cc = view_is_contiguous(cv), ac = view_is_contiguous(av), bc = view_is_contiguous(bv);
    GRID_STRIDE(i, n) {
        out[i] = c[view_index(cv, cc, i)] ? a[view_index(av, ac, i)] : b[view_index(bv, bc, i)];
    }
}

// ---- fills, accumulation, scaling ----
template <typename T>
__device__ __forceinline__ void fill(T* out, long long n, float value) {
    const T v = from_float<T>(value);
    GRID_STRIDE(i, n) out[i] = v;
}

template <typename T>
__device__ __forceinline__ void add_inplace(T* acc, const T* x, long long n) {
    GRID_STRIDE(i, n) acc[i] = from_float<T>(to_float(acc[i]) + to_float(x[i]));
}

template <typename T>
__device__ __forceinline__ void scale(T* out, const T* in, long long n, float s) {
    GRID_STRIDE(i, n) out[i] = from_float<T>(to_float(in[i]) * s);
}

// ---- per-type kernels ----
#define UNARY_KERNEL(NAME, EXPR, T, S)                                   \
    KERNEL unary_##NAME##_##S(T* out, const T* in, long long n) {        \
        unary<unary_op_##NAME>(out, in, n);                              \
    }
#define BINARY_KERNEL(NAME, EXPR, T, S)                                                                  \
    KERNEL binary_##NAME##_##S(T* out, const T* a, View av, const T* b, View bv, long long n) {         \
        binary<binary_op_##NAME>(out, a, av, b, bv, n);                                               \
    }
#define COMPARE_KERNEL(NAME, EXPR, T, S)                                                                 \
    KERNEL compare_##NAME##_##S(unsigned char* out, const T* a, View av, const T* b, View bv,           \
                                long long n) {                                                           \
        binary<binary_op_##NAME>(out, a, av, b, bv, n);                                                  \
    }

#define ELEMENTWISE_KERNELS(T, S)                                                                      \
    KERNEL copy_view_##S(T* out, View ov, const T* in, View iv, long long n) {                         \
        copy_view(out, ov, in, iv, n);                                                                 \
    }                                                                                                  \
    UNARY_OPS(UNARY_KERNEL, T, S)                                                                      \
    BINARY_OPS(BINARY_KERNEL, T, S)                                                                    \
    COMPARE_OPS(COMPARE_KERNEL, T, S)                                                                  \
    KERNEL where_##S(T* out, const unsigned char* c, View cv, const T* a, View av, const T* b, View bv, \
                     long long n) {                                                                    \
        where_select(out, c, cv, a, av, b, bv, n);                                                     \
    }                                                                                                  \
    KERNEL fill_##S(T* out, long long n, float value) { fill(out, n, value); }                         \
    KERNEL add_inplace_##S(T* acc, const T* x, long long n) { add_inplace(acc, x, n); }                \
    KERNEL scale_##S(T* out, const T* in, long long n, float s) { scale(out, in, n, s); }

FOR_EACH_TYPE(ELEMENTWISE_KERNELS)

// ---- casts between storage types ----
template <typename O, typename I>
__device__ __forceinline__ void cast(O* out, const I* in, long long n) {
    GRID_STRIDE(i, n) out[i] = (O)in[i];
}

KERNEL cast_f32_bf16(__nv_bfloat16* out, const float* in, long long n) {
    GRID_STRIDE(i, n) out[i] = __float2bfloat16(in[i]);
}
KERNEL cast_bf16_f32(float* out, const __nv_bfloat16* in, long long n) {
    GRID_STRIDE(i, n) out[i] = __bfloat162float(in[i]);
}
KERNEL cast_i64_f32(float* out, const long long* in, long long n) { cast(out, in, n); }
KERNEL cast_f32_i64(long long* out, const float* in, long long n) { cast(out, in, n); }
KERNEL cast_bool_f32(float* out, const unsigned char* in, long long n) {
    GRID_STRIDE(i, n) out[i] = in[i] ? 1.0f : 0.0f;
}
