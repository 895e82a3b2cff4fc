// PagedAttention (LATENT / MLA) read phase, sm_90a: two warpgroups on alternating pages.
//
// Same contract, grid and workspace as paged_mla_wg_fwd (paged_mla_wg.cu), and its
// arguments plus the latent cache's tensor map (kv_map); the partials are merged by
// paged_mla_combine (paged_mla.cu). Defines: PA_BF16, PA_HS / PA_VHS
// (576 / 512). Why this schedule: docs/notes/paged_attention.md#pair-kernel.
//
// A CTA (256 threads = warpgroups WG0 and WG1) owns M = 64 (token, head) rows and a range of
// 64-key tiles, taken in pairs: tile 2i in buffer 0, tile 2i + 1 in buffer 1. WG0 computes
// S = Q K^T and the softmax of buffer 0, WG1 those of buffer 1, and each warpgroup then runs
// P V over both tiles for its 256 value columns (O is 64 x 256 f32 per warpgroup), so one
// warpgroup's softmax overlaps the other's MMAs. The running row max is handed over in
// shared memory: WG0 raises it with tile 2i, WG1 with tile 2i + 1, and the P of tile 2i is
// rescaled to the pair's max before WG1 reads it.
//
// Shared memory: Q (64 x 576), two tile buffers (64 x 576 each) and the P of buffer 1, all
// in the wgmma 128-byte swizzle (64-channel sub-tiles of [rows][128 bytes], 16-byte chunk c
// of row r at chunk c ^ (r & 7), 1024-byte aligned). The P of buffer 0 lives in buffer 0's
// last (rotary) sub-tile, which only S reads. Each 64-channel sub-tile of a buffer is one
// TMA box (64 keys x 64 channels of one page, the swizzle applied by the copy) with its own
// mbarrier; a sub-tile is refilled with the tile two ahead as soon as its last reader is
// done: channels 0-255 by WG0 after its P V of the tile, channels 256-575 by WG1 after its
// own. S of the next tile waits on the sub-tiles one by one, so its MMAs start while the
// rest of the tile is still landing. One thread per warpgroup issues the copies: with
// cp.async the issuing warpgroup stalls ~0.6 us per half tile, on the critical path.
//
// Block sizes that are a multiple of 64 only (a tile is one box per sub-tile); kernel.py
// takes paged_mla_wg.cu otherwise. A block id outside the cache reads as zeros (the box lies
// past the tensor) and latches; rows of the last tile past the keys any row reads are
// cleared before P V (the cache past a sequence may hold anything, and 0 * NaN is NaN).
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

#ifndef PA_PAIR_TRACE
// Lab only (lab/paged_pair_trace.py): the SM clock at each step of the fourth- and
// third-last pairs of CTA (0, 0), written over the first bytes of the output.
#define PA_PAIR_TRACE 0
#endif
#if PA_PAIR_TRACE
#define PAIR_MARK(k)                                          \
  (keep[k] = trace_a ? (unsigned)clock() : keep[k],           \
   keep[12 + k] = trace_b ? (unsigned)clock() : keep[12 + k])
#else
#define PAIR_MARK(k) ((void)0)
#endif

#ifndef PA_PAIR_LEAN
// Lab switch (off): the same values with fewer instructions in the loop over pairs: the
// wgmma descriptors as a base computed once plus a constant offset (desc_add), not
// desc_sw128 of each runtime address, and a tile's page by a shift (block sizes are powers
// of two), not a division.
#define PA_PAIR_LEAN 0
#endif

#ifndef PA_PAIR_TRIGGER
// Lab switch (off): let the combine, launched programmatically after this kernel, launch as
// soon as every CTA has started (griddepcontrol.launch_dependents) instead of at this grid's
// end; it waits (griddepcontrol.wait) for the whole grid before reading the partials.
#define PA_PAIR_TRIGGER 0
#endif

#ifndef PA_PAIR_STSM
// Lab switch (off): P handed to the other warpgroup with four stmatrix, not sixteen stores.
#define PA_PAIR_STSM 0
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
constexpr int KS = BN / 16;     // k-steps of P V
constexpr int M = 64;           // query rows per CTA (the wgmma M)
constexpr int NTHREADS = 256;   // two warpgroups
constexpr int HB = HS / 64;     // 64-channel sub-tiles per latent row
constexpr int VBW = VHS / 128;  // 64-column blocks of O per warpgroup; WG0 loads sub-tiles
                                // 0 .. VBW - 1 of every tile, WG1 the rest

static_assert(HS % 64 == 0, "latent width must be a multiple of 64 (128-byte swizzle rows)");
static_assert(VHS % 128 == 0 && VHS + 64 <= HS,
              "value width a multiple of 128 and at least one sub-tile (the P of buffer 0) "
              "past it");

