// Warp-level tensor-core and async-copy wrappers for index_share_mma.cu (sm_80+).
// Under -DNXRT_EMU they map to the host emulation in index_share_emu.cuh.
#pragma once
#include "index_share_common.cuh"

#ifdef NXRT_EMU
#define is_cp_async16(dst, src, nbytes) emu_cp_async16((dst), (src), (nbytes))
#define is_cp_async_commit() emu_cp_async_commit()
#define is_cp_async_wait(n) emu_cp_async_wait(n)
#define is_ldmatrix_x4(r, p) emu_ldmatrix_x4((r), (p), false)
#define is_ldmatrix_x4_trans(r, p) emu_ldmatrix_x4((r), (p), true)
#define is_mma16816(d, a, b0, b1) emu_mma16816((d), (a), (b0), (b1), IS_DTYPE)
#else
__device__ __forceinline__ unsigned is_smem_addr(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}
// 16-byte global→shared copy; nbytes == 0 zero-fills the destination without reading.
// is_cp_async16_s takes the shared address already converted (a loop can add to it).
__device__ __forceinline__ void is_cp_async16_s(unsigned dst, const void* src, int nbytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(nbytes));
}
__device__ __forceinline__ void is_cp_async16(void* dst, const void* src, int nbytes) {
  is_cp_async16_s(is_smem_addr(dst), src, nbytes);
}
__device__ __forceinline__ void is_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
#define is_cp_async_wait(n) asm volatile("cp.async.wait_group %0;\n" ::"n"(n))

__device__ __forceinline__ void is_ldmatrix_x4(unsigned* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(is_smem_addr(p)));
}
__device__ __forceinline__ void is_ldmatrix_x4_trans(unsigned* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(is_smem_addr(p)));
}
// d (16x8 f32) += a (16x16, row) * b (16x8, col), operands in IS_DTYPE.
__device__ __forceinline__ void is_mma16816(float* d, const unsigned* a, unsigned b0, unsigned b1) {
#if IS_DTYPE == 1
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}
#endif

// Two floats → one register of two IS_DTYPE values (lo = first = lower column).
__device__ __forceinline__ unsigned is_pack2(float lo, float hi) {
#if IS_DTYPE == 1
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&h);
#else
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<unsigned*>(&h);
#endif
}

// cp.async.wait_group takes an immediate: dispatch the (uniform) pending count.
__device__ __forceinline__ void is_cp_async_wait_dyn(int n) {
#ifdef NXRT_EMU
  emu_cp_async_wait(n);
#else
  switch (n) {
    case 6: is_cp_async_wait(6); break;
    case 5: is_cp_async_wait(5); break;
    case 4: is_cp_async_wait(4); break;
    case 3: is_cp_async_wait(3); break;
    case 2: is_cp_async_wait(2); break;
    case 1: is_cp_async_wait(1); break;
    default: is_cp_async_wait(0); break;  // waiting for more is always safe
  }
#endif
}

// In-kernel split-K finish of the tensor-core path (see is_finish_if_last): the same
// arithmetic, vectorised so the merging CTA pays a few memory latencies, not one per
// element: per-row split weights once (into `s_w`, shared memory for nh * (S + 1)
// floats), then float4 partial loads, 8 chunks x 2 splits in flight per thread.
// `_by`: run by kThreads threads numbered `tid` that `sync()` joins (is_last_arrival_by).
template <int kThreads, int kHD, class Sync>
__device__ __forceinline__ void is_finish_if_last_v4_by(unsigned* counters, long long task, int S,
                                                        const float* part_o, const float* part_ml,
                                                        is_t* y, long long b, int qi, int Sq,
                                                        int N, int h0, int nh, int* s_flag,
                                                        float* s_w, int tid, Sync sync) {
  // Uniform over the participants: all leave, or all merge.
  if (!is_last_arrival_by(counters, task, S, s_flag, tid, sync)) return;
  for (int r = tid; r < nh; r += kThreads) {
    const float* ml = part_ml + is_prow(b, qi, Sq, N, h0 + r, S, 0) * 2;
    float M = is_neg_inf();
#pragma unroll 4
    for (int s = 0; s < S; ++s) M = fmaxf(M, __ldcg(ml + 2 * s));
    float L = 0.f;
#pragma unroll 4
    for (int s = 0; s < S; ++s) {
      float a = 0.f;
      if (M != is_neg_inf()) {  // as is_merge_parts: all -inf gives L = 0, O = 0
        a = exp2f(__ldcg(ml + 2 * s) - M);
        L = __fmaf_rn(__ldcg(ml + 2 * s + 1), a, L);
      }
      s_w[r * (S + 1) + s] = a;
    }
    s_w[r * (S + 1) + S] = L;
  }
  sync();
  constexpr int C4 = kHD / 4;  // float4 chunks per head row
  const int total = nh * C4;
  for (int base = 0; base < total; base += 8 * kThreads) {
    float4 acc[8];
#pragma unroll
    for (int u = 0; u < 8; ++u) acc[u] = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 2
    for (int s = 0; s < S; ++s) {
      float4 o[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int c = base + u * kThreads + tid;
        o[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (c < total) {
          const int r = c / C4, d4 = c - r * C4;
          o[u] = __ldcg(reinterpret_cast<const float4*>(
                            part_o + is_prow(b, qi, Sq, N, h0 + r, S, s) * kHD) + d4);
        }
      }
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const int c = base + u * kThreads + tid;
        if (c < total) {
          const float w = s_w[(c / C4) * (S + 1) + s];
          acc[u].x = __fmaf_rn(o[u].x, w, acc[u].x);
          acc[u].y = __fmaf_rn(o[u].y, w, acc[u].y);
          acc[u].z = __fmaf_rn(o[u].z, w, acc[u].z);
          acc[u].w = __fmaf_rn(o[u].w, w, acc[u].w);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < 8; ++u) {
      const int c = base + u * kThreads + tid;
      if (c < total) {
        const int r = c / C4, d4 = c - r * C4;
        const float L = s_w[r * (S + 1) + S], inv = is_recip(L);
        // Normalise, then round each value: the same bits as is_finish_element.
        uint2 packed;
        packed.x = is_pack2(is_norm(acc[u].x, L, inv), is_norm(acc[u].y, L, inv));
        packed.y = is_pack2(is_norm(acc[u].z, L, inv), is_norm(acc[u].w, L, inv));
        *reinterpret_cast<uint2*>(y + ((b * N + h0 + r) * (long long)Sq + qi) * kHD + 4 * d4) =
            packed;
      }
    }
  }
  if (tid == 0) counters[task] = 0u;  // the next launch (stream order) starts at zero
}
template <int kThreads, int kHD>
__device__ __forceinline__ void is_finish_if_last_v4(unsigned* counters, long long task, int S,
                                                     const float* part_o, const float* part_ml,
                                                     is_t* y, long long b, int qi, int Sq, int N,
                                                     int h0, int nh, int* s_flag, float* s_w) {
  is_finish_if_last_v4_by<kThreads, kHD>(counters, task, S, part_o, part_ml, y, b, qi, Sq, N, h0,
                                         nh, s_flag, s_w, (int)threadIdx.x,
                                         [] { __syncthreads(); });
}
