// Helpers shared by the PagedAttention (LATENT / MLA) kernels: element types, the
// tensor-core wrappers (ldmatrix, mma.sync m16n8k16, cp.async), sequence lookup and RoPE.
// Everything here is sm_80+; nothing needs sm_90a.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

// Latch bits (nxrt.latch): a slot_mapping / block_table entry outside the cache, and a
// token position outside the cos/sin cache (see paged_attention.py).
#define PA_LATCH_SLOT 1024u
#define PA_LATCH_BLOCK 2048u
#define PA_LATCH_POSITION 4096u

#define PA_NEG_INF __int_as_float(0xff800000)
#define PA_LOG2E 1.4426950408889634f

namespace pa {

template <typename T> struct Num;

template <> struct Num<__half> {
  static __device__ __forceinline__ float to_f(__half x) { return __half2float(x); }
  static __device__ __forceinline__ __half from_f(float x) { return __float2half_rn(x); }
  // Two floats rounded and packed little-end-first (a in the low half), as mma wants them.
  static __device__ __forceinline__ unsigned pack2(float a, float b) {
    __half2 h = __floats2half2_rn(a, b);
    return *reinterpret_cast<unsigned*>(&h);
  }
};

template <> struct Num<__nv_bfloat16> {
  static __device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __device__ __forceinline__ __nv_bfloat16 from_f(float x) { return __float2bfloat16_rn(x); }
  static __device__ __forceinline__ unsigned pack2(float a, float b) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<unsigned*>(&h);
  }
};

// D = A(16x16, row) * B(16x8, col) + D with f32 accumulation.
template <typename T> struct Mma;

