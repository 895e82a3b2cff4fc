// PagedAttention (LATENT): the write phase and the simple read phase.
//
// paged_write_*: one CTA per new token: partial RoPE on the latent key row, then scatter to
//   key_cache[slot_mapping[t]] (slot -1 skips; a slot past the cache latches and skips).
// paged_simple_*: one CTA of 4 warps per (token, head): the obviously-correct read phase,
//   used for shapes the MLA kernel is not built for (e.g. head 80 / v 64) and as fallback.
//   Each warp walks every 4th key with its own online softmax; the four are merged at the end.
#include "paged_common.cuh"

namespace {

template <typename T>
__device__ void write_rows(const T* __restrict__ key, const T* __restrict__ cos_c,
                           const T* __restrict__ sin_c, const int* __restrict__ slot_mapping,
                           const int* __restrict__ cu, const int* __restrict__ past,
                           T* __restrict__ key_cache, unsigned* __restrict__ latch, int n_tokens,
                           int B, int hs, int num_slots, int rd, int off, int max_pos,
                           int interleaved, int do_rotary) {
#if __CUDA_ARCH__ >= 900
  // The read kernel may be launched programmatically after this one (paged_attention
  // kernel.py): let it start its prologue now; it waits for this grid before reading keys.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  const int t = blockIdx.x;
  if (t >= n_tokens) return;
  const int slot = slot_mapping[t];
  if (slot < 0) return;  // -1: the caller asked for no write
  if (slot >= num_slots) {
    if (threadIdx.x == 0) atomicOr(latch, PA_LATCH_SLOT);
    return;
  }
  const T* src = key + (long long)t * hs;
  T* dst = key_cache + (long long)slot * hs;
  if (!do_rotary) {
    // Bitwise copy: the cache row equals the key row exactly.
    const unsigned short* s16 = reinterpret_cast<const unsigned short*>(src);
    unsigned short* d16 = reinterpret_cast<unsigned short*>(dst);
    for (int d = threadIdx.x; d < hs; d += blockDim.x) d16[d] = s16[d];
    return;
  }
  const int b = pa::locate_seq(cu, B, t);
  long long pos = -1;
  if (b >= 0) pos = (long long)past[b] + (t - (long long)cu[b]);
  if (pos < 0 || pos >= max_pos) {
    if (threadIdx.x == 0) atomicOr(latch, PA_LATCH_POSITION);
    return;
  }
  const unsigned short* s16 = reinterpret_cast<const unsigned short*>(src);
  unsigned short* d16 = reinterpret_cast<unsigned short*>(dst);
  for (int d = threadIdx.x; d < hs; d += blockDim.x) {
    if (d < off || d >= off + rd) {
      d16[d] = s16[d];
    } else {
      dst[d] = pa::Num<T>::from_f(pa::rope_channel(src, d, off, rd, pos, cos_c, sin_c, interleaved));
    }
  }
}

constexpr int SIMPLE_WARPS = 4;

template <typename T>
__device__ void simple_attention(const T* __restrict__ query, const T* __restrict__ key_cache,
                                 const T* __restrict__ cos_c, const T* __restrict__ sin_c,
                                 const int* __restrict__ cu, const int* __restrict__ past,
                                 const int* __restrict__ block_table, T* __restrict__ out,
                                 unsigned* __restrict__ latch, int n_tokens, int H, int B, int hs,
                                 int vhs, int num_blocks, int block_size, int max_blocks, int rd,
                                 int off, int max_pos, int interleaved, int do_rotary, float scale,
                                 float softcap, int window) {
  extern __shared__ float smem[];
  float* q = smem;                          // [hs] roped query row, f32
  float* acc = q + hs;                      // [SIMPLE_WARPS][vhs] per-warp unnormalised output
  float* ml = acc + SIMPLE_WARPS * vhs;     // [SIMPLE_WARPS][2] per-warp (max, sum)
  const long long row = blockIdx.x;         // t * H + h
  const int t = (int)(row / H);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (t >= n_tokens) return;
  T* out_row = out + row * vhs;

  const int b = pa::locate_seq(cu, B, t);
  long long pos = -1;
  if (b >= 0) pos = (long long)past[b] + (t - (long long)cu[b]);
  if (do_rotary && (pos < 0 || pos >= max_pos)) {
    if (threadIdx.x == 0 && b >= 0) atomicOr(latch, PA_LATCH_POSITION);
    pos = -1;
  }
  if (pos < 0) {  // no key to attend to: the output row is zero
    for (int d = threadIdx.x; d < vhs; d += blockDim.x) out_row[d] = pa::Num<T>::from_f(0.0f);
    return;
  }

  const T* q_row = query + row * hs;
  for (int d = threadIdx.x; d < hs; d += blockDim.x) {
    q[d] = do_rotary ? pa::rope_channel(q_row, d, off, rd, pos, cos_c, sin_c, interleaved)
                     : pa::Num<T>::to_f(q_row[d]);
  }
  float* my_acc = acc + warp * vhs;
  for (int d = lane; d < vhs; d += 32) my_acc[d] = 0.0f;
  __syncthreads();

  // Keys past the table can only latch: stop at the first of them.
  if (pos > (long long)max_blocks * block_size) pos = (long long)max_blocks * block_size;
  const long long lo = window >= 0 ? (pos - window > 0 ? pos - window : 0) : 0;
  float m = PA_NEG_INF, l = 0.0f;
  const int* bt_row = block_table + (long long)b * max_blocks;
  for (long long j = lo + warp; j <= pos; j += SIMPLE_WARPS) {
    const long long blk = j / block_size;
    int phys = -1;
    if (blk < max_blocks) phys = bt_row[blk];
    if (phys < 0 || phys >= num_blocks) {  // uniform across the warp
      if (lane == 0) atomicOr(latch, PA_LATCH_BLOCK);
      continue;
    }
    const T* k_row = key_cache + ((long long)phys * block_size + (j % block_size)) * hs;
    float dot = 0.0f;
    for (int d = lane; d < hs; d += 32) dot += q[d] * pa::Num<T>::to_f(k_row[d]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    float s = dot * scale;
    if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
    const float m_new = fmaxf(m, s);
    const float corr = __expf(m - m_new);  // m = -inf on the first key: corr = 0
    const float p = __expf(s - m_new);
    l = l * corr + p;
    m = m_new;
    for (int d = lane; d < vhs; d += 32) {
      my_acc[d] = my_acc[d] * corr + p * pa::Num<T>::to_f(k_row[d]);
    }
  }
  if (lane == 0) {
    ml[2 * warp] = m;
    ml[2 * warp + 1] = l;
  }
  __syncthreads();
  float mx = PA_NEG_INF;
#pragma unroll
  for (int w = 0; w < SIMPLE_WARPS; ++w) mx = fmaxf(mx, ml[2 * w]);
  float wgt[SIMPLE_WARPS];
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < SIMPLE_WARPS; ++w) {
    // A warp that saw no key has m = -inf, l = 0 and acc = 0: weight 0.
    wgt[w] = ml[2 * w] == PA_NEG_INF ? 0.0f : __expf(ml[2 * w] - mx);
    total += wgt[w] * ml[2 * w + 1];
  }
  const float inv = total > 0.0f ? 1.0f / total : 0.0f;
  for (int d = threadIdx.x; d < vhs; d += blockDim.x) {
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < SIMPLE_WARPS; ++w) v += wgt[w] * acc[w * vhs + d];
    out_row[d] = pa::Num<T>::from_f(v * inv);
  }
}

}  // namespace

