// PagedAttention (LATENT / MLA) read phase on tensor cores, split-KV, plus the LSE combine.
//
// Defines: PA_BF16 (1: bf16, 0: f16), PA_BN (keys per tile: 64, or 32 where shared memory is
// short), PA_HS / PA_VHS (latent width 576, value width 512).
//
// paged_mla_fwd: grid (row blocks, splits), 256 threads. A CTA owns M = 64 query rows of ONE
// sequence (rows are (token, head) pairs of that sequence, token-major, so with 128 heads a
// CTA is 64 heads of one token and with 16 heads it is 4 tokens x 16 heads) and one split of
// the tiles covering that sequence's key range. Per tile of BN keys:
//   cp.async 16-byte loads of the BN x HS latent rows into shared memory (double-buffered,
//     block-table lookup per key, the lookup prefetched one tile ahead into registers);
//   S = Q K^T: warp (wm, wn) computes rows [32wm, 32wm+32) x keys [wn*BN/4, ...) with
//     mma.sync m16n8k16 (Q and K fragments by ldmatrix from XOR-swizzled tiles);
//   online softmax (log2 domain): the four warps sharing rows exchange row maxima through
//     shared memory, P is rounded to the element type and stored to shared memory;
//   O += P V: warp (wm, wn) owns rows [32wm, 32wm+32) x value columns [wn*VHS/4, ...); V is
//     the leading VHS channels of the same tile, read with ldmatrix.trans.
// With one split the CTA writes the output; otherwise it writes the normalised partial O
// (f32) and its log2-sum-exp to the workspace and paged_mla_combine merges the splits.
//
// Row-block numbering needs no host readback: sequence b owns row blocks
// [G(b), G(b+1)) with G(b) = floor(cu[b] * H / 64) + (H % 64 ? b : 0), which always holds its
// ceil(q_len * H / 64) blocks; surplus CTAs exit at once. The grid is G(B) for cu[B] = T.
#include "paged_common.cuh"

#ifndef PA_BF16
#define PA_BF16 1
#endif
#ifndef PA_BN
#define PA_BN 64
#endif
#ifndef PA_HS
#define PA_HS 576
#endif
#ifndef PA_VHS
#define PA_VHS 512
#endif

#if PA_BF16
typedef __nv_bfloat16 elem_t;
#else
typedef __half elem_t;
#endif

