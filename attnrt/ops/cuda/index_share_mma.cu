// IndexShare attention, tensor-core path (f16/bf16, head size 64 or 128, sm_80+).
//
// For a shared index row (index heads = 1) the heads of one kv group attend to the same
// gathered rows, so the group's heads are the M dimension of a flash-attention tile:
// one CTA of WM x WN warps takes 16*WM heads of one (batch, query, kv head) and a split of
// the selected keys. Warp (wm, wn) owns heads 16*wm.. and keys wn*KT/WN.. of every tile.
// Each tile of KT selected K and V rows is gathered with 16-byte cp.async (consecutive
// threads -> consecutive chunks of one row: coalesced) into an ST-stage ring in padded
// shared memory (conflict-free ldmatrix); `stages` - 1 tiles are in flight while one is
// consumed, with one __syncthreads per tile. The ring depth is a launch argument (the host
// picks the deepest that fits), so one build serves every depth. Per tile: S = Q*K^T (m16n8k16 MMAs, Q fragments held in
// registers), online softmax per head row (fixed-order quad reductions, log2 domain),
// O += P*V. With WN > 1 the warps of a head block merge their states in warp order at the
// end. Split partials are merged by the task's last CTA (is_finish_if_last) or by
// is_combine; nothing touches the math with atomics, so the result is bitwise stable.
//
// Defines: IS_DTYPE (1 f16, 2 bf16), IS_HD (64 or 128), IS_WM (1, 2, 4, 8), IS_WN (1, 2,
// 4), IS_KT (keys per tile, a multiple of 16 * IS_WN), IS_PIPE (1: the first pipeline;
// 2: the leaner per-tile path below, the same bits).
//
// IS_PIPE 2 cuts the per-tile instruction count, which the H200 sweep showed to be the
// limit (~2.3 us per 32 KB tile, the same from DRAM (decode) and L2 (prefill), whatever
// the ring depth): each thread owns fixed (row slot, chunk) pairs, reads each slot's key
// once for its K and V copies (all key loads before any copy), computes the row offset
// once, and tracks ring stages without a modulo; tiles whose keys are all live skip the
// per-score key lookup (no bias, no hole in the staged keys); the O rescale is skipped when
// no row max moved (x * 1.0f is exact, so the bits match IS_PIPE 1).
#include "index_share_mma.cuh"

#ifndef IS_HD
#define IS_HD 128
#endif
#ifndef IS_WM
#define IS_WM 4
#endif
#ifndef IS_WN
#define IS_WN 1
#endif
#ifndef IS_KT
#define IS_KT 64
#endif
#ifndef IS_PIPE
#define IS_PIPE 1
#endif
#define IS_THREADS (32 * IS_WM * IS_WN)
#define IS_MROWS (16 * IS_WM)
#define IS_KW (IS_KT / IS_WN)  // keys of a tile per warp
#define IS_NT (IS_KW / 8)
#define IS_LDS (IS_HD + 8)  // 16-byte row pad: the 8 rows of an ldmatrix hit 8 bank groups
#define IS_CPR (IS_HD / 8)  // 16-byte chunks per row
#define IS_KSTEPS (IS_HD / 16)
#define IS_DT (IS_HD / 8)
#define IS_STAGE (2 * IS_KT * IS_LDS)  // elements of one stage: KT K rows, then KT V rows
#define IS_CHUNKS (2 * IS_KT * IS_CPR)  // 16-byte copies per stage

static_assert(IS_HD == 64 || IS_HD == 128, "IS_HD must be 64 or 128");
static_assert(IS_KW % 16 == 0, "each warp needs whole 16-key steps of a tile");
#define IS_MAX_STAGES 8  // is_cp_async_wait_dyn covers up to 6 pending groups
static_assert(IS_THREADS <= 256, "at most 8 warps");
static_assert(IS_CHUNKS % IS_THREADS == 0, "every thread issues the same copies per stage");
// IS_PIPE 2: thread t copies chunk t % CPR of row slots t / CPR + j * IS_SSTEP (K and V).
#define IS_SSTEP (IS_THREADS / IS_CPR)
#define IS_RPT (IS_KT / IS_SSTEP)  // row slots per thread per tile
static_assert(IS_THREADS % IS_CPR == 0 && IS_KT % IS_SSTEP == 0, "whole rows per thread pass");