#define PA_WRITE_ENTRY(NAME, T)                                                                 \
  extern "C" __global__ void __launch_bounds__(128) NAME(                                       \
      const T* key, const T* cos_c, const T* sin_c, const int* slot_mapping, const int* cu,     \
      const int* past, T* key_cache, unsigned* latch, int n_tokens, int B, int hs,              \
      int num_slots, int rd, int off, int max_pos, int interleaved, int do_rotary) {            \
    write_rows<T>(key, cos_c, sin_c, slot_mapping, cu, past, key_cache, latch, n_tokens, B, hs, \
                  num_slots, rd, off, max_pos, interleaved, do_rotary);                         \
  }

#define PA_SIMPLE_ENTRY(NAME, T)                                                                \
  extern "C" __global__ void __launch_bounds__(128) NAME(                                       \
      const T* query, const T* key_cache, const T* cos_c, const T* sin_c, const int* cu,        \
      const int* past, const int* block_table, T* out, unsigned* latch, int n_tokens, int H,    \
      int B, int hs, int vhs, int num_blocks, int block_size, int max_blocks, int rd, int off,  \
      int max_pos, int interleaved, int do_rotary, float scale, float softcap, int window) {    \
    simple_attention<T>(query, key_cache, cos_c, sin_c, cu, past, block_table, out, latch,      \
                        n_tokens, H, B, hs, vhs, num_blocks, block_size, max_blocks, rd, off,   \
                        max_pos, interleaved, do_rotary, scale, softcap, window);               \
  }

PA_WRITE_ENTRY(paged_write_f16, __half)
PA_WRITE_ENTRY(paged_write_bf16, __nv_bfloat16)
PA_SIMPLE_ENTRY(paged_simple_f16, __half)
PA_SIMPLE_ENTRY(paged_simple_bf16, __nv_bfloat16)
