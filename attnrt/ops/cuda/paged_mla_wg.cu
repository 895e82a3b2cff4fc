// PagedAttention (LATENT / MLA) read phase with Hopper warpgroup MMA (wgmma): sm_90a only.
//
// Same contract, grid and workspace as paged_mla_fwd (paged_mla.cu): grid (row blocks, splits),
// a CTA owns M = 64 (token, head) rows of one sequence and one split of its key range; the
// partials it writes are merged by paged_mla_combine of paged_mla.cu. Defines: PA_BF16,
// PA_HS / PA_VHS (576 / 512). Tiles are BN = 64 keys (why not 32:
// docs/notes/paged_attention.md#wg-tile).
//
// 256 threads = two warpgroups (WG). Shared memory holds Q (64 x 576) and two stages of the
// 64 x 576 latent tile, all in the wgmma "128-byte swizzle" layout: 64-channel blocks of
// [rows][128 bytes], 16-byte chunk c of row r stored at chunk c ^ (r & 7), blocks 1024-byte
// aligned. The same bytes are read K-major (Q and K for S = Q K^T) and N-major (V for P V).
// Per tile:
//   WG1:  cp.async of the next tile into the other stage (issued after barrier A);
//   WG0:  S = Q K^T as 36 wgmma m64n64k16 (A = Q, B = K, both from shared memory); mask,
//         online softmax in the log2 domain (a warp owns 16 whole rows: quad shuffles only);
//         P (bf16/f16) kept in registers as the A operand and stored to shared memory; the
//         row rescale factors to shared memory;
//   barrier B;
//   WG0/WG1: O[:, 256 wg + (0..255)] = O * corr + P V as 16 wgmma m64n64k16 with A = P from
//         registers (WG1 loads it with ldmatrix) and B = V (the tile's leading 512 channels).
// WG0 owns the softmax state; WG1 only rescales. O is 64 x 256 f32 per WG = 128 registers.
#include "paged_common.cuh"

#ifndef PA_BF16
#define PA_BF16 1
#endif
#ifndef PA_HS
#define PA_HS 576
#endif
#ifndef PA_VHS
#define PA_VHS 512
#endif

#if PA_BF16
typedef __nv_bfloat16 elem_t;
#define NXRT_WG_AB "bf16.bf16"
#else
typedef __half elem_t;
#define NXRT_WG_AB "f16.f16"
#endif

namespace {

constexpr int HS = PA_HS;
constexpr int VHS = PA_VHS;
constexpr int BN = 64;          // keys per tile
constexpr int STAGES = 2;       // tiles in shared memory beside Q
constexpr int KS = BN / 16;     // k-steps of P V
constexpr int M = 64;           // query rows per CTA (the wgmma M)
constexpr int NTHREADS = 256;   // two warpgroups
constexpr int HB = HS / 64;     // 64-channel blocks per latent row
constexpr int VBW = VHS / 128;  // 64-column blocks of O per warpgroup
constexpr int HC = HS / 8;      // 16-byte chunks per latent row
constexpr int LOADERS = 128;             // WG1 loads the tiles (it is idle while WG0 does S)
constexpr int LOAD_ROWS = LOADERS / 8;   // tile rows loaded per pass (8 threads per row)
constexpr int NPASS = BN / LOAD_ROWS;

static_assert(HS % 64 == 0, "latent width must be a multiple of 64 (128-byte swizzle rows)");
static_assert(VHS % 128 == 0 && VHS <= HS, "value width must be a multiple of 128 (two WGs)");

// Shared memory layout (bytes from a 1024-aligned base); paged_attention.py mirrors
// SMEM_BYTES in mla_wg_smem_bytes().
constexpr int QBLK = M * 128;            // one 64-channel block of Q
constexpr int TBLK = BN * 128;           // one 64-channel block of a tile
constexpr int Q_BYTES = HB * QBLK;
constexpr int T_BYTES = HB * TBLK;       // one stage
constexpr int OFF_KV = Q_BYTES;
constexpr int OFF_P = OFF_KV + STAGES * T_BYTES;  // [M][BN] P, swizzled rows of 128 bytes
constexpr int OFF_CORR = OFF_P + M * 128;     // float[M] per-tile row rescale
constexpr int OFF_L = OFF_CORR + M * 4;       // float[M] final row sums
constexpr int OFF_ROW = OFF_L + M * 4;        // int[3][M] rows: last key, first key, out row
constexpr int OFF_VALID = OFF_ROW + 3 * M * 4;  // uchar[STAGES][BN]
constexpr int OFF_MISC = OFF_VALID + STAGES * BN;  // int[8]
constexpr int SMEM_USED = OFF_MISC + 32;
constexpr int SMEM_BYTES = SMEM_USED + 1024;  // + slack to round the base up to 1024 bytes
static_assert(OFF_KV % 1024 == 0 && OFF_P % 1024 == 0 && T_BYTES % 1024 == 0,
              "swizzle atoms must be 1024-byte aligned");

#include "wgmma.cuh"

}  // namespace

extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
paged_mla_wg_fwd(const elem_t* __restrict__ query, const elem_t* __restrict__ key_cache,
                 const elem_t* __restrict__ cos_c, const elem_t* __restrict__ sin_c,
                 const int* __restrict__ cu, const int* __restrict__ past,
                 const int* __restrict__ block_table, elem_t* __restrict__ out,
                 float* __restrict__ ws_o, float* __restrict__ ws_lse,
                 unsigned* __restrict__ latch, int n_tokens, int H, int B, int num_blocks,
                 int block_size, int max_blocks, int rd, int off, int max_pos, int interleaved,
                 int do_rotary, float scale, float softcap, int window, int num_splits,
                 int* __restrict__ ws_cnt, int sms, float tile_us, float pro_us, float part_us,
                 float comb_us, float comb_rate) {
  // ws_cnt != nullptr: balanced split-KV (pa::balanced_sched; num_splits is then the
  // workspace's split stride and the largest chunk count); else every row block's key range
  // is cut into num_splits equal parts, one per blockIdx.y.
  typedef pa::Num<elem_t> N;
  // Declared 16-byte aligned only, so the compiler cannot fold the runtime round-up below.
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // A launch with less dynamic shared memory than this layout would write past the end.
  if (pa::dynamic_smem_bytes() < (unsigned)SMEM_BYTES) return;
  // The 128-byte swizzle pattern repeats every 1024 bytes; wgmma descriptors assume atoms
  // start on such a boundary (base_offset 0), so round the base up (SMEM_BYTES has the slack).
  unsigned char* smem = smem_raw + ((1024u - (pa::smem_u32(smem_raw) & 1023u)) & 1023u);
  const unsigned sbase = pa::smem_u32(smem);  // 1024-aligned
  unsigned char* sQ = smem;
  unsigned char* sKV = smem + OFF_KV;
  unsigned char* sP = smem + OFF_P;
  float* sCorr = reinterpret_cast<float*>(smem + OFF_CORR);
  float* sL = reinterpret_cast<float*>(smem + OFF_L);
  int* sRowP = reinterpret_cast<int*>(smem + OFF_ROW);
  int* sRowLo = sRowP + M;
  int* sRowOut = sRowLo + M;
  unsigned char* sValid = smem + OFF_VALID;
  int* sMisc = reinterpret_cast<int*>(smem + OFF_MISC);

  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  // The warpgroup as a warp-uniform value (a shuffle from lane 0): ptxas then knows the
  // wg == 0 branches do not diverge within a warp and keeps the wgmma pipelined (C7518).
  const int wg = __shfl_sync(0xffffffffu, warp >> 2, 0), wq = warp & 3;
  const int g = lane >> 2, tq = lane & 3;
  int x = blockIdx.x;
  int split = blockIdx.y, n_split = num_splits;  // this CTA's chunk and its row block's chunks
  pa::Sched sc{0, 0, 0, 0, 0};
  if (ws_cnt != nullptr) {
    sc = pa::balanced_sched(cu, past, n_tokens, H, B, M, BN, max_blocks * block_size, window,
                            num_splits, sms, tile_us, pro_us, part_us, comb_us, comb_rate, VHS,
                            reinterpret_cast<int*>(sKV));
    if (sc.x < 0) return;  // surplus CTA (uniform)
    x = sc.x;
    split = sc.chunk;
    n_split = sc.k;
  }

  int key_lo, key_hi;
  const int b = pa::mla_rows<M>(cu, past, latch, n_tokens, H, B, x, max_blocks, block_size,
                                max_pos, do_rotary, window, sMisc, sRowP, sRowLo, sRowOut,
                                key_lo, key_hi);
  if (b < 0) return;  // surplus CTA (uniform)
  int tile_begin, n_tiles;
  pa::pair_tiles(ws_cnt != nullptr, sc, key_lo, key_hi, BN, split, num_splits, tile_begin,
                 n_tiles);
  // Warp-uniform for ptxas (the same value in every thread already), so the loop's branches
  // keep the wgmma pipeline intact.
  n_tiles = __shfl_sync(0xffffffffu, n_tiles, 0);

  // This thread's two rows in the wgmma accumulator layout (the same in both warpgroups):
  // warp wq of a WG owns rows 16 wq .. 16 wq + 15; hf = 0: row g, hf = 1: row g + 8.
  int my_p[2], my_lo[2];
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    my_p[hf] = sRowP[16 * wq + g + 8 * hf];
    my_lo[hf] = sRowLo[16 * wq + g + 8 * hf];
  }

  // O[:, 256 wg + 64 q + 8 j + 2 tq + (e & 1)] of row (16 wq + g + 8 (e >> 1)) is o[q][4 j + e].
  float o[VBW][32];
