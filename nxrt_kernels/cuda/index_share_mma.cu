// IndexShare attention, tensor-core path (f16/bf16, head size 64 or 128, sm_80+).
//
// For a shared index row (index heads = 1) the heads of one kv group attend to the same
// gathered rows, so the group's heads are the M dimension of a flash-attention tile:
// one CTA (4 warps) takes 16*WM heads of one (batch, query, kv head) and a split of the
// selected keys. Each tile of 64 selected K and V rows is gathered with 16-byte cp.async
// (consecutive threads → consecutive chunks of one row: coalesced), double-buffered in
// padded shared memory (conflict-free ldmatrix), and consumed by m16n8k16 MMAs:
// S = Q·Kᵀ, online softmax per head row (fixed-order quad reductions), O += P·V.
// WM = 4: each warp owns 16 heads and every key. WM = 1: the 4 warps split each tile's keys
// and merge their softmax states in warp order at the end. No atomics touch the math.
//
// Defines: IS_DTYPE (1 f16, 2 bf16), IS_HD (64 or 128), IS_WM (1 or 4).
#include "index_share_mma.cuh"

#ifndef IS_HD
#define IS_HD 128
#endif
#ifndef IS_WM
#define IS_WM 4
#endif
#define IS_WN (4 / IS_WM)
#define IS_MROWS (16 * IS_WM)
#define IS_KT 64
#define IS_KW (IS_KT / IS_WN)
#define IS_NT (IS_KW / 8)
#define IS_LDS (IS_HD + 8)  // 16-byte row pad: the 8 rows of an ldmatrix hit 8 bank groups
#define IS_CPR (IS_HD / 8)
#define IS_KSTEPS (IS_HD / 16)
#define IS_DT (IS_HD / 8)

// Shared memory (dynamic): sQ[MROWS][LDS], sK[2][KT][LDS], sV[2][KT][LDS] (is_t), then
// s_key[cps] ints. After the key loop the sK/sV area holds the warps' partial states.
extern "C" __global__ void __launch_bounds__(128) is_attn_mma(
    const is_t* __restrict__ q, const is_t* __restrict__ k0, const is_t* __restrict__ v0,
    const is_t* __restrict__ k1, const is_t* __restrict__ v1, const void* __restrict__ idx,
    const is_t* __restrict__ bias, is_t* __restrict__ y, float* __restrict__ part_o,
    float* __restrict__ part_ml, long long bsb, long long bsh, long long bsq, long long bsk,
    int Sq, int N, int G, int U, int HBK, int shared_idx, int HI, int S, int K, int cps, int H,
    int len0, int len1, int bound, int idx64, int has_bias, int lpk, float scale_log2) {
  IS_DYN_SMEM(smem);
  __shared__ int s_live;
  is_t* sQ = reinterpret_cast<is_t*>(smem);
  is_t* sK = sQ + IS_MROWS * IS_LDS;
  is_t* sV = sK + 2 * IS_KT * IS_LDS;
  int* s_key = reinterpret_cast<int*>(sV + 2 * IS_KT * IS_LDS);

  const IsTask t = is_decode_task(Sq, G, U, HBK, shared_idx, S, IS_MROWS);
  const int Nkv = N / G;
  const long long bh = t.b * Nkv + t.kvh;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int wm = warp / IS_WN, wn = warp % IS_WN;
  const int r0 = wm * 16;       // this warp's first head row (CTA-local)
  const int kw0 = wn * IS_KW;   // this warp's first key of each tile
  const int c_begin = t.s * cps;
  const int ncols = is_imax(is_imin(K, c_begin + cps) - c_begin, 0);
  const long long irow = ((t.b * HI + t.ih) * (long long)Sq + t.qi) * K;
  const int live = is_stage_keys(idx, irow, idx64, c_begin, ncols, bound, s_key, &s_live);

  // Q rows of this head block; rows past nh are zero-filled (their results are dropped).
  for (int i = tid; i < IS_MROWS * IS_CPR; i += blockDim.x) {
    const int r = i / IS_CPR, ch = i - r * IS_CPR;
    const is_t* src = q + ((t.b * N + t.h0 + (r < t.nh ? r : 0)) * (long long)Sq + t.qi) * IS_HD;
    is_cp_async16(sQ + r * IS_LDS + ch * 8, src + ch * 8, r < t.nh ? 16 : 0);
  }
  is_cp_async_commit();

  // Gather tile `tile` of the split's selected keys into stage `st`. A masked column
  // (padding, or a poisoned replay's negative index) zero-fills its rows without a read.
  auto issue = [&](int tile, int st) {
    for (int i = tid; i < 2 * IS_KT * IS_CPR; i += blockDim.x) {
      const int which = i / (IS_KT * IS_CPR);
      const int rem = i - which * (IS_KT * IS_CPR);
      const int slot = rem / IS_CPR, ch = rem - slot * IS_CPR;
      const int col = tile * IS_KT + slot;
      const int key = col < live ? s_key[col] : -1;
      const is_t* s0 = which ? v0 : k0;
      const is_t* s1 = which ? v1 : k1;
      const is_t* src = key >= 0 ? is_row(s0, s1, bh, key, len0, len1, IS_HD) + ch * 8 : s0;
      is_t* dst = (which ? sV : sK) + (st * IS_KT + slot) * IS_LDS + ch * 8;
      is_cp_async16(dst, src, key >= 0 ? 16 : 0);
    }
  };

  const int ntiles = (live + IS_KT - 1) / IS_KT;
  if (ntiles > 0) issue(0, 0);
  is_cp_async_commit();

  unsigned qa[IS_KSTEPS][4];
  float oacc[IS_DT][4];
#pragma unroll
  for (int dt = 0; dt < IS_DT; ++dt) oacc[dt][0] = oacc[dt][1] = oacc[dt][2] = oacc[dt][3] = 0.f;
  float mrow[2] = {is_neg_inf(), is_neg_inf()};  // rows lane/4 and lane/4 + 8 (log2 domain)
  float lrow[2] = {0.f, 0.f};                    // this lane's partial row sums

  for (int tile = 0; tile < ntiles; ++tile) {
    const int st = tile & 1;
    if (tile + 1 < ntiles) issue(tile + 1, st ^ 1);  // that stage was freed by the last barrier
    is_cp_async_commit();
    is_cp_async_wait(1);  // everything but the tile just issued has landed
    __syncthreads();
    if (tile == 0) {
#pragma unroll
      for (int kk = 0; kk < IS_KSTEPS; ++kk)
        is_ldmatrix_x4(qa[kk], sQ + (r0 + (lane & 7) + ((lane >> 3) & 1) * 8) * IS_LDS + kk * 16 +
                                   (lane >> 4) * 8);
    }
    const is_t* sKs = sK + st * IS_KT * IS_LDS;
    const is_t* sVs = sV + st * IS_KT * IS_LDS;

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
#pragma unroll
    for (int nt = 0; nt < IS_NT; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = r0 + (lane >> 2) + (i >> 1) * 8;
        const int col = tile * IS_KT + kw0 + nt * 8 + (lane & 3) * 2 + (i & 1);
        const int key = col < live ? s_key[col] : -1;
        float s = is_neg_inf();
        if (key >= 0) {
          s = sacc[nt][i] * scale_log2;
          if (has_bias && row < t.nh)
            s += is_to_f32(bias[t.b * bsb + (long long)(t.h0 + row) * bsh + (long long)t.qi * bsq +
                                (long long)key * bsk]) * IS_LOG2E;
        }
        sacc[nt][i] = s;
        tmax[i >> 1] = fmaxf(tmax[i >> 1], s);
      }
    }
    float muse[2];
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      tmax[hr] = fmaxf(tmax[hr], __shfl_xor_sync(IS_FULL, tmax[hr], 1));
      tmax[hr] = fmaxf(tmax[hr], __shfl_xor_sync(IS_FULL, tmax[hr], 2));
      const float mn = fmaxf(mrow[hr], tmax[hr]);
      muse[hr] = mn == is_neg_inf() ? 0.f : mn;  // keeps exp2(-inf - m) at 0, never NaN
      const float corr = exp2f(mrow[hr] - muse[hr]);
      mrow[hr] = mn;
      lrow[hr] *= corr;
#pragma unroll
      for (int dt = 0; dt < IS_DT; ++dt) {
        oacc[dt][2 * hr] *= corr;
        oacc[dt][2 * hr + 1] *= corr;
      }
    }
