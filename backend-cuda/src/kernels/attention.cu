// Flash attention (fp32 accumulation, online softmax, K/V tiles in shared
// memory). q [B, Hq, Sq, D], k/v [B, Hk, Sk, D], o like q; head h reads kv
// head h / (Hq / Hk). Causal: query i sees key j iff j <= i (upper-left
// aligned, as Op::Attention), or iff j <= qpos[i] when the query positions
// are given (a context-parallel rank's balanced chunks; null otherwise).
// Tiles of hidden keys are skipped either way. D ≤ FLASH_MAX_D (checked by
// the executor; a larger D makes the kernels return without writing).
//
// An optional mask, as Op::Attention's: a bool mask (bytes) keeps nonzero, a
// float mask (of the run's type) is added to the scaled scores; keys from
// `mlen` on are masked. It is read through element strides (msb, msh, msq,
// msk) over (batch, query head, query, key), 0 where it is broadcast.
//
// Scores s = scale·q·k + bias stay in natural units, so a bias of -3.4e38
// (what exported masks use) is added as it is, as the reference adds it.
// The forward pass keeps, per query row, the running maximum m and the sum l
// of exp(s - m), and writes both (stats [B·Hq·Sq][2]: m, ln l) for the
// backward pass. Kept apart, not summed into one log-sum-exp, so that a row
// whose every score carries such a bias gets p = exp((s - m) - ln l) exactly
// as the forward pass had it: m + ln l would round ln l away.
//
// Threads work in groups of 4 consecutive lanes on one row (a query row in the
// forward pass, a key row in the backward pass); lane `part` of a group owns
// the columns col(j) = (j / 4)·16 + part·4 + j % 4, so each group reads a row
// of a tile as float4s and dot products finish with two shuffles.
// Kernels are specialised for D ≤ 64 and D ≤ 128.

#define FLASH_BLOCK_Q 32
#define FLASH_BLOCK_K 32
#define FLASH_THREADS 128
#define FLASH_MAX_D 128
// Query rows per step of the backward kernel.
#define FLASH_BWD_ROWS 16

#define LOG2E 1.4426950408889634f

__device__ __forceinline__ int flash_col(int j, int part) { return (j >> 2) * 16 + part * 4 + (j & 3); }

__device__ __forceinline__ float group_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// Σ_j a[j]·row[col(j)] over this lane's columns of a shared-memory row.
template <int NJ>
__device__ __forceinline__ float partial_dot(const float (&a)[NJ], const float* row, int part) {
    float s = 0.0f;
#pragma unroll
    for (int jj = 0; jj < NJ / 4; ++jj) {
        const float4 x = *reinterpret_cast<const float4*>(row + jj * 16 + part * 4);
        s += a[4 * jj] * x.x + a[4 * jj + 1] * x.y + a[4 * jj + 2] * x.z + a[4 * jj + 3] * x.w;
    }
    return s;
}

// acc[j] += w·row[col(j)]
template <int NJ>
__device__ __forceinline__ void axpy(float (&acc)[NJ], float w, const float* row, int part) {
#pragma unroll
    for (int jj = 0; jj < NJ / 4; ++jj) {
        const float4 x = *reinterpret_cast<const float4*>(row + jj * 16 + part * 4);
        acc[4 * jj] += w * x.x;
        acc[4 * jj + 1] += w * x.y;
        acc[4 * jj + 2] += w * x.z;
        acc[4 * jj + 3] += w * x.w;
    }
}

// Loads rows [r0, r0 + n_rows) of a [rows, D] matrix into shared [n_rows][DMAX]
// (float, zero-padded past `rows` and D), optionally a second matrix alongside.
template <int DMAX, typename T>
__device__ __forceinline__ void load_tile(float* dst, const T* src, float* dst2, const T* src2, int r0, int n_rows,
                                          int rows, int D) {
    for (int e = threadIdx.x; e < n_rows * DMAX; e += FLASH_THREADS) {
        const int r = r0 + e / DMAX, c = e % DMAX;
        const bool ok = r < rows && c < D;
        const long long at = (long long)r * D + c;
        dst[e] = ok ? to_float(src[at]) : 0.0f;
        if (dst2) dst2[e] = ok ? to_float(src2[at]) : 0.0f;
    }
}