#pragma unroll
  for (int q = 0; q < VBW; ++q)
#pragma unroll
    for (int i = 0; i < 32; ++i) o[q][i] = 0.0f;
  float m_run[2] = {PA_NEG_INF, PA_NEG_INF}, l_run[2] = {0.0f, 0.0f};  // WG0 only

  const int* bt_row = block_table + (long long)b * max_blocks;
  // Loader threads (WG1): 8 per tile row, NPASS rows each.
  const int ld_row = (tid - LOADERS) >> 3, ld_chunk = tid & 7;
  const bool loader = wg == 1;
  int pf_phys[NPASS];
  bool pf_need[NPASS];
  // Block-table lookup for the rows this thread loads in tile `tile` (used one tile later,
  // so the global load latency overlaps the current tile's math).
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
    unsigned char* dst_base = sKV + stage * T_BYTES;
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
        pa::cp_async16(pa::smem_u32(dst_base + sw_off(r, c, TBLK)), src_row + (ok ? c * 8 : 0),
                       ok ? 16 : 0);
      }
      if (ld_chunk == 0) sValid[stage * BN + r] = ok ? 1 : 0;
    }
  };

  // Tiles issued before the loop (one cp.async group each, the first with Q). Iteration k
  // refills the ring with tile k + PRE, so at its top group k (tile k) must be complete while
  // PRE - 1 newer groups may still fly.
  constexpr int PRE = STAGES - 1;
  // Refill: tile t into its stage (loaders only) and one commit in every thread, so group i
  // holds tile i in every thread and one wait count serves both warpgroups.
  auto refill = [&](int t) {
    if (loader && t < n_tiles) {
      issue(tile_begin + t, t & (STAGES - 1));
      if (t + 1 < n_tiles) prefetch(tile_begin + t + 1);
    }
    pa::cp_async_commit();
  };
  if (n_tiles > 0) {
    // Prologue: Q rows (zero for rows past the sequence) with tile 0 as group 0, then tiles
    // 1 .. PRE - 1.
    for (int idx = tid; idx < M * HC; idx += NTHREADS) {
      const int r = idx / HC, c = idx - r * HC;
      const int orow = sRowOut[r];
      const bool ok = orow >= 0;
      pa::cp_async16(pa::smem_u32(sQ + sw_off(r, c, QBLK)),
                     ok ? query + (long long)orow * HS + c * 8 : query, ok ? 16 : 0);
    }
    if (loader) prefetch(tile_begin);
    // Launched programmatically after the write kernel (kernel.py): everything above reads
    // only inputs that kernel does not write; the latent cache waits for it to complete.
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#pragma unroll
    for (int t = 0; t < PRE; ++t) refill(t);
    pa::cp_async_wait<PRE - 1>();  // group 0: Q and tile 0
    fence_proxy_async();
    __syncthreads();
    if (do_rotary) {
      pa::rope_rows_smem<elem_t, M, NTHREADS>(sQ, sRowP, rd, off, interleaved, cos_c, sin_c,
                                              [](int r, int c) { return sw_off(r, c, QBLK); });
      fence_proxy_async();
      __syncthreads();
    }
  }

  const float sl2 = scale * PA_LOG2E;
  const unsigned sP_u32 = sbase + OFF_P;
  // WG0: S = Q K^T (64 x BN) of the tile in stage `stg`, issued and committed as one wgmma
  // group; K = HS in 16-channel steps, 4 steps per 128-byte row.
  auto issue_s = [&](float (&sa)[BN / 2], int stg) {
    const unsigned sK = sbase + OFF_KV + stg * T_BYTES;
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) sa[i] = 0.0f;
    fence_regs(sa);
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < HS / 16; ++ks) {
      const unsigned koff = (ks >> 2) * QBLK + (ks & 3) * 32;
      const unsigned toff = (ks >> 2) * TBLK + (ks & 3) * 32;
      wg_ss(sa, desc_sw128(sbase + koff, 16, 1024), desc_sw128(sK + toff, 16, 1024),
            ks > 0 ? 1 : 0);
    }
    wg_commit();
  };
  // WG0: online softmax of tile t (stage stg) from its S: scale, softcap, mask, running max
  // and sum (a quad holds a whole row's BN keys), P = 2^(s - m) as the A fragments of P V
  // (row g: regs 0/2, row g+8: regs 1/3) and in shared memory for WG1; the row rescale in
  // corr and sCorr.
  auto softmax = [&](const float (&sa)[BN / 2], int t, int stg, unsigned (&frag)[KS][4],
                     float (&corr)[2]) {
    const int key0 = (tile_begin + t) * BN;
    float v[BN / 2];
    float mx[2] = {PA_NEG_INF, PA_NEG_INF};
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int hf = e >> 1;
        const int kl = 8 * j + 2 * tq + (e & 1);
        const int jj = key0 + kl;
        const bool ok = sValid[stg * BN + kl] && jj >= my_lo[hf] && jj <= my_p[hf];
        float x;
        if (softcap > 0.0f) {
          x = softcap * tanhf(sa[4 * j + e] * scale / softcap) * PA_LOG2E;
        } else {
          x = sa[4 * j + e] * sl2;
        }
        x = ok ? x : PA_NEG_INF;
        v[4 * j + e] = x;
        mx[hf] = fmaxf(mx[hf], x);
      }
    float m_use[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float x = mx[hf];
      x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
      x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
      const float m_new = fmaxf(m_run[hf], x);
      // A row with no key yet keeps m = -inf; use 0 so no (-inf) - (-inf) appears.
      m_use[hf] = m_new == PA_NEG_INF ? 0.0f : m_new;
      corr[hf] = exp2f(m_run[hf] - m_use[hf]);
      m_run[hf] = m_new;
    }
    float rs[2] = {0.0f, 0.0f};
    const int r0 = 16 * wq + g;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const float p0 = exp2f(v[4 * j + 0] - m_use[0]);
      const float p1 = exp2f(v[4 * j + 1] - m_use[0]);
      const float p2 = exp2f(v[4 * j + 2] - m_use[1]);
      const float p3 = exp2f(v[4 * j + 3] - m_use[1]);
      rs[0] += p0 + p1;
      rs[1] += p2 + p3;
      const unsigned lo = N::pack2(p0, p1), hi = N::pack2(p2, p3);
      frag[j >> 1][2 * (j & 1) + 0] = lo;
      frag[j >> 1][2 * (j & 1) + 1] = hi;
      *reinterpret_cast<unsigned*>(sP + r0 * 128 + ((j ^ (r0 & 7)) << 4) + 4 * tq) = lo;
      *reinterpret_cast<unsigned*>(sP + (r0 + 8) * 128 + ((j ^ ((r0 + 8) & 7)) << 4) + 4 * tq) =
          hi;
    }
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) l_run[hf] = l_run[hf] * corr[hf] + rs[hf];
    if (tq == 0) {
      sCorr[r0] = corr[0];
      sCorr[r0 + 8] = corr[1];
    }
  };
  // O of this warpgroup's rows g and g + 8 scaled by c0 and c1.
  auto rescale = [&](float c0, float c1) {
#pragma unroll
    for (int q = 0; q < VBW; ++q)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        o[q][4 * j + 0] *= c0;
        o[q][4 * j + 1] *= c0;
        o[q][4 * j + 2] *= c1;
        o[q][4 * j + 3] *= c1;
      }
  };
  // WG1: P from shared memory as A fragments (ldmatrix x4: matrices (rows 0-7 | 8-15) x (keys
  // 16kk + 0-7 | 8-15) of this warp's 16 rows, in the A fragment's order) and O rescaled.
  auto take_p = [&](unsigned (&frag)[KS][4]) {
    const int r0 = 16 * wq + g;
    rescale(sCorr[r0], sCorr[r0 + 8]);
    const int pr = 16 * wq + (lane & 7) + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) {
      const int c = 2 * kk + (lane >> 4);
      pa::ldsm_x4(frag[kk], sP_u32 + pr * 128 + ((c ^ (pr & 7)) << 4));
    }
  };
  // O[:, this WG's 256 columns] += P V (issued, not committed); V = the tile's leading VHS
  // channels in stage stg, N-major.
  auto issue_pv = [&](const unsigned (&frag)[KS][4], int stg) {
    const unsigned sK = sbase + OFF_KV + stg * T_BYTES;
#pragma unroll
    for (int q = 0; q < VBW; ++q) fence_regs(o[q]);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < KS; ++kk)
