// IndexShare helpers shared by index_share_aux.cu, index_share_attn.cu, index_share_mma.cu.
//
// IS_DTYPE selects the storage type of query/key/value/bias/output: 0 float, 1 __half,
// 2 __nv_bfloat16. All math is fp32. Building with -DNXRT_EMU swaps the CUDA headers for
// index_share_emu.cuh, a host emulation used only by the CPU tests.
#pragma once

#ifdef NXRT_EMU
#include "index_share_emu.cuh"
#else
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#endif

#ifndef IS_DTYPE
#define IS_DTYPE 0
#endif

#if IS_DTYPE == 0
typedef float is_t;
#elif IS_DTYPE == 1
typedef __half is_t;
#else
typedef __nv_bfloat16 is_t;
#endif

#define IS_FULL 0xffffffffu
#define IS_LOG2E 1.4426950408889634f
#define IS_LATCH_BIT 512u  // nxrt.latch.INDEX_SHARE_SELECTED_INDICES

__device__ __forceinline__ float is_neg_inf() { return __int_as_float(0xff800000); }

__device__ __forceinline__ float is_to_f32(float x) { return x; }
__device__ __forceinline__ float is_to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float is_to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

__device__ __forceinline__ void is_store(float* p, float v) { *p = v; }
__device__ __forceinline__ void is_store(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void is_store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }

// The low 16 bits of a packed pair are element 0 (the lower column), as mma expects.
__device__ __forceinline__ float is_lo(unsigned w, float*) { return __uint_as_float(w); }
__device__ __forceinline__ float is_lo(unsigned w, __half*) {
  return __half2float(__ushort_as_half((unsigned short)(w & 0xffffu)));
}
__device__ __forceinline__ float is_hi(unsigned w, __half*) {
  return __half2float(__ushort_as_half((unsigned short)(w >> 16)));
}
__device__ __forceinline__ float is_lo(unsigned w, __nv_bfloat16*) {
  return __uint_as_float(w << 16);
}
__device__ __forceinline__ float is_hi(unsigned w, __nv_bfloat16*) {
  return __uint_as_float(w & 0xffff0000u);
}

__device__ __forceinline__ long long is_load_index(const void* idx, long long i, int idx64) {
  return idx64 ? ((const long long*)idx)[i] : (long long)((const int*)idx)[i];
}

__device__ __forceinline__ int is_imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int is_imax(int a, int b) { return a > b ? a : b; }
// Columns of the split starting at c_begin (cps per split) that lie in a row of K.
__device__ __forceinline__ int is_split_cols(int K, int c_begin, int cps) {
  return is_imax(is_imin(K, c_begin + cps) - c_begin, 0);
}

// Warp max of an int (all 32 lanes take part).
__device__ __forceinline__ int is_warp_max(int v) {
  for (int off = 16; off > 0; off >>= 1) v = is_imax(v, __shfl_xor_sync(IS_FULL, v, off));
  return v;
}