// Dynamic shared memory, in bytes (the host mirrors this in _index_share_plan._mma_smem):
// sQ[MROWS][LDS], then a union of the stage ring (K then V rows of each stage), the states
// warps hand over in the WN > 1 merge, and the split finish's weights, then s_key[cps] ints.
#define IS_Q_BYTES (IS_MROWS * IS_LDS * 2)
#define IS_XS (IS_DT * 4 + 4)  // floats a lane hands over in the warp merge: O, m, l
#define IS_MERGE_BYTES (IS_WN > 1 ? IS_WM * (IS_WN - 1) * IS_XS * 32 * 4 : 0)

extern "C" __global__ void __launch_bounds__(IS_THREADS) is_attn_mma(IS_ATTN_PARAMS) {
  IS_DYN_SMEM(smem);
  const int ST = stages < 2 ? 2 : (stages > IS_MAX_STAGES ? IS_MAX_STAGES : stages);
  const int ring_bytes = ST * IS_STAGE * 2;
  const int union_bytes = ring_bytes > IS_MERGE_BYTES ? ring_bytes : IS_MERGE_BYTES;
  IS_DYN_SMEM_NEED(IS_Q_BYTES + union_bytes + (long long)cps * 4);
  __shared__ int s_live, s_flag;
#if IS_PIPE >= 2
  __shared__ int s_hole;
#endif
  is_t* sQ = reinterpret_cast<is_t*>(smem);
  is_t* sRing = reinterpret_cast<is_t*>(smem + IS_Q_BYTES);
  int* s_key = reinterpret_cast<int*>(smem + IS_Q_BYTES + union_bytes);

  const IsTask t = is_decode_task(Sq, G, U, HBK, shared_idx, S, IS_MROWS);
  const int Nkv = N / G;
  const long long bh = t.b * Nkv + t.kvh;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wm = warp / IS_WN, wn = warp % IS_WN;
  const int r0 = wm * 16;      // this warp's first head row (CTA-local)
  const int kw0 = wn * IS_KW;  // this warp's first key of each tile

  // Q rows of this head block (rows past nh are zero-filled; their results are dropped),
  // issued first so their latency overlaps the index staging.
#pragma unroll
  for (int i = tid; i < IS_MROWS * IS_CPR; i += IS_THREADS) {
    const int r = i / IS_CPR, ch = i - r * IS_CPR;
    const is_t* src = q + ((t.b * N + t.h0 + (r < t.nh ? r : 0)) * (long long)Sq + t.qi) * IS_HD;
    is_cp_async16(sQ + r * IS_LDS + ch * 8, src + ch * 8, r < t.nh ? 16 : 0);
  }
  is_cp_async_commit();

  const int c_begin = t.s * cps;
  const int ncols = is_split_cols(K, c_begin, cps);
  const long long irow = ((t.b * HI + t.ih) * (long long)Sq + t.qi) * K;
  const int vbound = (latch && valid_len) ? valid_len[t.b] : bound;
#if IS_PIPE >= 2
  if (tid == 0) s_hole = 0;  // ordered before every write below by the staging's first barrier
#endif
  const int live = is_stage_keys(idx, irow, idx64, c_begin, ncols, bound, s_key, &s_live, latch,
                                 vbound);

  // Gather tile `tile` of the split's selected keys into stage `st`. A masked column
  // (padding, or a poisoned replay's negative index) zero-fills its rows without a read.
#if IS_PIPE < 2
  auto issue = [&](int tile, int st) {
    is_t* dst0 = sRing + st * IS_STAGE;
#pragma unroll
    for (int j = 0; j < IS_CHUNKS / IS_THREADS; ++j) {
      const int i = j * IS_THREADS + tid;
      const int which = i / (IS_KT * IS_CPR);  // 0: K, 1: V (uniform per j)
      const int rem = i - which * (IS_KT * IS_CPR);
      const int slot = rem / IS_CPR, ch = rem - slot * IS_CPR;
      const int col = tile * IS_KT + slot;
      const int key = col < live ? s_key[col] : -1;
      const is_t* s0 = which ? v0 : k0;
      const is_t* s1 = which ? v1 : k1;
      const is_t* src = key >= 0 ? is_row(s0, s1, bh, key, len0, len1, IS_HD) + ch * 8 : s0;
      is_cp_async16(dst0 + (which * IS_KT + slot) * IS_LDS + ch * 8, src, key >= 0 ? 16 : 0);
    }
  };
#endif

#if IS_PIPE >= 2
  // Thread tid copies chunk ch2 of row slots s2_0 + j * IS_SSTEP of every tile, K and V.
  const int ch2 = tid % IS_CPR, s2_0 = tid / IS_CPR;
  const long long base0 = bh * (long long)len0, base1 = bh * (long long)len1 - len0;
  auto issue2 = [&](int tile, int st) {
    is_t* dst0 = sRing + st * IS_STAGE + s2_0 * IS_LDS + ch2 * 8;
    int key[IS_RPT];
    // Every key read before any copy is issued: one shared-memory latency per tile.
#pragma unroll
    for (int j = 0; j < IS_RPT; ++j) {
      const int col = tile * IS_KT + s2_0 + j * IS_SSTEP;
      key[j] = col < live ? s_key[col] : -1;
    }
#pragma unroll
    for (int j = 0; j < IS_RPT; ++j) {
      const IsRowSrc src = is_row_src(key[j], len0, base0, base1, k0, k1, v0, v1, IS_HD, ch2);
      is_t* d = dst0 + j * IS_SSTEP * IS_LDS;
      is_cp_async16(d, src.k, src.ok ? 16 : 0);
      is_cp_async16(d + IS_KT * IS_LDS, src.v, src.ok ? 16 : 0);
    }
  };
#endif

  // Prologue: tiles 0 .. ST-2 in flight (one commit group each, empty past the end).
  const int ntiles = (live + IS_KT - 1) / IS_KT;
  for (int p = 0; p < ST - 1; ++p) {
#if IS_PIPE >= 2
    if (p < ntiles) issue2(p, p);
#else
    if (p < ntiles) issue(p, p);
#endif
    is_cp_async_commit();
  }
#if IS_PIPE >= 2
  // A masked column below `live` (only a poisoned row has one: valid rows pad at the end)
  // sends every tile down the checked score path. Read after the first tile's barrier.
  for (int i = tid; i < live; i += IS_THREADS)
    if (s_key[i] < 0) s_hole = 1;  // racing stores of the same value
  int cst = 0, ist = ST - 1;  // ring stages of the tile consumed / refilled next
#endif

  unsigned qa[IS_KSTEPS][4];
  float oacc[IS_DT][4];
#pragma unroll
  for (int dt = 0; dt < IS_DT; ++dt) oacc[dt][0] = oacc[dt][1] = oacc[dt][2] = oacc[dt][3] = 0.f;
  float mrow[2] = {is_neg_inf(), is_neg_inf()};  // rows lane/4 and lane/4 + 8 (log2 domain)
  float lrow[2] = {0.f, 0.f};                    // this lane's partial row sums

  for (int tile = 0; tile < ntiles; ++tile) {
    // Groups committed so far: Q, ST-1 prologue tiles, one per earlier iteration; leaving
    // the newest ST-2 pending means Q and tiles 0..tile have landed (for this thread).
    is_cp_async_wait_dyn(ST - 2);
    // Everyone's copies of this tile are visible, and every warp is done with the stage of
    // tile - 1, which is refilled next.
    __syncthreads();
    {
      const int nxt = tile + ST - 1;
#if IS_PIPE >= 2
      if (nxt < ntiles) issue2(nxt, ist);
      ist = ist + 1 == ST ? 0 : ist + 1;
#else
      if (nxt < ntiles) issue(nxt, nxt % ST);
#endif
      is_cp_async_commit();
    }
    if (tile == 0) {
#pragma unroll
      for (int kk = 0; kk < IS_KSTEPS; ++kk)
        is_ldmatrix_x4(qa[kk], sQ + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * IS_LDS + kk * 16 +
                                   (lane >> 4) * 8);
    }
#if IS_PIPE >= 2
    const is_t* sKs = sRing + cst * IS_STAGE;
    cst = cst + 1 == ST ? 0 : cst + 1;
#else
    const is_t* sKs = sRing + (tile % ST) * IS_STAGE;
#endif
    const is_t* sVs = sKs + IS_KT * IS_LDS;

    float sacc[IS_NT][4];
#pragma unroll
    for (int nt = 0; nt < IS_NT; ++nt) sacc[nt][0] = sacc[nt][1] = sacc[nt][2] = sacc[nt][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < IS_KSTEPS; ++kk) {
#pragma unroll
      for (int np = 0; np < IS_NT / 2; ++np) {
        unsigned kb[4];
        is_ldmatrix_x4(kb, sKs + (kw0 + np * 16 + (lane & 7) + (lane >> 4) * 8) * IS_LDS + kk * 16 +
                               ((lane >> 3) & 1) * 8);
        is_mma16816(sacc[2 * np], qa[kk], kb[0], kb[1]);
        is_mma16816(sacc[2 * np + 1], qa[kk], kb[2], kb[3]);
      }
    }

    // Scores (log2 domain), bias, masks; per-row tile max across the quad.
    float tmax[2] = {is_neg_inf(), is_neg_inf()};
#if IS_PIPE >= 2
    // Uniform: no bias, every key of the tile live and unmasked -> no per-score lookup.
    const bool plain = !has_bias && (tile + 1) * IS_KT <= live && !s_hole;
    if (plain) {
#pragma unroll
      for (int nt = 0; nt < IS_NT; ++nt) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          // Every step of the online softmax is an explicitly rounded intrinsic (here and in
          // the checked path): no FMA contraction that depends on the code's shape, so every
          // pipeline and layout gives the same bits for the same split.
          const float s = __fmul_rn(sacc[nt][i], scale_log2);
          sacc[nt][i] = s;
          tmax[i >> 1] = fmaxf(tmax[i >> 1], s);
        }
      }
    } else {
#endif
#pragma unroll
    for (int nt = 0; nt < IS_NT; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = r0 + (lane >> 2) + (i >> 1) * 8;
        const int col = tile * IS_KT + kw0 + nt * 8 + (lane & 3) * 2 + (i & 1);
        const int key = col < live ? s_key[col] : -1;
        float s = is_neg_inf();
        if (key >= 0) {
          s = __fmul_rn(sacc[nt][i], scale_log2);
          if (has_bias && row < t.nh)
            s += is_to_f32(bias[t.b * bsb + (long long)(t.h0 + row) * bsh + (long long)t.qi * bsq +
                                (long long)key * bsk]) * IS_LOG2E;
        }
        sacc[nt][i] = s;
        tmax[i >> 1] = fmaxf(tmax[i >> 1], s);
      }
    }