#pragma unroll
      for (int q = 0; q < VBW; ++q) {
        const unsigned voff = (wg * VBW + q) * TBLK + kk * (16 * 128);
        wg_rs(o[q], frag[kk], desc_sw128(sK + voff, TBLK, 1024));
      }
  };

  unsigned frag[KS][4];  // P of the tile whose P V comes next
  float s[BN / 2];       // WG0: S of one tile
  float corr[2];
  for (int k = 0; k < n_tiles; ++k) {
    const int stage = k & (STAGES - 1);
    pa::cp_async_wait<PRE - 1>();  // this thread's group k (tile k) is complete
    fence_proxy_async();
    // [A] Tile k landed and is visible to wgmma; both WGs finished tile k - 1 (their wgmma
    // groups were waited on), so its stage may be refilled.
    __syncthreads();
    refill(k + PRE);
    if (wg == 0) {
      issue_s(s, stage);
      wg_wait0();
      fence_regs(s);
      softmax(s, k, stage, frag, corr);
      rescale(corr[0], corr[1]);
    }
    __syncthreads();  // [B] P and the row rescale factors are in shared memory
    if (wg == 1) take_p(frag);
    issue_pv(frag, stage);
    wg_commit();
    wg_wait0();
#pragma unroll
    for (int q = 0; q < VBW; ++q) fence_regs(o[q]);
  }
  pa::cp_async_wait_all();

  // ---- Epilogue: WG0 publishes the row sums (and the split's log2-sum-exp), both write O.
  if (wg == 0) {
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float v = l_run[hf];
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      const int r = 16 * wq + g + 8 * hf;
      if (tq == 0) {
        sL[r] = v;
        const int orow = sRowOut[r];
        if (ws_cnt != nullptr && split == 0 && orow >= 0) ws_cnt[orow] = n_split;
        if (n_split > 1 && orow >= 0) {
          ws_lse[(long long)orow * num_splits + split] =
              v > 0.0f ? m_run[hf] + __log2f(v) : PA_NEG_INF;
        }
      }
    }
  }
  __syncthreads();
#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int r = 16 * wq + g + 8 * hf;
    const int orow = sRowOut[r];
    if (orow < 0) continue;
    const float l = sL[r];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    const int col = wg * (VHS / 2) + 2 * tq;
    if (n_split == 1) {
      elem_t* dst = out + (long long)orow * VHS + col;
#pragma unroll
      for (int q = 0; q < VBW; ++q)
#pragma unroll
        for (int j = 0; j < 8; ++j)
          *reinterpret_cast<unsigned*>(dst + 64 * q + 8 * j) =
              N::pack2(o[q][4 * j + 2 * hf] * inv, o[q][4 * j + 2 * hf + 1] * inv);
    } else {
      float* dst = ws_o + ((long long)orow * num_splits + split) * VHS + col;
#pragma unroll
      for (int q = 0; q < VBW; ++q)
#pragma unroll
        for (int j = 0; j < 8; ++j)
          *reinterpret_cast<float2*>(dst + 64 * q + 8 * j) =
              make_float2(o[q][4 * j + 2 * hf] * inv, o[q][4 * j + 2 * hf + 1] * inv);
    }
  }
}
