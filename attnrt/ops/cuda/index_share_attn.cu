// IndexShare attention, CUDA-core path (every dtype and head size; GQA groups up to RB heads
// per CTA). One CTA = 4 warps per (batch, query, head block, split).
//
// Layout: a warp takes KPW = 32/LPK selected keys at a time, LPK lanes per key; each lane
// gathers VEC-element (16-byte when IS_VEC > 1) chunks of its key's K and V rows, so a
// key row is read by consecutive lanes (coalesced). The q·k dot is reduced across the LPK
// lanes with an xor butterfly (fixed order). Each lane group keeps an online softmax state
// per head; lane groups merge by butterfly, warps merge in warp order through shared
// memory. Nothing in the math uses atomics, so results are bitwise reproducible.
//
// Defines: IS_DTYPE, IS_VEC (elements per chunk), IS_CPL (chunks per lane, max), IS_RB
// (heads per CTA; a GQA group of <= RB heads sharing an index row reads each row once).
#include "index_share_common.cuh"

#ifndef IS_VEC
#define IS_VEC 1
#endif
#ifndef IS_CPL
#define IS_CPL 4
#endif
#ifndef IS_RB
#define IS_RB 1
#endif
#define IS_NW 4
#define IS_UNR (IS_RB == 1 ? 4 : 2)  // keys in flight per lane group

struct IsChunk {
  is_t v[IS_VEC];
};

__device__ __forceinline__ IsChunk is_load_chunk(const is_t* p) {
  IsChunk c;
#if IS_VEC > 1
  // VEC * sizeof(is_t) == 16 and the host checked 16-byte alignment of every row.
  *reinterpret_cast<uint4*>(&c) = *reinterpret_cast<const uint4*>(p);
#else
  c.v[0] = *p;
#endif
  return c;
}

__device__ __forceinline__ IsChunk is_zero_chunk() {
  IsChunk c;
#if IS_VEC > 1
  *reinterpret_cast<uint4*>(&c) = make_uint4(0u, 0u, 0u, 0u);
#else
  c.v[0] = is_t();
  is_store(&c.v[0], 0.f);
#endif
  return c;
}

