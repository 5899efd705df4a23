// Flash attention (fp32 accumulation, online softmax, K/V tiles in shared
// memory). q [B, Hq, Sq, D], k/v [B, Hk, Sk, D], o like q, lse [B, Hq, Sq]
// (natural log); head h reads kv head h / (Hq / Hk). Causal: query i sees
// key j iff j <= i (upper-left aligned, as Op::Attention). D ≤ FLASH_MAX_D (checked by the executor; a
// larger D makes the kernels return without writing).
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
#define LN2 0.6931471805599453f

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

// Which kv head query head h reads, and the offsets of (b, h) and (b, kv head).
struct Heads {
    int b, h, hk;
};
__device__ __forceinline__ Heads flash_heads(int Hq, int Hk) {
    const int bh = blockIdx.y, h = bh % Hq;
    return Heads{bh / Hq, h, h / (Hq / Hk)};
}

template <int DMAX, typename T>
__device__ __forceinline__ void flash_fwd(float* smem, T* o, float* lse, const T* q, const T* k, const T* v, int Hq,
                                          int Hk, int Sq, int Sk, int D, float scale, int causal) {
    constexpr int NJ = DMAX / 4, BQ = FLASH_BLOCK_Q, BK = FLASH_BLOCK_K;
    float* ks = smem;
    float* vs = smem + BK * DMAX;
    const int row = threadIdx.x >> 2, part = threadIdx.x & 3;
    const Heads hd = flash_heads(Hq, Hk);
    const int q0 = blockIdx.x * BQ, qi = q0 + row, shift = 0;  // keys visible to query i: j <= i + shift
    const long long q_row = (long long)blockIdx.y * Sq + qi;
    const long long kv_base = ((long long)hd.b * Hk + hd.hk) * Sk * D;

    // This lane's columns of the query row, pre-scaled into base-2 logits.
    float qr[NJ], acc[NJ];
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        const int c = flash_col(j, part);
        qr[j] = (qi < Sq && c < D) ? to_float(q[q_row * D + c]) * (scale * LOG2E) : 0.0f;
        acc[j] = 0.0f;
    }
    float m = -F32_INF, l = 0.0f;
    // Keys past the last one the tile's last row sees are skipped.
    const int k_end = causal ? min(Sk, min(q0 + BQ, Sq) + shift) : Sk;
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
            const bool visible = key < Sk && (!causal || key <= qi + shift);
            s[kk] = visible ? dot : -F32_INF;
            m_new = fmaxf(m_new, s[kk]);
        }
        // All keys so far masked: keep exponents finite (every p is 0).
        const float m_use = m_new == -F32_INF ? 0.0f : m_new;
        const float alpha = exp2f(m - m_use);
        l *= alpha;
