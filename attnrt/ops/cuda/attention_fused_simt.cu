// attention_fused_simt.cu — fused attention on CUDA cores, fp32 math (f32, and the f16/bf16
// fallback for head dims or strides the tensor-core kernel cannot read).
//
// One CTA = 8 warps x 4 packed query rows (32 rows) against BLOCK_N = 32 keys per step;
// lane j of a warp owns key j of the tile while scoring and output columns lane + 32k while
// accumulating P V. Q, K and V tiles are staged in shared memory as f32 (K with an odd row
// pitch so that 32 lanes reading 32 different key rows hit 32 banks). All arithmetic is
// IEEE fp32 (no tf32), so f32 inputs meet a 1e-5 relative tolerance.
//
// Compile-time: NXRT_T (float | __half | __nv_bfloat16), DMAX (largest runtime D, multiple
// of 32). Any runtime D <= DMAX works, with any element strides of the B, H and S dims.
// Shared memory (bytes): 4 * (32*D + 32*KP + 32*D + 8*4*32) with KP = D | 1.
#include "attention_util.cuh"

#ifndef NXRT_T
#define NXRT_T float
#endif
#ifndef DMAX
#define DMAX 256
#endif

typedef NXRT_T T;
using namespace nxrt;
using namespace nxrt_attn;

constexpr int NWARPS = 8;
constexpr int RW = 4;                // rows per warp
constexpr int BM = NWARPS * RW;      // 32
constexpr int BN = 32;               // keys per tile (one per lane)
constexpr int NT = NWARPS * 32;
constexpr int KD = DMAX / 32;        // output columns per lane

static_assert(DMAX % 32 == 0 && DMAX <= 256, "DMAX must be a multiple of 32, at most 256");

extern "C" __global__ void __launch_bounds__(NT)
attn_fused_simt(NXRT_ATTN_FUSED_PARAMS(T)) {
    extern __shared__ __align__(16) float smem_f[];
    const int KP = D | 1;  // odd pitch: conflict-free column reads across 32 key rows
    const unsigned need = 4u * (unsigned)(BM * D + BN * KP + BN * D + NWARPS * RW * BN);
    if (D > DMAX || dynamic_smem_bytes() < need) return;
    float* Qs = smem_f;              // [BM][D]
    float* Ks = Qs + BM * D;         // [BN][KP]
    float* Vs = Ks + BN * KP;        // [BN][D]
    float* Ps = Vs + BN * D;         // [NWARPS][RW][BN]

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;

    const Work w = decode_work(BM, BN, B, H, Hkv, Sq, Sk, causal, window, row_tiles, splits);
    const T* kbase = k + w.b * k_sb + w.kvh * k_sh;
    const T* vbase = v + w.b * v_sb + w.kvh * v_sh;
    const float scale_log2 = scale * kLog2e;

    Row rows[RW];
#pragma unroll
    for (int x = 0; x < RW; ++x)
        rows[x] = make_row(w, w.r0 + warp * RW + x, B, H, Sq, Sk, q_sb, q_sh, q_ss, o_sb, o_sh,
                           o_ss, mask_planes);
    const bool warp_active = w.r0 + warp * RW < w.R;

    float o[RW][KD];
    float m_run[RW], l_run[RW];
#pragma unroll
    for (int x = 0; x < RW; ++x) {
        m_run[x] = neg_inf();
        l_run[x] = 0.f;
#pragma unroll
        for (int c = 0; c < KD; ++c) o[x][c] = 0.f;
    }

    if (w.t_beg < w.t_end) {
        for (int id = tid; id < BM * D; id += NT) {
            const int rr = id / D;
            const int c = id - rr * D;
            const int r = w.r0 + rr;
            float val = 0.f;
            if (r < w.R) {
                const int i = r / w.G;
                const int h = w.kvh * w.G + (r - i * w.G);
                val = to_float(q[w.b * q_sb + h * q_sh + i * q_ss + c]);
            }
            Qs[id] = val;
        }
    }

    float* Pw = Ps + warp * RW * BN;
    for (int t = w.t_beg; t < w.t_end; ++t) {
        const int kb = t * BN;
        // Every warp is done with the previous tile (and Qs is written) before we overwrite.
        __syncthreads();
        for (int id = tid; id < BN * D; id += NT) {
            const int rr = id / D;
            const int c = id - rr * D;
            const int j = kb + rr;
            float kv = 0.f, vv = 0.f;
            if (j < Sk) {
                kv = to_float(kbase[j * k_ss + c]);
                vv = to_float(vbase[j * v_ss + c]);
            }
            Ks[rr * KP + c] = kv;
            Vs[id] = vv;
        }
        __syncthreads();
        if (!warp_active) continue;

        float sc[RW];
#pragma unroll
        for (int x = 0; x < RW; ++x) sc[x] = 0.f;
        const float* qw = Qs + warp * RW * D;
        const float* kr = Ks + lane * KP;
        for (int c = 0; c < D; ++c) {
            const float kv = kr[c];
#pragma unroll
            for (int x = 0; x < RW; ++x) sc[x] = fmaf(qw[x * D + c], kv, sc[x]);
        }

        const bool check = !tile_fully_visible(w, BM, kb, BN, Sq, Sk, causal, window);
        const int j = kb + lane;
#pragma unroll
        for (int x = 0; x < RW; ++x) {
            const float xl = logit2<T>(sc[x], scale, scale_log2, softcap, mask, rows[x], j, Sk,
                                       causal, window, check);
            float m_use;
            const float alpha = online_rescale(m_run[x], warp_max(xl), m_use);
            const float p = exp2f(xl - m_use);
            l_run[x] = l_run[x] * alpha + warp_sum(p);
#pragma unroll
            for (int c = 0; c < KD; ++c) o[x][c] *= alpha;
            Pw[x * BN + lane] = p;
        }
        __syncwarp();
        const int jn = min(BN, Sk - kb);
        for (int jj = 0; jj < jn; ++jj) {
            const float* vr = Vs + jj * D;
            float vv[KD];
#pragma unroll
            for (int c = 0; c < KD; ++c) vv[c] = (lane + 32 * c < D) ? vr[lane + 32 * c] : 0.f;
#pragma unroll
            for (int x = 0; x < RW; ++x) {
                const float p = Pw[x * BN + jj];
#pragma unroll
                for (int c = 0; c < KD; ++c) o[x][c] = fmaf(p, vv[c], o[x][c]);
            }
        }
        __syncwarp();
    }

    if (!warp_active) return;
    const long long n_rows = (long long)B * H * Sq;
#pragma unroll
    for (int x = 0; x < RW; ++x) {
        if (!rows[x].valid) continue;
        if (splits == 1) {
            const float inv = l_run[x] > 0.f ? 1.f / l_run[x] : 0.f;
            T* orow = out + rows[x].o_off;
#pragma unroll
            for (int c = 0; c < KD; ++c)
                if (lane + 32 * c < D) orow[lane + 32 * c] = from_float<T>(o[x][c] * inv);
        } else {
            const long long pr = (long long)w.split * n_rows + rows[x].orow;
            float* po = ws_o + pr * D;
#pragma unroll
            for (int c = 0; c < KD; ++c)
                if (lane + 32 * c < D) po[lane + 32 * c] = o[x][c];
            if (lane == 0) {
                ws_ml[2 * pr] = m_run[x];
                ws_ml[2 * pr + 1] = l_run[x];
            }
        }
    }
}