// Shared memory layout (bytes from a 1024-aligned base); builds.py mirrors SMEM_BYTES in
// mla_pair_smem_bytes().
constexpr int QBLK = M * 128;              // one 64-channel sub-tile of Q
constexpr int TBLK = BN * 128;             // one 64-channel sub-tile of a tile
constexpr int T_BYTES = HB * TBLK;         // one tile buffer
constexpr int OFF_K = HB * QBLK;           // two tile buffers
constexpr int OFF_P0 = OFF_K + (HB - 1) * TBLK;  // P of buffer 0: its last sub-tile
constexpr int OFF_P1 = OFF_K + 2 * T_BYTES;      // P of buffer 1; before the loop the row
                                                 // data (int[3][M] last key, first key, out
                                                 // row, then int[8] scratch), at the end the
                                                 // row sums (float[2][M])
constexpr int OFF_MAX = OFF_P1 + M * 128;        // float[M] running row max (log2 domain)
constexpr int OFF_SC0 = OFF_MAX + M * 4;         // float[M] WG0's rescale of the pair
constexpr int OFF_SC1 = OFF_SC0 + M * 4;         // float[M] WG1's rescale of the pair
constexpr int OFF_MU = OFF_SC1 + M * 4;          // float[2][M] each warpgroup's row max of
                                                 // its tile's exp (read back: PA_PAIR_ORDER)
constexpr int OFF_BAR = OFF_MU + 2 * M * 4;      // u64[2][HB] sub-tile mbarriers
constexpr int SMEM_USED = OFF_BAR + 2 * HB * 8;
constexpr int SMEM_BYTES = SMEM_USED + 1024;  // + slack to round the base up to 1024 bytes
static_assert(OFF_K % 1024 == 0 && OFF_P1 % 1024 == 0 && T_BYTES % 1024 == 0 &&
              OFF_BAR % 8 == 0, "swizzle atoms 1024-byte, mbarriers 8-byte aligned");

// Named barriers between the warpgroups (0 is __syncthreads); each is one warpgroup's
// bar.arrive and the other's bar.sync, 256 threads.
constexpr int BAR_SCALE0 = 1;  // WG0 -> WG1: row max and rescale of tile 2i published
constexpr int BAR_SCALE1 = 2;  // WG1 -> WG0: row max and rescale of tile 2i + 1 published
constexpr int BAR_P0 = 3;      // WG0 -> WG1: P of tile 2i (at the pair's max) in shared memory
constexpr int BAR_PV0 = 4;     // WG1 -> WG0: its P V of tile 2i issued (and P of 2i + 1
                               // in shared memory): that P V frees channels 256-575 of
                               // tile 2i, which S of tile 2i + 2 needs, so it goes first

#include "wgmma.cuh"

#ifndef PA_SOFTCAP
// 1: the build for softcap > 0 (kernel.py picks it then); 0: the softcap argument is
// ignored, and the loop holds no tanh (5k fewer instructions: the loop fits the
// instruction cache better).
#define PA_SOFTCAP 1
#endif

#ifndef PA_PAIR_RAWMAX
// Without softcap, the row max is taken over the raw scores (scale > 0 commutes with max)
// and the exp folds the scale into one FFMA: 32 fewer FMULs before each max hand-off.
#define PA_PAIR_RAWMAX 1
#endif

#ifndef PA_PAIR_FASTMASK
// S of a tile whose every key every output row of the thread reads skips the per-element
// mask (fewer instructions on the softmax's path; 0 turns it off, for the lab).
#define PA_PAIR_FASTMASK 1
#endif

#ifndef PA_PAIR_ORDER
// After each hand-off's bar.arrive the values the code after it uses (rescale, row max) are
// read back from shared memory: without that dependency ptxas sank the arrive below the O
// rescale and the exp that follow it, and the other warpgroup waited for them
// (docs/notes/paged_attention.md#pair-kernel; 0 turns it off, for the lab).
#define PA_PAIR_ORDER 1
#endif

// Lab switch: lazy running max (see raise_max); 0 (off) ships.
#ifndef PA_PAIR_LAZY
#define PA_PAIR_LAZY 0
#endif
#ifndef PA_PAIR_FULLSYNC
// Lab only (racecheck): every hand-off's bar.arrive becomes a bar.sync (both warpgroups wait;
// the same order, no deadlock, slower).
#define PA_PAIR_FULLSYNC 0
#endif
#if PA_PAIR_FULLSYNC
#define named_bar_arrive named_bar_sync
#endif

// A CUtensorMap (opaque, 128 bytes, 64-byte aligned), passed by value as a
// __grid_constant__ parameter.
struct __align__(64) TmaDesc {
  unsigned long long v[16];
};