#pragma unroll
        for (int j = 0; j < NJ; ++j) acc[j] *= alpha;
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            const float p = exp2f(s[kk] - m_use);
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
    if (part == 0) lse[q_row] = l > 0.0f ? (m + log2f(l)) * LN2 : -F32_INF;
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
                                          const T* k, const T* v, const T* dO, const float* lse,
                                          const float* delta, int Hq, int Hk, int Sq, int Sk, int D, float scale,
                                          int causal) {
    constexpr int NJ = DMAX / 4, BK = FLASH_BLOCK_K, BR = FLASH_BWD_ROWS, DS_STRIDE = BK + 1;
    float* ks = smem;                      // [BK][DMAX]: K tile for dQ
    float* qs = ks + BK * DMAX;            // [BR][DMAX]
    float* dos = qs + BR * DMAX;           // [BR][DMAX]
    float* ds_s = dos + BR * DMAX;         // [BR][BK + 1]: scale·dS
    float* lse_s = ds_s + BR * DS_STRIDE;  // [BR]: lse·log2(e)
    float* delta_s = lse_s + BR;           // [BR]
    const int row = threadIdx.x >> 2, part = threadIdx.x & 3;
    const Heads hd = flash_heads(Hq, Hk);
    const int k0 = blockIdx.x * BK, key = k0 + row, shift = 0;  // as in the forward pass
    const long long kv_base = ((long long)hd.b * Hk + hd.hk) * Sk * D;
    const long long q_base = (long long)blockIdx.y * Sq;

    load_tile<DMAX>(ks, k + kv_base, (float*)0, (const T*)0, k0, BK, Sk, D);
    __syncthreads();
    float kr[NJ], vr[NJ], dk[NJ], dv[NJ];
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
        const int c = flash_col(j, part);
        kr[j] = ks[row * DMAX + c] * (scale * LOG2E);
        vr[j] = (key < Sk && c < D) ? to_float(v[kv_base + (long long)key * D + c]) : 0.0f;
        dk[j] = 0.0f;
        dv[j] = 0.0f;
    }
    // Queries before the first one that sees this tile's first key are skipped.
    const int q_begin = causal ? max(0, k0 - shift) : 0;
    for (int r0 = q_begin; r0 < Sq; r0 += BR) {
        __syncthreads();
        load_tile<DMAX>(qs, q + q_base * D, dos, dO + q_base * D, r0, BR, Sq, D);
        if (threadIdx.x < BR) {
            const int qi = r0 + threadIdx.x;
            lse_s[threadIdx.x] = qi < Sq ? lse[q_base + qi] * LOG2E : F32_INF;
            delta_s[threadIdx.x] = qi < Sq ? delta[q_base + qi] : 0.0f;
        }
        __syncthreads();
        for (int i = 0; i < BR; ++i) {
            const int qi = r0 + i;
            const float s = group_sum(partial_dot(kr, qs + i * DMAX, part));
            const float dp = group_sum(partial_dot(vr, dos + i * DMAX, part));
            const bool visible = qi < Sq && key < Sk && (!causal || key <= qi + shift);
            const float p = visible ? exp2f(s - lse_s[i]) : 0.0f;
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
    ((FLASH_BLOCK_K + 2 * FLASH_BWD_ROWS) * FLASH_MAX_D + FLASH_BWD_ROWS * (FLASH_BLOCK_K + 1) + 2 * FLASH_BWD_ROWS)

#define FLASH_KERNEL extern "C" __global__ void __launch_bounds__(FLASH_THREADS)
#define ATTENTION_KERNELS(T, S)                                                                          \
    FLASH_KERNEL flash_attn_fwd_##S(T* o, float* lse, const T* q, const T* k, const T* v, int B, int Hq, \
                                    int Hk, int Sq, int Sk, int D, float scale, int causal) {            \
        __shared__ __align__(16) float smem[FLASH_FWD_SMEM];                                             \
        if (D <= 64)                                                                                     \
            flash_fwd<64>(smem, o, lse, q, k, v, Hq, Hk, Sq, Sk, D, scale, causal);                      \
        else if (D <= FLASH_MAX_D)                                                                       \
            flash_fwd<FLASH_MAX_D>(smem, o, lse, q, k, v, Hq, Hk, Sq, Sk, D, scale, causal);             \
    }                                                                                                    \
    KERNEL flash_attn_bwd_pre_##S(float* delta, const T* o, const T* dO, long long rows, int D) {        \
        flash_bwd_pre(delta, o, dO, rows, D);                                                            \
    }                                                                                                    \
    FLASH_KERNEL flash_attn_bwd_##S(float* dq_acc, float* dk_acc, float* dv_acc, const T* q, const T* k, \
                                    const T* v, const T* dO, const float* lse, const float* delta, int B, \
                                    int Hq, int Hk, int Sq, int Sk, int D, float scale, int causal) {    \
        __shared__ __align__(16) float smem[FLASH_BWD_SMEM];                                             \
        if (D <= 64)                                                                                     \
            flash_bwd<64>(smem, dq_acc, dk_acc, dv_acc, q, k, v, dO, lse, delta, Hq, Hk, Sq, Sk, D,      \
                          scale, causal);                                                                \
        else if (D <= FLASH_MAX_D)                                                                       \
            flash_bwd<FLASH_MAX_D>(smem, dq_acc, dk_acc, dv_acc, q, k, v, dO, lse, delta, Hq, Hk, Sq, Sk, \
                                   D, scale, causal);                                                    \
    }
FOR_EACH_TYPE(ATTENTION_KERNELS)