// Stage one split's column range of an index row into shared memory as a clamped key
// (or -1 for a masked column) and return the split's live length: one past its last
// selected column. Valid rows pad only at the end, so the live prefix is every column
// before the padding. The clamp to [0, bound) is what keeps a poisoned replay from ever
// gathering out of bounds.
//
// With `latch` set (the stream is capturing) the same pass checks the row rules of
// nxrt_kernels._ref_index_share.find_index_violation on this split's columns against
// `vbound` (the cache length, or the batch's valid length in capacity mode) and latches
// IS_LATCH_BIT on a violation. Every rule is local to a column and its left neighbour, so
// the splits of a row together check it all: an entry < -1; a -1 in column 0 (an all -1
// row, or an index after a leading -1); a non-(-1) entry >= vbound, right after a -1
// (after padding), or <= its left neighbour (duplicate / not increasing).
// Needs a __shared__ int scratch word; ends with a __syncthreads().
__device__ __forceinline__ int is_stage_keys(const void* idx, long long row_off, int idx64,
                                             int c_begin, int ncols, int bound, int* s_key,
                                             int* s_live, unsigned* latch, int vbound) {
  if (threadIdx.x == 0) *s_live = 0;
  __syncthreads();
  int live = 0;
  bool bad = false;
  const int nt = (int)blockDim.x;
  for (int i0 = 0; i0 < ncols; i0 += 8 * nt) {
    // Eight independent loads per thread before any use: one memory latency for a whole
    // 2048-column split on 256 threads.
    long long raw[8], prev[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int i = i0 + u * nt + (int)threadIdx.x;
      raw[u] = -1;
      prev[u] = -1;
      if (i < ncols) {
        const long long c = (long long)c_begin + i;
        raw[u] = is_load_index(idx, row_off + c, idx64);
        if (latch && c > 0) prev[u] = is_load_index(idx, row_off + c - 1, idx64);
      }
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int i = i0 + u * nt + (int)threadIdx.x;
      if (i >= ncols) continue;
      const long long r = raw[u];
      int key = -1;
      if (r >= 0) {
        key = r < (long long)bound ? (int)r : bound - 1;
        live = i + 1;
      }
      s_key[i] = key;
      if (latch) {
        const int c = c_begin + i;
        bad = bad || r < -1 || (c == 0 && r == -1) ||
              (r != -1 && (r >= (long long)vbound || (c > 0 && (prev[u] == -1 || r <= prev[u]))));
      }
    }
  }
  if (bad) atomicOr(latch, IS_LATCH_BIT);
  live = is_warp_max(live);
  if ((threadIdx.x & 31) == 0) atomicMax(s_live, live);  // integer max: order-independent
  __syncthreads();
  return *s_live;
}

// Address of the gathered row `key` of kv head (b, kvh): keys below len0 live in segment 0
// (past, or the capacity present), the rest in segment 1 (the current tokens).
__device__ __forceinline__ const is_t* is_row(const is_t* seg0, const is_t* seg1, long long bh,
                                              int key, int len0, int len1, int H) {
  return key < len0 ? seg0 + (bh * len0 + key) * (long long)H
                    : seg1 + (bh * len1 + (key - len0)) * (long long)H;
}

// The attention kernels' common parameter list (is_attn_simt, is_attn_mma, is_attn_wg,
// is_attn_ws: one host launch path). `lpk` is the CUDA-core path's lanes per key; `stages`
// the tensor-core ring depth; `items` the number of (task, split) work items (the grid of
// the one-CTA-per-item kernels; the persistent is_attn_ws loops over them).
#define IS_ATTN_PARAMS                                                                          \
  const is_t *__restrict__ q, const is_t *__restrict__ k0, const is_t *__restrict__ v0,        \
      const is_t *__restrict__ k1, const is_t *__restrict__ v1, const void *__restrict__ idx,  \
      const is_t *__restrict__ bias, is_t *__restrict__ y, float *__restrict__ part_o,         \
      float *__restrict__ part_ml, unsigned *__restrict__ counters, unsigned *__restrict__ latch, \
      const int *__restrict__ valid_len, long long bsb, long long bsh, long long bsq,          \
      long long bsk, int Sq, int N, int G, int U, int HBK, int shared_idx, int HI, int S, int K, \
      int cps, int H, int len0, int len1, int bound, int idx64, int has_bias, int lpk,         \
      int stages, float scale_log2, int items

