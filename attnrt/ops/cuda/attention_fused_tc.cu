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
//
// With -DDEC_STAGES this file builds the single-kernel decode entry `attn_decode` instead (see
// the section at the end): the same fragment code, one 16-row block per CTA, every warp on
// its own 16 keys of each tile, a DEC_STAGES-deep cp.async ring and the split-KV combine done
// in-kernel by the last CTA of each row tile.
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
constexpr int NT = 32 * NWARPS;
constexpr int PITCH = DP + 8;          // 16-byte row pad: 8 rows of an ldmatrix hit 8 bank groups
constexpr int CHUNKS = DP / 8;         // 16-byte chunks per row
constexpr int KSTEPS = DP / 16;        // k-steps of Q Kᵀ
constexpr int NO = DP / 8;             // n8 tiles of O per warp
constexpr bool Q_IN_REGS = DP <= 128;  // DP = 256 would cost 64 more registers per thread
#ifndef DEC_STAGES
constexpr int BM = 16 * NWARPS;
constexpr int NS = BN / 8;             // n8 tiles of S per warp
constexpr int SPITCH = BN + 4;  // f32 score tile row pitch
constexpr int SMEM_BYTES = (BM + 4 * BN) * PITCH * 2 + BM * (SPITCH * 4 + 8);
#endif

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

#ifndef DEC_STAGES
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
                exp_rows(s, m_use, l_run);
                scale_rows(o, alpha);
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
#endif  // !DEC_STAGES

#ifdef DEC_STAGES
// ------------------------------------------------------------------------------------------
// attn_decode — single-kernel decode (packed rows G*Sq <= 16), compile-time DEC_STAGES and
// NWARPS (BLOCK_N must be 16 * NWARPS). Decode moves K and V once and does ~4 FLOP per byte,
// so what matters is bytes in flight and fixed costs, not the math:
//   * CTA = one (batch, kv head) row tile of at most 16 packed rows (one mma row block) and
//     one split of the key range; grid = (B*Hkv, splits), sized by the host to one wave.
//   * Each tile has 16*NWARPS keys; warp w owns keys [16w, 16w+16) of every tile and keeps its
//     own online softmax (max, sum, O in mma accumulators), so every warp loads and computes.
//   * K and V tiles stream through a DEC_STAGES-deep ring of 16-byte cp.async (zero-fill past
//     Sk and D), in one of two schedules (the host's `warp_ring` argument):
//       - warp ring (warp_ring = 1, chosen for grids of at most one CTA per SM): each warp
//         copies only its own 16 keys of each stage, waits on its own copies and refills the
//         stage it just read, with no CTA barrier per tile: all DEC_STAGES tiles in flight;
//       - CTA ring (warp_ring = 0, two CTAs per SM): every thread copies a share of every
//         row, DEC_STAGES-1 tiles in flight while one is computed, one CTA barrier per tile
//         (the four warps' reads stay within one tile: measured 1-3 % faster at long Sk).
//   * End: the warps' states merge through shared memory (the ring, now idle) in fixed warp
//     order. splits == 1: normalised output. splits > 1: the CTA writes its f32 partial
//     (unnormalised O, max in log2 units, sum) to ws_o / ws_ml (the layout attn_combine
//     reads), then arrives on counters[row tile]; the last of the `splits` CTAs merges every
//     split's partial in fixed split order (bitwise the same whichever CTA comes last) and
//     re-arms the counter to zero for the next launch. No atomics touch the math.
//   * DEC_CLUSTER = C (sm_90+, splits == C): the C split CTAs of a row tile form one thread-block
//     cluster (rank = split). After a cluster barrier (every loop done, so every ring is idle)
//     each CTA stores its partial into rank 0's ring through distributed shared memory, arrives
//     once more and leaves; rank 0 merges exactly as the last CTA above does (same order, same
//     bits) but from shared memory: no partials, counters, fences or atomics in global memory.
// Logits: scale*log2e on the fast path; softcap, mask, causal and window per element (eight
// elements per thread per tile: registers only).
constexpr int STAGES = DEC_STAGES;
constexpr int DNW = NWARPS;
constexpr int DBN = 16 * NWARPS;   // keys per tile (16 per warp)
constexpr int DNT = 32 * NWARPS;
constexpr int DROWS = 16;          // packed rows per CTA
constexpr int DEC_MAX_SPLITS = 64;  // the host clamps splits to this (weights in shared memory)
constexpr int OPITCH = DP + 8;     // f32 pitch of the per-warp O rows in the merge
constexpr int DEC_STAGE_ELEMS = 2 * DBN * PITCH;  // K then V of one tile
constexpr int DEC_Q_BYTES = DROWS * PITCH * 2;
constexpr int DEC_RING_BYTES = STAGES * DEC_STAGE_ELEMS * 2;
constexpr int DEC_SMEM_BYTES = DEC_Q_BYTES + DEC_RING_BYTES;
constexpr int WPITCH = DEC_MAX_SPLITS + 1;  // per-row split weights, then the row sum
constexpr int DEC_MERGE_FLOATS = DNW * DROWS * OPITCH + 2 * DNW * DROWS + DROWS * WPITCH;
constexpr int DEC_LOADS = DBN * CHUNKS / DNT;  // 16-byte K (and V) chunks per thread per tile
#ifndef DEC_CLUSTER
#define DEC_CLUSTER 0
#endif
constexpr int CL = DEC_CLUSTER;    // cluster split merge: CTAs per cluster (0: through memory)
static_assert(CL == 0 || (CL >= 2 && CL <= 8), "DEC_CLUSTER must be 0 or in [2, 8]");
static_assert(DEC_MERGE_FLOATS % 4 == 0, "the cluster receive area must be 16-byte aligned");

