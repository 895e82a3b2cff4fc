// IndexShare attention on Hopper warpgroup MMA (wgmma): sm_90a, f16/bf16, head size 64 or
// 128, one shared index row (index heads = 1).
//
// Same contract, arguments, task decode (is_decode_task), split-K partials and last-CTA
// merge as is_attn_mma (index_share_mma.cu); only the per-tile math differs. The heads of
// one kv group that share an index row are the wgmma M dimension: a CTA owns IS_MROWS (64
// or 128) heads of one (batch, query, kv head) and one split of the selected keys.
//
// Why: the mma.sync path was latency-bound at ~2.3 us per 32 KB tile (8 warps per SM, ~64
// dependent mma.sync + ldmatrix per warp per tile). Here a warpgroup issues 8 wgmma for
// S = Q K^T and 4 x HB for O += P V per 64-key tile, asynchronously, from swizzled shared
// memory that cp.async fills directly (no ldmatrix).
//
// Threads: IS_WGS consumer warpgroups (1 or 2), all of which also issue the copies.
//   IS_MROWS = 64 * IS_WGS   the warpgroups split the heads (64 each) and share every tile;
//   IS_MROWS = 64, IS_WGS 2  the warpgroups split each tile's keys (a tile is 128 keys, 64
//                            per warpgroup) and merge their softmax states at the end in
//                            warpgroup order (deterministic).
// Pipeline: an ST-stage ring (ST a launch argument, as in is_attn_mma); per tile one
// cp.async.wait_group, a proxy fence and one __syncthreads, then the copy of tile t+ST-1
// into the stage of tile t-1 is issued, then S (wgmma, wait), softmax in registers (a quad
// of lanes holds a row), O += P V (wgmma, A = P from registers, B = V N-major), wait.
// Masked columns (padding, a poisoned replay's negative index) are zero-filled without a
// read and score -inf; every gathered key was clamped by is_stage_keys.
//
// Shared memory (from a 1024-byte aligned base; _index_share_plan._wg_smem mirrors it): Q as HB
// 64-channel blocks of [MROWS][128 B] in the 128-byte swizzle (chunk c of row r at c ^ (r & 7)),
// then ST stages of (K tile, V tile), each HB blocks of [KT][128 B], then s_key[cps] ints.
// After the loop the ring holds the warpgroup merge and the split finish's weights.
//
// Defines: IS_DTYPE (1 f16, 2 bf16), IS_HD (64 or 128), IS_WGS (1 or 2), IS_MROWS (64 or
// 128, at most 64 * IS_WGS), IS_OVERLAP (0: the loop above; 1: FA3's intra-warpgroup
// pipelining, S(t+1) issued before P(t) V(t) so softmax(t+1) overlaps the tensor cores;
// needs a ring of >= 3 stages), IS_QREG (1: Q lives in registers as the A operand of
// S = Q K^T instead of shared memory: 16 KB less per CTA, so two one-warpgroup CTAs per SM
// fit a 3-stage ring), IS_MINB (__launch_bounds__ min blocks, default 1; 3 caps a Q-in-
// registers warpgroup at 168 registers so three CTAs with 2-stage rings share an SM: the
// prefill build, which spills a few words in the softmax and still wins on latency hiding).
#include "index_share_mma.cuh"

#ifndef IS_HD
#define IS_HD 128
#endif
#ifndef IS_WGS
#define IS_WGS 1
#endif
#ifndef IS_MROWS
#define IS_MROWS 64
#endif
#ifndef IS_OVERLAP
#define IS_OVERLAP 0
#endif
#ifndef IS_QREG
#define IS_QREG 0
#endif
#ifndef IS_MINB
#define IS_MINB 1  // __launch_bounds__ min blocks: 3 caps registers at 168 (3 CTAs per SM)
#endif
#include "index_share_acc.cuh"  // NXRT_WG_AB from IS_DTYPE, wgmma.cuh