// One arrival that also expects `bytes` of TMA transactions in the current phase.
__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
// TMA: the box at (x, y) of the tensor map into shared memory at dst, completing on bar.
// Each key is read once: the box carries an L2 evict-first hint, so the cache keeps what is
// reused (block tables, workspace). Measured: docs/notes/paged_attention.md#pair-kernel.
__device__ __forceinline__ void tma_load_2d(unsigned dst, const TmaDesc* map, int x, int y,
                                            unsigned bar) {
  unsigned long long policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      ".L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(x), "r"(y), "r"(bar), "l"(policy)
      : "memory");
}

}  // namespace

extern "C" __global__ void __launch_bounds__(NTHREADS, 1)
paged_mla_pair_fwd(const elem_t* __restrict__ query, const elem_t* __restrict__ key_cache,
                   const elem_t* __restrict__ cos_c, const elem_t* __restrict__ sin_c,
                   const int* __restrict__ cu, const int* __restrict__ past,
                   const int* __restrict__ block_table, elem_t* __restrict__ out,
                   float* __restrict__ ws_o, float* __restrict__ ws_lse,
                   unsigned* __restrict__ latch, int n_tokens, int H, int B, int num_blocks,
                   int block_size, int max_blocks, int rd, int off, int max_pos, int interleaved,
                   int do_rotary, float scale, float softcap, int window, int num_splits,
                   int* __restrict__ ws_cnt, int overhead, int lanes,
                   const __grid_constant__ TmaDesc kv_map) {
  typedef pa::Num<elem_t> N;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  if (pa::dynamic_smem_bytes() < (unsigned)SMEM_BYTES) return;
  unsigned char* smem = smem_raw + ((1024u - (pa::smem_u32(smem_raw) & 1023u)) & 1023u);
  const unsigned sbase = pa::smem_u32(smem);  // 1024-aligned
  unsigned char* sQ = smem;
  unsigned char* sP0 = smem + OFF_P0;
  unsigned char* sP1 = smem + OFF_P1;
  int* sRowP = reinterpret_cast<int*>(sP1);
  int* sRowLo = sRowP + M;
  int* sRowOut = sRowLo + M;
  int* sMisc = sRowOut + M;
  float* sMax = reinterpret_cast<float*>(smem + OFF_MAX);
  float* sSc0 = reinterpret_cast<float*>(smem + OFF_SC0);
  float* sSc1 = reinterpret_cast<float*>(smem + OFF_SC1);
  float* sMu = reinterpret_cast<float*>(smem + OFF_MU);
  auto bar = [&](int buf, int sub) { return sbase + OFF_BAR + 8u * (buf * HB + sub); };

  const int tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  // Warp-uniform (a shuffle from lane 0), so ptxas keeps the wgmma of each branch pipelined.
  const int wg = __shfl_sync(0xffffffffu, warp >> 2, 0), wq = warp & 3;
  const int g = lane >> 2, tq = lane & 3;
  // Balanced split-KV (ws_cnt != nullptr; the partials then go to the partition's row-block
  // slots, and ws_cnt holds each row's chunk count and first slot row): about one CTA per
  // SM, each taking its contiguous range of its lane's (row block, tile) line, row block by
  // row block on the same mbarriers (pa::part_begin; overhead is a row block's fixed cost in
  // tiles). Otherwise one pair, its own: row block blockIdx.x, split blockIdx.y.
  // docs/notes/paged_attention.md#contiguous-partition
#if PA_PAIR_TRIGGER
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  const bool balanced = ws_cnt != nullptr;
  const pa::SeqArgs seqs{cu, past, n_tokens, H, M, BN, max_blocks * block_size, window};
  pa::Part part{};
  if (balanced) {
    part = pa::part_begin(seqs, B, overhead, lanes, reinterpret_cast<int*>(smem + OFF_K));
    fence_proxy_async();  // the scratch's generic writes before the TMA copies into it
    __syncthreads();      // the scratch (tile buffers) read
  }
  if (tid == 0) {
#pragma unroll
    for (int buf = 0; buf < 2; ++buf)
#pragma unroll
      for (int sub = 0; sub < HB; ++sub) mbar_init(bar(buf, sub), 1);
  }
  // Parity of each buffer's next mbarrier phase: a pair fills buffer 0 ceil(n / 2) times
  // and buffer 1 floor(n / 2) times, every fill waited on within the pair.
  unsigned ph0 = 0, ph1 = 0;
  for (int u = 0;; ++u) {
    int x = blockIdx.x;
    int split = blockIdx.y, n_split = num_splits;
    pa::Sched sc{0, 0, 0, 0, 0};
    if (balanced) {
      if (!pa::part_next(part, seqs, B, overhead, sc)) break;
      x = sc.x;
      split = sc.chunk;
      n_split = sc.k;
    } else if (u > 0) {
      break;
    }
    if (u > 0) __syncthreads();  // the last pair's epilogue read its row sums where mla_rows writes

    int key_lo, key_hi;
    const int b = pa::mla_rows<M>(cu, past, latch, n_tokens, H, B, x, max_blocks, block_size,
                                  max_pos, do_rotary, window, sMisc, sRowP, sRowLo, sRowOut,
                                  key_lo, key_hi, balanced ? part.b : -1);
    if (b < 0) continue;  // surplus pair (uniform)
    int tile_begin, n_tiles;
    pa::pair_tiles(balanced, sc, key_lo, key_hi, BN, split, num_splits, tile_begin,
                   n_tiles);
    n_tiles = __shfl_sync(0xffffffffu, n_tiles, 0);

    // This thread's two rows in the wgmma accumulator layout (the same in both warpgroups),
    // read before the row data's buffer is reused for P.
    int my_p[2], my_lo[2], my_out[2];
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      my_p[hf] = sRowP[16 * wq + g + 8 * hf];
      my_lo[hf] = sRowLo[16 * wq + g + 8 * hf];
      my_out[hf] = sRowOut[16 * wq + g + 8 * hf];
    }
#if PA_PAIR_FASTMASK
    // The keys every output row of this thread reads (padding rows read anything).
    int keys_lo = -0x7fffffff - 1, keys_hi = 0x7fffffff;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf)
      if (my_out[hf] >= 0) {
        keys_lo = max(keys_lo, my_lo[hf]);
        keys_hi = min(keys_hi, my_p[hf]);
      }