#pragma unroll
    for (int nt = 0; nt < IS_NT; ++nt) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float p = exp2f(sacc[nt][i] - muse[i >> 1]);
        sacc[nt][i] = p;
        lrow[i >> 1] += p;
      }
    }

    // O += P·V: the S accumulators of n-tiles 2ks, 2ks+1 are the A fragment of key step ks.
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
    __syncthreads();  // every warp is done with stage st before it is refilled
  }
  is_cp_async_wait(0);
  __syncthreads();

#pragma unroll
  for (int hr = 0; hr < 2; ++hr) {
    lrow[hr] += __shfl_xor_sync(IS_FULL, lrow[hr], 1);
    lrow[hr] += __shfl_xor_sync(IS_FULL, lrow[hr], 2);
  }

#if IS_WN == 1
#pragma unroll
  for (int dt = 0; dt < IS_DT; ++dt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = r0 + (lane >> 2) + (i >> 1) * 8;
      const int d = dt * 8 + (lane & 3) * 2 + (i & 1);
      if (row < t.nh)
        is_write_out(y, part_o, part_ml, S, t.s, t.b, t.h0 + row, t.qi, Sq, N, IS_HD, d,
                     mrow[i >> 1], lrow[i >> 1], oacc[dt][i]);
    }
  }
#else
  // The warps split the keys: merge their states in warp order through shared memory.
  float* s_o = reinterpret_cast<float*>(sK);  // [WN][16][HD]
  float* s_ml = s_o + IS_WN * 16 * IS_HD;     // [WN][16][2]
#pragma unroll
  for (int dt = 0; dt < IS_DT; ++dt) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = (lane >> 2) + (i >> 1) * 8;
      s_o[(wn * 16 + row) * IS_HD + dt * 8 + (lane & 3) * 2 + (i & 1)] = oacc[dt][i];
    }
  }
  if ((lane & 3) == 0) {
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const int row = (lane >> 2) + hr * 8;
      s_ml[(wn * 16 + row) * 2] = mrow[hr];
      s_ml[(wn * 16 + row) * 2 + 1] = lrow[hr];
    }
  }
  __syncthreads();
  for (int i = tid; i < t.nh * IS_HD; i += blockDim.x) {
    const int row = i / IS_HD, d = i - row * IS_HD;
    float M, L, O;
    is_merge_parts(s_ml + row * 2, s_ml + row * 2 + 1, s_o + row * IS_HD + d, IS_WN, 32,
                   16 * IS_HD, &M, &L, &O);
    is_write_out(y, part_o, part_ml, S, t.s, t.b, t.h0 + row, t.qi, Sq, N, IS_HD, d, M, L, O);
  }
#endif
  (void)H;
  (void)lpk;
}

#ifdef NXRT_EMU
IS_EMU_EXPORT(is_attn_mma)
#endif