#define IS_THREADS (128 * IS_WGS)
#define IS_RWG (IS_MROWS / 64)       // warpgroups along heads
#define IS_KWG (IS_WGS / IS_RWG)     // warpgroups along each tile's keys
#define IS_KT (64 * IS_KWG)          // keys per tile (ring stage)
#define IS_HB (IS_HD / 64)           // 64-channel blocks per row
#define IS_CPR (IS_HD / 8)           // 16-byte chunks per row
#define IS_QBLK (IS_MROWS * 128)     // bytes of one 64-channel block of Q
#define IS_TBLK (IS_KT * 128)        // bytes of one 64-channel block of a K or V tile
#define IS_QBYTES (IS_HB * IS_QBLK)
#define IS_QSMEM (IS_QREG ? 0 : IS_QBYTES)  // Q's shared memory (none when in registers)
#define IS_TBYTES (IS_HB * IS_TBLK)  // one K (or V) tile
#define IS_STAGE_BYTES (2 * IS_TBYTES)
#define IS_SSTEP (IS_THREADS / IS_CPR)  // row slots one pass of the threads copies
#define IS_RPT (IS_KT / IS_SSTEP)        // row slots per thread per tile (K and V each)
#define IS_MAX_STAGES 8

static_assert(IS_DTYPE == 1 || IS_DTYPE == 2, "wgmma takes f16 or bf16");
static_assert(IS_HD == 64 || IS_HD == 128, "IS_HD must be 64 or 128");
static_assert(IS_WGS == 1 || IS_WGS == 2, "one or two warpgroups");
static_assert(IS_MROWS == 64 || IS_MROWS == 128, "IS_MROWS must be 64 or 128");
static_assert(IS_RWG >= 1 && IS_RWG <= IS_WGS && IS_WGS % IS_RWG == 0, "rows per warpgroup");
static_assert(IS_KT % IS_SSTEP == 0, "whole rows per thread pass");
static_assert(IS_SSTEP % 8 == 0, "a thread's rows share one swizzled chunk position");
static_assert(IS_QBLK % 1024 == 0 && IS_TBLK % 1024 == 0, "swizzle atoms are 1024 bytes");

namespace {

__device__ __forceinline__ unsigned is_smem_u32(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}


}  // namespace

extern "C" __global__ void __launch_bounds__(IS_THREADS, IS_MINB) is_attn_wg(IS_ATTN_PARAMS) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int ST = stages < 2 ? 2 : (stages > IS_MAX_STAGES ? IS_MAX_STAGES : stages);
  {
    // A launch with less dynamic shared memory than this layout would write past the end.
    unsigned dyn;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(dyn));
    if ((long long)dyn < 1024 + IS_QSMEM + (long long)ST * IS_STAGE_BYTES + (long long)cps * 4)
      return;
  }
  // The swizzle repeats every 1024 bytes and the descriptors assume atoms on such a boundary.
  unsigned char* smem = smem_raw + ((1024u - (is_smem_u32(smem_raw) & 1023u)) & 1023u);
  const unsigned sbase = is_smem_u32(smem);
  unsigned char* sRing = smem + IS_QSMEM;
  int* s_key = reinterpret_cast<int*>(sRing + ST * IS_STAGE_BYTES);
  __shared__ int s_live, s_flag, s_hole;

  const IsTask t = is_decode_task(Sq, G, U, HBK, shared_idx, S, IS_MROWS);
  const int Nkv = N / G;
  const long long bh = t.b * Nkv + t.kvh;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  // Broadcast from lane 0 so the compiler knows the warpgroup is warp-uniform (addresses
  // and wgmma descriptors derived from it stay in uniform registers).
  const int wg = __shfl_sync(IS_FULL, warp >> 2, 0), wq = warp & 3;
  const int rw = wg % IS_RWG, kw = wg / IS_RWG;  // this warpgroup's head block and key half
  const int g = lane >> 2, tq = lane & 3;

  // Q rows of this head block (rows past nh zero-filled; their results are dropped), issued
  // first so their latency overlaps the index staging. IS_QREG: straight into this thread's
  // A fragments of S = Q K^T (k-step ks: registers 0/1 rows g/g+8 at channels 16 ks + 2 tq
  // and + 1, registers 2/3 the same 8 channels on), and an empty copy group keeps the count.
#if IS_QREG
  unsigned qf[IS_HD / 16][4];
  {
    const int qrow = 64 * rw + 16 * wq + g;
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      const int r = qrow + 8 * x;
      const unsigned* src = reinterpret_cast<const unsigned*>(
          q + ((t.b * N + t.h0 + (r < t.nh ? r : 0)) * (long long)Sq + t.qi) * IS_HD + 2 * tq);
#pragma unroll
      for (int ks = 0; ks < IS_HD / 16; ++ks) {
        qf[ks][x] = r < t.nh ? src[8 * ks] : 0u;
        qf[ks][x + 2] = r < t.nh ? src[8 * ks + 4] : 0u;
      }
    }
  }