#if IS_PIPE >= 2
    }
#endif
    float muse[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      tmax[hr] = fmaxf(tmax[hr], __shfl_xor_sync(IS_FULL, tmax[hr], 1));
      tmax[hr] = fmaxf(tmax[hr], __shfl_xor_sync(IS_FULL, tmax[hr], 2));
      const float mn = fmaxf(mrow[hr], tmax[hr]);
      muse[hr] = mn == is_neg_inf() ? 0.f : mn;  // keeps exp2(-inf - m) at 0, never NaN
      const float corr = exp2f(mrow[hr] - muse[hr]);
      mrow[hr] = mn;
      lrow[hr] = __fmul_rn(lrow[hr], corr);  // never fused with the adds below
#if IS_PIPE >= 2
      // x * 1.0f == x bit for bit: skip the rescale when no row of the warp moved its max.
      if (__any_sync(IS_FULL, corr != 1.f)) {
#endif
#pragma unroll
      for (int dt = 0; dt < IS_DT; ++dt) {
        oacc[dt][2 * hr] *= corr;
        oacc[dt][2 * hr + 1] *= corr;
      }
#if IS_PIPE >= 2
      }
#endif
    }
#pragma unroll
    for (int nt = 0; nt < IS_NT; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float p = exp2f(__fsub_rn(sacc[nt][i], muse[i >> 1]));
        sacc[nt][i] = p;
        lrow[i >> 1] = __fadd_rn(lrow[i >> 1], p);
      }
    }

    // O += P*V: the S accumulators of n-tiles 2ks, 2ks+1 are the A fragment of key step ks.