// One line of a mask's scores: entry n is at n·step from the start; entries
// from `len` on are masked. No pointer set: no mask.
template <typename T>
struct MaskLine {
    const T* f;
    const unsigned char* b;
    long long step;
    int len;

    // The bias of entry n: -inf where masked.
    __device__ __forceinline__ float at(int n) const {
        if (!f && !b) return 0.0f;
        if (n >= len) return -F32_INF;
        if (b) return b[n * step] ? 0.0f : -F32_INF;
        return to_float(f[n * step]);
    }
};

// A mask as the kernels read it (see the top of this file).
template <typename T>
struct FlashMask {
    const T* f;
    const unsigned char* b;
    long long sb, sh, sq, sk;
    int len;

    // The biases of query i's scores, along the keys.
    __device__ __forceinline__ MaskLine<T> keys(int batch, int head, int i) const {
        const long long at = batch * sb + head * sh + i * sq;
        return MaskLine<T>{f ? f + at : f, b ? b + at : b, sk, len};
    }
    // The biases of key j's scores, along the queries (all masked past `len`).
    __device__ __forceinline__ MaskLine<T> queries(int batch, int head, int j) const {
        const long long at = batch * sb + head * sh + (long long)min(j, len - 1) * sk;
        return MaskLine<T>{f ? f + at : f, b ? b + at : b, sq, j < len ? 0x7fffffff : 0};
    }
};

// The last key query qi sees under a causal mask (-1 for none), at most Sk - 1.
__device__ __forceinline__ int flash_last_key(const long long* qpos, int qi, int Sk) {
    const long long p = qpos ? qpos[qi] : (long long)qi;
    return (int)max(-1LL, min(p, (long long)Sk - 1));
}

// Which kv head query head h reads, and the offsets of (b, h) and (b, kv head).
struct Heads {
    int b, h, hk;
};
__device__ __forceinline__ Heads flash_heads(int Hq, int Hk) {
    const int bh = blockIdx.y, h = bh % Hq;
    return Heads{bh / Hq, h, h / (Hq / Hk)};
}