#else
  for (int i = tid; i < IS_MROWS * IS_CPR; i += IS_THREADS) {
    const int r = i / IS_CPR, ch = i - r * IS_CPR;
    const is_t* src = q + ((t.b * N + t.h0 + (r < t.nh ? r : 0)) * (long long)Sq + t.qi) * IS_HD;
    is_cp_async16(smem + sw_off(r, ch, IS_QBLK), src + ch * 8, r < t.nh ? 16 : 0);
  }
#endif
  is_cp_async_commit();

  const int c_begin = t.s * cps;
  const int ncols = is_split_cols(K, c_begin, cps);
  const long long irow = ((t.b * HI + t.ih) * (long long)Sq + t.qi) * K;
  const int vbound = (latch && valid_len) ? valid_len[t.b] : bound;
  if (tid == 0) s_hole = 0;  // ordered before the writes below by the staging's first barrier
  const int live = is_stage_keys(idx, irow, idx64, c_begin, ncols, bound, s_key, &s_live, latch,
                                 vbound);

  // Thread tid copies chunk ch2 of row slots s2_0 + j * IS_SSTEP of every tile, K and V.
  // IS_SSTEP is a multiple of 8, so the swizzled chunk is the same in all of them: one shared
  // address per thread plus constants. The sources start from this thread's chunk of row 0
  // of each segment of the kv head (segment 1 offset by -len0 rows, so key kj >= len0 is its
  // row kj): per row a select and one multiply-add, where the copy issue was ~24 % of the
  // decode kernel's warp samples (ncu) with per-row 64-bit index math.
  const int ch2 = tid % IS_CPR, s2_0 = tid / IS_CPR;
  const long long base0 = bh * (long long)len0, base1 = bh * (long long)len1 - len0;
  const is_t* kp0 = k0 + base0 * IS_HD + ch2 * 8;
  const is_t* kp1 = k1 + base1 * IS_HD + ch2 * 8;
  const is_t* vp0 = v0 + base0 * IS_HD + ch2 * 8;
  const is_t* vp1 = v1 + base1 * IS_HD + ch2 * 8;
  const unsigned dRow = is_smem_u32(sRing) + sw_off(s2_0, ch2, IS_TBLK);
  auto issue = [&](int tile, int st) {
    const unsigned d = dRow + st * IS_STAGE_BYTES;
    int key[IS_RPT];
#pragma unroll
    for (int j = 0; j < IS_RPT; ++j) {  // every key read before any copy is issued
      const int col = tile * IS_KT + s2_0 + j * IS_SSTEP;
      key[j] = col < live ? s_key[col] : -1;
    }
#pragma unroll
    for (int j = 0; j < IS_RPT; ++j) {
      // A masked column (kj < 0) zero-fills without a read (sources: the segment-0 bases).
      const int kj = key[j];
      const bool ok = kj >= 0, seg1 = kj >= len0;
      const long long off = (long long)(ok ? kj : 0) * IS_HD;
      const is_t* ks = ok ? (seg1 ? kp1 : kp0) + off : k0;
      const is_t* vs = ok ? (seg1 ? vp1 : vp0) + off : v0;
      is_cp_async16_s(d + j * IS_SSTEP * 128, ks, ok ? 16 : 0);
      is_cp_async16_s(d + IS_TBYTES + j * IS_SSTEP * 128, vs, ok ? 16 : 0);
    }
  };

  // Prologue: tiles 0 .. ST-2 in flight (one commit group each, empty past the end).
  const int ntiles = (live + IS_KT - 1) / IS_KT;
  for (int p = 0; p < ST - 1; ++p) {
    if (p < ntiles) issue(p, p);
    is_cp_async_commit();
  }
  // A masked column below `live` (only a poisoned row has one: valid rows pad at the end)
  // sends every tile down the checked score path. Read after the first tile's barrier.
  for (int i = tid; i < live; i += IS_THREADS)
    if (s_key[i] < 0) s_hole = 1;  // racing stores of the same value

  // O[row, 64 qb + 8 j + 2 tq + (e & 1)] of row x = e >> 1 (g or g + 8 of the warp's 16).
  float o[IS_HB][32];
