// Lab probe (not shipped): MLA decode for 16 query heads with the heads as the wgmma N
// dimension, S^T = K Q^T and O^T = V^T P^T, so a 64-key tile costs 2.2 MFLOP of wgmma
// instead of the 8.9 of 64 padded query rows (docs/notes/paged_attention.md, "Next kernel
// for H <= 32"). The question it answers: is the kernel then bound by the cache reads alone?
// Scope: bf16, 16 heads, one new token per sequence, 64-key pages, no softcap or window;
// grid (splits, B); one warpgroup; two 72 KB tile stages by TMA; partials merged by
// heads_n_combine. Driven by lab/heads_n_probe.py.
#include <cuda_bf16.h>
#define NXRT_WG_AB "bf16.bf16"
#include "wgmma.cuh"

namespace {

constexpr int H = 16, HS = 576, VHS = 512, BN = 64, HB = HS / 64, VB = VHS / 64;
constexpr int TBLK = BN * 128;        // one 64-channel box of a tile (64 keys x 128 B)
constexpr int T_BYTES = HB * TBLK;    // a tile: 72 KB
constexpr int QBLK = H * 128;         // one 64-channel box of Q (16 heads x 128 B)
constexpr int OFF_Q = 0;
constexpr int OFF_K = HB * QBLK;      // 18 KB, 1024-aligned (the swizzle atom)
constexpr int OFF_P = OFF_K + 2 * T_BYTES;
constexpr int OFF_MX = OFF_P + H * 128;  // [2 parities][4 warps][16 heads] tile maxima
constexpr int OFF_L = OFF_MX + 2 * 4 * H * 4;
constexpr int OFF_BAR = OFF_L + 4 * H * 4;
#define NEG_INF (-__int_as_float(0x7f800000))

struct __align__(64) TmaDesc {
  unsigned long long v[16];
};

__device__ __forceinline__ unsigned to_smem(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void tma_box(unsigned dst, const TmaDesc* map, int x, int y,
                                        unsigned bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<unsigned long long>(map)), "r"(x), "r"(y), "r"(bar)
      : "memory");
}

// D(64x16, f32) (+)= A(64x16, smem) * B(16x16, smem, K-major); TA = 1: A is M-major
// (V^T read from the tile as it lies, channels contiguous), 0: K-major.
template <int TA>
__device__ __forceinline__ void wg16(float (&d)[8], unsigned long long da,
                                     unsigned long long db, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1, %11, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
        "+f"(d[7])
      : "l"(da), "l"(db), "r"(scale_d), "n"(TA));
}

}  // namespace

