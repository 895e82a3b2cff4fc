// IndexShare helper kernels: the fixed-capacity frontier, present K/V copies and scatters,
// and the deterministic split combine. (Capture-time index validation runs inside the
// attention kernels, in is_stage_keys.)
#include "index_share_common.cuh"

// valid_len[b] = max(valid_len[b], 1 + last column k with a finite bias for batch b).
// grid = (chunks, B); the bias is contiguous [pb, ph, pq, pk] (right-aligned, size-1
// axes broadcast) and valid_len must be zeroed first. A broadcast last axis (pk == 1)
// makes every column valid. Integer max is order-independent, so atomicMax is exact.
extern "C" __global__ void __launch_bounds__(256) is_frontier(
    const is_t* __restrict__ bias, int* __restrict__ valid_len, int pb, long long per_batch,
    int pk, int cache, long long chunk) {
  __shared__ int s_live;
  const int b = blockIdx.y;
  const is_t* src = bias + (pb == 1 ? 0 : (long long)b * per_batch);
  const long long lo = (long long)blockIdx.x * chunk;
  const long long hi = lo + chunk < per_batch ? lo + chunk : per_batch;
  int live = 0;
  for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    if (isfinite(is_to_f32(src[i]))) {
      const int k = pk == 1 ? cache : (int)(i % pk) + 1;
      live = is_imax(live, k);
    }
  }
  if (threadIdx.x == 0) s_live = 0;
  __syncthreads();
  live = is_warp_max(live);
  if ((threadIdx.x & 31) == 0) atomicMax(&s_live, live);
  __syncthreads();
  if (threadIdx.x == 0 && s_live > 0) atomicMax(valid_len + b, s_live);
}

// Segment copy in W-byte units: dst[seg*dst_stride + i] = src[seg*src_stride + i] for
// i < seg_len. Builds past ⧺ current (two launches per tensor).
template <typename W>
__device__ __forceinline__ void is_copy_impl(W* __restrict__ dst, const W* __restrict__ src,
                                             long long nseg, long long seg_len,
                                             long long src_stride, long long dst_stride) {
  const long long total = nseg * seg_len;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const long long seg = i / seg_len, off = i - seg * seg_len;
    dst[seg * dst_stride + off] = src[seg * src_stride + off];
  }
}

// Fixed capacity: write current token c of (b, h) at row max(valid_len[b] - Scur, 0) + c
// of the present (rows at or past `cache` are dropped), in W-byte units of a row.
template <typename W>
__device__ __forceinline__ void is_scatter_impl(W* __restrict__ dst, const W* __restrict__ src,
                                                const int* __restrict__ valid_len, int Nkv,
                                                int Scur, int cache, long long rows,
                                                long long row_len) {
  const long long total = rows * row_len;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const long long r = i / row_len, u = i - r * row_len;
    const int c = (int)(r % Scur);
    const long long bh = r / Scur;
    const int wp = is_imax(valid_len[bh / Nkv] - Scur, 0);
    const int t = wp + c;
    if (t < cache) dst[(bh * cache + t) * row_len + u] = src[r * row_len + u];
  }
}

#define IS_COPY_ENTRY(NAME, W)                                                               \
  extern "C" __global__ void __launch_bounds__(256) NAME(                                     \
      W* __restrict__ dst, const W* __restrict__ src, long long nseg, long long seg_len,      \
      long long src_stride, long long dst_stride) {                                           \
    is_copy_impl<W>(dst, src, nseg, seg_len, src_stride, dst_stride);                         \
  }
#define IS_SCATTER_ENTRY(NAME, W)                                                            \
  extern "C" __global__ void __launch_bounds__(256) NAME(                                     \
      W* __restrict__ dst, const W* __restrict__ src, const int* __restrict__ valid_len,      \
      int Nkv, int Scur, int cache, long long rows, long long row_len) {                      \
    is_scatter_impl<W>(dst, src, valid_len, Nkv, Scur, cache, rows, row_len);                 \
  }
IS_COPY_ENTRY(is_copy_w16, uint4)
IS_COPY_ENTRY(is_copy_w8, uint2)
IS_COPY_ENTRY(is_copy_w4, unsigned)
IS_COPY_ENTRY(is_copy_w2, unsigned short)
IS_SCATTER_ENTRY(is_scatter_w16, uint4)
IS_SCATTER_ENTRY(is_scatter_w8, uint2)
IS_SCATTER_ENTRY(is_scatter_w4, unsigned)
IS_SCATTER_ENTRY(is_scatter_w2, unsigned short)

// Combine S split partials per output element in split order (deterministic, the same
// arithmetic and bits as the in-kernel finishes: is_merge_batched): rows = B*Sq*N,
// partial p = row*S + s, row = (b*Sq + q)*N + h.
extern "C" __global__ void __launch_bounds__(256) is_combine(
    const float* __restrict__ part_o, const float* __restrict__ part_ml, is_t* __restrict__ y,
    long long rows, int S, int H, int Sq, int N) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && !defined(NXRT_EMU)
  // Launched programmatically after is_attn_ws (index_share.py): resident while the
  // partials are computed, it reads them only once that grid has completed and its writes
  // are visible (a no-op after an ordinary launch).
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  const long long total = rows * H;
  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (long long)gridDim.x * blockDim.x) {
    const long long row = i / H;
    const int d = (int)(i - row * H);
    const int h = (int)(row % N);
    const long long bq = row / N;
    const int qi = (int)(bq % Sq);
    const long long b = bq / Sq;
    is_store(y + ((b * N + h) * (long long)Sq + qi) * H + d,
             is_merge_batched(part_ml + row * S * 2, part_o + row * S * H + d, S, H));
  }
}

#ifdef NXRT_EMU
IS_EMU_EXPORT(is_frontier)
IS_EMU_EXPORT(is_copy_w16)
IS_EMU_EXPORT(is_copy_w8)
IS_EMU_EXPORT(is_copy_w4)
IS_EMU_EXPORT(is_copy_w2)
IS_EMU_EXPORT(is_scatter_w16)
IS_EMU_EXPORT(is_scatter_w8)
IS_EMU_EXPORT(is_scatter_w4)
IS_EMU_EXPORT(is_scatter_w2)
IS_EMU_EXPORT(is_combine)
#endif
