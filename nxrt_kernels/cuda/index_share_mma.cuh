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
__device__ __forceinline__ void is_cp_async16(void* dst, const void* src, int nbytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(is_smem_addr(dst)),
               "l"(src), "r"(nbytes));
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