// Sources of 16-byte chunk `ch` of gathered key `kj`'s K and V rows (hd elements per row):
// keys below len0 in segment 0 (k0/v0, row base0 + kj), the rest in segment 1 (k1/v1, row
// base1 + kj, base1 already offset by -len0). A masked column (kj < 0) gets the segment-0
// bases and ok = false: its copy zero-fills without reading.
struct IsRowSrc {
  const is_t* k;
  const is_t* v;
  bool ok;
};
__device__ __forceinline__ IsRowSrc is_row_src(int kj, int len0, long long base0, long long base1,
                                               const is_t* k0, const is_t* k1, const is_t* v0,
                                               const is_t* v1, int hd, int ch) {
  const bool ok = kj >= 0;
  const bool seg1 = kj >= len0;
  const long long off = ((seg1 ? base1 : base0) + (ok ? kj : 0)) * hd + ch * 8;
  IsRowSrc r;
  r.k = ok ? (seg1 ? k1 : k0) + off : k0;
  r.v = ok ? (seg1 ? v1 : v0) + off : v0;
  r.ok = ok;
  return r;
}

// Task decode shared by both attention paths. blockIdx.x = ((bq * S) + s) * U + u, with the
// head block u fastest so CTAs that gather the same rows run side by side (L2 reuse).
// `task` = bq * U + u numbers the (batch, query, head block) tasks (split-K counters).
struct IsTask {
  long long b, task;
  int qi, s, kvh, h0, nh, ih;
};

__device__ __forceinline__ IsTask is_decode_task_at(long long x, int Sq, int G, int U, int HBK,
                                                    int shared_idx, int S, int heads_per_cta) {
  IsTask t;
  const int u = (int)(x % U);
  x /= U;
  t.s = (int)(x % S);
  x /= S;
  t.task = x * U + u;
  t.qi = (int)(x % Sq);
  t.b = x / Sq;
  if (shared_idx) {
    t.kvh = u / HBK;
    const int hb = u % HBK;
    t.h0 = t.kvh * G + hb * heads_per_cta;
    t.nh = is_imin(heads_per_cta, G - hb * heads_per_cta);
    t.ih = 0;
  } else {
    t.h0 = u;
    t.kvh = u / G;
    t.nh = 1;
    t.ih = u;
  }
  return t;
}

// The task of this CTA's work item blockIdx.x (one CTA per item).
__device__ __forceinline__ IsTask is_decode_task(int Sq, int G, int U, int HBK, int shared_idx,
                                                 int S, int heads_per_cta) {
  return is_decode_task_at(blockIdx.x, Sq, G, U, HBK, shared_idx, S, heads_per_cta);
}

// A float from shared memory (kCg = false) or from split partials other CTAs wrote in this
// launch (kCg = true: ld.global.cg, served by L2, never a stale L1 line).
template <bool kCg>
__device__ __forceinline__ float is_ldf(const float* p) {
  if constexpr (kCg) {
    return __ldcg(p);
  } else {
    return *p;
  }
}

// Merge (m, l, o) partial softmax states in a fixed order (log2 domain). Returns the
// merged output value for one element; *L_out gets the merged denominator.
template <bool kCg = false>
__device__ __forceinline__ void is_merge_parts(const float* m, const float* l, const float* o,
                                               int n, int stride_ml, int stride_o, float* M_out,
                                               float* L_out, float* O_out) {
  float M = is_neg_inf();
  for (int w = 0; w < n; ++w) M = fmaxf(M, is_ldf<kCg>(m + w * stride_ml));
  float L = 0.f, O = 0.f;
  if (M != is_neg_inf()) {
    for (int w = 0; w < n; ++w) {
      const float a = exp2f(is_ldf<kCg>(m + w * stride_ml) - M);  // -inf parts contribute 0
      // Explicit FMAs: every merge of split partials (is_combine, both in-kernel finishes)
      // rounds exactly the same way, whatever the compiler would contract.
      L = __fmaf_rn(is_ldf<kCg>(l + w * stride_ml), a, L);
      O = __fmaf_rn(is_ldf<kCg>(o + w * stride_o), a, O);
    }
  }
  *M_out = M;
  *L_out = L;
  *O_out = O;
}

