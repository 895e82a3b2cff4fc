// wgmma building blocks shared by the sm_90a kernels (attention_wg.cu, paged_mla_wg.cu,
// index_share_wg.cu): the 128-byte swizzle, shared-memory matrix descriptors, fences, the
// m64n64k16 / m64n128k16 instruction forms and a flush-to-zero exp2. The including file
// defines NXRT_WG_AB ("bf16.bf16" or "f16.f16").
#pragma once
#ifndef NXRT_WG_AB
#error "define NXRT_WG_AB (the wgmma A/B element types) before including wgmma.cuh"
#endif

// Byte offset of 16-byte chunk c of row r in a [HB][rows][128 B] swizzled array whose
// 64-channel blocks are `blk` bytes apart.
__device__ __forceinline__ unsigned sw_off(int r, int c, int blk) {
    return (unsigned)((c >> 3) * blk + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// wgmma shared-memory matrix descriptor, 128-byte swizzle (layout type 1 in bits 62-63).
// K-major operands: LBO unused (16), SBO = 1024 (next 8 rows). N-major (V): LBO = bytes to
// the next 64 columns (unused by n64 instructions), SBO = 1024 (next 8 keys).
__device__ __forceinline__ unsigned long long desc_sw128(unsigned addr, unsigned lbo,
                                                         unsigned sbo) {
    return (unsigned long long)((addr & 0x3FFFFu) >> 4) |
           ((unsigned long long)((lbo >> 4) & 0x3FFFu) << 16) |
           ((unsigned long long)((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}

// The descriptor of the matrix `bytes` (a multiple of 16) past the one `d` describes. The
// start address field is bits 0-13 of the low word (address / 16) and every shared-memory
// address is below 2^18, so a 32-bit add of bytes / 16 to the low word never carries out of
// the field: one add per wgmma, where desc_sw128 of a runtime address is a mask, a shift and
// an or each time (ptxas cannot move the mask across the add).
__device__ __forceinline__ unsigned long long desc_add(unsigned long long d, unsigned bytes) {
    const unsigned lo = (unsigned)d + (bytes >> 4), hi = (unsigned)(d >> 32);
    return ((unsigned long long)hi << 32) | lo;
}

__device__ __forceinline__ void wg_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wg_wait0() {
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// Generic-proxy shared-memory writes (cp.async) made visible to wgmma's (async proxy) reads.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Pins accumulator registers here, so no use or definition of them moves across a wgmma
// issue or wait.
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// D(64x64, f32) (+)= A(64x16, smem, K-major) * B(16x64, smem, K-major); scale_d = 0 overwrites.
__device__ __forceinline__ void wg_ss(float (&d)[32], unsigned long long da,
                                      unsigned long long db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." NXRT_WG_AB " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(scale_d));
}

// D(64x64, f32) += A(64x16, registers) * B(16x64, smem): N-major B (imm-trans-b = 1, the
// default: V in P V) or K-major B (kTransB = 0: K in S = Q K^T with Q in registers).
template <int kTransB = 1>
__device__ __forceinline__ void wg_rs(float (&d)[32], const unsigned (&a)[4],
                                      unsigned long long db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." NXRT_WG_AB " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1), "n"(kTransB));
}

// D(64x128, f32) += A(64x16, registers) * B(16x128, smem, N-major: V in P V), one
// instruction where two m64n64k16 would read the A registers twice. B's descriptor: LBO =
// bytes to the next 64 columns (the next 64-channel block), SBO = 1024 (next 8 keys). The
// accumulator is the two 64-column halves d0 (columns 0-63) and d1 (64-127), each in
// m64n64k16's layout (m64n128k16's register 32 + i is register i of d1).
__device__ __forceinline__ void wg_rs128(float (&d0)[32], float (&d1)[32], const unsigned (&a)[4],
                                         unsigned long long db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." NXRT_WG_AB " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(d0[0]), "+f"(d0[1]), "+f"(d0[2]), "+f"(d0[3]), "+f"(d0[4]), "+f"(d0[5]), "+f"(d0[6]), "+f"(d0[7]),
          "+f"(d0[8]), "+f"(d0[9]), "+f"(d0[10]), "+f"(d0[11]), "+f"(d0[12]), "+f"(d0[13]), "+f"(d0[14]), "+f"(d0[15]),
          "+f"(d0[16]), "+f"(d0[17]), "+f"(d0[18]), "+f"(d0[19]), "+f"(d0[20]), "+f"(d0[21]), "+f"(d0[22]), "+f"(d0[23]),
          "+f"(d0[24]), "+f"(d0[25]), "+f"(d0[26]), "+f"(d0[27]), "+f"(d0[28]), "+f"(d0[29]), "+f"(d0[30]), "+f"(d0[31]),
          "+f"(d1[0]), "+f"(d1[1]), "+f"(d1[2]), "+f"(d1[3]), "+f"(d1[4]), "+f"(d1[5]), "+f"(d1[6]), "+f"(d1[7]),
          "+f"(d1[8]), "+f"(d1[9]), "+f"(d1[10]), "+f"(d1[11]), "+f"(d1[12]), "+f"(d1[13]), "+f"(d1[14]), "+f"(d1[15]),
          "+f"(d1[16]), "+f"(d1[17]), "+f"(d1[18]), "+f"(d1[19]), "+f"(d1[20]), "+f"(d1[21]), "+f"(d1[22]), "+f"(d1[23]),
          "+f"(d1[24]), "+f"(d1[25]), "+f"(d1[26]), "+f"(d1[27]), "+f"(d1[28]), "+f"(d1[29]), "+f"(d1[30]), "+f"(d1[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

// 2^x as one MUFU.EX2 (flush-to-zero): exp2f's non-ftz form spends a compare and two
// predicated multiplies per call on results below 2^-126. In a softmax such a P is a weight
// 2^-126 below the row's largest and contributes nothing, so it may flush to 0.
__device__ __forceinline__ float ex2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// ---- Additions for the pipelined attention schedules (attention_wg.cu NXRT_WG_SCHED >= 1).

// Wait until at most one wgmma group of this warpgroup is pending (groups retire in order).
__device__ __forceinline__ void wg_wait1() {
    asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
}

// D(64x128, f32) (+)= A(64x16, smem, K-major) * B(16x128, smem, K-major); scale_d = 0
// overwrites. Accumulator layout as m64n64k16 extended: d[4 j + e] is row g + 8 (e >> 1) of the
// warp's 16, column 8 j + 2 tq + (e & 1), j < 16.
__device__ __forceinline__ void wg_ss128(float (&d)[64], unsigned long long da,
                                         unsigned long long db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32." NXRT_WG_AB " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(scale_d));
}

// D[64 x 176] (+)= A B with A and B from shared memory (both K-major): S = Q Kᵀ against a
// 176-key tile (attention_wg.cu with NXRT_WG_BN 176). 88 accumulators per thread.
__device__ __forceinline__ void wg_ss176(float (&d)[88], unsigned long long da,
                                         unsigned long long db, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %90, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n176k16.f32." NXRT_WG_AB " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87}, %88, %89, p, 1, 1, 0, 0;\n}\n"
        :
          "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
          "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
          "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
          "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
        : "l"(da), "l"(db), "r"(scale_d));
}

// ---- Additions for the warp-specialised schedules (attention_wg.cu NXRT_WG_SCHED >= 4):
// mbarriers (shared::cta, 8-byte aligned), cp.async completion on an mbarrier, named
// barriers, and the warpgroup register reallocation.

// Initialise an mbarrier expecting `count` arrivals per phase (one thread, before a
// __syncthreads that publishes it).
__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// One arrival (release, CTA scope).
__device__ __forceinline__ void mbar_arrive(unsigned bar) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(bar)
                 : "memory");
}
// Block until the phase of parity `parity` has completed (acquire, CTA scope): the phase
// count starts at 0, so waiting parity 0 on a fresh barrier waits for its first completion.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity) {
    asm volatile(
        "{\n.reg .pred p;\n"
        "WAIT_%=:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
        "@!p bra WAIT_%=;\n}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}
// Arrive on `bar` once every cp.async this thread issued so far has landed; .noinc: the
// arrival counts against the count given at init (one per producer thread).
__device__ __forceinline__ void cp_async_mbar_arrive(unsigned bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// Named barrier `id` (not 0: __syncthreads uses it) over `n` threads (a multiple of 32).
__device__ __forceinline__ void named_bar_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int n) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
}
// Warpgroup register reallocation (every warp of the warpgroup executes the same one; N a
// multiple of 8 in [24, 256]).
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