#pragma unroll
    for (int ks = 0; ks < IS_KW / 16; ++ks) {
      unsigned pa[4];
      pa[0] = is_pack2(sacc[2 * ks][0], sacc[2 * ks][1]);
      pa[1] = is_pack2(sacc[2 * ks][2], sacc[2 * ks][3]);
      pa[2] = is_pack2(sacc[2 * ks + 1][0], sacc[2 * ks + 1][1]);
      pa[3] = is_pack2(sacc[2 * ks + 1][2], sacc[2 * ks + 1][3]);
#pragma unroll
      for (int dp = 0; dp < IS_HD / 16; ++dp) {
        unsigned vb[4];
        is_ldmatrix_x4_trans(vb, sVs + (kw0 + ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * IS_LDS +
                                     dp * 16 + (lane >> 4) * 8);
        is_mma16816(oacc[2 * dp], pa, vb[0], vb[1]);
        is_mma16816(oacc[2 * dp + 1], pa, vb[2], vb[3]);
      }
    }
    // No barrier here: the next iteration's barrier orders this stage's reads before its
    // refill.
  }
  is_cp_async_wait(0);  // only empty groups can be pending; the ring is reused below
  __syncthreads();

#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    lrow[hr] += __shfl_xor_sync(IS_FULL, lrow[hr], 1);
    lrow[hr] += __shfl_xor_sync(IS_FULL, lrow[hr], 2);
  }