#endif

    // ---- Loads: TMA boxes of kv_map (the cache as [rows, HS]), one mbarrier per sub-tile.
    const int* bt_row = block_table + (long long)b * max_blocks;
    const int cache_rows = num_blocks * block_size;
#if PA_PAIR_LEAN
    const int bs_log2 = __ffs(block_size) - 1;  // a power of two (the schema's check)
#endif
    // The cache row of tile t's first key (its page holds the whole tile), or -1 when the
    // block id is out of range.
    auto page_row = [&](int t) {
      const int j = (tile_begin + t) * BN;
#if PA_PAIR_LEAN
      const int blk = j >> bs_log2;
#else
      const int blk = j / block_size;
#endif
      const int phys = blk < max_blocks ? __ldg(bt_row + blk) : -1;
      return (phys >= 0 && phys < num_blocks) ? phys * block_size + (j & (block_size - 1)) : -1;
    };
    // This warpgroup's sub-tiles of tile t (page row `row`) into buffer t & 1, by one thread.
    auto issue = [&](int t, int row) {
      if ((tid & 127) != 0) return;
      const int buf = t & 1;
      if (row < 0 && wg == 0) atomicOr(latch, PA_LATCH_BLOCK);
      const int y = row >= 0 ? row : cache_rows;  // past the tensor: zeros
      const unsigned dst = sbase + OFF_K + buf * T_BYTES;
      for (int sub = wg == 0 ? 0 : VBW; sub < (wg == 0 ? VBW : HB); ++sub) {
        mbar_expect_tx(bar(buf, sub), TBLK);
        tma_load_2d(dst + sub * TBLK, &kv_map, sub * 64, y, bar(buf, sub));
      }
    };
    // Rows of tile t past the last key any row of this CTA reads, cleared in the value
    // channels (by the warpgroup that ran S of the tile, so its loads have landed).
    auto clear_tail = [&](int t) {
      const int first = key_hi + 1 - (tile_begin + t) * BN;
      if (first >= BN) return;
      unsigned char* base = smem + OFF_K + (t & 1) * T_BYTES;
      for (int idx = tid & 127; idx < (BN - first) * (VHS / 8); idx += 128) {
        const int r = first + idx / (VHS / 8), c = idx % (VHS / 8);
        *reinterpret_cast<uint4*>(base + sw_off(r, c, TBLK)) = make_uint4(0u, 0u, 0u, 0u);
      }
      fence_proxy_async();
    };

    float o[VBW][32];
#pragma unroll
    for (int q = 0; q < VBW; ++q)
