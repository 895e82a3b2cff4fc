// common.cuh — generic device helpers shared by nxrt kernels (read-only for ops).
//
// Element conversions (float / __half / __nv_bfloat16), warp and quad reductions, and thin
// PTX wrappers for sm_80+ tensor-core building blocks: ldmatrix, mma.sync m16n8k16 with f32
// accumulators, and cp.async (16 bytes, zero-fill). Everything is in namespace nxrt and
// header-only; keep it generic: op-specific helpers belong in the op's own header.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace nxrt {

// NVRTC has no <math.h> constants; build infinities from bit patterns.
__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float pos_inf() { return __int_as_float(0x7f800000); }

constexpr float kLog2e = 1.4426950408889634f;

// ---- element conversions -------------------------------------------------------------
__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) {
    return __float2half_rn(x);
}
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

// Two floats packed into one 32-bit register of 16-bit elements; `lo` goes to the low half
// (the element with the smaller index, as ldmatrix/mma fragments expect).
template <typename T> __device__ __forceinline__ unsigned pack2(float lo, float hi);
template <> __device__ __forceinline__ unsigned pack2<__half>(float lo, float hi) {
    __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
}
template <> __device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float lo, float hi) {
    __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&h);
}

// Store two consecutive elements (address must be 4-byte aligned for 16-bit types).
__device__ __forceinline__ void store2(float* p, float a, float b) {
    *reinterpret_cast<float2*>(p) = make_float2(a, b);
}
__device__ __forceinline__ void store2(__half* p, float a, float b) {
    *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
}
__device__ __forceinline__ void store2(__nv_bfloat16* p, float a, float b) {
    *reinterpret_cast<__nv_bfloat162*>(p) = __floats2bfloat162_rn(a, b);
}

// ---- reductions ------------------------------------------------------------------------
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}
// Over the 4 lanes of an mma "quad" (lanes 4g..4g+3 hold one accumulator row).
__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// ---- shared memory addresses -----------------------------------------------------------
__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Bytes of dynamic shared memory this launch was given (to refuse a short launch).
__device__ __forceinline__ unsigned dynamic_smem_bytes() {
    unsigned r;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));
    return r;
}

// ---- ldmatrix (sm_75+) -----------------------------------------------------------------
// x4: lanes 8q..8q+7 give the 8 row addresses (16 bytes each) of matrix q; register q of
// lane l receives row l/4, columns 2(l%4), 2(l%4)+1 of matrix q (.trans: the transpose).
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

// ---- mma.sync m16n8k16, f32 accumulate (sm_80+) ----------------------------------------
// A: 4 regs (row-major 16x16), B: 2 regs (16x8, "col"), C/D: 4 floats, in place.
// Fragment layout (g = lane/4, t = lane%4): c0,c1 = (row g, cols 2t,2t+1), c2,c3 = row g+8.
template <typename T> struct Mma;
template <> struct Mma<__half> {
    static __device__ __forceinline__ void run(float (&c)[4], const unsigned (&a)[4],
                                               unsigned b0, unsigned b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct Mma<__nv_bfloat16> {
    static __device__ __forceinline__ void run(float (&c)[4], const unsigned (&a)[4],
                                               unsigned b0, unsigned b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                          unsigned b1) {
    Mma<T>::run(c, a, b0, b1);
}

// ---- cp.async (sm_80+) -----------------------------------------------------------------
// Copies 16 bytes global -> shared; with src_bytes < 16 the rest is zero-filled (0: all
// zeros, nothing is read, but `src` must still be a valid address to keep tools quiet).
// (cp_async_16_s: to an already converted shared address, which a loop can add to.)
__device__ __forceinline__ void cp_async_16_s(unsigned smem_addr, const void* gmem, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_addr), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, int src_bytes) {
    cp_async_16_s(smem_u32(smem), gmem, src_bytes);
}
__device__ __forceinline__ void cp_async_commit() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
// Wait until at most N of this thread's committed groups are still pending.
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
}

// ---- thread-block clusters (sm_90+; only builds that use them emit these) ---------------
// Rank `rank`'s shared address for this CTA's shared address `a`.
__device__ __forceinline__ unsigned cluster_mapa(unsigned a, unsigned rank) {
    unsigned r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(rank));
    return r;
}
// Cluster barrier halves (every non-exited thread of the cluster arrives, warp-convergent).
// A relaxed arrive orders none of the thread's earlier memory accesses; use the release
// arrive when other CTAs will write memory this thread read or wrote once the barrier
// completes (a ring handed over), or read what it wrote.
__device__ __forceinline__ void cluster_arrive_relaxed() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive_release() {
    asm volatile("barrier.cluster.arrive.release.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void cluster_wait() {
    asm volatile("barrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
// Stores into another CTA's shared memory (an address from cluster_mapa).
__device__ __forceinline__ void st_cluster_f32x4(unsigned a, float4 v) {
    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};\n"
                 :: "r"(a), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w) : "memory");
}
__device__ __forceinline__ void st_cluster_f32x2(unsigned a, float x, float y) {
    asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};\n" :: "r"(a), "f"(x), "f"(y)
                 : "memory");
}

// ---- gpu-scope arrival counter ---------------------------------------------------------
// atom.add with acquire-release semantics at gpu scope: issued by one thread after a
// __syncthreads, it publishes the CTA's earlier stores (release is cumulative over what the
// barrier ordered before it) and, followed by a __syncthreads, orders the CTA's later loads
// after every store published before the earlier arrivals (CUTLASS's GenericBarrier idiom).
__device__ __forceinline__ unsigned atomic_add_acq_rel_gpu(unsigned* p, unsigned v) {
    unsigned old;
    asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], %2;\n"
                 : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

}  // namespace nxrt