#if IS_WN > 1
  // The warps of a head block split each tile's keys: warps wn > 0 hand their states to warp
  // wn == 0 through shared memory (lane-private slots: conflict-free, no index math), which
  // merges them in warp order in registers and writes the rows below.
  {
    float* s_x = reinterpret_cast<float*>(sRing);  // [WM][WN-1][XS][32]
    if (wn > 0) {
      float* dst = s_x + (wm * (IS_WN - 1) + wn - 1) * IS_XS * 32 + lane;
#pragma unroll
      for (int dt = 0; dt < IS_DT; ++dt)
#pragma unroll
        for (int i = 0; i < 4; ++i) dst[(dt * 4 + i) * 32] = oacc[dt][i];
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        dst[(IS_DT * 4 + hr) * 32] = mrow[hr];
        dst[(IS_DT * 4 + 2 + hr) * 32] = lrow[hr];
      }
    }
    __syncthreads();
    if (wn == 0) {
      for (int w = 1; w < IS_WN; ++w) {
        const float* src = s_x + (wm * (IS_WN - 1) + w - 1) * IS_XS * 32 + lane;
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const float mo = src[(IS_DT * 4 + hr) * 32], lo = src[(IS_DT * 4 + 2 + hr) * 32];
          const float M = fmaxf(mrow[hr], mo);
          const float a = M == is_neg_inf() ? 0.f : exp2f(mrow[hr] - M);  // -inf -> 0
          const float bw = M == is_neg_inf() ? 0.f : exp2f(mo - M);
          lrow[hr] = __fmaf_rn(lo, bw, lrow[hr] * a);
#pragma unroll
          for (int dt = 0; dt < IS_DT; ++dt) {
            oacc[dt][2 * hr] = __fmaf_rn(src[(dt * 4 + 2 * hr) * 32], bw, oacc[dt][2 * hr] * a);
            oacc[dt][2 * hr + 1] =
                __fmaf_rn(src[(dt * 4 + 2 * hr + 1) * 32], bw, oacc[dt][2 * hr + 1] * a);
          }
          mrow[hr] = M;
        }
      }
    }
  }
#endif
  if (wn == 0) {
#pragma unroll
    for (int dt = 0; dt < IS_DT; ++dt) {
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int row = r0 + (lane >> 2) + hr * 8;
        const int d = dt * 8 + (lane & 3) * 2;  // this lane's two adjacent output columns
        if (row >= t.nh) continue;
        const float O0 = oacc[dt][2 * hr], O1 = oacc[dt][2 * hr + 1];
        const float M = mrow[hr], L = lrow[hr];
        if (S == 1) {
          // Same rounding as is_store(O / L): divide, then round each value to IS_DTYPE.
          *reinterpret_cast<unsigned*>(y + ((t.b * N + t.h0 + row) * (long long)Sq + t.qi) * IS_HD +
                                       d) = is_pack2(L > 0.f ? O0 / L : 0.f, L > 0.f ? O1 / L : 0.f);
        } else {
          const long long prow = is_prow(t.b, t.qi, Sq, N, t.h0 + row, S, t.s);
          *reinterpret_cast<float2*>(part_o + prow * IS_HD + d) = make_float2(O0, O1);
          if (d == 0) {
            part_ml[prow * 2] = M;
            part_ml[prow * 2 + 1] = L;
          }
        }
      }
    }
  }
  // The ring is free now (the warp merge above is fenced by the finish's first barrier).
  IS_DYN_SMEM_NEED(S > 1 && counters ? IS_Q_BYTES + t.nh * (S + 1) * 4 : 0);
  if (S > 1 && counters)
    is_finish_if_last_v4<IS_THREADS, IS_HD>(counters, t.task, S, part_o, part_ml, y, t.b, t.qi, Sq, N, t.h0, t.nh,
                         &s_flag, reinterpret_cast<float*>(sRing));
  (void)H;
  (void)lpk;
}

#ifdef NXRT_EMU
IS_EMU_EXPORT(is_attn_mma)
#endif