#pragma unroll
      for (int i = 0; i < 32; ++i) o[q][i] = 0.0f;
    float l_run[2] = {0.0f, 0.0f};  // this warpgroup's share of the row sums, at sMax

    if (tid < M) sMax[tid] = PA_NEG_INF;
    int row0 = 0, row1 = 0;  // page rows of the pair's tiles (then of the next pair's)
    if (n_tiles > 0) {
      // Q rows (zero for rows past the sequence) as one cp.async group.
      for (int idx = tid; idx < M * (HS / 8); idx += NTHREADS) {
        const int r = idx / (HS / 8), c = idx - r * (HS / 8);
        const int orow = sRowOut[r];
        const bool ok = orow >= 0;
        pa::cp_async16(pa::smem_u32(sQ + sw_off(r, c, QBLK)),
                       ok ? query + (long long)orow * HS + c * 8 : query, ok ? 16 : 0);
      }
      pa::cp_async_commit();
      row0 = page_row(0);
      if (n_tiles > 1) row1 = page_row(1);
    }
    __syncthreads();  // mbarriers initialised, sMax set
    if (n_tiles > 0) {
      // Launched programmatically after the write kernel (kernel.py): everything above reads
      // only inputs that kernel does not write; the latent cache waits for it to complete.
      asm volatile("griddepcontrol.wait;\n" ::: "memory");
      issue(0, row0);
      if (n_tiles > 1) issue(1, row1);
      pa::cp_async_wait_all();  // Q
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
#if PA_SOFTCAP
    const float cap_in = scale / softcap;  // softcap > 0 here (kernel.py)
#endif
    // S values as mask_s leaves them: x, with the log2-domain score x * kx.
#if PA_SOFTCAP || !PA_PAIR_RAWMAX
    const float kx = 1.0f;
#else
    const float kx = sl2;
#endif
    // The score of raw S value v before the mask (log2 domain up to the factor kx).
    auto score = [&](float v) {
#if PA_SOFTCAP
      return softcap > 0.0f ? softcap * tanhf(v * cap_in) * PA_LOG2E : v * sl2;
#elif PA_PAIR_RAWMAX
      return v;
#else
      return v * sl2;
#endif
    };
    // S (64 x BN) of the tile in buffer `buf` over sub-tiles (k + rot) % HB for k in
    // [from, to), waiting on each sub-tile's mbarrier (phase parity `par`) just before its
    // MMAs; k == 0 overwrites s. Issued and committed as one wgmma group. WG1 starts at its
    // own sub-tiles (rot = VBW): they were refilled before WG0's.
#if PA_PAIR_LEAN
    // K-major operands (Q, K, P: LBO 16, SBO 1024) at sbase, and this warpgroup's value
    // columns of buffer 0 (N-major: LBO = the next 64 columns).
    const unsigned long long d_k1 = desc_sw128(sbase, 16, 1024);
    const unsigned long long d_v = desc_sw128(sbase + OFF_K + wg * VBW * TBLK, TBLK, 1024);
#endif
    auto issue_s = [&](float (&s)[BN / 2], int buf, unsigned par, int from, int to, int rot) {
#if !PA_PAIR_LEAN
      const unsigned kb = sbase + OFF_K + buf * T_BYTES;
#endif
      fence_regs(s);
#pragma unroll
      for (int k = 0; k < HB; ++k) {
        if (k < from || k >= to) continue;
        const int sub = (k + rot) % HB;
        mbar_wait(bar(buf, sub), par);
        if (k == from) wg_fence();
#pragma unroll
        for (int kq = 0; kq < 4; ++kq) {
#if PA_PAIR_LEAN
          wg_ss(s, desc_add(d_k1, sub * QBLK + kq * 32),
                desc_add(d_k1, OFF_K + buf * T_BYTES + sub * TBLK + kq * 32),
                (k > 0 || kq > 0) ? 1 : 0);
#else
          wg_ss(s, desc_sw128(sbase + sub * QBLK + kq * 32, 16, 1024),
                desc_sw128(kb + sub * TBLK + kq * 32, 16, 1024), (k > 0 || kq > 0) ? 1 : 0);
#endif
        }
      }
      wg_commit();
    };
    // Scale, softcap and mask S of tile t (buffer t & 1) in place (score(), -inf when masked,
    // also every key of an out-of-range block); returns the row maxima of this thread's two
    // rows over the tile in the log2 domain.
    auto mask_s = [&](float (&s)[BN / 2], int t, bool page_ok, float (&mx)[2]) {
      const int key0 = (tile_begin + t) * BN;
      mx[0] = mx[1] = PA_NEG_INF;
#if PA_PAIR_FASTMASK
      if (page_ok && key0 >= keys_lo && key0 + BN - 1 <= keys_hi) {  // nothing to mask
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const float v = score(s[4 * j + e]);
            s[4 * j + e] = v;
            mx[e >> 1] = fmaxf(mx[e >> 1], v);
          }
      } else
#endif
      {
#pragma unroll
      for (int j = 0; j < BN / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int hf = e >> 1;
          const int kl = 8 * j + 2 * tq + (e & 1);
          const int jj = key0 + kl;
          const bool ok = page_ok && jj >= my_lo[hf] && jj <= my_p[hf];
          const float v = ok ? score(s[4 * j + e]) : PA_NEG_INF;
          s[4 * j + e] = v;
          mx[hf] = fmaxf(mx[hf], v);
        }
      }
#pragma unroll
      for (int hf = 0; hf < 2; ++hf) {
        mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 1));
        mx[hf] = fmaxf(mx[hf], __shfl_xor_sync(0xffffffffu, mx[hf], 2)) * kx;
      }
    };
    // P = 2^(s kx - m) in place (s masked, m finite or 0), its A fragments (row g: regs 0/2, row
    // g + 8: regs 1/3) and this thread's part of the row sums.
    auto exp_p = [&](float (&s)[BN / 2], const float (&m)[2], unsigned (&frag)[KS][4],
                     float (&rs)[2]) {
      rs[0] = rs[1] = 0.0f;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s[4 * j + e] = ex2_ftz(fmaf(s[4 * j + e], kx, -m[e >> 1]));
          rs[e >> 1] += s[4 * j + e];
        }
        frag[j >> 1][2 * (j & 1) + 0] = N::pack2(s[4 * j + 0], s[4 * j + 1]);
        frag[j >> 1][2 * (j & 1) + 1] = N::pack2(s[4 * j + 2], s[4 * j + 3]);
      }
    };
    // P fragments into a swizzled [M][BN] shared-memory array (the A operand of P V there).