// Shared memory (dynamic): s_key[cps_pad] ints, then per warp and head o[H], m, l floats.
extern "C" __global__ void __launch_bounds__(128) is_attn_simt(IS_ATTN_PARAMS) {
  IS_DYN_SMEM(smem);
  __shared__ int s_live, s_flag;
  const int cps_pad = (cps + 3) & ~3;
  IS_DYN_SMEM_NEED((long long)cps_pad * 4 + (IS_NW * IS_RB * H + 2 * IS_NW * IS_RB) * 4);
  (void)stages;  // the tensor-core path's ring depth; this path streams through registers
  int* s_key = reinterpret_cast<int*>(smem);
  float* s_o = reinterpret_cast<float*>(smem + (long long)cps_pad * 4);  // [NW][RB][H]
  float* s_m = s_o + IS_NW * IS_RB * H;                                  // [NW][RB]
  float* s_l = s_m + IS_NW * IS_RB;                                      // [NW][RB]

  const IsTask t = is_decode_task(Sq, G, U, HBK, shared_idx, S, IS_RB);
  const int Nkv = N / G;
  const long long bh = t.b * Nkv + t.kvh;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int c_begin = t.s * cps;
  const int ncols = is_split_cols(K, c_begin, cps);
  const long long irow = ((t.b * HI + t.ih) * (long long)Sq + t.qi) * K;
  const int vbound = (latch && valid_len) ? valid_len[t.b] : bound;
  const int live = is_stage_keys(idx, irow, idx64, c_begin, ncols, bound, s_key, &s_live, latch,
                                 vbound);

  const int kpw = 32 / lpk;
  const int kl = lane / lpk, cl = lane - kl * lpk;
  const int nchunks = H / IS_VEC;

  float qf[IS_RB][IS_CPL][IS_VEC];
#pragma unroll
  for (int r = 0; r < IS_RB; ++r) {
    const is_t* qp = q + ((t.b * N + t.h0 + r) * (long long)Sq + t.qi) * H;
#pragma unroll
    for (int c = 0; c < IS_CPL; ++c) {
      const int ch = cl + c * lpk;
      IsChunk x = (r < t.nh && ch < nchunks) ? is_load_chunk(qp + ch * IS_VEC) : is_zero_chunk();
#pragma unroll
      for (int e = 0; e < IS_VEC; ++e) qf[r][c][e] = is_to_f32(x.v[e]) * scale_log2;
    }
  }

  float m[IS_RB], l[IS_RB], o[IS_RB][IS_CPL][IS_VEC];
#pragma unroll
  for (int r = 0; r < IS_RB; ++r) {
    m[r] = is_neg_inf();
    l[r] = 0.f;
#pragma unroll
    for (int c = 0; c < IS_CPL; ++c)
#pragma unroll
      for (int e = 0; e < IS_VEC; ++e) o[r][c][e] = 0.f;
  }

  const int step = IS_NW * kpw * IS_UNR;
  for (int base = warp * kpw * IS_UNR; base < live; base += step) {
    int key[IS_UNR];
    IsChunk kc[IS_UNR][IS_CPL], vc[IS_UNR][IS_CPL];
    // Issue every load of this step before using any (memory-level parallelism).
#pragma unroll
    for (int j = 0; j < IS_UNR; ++j) {
      const int col = base + j * kpw + kl;
      key[j] = col < live ? s_key[col] : -1;
      const is_t* kr = key[j] >= 0 ? is_row(k0, k1, bh, key[j], len0, len1, H) : k0;
      const is_t* vr = key[j] >= 0 ? is_row(v0, v1, bh, key[j], len0, len1, H) : v0;
#pragma unroll
      for (int c = 0; c < IS_CPL; ++c) {
        const int ch = cl + c * lpk;
        const bool ok = key[j] >= 0 && ch < nchunks;
        kc[j][c] = ok ? is_load_chunk(kr + ch * IS_VEC) : is_zero_chunk();
        vc[j][c] = ok ? is_load_chunk(vr + ch * IS_VEC) : is_zero_chunk();
      }
    }
#pragma unroll
    for (int r = 0; r < IS_RB; ++r) {
      if (r >= t.nh) break;  // uniform across the CTA
      float sc[IS_UNR];
      float mx = m[r];
#pragma unroll
      for (int j = 0; j < IS_UNR; ++j) {
        float part = 0.f;
#pragma unroll
        for (int c = 0; c < IS_CPL; ++c)
#pragma unroll
          for (int e = 0; e < IS_VEC; ++e) part += qf[r][c][e] * is_to_f32(kc[j][c].v[e]);
        // Butterfly over the LPK lanes of this key: every lane ends with the same sum.
        for (int off = 1; off < lpk; off <<= 1) part += __shfl_xor_sync(IS_FULL, part, off);
        float s = is_neg_inf();
        if (key[j] >= 0) {
          s = part;
          if (has_bias)
            s += is_to_f32(bias[t.b * bsb + (long long)(t.h0 + r) * bsh + (long long)t.qi * bsq +
                                (long long)key[j] * bsk]) * IS_LOG2E;
        }
        sc[j] = s;
        mx = fmaxf(mx, s);
      }
      if (mx != is_neg_inf()) {
        const float corr = exp2f(m[r] - mx);  // 0 while m is still -inf
        l[r] *= corr;
#pragma unroll
        for (int c = 0; c < IS_CPL; ++c)
#pragma unroll
          for (int e = 0; e < IS_VEC; ++e) o[r][c][e] *= corr;
#pragma unroll
        for (int j = 0; j < IS_UNR; ++j) {
          const float p = exp2f(sc[j] - mx);
          l[r] += p;
#pragma unroll
          for (int c = 0; c < IS_CPL; ++c)
#pragma unroll
            for (int e = 0; e < IS_VEC; ++e) o[r][c][e] += p * is_to_f32(vc[j][c].v[e]);
        }
        m[r] = mx;
      }
    }
  }

  // Merge the KPW lane groups of this warp (butterfly over the key slots).
  for (int off = lpk; off < 32; off <<= 1) {
#pragma unroll
    for (int r = 0; r < IS_RB; ++r) {
      const float om = __shfl_xor_sync(IS_FULL, m[r], off);
      const float ol = __shfl_xor_sync(IS_FULL, l[r], off);
      const float M = fmaxf(m[r], om);
      const float a = M == is_neg_inf() ? 0.f : exp2f(m[r] - M);
      const float bb = M == is_neg_inf() ? 0.f : exp2f(om - M);
      l[r] = l[r] * a + ol * bb;
#pragma unroll
      for (int c = 0; c < IS_CPL; ++c)
#pragma unroll
        for (int e = 0; e < IS_VEC; ++e) {
          const float oo = __shfl_xor_sync(IS_FULL, o[r][c][e], off);
          o[r][c][e] = o[r][c][e] * a + oo * bb;
        }
      m[r] = M;
    }
  }
  if (kl == 0) {
#pragma unroll
    for (int r = 0; r < IS_RB; ++r) {
#pragma unroll
      for (int c = 0; c < IS_CPL; ++c) {
        const int ch = cl + c * lpk;
        if (ch < nchunks) {
#pragma unroll
          for (int e = 0; e < IS_VEC; ++e) s_o[(warp * IS_RB + r) * H + ch * IS_VEC + e] = o[r][c][e];
        }
      }
      if (cl == 0) {
        s_m[warp * IS_RB + r] = m[r];
        s_l[warp * IS_RB + r] = l[r];
      }
    }
  }
  __syncthreads();
  // Merge the warps in warp order, one output element per thread.
  for (int i = tid; i < t.nh * H; i += blockDim.x) {
    const int r = i / H, d = i - r * H;
    float M, L, O;
    is_merge_parts(s_m + r, s_l + r, s_o + r * H + d, IS_NW, IS_RB, IS_RB * H, &M, &L, &O);
    is_write_out(y, part_o, part_ml, S, t.s, t.b, t.h0 + r, t.qi, Sq, N, H, d, M, L, O);
  }
  if (S > 1 && counters)
    is_finish_if_last(counters, t.task, S, part_o, part_ml, y, t.b, t.qi, Sq, N, t.h0, t.nh, H,
                      &s_flag);
}

#ifdef NXRT_EMU
IS_EMU_EXPORT(is_attn_simt)
#endif