namespace {

constexpr int HS = PA_HS;
constexpr int VHS = PA_VHS;
constexpr int BN = PA_BN;
constexpr int M = 64;            // query rows per CTA
constexpr int NTHREADS = 256;    // 8 warps: 2 (rows) x 4 (keys for S, value columns for O)
constexpr int HC = HS / 8;       // 16-byte chunks per latent row
constexpr int KPW = BN / 4;      // keys per warp in S
constexpr int NTS = KPW / 8;     // S n-tiles (8 keys) per warp: 2 (BN 64) or 1 (BN 32)
constexpr int CPW = VHS / 4;     // value columns per warp
constexpr int NTO = CPW / 8;     // O n-tiles per warp
constexpr int LOAD_ROWS = NTHREADS / 8;  // tile rows loaded per pass (8 threads per row)
constexpr int NPASS = BN / LOAD_ROWS;

static_assert(HS % 64 == 0, "the XOR swizzle needs a multiple of 8 chunks per row");
static_assert(VHS % 64 == 0 && VHS <= HS, "each warp's value columns must be a multiple of 16");
static_assert(BN == 64 || BN == 32, "tile of 64 or 32 keys");
static_assert(HC % 8 == 0, "8 loader threads per row");

// Shared memory layout (bytes); paged_attention.py mirrors this in _mla_smem_bytes().
constexpr int Q_BYTES = M * HS * 2;
constexpr int KV_BYTES = BN * HS * 2;  // one stage
constexpr int P_BYTES = M * BN * 2;
constexpr int RED_BYTES = 4 * M * 4;
constexpr int ROW_BYTES = 3 * M * 4;
constexpr int VALID_BYTES = ((2 * BN + 15) / 16) * 16;
constexpr int MISC_BYTES = 32;
constexpr int OFF_KV = Q_BYTES;
constexpr int OFF_P = OFF_KV + 2 * KV_BYTES;
constexpr int OFF_RED = OFF_P + P_BYTES;
constexpr int OFF_ROW = OFF_RED + RED_BYTES;
constexpr int OFF_VALID = OFF_ROW + ROW_BYTES;
constexpr int OFF_MISC = OFF_VALID + VALID_BYTES;
constexpr int SMEM_BYTES = OFF_MISC + MISC_BYTES;

// Element offset of (row, 16-byte chunk c) in a swizzled [rows][HS] tile: chunk c of row r
// lives at chunk c ^ (r & 7), so the 8 rows an ldmatrix reads hit 8 distinct bank groups.
__device__ __forceinline__ int kv_off(int r, int c) { return r * HS + ((c ^ (r & 7)) << 3); }

// Same for the [M][BN] P tile (8 or 4 chunks per row).
__device__ __forceinline__ int p_off(int r, int c) {
  return BN == 64 ? r * BN + ((c ^ (r & 7)) << 3) : r * BN + ((c ^ ((r >> 1) & 3)) << 3);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
paged_mla_fwd(const elem_t* __restrict__ query, const elem_t* __restrict__ key_cache,
              const elem_t* __restrict__ cos_c, const elem_t* __restrict__ sin_c,
              const int* __restrict__ cu, const int* __restrict__ past,
              const int* __restrict__ block_table, elem_t* __restrict__ out,
              float* __restrict__ ws_o, float* __restrict__ ws_lse,
              unsigned* __restrict__ latch, int n_tokens, int H, int B, int num_blocks,
              int block_size, int max_blocks, int rd, int off, int max_pos, int interleaved,
              int do_rotary, float scale, float softcap, int window, int num_splits) {
  typedef pa::Num<elem_t> N;
  extern __shared__ __align__(16) unsigned char smem[];
  // A launch with less dynamic shared memory than this layout would write past the end.
  if (pa::dynamic_smem_bytes() < (unsigned)SMEM_BYTES) return;
  elem_t* sQ = reinterpret_cast<elem_t*>(smem);
  elem_t* sKV = reinterpret_cast<elem_t*>(smem + OFF_KV);
  elem_t* sP = reinterpret_cast<elem_t*>(smem + OFF_P);
  float* sRed = reinterpret_cast<float*>(smem + OFF_RED);     // [4][M]
  int* sRowP = reinterpret_cast<int*>(smem + OFF_ROW);        // last key a row sees (-1: none)
  int* sRowLo = sRowP + M;                                    // first key a row sees
  int* sRowOut = sRowLo + M;                                  // t * H + h, or -1
  unsigned char* sValid = smem + OFF_VALID;                   // [2][BN] key loaded and in range
  int* sMisc = reinterpret_cast<int*>(smem + OFF_MISC);       // 0: b, 1: key lo, 2: key hi

  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  const int wm = warp >> 2, wn = warp & 3;
  const int g = lane >> 2, tq = lane & 3;
  const int x = blockIdx.x;
  const int split = blockIdx.y;

  // ---- 1-2. Sequence of row block x, per-row positions and key ranges (paged_common.cuh).
  int key_lo, key_hi;
  const int b = pa::mla_rows<M>(cu, past, latch, n_tokens, H, B, x, max_blocks, block_size,
                                max_pos, do_rotary, window, sMisc, sRowP, sRowLo, sRowOut,
                                key_lo, key_hi);
  if (b < 0) return;  // surplus CTA (uniform)
  int tile_begin, n_tiles;
  pa::split_tiles(key_lo, key_hi, BN, split, num_splits, tile_begin, n_tiles);

  // This thread's four rows (mt, half) in the mma C layout.
  int my_p[2][2], my_lo[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = 32 * wm + 16 * mt + g + 8 * hf;
      my_p[mt][hf] = sRowP[r];
      my_lo[mt][hf] = sRowLo[r];
    }

  float o[2][NTO][4];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < NTO; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][nt][e] = 0.0f;
  float m_run[2][2], l_run[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      m_run[mt][hf] = PA_NEG_INF;
      l_run[mt][hf] = 0.0f;
    }

  const int* bt_row = block_table + (long long)b * max_blocks;
  const int ld_row = tid >> 3, ld_chunk = tid & 7;
  int pf_phys[NPASS];
  bool pf_need[NPASS];
  // Block-table lookup for the rows this thread loads in tile `tile` (result used later, so
  // the global load latency overlaps the current tile's math).
  auto prefetch = [&](int tile) {
#pragma unroll
    for (int ps = 0; ps < NPASS; ++ps) {
      const int j = tile * BN + ld_row + ps * LOAD_ROWS;
      pf_need[ps] = j >= key_lo && j <= key_hi;
      const int blk = j / block_size;
      pf_phys[ps] = (pf_need[ps] && blk < max_blocks) ? bt_row[blk] : -1;
    }
  };
  auto issue = [&](int tile, int stage) {
    elem_t* dst_base = sKV + stage * (BN * HS);
#pragma unroll
    for (int ps = 0; ps < NPASS; ++ps) {
      const int r = ld_row + ps * LOAD_ROWS;
      const int j = tile * BN + r;
      const int phys = pf_phys[ps];
      const bool ok = pf_need[ps] && phys >= 0 && phys < num_blocks;
      if (pf_need[ps] && !ok && ld_chunk == 0) atomicOr(latch, PA_LATCH_BLOCK);
      const elem_t* src_row =
          ok ? key_cache + ((long long)phys * block_size + (j & (block_size - 1))) * HS : key_cache;
#pragma unroll
      for (int k = 0; k < HC / 8; ++k) {
        const int c = ld_chunk + 8 * k;
        // Rows not needed or not resolvable are zero-filled (finite V) and masked below.
        pa::cp_async16(pa::smem_u32(dst_base + kv_off(r, c)), src_row + (ok ? c * 8 : 0),
                       ok ? 16 : 0);
      }
      if (ld_chunk == 0) sValid[stage * BN + r] = ok ? 1 : 0;
    }
  };

  if (n_tiles > 0) {
    // ---- 3. Prologue: Q rows (zero for rows past the sequence) and tile 0, one group.
    for (int idx = tid; idx < M * HC; idx += NTHREADS) {
      const int r = idx / HC, c = idx - r * HC;
      const int orow = sRowOut[r];
      const bool ok = orow >= 0;
      pa::cp_async16(pa::smem_u32(sQ + kv_off(r, c)),
                     ok ? query + (long long)orow * HS + c * 8 : query, ok ? 16 : 0);
    }
    prefetch(tile_begin);
    issue(tile_begin, 0);
    pa::cp_async_commit();
    if (n_tiles > 1) prefetch(tile_begin + 1);
  }

  const float sl2 = scale * PA_LOG2E;
  for (int it = 0; it < n_tiles; ++it) {
    const int stage = it & 1;
    pa::cp_async_wait_all();
    // [A] Tile `it` (and at it == 0 the Q rows) visible to all; every warp is done with
    // tile it-1, so its stage, P and the row-max exchange may be overwritten.
    __syncthreads();
    if (it == 0 && do_rotary) {
      // Partial RoPE on the query rows in place (each pair belongs to one thread).
      const int half = rd >> 1;
      for (int idx = tid; idx < M * half; idx += NTHREADS) {
        const int r = idx / half, i = idx - r * half;
        const int p = sRowP[r];
        if (p < 0) continue;
        const int d1 = interleaved ? off + 2 * i : off + i;
        const int d2 = interleaved ? d1 + 1 : d1 + half;
        elem_t* e1 = sQ + kv_off(r, d1 >> 3) + (d1 & 7);
        elem_t* e2 = sQ + kv_off(r, d2 >> 3) + (d2 & 7);
        const float cs = N::to_f(cos_c[(long long)p * half + i]);
        const float sn = N::to_f(sin_c[(long long)p * half + i]);
        const float x1 = N::to_f(*e1), x2 = N::to_f(*e2);
        *e1 = N::from_f(x1 * cs - x2 * sn);
        *e2 = N::from_f(x2 * cs + x1 * sn);
      }
      __syncthreads();
    }
    if (it + 1 < n_tiles) {
      issue(tile_begin + it + 1, stage ^ 1);
      pa::cp_async_commit();
      if (it + 2 < n_tiles) prefetch(tile_begin + it + 2);
    }
    const elem_t* sK = sKV + stage * (BN * HS);

    // ---- S = Q K^T for rows [32wm, +32) x keys [wn*KPW, +KPW).
    float s[2][NTS][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < NTS; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
    const int a_row = 32 * wm + (lane & 7) + ((lane >> 3) & 1) * 8;  // + 16 * mt
    const int a_chk = lane >> 4;
#pragma unroll 6
    for (int ks = 0; ks < HS / 16; ++ks) {
      unsigned a[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int r = a_row + 16 * mt;
        pa::ldsm_x4(a[mt], pa::smem_u32(sQ + kv_off(r, 2 * ks + a_chk)));
      }
      if (NTS == 2) {
        unsigned bb[4];
        const int kr = wn * KPW + (lane & 7) + (lane >> 4) * 8;
        pa::ldsm_x4(bb, pa::smem_u32(sK + kv_off(kr, 2 * ks + ((lane >> 3) & 1))));
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          pa::Mma<elem_t>::run(s[mt][0], a[mt], bb[0], bb[1]);
          pa::Mma<elem_t>::run(s[mt][NTS - 1], a[mt], bb[2], bb[3]);
        }
      } else {
        unsigned b0, b1;
        const int kr = wn * KPW + (lane & 7);
        pa::ldsm_x2(b0, b1, pa::smem_u32(sK + kv_off(kr, 2 * ks + ((lane >> 3) & 1))));
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) pa::Mma<elem_t>::run(s[mt][0], a[mt], b0, b1);
      }
    }

    // ---- Scale, softcap, mask; row maxima of this warp's keys.
    const int key0 = (tile_begin + it) * BN;
    float mx[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      mx[mt][0] = PA_NEG_INF;
      mx[mt][1] = PA_NEG_INF;
#pragma unroll
      for (int nt = 0; nt < NTS; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int hf = e >> 1;
          const int kl = wn * KPW + 8 * nt + 2 * tq + (e & 1);
          const int j = key0 + kl;
          const bool ok = sValid[stage * BN + kl] && j >= my_lo[mt][hf] && j <= my_p[mt][hf];
          float v;
          if (softcap > 0.0f) {
            v = softcap * tanhf(s[mt][nt][e] * scale / softcap) * PA_LOG2E;
          } else {
            v = s[mt][nt][e] * sl2;
          }
          v = ok ? v : PA_NEG_INF;
          s[mt][nt][e] = v;
          mx[mt][hf] = fmaxf(mx[mt][hf], v);
        }
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        float v = mx[mt][hf];
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
        if (tq == 0) sRed[wn * M + 32 * wm + 16 * mt + g + 8 * hf] = v;
      }
    __syncthreads();  // [B] the four warps' row maxima are in sRed

    // ---- Online softmax update; P to shared memory.
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        const int r = 32 * wm + 16 * mt + g + 8 * hf;
        const float tile_max =
            fmaxf(fmaxf(sRed[r], sRed[M + r]), fmaxf(sRed[2 * M + r], sRed[3 * M + r]));
        const float m_new = fmaxf(m_run[mt][hf], tile_max);
        // A row with no key yet keeps m = -inf; use 0 so no (-inf) - (-inf) appears.
        const float m_use = m_new == PA_NEG_INF ? 0.0f : m_new;
        const float corr = exp2f(m_run[mt][hf] - m_use);
        m_run[mt][hf] = m_new;
        float rs = 0.0f;
#pragma unroll
        for (int nt = 0; nt < NTS; ++nt) {
          const float p0 = exp2f(s[mt][nt][2 * hf] - m_use);
          const float p1 = exp2f(s[mt][nt][2 * hf + 1] - m_use);
          rs += p0 + p1;
          const int kl = wn * KPW + 8 * nt + 2 * tq;
          *reinterpret_cast<unsigned*>(sP + p_off(r, kl >> 3) + (kl & 7)) = N::pack2(p0, p1);
        }
        l_run[mt][hf] = l_run[mt][hf] * corr + rs;
#pragma unroll
        for (int nt = 0; nt < NTO; ++nt) {
          o[mt][nt][2 * hf] *= corr;
          o[mt][nt][2 * hf + 1] *= corr;
        }
      }
    __syncthreads();  // [C] P complete