#if PA_PAIR_STSM
    // stmatrix x4 stores four 8 x 8 matrices, lane l giving the row address of row l % 8 of
    // matrix l / 8; matrix m of step k is key chunk 2k + (m >> 1) of rows 16 wq + 8 (m & 1)
    // .. + 7, held in frag[k][m] in the wgmma accumulator's layout (row l / 4, keys 2 (l % 4)).
    auto store_p = [&](unsigned char* sp, const unsigned (&frag)[KS][4]) {
      const int m = lane >> 3, row = 16 * wq + 8 * (m & 1) + (lane & 7);
      const unsigned base = pa::smem_u32(sp) + row * 128;
#pragma unroll
      for (int k = 0; k < KS; ++k) {
        const unsigned addr = base + (((2 * k + (m >> 1)) ^ (lane & 7)) << 4);
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n"
                     :: "r"(addr), "r"(frag[k][0]), "r"(frag[k][1]), "r"(frag[k][2]),
                     "r"(frag[k][3]) : "memory");
      }
    };
#else
    auto store_p = [&](unsigned char* sp, const unsigned (&frag)[KS][4]) {
      const int r0 = 16 * wq + g;
#pragma unroll
      for (int j = 0; j < BN / 8; ++j) {
        *reinterpret_cast<unsigned*>(sp + r0 * 128 + ((j ^ (r0 & 7)) << 4) + 4 * tq) =
            frag[j >> 1][2 * (j & 1) + 0];
        *reinterpret_cast<unsigned*>(sp + (r0 + 8) * 128 + ((j ^ ((r0 + 8) & 7)) << 4) + 4 * tq) =
            frag[j >> 1][2 * (j & 1) + 1];
      }
    };
#endif
    // The running max only moves when a tile's max exceeds it by more than PA_PAIR_LAZY (log2
    // units; 0: whenever it grows): P stays <= 2^PA_PAIR_LAZY, and while it holds, O and
    // the row sums need no rescale (c = 1), which a warp then skips.
    auto raise_max = [&](float old, float mx) {
#if PA_PAIR_LAZY
      return mx > old + (float)PA_PAIR_LAZY ? mx : old;
#else
      return fmaxf(old, mx);
#endif
    };
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
    auto maybe_rescale = [&](float c0, float c1) {
#if PA_PAIR_LAZY
      if (!__any_sync(0xffffffffu, c0 != 1.0f || c1 != 1.0f)) return;
#endif
      rescale(c0, c1);
    };
    // O += P V over this warpgroup's value columns of buffer `buf`, issued and committed: P
    // from registers (this warpgroup's tile) or from shared memory at `sp` (the other's).
    // Two functions, not one with a branch: a wgmma under a runtime branch is serialized.
    auto pv_fence = [&]() {
#pragma unroll
      for (int q = 0; q < VBW; ++q) fence_regs(o[q]);
      wg_fence();
    };
    auto issue_pv_regs = [&](const unsigned (&frag)[KS][4], int buf) {
#if !PA_PAIR_LEAN
      const unsigned vb = sbase + OFF_K + buf * T_BYTES + wg * VBW * TBLK;
#endif
      pv_fence();
#pragma unroll
      for (int kk = 0; kk < KS; ++kk)
#if PA_PAIR_LEAN
        wg_rs256(o, frag[kk], desc_add(d_v, buf * T_BYTES + kk * (16 * 128)));
#else
        wg_rs256(o, frag[kk], desc_sw128(vb + kk * (16 * 128), TBLK, 1024));
#endif
      wg_commit();
    };
    // sp: OFF_P0 or OFF_P1 (bytes past sbase).
    auto issue_pv_smem = [&](unsigned sp, int buf) {
#if !PA_PAIR_LEAN
      const unsigned vb = sbase + OFF_K + buf * T_BYTES + wg * VBW * TBLK;
#endif
      pv_fence();
#pragma unroll
      for (int kk = 0; kk < KS; ++kk)
#if PA_PAIR_LEAN
        wg_ss256(o, desc_add(d_k1, sp + kk * 32), desc_add(d_v, buf * T_BYTES + kk * (16 * 128)));
#else
        wg_ss256(o, desc_sw128(sbase + sp + kk * 32, 16, 1024),
                 desc_sw128(vb + kk * (16 * 128), TBLK, 1024));
#endif
      wg_commit();
    };
    auto settle = [&](float (&s)[BN / 2]) {
      fence_regs(s);
#pragma unroll
      for (int q = 0; q < VBW; ++q) fence_regs(o[q]);
    };

    const int r0 = 16 * wq + g;
    float s[BN / 2];
    unsigned frag[KS][4];
    if (n_tiles > 0) {
      if (wg == 0) {
        issue_s(s, 0, ph0, 0, HB, 0);
        wg_wait0();
      } else if (n_tiles > 1) {
        issue_s(s, 1, ph1, 0, HB, VBW);
        wg_wait0();
      }
      settle(s);
    }
    const int n_pairs = (n_tiles + 1) >> 1;