static_assert(BLOCK_N == DBN, "the decode build needs BLOCK_N == 16 * NWARPS");
static_assert(STAGES >= 2 && STAGES <= 8, "DEC_STAGES must be in [2, 8]");
static_assert(DBN * CHUNKS % DNT == 0 && 16 * CHUNKS % 32 == 0,
              "every thread issues the same number of copies");
static_assert(DEC_Q_BYTES % 16 == 0, "the ring must start 16-byte aligned");
static_assert(DEC_MERGE_FLOATS * 4 <= DEC_RING_BYTES, "the merge scratch must fit in the ring");
static_assert(2 * DROWS * WPITCH <= DNW * DROWS * OPITCH, "the staged (max, sum) fit the warps' O");

// cp.async of tile keys [j0, j0 + DBN) of K and V into one ring stage (K rows, then V rows).
// WR (warp ring): warp `warp` copies only its own 16 keys (rows 16 warp .. 16 warp + 15 of the
// stage), the rows it alone reads, so the ring needs no CTA barrier, only the warp's own.
// Otherwise every thread copies a share of every row (a CTA barrier before the reads).
template <bool WR>
__device__ __forceinline__ void dec_load_tile(T* dst, const T* __restrict__ kbase,
                                              const T* __restrict__ vbase, long long k_ss,
                                              long long v_ss, int j0, int Sk, int D, int tid) {
    T* kd = dst;
    T* vd = dst + DBN * PITCH;
#pragma unroll
    for (int it = 0; it < DEC_LOADS; ++it) {
        const int id = WR ? (tid & 31) + it * 32 : tid + it * DNT;
        const int rr0 = id / CHUNKS;
        const int c = id - rr0 * CHUNKS;
        const int rr = WR ? (tid >> 5) * 16 + rr0 : rr0;
        const int j = j0 + rr;
        const bool ok = j < Sk && c * 8 < D;
        const T* ks = ok ? kbase + (long long)j * k_ss + c * 8 : kbase;
        const T* vs = ok ? vbase + (long long)j * v_ss + c * 8 : vbase;
        cp_async_16(kd + rr * PITCH + c * 8, ks, ok ? 16 : 0);
        cp_async_16(vd + rr * PITCH + c * 8, vs, ok ? 16 : 0);
    }
}

// Four consecutive elements (8-byte aligned for 16-bit T).
__device__ __forceinline__ void dec_store4(T* p, float a, float b, float c, float d) {
    uint2 u;
    u.x = pack2<T>(a, b);
    u.y = pack2<T>(c, d);
    *reinterpret_cast<uint2*>(p) = u;
}