#pragma unroll
  for (int qb = 0; qb < IS_HB; ++qb)
#pragma unroll
    for (int i = 0; i < 32; ++i) o[qb][i] = 0.f;
  float m_run[2] = {is_neg_inf(), is_neg_inf()};  // log2 domain
  float l_run[2] = {0.f, 0.f};                    // this lane's share of the row sums
  const int row0 = 64 * rw + 16 * wq + g;         // CTA-local head rows row0 and row0 + 8
  const unsigned qa = sbase + 64 * rw * 128;      // this warpgroup's 64 Q rows (IS_QREG: unused)
  (void)qa;
  const unsigned sRing0 = sbase + IS_QSMEM + kw * 64 * 128;  // + stage: this WG's K rows

  // S = Q K^T for this warpgroup's 64 heads x 64 keys of the tile in `stage` (issued only).
  auto issue_s = [&](float (&sc)[32], int stage) {
    const unsigned sK = sRing0 + stage * IS_STAGE_BYTES;
    // One descriptor per base, + (offset >> 4) per k-step (no carry below 256 KiB).
    const unsigned long long dk = desc_sw128(sK, 16, 1024);
#pragma unroll
    for (int i = 0; i < 32; ++i) sc[i] = 0.f;
    fence_regs(sc);
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < IS_HD / 16; ++ks) {
      const unsigned koff = (ks >> 2) * IS_TBLK + (ks & 3) * 32;
#if IS_QREG
      wg_rs<0>(sc, qf[ks], dk + (koff >> 4));  // accumulates onto the zeros
#else
      const unsigned qoff = (ks >> 2) * IS_QBLK + (ks & 3) * 32;
      wg_ss(sc, desc_sw128(qa, 16, 1024) + (qoff >> 4), dk + (koff >> 4), ks > 0 ? 1 : 0);
#endif
    }
    wg_commit();
  };
  // O += P V with P from registers and V = the tile's rows in `stage`, N-major (issued only).
  auto issue_pv = [&](const unsigned (&pa)[4][4], int stage) {
    const unsigned sV = sRing0 + stage * IS_STAGE_BYTES + IS_TBYTES;
#pragma unroll
    for (int qb = 0; qb < IS_HB; ++qb) fence_regs(o[qb]);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#if IS_HD == 128  // one m64n128k16 per k-step: the P registers read once
      wg_rs128(o[0], o[1], pa[kk], desc_sw128(sV, IS_TBLK, 1024) + (kk * 16 * 128 >> 4));
#else
      wg_rs(o[0], pa[kk], desc_sw128(sV, IS_TBLK, 1024) + (kk * 16 * 128 >> 4));
#endif
    }
    wg_commit();
  };
  // Online softmax of tile `tile` in place: raw scores become P = 2^(logit - m) (f32);
  // m_run and l_run advance; corr gets the factor O must take before the next P V.
  // sc[4 j + e] is column kc + 8 j + 2 tq + (e & 1) of row x = e >> 1.
  auto softmax = [&](float (&sc)[32], int tile, float (&corr)[2]) {
    const int kc = tile * IS_KT + 64 * kw;  // this warpgroup's first column of the tile
    float tmax[2] = {is_neg_inf(), is_neg_inf()};
    // Uniform: every key of the tile live. Such tiles keep the raw scores: the maxima are
    // taken raw and scaled once (scale > 0 and rounding is monotonic, so max(s) * c ==
    // max(s * c) exactly) and the scale folds into the exponent's FMA below.
    const bool raw = !has_bias && (tile + 1) * IS_KT <= live && !s_hole;
    if (raw) {
      // Two independent chains per row, combined in a fixed order (max is exact anyway).
      float t2[2][2];
#pragma unroll
      for (int x = 0; x < 2; ++x)
#pragma unroll
        for (int q = 0; q < 2; ++q) t2[x][q] = is_neg_inf();
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int x = (i >> 1) & 1, q = (i >> 2) & 1;
        t2[x][q] = fmaxf(t2[x][q], sc[i]);
      }
#pragma unroll
      for (int x = 0; x < 2; ++x)
        tmax[x] = __fmul_rn(fmaxf(t2[x][0], t2[x][1]), scale_log2);
    } else {
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int x = (i >> 1) & 1;
        const int col = kc + 8 * (i >> 2) + 2 * tq + (i & 1);
        const int key = col < live ? s_key[col] : -1;
        const int row = row0 + 8 * x;
        float v = is_neg_inf();
        if (key >= 0) {
          v = __fmul_rn(sc[i], scale_log2);
          if (has_bias && row < t.nh)
            v += is_to_f32(bias[t.b * bsb + (long long)(t.h0 + row) * bsh +
                                (long long)t.qi * bsq + (long long)key * bsk]) * IS_LOG2E;
        }
        sc[i] = v;
        tmax[x] = fmaxf(tmax[x], v);
      }
    }
    // P = 2^(logit - m) (ex2_ftz: one MUFU per element): raw tiles scale here, the others
    // were scaled above (times 1 is exact).
    is_softmax_step<32>(sc, tmax, raw ? scale_log2 : 1.f, m_run, l_run, corr);
  };
  auto pack = [&](unsigned (&pa)[4][4], const float (&sc)[32]) { is_acc_pack<32>(pa, sc); };
  auto rescale = [&](const float (&corr)[2]) { is_acc_rescale<IS_HB>(o, corr); };
  // Wait until at most `pending` copy groups of this thread are in flight, make every
  // thread's copies visible to wgmma, then (nxt >= 0) copy tile nxt into stage nxt % ST,
  // which the caller guarantees every warpgroup has retired (the stage of tile nxt - ST).
  // Committed groups: Q, then one per tile (empty past the end), so tile m is group m + 1.
  auto arrive = [&](int pending, int nxt) {
    is_cp_async_wait_dyn(pending);
    fence_proxy_async();  // this thread's cp.async writes, visible to wgmma (async proxy)
    __syncthreads();
    if (nxt >= 0) {
      if (nxt < ntiles) issue(nxt, nxt % ST);
      is_cp_async_commit();
    }
  };

  float s[32], corr[2];
  unsigned pa[4][4];