#if PA_PAIR_TRACE
    unsigned keep[24] = {0};
#endif
    for (int i = 0; i < n_pairs; ++i) {
#if PA_PAIR_TRACE
      const bool trace_a = i == n_pairs - 4, trace_b = i == n_pairs - 3;
#endif
      const int t0 = 2 * i;
      const bool has1 = t0 + 1 < n_tiles, nxt0 = t0 + 2 < n_tiles, nxt1 = t0 + 3 < n_tiles;
      const unsigned npar = (i + 1) & 1;  // phase of the buffers' next fill
      const bool ok0 = row0 >= 0, ok1 = row1 >= 0;
      if (nxt0) row0 = page_row(t0 + 2);
      if (nxt1) row1 = page_row(t0 + 3);
      PAIR_MARK(0);
      if (wg == 0) {
        // Tile 2i: raise the row max, publish it with the rescale of everything before.
        float mx[2], m_use[2], c[2], rs[2];
        clear_tail(t0);
        mask_s(s, t0, ok0, mx);
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const float old = sMax[r0 + 8 * hf];
          const float m_new = raise_max(old, mx[hf]);
          // No key yet: keep -inf in sMax and use 0 here, so no (-inf) - (-inf) appears.
          m_use[hf] = m_new == PA_NEG_INF ? 0.0f : m_new;
          c[hf] = ex2_ftz(old - m_use[hf]);
          __syncwarp();  // the quad's reads of sMax before its write
          if (tq == 0) {
            sMax[r0 + 8 * hf] = m_new;
            sSc0[r0 + 8 * hf] = c[hf];
            sMu[r0 + 8 * hf] = m_use[hf];
          }
        }
        named_bar_arrive(BAR_SCALE0, NTHREADS);
#if PA_PAIR_ORDER
        __syncwarp();
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          c[hf] = sSc0[r0 + 8 * hf];
          m_use[hf] = sMu[r0 + 8 * hf];
        }
#endif
        PAIR_MARK(1);
        maybe_rescale(c[0], c[1]);
        exp_p(s, m_use, frag, rs);
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) l_run[hf] = l_run[hf] * c[hf] + rs[hf];
        issue_pv_regs(frag, 0);
        wg_wait0();
        settle(s);
        PAIR_MARK(2);
        // Tile 2i's channels 0-255 are free (its S and this P V are done).
        if (nxt0) issue(t0 + 2, row0);
        PAIR_MARK(3);
        named_bar_sync(BAR_SCALE1, NTHREADS);
        PAIR_MARK(4);
        float c0 = sSc1[r0], c1 = sSc1[r0 + 8];
        // P of tile 2i at the pair's max, for WG1's columns.
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          frag[j >> 1][2 * (j & 1) + 0] = N::pack2(s[4 * j + 0] * c0, s[4 * j + 1] * c0);
          frag[j >> 1][2 * (j & 1) + 1] = N::pack2(s[4 * j + 2] * c1, s[4 * j + 3] * c1);
        }
        store_p(sP0, frag);
        fence_proxy_async();
        named_bar_arrive(BAR_P0, NTHREADS);
#if PA_PAIR_ORDER
        c0 = sSc1[r0];
        c1 = sSc1[r0 + 8];
