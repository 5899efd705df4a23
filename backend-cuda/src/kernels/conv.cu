// Convolutions and pools (grid-stride), read through the tap table the IR
// builds (`Window::taps`): table[o * taps + t] is the flat spatial position
// in the input plane that tap t of output position o reads, or -1 in the
// padding. A convolution gathers one sample's group of channels into
// columns col[(c * taps + t) * outs + o] (im2col) for a cuBLAS GEMM; its
// input adjoint adds columns back into an f32 accumulator the executor
// zeroes (col2im). Pools reduce each window; their adjoint adds into an f32
// accumulator; the four pool kernels share one argument list (the max
// pools ignore the divisors, the average adjoint the input). `plane0` is the first input plane (sample · channels + first
// channel of the group) the launch reads or writes.

// The input element column entry i = (c * taps + t) * outs + o reads
// (relative to plane 0 of the whole input), or -1 in the padding.
__device__ __forceinline__ long long column_source(long long i, const long long* table, long long ins,
                                                   long long outs, long long taps, long long plane0) {
    const long long o = i % outs, row = i / outs;
    const long long p = table[o * taps + row % taps];
    return p < 0 ? -1 : (plane0 + row / taps) * ins + p;
}

template <typename T>
__device__ __forceinline__ void im2col(T* col, const T* x, const long long* table, long long channels,
                                       long long ins, long long outs, long long taps, long long plane0) {
    GRID_STRIDE(i, channels * taps * outs) {
        const long long p = column_source(i, table, ins, outs, taps, plane0);
        col[i] = p < 0 ? from_float<T>(0.0f) : x[p];
    }
}

template <typename T>
__device__ __forceinline__ void col2im(float* acc, const T* col, const long long* table, long long channels,
                                       long long ins, long long outs, long long taps, long long plane0) {
    GRID_STRIDE(i, channels * taps * outs) {
        const long long p = column_source(i, table, ins, outs, taps, plane0);
        if (p >= 0) atomicAdd(acc + p, to_float(col[i]));
    }
}

// y[n, c, positions] += bias[c].
template <typename T>
__device__ __forceinline__ void channel_bias(T* y, const T* bias, long long channels, long long positions,
                                             long long n) {
    GRID_STRIDE(i, n) y[i] = from_float<T>(to_float(y[i]) + to_float(bias[(i / positions) % channels]));
}

// The first largest element of window o of a plane (NaN wins), or -1.
template <typename T>
__device__ __forceinline__ long long window_max(const T* plane, const long long* table, long long o,
                                                long long taps) {
    long long best = -1;
    for (long long t = 0; t < taps; ++t) {
        const long long p = table[o * taps + t];
        if (p < 0) continue;
        const float v = to_float(plane[p]);
        if (best < 0) {
            best = p;
            continue;
        }
        const float b = to_float(plane[best]);
        if (!isnan(b) && (isnan(v) || v > b)) best = p;
    }
    return best;
}

template <typename T>
__device__ __forceinline__ void max_pool_fwd(T* y, const T* x, const long long* table, long long planes,
                                             long long ins, long long outs, long long taps) {
    GRID_STRIDE(i, planes * outs) {
        const T* plane = x + (i / outs) * ins;
        const long long p = window_max(plane, table, i % outs, taps);
        y[i] = p < 0 ? from_float<T>(-__int_as_float(0x7f800000)) : plane[p];
    }
}

// The mean of each window over divisors[o] (its taps inside the input, or
// inside the padded input where padding counts).
template <typename T>
__device__ __forceinline__ void avg_pool_fwd(T* y, const T* x, const long long* table, const long long* divisors,
                                             long long planes, long long ins, long long outs, long long taps) {
    GRID_STRIDE(i, planes * outs) {
        const long long o = i % outs;
        const T* plane = x + (i / outs) * ins;
        float sum = 0.0f;
        for (long long t = 0; t < taps; ++t) {
            const long long p = table[o * taps + t];
            if (p >= 0) sum += to_float(plane[p]);
        }
        y[i] = from_float<T>(sum / (float)max(divisors[o], 1LL));
    }
}

template <typename T>
__device__ __forceinline__ void max_pool_bwd(float* acc, const T* x, const T* dy, const long long* table,
                                             long long planes, long long ins, long long outs, long long taps) {
    GRID_STRIDE(i, planes * outs) {
        const long long base = (i / outs) * ins;
        const long long p = window_max(x + base, table, i % outs, taps);
        if (p >= 0) atomicAdd(acc + base + p, to_float(dy[i]));
    }
}

template <typename T>
__device__ __forceinline__ void avg_pool_bwd(float* acc, const T* dy, const long long* table,
                                             const long long* divisors, long long planes, long long ins,
                                             long long outs, long long taps) {
    GRID_STRIDE(i, planes * outs) {
        const long long o = i % outs;
        const long long base = (i / outs) * ins;
        const float share = to_float(dy[i]) / (float)max(divisors[o], 1LL);
        for (long long t = 0; t < taps; ++t) {
            const long long p = table[o * taps + t];
            if (p >= 0) atomicAdd(acc + base + p, share);
        }
    }
}

#define CONV_KERNELS(T, S)                                                                                  \
    KERNEL im2col_##S(T* col, const T* x, const long long* table, long long channels, long long ins,         \
                      long long outs, long long taps, long long plane0) {                                   \
        im2col(col, x, table, channels, ins, outs, taps, plane0);                                           \
    }                                                                                                       \
    KERNEL col2im_##S(float* acc, const T* col, const long long* table, long long channels, long long ins,   \
                      long long outs, long long taps, long long plane0) {                                   \
        col2im(acc, col, table, channels, ins, outs, taps, plane0);                                         \
    }                                                                                                       \
    KERNEL channel_bias_##S(T* y, const T* bias, long long channels, long long positions, long long n) {     \
        channel_bias(y, bias, channels, positions, n);                                                      \
    }                                                                                                       \
    KERNEL max_pool_fwd_##S(T* y, const T* x, const long long* table, const long long*, long long planes,    \
                            long long ins, long long outs, long long taps) {                                \
        max_pool_fwd(y, x, table, planes, ins, outs, taps);                                                 \
    }                                                                                                       \
    KERNEL avg_pool_fwd_##S(T* y, const T* x, const long long* table, const long long* divisors,             \
                            long long planes, long long ins, long long outs, long long taps) {              \
        avg_pool_fwd(y, x, table, divisors, planes, ins, outs, taps);                                       \
    }                                                                                                       \
    KERNEL max_pool_bwd_##S(float* acc, const T* x, const T* dy, const long long* table, const long long*,   \
                            long long planes, long long ins, long long outs, long long taps) {              \
        max_pool_bwd(acc, x, dy, table, planes, ins, outs, taps);                                           \
    }                                                                                                       \
    KERNEL avg_pool_bwd_##S(float* acc, const T*, const T* dy, const long long* table,                       \
                            const long long* divisors, long long planes, long long ins, long long outs,     \
                            long long taps) {                                                               \
        avg_pool_bwd(acc, dy, table, divisors, planes, ins, outs, taps);                                    \
    }
FOR_EACH_TYPE(CONV_KERNELS)
