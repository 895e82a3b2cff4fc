// attention_fused_tc.cu — FlashAttention-2 style fused attention on tensor cores (f16/bf16).
//
// One CTA = NWARPS warps x 16 packed query rows (see attention_util.cuh for the packing)
// against the key tiles of its split. Per key tile of BLOCK_N keys:
//   S = Q Kᵀ        mma.sync m16n8k16 (f32 accumulate), Q and K fragments by ldmatrix
//   online softmax  in registers, exp2 with scale*log2(e) folded in, quad shuffles
//   O += P V        P re-packed from the S accumulators, V fragments by ldmatrix.trans
// K and V tiles are double-buffered with cp.async (zero-fill past Sk and past D), so the
// copy of tile t+1 overlaps the math of tile t. Nothing of size [Sq, Sk] touches memory.
//
// Compile-time: NXRT_T (__half | __nv_bfloat16), HEAD_DIM (padded head dim, multiple of 16,
// <= 256), BLOCK_N (keys per tile, multiple of 16), NWARPS. The runtime D may be smaller
// than HEAD_DIM (multiple of 8); the extra columns are zero-filled. Shared memory (bytes):
// (16*NWARPS + 4*BLOCK_N) * (HEAD_DIM + 8) * 2 for Q, K[2], V[2], plus
// 16*NWARPS * ((BLOCK_N + 4) * 4 + 8) for the f32 score tile of the general logit path and the
// rows' mask offsets — the Python launcher uses the same formula.
//
// Logits: tiles that every row sees in full and that have no softcap or mask take a fast
// path (scale * log2e on the registers). Others (causal diagonal, window edges, the last
// partial tile, softcap, mask) go through a per-warp f32 tile in shared memory and one
// rolled loop, which keeps the unrolled code (and NVRTC's compile time) small.
//
// splits == 1: normalised output in O's dtype. splits > 1: unnormalised f32 partial O plus
// (running max in log2 units, row sum) per row into ws_o / ws_ml for attention_rows.cu's
// combine kernel.
#include "attention_util.cuh"

#ifndef NXRT_T
#define NXRT_T __half
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#ifndef BLOCK_N
#define BLOCK_N 64
#endif
#ifndef NWARPS
#define NWARPS 4
#endif

typedef NXRT_T T;
using namespace nxrt;
using namespace nxrt_attn;

constexpr int DP = HEAD_DIM;
constexpr int BN = BLOCK_N;
constexpr int BM = 16 * NWARPS;
constexpr int NT = 32 * NWARPS;
constexpr int PITCH = DP + 8;          // 16-byte row pad: 8 rows of an ldmatrix hit 8 bank groups
constexpr int CHUNKS = DP / 8;         // 16-byte chunks per row
constexpr int KSTEPS = DP / 16;        // k-steps of Q Kᵀ
constexpr int NS = BN / 8;             // n8 tiles of S per warp
constexpr int NO = DP / 8;             // n8 tiles of O per warp
constexpr bool Q_IN_REGS = DP <= 128;  // DP = 256 would cost 64 more registers per thread
constexpr int SPITCH = BN + 4;  // f32 score tile row pitch
constexpr int SMEM_BYTES = (BM + 4 * BN) * PITCH * 2 + BM * (SPITCH * 4 + 8);

static_assert(DP % 16 == 0 && DP <= 256, "HEAD_DIM must be a multiple of 16, at most 256");
static_assert(BN % 16 == 0, "BLOCK_N must be a multiple of 16");
static_assert(((DP / 8 + 1) & 1) == 1, "PITCH must be an odd number of 16-byte chunks");

// Issue the cp.async copies of BN key rows starting at key `j0` into `dst` (zero-fill past
// Sk and past D). `base` points at key 0 of this (batch, kv head).
__device__ __forceinline__ void load_kv_tile(T* dst, const T* __restrict__ base, long long s_s,
                                             int j0, int Sk, int D, int tid) {
#pragma unroll 4
    for (int id = tid; id < BN * CHUNKS; id += NT) {
        const int rr = id / CHUNKS;
        const int c = id - rr * CHUNKS;
        const int j = j0 + rr;
        const bool ok = j < Sk && c * 8 < D;
        const T* src = ok ? base + (long long)j * s_s + c * 8 : base;
        cp_async_16(dst + rr * PITCH + c * 8, src, ok ? 16 : 0);
    }
}