    // ---- O += P V for rows [32wm, +32) x value columns [wn*CPW, +CPW).
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      unsigned a[2][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const int r = a_row + 16 * mt;
        pa::ldsm_x4(a[mt], pa::smem_u32(sP + p_off(r, 2 * kk + a_chk)));
      }
      const int vr = 16 * kk + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
      for (int np = 0; np < NTO / 2; ++np) {
        unsigned bv[4];
        const int c = (wn * CPW + 16 * np) / 8 + (lane >> 4);
        pa::ldsm_x4_trans(bv, pa::smem_u32(sK + kv_off(vr, c)));
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          pa::Mma<elem_t>::run(o[mt][2 * np], a[mt], bv[0], bv[1]);
          pa::Mma<elem_t>::run(o[mt][2 * np + 1], a[mt], bv[2], bv[3]);
        }
      }
    }
  }
  pa::cp_async_wait_all();

  // ---- 4. Epilogue: full row sums (quad, then the four warps), then output or partials.
  float lq[2][2];
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float v = l_run[mt][hf];
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      lq[mt][hf] = v;
    }
  __syncthreads();  // sRed is free again
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
      if (tq == 0) sRed[wn * M + 32 * wm + 16 * mt + g + 8 * hf] = lq[mt][hf];
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = 32 * wm + 16 * mt + g + 8 * hf;
      const int orow = sRowOut[r];
      if (orow < 0) continue;
      const float l = sRed[r] + sRed[M + r] + sRed[2 * M + r] + sRed[3 * M + r];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      if (num_splits == 1) {
        elem_t* dst = out + (long long)orow * VHS + wn * CPW + 2 * tq;
#pragma unroll
        for (int nt = 0; nt < NTO; ++nt) {
          *reinterpret_cast<unsigned*>(dst + 8 * nt) =
              N::pack2(o[mt][nt][2 * hf] * inv, o[mt][nt][2 * hf + 1] * inv);
        }
      } else {
        const long long prow = (long long)orow * num_splits + split;
        float* dst = ws_o + prow * VHS + wn * CPW + 2 * tq;
#pragma unroll
        for (int nt = 0; nt < NTO; ++nt) {
          *reinterpret_cast<float2*>(dst + 8 * nt) =
              make_float2(o[mt][nt][2 * hf] * inv, o[mt][nt][2 * hf + 1] * inv);
        }
        if (wn == 0 && tq == 0) ws_lse[prow] = l > 0.0f ? m_run[mt][hf] + __log2f(l) : PA_NEG_INF;
      }
    }
}