#if IS_OVERLAP
  // FA3's intra-warpgroup pipelining: S(t+1) is issued before P(t) V(t), and softmax(t+1)
  // runs while the tensor cores still do P(t) V(t). Needs ST >= 3 (the host clamps): the
  // wait for tile t+1 leaves one group less pending than the plain loop's.
  if (ntiles > 0) {
    // Tile 0 (group 1; groups 0 .. ST - 1 committed); stage ST - 1 was never filled: tile
    // ST - 1 goes there (group ST).
    arrive(ST - 2, ST - 1);
    issue_s(s, 0);
    wg_wait0();
    fence_regs(s);
    softmax(s, 0, corr);
    pack(pa, s);
  }
  for (int tile = 0; tile + 1 < ntiles; ++tile) {
    // Tile + 1 (group tile + 2; groups 0 .. ST + tile - 1 committed, ST at tile 0, where
    // this waits one group more than needed). Stages of tiles tile and tile + 1 are read
    // now; tile - 1's is free from tile 1 on: it takes tile + ST - 1.
    arrive(ST - 3, tile >= 1 ? tile + ST - 1 : -1);
    issue_s(s, (tile + 1) % ST);
    rescale(corr);  // O is no wgmma's accumulator now: P(t-1) V(t-1) was retired
    issue_pv(pa, tile % ST);
    wg_wait1();  // S(t+1) retired (groups retire in order); P(t) V(t) may still run
    fence_regs(s);
    softmax(s, tile + 1, corr);
    wg_wait0();
#pragma unroll
    for (int qb = 0; qb < IS_HB; ++qb) fence_regs(o[qb]);
    fence_regs(s);
    pack(pa, s);  // P(t) was wgmma input until the wait above
  }
  if (ntiles > 0) {
    rescale(corr);
    issue_pv(pa, (ntiles - 1) % ST);
    wg_wait0();
#pragma unroll
    for (int qb = 0; qb < IS_HB; ++qb) fence_regs(o[qb]);
  }