template <int DMAX, typename T>
__device__ __forceinline__ void flash_fwd(float* smem, T* o, float* stats, const T* q, const T* k, const T* v,
                                          const FlashMask<T> mask, int Hq, int Hk, int Sq, int Sk, int D,
                                          float scale, int causal, const long long* qpos) {
    constexpr int NJ = DMAX / 4, BQ = FLASH_BLOCK_Q, BK = FLASH_BLOCK_K;
    float* ks = smem;
    float* vs = smem + BK * DMAX;
    const int row = threadIdx.x >> 2, part = threadIdx.x & 3;
    const Heads hd = flash_heads(Hq, Hk);
    const int q0 = blockIdx.x * BQ, qi = q0 + row;
    const long long q_row = (long long)blockIdx.y * Sq + qi;
    const long long kv_base = ((long long)hd.b * Hk + hd.hk) * Sk * D;

    // This lane's columns of the query row, pre-scaled.
    float qr[NJ], acc[NJ];
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        const int c = flash_col(j, part);
        qr[j] = (qi < Sq && c < D) ? to_float(q[q_row * D + c]) * scale : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -F32_INF, l = 0.0f;
    const MaskLine<T> bias = mask.keys(hd.b, hd.h, min(qi, Sq - 1));
    // The last key this row sees (-1 past the queries); keys past the last
    // one any row of the tile sees are skipped.
    const int last = qi >= Sq ? -1 : causal ? flash_last_key(qpos, qi, Sk) : Sk - 1;
    int k_end = Sk;
    if (causal) {
        k_end = 0;
        for (int i = q0; i < min(q0 + BQ, Sq); ++i) k_end = max(k_end, flash_last_key(qpos, i, Sk) + 1);
    }
    for (int k0 = 0; k0 < k_end; k0 += BK) {
        __syncthreads();
        load_tile<DMAX>(ks, k + kv_base, vs, v + kv_base, k0, BK, Sk, D);
        __syncthreads();
        float s[BK];
        float m_new = m;
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            const float dot = group_sum(partial_dot(qr, ks + kk * DMAX, part));
            const int key = k0 + kk;
            s[kk] = key <= last ? dot + bias.at(key) : -F32_INF;
            m_new = fmaxf(m_new, s[kk]);
        }
        // All keys so far masked: keep exponents finite (every p is 0).
        const float m_use = m_new == -F32_INF ? 0.0f : m_new;
        const float alpha = exp2f((m - m_use) * LOG2E);
        l *= alpha;
#pragma unroll
        for (int j = 0; j < NJ; ++j) acc[j] *= alpha;
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            const float p = exp2f((s[kk] - m_use) * LOG2E);
            l += p;
            axpy(acc, p, vs + kk * DMAX, part);
        }
        m = m_new;
    }
    if (qi >= Sq) return;
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        const int c = flash_col(j, part);
        if (c < D) o[q_row * D + c] = from_float<T>(acc[j] * inv);
    }
    if (part == 0) {
        stats[2 * q_row] = l > 0.0f ? m : -F32_INF;
        stats[2 * q_row + 1] = l > 0.0f ? logf(l) : 0.0f;
    }
}

// delta[r] = Σ_d o[r, d]·dO[r, d], one warp per row, any launch geometry
// (blockDim.x a multiple of 32).
template <typename T>
__device__ __forceinline__ void flash_bwd_pre(float* delta, const T* o, const T* dO, long long rows, int D) {
    const int lane = threadIdx.x & 31;
    const long long warps = ((long long)gridDim.x * blockDim.x) >> 5;
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += warps) {
        float s = 0.0f;
        for (int d = lane; d < D; d += 32) s += to_float(o[r * D + d]) * to_float(dO[r * D + d]);
        s = warp_sum(s);
        if (lane == 0) delta[r] = s;
    }
}