extern "C" __global__ void __launch_bounds__(NT)
attn_fused_tc(NXRT_ATTN_FUSED_PARAMS(T)) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // A launch with less shared memory than this build needs would write out of bounds.
    if (dynamic_smem_bytes() < (unsigned)SMEM_BYTES) return;
    T* Qs = reinterpret_cast<T*>(smem_raw);
    T* Ks = Qs + BM * PITCH;          // [2][BN][PITCH]
    T* Vs = Ks + 2 * BN * PITCH;      // [2][BN][PITCH]
    // Per-row mask offsets (-1: none) and the f32 score tile [BM][SPITCH] of the general path.
    long long* Moff = reinterpret_cast<long long*>(Vs + 2 * BN * PITCH);
    float* Ss = reinterpret_cast<float*>(Moff + BM);
    const bool has_mask = mask_planes > 0;

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int g = lane >> 2;   // accumulator row within the warp's 16 (and g + 8)
    const int t4 = lane & 3;   // accumulator column pair

    const Work w = decode_work(BM, BN, B, H, Hkv, Sq, Sk, causal, window, row_tiles, splits);
    const T* kbase = k + w.b * k_sb + w.kvh * k_sh;
    const T* vbase = v + w.b * v_sb + w.kvh * v_sh;
    const float scale_log2 = scale * kLog2e;

    // The two rows this thread accumulates.
    Row rows[2];
#pragma unroll
    for (int x = 0; x < 2; ++x)
        rows[x] = make_row(w, w.r0 + warp * 16 + g + 8 * x, B, H, Sq, Sk, q_sb, q_sh, q_ss,
                           o_sb, o_sh, o_ss, mask_planes);
    const bool warp_active = w.r0 + warp * 16 < w.R;
    for (int rr = tid; rr < BM; rr += NT)
        Moff[rr] = make_row(w, w.r0 + rr, B, H, Sq, Sk, q_sb, q_sh, q_ss, o_sb, o_sh, o_ss,
                            mask_planes).m_off;
    // Softcap or mask: the general logit transform (else scores only need scale*log2e).
    const bool general = softcap > 0.f || has_mask;

    float o[NO][4];