#endif
        PAIR_MARK(5);
        maybe_rescale(c0, c1);
        l_run[0] *= c0;
        l_run[1] *= c1;
        if (has1) {
          named_bar_sync(BAR_PV0, NTHREADS);
          PAIR_MARK(6);
          fence_proxy_async();
          issue_pv_smem(OFF_P1, 1);
        }
        if (nxt0) issue_s(s, 0, npar ^ ph0, 0, VBW, 0);
        PAIR_MARK(7);
        if (nxt1) {
          wg_wait1();  // P V of tile 2i + 1 done: its channels 0-255 are free
          PAIR_MARK(8);
          issue(t0 + 3, row1);
        }
        PAIR_MARK(9);
        if (nxt0) issue_s(s, 0, npar ^ ph0, VBW, HB, 0);
        PAIR_MARK(10);
        wg_wait0();
        settle(s);
        PAIR_MARK(11);
      } else {
        // Tile 2i + 1: raise the max WG0 published, rescale to it.
        if (has1) clear_tail(t0 + 1);
        named_bar_sync(BAR_SCALE0, NTHREADS);
        PAIR_MARK(1);
        float mx[2] = {PA_NEG_INF, PA_NEG_INF}, m_use[2], c[2], rs[2] = {0.0f, 0.0f};
        if (has1) mask_s(s, t0 + 1, ok1, mx);
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const float old = sMax[r0 + 8 * hf];
          const float m_new = raise_max(old, mx[hf]);
          m_use[hf] = m_new == PA_NEG_INF ? 0.0f : m_new;
          const float c1 = has1 ? ex2_ftz(old - m_use[hf]) : 1.0f;
          c[hf] = c1 * sSc0[r0 + 8 * hf];
          __syncwarp();
          if (tq == 0) {
            sMax[r0 + 8 * hf] = m_new;
            sSc1[r0 + 8 * hf] = c1;
            sMu[M + r0 + 8 * hf] = m_use[hf];
          }
        }
        named_bar_arrive(BAR_SCALE1, NTHREADS);
#if PA_PAIR_ORDER
        __syncwarp();
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          c[hf] = sSc1[r0 + 8 * hf] * sSc0[r0 + 8 * hf];
          m_use[hf] = sMu[M + r0 + 8 * hf];
        }
#endif
        PAIR_MARK(2);
        maybe_rescale(c[0], c[1]);
        if (has1) {
          exp_p(s, m_use, frag, rs);
          store_p(sP1, frag);
          fence_proxy_async();
          issue_pv_regs(frag, 1);
        }
        PAIR_MARK(3);
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) l_run[hf] = l_run[hf] * c[hf] + rs[hf];
        named_bar_sync(BAR_P0, NTHREADS);
        PAIR_MARK(4);
        fence_proxy_async();
        issue_pv_smem(OFF_P0, 0);
        if (has1) named_bar_arrive(BAR_PV0, NTHREADS);
        PAIR_MARK(5);
        if (nxt1) {
          wg_wait1();  // P V of tile 2i + 1 done: its channels 256-575 are free
          PAIR_MARK(6);
          issue(t0 + 3, row1);
        }
        PAIR_MARK(7);
        wg_wait0();  // P V of tile 2i done: its channels 256-575 (and its P) are free
        PAIR_MARK(8);
        if (nxt0) issue(t0 + 2, row0);
        PAIR_MARK(9);
        if (nxt1) {
          issue_s(s, 1, npar ^ ph1, 0, HB, VBW);
          PAIR_MARK(10);
          wg_wait0();
        }
        settle(s);
        PAIR_MARK(11);
      }
    }

    // ---- Epilogue: the row sums of both warpgroups (at the final max), then O / l.
    __syncthreads();  // every P V is done: P1's buffer holds the row sums now
    float* sL = reinterpret_cast<float*>(sP1);
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      float v = l_run[hf];
      v += __shfl_xor_sync(0xffffffffu, v, 1);
      v += __shfl_xor_sync(0xffffffffu, v, 2);
      if (tq == 0) sL[wg * M + r0 + 8 * hf] = v;
    }
    __syncthreads();
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const int r = r0 + 8 * hf;
      const int orow = my_out[hf];
      if (orow < 0) continue;
      const float l = sL[r] + sL[M + r];
      // The row's slot row: its own split slots, or with balancing the partition's slot
      // (x + p) * lanes + lane of 64 rows (pa::part_begin); chunk 0 records the count and
      // the first slot row (the combine steps lanes * 64 slot rows a chunk).
      const long long slot = balanced ? ((long long)(x + part.p) * lanes + part.lane) * M + r
                                      : (long long)orow * num_splits + split;
      if (wg == 0 && tq == 0) {
        if (balanced && split == 0) {
          ws_cnt[orow] = n_split;
          ws_cnt[(long long)n_tokens * H + orow] = (int)(slot);
        }
        if (n_split > 1) ws_lse[slot] = l > 0.0f ? sMax[r] + __log2f(l) : PA_NEG_INF;
      }
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
        float* dst = ws_o + slot * VHS + col;
#pragma unroll
        for (int q = 0; q < VBW; ++q)
#pragma unroll
          for (int j = 0; j < 8; ++j)
            *reinterpret_cast<float2*>(dst + 64 * q + 8 * j) =
                make_float2(o[q][4 * j + 2 * hf] * inv, o[q][4 * j + 2 * hf + 1] * inv);
      }
    }
#if PA_PAIR_TRACE
    if (blockIdx.x == 0 && blockIdx.y == 0 && (tid & 127) == 0)
#pragma unroll
      for (int k = 0; k < 24; ++k) reinterpret_cast<unsigned*>(out)[32 * wg + k] = keep[k];
#endif
    ph0 ^= ((n_tiles + 1) >> 1) & 1;
    ph1 ^= (n_tiles >> 1) & 1;
  }
}