// One CTA of 128 threads per output row (t * H + h); thread i owns columns 4i + 512k. The
// split weights 2^(lse_s - max) / sum are staged in shared memory 64 splits at a time, and the
// split loop is unrolled so that each thread has several 16-byte partial loads in flight (the
// partials were just written and mostly sit in L2: this kernel is latency-bound, not
// bandwidth-bound). A split that saw no key has lse = -inf, weight 0 and a zero partial.
constexpr int COMBINE_THREADS = 128;
constexpr int COMBINE_CHUNK = 64;

extern "C" __global__ void __launch_bounds__(COMBINE_THREADS)
paged_mla_combine(const float* __restrict__ ws_o, const float* __restrict__ ws_lse,
                  elem_t* __restrict__ out, int rows, int num_splits,
                  const int* __restrict__ counts, int slot_rows, int slot_stride) {
  typedef pa::Num<elem_t> N;
  __shared__ float sw[COMBINE_CHUNK];
  const int tid = threadIdx.x, lane = tid & 31;
  const long long row = blockIdx.x;
  if (row >= rows) return;  // uniform
#if __CUDA_ARCH__ >= 900
  // May be launched programmatically after the read kernel (kernel.py): wait for its
  // partials before touching the workspace or the output.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
  // counts (balanced split-KV): this row's chunks; 1: written directly. Partials of split s
  // at slot row base + s * stride: the row's own num_splits slots (base row * num_splits,
  // stride 1), or with slot_rows > 0 the pair kernel's partition (paged_mla_pair.cu): row
  // block slots of 64 rows, the row's first slot row after the counts, slot_stride slot rows
  // a chunk. Clamped: a count or base is never trusted to index past the slots.
  long long base = row * num_splits, stride = 1;
  int used = counts != nullptr ? min(counts[row], num_splits) : num_splits;
  if (slot_rows > 0) {
    base = counts[rows + row];
    stride = max(slot_stride, 1);
    used = base >= 0 && base < slot_rows ? min(used, (int)((slot_rows - 1 - base) / stride) + 1)
                                         : 0;
  }
  if (counts != nullptr && used <= 1) return;  // uniform
  const float* lse = ws_lse + base;
  // Max and sum of 2^lse, computed redundantly by every warp (no barrier needed).
  float mx = PA_NEG_INF;
  for (int s = lane; s < used; s += 32) mx = fmaxf(mx, lse[s * stride]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0.0f;
  if (mx != PA_NEG_INF) {
    for (int s = lane; s < used; s += 32) sum += exp2f(lse[s * stride] - mx);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
  const float* po = ws_o + base * VHS;
  elem_t* dst = out + row * VHS;
  constexpr int NCOL = (VHS + 4 * COMBINE_THREADS - 1) / (4 * COMBINE_THREADS);
  float4 acc[NCOL];
#pragma unroll
  for (int k = 0; k < NCOL; ++k) acc[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int s0 = 0; s0 < used; s0 += COMBINE_CHUNK) {
    const int ns = min(COMBINE_CHUNK, used - s0);
    __syncthreads();  // the previous chunk's weights are no longer read
    if (tid < ns) sw[tid] = mx != PA_NEG_INF ? exp2f(lse[(s0 + tid) * stride] - mx) * inv : 0.0f;
    __syncthreads();
#pragma unroll 8
    for (int s = 0; s < ns; ++s) {
      const float w = sw[s];
      const float* src = po + (s0 + s) * stride * VHS;
#pragma unroll
      for (int k = 0; k < NCOL; ++k) {
        const int d = 4 * tid + 4 * COMBINE_THREADS * k;
        // w == 0: skip the load (uniform per split), so nothing but weighted partials counts.
        if (d < VHS && w != 0.0f) {
          const float4 v = __ldcg(reinterpret_cast<const float4*>(src + d));
          acc[k].x += w * v.x;
          acc[k].y += w * v.y;
          acc[k].z += w * v.z;
          acc[k].w += w * v.w;
        }
      }
    }
  }
#pragma unroll
  for (int k = 0; k < NCOL; ++k) {
    const int d = 4 * tid + 4 * COMBINE_THREADS * k;
    if (d < VHS) {
      uint2 packed;
      packed.x = N::pack2(acc[k].x, acc[k].y);
      packed.y = N::pack2(acc[k].z, acc[k].w);
      *reinterpret_cast<uint2*>(dst + d) = packed;
    }
  }
}