// ---- m64n256k16 P V (paged_mla_pair.cu: each warpgroup owns 256 value columns).
// The 128 accumulator operands of an m64n256k16 as d[4][32] (d[q] = columns 64 q .. 64 q + 63).
#define NXRT_WG_D256(d) \
    "+f"((d)[0][0]), "+f"((d)[0][1]), "+f"((d)[0][2]), "+f"((d)[0][3]), "+f"((d)[0][4]), "+f"((d)[0][5]), "+f"((d)[0][6]), "+f"((d)[0][7]), \
    "+f"((d)[0][8]), "+f"((d)[0][9]), "+f"((d)[0][10]), "+f"((d)[0][11]), "+f"((d)[0][12]), "+f"((d)[0][13]), "+f"((d)[0][14]), "+f"((d)[0][15]), \
    "+f"((d)[0][16]), "+f"((d)[0][17]), "+f"((d)[0][18]), "+f"((d)[0][19]), "+f"((d)[0][20]), "+f"((d)[0][21]), "+f"((d)[0][22]), "+f"((d)[0][23]), \
    "+f"((d)[0][24]), "+f"((d)[0][25]), "+f"((d)[0][26]), "+f"((d)[0][27]), "+f"((d)[0][28]), "+f"((d)[0][29]), "+f"((d)[0][30]), "+f"((d)[0][31]), \
    "+f"((d)[1][0]), "+f"((d)[1][1]), "+f"((d)[1][2]), "+f"((d)[1][3]), "+f"((d)[1][4]), "+f"((d)[1][5]), "+f"((d)[1][6]), "+f"((d)[1][7]), \
    "+f"((d)[1][8]), "+f"((d)[1][9]), "+f"((d)[1][10]), "+f"((d)[1][11]), "+f"((d)[1][12]), "+f"((d)[1][13]), "+f"((d)[1][14]), "+f"((d)[1][15]), \
    "+f"((d)[1][16]), "+f"((d)[1][17]), "+f"((d)[1][18]), "+f"((d)[1][19]), "+f"((d)[1][20]), "+f"((d)[1][21]), "+f"((d)[1][22]), "+f"((d)[1][23]), \
    "+f"((d)[1][24]), "+f"((d)[1][25]), "+f"((d)[1][26]), "+f"((d)[1][27]), "+f"((d)[1][28]), "+f"((d)[1][29]), "+f"((d)[1][30]), "+f"((d)[1][31]), \
    "+f"((d)[2][0]), "+f"((d)[2][1]), "+f"((d)[2][2]), "+f"((d)[2][3]), "+f"((d)[2][4]), "+f"((d)[2][5]), "+f"((d)[2][6]), "+f"((d)[2][7]), \
    "+f"((d)[2][8]), "+f"((d)[2][9]), "+f"((d)[2][10]), "+f"((d)[2][11]), "+f"((d)[2][12]), "+f"((d)[2][13]), "+f"((d)[2][14]), "+f"((d)[2][15]), \
    "+f"((d)[2][16]), "+f"((d)[2][17]), "+f"((d)[2][18]), "+f"((d)[2][19]), "+f"((d)[2][20]), "+f"((d)[2][21]), "+f"((d)[2][22]), "+f"((d)[2][23]), \
    "+f"((d)[2][24]), "+f"((d)[2][25]), "+f"((d)[2][26]), "+f"((d)[2][27]), "+f"((d)[2][28]), "+f"((d)[2][29]), "+f"((d)[2][30]), "+f"((d)[2][31]), \
    "+f"((d)[3][0]), "+f"((d)[3][1]), "+f"((d)[3][2]), "+f"((d)[3][3]), "+f"((d)[3][4]), "+f"((d)[3][5]), "+f"((d)[3][6]), "+f"((d)[3][7]), \
    "+f"((d)[3][8]), "+f"((d)[3][9]), "+f"((d)[3][10]), "+f"((d)[3][11]), "+f"((d)[3][12]), "+f"((d)[3][13]), "+f"((d)[3][14]), "+f"((d)[3][15]), \
    "+f"((d)[3][16]), "+f"((d)[3][17]), "+f"((d)[3][18]), "+f"((d)[3][19]), "+f"((d)[3][20]), "+f"((d)[3][21]), "+f"((d)[3][22]), "+f"((d)[3][23]), \
    "+f"((d)[3][24]), "+f"((d)[3][25]), "+f"((d)[3][26]), "+f"((d)[3][27]), "+f"((d)[3][28]), "+f"((d)[3][29]), "+f"((d)[3][30]), "+f"((d)[3][31])

// D(64x256, f32) += A(64x16, registers) * B(16x256, smem, N-major: V in P V), one
// instruction where four m64n64k16 would read the A registers four times. B's descriptor:
// LBO = bytes to the next 64 columns (the next 64-channel block), SBO = 1024 (next 8 keys).
// d[q] is columns 64 q .. 64 q + 63 in m64n64k16's layout (m64n256k16's register 32 q + i).
__device__ __forceinline__ void wg_rs256(float (&d)[4][32], const unsigned (&a)[4],
                                         unsigned long long db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32." NXRT_WG_AB " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
        : NXRT_WG_D256(d)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(1));
}

// D(64x256, f32) += A(64x16, smem, K-major) * B(16x256, smem, N-major): P V with P from
// shared memory (written by the other warpgroup); A is read once for all 256 columns.
__device__ __forceinline__ void wg_ss256(float (&d)[4][32], unsigned long long da,
                                         unsigned long long db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32." NXRT_WG_AB " "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 1;\n}\n"
        : NXRT_WG_D256(d)
        : "l"(da), "l"(db), "r"(1));
}