// Split partial row index: rows (b, q, h) in that order, S partials per row.
__device__ __forceinline__ long long is_prow(long long b, int qi, int Sq, int N, int h, int S,
                                             int s) {
  return ((b * Sq + qi) * (long long)N + h) * S + s;
}

// Write one finished element: the output when the row has one split, else the split's
// partial (unnormalised O, and m/l from the d == 0 thread).
__device__ __forceinline__ void is_write_out(is_t* y, float* part_o, float* part_ml, int S,
                                             int s, long long b, int h, int qi, int Sq, int N,
                                             int H, int d, float M, float L, float O) {
  if (S == 1) {
    is_store(y + ((b * N + h) * (long long)Sq + qi) * H + d, L > 0.f ? O / L : 0.f);
  } else {
    const long long prow = is_prow(b, qi, Sq, N, h, S, s);
    part_o[prow * H + d] = O;
    if (d == 0) {
      part_ml[prow * 2] = M;
      part_ml[prow * 2 + 1] = L;
    }
  }
}

// The normalisation of every split merge (is_finish_element, is_finish_if_last_v4, the ws
// build's cluster merge): O times the row's reciprocal 1 / L, which the vectorised merges
// compute once per row (a chain of divisions per element was ~1 us of the cluster merge's
// tail; is_finish_element, one element per call, still takes one reciprocal per element);
// a row that saw no key (L = 0) gives zeros. One split divides (is_store(O / L)): its own bits.
__device__ __forceinline__ float is_recip(float L) { return L > 0.f ? 1.f / L : 0.f; }
__device__ __forceinline__ float is_norm(float O, float L, float inv) {
  return L > 0.f ? O * inv : 0.f;
}

// Merge the S split partials of one output element in split order and store it. Shared by
// the in-kernel finish and is_combine, so both give the same bits.
__device__ __forceinline__ void is_finish_element(const float* part_o, const float* part_ml,
                                                  is_t* y, long long prow0, int S, int H, int d,
                                                  long long y_off) {
  float M, L, O;
  is_merge_parts<true>(part_ml + prow0 * 2, part_ml + prow0 * 2 + 1, part_o + prow0 * H + d, S, 2,
                       H, &M, &L, &O);
  is_store(y + y_off, is_norm(O, L, is_recip(L)));
}

// One element's S split partials merged as is_finish_element merges them (the max of the m,
// explicit FMAs in split order, times 1 / L: the same bits), with the loads batched: the
// partials are independent loads, issued IS_MERGE_CB at a time ahead of their arithmetic,
// two L2 round trips per IS_MERGE_CB splits (one for the max, one for the values) where
// is_merge_parts' loop waits on ~3 S loads in turn (H200, 8 splits of 128 heads: is_combine
// took ~7 us; docs/notes/index_share-history.md). pm: the (m, l) pairs of split 0 .. S - 1 (stride
// 2); po: split 0's value (stride H). For is_combine and the ws build's IS_CMERGE merge. (A
// template, so that a build that does not call it compiles to the same cubin as without it.)
template <int IS_MERGE_CB = 8>
__device__ __forceinline__ float is_merge_batched(const float* pm, const float* po, int S,
                                                  int H) {
  float M = is_neg_inf();
  for (int w0 = 0; w0 < S; w0 += IS_MERGE_CB) {
    float mv[IS_MERGE_CB];
#pragma unroll
    for (int j = 0; j < IS_MERGE_CB; ++j)
      mv[j] = w0 + j < S ? __ldcg(pm + 2 * (w0 + j)) : is_neg_inf();
#pragma unroll
    for (int j = 0; j < IS_MERGE_CB; ++j) M = fmaxf(M, mv[j]);  // exact: order-free
  }
  float L = 0.f, O = 0.f;
  if (M != is_neg_inf()) {
    for (int w0 = 0; w0 < S; w0 += IS_MERGE_CB) {
      float mv[IS_MERGE_CB], lv[IS_MERGE_CB], ov[IS_MERGE_CB];
#pragma unroll
      for (int j = 0; j < IS_MERGE_CB; ++j) {
        const bool ok = w0 + j < S;
        mv[j] = ok ? __ldcg(pm + 2 * (w0 + j)) : 0.f;
        lv[j] = ok ? __ldcg(pm + 2 * (w0 + j) + 1) : 0.f;
        ov[j] = ok ? __ldcg(po + (long long)(w0 + j) * H) : 0.f;
      }
#pragma unroll
      for (int j = 0; j < IS_MERGE_CB; ++j) {
        if (w0 + j < S) {  // is_merge_parts' step, split w0 + j
          const float a = exp2f(mv[j] - M);
          L = __fmaf_rn(lv[j], a, L);
          O = __fmaf_rn(ov[j], a, O);
        }
      }
    }
  }
  return is_norm(O, L, is_recip(L));
}