// Accumulator layout (m64n16): warp w, lane 4 g + q holds rows 16 w + g (+ 8 for e >= 2)
// and columns 8 j + 2 q + (e & 1) in d[4 j + e]. Rows are keys in S^T, value channels in
// O^T; columns are heads in both: this thread's heads are hd(j, c) = 8 j + 2 q + c.
extern "C" __global__ void __launch_bounds__(128, 1)
heads_n_fwd(const __nv_bfloat16* __restrict__ query, const int* __restrict__ seqlens,
            const int* __restrict__ block_table, int max_blocks, int tps, float sl2,
            __nv_bfloat16* __restrict__ out, float* __restrict__ ws_o,
            float* __restrict__ ws_ml, const __grid_constant__ TmaDesc kv_map) {
  extern __shared__ unsigned char smem_raw[];
  const unsigned raw = to_smem(smem_raw);
  const unsigned sbase = (raw + 1023u) & ~1023u;
  unsigned char* smem = smem_raw + (sbase - raw);
  const int tid = threadIdx.x, lane = tid & 31, w = tid >> 5, g = lane >> 2, q = lane & 3;
  const int b = blockIdx.y, sp = blockIdx.x, splits = gridDim.x;
  const int n_keys = seqlens[b];
  const int n_tiles = (n_keys + BN - 1) / BN;
  const int t_lo = sp * tps;
  const int nt = max(min(n_tiles, t_lo + tps) - t_lo, 0);
  const unsigned bar0 = sbase + OFF_BAR;
  if (tid == 0) {
    mbar_init(bar0, 1);
    mbar_init(bar0 + 8, 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  const int* bt = block_table + (long long)b * max_blocks;
  // Tile t_lo + i (one whole page) into stage i & 1, by one thread.
  auto issue = [&](int i) {
    const int row = bt[t_lo + i] * BN;
    const unsigned bar = bar0 + 8 * (i & 1), dst = sbase + OFF_K + (i & 1) * T_BYTES;
    expect_tx(bar, T_BYTES);
    for (int k = 0; k < HB; ++k) tma_box(dst + k * TBLK, &kv_map, k * 64, row, bar);
  };
  if (tid == 0) {
    if (nt > 0) issue(0);
    if (nt > 1) issue(1);
  }
  // Q [16][576] into nine swizzled 64-channel boxes (the B operand of S^T, K-major).
  const __nv_bfloat16* qb = query + (long long)b * H * HS;
  for (int c = tid; c < H * (HS / 8); c += 128) {
    const int r = c / (HS / 8), cc = c % (HS / 8);
    const uint4 v = *reinterpret_cast<const uint4*>(qb + r * HS + cc * 8);
    *reinterpret_cast<uint4*>(smem + OFF_Q + (cc >> 3) * QBLK + r * 128 +
                              (((cc & 7) ^ (r & 7)) << 4)) = v;
  }
  fence_proxy_async();
  __syncthreads();

  const unsigned long long dq = desc_sw128(sbase + OFF_Q, 16, 1024);
  const unsigned long long dk = desc_sw128(sbase + OFF_K, 16, 1024);
  const unsigned long long dv = desc_sw128(sbase + OFF_K, TBLK, 1024);
  const unsigned long long dp = desc_sw128(sbase + OFF_P, 16, 1024);
  float o[VB][8];
#pragma unroll
  for (int v = 0; v < VB; ++v)
#pragma unroll
    for (int e = 0; e < 8; ++e) o[v][e] = 0.0f;
  float m[4], l[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) m[i] = NEG_INF, l[i] = 0.0f;

  for (int i = 0; i < nt; ++i) {
    const int st = i & 1;
    mbar_wait(bar0 + 8 * st, (i >> 1) & 1);
    float s[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) s[e] = 0.0f;
    fence_regs(s);
    wg_fence();
#pragma unroll
    for (int k = 0; k < HB; ++k)
#pragma unroll
      for (int kq = 0; kq < 4; ++kq)
        wg16<0>(s, desc_add(dk, st * T_BYTES + k * TBLK + kq * 32),
                desc_add(dq, k * QBLK + kq * 32), (k | kq) ? 1 : 0);
    wg_commit();
    wg_wait0();
    fence_regs(s);

    // Scores (log2 domain), masked past the sequence; each head's max over the tile's 64
    // keys: the thread's two keys, the warp's 8 lanes of the same q, then the four warps.
    const int key0 = (t_lo + i) * BN + 16 * w + g;
    float tm[4];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + ((e >> 1) ? 8 : 0);
        s[4 * j + e] = key < n_keys ? s[4 * j + e] * sl2 : NEG_INF;
      }
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        float v = fmaxf(s[4 * j + c], s[4 * j + 2 + c]);
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
        tm[2 * j + c] = v;
      }
    float* mx = reinterpret_cast<float*>(smem + OFF_MX) + st * 4 * H;
    if (g == 0) {
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) mx[w * H + 8 * j + 2 * q + c] = tm[2 * j + c];
    }
    named_bar_sync(1, 128);
    float sc[4], base[4];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int hd = 8 * j + 2 * q + c, x = 2 * j + c;
        const float t = fmaxf(fmaxf(mx[hd], mx[H + hd]), fmaxf(mx[2 * H + hd], mx[3 * H + hd]));
        const float mn = fmaxf(m[x], t);
        base[x] = mn == NEG_INF ? 0.0f : mn;
        sc[x] = ex2_ftz(m[x] - base[x]);
        m[x] = mn;
      }
    // P = 2^(s - m); the row sums per thread; P^T into shared memory as [16 heads][64 keys]
    // (the B operand of O^T, K-major, swizzled).
    unsigned char* sp_ = smem + OFF_P;
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int x = 2 * j + (e & 1);
        const float p = ex2_ftz(s[4 * j + e] - base[x]);
        if (e < 2) l[x] *= sc[x];
        l[x] += p;
        const int hd = 8 * j + 2 * q + (e & 1), key = 16 * w + g + ((e >> 1) ? 8 : 0);
        *reinterpret_cast<__nv_bfloat16*>(sp_ + hd * 128 + ((((key >> 3) ^ (hd & 7))) << 4) +
                                          (key & 7) * 2) = __float2bfloat16_rn(p);
      }