// One block per (key tile, b, query head): the key rows' K and V live in
// registers; query rows stream through shared memory FLASH_BWD_ROWS at a
// time. dK, dV accumulate in registers and are added to the float buffers at
// the end (query heads sharing a kv head add into the same rows); dQ gets
// this key tile's contribution per step (atomicAdd).
template <int DMAX, typename T>
__device__ __forceinline__ void flash_bwd(float* smem, float* dq_acc, float* dk_acc, float* dv_acc, const T* q,
                                          const T* k, const T* v, const T* dO, const float* stats,
                                          const float* delta, const FlashMask<T> mask, int Hq, int Hk, int Sq,
                                          int Sk, int D, float scale, int causal, const long long* qpos) {
    constexpr int NJ = DMAX / 4, BK = FLASH_BLOCK_K, BR = FLASH_BWD_ROWS, DS_STRIDE = BK + 1;
    float* ks = smem;                      // [BK][DMAX]: K tile for dQ
    float* qs = ks + BK * DMAX;            // [BR][DMAX]
    float* dos = qs + BR * DMAX;           // [BR][DMAX]
    float* ds_s = dos + BR * DMAX;         // [BR][BK + 1]: scale·dS
    float* max_s = ds_s + BR * DS_STRIDE;  // [BR]: the rows' m
    float* logl_s = max_s + BR;            // [BR]: the rows' ln l
    float* delta_s = logl_s + BR;          // [BR]
    const int row = threadIdx.x >> 2, part = threadIdx.x & 3;
    const Heads hd = flash_heads(Hq, Hk);
    const int k0 = blockIdx.x * BK, key = k0 + row;
    const long long kv_base = ((long long)hd.b * Hk + hd.hk) * Sk * D;
    const long long q_base = (long long)blockIdx.y * Sq;

    load_tile<DMAX>(ks, k + kv_base, (float*)0, (const T*)0, k0, BK, Sk, D);
    __syncthreads();
    float kr[NJ], vr[NJ], dk[NJ], dv[NJ];
    const MaskLine<T> bias = mask.queries(hd.b, hd.h, min(key, Sk - 1));
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        const int c = flash_col(j, part);
        kr[j] = ks[row * DMAX + c] * scale;
        vr[j] = (key < Sk && c < D) ? to_float(v[kv_base + (long long)key * D + c]) : 0.0f;
        dk[j] = 0.0f;
        dv[j] = 0.0f;
    }
    // Queries before the first one that sees this tile's first key are
    // skipped; at given positions, each step of rows none of which sees it.
    const int q_begin = causal && !qpos ? k0 : 0;
    for (int r0 = q_begin; r0 < Sq; r0 += BR) {
        if (causal && qpos) {
            const int qi = r0 + (int)threadIdx.x;
            const bool sees = threadIdx.x < BR && qi < Sq && flash_last_key(qpos, qi, Sk) >= k0;
            if (!__syncthreads_or(sees)) continue;
        }
        __syncthreads();
        load_tile<DMAX>(qs, q + q_base * D, dos, dO + q_base * D, r0, BR, Sq, D);
        if (threadIdx.x < BR) {
            const int qi = r0 + threadIdx.x;
            // A row without a visible key (m = -inf) gets p = 0 below.
            max_s[threadIdx.x] = qi < Sq ? stats[2 * (q_base + qi)] : -F32_INF;
            logl_s[threadIdx.x] = qi < Sq ? stats[2 * (q_base + qi) + 1] : 0.0f;
            delta_s[threadIdx.x] = qi < Sq ? delta[q_base + qi] : 0.0f;
        }
        __syncthreads();
        for (int i = 0; i < BR; ++i) {
            const int qi = r0 + i;
            const float s = group_sum(partial_dot(kr, qs + i * DMAX, part));
            const float dp = group_sum(partial_dot(vr, dos + i * DMAX, part));
            const bool visible = qi < Sq && key < Sk && (!causal || key <= flash_last_key(qpos, qi, Sk)) &&
                                 max_s[i] != -F32_INF;
            const float p =
                visible ? exp2f(((s + bias.at(qi) - max_s[i]) - logl_s[i]) * LOG2E) : 0.0f;
            const float ds = p * (dp - delta_s[i]);
            axpy(dv, p, dos + i * DMAX, part);
            axpy(dk, ds, qs + i * DMAX, part);
            if (part == 0) ds_s[i * DS_STRIDE + row] = ds * scale;
        }
        __syncthreads();
        // dQ[r0 + i, :] += Σ_key scale·dS[i, key]·K[key, :], 8 lanes per query row.
        constexpr int NQ = DMAX / 8;
        const int i = threadIdx.x >> 3, part8 = threadIdx.x & 7, qi = r0 + i;
        float dq[NQ];
#pragma unroll
        for (int j = 0; j < NQ; ++j) dq[j] = 0.0f;
#pragma unroll 4
        for (int kk = 0; kk < BK; ++kk) {
            const float w = ds_s[i * DS_STRIDE + kk];
#pragma unroll
            for (int jj = 0; jj < NQ / 4; ++jj) {
                const float4 x = *reinterpret_cast<const float4*>(ks + kk * DMAX + jj * 32 + part8 * 4);
                dq[4 * jj] += w * x.x;
                dq[4 * jj + 1] += w * x.y;
                dq[4 * jj + 2] += w * x.z;
                dq[4 * jj + 3] += w * x.w;
            }
        }
        if (qi < Sq) {
#pragma unroll
            for (int j = 0; j < NQ; ++j) {
                const int c = (j >> 2) * 32 + part8 * 4 + (j & 3);
                if (c < D) atomicAdd(dq_acc + (q_base + qi) * D + c, dq[j]);
            }
        }
    }
    if (key >= Sk) return;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        const int c = flash_col(j, part);
        if (c < D) {
            atomicAdd(dk_acc + kv_base + (long long)key * D + c, dk[j] * scale);
            atomicAdd(dv_acc + kv_base + (long long)key * D + c, dv[j]);
        }
    }
}