// Split-K arrival: every thread's partial stores are made device-wide visible, then one
// thread counts the CTA in on the task's counter. True (in every thread of the CTA) for the
// task's last CTA to arrive, which then reads the other splits' partials; the caller lets
// the others leave (the result is uniform over the CTA).
// `is_last_arrival_by` is the same for a subset of the CTA's threads: `tid` numbers the
// caller among them and `sync()` is their barrier (the persistent kernel's consumers).
template <class Sync>
__device__ __forceinline__ bool is_last_arrival_by(unsigned* counters, long long task, int S,
                                                   int* s_flag, int tid, Sync sync) {
  __threadfence();  // this thread's partial stores, device-wide, before the arrival below
  sync();
  if (tid == 0) {
    __threadfence();  // cumulative: the CTA's stores (seen through the barrier) first
    *s_flag = atomicAdd(counters + task, 1u) == (unsigned)(S - 1);
  }
  sync();
  const bool last = *s_flag != 0;
  if (last) __threadfence();
  return last;
}
__device__ __forceinline__ bool is_last_arrival(unsigned* counters, long long task, int S,
                                                int* s_flag) {
  return is_last_arrival_by(counters, task, S, s_flag, (int)threadIdx.x, [] { __syncthreads(); });
}

// In-kernel split-K finish (S > 1, counters given). Call with every thread of the CTA after
// it wrote its partials for heads [h0, h0 + nh) of (b, qi). The task's last CTA to arrive
// merges all S partials in split order — the same arithmetic whichever CTA it is, so Y is
// bitwise reproducible — and re-arms the task's counter. Counters start at zero (the host
// zeroes them when it allocates them) and every launch leaves them at zero.
__device__ __forceinline__ void is_finish_if_last(unsigned* counters, long long task, int S,
                                                  const float* part_o, const float* part_ml,
                                                  is_t* y, long long b, int qi, int Sq, int N,
                                                  int h0, int nh, int H, int* s_flag) {
  if (!is_last_arrival(counters, task, S, s_flag)) return;  // uniform: the whole CTA leaves
  for (int i = threadIdx.x; i < nh * H; i += blockDim.x) {
    const int r = i / H, d = i - r * H;
    is_finish_element(part_o, part_ml, y, is_prow(b, qi, Sq, N, h0 + r, S, 0), S, H, d,
                      ((b * N + h0 + r) * (long long)Sq + qi) * H + d);
  }
  if (threadIdx.x == 0) counters[task] = 0u;  // the next launch (stream order) starts at zero
}

#ifdef NXRT_EMU
#define IS_DYN_SMEM(name) unsigned char* name = emu_dynamic_smem()
// The emulation checks that the host sized the dynamic shared memory for what the kernel uses.
#define IS_DYN_SMEM_NEED(nbytes) emu_check_dynamic_smem((size_t)(nbytes))
#else
#define IS_DYN_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#define IS_DYN_SMEM_NEED(nbytes) ((void)0)
#endif
