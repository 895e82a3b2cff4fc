// Accumulator-fragment helpers shared by the wgmma IndexShare kernels (index_share_wg.cu,
// index_share_ws.cu), after index_share_mma.cuh; brings in wgmma.cuh with the element types
// of IS_DTYPE.
#pragma once

#if IS_DTYPE == 1
#define NXRT_WG_AB "f16.f16"
#else
#define NXRT_WG_AB "bf16.bf16"
#endif
#include "wgmma.cuh"

// Lazy rescaling: the softmax's reference maximum moves only when a row's maximum exceeds
// it by more than this (log2 units), so P = 2^(logit - m) <= 2^8 and O's rescale is skipped
// on most tiles; O and l share the reference, so O / l is the same softmax.
#define IS_LAZY_SLACK 8.f

// wgmma accumulator helpers shared by is_attn_wg and is_attn_ws. A warp's accumulator
// fragment: o[qb][4 j + e] is row g (e < 2) or g + 8 (x = e >> 1) of the warp's 16, channel
// 64 qb + 8 j + 2 tq + (e & 1); scores s[4 j + e] the same with key 8 j + 2 tq + (e & 1).

// Max / sum over the quad of lanes that holds one accumulator row.
__device__ __forceinline__ float is_quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(IS_FULL, v, 1));
  return fmaxf(v, __shfl_xor_sync(IS_FULL, v, 2));
}
__device__ __forceinline__ float is_quad_sum(float v) {
  v += __shfl_xor_sync(IS_FULL, v, 1);
  return v + __shfl_xor_sync(IS_FULL, v, 2);
}

// O's rows x times corr[x]; skipped when no row of the warp moved (x * 1 is exact).
template <int kHB>
__device__ __forceinline__ void is_acc_rescale(float (&o)[kHB][32], const float (&corr)[2]) {
  if (__any_sync(IS_FULL, corr[0] != 1.f || corr[1] != 1.f)) {
#pragma unroll
    for (int qb = 0; qb < kHB; ++qb)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        o[qb][4 * j + 0] *= corr[0];
        o[qb][4 * j + 1] *= corr[0];
        o[qb][4 * j + 2] *= corr[1];
        o[qb][4 * j + 3] *= corr[1];
      }
  }
}

// P (f32 scores of kNS / 2 keys per row pair) as the A operand of P V: k-step kk covers
// keys 16 kk .. +15; registers 0/2 row g (keys lo/hi 8), 1/3 row g + 8.
template <int kNS>
__device__ __forceinline__ void is_acc_pack(unsigned (&pa)[kNS / 8][4], const float (&s)[kNS]) {
#pragma unroll
  for (int j = 0; j < kNS / 4; ++j) {
    pa[j >> 1][2 * (j & 1) + 0] = is_pack2(s[4 * j + 0], s[4 * j + 1]);
    pa[j >> 1][2 * (j & 1) + 1] = is_pack2(s[4 * j + 2], s[4 * j + 3]);
  }
}

// Row x's split partial at partial row `prow`: this thread's unnormalised O values and, from
// the quad's first lane, (m, l).
template <int kHB>
__device__ __forceinline__ void is_acc_store_partial(const float (&o)[kHB][32], int x, float m,
                                                     float l, float* part_o, float* part_ml,
                                                     long long prow, int tq) {
  float* po = part_o + prow * (64 * kHB) + 2 * tq;
#pragma unroll
  for (int qb = 0; qb < kHB; ++qb)
#pragma unroll
    for (int j = 0; j < 8; ++j)
      *reinterpret_cast<float2*>(po + 64 * qb + 8 * j) =
          make_float2(o[qb][4 * j + 2 * x], o[qb][4 * j + 2 * x + 1]);
  if (tq == 0) {
    part_ml[prow * 2] = m;
    part_ml[prow * 2 + 1] = l;
  }
}

// The online-softmax step of one tile after the row maxima: tmax (this thread's maxima of
// its two rows, in the logit scale of `s` times k) moves the reference m_run lazily, corr
// gets O's factor, l_run is rescaled, and s (kNS scores) becomes P = 2^(s k - m) (one FFMA
// and one flush-to-zero ex2 per element; a masked -inf gives 0), its row sums added to
// l_run through two independent chains per row, combined in a fixed order.
template <int kNS>
__device__ __forceinline__ void is_softmax_step(float (&s)[kNS], const float (&tmax)[2], float k,
                                                float (&m_run)[2], float (&l_run)[2],
                                                float (&corr)[2]) {
  float muse[2];
#pragma unroll
  for (int x = 0; x < 2; ++x) {
    const float mt = is_quad_max(tmax[x]);
    const float mn = mt > m_run[x] + IS_LAZY_SLACK ? mt : m_run[x];  // -inf + c = -inf
    muse[x] = mn == is_neg_inf() ? 0.f : mn;  // keeps exp2(-inf - m) at 0, never NaN
    corr[x] = exp2f(m_run[x] - muse[x]);
    m_run[x] = mn;
    l_run[x] = __fmul_rn(l_run[x], corr[x]);
  }
  float l2[2][2] = {{0.f, 0.f}, {0.f, 0.f}};
#pragma unroll
  for (int i = 0; i < kNS; ++i) {
    const int x = (i >> 1) & 1, q = (i >> 2) & 1;
    s[i] = ex2_ftz(__fmaf_rn(s[i], k, -muse[x]));
    l2[x][q] = __fadd_rn(l2[x][q], s[i]);
  }
#pragma unroll
  for (int x = 0; x < 2; ++x) l_run[x] = __fadd_rn(l_run[x], __fadd_rn(l2[x][0], l2[x][1]));
}