#pragma unroll
    for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m_run[2] = {neg_inf(), neg_inf()};
    float l_run[2] = {0.f, 0.f};  // this thread's share of the row sums (quad-reduced at the end)

    if (w.t_beg < w.t_end) {
        // Prologue: group 0 = Q tile + K tile 0, group 1 = V tile 0.
        for (int id = tid; id < BM * CHUNKS; id += NT) {
            const int rr = id / CHUNKS;
            const int c = id - rr * CHUNKS;
            const int r = w.r0 + rr;
            const bool ok = r < w.R && c * 8 < D;
            const T* src = q;
            if (ok) {
                const int i = r / w.G;
                const int h = w.kvh * w.G + (r - i * w.G);
                src = q + w.b * q_sb + h * q_sh + i * q_ss + c * 8;
            }
            cp_async_16(Qs + rr * PITCH + c * 8, src, ok ? 16 : 0);
        }
        load_kv_tile(Ks, kbase, k_ss, w.t_beg * BN, Sk, D, tid);
        cp_async_commit();
        load_kv_tile(Vs, vbase, v_ss, w.t_beg * BN, Sk, D, tid);
        cp_async_commit();

        unsigned qf[Q_IN_REGS ? KSTEPS : 1][4];
        const T* q_ld = Qs + (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * PITCH +
                        (lane >> 4) * 8;

        for (int t = w.t_beg; t < w.t_end; ++t) {
            const int st = (t - w.t_beg) & 1;
            const int kb = t * BN;
            T* Kst = Ks + st * BN * PITCH;
            T* Vst = Vs + st * BN * PITCH;

            // K[t] (and Q) landed: all groups but the newest (V[t]) are complete.
            cp_async_wait<1>();
            __syncthreads();

            float s[NS][4];
#pragma unroll
            for (int n = 0; n < NS; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
            if (warp_active) {
                if (Q_IN_REGS && t == w.t_beg) {
#pragma unroll
                    for (int ks = 0; ks < (Q_IN_REGS ? KSTEPS : 1); ++ks)
                        ldmatrix_x4(qf[ks], q_ld + ks * 16);
                }
                // K fragments: matrices (keys n0..+7 | n0+8..+15) x (dims k0..+7 | k0+8..+15).
                const T* k_ld = Kst + ((lane & 7) + (lane >> 4) * 8) * PITCH +
                                ((lane >> 3) & 1) * 8;
#pragma unroll
                for (int ks = 0; ks < KSTEPS; ++ks) {
                    unsigned a[4];
                    if (Q_IN_REGS) {
                        a[0] = qf[Q_IN_REGS ? ks : 0][0];
                        a[1] = qf[Q_IN_REGS ? ks : 0][1];
                        a[2] = qf[Q_IN_REGS ? ks : 0][2];
                        a[3] = qf[Q_IN_REGS ? ks : 0][3];
                    } else {
                        ldmatrix_x4(a, q_ld + ks * 16);
                    }
#pragma unroll
                    for (int np = 0; np < NS / 2; ++np) {
                        unsigned kf[4];
                        ldmatrix_x4(kf, k_ld + np * 16 * PITCH + ks * 16);
                        mma_16816<T>(s[2 * np], a, kf[0], kf[1]);
                        mma_16816<T>(s[2 * np + 1], a, kf[2], kf[3]);
                    }
                }
            }

            // K[t+1] into the other buffer: every warp finished reading it (K[t-1]) before
            // the barrier above.
            if (t + 1 < w.t_end)
                load_kv_tile(Ks + (st ^ 1) * BN * PITCH, kbase, k_ss, kb + BN, Sk, D, tid);
            cp_async_commit();

            if (warp_active) {
                const bool check = !tile_fully_visible(w, BM, kb, BN, Sq, Sk, causal, window);
                float tmax[2] = {neg_inf(), neg_inf()};
                if (!general && !check) {
#pragma unroll
                    for (int n = 0; n < NS; ++n) {
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            s[n][e] *= scale_log2;
                            tmax[e >> 1] = fmaxf(tmax[e >> 1], s[n][e]);
                        }
                    }
                } else {
                    // Through this warp's rows of Ss: fragment -> shared, one rolled loop over
                    // 16 x BN elements (lanes along keys: coalesced mask reads), back.
                    float* Sw = Ss + warp * 16 * SPITCH;
#pragma unroll
                    for (int n = 0; n < NS; ++n) {
                        Sw[g * SPITCH + n * 8 + 2 * t4] = s[n][0];
                        Sw[g * SPITCH + n * 8 + 2 * t4 + 1] = s[n][1];
                        Sw[(g + 8) * SPITCH + n * 8 + 2 * t4] = s[n][2];
                        Sw[(g + 8) * SPITCH + n * 8 + 2 * t4 + 1] = s[n][3];
                    }
                    __syncwarp();
#pragma unroll 1
                    for (int id = lane; id < 16 * BN; id += 32) {
                        const int rr = id / BN;
                        const int cc = id - rr * BN;
                        const int j = kb + cc;
                        const int r = w.r0 + warp * 16 + rr;
                        const int p = Sk - Sq + r / w.G;
                        float x = Sw[rr * SPITCH + cc] * scale;
                        if (softcap > 0.f) x = softcap * fast_tanh(x / softcap);
                        const long long moff = Moff[warp * 16 + rr];
                        if (moff >= 0 && j < Sk) x += to_float(mask[moff + j]);
                        x *= kLog2e;
                        if (!visible(j, p, Sk, causal, window)) x = neg_inf();
                        Sw[rr * SPITCH + cc] = x;
                    }
                    __syncwarp();
#pragma unroll
                    for (int n = 0; n < NS; ++n) {
                        s[n][0] = Sw[g * SPITCH + n * 8 + 2 * t4];
                        s[n][1] = Sw[g * SPITCH + n * 8 + 2 * t4 + 1];
                        s[n][2] = Sw[(g + 8) * SPITCH + n * 8 + 2 * t4];
                        s[n][3] = Sw[(g + 8) * SPITCH + n * 8 + 2 * t4 + 1];
                        tmax[0] = fmaxf(tmax[0], fmaxf(s[n][0], s[n][1]));
                        tmax[1] = fmaxf(tmax[1], fmaxf(s[n][2], s[n][3]));
                    }
                }
                float alpha[2], m_use[2];
#pragma unroll
                for (int x = 0; x < 2; ++x) {
                    tmax[x] = quad_max(tmax[x]);
                    alpha[x] = online_rescale(m_run[x], tmax[x], m_use[x]);
                    l_run[x] *= alpha[x];
                }
#pragma unroll
                for (int n = 0; n < NS; ++n) {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const float p = exp2f(s[n][e] - m_use[e >> 1]);
                        s[n][e] = p;
                        l_run[e >> 1] += p;
                    }
                }
#pragma unroll
                for (int n = 0; n < NO; ++n) {
                    o[n][0] *= alpha[0];
                    o[n][1] *= alpha[0];
                    o[n][2] *= alpha[1];
                    o[n][3] *= alpha[1];
                }
            }

            // V[t] landed: the pending groups are V[t] and K[t+1]; wait for the older one.
            cp_async_wait<1>();
            __syncthreads();

            if (warp_active) {
                // V fragments (.trans): matrices (keys k0..+7 | k0+8..+15) x (dims n0 | n0+8).
                const T* v_ld = Vst + ((lane & 7) + ((lane >> 3) & 1) * 8) * PITCH +
                                (lane >> 4) * 8;
#pragma unroll
                for (int kk = 0; kk < BN / 16; ++kk) {
                    // P as the A operand: the S accumulators of n-tiles 2kk and 2kk+1.
                    unsigned pa[4];
                    pa[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
                    pa[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
                    pa[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                    pa[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
                    for (int dp = 0; dp < NO / 2; ++dp) {
                        unsigned vf[4];
                        ldmatrix_x4_trans(vf, v_ld + kk * 16 * PITCH + dp * 16);
                        mma_16816<T>(o[2 * dp], pa, vf[0], vf[1]);
                        mma_16816<T>(o[2 * dp + 1], pa, vf[2], vf[3]);
                    }
                }
            }

            // V[t+1] into the other buffer: every warp finished P V[t-1] before the barrier.
            if (t + 1 < w.t_end)
                load_kv_tile(Vs + (st ^ 1) * BN * PITCH, vbase, v_ss, kb + BN, Sk, D, tid);
            cp_async_commit();
        }
        cp_async_wait<0>();
    }

    if (!warp_active) return;
    float l_row[2];
#pragma unroll
    for (int x = 0; x < 2; ++x) l_row[x] = quad_sum(l_run[x]);

    if (splits == 1) {
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            if (!rows[x].valid) continue;
            // A row that saw no visible key has l = 0 and o = 0: it gives zeros.
            const float inv = l_row[x] > 0.f ? 1.f / l_row[x] : 0.f;
            T* orow = out + rows[x].o_off;
#pragma unroll
            for (int n = 0; n < NO; ++n) {
                const int c = n * 8 + 2 * t4;
                if (c < D) store2(orow + c, o[n][2 * x] * inv, o[n][2 * x + 1] * inv);
            }
        }
    } else {
        const long long n_rows = (long long)B * H * Sq;
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            if (!rows[x].valid) continue;
            const long long pr = (long long)w.split * n_rows + rows[x].orow;
            float* po = ws_o + pr * D;
#pragma unroll
            for (int n = 0; n < NO; ++n) {
                const int c = n * 8 + 2 * t4;
                if (c < D) store2(po + c, o[n][2 * x], o[n][2 * x + 1]);
            }
            if (t4 == 0) {
                ws_ml[2 * pr] = m_run[x];
                ws_ml[2 * pr + 1] = l_row[x];
            }
        }
    }
}