// A partial's float(s): from global memory through L2 (other CTAs wrote it) or from this
// CTA's shared memory (the cluster merge).
template <bool SHARED> __device__ __forceinline__ float dec_ld(const float* p) {
    return SHARED ? *p : __ldcg(p);
}
template <bool SHARED> __device__ __forceinline__ float4 dec_ld4(const float* p) {
    return SHARED ? *reinterpret_cast<const float4*>(p) : __ldcg(reinterpret_cast<const float4*>(p));
}

// The per-warp ring's barrier: named barrier 1 + warp over the warp's 32 threads. It orders
// the lanes' cp.async writes (each after its own wait_group) before the other lanes' reads,
// and the reads before the refill. __syncwarp orders them too, but compute-sanitizer's
// racecheck does not take it as ordering cp.async writes: on the H200 it reported those writes
// racing with the cluster merge's later stores into the same ring; with bar.sync it is clean.
__device__ __forceinline__ void dec_warp_bar(int warp) {
    asm volatile("bar.sync %0, 32;\n" ::"r"(1 + warp) : "memory");
}

#ifndef DEC_FAST_SPLITS
#define DEC_FAST_SPLITS 8  // dec_merge_splits' one-round path: at most this many splits
#endif

// The last step of the split merge: every split's partial of each of the R rows (unnormalised
// O, max in log2 units, sum) in fixed split order, normalised into the output. Partial s of
// row r: O at po + o_row(r) * D + s * o_split, (max, sum) at pml + 2 * o_row(r) + s * ml_split,
// where o_row(r) = r in shared memory and the row's output row s_orow[r] in global memory.
template <bool SHARED>
__device__ __forceinline__ void dec_merge_splits(const float* po, const float* pml,
                                                 long long o_split, long long ml_split,
                                                 const long long* s_orow,
                                                 const long long* s_ooff, float* Wt, float* Ms,
                                                 T* __restrict__ out, int R, int D, int splits,
                                                 int tid) {
    const int D4 = D >> 2;
    if (R * D4 <= DNT && splits <= DEC_FAST_SPLITS) {
        // One (row, 4 columns) per thread and few splits (the usual GQA decode): every load of
        // the merge in one round into registers, no barrier. The same arithmetic in the same
        // order as below, so the same bits.
        if (tid >= R * D4) return;
        const int r = tid / D4;
        const int c = (tid - r * D4) * 4;
        const long long orow = SHARED ? (long long)r : s_orow[r];
        float ms[DEC_FAST_SPLITS], ls[DEC_FAST_SPLITS];
        float4 ov[DEC_FAST_SPLITS];
#pragma unroll
        for (int s = 0; s < DEC_FAST_SPLITS; ++s) {
            if (s < splits) {
                ms[s] = dec_ld<SHARED>(pml + 2 * orow + s * ml_split);
                ls[s] = dec_ld<SHARED>(pml + 2 * orow + s * ml_split + 1);
                ov[s] = dec_ld4<SHARED>(po + orow * D + c + s * o_split);
            }
        }
        float M = neg_inf();
#pragma unroll
        for (int s = 0; s < DEC_FAST_SPLITS; ++s)
            if (s < splits) M = fmaxf(M, ms[s]);
        float L = 0.f;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int s = 0; s < DEC_FAST_SPLITS; ++s) {
            if (s >= splits || ms[s] == neg_inf()) continue;
            const float a = exp2f(ms[s] - M);
            L += a * ls[s];
            if (a == 0.f) continue;
            acc.x += a * ov[s].x;
            acc.y += a * ov[s].y;
            acc.z += a * ov[s].z;
            acc.w += a * ov[s].w;
        }
        const float inv = L > 0.f ? 1.f / L : 0.f;
        dec_store4(out + s_ooff[r] + c, acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
        return;
    }
    // Every (max, sum) pair in one round of independent loads, staged as Ms [R][WPITCH] and
    // Ls (the same arithmetic below reads them from shared memory).
    float* Ls = Ms + DROWS * WPITCH;
    for (int i = tid; i < R * splits; i += DNT) {
        const int r = i / splits;
        const int s = i - r * splits;
        const float* ml = pml + 2 * (SHARED ? (long long)r : s_orow[r]) + s * ml_split;
        Ms[r * WPITCH + s] = dec_ld<SHARED>(ml);
        Ls[r * WPITCH + s] = dec_ld<SHARED>(ml + 1);
    }
    __syncthreads();
    for (int r = tid; r < R; r += DNT) {
        float M = neg_inf();
        for (int s = 0; s < splits; ++s) M = fmaxf(M, Ms[r * WPITCH + s]);
        float L = 0.f;
        for (int s = 0; s < splits; ++s) {
            float a = 0.f;
            const float ms = Ms[r * WPITCH + s];
            if (ms != neg_inf()) {  // all -inf: L = 0, the row gives zeros
                a = exp2f(ms - M);
                L += a * Ls[r * WPITCH + s];
            }
            Wt[r * WPITCH + s] = a;
        }
        Wt[r * WPITCH + DEC_MAX_SPLITS] = L;
    }
    __syncthreads();
    for (int idx = tid; idx < R * D4; idx += DNT) {
        const int r = idx / D4;
        const int c = (idx - r * D4) * 4;
        const float* wr = Wt + r * WPITCH;
        const float* p = po + (SHARED ? (long long)r : s_orow[r]) * D + c;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 4
        for (int s = 0; s < splits; ++s) {
            const float a = wr[s];
            if (a == 0.f) continue;  // an empty split (or one that underflows): adds nothing
            const float4 ov = dec_ld4<SHARED>(p + s * o_split);
            acc.x += a * ov.x;
            acc.y += a * ov.y;
            acc.z += a * ov.z;
            acc.w += a * ov.w;
        }
        const float L = wr[DEC_MAX_SPLITS];
        const float inv = L > 0.f ? 1.f / L : 0.f;
        dec_store4(out + s_ooff[r] + c, acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
    }
}

extern "C" __global__ void __launch_bounds__(DNT, 2)
#if DEC_CLUSTER
__cluster_dims__(1, DEC_CLUSTER, 1)
#endif
attn_decode(NXRT_ATTN_FUSED_PARAMS(T), unsigned* __restrict__ counters, int warp_ring) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    __shared__ long long s_orow[DROWS];  // output row (b*H + h)*Sq + i of each packed row
    __shared__ long long s_ooff[DROWS];  // its element offset in the output
    __shared__ int s_last;
    // Launch mistakes the host never makes (uniform: the whole grid leaves): too little
    // shared memory, more splits than the weight table holds, no counters to merge with,
    // more rows than one mma row block; a cluster build with splits other than its cluster
    // size or partials that do not fit rank 0's ring (the whole cluster leaves).
    if (dynamic_smem_bytes() < (unsigned)DEC_SMEM_BYTES) return;
    if (splits < 1 || splits > DEC_MAX_SPLITS) return;
    if (CL ? splits != CL : (splits > 1 && counters == nullptr)) return;
    if (row_tiles != 1 || (long long)(H / Hkv) * Sq > DROWS) return;
    if (CL && (DEC_MERGE_FLOATS + (long long)CL * (H / Hkv) * Sq * (D + 2)) * 4 > DEC_RING_BYTES)
        return;

    T* Qs = reinterpret_cast<T*>(smem_raw);  // [DROWS][PITCH]
    T* ring = Qs + DROWS * PITCH;            // [STAGES][K | V][DBN][PITCH]

    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int g = lane >> 2;
    const int t4 = lane & 3;

    const Work w = decode_work(DROWS, DBN, B, H, Hkv, Sq, Sk, causal, window, 1, splits);
    const T* kbase = k + w.b * k_sb + w.kvh * k_sh;
    const T* vbase = v + w.b * v_sb + w.kvh * v_sh;
    const float scale_log2 = scale * kLog2e;
    const bool general = softcap > 0.f || mask_planes > 0;

    Row rows[2];  // accumulator rows g and g + 8 (mask offset, position)
#pragma unroll
    for (int x = 0; x < 2; ++x)
        rows[x] = make_row(w, g + 8 * x, B, H, Sq, Sk, q_sb, q_sh, q_ss, o_sb, o_sh, o_ss,
                           mask_planes);
    if (tid < DROWS) {
        const Row r = make_row(w, tid, B, H, Sq, Sk, q_sb, q_sh, q_ss, o_sb, o_sh, o_ss, 0);
        s_orow[tid] = r.orow;
        s_ooff[tid] = r.o_off;
    }

    float o[NO][4];
#pragma unroll
    for (int n = 0; n < NO; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    float m_run[2] = {neg_inf(), neg_inf()};
    float l_run[2] = {0.f, 0.f};

    const int n_t = w.t_end - w.t_beg;  // tiles of this split (<= 0: none)
    // The key loop, inlined once per ring schedule with `wr` a constant (one loop's
    // registers, not both).
    auto key_loop = [&](const bool wr) {
        const int inflight = wr ? STAGES : STAGES - 1;  // tiles in flight (see the header)
        // Prologue: group 0 = Q + tile 0, then tiles 1 .. inflight-1 (empty groups past the
        // end keep the group count uniform).
        for (int id = tid; id < DROWS * CHUNKS; id += DNT) {
            const int rr = id / CHUNKS;
            const int c = id - rr * CHUNKS;
            const bool ok = rr < w.R && c * 8 < D;
            const T* src = q;
            if (ok) {
                const int i = rr / w.G;
                const int h = w.kvh * w.G + (rr - i * w.G);
                src = q + w.b * q_sb + h * q_sh + i * q_ss + c * 8;
            }
            cp_async_16(Qs + rr * PITCH + c * 8, src, ok ? 16 : 0);
        }
#pragma unroll
        for (int s = 0; s < inflight; ++s) {
            if (s < n_t && wr)
                dec_load_tile<true>(ring + s * DEC_STAGE_ELEMS, kbase, vbase, k_ss, v_ss,
                                    (w.t_beg + s) * DBN, Sk, D, tid);
            else if (s < n_t)
                dec_load_tile<false>(ring + s * DEC_STAGE_ELEMS, kbase, vbase, k_ss, v_ss,
                                     (w.t_beg + s) * DBN, Sk, D, tid);
            cp_async_commit();
        }

        unsigned qf[Q_IN_REGS ? KSTEPS : 1][4];
        const T* q_ld = Qs + ((lane & 7) + ((lane >> 3) & 1) * 8) * PITCH + (lane >> 4) * 8;

        for (int i = 0; i < n_t; ++i) {
            // Tile i landed (groups 0..i complete; inflight-1 newer ones may be pending).
            if (wr) {
                cp_async_wait<STAGES - 1>();
                // The warp's own rows: its barrier orders its lanes' copies before their
                // reads (dec_warp_bar). Q (every thread copied a share) needs the CTA's, once.
                if (i == 0)
                    __syncthreads();
                else
                    dec_warp_bar(warp);
            } else {
                cp_async_wait<STAGES - 2>();
                // After the barrier every warp has finished tile i-1, whose stage is refilled.
                __syncthreads();
                if (i + STAGES - 1 < n_t)
                    dec_load_tile<false>(ring + ((i + STAGES - 1) % STAGES) * DEC_STAGE_ELEMS,
                                         kbase, vbase, k_ss, v_ss,
                                         (w.t_beg + i + STAGES - 1) * DBN, Sk, D, tid);
                cp_async_commit();
            }

            if (Q_IN_REGS && i == 0) {
#pragma unroll
                for (int ks = 0; ks < (Q_IN_REGS ? KSTEPS : 1); ++ks)
                    ldmatrix_x4(qf[ks], q_ld + ks * 16);
            }
            const T* Kw = ring + (i % STAGES) * DEC_STAGE_ELEMS + warp * 16 * PITCH;
            const T* Vw = Kw + DBN * PITCH;
            const int kb = (w.t_beg + i) * DBN;  // the tile's first key
            const int kw = kb + warp * 16;       // this warp's first key

            // S = Q Kᵀ for 16 rows x this warp's 16 keys (two n8 tiles).
            float s[2][4];
#pragma unroll
            for (int n = 0; n < 2; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
            const T* k_ld = Kw + ((lane & 7) + (lane >> 4) * 8) * PITCH + ((lane >> 3) & 1) * 8;
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
                unsigned kf[4];
                ldmatrix_x4(kf, k_ld + ks * 16);
                mma_16816<T>(s[0], a, kf[0], kf[1]);
                mma_16816<T>(s[1], a, kf[2], kf[3]);
            }

            // Logits (log2 units) and the online softmax of rows g, g + 8.
            const bool check = !tile_fully_visible(w, DROWS, kb, DBN, Sq, Sk, causal, window);
            float tmax[2] = {neg_inf(), neg_inf()};
#pragma unroll
            for (int n = 0; n < 2; ++n) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int x = e >> 1;
                    const int j = kw + n * 8 + 2 * t4 + (e & 1);
                    float val;
                    if (general) {
                        val = s[n][e] * scale;
                        if (softcap > 0.f) val = softcap * fast_tanh(val / softcap);
                        if (rows[x].m_off >= 0 && j < Sk) val += to_float(mask[rows[x].m_off + j]);
                        val *= kLog2e;
                    } else {
                        val = s[n][e] * scale_log2;
                    }
                    if (check && !visible(j, rows[x].p, Sk, causal, window)) val = neg_inf();
                    s[n][e] = val;
                    tmax[x] = fmaxf(tmax[x], val);
                }
            }
            float alpha[2], m_use[2];
#pragma unroll
            for (int x = 0; x < 2; ++x) {
                tmax[x] = quad_max(tmax[x]);
                alpha[x] = online_rescale(m_run[x], tmax[x], m_use[x]);
                l_run[x] *= alpha[x];
            }
            exp_rows(s, m_use, l_run);
            scale_rows(o, alpha);

            // O += P V: P (16 rows x 16 keys) from the S accumulators as the A operand.
            unsigned pa[4];
            pa[0] = pack2<T>(s[0][0], s[0][1]);
            pa[1] = pack2<T>(s[0][2], s[0][3]);
            pa[2] = pack2<T>(s[1][0], s[1][1]);
            pa[3] = pack2<T>(s[1][2], s[1][3]);
            const T* v_ld = Vw + ((lane & 7) + ((lane >> 3) & 1) * 8) * PITCH + (lane >> 4) * 8;
#pragma unroll
            for (int dp = 0; dp < NO / 2; ++dp) {
                unsigned vf[4];
                ldmatrix_x4_trans(vf, v_ld + dp * 16);
                mma_16816<T>(o[2 * dp], pa, vf[0], vf[1]);
                mma_16816<T>(o[2 * dp + 1], pa, vf[2], vf[3]);
            }
            if (wr) {
                // Every lane's reads of its stage are done: the warp refills it, tile i+STAGES.
                dec_warp_bar(warp);
                if (i + STAGES < n_t)
                    dec_load_tile<true>(ring + (i % STAGES) * DEC_STAGE_ELEMS, kbase, vbase,
                                        k_ss, v_ss, (w.t_beg + i + STAGES) * DBN, Sk, D, tid);
                cp_async_commit();
            }
        }
        cp_async_wait<0>();  // only empty groups remain; nothing may still write the ring
    };
    if (n_t > 0) {
        if (warp_ring)
            key_loop(true);
        else
            key_loop(false);
    }
    __syncthreads();  // every warp is done with the ring: it becomes the merge scratch
    // ... and, once all have arrived, rank 0's receive area: a release arrive, so the ring's
    // last reads are ordered before the other CTAs' stores into it.
    if (CL) cluster_arrive_release();

    float* Om = reinterpret_cast<float*>(ring);  // [DNW][DROWS][OPITCH]
    float* Mw = Om + DNW * DROWS * OPITCH;       // [DNW][DROWS] running max (log2 units)
    float* Lw = Mw + DNW * DROWS;                // [DNW][DROWS] row sums
    float* Wt = Lw + DNW * DROWS;                // [DROWS][WPITCH] split weights, row sum
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        const int r = g + 8 * x;
        const float l_row = quad_sum(l_run[x]);
        float* orow = Om + (warp * DROWS + r) * OPITCH;