// Shared memory for the largest specialisation (D ≤ 128), in floats.
#define FLASH_FWD_SMEM (2 * FLASH_BLOCK_K * FLASH_MAX_D)
#define FLASH_BWD_SMEM \
    ((FLASH_BLOCK_K + 2 * FLASH_BWD_ROWS) * FLASH_MAX_D + FLASH_BWD_ROWS * (FLASH_BLOCK_K + 1) + 3 * FLASH_BWD_ROWS)

#define FLASH_KERNEL extern "C" __global__ void __launch_bounds__(FLASH_THREADS)
#define FLASH_MASK_PARAMS(T) \
    const T *mask_f, const unsigned char *mask_b, long long msb, long long msh, long long msq, long long msk, int mlen
#define FLASH_MASK(T) \
    FlashMask<T> { mask_f, mask_b, msb, msh, msq, msk, mlen }
#define ATTENTION_KERNELS(T, S)                                                                             \
    FLASH_KERNEL flash_attn_fwd_##S(T* o, float* stats, const T* q, const T* k, const T* v,                 \
                                    FLASH_MASK_PARAMS(T), int B, int Hq, int Hk, int Sq, int Sk, int D,     \
                                    float scale, int causal, const long long* qpos) {                       \
        __shared__ __align__(16) float smem[FLASH_FWD_SMEM];                                                \
        const FlashMask<T> mask = FLASH_MASK(T);                                                            \
        if (D <= 64)                                                                                        \
            flash_fwd<64>(smem, o, stats, q, k, v, mask, Hq, Hk, Sq, Sk, D, scale, causal, qpos);           \
        else if (D <= FLASH_MAX_D)                                                                          \
            flash_fwd<FLASH_MAX_D>(smem, o, stats, q, k, v, mask, Hq, Hk, Sq, Sk, D, scale, causal, qpos);  \
    }                                                                                                       \
    KERNEL flash_attn_bwd_pre_##S(float* delta, const T* o, const T* dO, long long rows, int D) {           \
        flash_bwd_pre(delta, o, dO, rows, D);                                                               \
    }                                                                                                       \
    FLASH_KERNEL flash_attn_bwd_##S(float* dq_acc, float* dk_acc, float* dv_acc, const T* q, const T* k,    \
                                    const T* v, const T* dO, const float* stats, const float* delta,        \
                                    FLASH_MASK_PARAMS(T), int B, int Hq, int Hk, int Sq, int Sk, int D,     \
                                    float scale, int causal, const long long* qpos) {                       \
        __shared__ __align__(16) float smem[FLASH_BWD_SMEM];                                                \
        const FlashMask<T> mask = FLASH_MASK(T);                                                            \
        if (D <= 64)                                                                                        \
            flash_bwd<64>(smem, dq_acc, dk_acc, dv_acc, q, k, v, dO, stats, delta, mask, Hq, Hk, Sq, Sk, D, \
                          scale, causal, qpos);                                                             \
        else if (D <= FLASH_MAX_D)                                                                          \
            flash_bwd<FLASH_MAX_D>(smem, dq_acc, dk_acc, dv_acc, q, k, v, dO, stats, delta, mask, Hq, Hk,   \
                                   Sq, Sk, D, scale, causal, qpos);                                         \
    }
FOR_EACH_TYPE(ATTENTION_KERNELS)
