// attention_util.cuh — what the fused attention kernels (tensor-core and SIMT) share:
// the kernel parameter list, the CTA -> work decode (GQA row packing, split-KV ranges),
// per-row visibility (causal bottom-right, local window), and the split partial stores.
//
// Row packing: all G = H / Hkv query heads that share one KV head are processed by the same
// CTAs. Packed row r in [0, G*Sq) is query i = r / G of head h = kvh*G + r % G, so a tile of
// rows covers consecutive query positions and decode (Sq = 1) still gives G useful rows.
//
// Positions: query i sits at p = Sk - Sq + i (bottom-right alignment). Key j is visible iff
// j < Sk, (!causal || j <= p) and (window < 0 || p - j <= window).
#pragma once

#include "common.cuh"

namespace nxrt_attn {

// The parameter list of every fused entry (the Python launcher passes them in this order).
#define NXRT_ATTN_FUSED_PARAMS(T)                                                          \
    const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,             \
    const T* __restrict__ mask, T* __restrict__ out, float* __restrict__ ws_o,             \
    float* __restrict__ ws_ml, int B, int H, int Hkv, int Sq, int Sk, int D,               \
    long long q_sb, long long q_sh, long long q_ss, long long k_sb, long long k_sh,        \
    long long k_ss, long long v_sb, long long v_sh, long long v_ss, long long o_sb,        \
    long long o_sh, long long o_ss, int mask_planes, int causal, int window, float scale,  \
    float softcap, int row_tiles, int splits

// What one CTA works on.
struct Work {
    int b, kvh, G, R;   // batch, kv head, group size, packed rows of this (b, kvh)
    int r0;             // first packed row of the tile
    int t_beg, t_end;   // key tiles [t_beg, t_end) of this split (empty when t_beg >= t_end)
    int split;
};

// Work item (x, y): x = (b*Hkv + kvh) * row_tiles + (reversed) row tile, y = split. Row
// tiles run last-first so that, under causal masking, the longest tiles start first.
__device__ __forceinline__ Work decode_work_at(int x, int y, int BM, int BN, int B, int H,
                                               int Hkv, int Sq, int Sk, int causal, int window,
                                               int row_tiles, int splits) {
    Work w;
    const int bh = x / row_tiles;
    const int mt = row_tiles - 1 - (x - bh * row_tiles);
    w.b = bh / Hkv;
    w.kvh = bh - w.b * Hkv;
    w.G = H / Hkv;
    w.R = w.G * Sq;
    w.r0 = mt * BM;
    w.split = y;
    const int r_last = min(w.r0 + BM, w.R) - 1;
    // Key range any row of the tile can see (64-bit: p - window may go far below zero).
    const long long p_lo = (long long)Sk - Sq + w.r0 / w.G;
    const long long p_hi = (long long)Sk - Sq + r_last / w.G;
    long long kv_end = causal ? min((long long)Sk, p_hi + 1) : (long long)Sk;
    long long kv_beg = window >= 0 ? max(0LL, p_lo - window) : 0LL;
    int t_beg = 0, t_end = 0;
    if (kv_end > kv_beg) {
        t_beg = (int)(kv_beg / BN);
        t_end = (int)((kv_end + BN - 1) / BN);
    }
    const int n = t_end - t_beg;
    const int per = (n + splits - 1) / splits;
    w.t_beg = t_beg + w.split * per;
    w.t_end = min(t_end, w.t_beg + per);
    return w;
}

// The work item of this CTA in a one-CTA-per-item grid: (blockIdx.x, blockIdx.y).
__device__ __forceinline__ Work decode_work(int BM, int BN, int B, int H, int Hkv, int Sq,
                                            int Sk, int causal, int window, int row_tiles,
                                            int splits) {
    return decode_work_at(blockIdx.x, blockIdx.y, BM, BN, B, H, Hkv, Sq, Sk, causal, window,
                          row_tiles, splits);
}

// One packed row's addressing and masking facts.
struct Row {
    bool valid;
    int i, h, p;            // query index, head, absolute position
    long long orow;         // output row (b*H + h)*Sq + i, the split partials' row index
    long long q_off, o_off; // element offsets of the row in Q and in the output
    long long m_off;        // element offset of the row in the mask, -1 without a mask
};

__device__ __forceinline__ Row make_row(const Work& w, int r, int B, int H, int Sq, int Sk,
                                        long long q_sb, long long q_sh, long long q_ss,
                                        long long o_sb, long long o_sh, long long o_ss,
                                        int mask_planes) {
    Row row;
    row.valid = r < w.R;
    const int rr = row.valid ? r : 0;
    row.i = rr / w.G;
    row.h = w.kvh * w.G + (rr - row.i * w.G);
    row.p = Sk - Sq + row.i;
    row.orow = ((long long)w.b * H + row.h) * Sq + row.i;
    row.q_off = w.b * q_sb + row.h * q_sh + row.i * q_ss;
    row.o_off = w.b * o_sb + row.h * o_sh + row.i * o_ss;
    row.m_off = -1;
    if (mask_planes > 0 && row.valid) {
        // planes: 1 (shared), B (per batch) or B*H (per batch and head).
        long long plane = 0;
        if (mask_planes == B * H) plane = (long long)w.b * H + row.h;
        else if (mask_planes == B) plane = w.b;
        row.m_off = (plane * Sq + row.i) * (long long)Sk;
    }
    return row;
}

__device__ __forceinline__ bool visible(int j, int p, int Sk, int causal, int window) {
    return j < Sk && (!causal || j <= p) && (window < 0 || p - j <= window);
}

// Whether every row of [r0, r0+BM) sees every key of [kb, kb+BN) (no per-element masking).
__device__ __forceinline__ bool tile_fully_visible(const Work& w, int BM, int kb, int BN,
                                                   int Sq, int Sk, int causal, int window) {
    if (kb + BN > Sk) return false;
    const int r_last = min(w.r0 + BM, w.R) - 1;
    const long long p_lo = (long long)Sk - Sq + w.r0 / w.G;
    const long long p_hi = (long long)Sk - Sq + r_last / w.G;
    if (causal && (long long)(kb + BN - 1) > p_lo) return false;
    if (window >= 0 && p_hi - kb > window) return false;
    return true;
}

// tanh through one exp2: absolute error ~1e-7, enough for logits of f16/bf16 inputs (the
// f32 path keeps tanhf) and far less code than tanhf when unrolled over a fragment.
__device__ __forceinline__ float fast_tanh(float x) {
    return 1.f - 2.f / (1.f + exp2f(x * (2.f * nxrt::kLog2e)));
}

// Score (raw q.k) -> log2-domain logit: scale, softcap, additive mask, visibility.
template <typename T>
__device__ __forceinline__ float logit2(float s, float scale, float scale_log2, float softcap,
                                        const T* __restrict__ mask, const Row& row, int j,
                                        int Sk, int causal, int window, bool check) {
    float x;
    if (softcap > 0.f || row.m_off >= 0) {
        x = s * scale;
        if (softcap > 0.f) x = softcap * tanhf(x / softcap);
        if (row.m_off >= 0 && j < Sk) x += nxrt::to_float(mask[row.m_off + j]);
        x *= nxrt::kLog2e;
    } else {
        x = s * scale_log2;
    }
    if (check && !visible(j, row.p, Sk, causal, window)) x = nxrt::neg_inf();
    return x;
}

// Online-softmax step for one row: new max `m_new` from the running max `m` and this tile's
// max; returns the factor that rescales the old accumulators and sets `m_use`, the
// subtrahend for this tile's exponentials (0 while the row has seen no visible key, so that
// -inf - -inf never makes a NaN).
__device__ __forceinline__ float online_rescale(float& m, float tile_max, float& m_use) {
    const float m_new = fmaxf(m, tile_max);
    m_use = (m_new == nxrt::neg_inf()) ? 0.f : m_new;
    const float alpha = exp2f(m - m_use);  // m = -inf gives 0
    m = m_new;
    return alpha;
}

// Scores -> probabilities in place for the two rows an mma.sync thread holds (e >> 1 picks
// the row): p = exp2(s - m_use), accumulated into the running row sums.
template <int N>
__device__ __forceinline__ void exp_rows(float (&s)[N][4], const float (&m_use)[2], float (&l)[2]) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const float p = exp2f(s[n][e] - m_use[e >> 1]);
            s[n][e] = p;
            l[e >> 1] += p;
        }
    }
}

// The output accumulators of those two rows times this tile's rescale factors.
template <int N>
__device__ __forceinline__ void scale_rows(float (&o)[N][4], const float (&alpha)[2]) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
        o[n][0] *= alpha[0];
        o[n][1] *= alpha[0];
        o[n][2] *= alpha[1];
        o[n][3] *= alpha[1];
    }
}

}  // namespace nxrt_attn