#pragma unroll
        for (int n = 0; n < NO; ++n)
            *reinterpret_cast<float2*>(orow + n * 8 + 2 * t4) =
                make_float2(o[n][2 * x], o[n][2 * x + 1]);
        if (t4 == 0) {
            Mw[warp * DROWS + r] = m_run[x];  // quad-uniform (tmax was quad-reduced)
            Lw[warp * DROWS + r] = l_row;
        }
    }
    __syncthreads();

    // This CTA's result per (row, 4 columns): merge the warps in fixed order.
    const int R = w.R;
    const int D4 = D >> 2;  // D % 8 == 0 (host-checked)
    const long long n_rows = (long long)B * H * Sq;
    // Cluster merge: rank 0's receive area after its merge scratch, O [CL][R][D] then
    // (max, sum) [CL][R][2]; written once every CTA of the cluster is past its loop.
    float* Rv = reinterpret_cast<float*>(ring) + DEC_MERGE_FLOATS;
    unsigned rv0 = 0;
    if (CL) {
        cluster_wait();
        rv0 = cluster_mapa(smem_u32(Rv), 0u);
    }
    for (int idx = tid; idx < R * D4; idx += DNT) {
        const int r = idx / D4;
        const int c = (idx - r * D4) * 4;
        float M = neg_inf();
#pragma unroll
        for (int wi = 0; wi < DNW; ++wi) M = fmaxf(M, Mw[wi * DROWS + r]);
        float L = 0.f;
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int wi = 0; wi < DNW; ++wi) {
            const float mw = Mw[wi * DROWS + r];
            if (mw == neg_inf()) continue;  // that warp saw no visible key (o = 0, l = 0)
            const float a = exp2f(mw - M);
            L += a * Lw[wi * DROWS + r];
            const float4 ov = *reinterpret_cast<const float4*>(Om + (wi * DROWS + r) * OPITCH + c);
            acc.x += a * ov.x;
            acc.y += a * ov.y;
            acc.z += a * ov.z;
            acc.w += a * ov.w;
        }
        if (splits == 1) {
            // A row that saw no visible key has L = 0 and acc = 0: it gives zeros.
            const float inv = L > 0.f ? 1.f / L : 0.f;
            dec_store4(out + s_ooff[r] + c, acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
        } else if (CL) {
            const unsigned pr = (unsigned)(w.split * R + r);
            st_cluster_f32x4(rv0 + 4u * (pr * D + c), acc);
            if (c == 0) st_cluster_f32x2(rv0 + 4u * (CL * R * D + 2 * pr), M, L);
        } else {
            const long long pr = (long long)w.split * n_rows + s_orow[r];
            *reinterpret_cast<float4*>(ws_o + pr * D + c) = acc;
            if (c == 0) {
                ws_ml[2 * pr] = M;
                ws_ml[2 * pr + 1] = L;
            }
        }
    }
    if (splits == 1) return;

    if (CL) {
        // Every partial is in rank 0's shared memory once all have arrived (release/acquire).
        // The others leave (nothing reads their shared memory); rank 0 merges.
        cluster_arrive_release();
        if (w.split != 0) return;  // uniform per CTA
        cluster_wait();
        dec_merge_splits<true>(Rv, Rv + CL * R * D, (long long)R * D, 2LL * R, s_orow, s_ooff,
                               Wt, Om, out, R, D, splits, tid);
        return;
    }

    // Arrive; the last CTA of this row tile merges every split. One thread's acq_rel
    // arrival between two barriers publishes the CTA's partials and, for the last CTA, orders
    // its loads of the others' partials after theirs (see atomic_add_acq_rel_gpu).
    __syncthreads();  // every warp-merge read of Om is done: the merge reuses it as scratch
    if (tid == 0) s_last = atomic_add_acq_rel_gpu(counters + blockIdx.x, 1u) == (unsigned)(splits - 1);
    __syncthreads();
    if (!s_last) return;  // uniform: the whole CTA leaves

    dec_merge_splits<false>(ws_o, ws_ml, n_rows * D, 2 * n_rows, s_orow, s_ooff, Wt, Om, out, R,
                            D, splits, tid);
    if (tid == 0) counters[blockIdx.x] = 0u;  // re-armed: the next launch (stream order) starts at 0
}
#endif  // DEC_STAGES