#pragma unroll
    for (int v = 0; v < VB; ++v)
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[v][4 * j + e] *= sc[2 * j + (e & 1)];
    fence_proxy_async();
    named_bar_sync(2, 128);

#pragma unroll
    for (int v = 0; v < VB; ++v) fence_regs(o[v]);
    wg_fence();
#pragma unroll
    for (int v = 0; v < VB; ++v)
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wg16<1>(o[v], desc_add(dv, st * T_BYTES + v * TBLK + kk * 2048), desc_add(dp, kk * 32),
                1);
    wg_commit();
    wg_wait0();
#pragma unroll
    for (int v = 0; v < VB; ++v) fence_regs(o[v]);
    named_bar_sync(3, 128);  // every warp's wgmma reads of this stage are done
    if (tid == 0 && i + 2 < nt) issue(i + 2);
  }

  // Row sums: the 8 lanes of a q, then the four warps (m is the same in every warp).
  float* ls = reinterpret_cast<float*>(smem + OFF_L);
#pragma unroll
  for (int x = 0; x < 4; ++x) {
    l[x] += __shfl_xor_sync(0xffffffffu, l[x], 4);
    l[x] += __shfl_xor_sync(0xffffffffu, l[x], 8);
    l[x] += __shfl_xor_sync(0xffffffffu, l[x], 16);
  }
  if (g == 0) {
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) ls[w * H + 8 * j + 2 * q + c] = l[2 * j + c];
  }
  __syncthreads();
  float lt[4];
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int hd = 8 * j + 2 * q + c;
      lt[2 * j + c] = ls[hd] + ls[H + hd] + ls[2 * H + hd] + ls[3 * H + hd];
    }
  const long long unit = (long long)b * splits + sp;
#pragma unroll
  for (int v = 0; v < VB; ++v)
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int hd = 8 * j + 2 * q + (e & 1), ch = 64 * v + 16 * w + g + ((e >> 1) ? 8 : 0);
        const float val = o[v][4 * j + e];
        if (splits == 1)
          out[((long long)b * H + hd) * VHS + ch] = __float2bfloat16_rn(val / lt[2 * j + (e & 1)]);
        else
          ws_o[(unit * H + hd) * VHS + ch] = val;
      }
  if (splits > 1 && w == 0 && g == 0) {
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int hd = 8 * j + 2 * q + c;
        ws_ml[(unit * H + hd) * 2 + 0] = m[2 * j + c];
        ws_ml[(unit * H + hd) * 2 + 1] = lt[2 * j + c];
      }
  }
}

// out[b][h][ch] from the splits' partials (m in the log2 domain); grid B, 512 threads.
extern "C" __global__ void heads_n_combine(const float* __restrict__ ws_o,
                                           const float* __restrict__ ws_ml, int splits,
                                           __nv_bfloat16* __restrict__ out) {
  const int b = blockIdx.x, ch = threadIdx.x;
  for (int hd = 0; hd < H; ++hd) {
    float mm = NEG_INF;
    for (int s = 0; s < splits; ++s) mm = fmaxf(mm, ws_ml[(((long long)b * splits + s) * H + hd) * 2]);
    float lsum = 0.0f, acc = 0.0f;
    for (int s = 0; s < splits; ++s) {
      const long long u = (long long)b * splits + s;
      const float ms = ws_ml[(u * H + hd) * 2], lv = ws_ml[(u * H + hd) * 2 + 1];
      const float wt = lv > 0.0f ? exp2f(ms - mm) : 0.0f;
      lsum += lv * wt;
      acc += ws_o[(u * H + hd) * VHS + ch] * wt;
    }
    out[((long long)b * H + hd) * VHS + ch] = __float2bfloat16_rn(acc / lsum);
  }
}