#else
  for (int tile = 0; tile < ntiles; ++tile) {
    // Q and tiles 0..tile landed (the newest ST - 2 groups may pend); the stage of tile - 1
    // (retired) takes tile + ST - 1.
    arrive(ST - 2, tile + ST - 1);
    issue_s(s, tile % ST);
    wg_wait0();
    fence_regs(s);
    softmax(s, tile, corr);
    pack(pa, s);
    rescale(corr);
    issue_pv(pa, tile % ST);
    wg_wait0();
#pragma unroll
    for (int qb = 0; qb < IS_HB; ++qb) fence_regs(o[qb]);
  }
#endif
  is_cp_async_wait(0);  // only empty groups can be pending; the ring is reused below
  __syncthreads();

  float l_row[2];
#pragma unroll
  for (int x = 0; x < 2; ++x) l_row[x] = is_quad_sum(l_run[x]);

#if IS_KWG > 1
  // The key-half warpgroup (kw = 1) hands its state to kw = 0 through the ring (slot
  // [value][thread of the warpgroup]: conflict-free), which merges it in registers.
  {
    constexpr int XS = IS_HB * 32 + 4;  // floats a thread hands over: O, m, l
    float* s_x = reinterpret_cast<float*>(sRing) + rw * XS * 128;
    const int tw = tid & 127;
    if (kw == 1) {
#pragma unroll
      for (int qb = 0; qb < IS_HB; ++qb)
#pragma unroll
        for (int i = 0; i < 32; ++i) s_x[(qb * 32 + i) * 128 + tw] = o[qb][i];
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        s_x[(IS_HB * 32 + x) * 128 + tw] = m_run[x];
        s_x[(IS_HB * 32 + 2 + x) * 128 + tw] = l_row[x];
      }
    }
    __syncthreads();
    if (kw == 0) {
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const float mo = s_x[(IS_HB * 32 + x) * 128 + tw];
        const float lo = s_x[(IS_HB * 32 + 2 + x) * 128 + tw];
        const float M = fmaxf(m_run[x], mo);
        const float a = M == is_neg_inf() ? 0.f : exp2f(m_run[x] - M);  // -inf -> 0
        const float bw = M == is_neg_inf() ? 0.f : exp2f(mo - M);
        l_row[x] = __fmaf_rn(lo, bw, __fmul_rn(l_row[x], a));
#pragma unroll
        for (int qb = 0; qb < IS_HB; ++qb)
#pragma unroll
          for (int j = 0; j < 8; ++j)
#pragma unroll
            for (int e = 2 * x; e < 2 * x + 2; ++e)
              o[qb][4 * j + e] =
                  __fmaf_rn(s_x[(qb * 32 + 4 * j + e) * 128 + tw], bw, __fmul_rn(o[qb][4 * j + e], a));
        m_run[x] = M;
      }
    }
  }
#endif
  if (kw == 0) {
#pragma unroll
    for (int x = 0; x < 2; ++x) {
      const int row = row0 + 8 * x;
      if (row >= t.nh) continue;
      const float L = l_row[x];
      if (S == 1) {
        // Same rounding as is_store(O / L): divide, then round each value to IS_DTYPE.
        is_t* yr = y + ((t.b * N + t.h0 + row) * (long long)Sq + t.qi) * IS_HD + 2 * tq;
#pragma unroll
        for (int qb = 0; qb < IS_HB; ++qb)
#pragma unroll
          for (int j = 0; j < 8; ++j) {
            const float O0 = o[qb][4 * j + 2 * x], O1 = o[qb][4 * j + 2 * x + 1];
            *reinterpret_cast<unsigned*>(yr + 64 * qb + 8 * j) =
                is_pack2(L > 0.f ? O0 / L : 0.f, L > 0.f ? O1 / L : 0.f);
          }
      } else {
        is_acc_store_partial<IS_HB>(o, x, m_run[x], L, part_o, part_ml,
                                    is_prow(t.b, t.qi, Sq, N, t.h0 + row, S, t.s), tq);
      }
    }
  }
  // The ring is free for the finish's weights (the merge above is fenced by its barrier).
  if (S > 1 && counters)
    is_finish_if_last_v4<IS_THREADS, IS_HD>(counters, t.task, S, part_o, part_ml, y, t.b, t.qi,
                                            Sq, N, t.h0, t.nh, &s_flag,
                                            reinterpret_cast<float*>(sRing));
  (void)H;
  (void)lpk;
}