template <> struct Mma<__half> {
  static __device__ __forceinline__ void run(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                             unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <> struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float (&d)[4], const unsigned (&a)[4], unsigned b0,
                                             unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldsm_x4(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldsm_x2(unsigned& r0, unsigned& r1, unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r0), "=r"(r1)
               : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_trans(unsigned (&r)[4], unsigned addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// 16-byte global->shared copy; src_bytes == 0 writes zeros and reads nothing (the source
// address must still be a valid pointer, so callers pass a known-good base then).
__device__ __forceinline__ void cp_async16(unsigned dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// Wait until at most N of this thread's most recent cp.async groups are pending.
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ unsigned dynamic_smem_bytes() {
  unsigned r;
  asm volatile("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(r));
  return r;
}

// The sequence that owns global token t: the largest b in [0, B) with cu[b] <= t, accepted
// only if t < cu[b + 1]; -1 when none does. For a well-formed cu (non-decreasing, cu[0] = 0,
// cu[B] = T) this is the unique sequence whose token range holds t (empty sequences are
// skipped). Reads only cu[0..B], so a malformed cu can never index out of bounds.
__device__ __forceinline__ int locate_seq(const int* __restrict__ cu, int B, long long t) {
  int lo = 0, hi = B - 1, ans = -1;
  while (lo <= hi) {
    const int mid = (lo + hi) >> 1;
    if ((long long)cu[mid] <= t) {
      ans = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  if (ans >= 0 && t >= (long long)cu[ans + 1]) ans = -1;
  return ans;
}

__device__ __forceinline__ long long floor_div(long long a, long long b) {
  return a >= 0 ? a / b : -((-a + b - 1) / b);
}

// Row setup shared by the MLA read kernels (paged_mla.cu, paged_mla_wg.cu). A CTA owns row
// block x: M (token, head) rows of ONE sequence, token-major. Sequence b owns row blocks
// [G(b), G(b+1)), G(b) = floor(cu[b] * H / M) + (H % M ? b : 0), which always holds its
// ceil(q_len * H / M) blocks, so no host readback is needed; surplus CTAs get -1.
// Fills sRowP (last key a row sees, -1: none), sRowLo (first key), sRowOut (t * H + h, or -1)
// for the M rows, and the CTA's key range [key_lo, key_hi] (empty: key_hi < key_lo).
// Every thread of the CTA must call it (it has barriers); needs blockDim.x >= M.
// Returns the sequence, or -1 for a surplus CTA (the same value in every thread).
template <int M>
__device__ int mla_rows(const int* __restrict__ cu, const int* __restrict__ past,
                        unsigned* __restrict__ latch, int n_tokens, int H, int B, int x,
                        int max_blocks, int block_size, int max_pos, int do_rotary, int window,
                        int* sMisc, int* sRowP, int* sRowLo, int* sRowOut, int& key_lo,
                        int& key_hi, int known_b = -1) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int extra = (H % M) ? 1 : 0;
  // Which sequence owns row block x (every thread tests a few b in parallel), unless the
  // caller knows it (the partition's cursor: a valid sequence that owns x).
  if (tid == 0) sMisc[0] = known_b;
  __syncthreads();
  for (int base = 0; base < B && known_b < 0; base += blockDim.x) {
    const int b = base + tid;
    if (b < B) {
      const long long c0 = cu[b], c1 = cu[b + 1];
      if (c0 >= 0 && c0 <= c1 && c1 <= n_tokens) {
        const long long g0 = floor_div(c0 * H, M) + (long long)extra * b;
        const long long g1 = floor_div(c1 * H, M) + (long long)extra * (b + 1);
        if (g0 <= x && x < g1) atomicMax(&sMisc[0], b);
      }
    }
  }
  __syncthreads();
  const int b = sMisc[0];
  if (b < 0) return -1;  // surplus CTA (uniform)
  const int c0 = cu[b];
  const long long q_rows = (long long)(cu[b + 1] - c0) * H;
  const long long local_block = x - (floor_div((long long)c0 * H, M) + (long long)extra * b);
  const int past_b = past[b];
  // Per-row token, position and key range.
  if (tid < M) {
    const long long R = local_block * M + tid;
    int p = -1, lo = 0, orow = -1;
    if (R < q_rows) {
      const int tq_ = (int)(R / H), h = (int)(R % H);
      orow = (c0 + tq_) * H + h;
      const long long pos = (long long)past_b + tq_;
      if (do_rotary && (pos < 0 || pos >= max_pos)) {
        atomicOr(latch, PA_LATCH_POSITION);
      } else if (pos >= 0) {
        // Keys past the table (j >= max_blocks * block_size) can only latch; stopping at the
        // first of them keeps every key index far from int overflow.
        p = (int)min(pos, (long long)max_blocks * block_size);
        lo = window >= 0 ? max(0, p - window) : 0;
      }
    }
    sRowP[tid] = p;
    sRowLo[tid] = lo;
    sRowOut[tid] = orow;
  }
  __syncthreads();
  if (warp == 0) {
    // Key range of the CTA: union of the rows' [lo, p].
    int klo = 0x7fffffff, khi = -1;
    for (int r = lane; r < M; r += 32) {
      if (sRowP[r] >= sRowLo[r]) {
        klo = min(klo, sRowLo[r]);
        khi = max(khi, sRowP[r]);
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      klo = min(klo, __shfl_xor_sync(0xffffffffu, klo, o));
      khi = max(khi, __shfl_xor_sync(0xffffffffu, khi, o));
    }
    if (lane == 0) {
      sMisc[1] = klo;
      sMisc[2] = khi;
    }
  }
  __syncthreads();
  key_lo = sMisc[1];
  key_hi = sMisc[2];
  return b;
}

// Tiles [tile_begin, tile_begin + n_tiles) of BN keys that split `split` of `num_splits`
// covers in the key range [key_lo, key_hi] (n_tiles = 0: none).
__device__ __forceinline__ void split_tiles(int key_lo, int key_hi, int bn, int split,
                                            int num_splits, int& tile_begin, int& n_tiles) {
  tile_begin = 0;
  n_tiles = 0;
  if (key_hi >= key_lo) {
    const int t_lo = key_lo / bn, t_hi = key_hi / bn;
    const int chunk = (t_hi - t_lo + 1 + num_splits - 1) / num_splits;
    tile_begin = t_lo + split * chunk;
    n_tiles = max(0, min(tile_begin + chunk, t_hi + 1) - tile_begin);
  }
}

// The rows and keys of sequence b as split-KV balancing sees them (both wgmma kernels): its
// q new tokens make rb = ceil(q H / M) row blocks from x0 = G(b) on (as mla_rows), and every
// key they read lies in the n tiles [t0, t0 + n) of its key span (first token's window start
// .. last token's position; n = 0: none). A malformed cu entry gives a sequence of no rows.
struct SeqShape {
  int qn, rb, n, t0, x0;
};
struct SeqArgs {
  const int* cu;
  const int* past;
  int n_tokens, H, M, bn, key_cap, window;
  __device__ __forceinline__ SeqShape shape(int b) const {
    SeqShape s{0, 0, 0, 0, 0};
    const long long c0 = cu[b], c1 = cu[b + 1];
    s.x0 = (int)floor_div(c0 * H, M) + ((H % M) ? b : 0);
    if (c0 >= 0 && c0 <= c1 && c1 <= n_tokens && c1 > c0) {
      const long long q = c1 - c0;
      s.qn = (int)q;
      s.rb = (int)((q * H + M - 1) / M);
      const long long p0 = past[b];
      const long long hi = min(p0 + q - 1, (long long)key_cap);
      const long long first = min(p0, (long long)key_cap);
      const long long lo = window >= 0 ? max(0LL, first - window) : 0LL;
      if (hi >= 0 && hi >= lo) {
        s.t0 = (int)(lo / bn);
        s.n = (int)(hi / bn) - s.t0 + 1;
      }
    }
    return s;
  }
};

// In place: v[0 .. B) becomes its exclusive prefix sums and v[B] the total. Each thread sums a
// contiguous run, then a warp scan and a scan of the warp totals give its run's offset. Every
// thread of the CTA calls it after a __syncthreads that published v; it ends with one.
__device__ __forceinline__ void block_exclusive_scan(int* v, int B) {
  __shared__ int sWarp[32];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int per = (B + blockDim.x - 1) / blockDim.x;
  const int b0 = min(B, tid * per), b1 = min(B, b0 + per);
  int mine = 0;
  for (int b = b0; b < b1; ++b) mine += v[b];
  int incl = mine;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int u = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += u;
  }
  if (lane == 31) sWarp[warp] = incl;
  __syncthreads();
  int acc = incl - mine;
  for (int w = 0; w < warp; ++w) acc += sWarp[w];
  for (int b = b0; b < b1; ++b) {
    const int x = v[b];
    v[b] = acc;
    acc += x;
  }
  if (tid == blockDim.x - 1) v[B] = acc;
  __syncthreads();
}

// ---- Balanced split-KV (paged_mla_wg.cu, docs/notes/paged_attention.md#balanced-splits).
// Every CTA computes the same schedule from cu / past (no readback, capturable). Sequence b
// with q_b new tokens has rb_b = ceil(q_b H / M) row blocks (G(b) .. G(b) + rb_b - 1) whose
// keys all lie in the tiles [t0_b, t0_b + n_b) of its key span (first token's window start ..
// last token's position). One chunk length C (tiles) serves the launch: sequence b gets
// k_b = ceil(n_b / C) chunks per row block (1 when it has rows but no keys), chunk j covering
// tiles [t0_b + j C, t0_b + (j + 1) C). C = ceil(n_max / s) for the s in [1, max_splits]
// that minimises the planner's cost model (plan.choose_splits) with the real lengths:
//   ceil(busy / sms) * (C * tile_us + pro_us + (s > 1) * part_us)
//     + (s > 1) * (comb_us + split rows * k * vhs * 4 / comb_rate).
// CTAs take the busy (row block, chunk) pairs in order: linear index i = y * gridDim.x + x,
// sequence-major, then row block, then chunk; CTAs past them exit. Scratch: 5 * (B + 1) ints.
struct Sched {
  int x;      // row block (as mla_rows' x); -1: surplus CTA
  int chunk;  // j
  int k;      // chunks of this row block (1: unsplit, written directly)
  int t_lo;   // first tile of the chunk
  int t_end;  // one past its last tile
};

// The tiles of a (row block, chunk) pair whose rows read keys [key_lo, key_hi]: a balanced
// chunk [sc.t_lo, sc.t_end) clipped to them, else split `split` of `num_splits` equal parts.
__device__ __forceinline__ void pair_tiles(bool balanced, const Sched& sc, int key_lo,
                                           int key_hi, int bn, int split, int num_splits,
                                           int& tile_begin, int& n_tiles) {
  if (balanced) {
    tile_begin = max(sc.t_lo, key_lo / bn);
    n_tiles = key_hi >= key_lo ? max(0, min(sc.t_end, key_hi / bn + 1) - tile_begin) : 0;
  } else {
    split_tiles(key_lo, key_hi, bn, split, num_splits, tile_begin, n_tiles);
  }
}

// The launch's chunk length and busy-pair count; the per-sequence tables stay in scratch
// for balanced_unit (until the scratch is reused).
struct SchedPlan {
  int C;      // chunk length in tiles
  int total;  // busy (row block, chunk) pairs
};

__device__ __forceinline__ SchedPlan balanced_plan(
    const int* __restrict__ cu, const int* __restrict__ past, int n_tokens, int H, int B, int M,
    int bn, int key_cap, int window, int max_splits, int sms, float tile_us, float pro_us,
    float part_us, float comb_us, float comb_rate, int vhs, int* scratch) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nwarp = blockDim.x >> 5;
  int* sN = scratch;            // n_b
  int* sQn = sN + (B + 1);      // q_b (its rows: q_b H, its row blocks: ceil(q_b H / M))
  int* sT0 = sQn + (B + 1);     // t0_b
  int* sPre = sT0 + (B + 1);    // exclusive prefix of rb_b * k_b (B + 1 entries)
  int* sX0 = sPre + (B + 1);    // G(b): the first row block (as mla_rows' x)
  __shared__ int sMax;
  __shared__ __align__(16) float sCost[64];
  __shared__ int sPick;
  if (tid == 0) sMax = 0;
  __syncthreads();
  const SeqArgs sa{cu, past, n_tokens, H, M, bn, key_cap, window};
  for (int b = tid; b < B; b += blockDim.x) {
    const SeqShape sh = sa.shape(b);
    sN[b] = sh.n;
    sQn[b] = sh.qn;
    sT0[b] = sh.t0;
    sX0[b] = sh.x0;
    if (sh.n > 0) atomicMax(&sMax, sh.n);
  }
  __syncthreads();
  const int n_max = sMax;
  const int s_hi = max(1, min(min(max_splits, 64), n_max));  // sCost holds 64
  // The cost of each candidate count s, from shared memory only and in 32-bit division:
  // this runs before every CTA's first load, so it is kept short (measured:
  // docs/notes/paged_attention.md#balanced-splits).
  auto rbs = [&](int b) { return (sQn[b] * H + M - 1) / M; };
  // Busy pairs and split rows of sequences b0, b0 + step, ... for chunk length C.
  auto tally = [&](int C, int b0, int step, int& busy, long long& prow) {
    busy = 0;
    prow = 0;
    for (int b = b0; b < B; b += step) {
      const int rb = rbs(b);
      const int k = sN[b] > 0 ? (sN[b] + C - 1) / C : (rb > 0 ? 1 : 0);
      busy += rb * k;
      if (k > 1) prow += (long long)sQn[b] * H * k;
    }
  };
  auto cost_of = [&](int s, int C, int busy, long long prow) {
    const float waves = (float)((busy + sms - 1) / sms);  // busy < 2^31: B <= 4096
    float cost = waves * (C * tile_us + pro_us + (s > 1 ? part_us : 0.0f));
    if (s > 1) cost += comb_us + (float)prow * vhs * 4.0f / comb_rate;
    return cost;
  };
  if (B <= 32) {
    // Few sequences: one thread per candidate, no reduction.
    if (tid < s_hi) {
      const int s = tid + 1, C = (n_max + s - 1) / s;
      int busy;
      long long prow;
      tally(C, 0, 1, busy, prow);
      sCost[s - 1] = cost_of(s, C, busy, prow);
    }
  } else {
    // One warp per candidate s = w + 1, w + 1 + nwarp, ..., lanes over sequences.
    for (int s = warp + 1; s <= s_hi; s += nwarp) {
      const int C = (n_max + s - 1) / s;
      int busy;
      long long prow;
      tally(C, lane, 32, busy, prow);
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        busy += __shfl_xor_sync(0xffffffffu, busy, o);
        prow += __shfl_xor_sync(0xffffffffu, prow, o);
      }
      if (lane == 0) sCost[s - 1] = cost_of(s, C, busy, prow);
    }
  }
  __syncthreads();
  if (tid == 0) {
    // The costs in registers first (16 vector loads), then the serial rule.
    float c[64];
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const float4 v = reinterpret_cast<const float4*>(sCost)[j];
      c[4 * j] = v.x;
      c[4 * j + 1] = v.y;
      c[4 * j + 2] = v.z;
      c[4 * j + 3] = v.w;
    }
    int best = 1;
    float best_cost = c[0];
#pragma unroll
    for (int s = 2; s <= 64; ++s)
      if (s <= s_hi && c[s - 1] < best_cost - 1e-3f) {  // the smallest of equal costs
        best = s;
        best_cost = c[s - 1];
      }
    sPick = best;
  }
  __syncthreads();
  const int C = n_max > 0 ? (n_max + sPick - 1) / sPick : 1;
  // Exclusive prefix of the busy pairs per sequence.
  for (int b = tid; b < B; b += blockDim.x) {
    const int rb = rbs(b);
    sPre[b] = rb * (sN[b] > 0 ? (sN[b] + C - 1) / C : (rb > 0 ? 1 : 0));
  }
  __syncthreads();
  block_exclusive_scan(sPre, B);
  return SchedPlan{C, sPre[B]};
}

// The i-th busy (row block, chunk) pair of the plan (x = -1 past the last).
__device__ __forceinline__ Sched balanced_unit(long long i, SchedPlan sp, int B,
                                               const int* scratch) {
  const int* sN = scratch;
  const int* sT0 = sN + 2 * (B + 1);
  const int* sPre = sN + 3 * (B + 1);
  const int* sX0 = sN + 4 * (B + 1);
  const int C = sp.C;
  Sched r{-1, 0, 0, 0, 0};
  if (i >= sp.total) return r;
  int lo = 0, hi = B - 1, b = 0;  // the last b with sPre[b] <= i (and rb_b > 0)
  while (lo <= hi) {
    const int mid = (lo + hi) >> 1;
    if (sPre[mid] <= i) {
      b = mid;
      lo = mid + 1;
    } else {
      hi = mid - 1;
    }
  }
  const int k = sN[b] > 0 ? (sN[b] + C - 1) / C : 1;
  const int local = (int)(i - sPre[b]);
  r.x = sX0[b] + local / k;
  r.chunk = local % k;
  r.k = k;
  r.t_lo = sT0[b] + r.chunk * C;
  r.t_end = r.t_lo + C;
  return r;
}

// This CTA's pair (linear index y * gridDim.x + x) of balanced_plan.
__device__ __forceinline__ Sched balanced_sched(
    const int* __restrict__ cu, const int* __restrict__ past, int n_tokens, int H, int B, int M,
    int bn, int key_cap, int window, int max_splits, int sms, float tile_us, float pro_us,
    float part_us, float comb_us, float comb_rate, int vhs, int* scratch) {
  const SchedPlan sp = balanced_plan(cu, past, n_tokens, H, B, M, bn, key_cap, window,
                                     max_splits, sms, tile_us, pro_us, part_us, comb_us,
                                     comb_rate, vhs, scratch);
  return balanced_unit((long long)blockIdx.y * gridDim.x + blockIdx.x, sp, B, scratch);
}

// ---- Contiguous partition: the pair kernel's balanced launch (paged_mla_pair.cu;
// docs/notes/paged_attention.md#contiguous-partition). The G CTAs form `lanes` lanes of
// P = G / lanes parts; row block j of a sequence belongs to lane j % lanes, so with
// lanes = ceil(H / 64) the row blocks of one decode token, which read the same keys, run on
// parallel lanes at the same time (the second read comes from L2). On each lane's line its
// row blocks lie end to end (sequence-major), each w = ovh + m positions wide: ovh for its
// fixed cost (setup, Q, pipeline fill, epilogue) and then one per tile of its span, m =
// max(n, 1) (a row block with rows but no keys still takes a unit). Part p of the lane takes
// the positions [p C, (p + 1) C), C = ceil(W / P), W the line's length: every tile lies in
// exactly one part's range, and a row block's chunks are the ranges it meets, in key order
// (the one of part p is p - floor(T / C), T its first tile's position). Row block x cut by
// part p writes its partials to slot (x + p) * lanes + lane (unique: x and p both grow along
// a lane's line). Every CTA computes its lane's line from cu / past (no readback,
// capturable); its row blocks are walked one after the other (part_next), so a CTA may take
// any number of them.
struct Part {
  int p, lane, lanes, C, a, e;  // part, lane, lanes, the range length, the range [a, e)
  int b, j, start;              // the cursor: row block j of sequence b, its width at start
  SeqShape s;                   // sequence b's
};

// The CTA's range and the cursor at its first row block. Scratch: 5 (B + 1) ints, free again
// after the caller's next __syncthreads. Every thread calls it and gets the same result.
__device__ __forceinline__ Part part_begin(const SeqArgs& sa, int B, int ovh, int lanes,
                                           int* scratch) {
  Part p;
  const int c = blockIdx.y * gridDim.x + blockIdx.x;
  const int parts = max(gridDim.x * gridDim.y / lanes, 1u);  // the host keeps lanes <= CTAs
  p.lanes = lanes;
  p.lane = c % lanes;
  p.p = c / lanes;
  int* sN = scratch + (B + 1);  // the shapes, so the cursor's first sequence is not reloaded
  int* sT0 = sN + (B + 1);
  int* sRb = sT0 + (B + 1);
  int* sX0 = sRb + (B + 1);
  for (int b = threadIdx.x; b < B; b += blockDim.x) {
    const SeqShape sh = sa.shape(b);
    const int mine = sh.rb > p.lane ? (sh.rb - p.lane + lanes - 1) / lanes : 0;
    scratch[b] = mine * (ovh + max(sh.n, 1));
    sN[b] = sh.n;
    sT0[b] = sh.t0;
    sRb[b] = sh.rb;
    sX0[b] = sh.x0;
  }
  __syncthreads();
  block_exclusive_scan(scratch, B);
  const int W = scratch[B];
  p.C = max((W + parts - 1) / parts, 1);
  p.a = (int)min((long long)p.p * p.C, (long long)W);
  p.e = min(p.a + p.C, W);
  p.b = B;
  p.j = p.start = 0;
  p.s = SeqShape{0, 0, 0, 0, 0};
  if (p.a < W) {
    int lo = 0, hi = B - 1, b = 0;  // the last b with scratch[b] <= a: its width holds a
    while (lo <= hi) {
      const int mid = (lo + hi) >> 1;
      if (scratch[mid] <= p.a) {
        b = mid;
        lo = mid + 1;
      } else {
        hi = mid - 1;
      }
    }
    p.b = b;
    p.s = SeqShape{0, sRb[b], sN[b], sT0[b], sX0[b]};
    const int w = ovh + max(p.s.n, 1), k = (p.a - scratch[b]) / w;
    p.j = p.lane + k * lanes;
    p.start = scratch[b] + k * w;
  }
  return p;
}

// The next (row block, chunk) of the CTA's range into sc, advancing the cursor; false when
// the range holds no more tiles. Uniform: every thread walks the same cursor.
__device__ __forceinline__ bool part_next(Part& p, const SeqArgs& sa, int B, int ovh,
                                          Sched& sc) {
  for (;;) {
    if (p.b >= B || p.start >= p.e) return false;
    if (p.j >= p.s.rb) {  // on to the lane's row blocks of the next sequence
      if (++p.b >= B) return false;
      p.s = sa.shape(p.b);
      p.j = p.lane;
      continue;
    }
    const int m = max(p.s.n, 1), T = p.start + ovh;
    if (T >= p.e) return false;
    const int lo = max(p.a, T), hi = min(p.e, T + m), first = T / p.C;
    sc.x = p.s.x0 + p.j;
    sc.chunk = p.p - first;
    sc.k = (T + m - 1) / p.C - first + 1;
    sc.t_lo = p.s.t0 + (lo - T);
    sc.t_end = p.s.t0 + (hi - T);
    p.start += ovh + m;
    p.j += p.lanes;
    return true;
  }
}

// Partial RoPE in place on a CTA's M query rows in shared memory (the wgmma kernels, after
// their Q copy; rows with row_pos < 0 are padding): one (d1, d2) pair per thread and step,
// NT threads; at(r, c) is the byte offset of row r's 16-byte chunk c (the kernel's swizzle).
template <typename T, int M, int NT, typename At>
__device__ __forceinline__ void rope_rows_smem(unsigned char* q, const int* row_pos, int rd,
                                               int off, int interleaved,
                                               const T* __restrict__ cos_c,
                                               const T* __restrict__ sin_c, At at) {
  const int half = rd >> 1;
  for (int idx = threadIdx.x; idx < M * half; idx += NT) {
    const int r = idx / half, i = idx - r * half;
    const int p = row_pos[r];
    if (p < 0) continue;
    const int d1 = interleaved ? off + 2 * i : off + i;
    const int d2 = interleaved ? d1 + 1 : d1 + half;
    T* e1 = reinterpret_cast<T*>(q + at(r, d1 >> 3)) + (d1 & 7);
    T* e2 = reinterpret_cast<T*>(q + at(r, d2 >> 3)) + (d2 & 7);
    const float cs = Num<T>::to_f(cos_c[(long long)p * half + i]);
    const float sn = Num<T>::to_f(sin_c[(long long)p * half + i]);
    const float x1 = Num<T>::to_f(*e1), x2 = Num<T>::to_f(*e2);
    *e1 = Num<T>::from_f(x1 * cs - x2 * sn);
    *e2 = Num<T>::from_f(x2 * cs + x1 * sn);
  }
}

// Channel d of a head row (x points at the row) after partial RoPE at absolute position pos;
// channels outside [off, off + rd) pass through. Half-split pairs (i, i + rd/2), interleaved
// pairs (2i, 2i + 1); the first of a pair gets x*c - partner*s, the second x*c + partner*s.
// pos must already be in [0, max_pos).
template <typename T>
__device__ __forceinline__ float rope_channel(const T* __restrict__ x, int d, int off, int rd,
                                              long long pos, const T* __restrict__ cos_c,
                                              const T* __restrict__ sin_c, int interleaved) {
  const float v = Num<T>::to_f(x[d]);
  if (d < off || d >= off + rd) return v;
  const int half = rd >> 1;
  const int r = d - off;
  int i, partner;
  float sign;
  if (interleaved) {
    i = r >> 1;
    if ((r & 1) == 0) { partner = d + 1; sign = -1.0f; }
    else { partner = d - 1; sign = 1.0f; }
  } else if (r < half) {
    i = r; partner = d + half; sign = -1.0f;
  } else {
    i = r - half; partner = d - half; sign = 1.0f;
  }
  const float c = Num<T>::to_f(cos_c[pos * half + i]);
  const float s = Num<T>::to_f(sin_c[pos * half + i]);
  return v * c + sign * Num<T>::to_f(x[partner]) * s;
}

}  // namespace pa
