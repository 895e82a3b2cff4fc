// attention_gemm.cu — the two batched products of the unfused attention path, any head dim:
//   attn_qk  S[z] = scale * Q[b,h] K[b,kvh]ᵀ   -> f32 scores, [B*H, Sq, Sk] (row pitch Sk)
//   attn_pv  O[b,h] = P[z] V[b,kvh]            -> O's dtype, O's strides
// with z = b*H + h and kvh = h / (H / Hkv) (GQA without expanding K/V).
//
// One 64x64 output tile per CTA, K-dimension in steps of BK. Operands are read with plain
// (bounds-checked, zero-filled) loads and converted to the compute type in shared memory, so
// any strides and any D work. f16/bf16 multiply on tensor cores (mma.sync m16n8k16, f32
// accumulate; P is rounded to the input type like the fused path does); f32 runs fp32 FMA
// on CUDA cores (4x4 outputs per thread) so it stays exact to fp32.
//
// Compile-time: NXRT_T (float | __half | __nv_bfloat16) and NXRT_F32=1 with float.
#include "common.cuh"

#ifndef NXRT_T
#define NXRT_T float
#define NXRT_F32 1
#endif

typedef NXRT_T T;
using namespace nxrt;

constexpr int TM = 64, TN = 64;

// C[m, n] = alpha * sum_k A(m, k) B(k, n) for one 64x64 tile. A(m,k) = A[m*a_m + k*a_k],
// B(k,n) = B[k*b_k + n*b_n], C(m,n) = C[m*c_m + n]. b_k == 1 selects the loader that reads
// B along k (K rows in Q Kᵀ); otherwise B is read along n (V rows in P V).
template <typename TA, typename TC>
struct Tile {
    const TA* A; long long a_m, a_k;
    const T* Bm; long long b_k, b_n;
    TC* C; long long c_m;
    int M, N, K;
    float alpha;
};

#if defined(NXRT_F32)
static_assert(sizeof(T) == 4, "NXRT_F32 goes with NXRT_T=float");
// ---------------------------------------------------------------- f32: CUDA cores
constexpr int BK = 16;
constexpr int NTH = 256;
constexpr int SP = BK + 1;  // odd pitch: 16 threads reading 16 different rows hit 16 banks

template <typename TA, typename TC>
__device__ __forceinline__ void run_tile(const Tile<TA, TC>& p, int m0, int n0) {
    __shared__ float As[TM * SP];
    __shared__ float Bs[TN * SP];
    const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < p.K; k0 += BK) {
        for (int id = tid; id < TM * BK; id += NTH) {
            const int mm = id / BK, kk = id - mm * BK;
            const int m = m0 + mm, kq = k0 + kk;
            As[mm * SP + kk] = (m < p.M && kq < p.K) ? to_float(p.A[m * p.a_m + kq * p.a_k]) : 0.f;
        }
        if (p.b_k == 1) {
            for (int id = tid; id < TN * BK; id += NTH) {
                const int nn = id / BK, kk = id - nn * BK;
                const int n = n0 + nn, kq = k0 + kk;
                Bs[nn * SP + kk] = (n < p.N && kq < p.K) ? to_float(p.Bm[kq + n * p.b_n]) : 0.f;
            }
        } else {
            for (int id = tid; id < TN * BK; id += NTH) {
                const int kk = id / TN, nn = id - kk * TN;
                const int n = n0 + nn, kq = k0 + kk;
                Bs[nn * SP + kk] =
                    (n < p.N && kq < p.K) ? to_float(p.Bm[kq * p.b_k + n * p.b_n]) : 0.f;
            }
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float a[4], b[4];
#pragma unroll
            for (int x = 0; x < 4; ++x) {
                a[x] = As[(ty + 16 * x) * SP + kk];
                b[x] = Bs[(tx + 16 * x) * SP + kk];
            }
#pragma unroll
            for (int x = 0; x < 4; ++x)
#pragma unroll
                for (int y = 0; y < 4; ++y) acc[x][y] = fmaf(a[x], b[y], acc[x][y]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int x = 0; x < 4; ++x) {
        const int m = m0 + ty + 16 * x;
        if (m >= p.M) continue;
#pragma unroll
        for (int y = 0; y < 4; ++y) {
            const int n = n0 + tx + 16 * y;
            if (n < p.N) p.C[m * p.c_m + n] = from_float<TC>(p.alpha * acc[x][y]);
        }
    }
}
#else
// ---------------------------------------------------------------- f16/bf16: tensor cores
static_assert(sizeof(T) == 2, "tensor-core tiles take __half or __nv_bfloat16");
constexpr int BK = 32;
constexpr int NTH = 128;
constexpr int SP = BK + 8;  // 80-byte rows: the 8 rows of a fragment load hit distinct banks

template <typename TA, typename TC>
__device__ __forceinline__ void run_tile(const Tile<TA, TC>& p, int m0, int n0) {
    __shared__ __align__(16) T As[TM * SP];
    __shared__ __align__(16) T Bs[TN * SP];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    float acc[TN / 8][4];
#pragma unroll
    for (int n = 0; n < TN / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
    for (int k0 = 0; k0 < p.K; k0 += BK) {
        for (int id = tid; id < TM * BK; id += NTH) {
            const int mm = id / BK, kk = id - mm * BK;
            const int m = m0 + mm, kq = k0 + kk;
            As[mm * SP + kk] = from_float<T>(
                (m < p.M && kq < p.K) ? to_float(p.A[m * p.a_m + kq * p.a_k]) : 0.f);
        }
        if (p.b_k == 1) {
            for (int id = tid; id < TN * BK; id += NTH) {
                const int nn = id / BK, kk = id - nn * BK;
                const int n = n0 + nn, kq = k0 + kk;
                Bs[nn * SP + kk] = (n < p.N && kq < p.K) ? p.Bm[kq + n * p.b_n] : from_float<T>(0.f);
            }
        } else {
            for (int id = tid; id < TN * BK; id += NTH) {
                const int kk = id / TN, nn = id - kk * TN;
                const int n = n0 + nn, kq = k0 + kk;
                Bs[nn * SP + kk] =
                    (n < p.N && kq < p.K) ? p.Bm[kq * p.b_k + n * p.b_n] : from_float<T>(0.f);
            }
        }
        __syncthreads();
#pragma unroll
        for (int ks = 0; ks < BK / 16; ++ks) {
            // Fragments by 32-bit shared loads (layouts as in common.cuh's mma comment).
            const T* ar = As + (warp * 16 + g) * SP + ks * 16 + 2 * t4;
            unsigned a[4];
            a[0] = *reinterpret_cast<const unsigned*>(ar);
            a[1] = *reinterpret_cast<const unsigned*>(ar + 8 * SP);
            a[2] = *reinterpret_cast<const unsigned*>(ar + 8);
            a[3] = *reinterpret_cast<const unsigned*>(ar + 8 * SP + 8);
#pragma unroll
            for (int n = 0; n < TN / 8; ++n) {
                const T* br = Bs + (n * 8 + g) * SP + ks * 16 + 2 * t4;
                mma_16816<T>(acc[n], a, *reinterpret_cast<const unsigned*>(br),
                             *reinterpret_cast<const unsigned*>(br + 8));
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int n = 0; n < TN / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int m = m0 + warp * 16 + g + 8 * (e >> 1);
            const int nc = n0 + n * 8 + 2 * t4 + (e & 1);
            if (m < p.M && nc < p.N) p.C[m * p.c_m + nc] = from_float<TC>(p.alpha * acc[n][e]);
        }
    }
}
#endif

// grid = (ceil(Sk/64), ceil(Sq/64), B*H)
extern "C" __global__ void __launch_bounds__(NTH)
attn_qk(const T* __restrict__ q, const T* __restrict__ k, float* __restrict__ S, int H,
        int Hkv, int Sq, int Sk, int D, long long q_sb, long long q_sh, long long q_ss,
        long long k_sb, long long k_sh, long long k_ss, float scale) {
    const int z = blockIdx.z, b = z / H, h = z - b * H, kvh = h / (H / Hkv);
    Tile<T, float> p;
    p.A = q + b * q_sb + h * q_sh; p.a_m = q_ss; p.a_k = 1;
    p.Bm = k + b * k_sb + kvh * k_sh; p.b_k = 1; p.b_n = k_ss;
    p.C = S + (long long)z * Sq * Sk; p.c_m = Sk;
    p.M = Sq; p.N = Sk; p.K = D; p.alpha = scale;
    run_tile(p, blockIdx.y * TM, blockIdx.x * TN);
}

// grid = (ceil(D/64), ceil(Sq/64), B*H)
extern "C" __global__ void __launch_bounds__(NTH)
attn_pv(const float* __restrict__ P, const T* __restrict__ v, T* __restrict__ out, int H,
        int Hkv, int Sq, int Sk, int D, long long v_sb, long long v_sh, long long v_ss,
        long long o_sb, long long o_sh, long long o_ss) {
    const int z = blockIdx.z, b = z / H, h = z - b * H, kvh = h / (H / Hkv);
    Tile<float, T> p;
    p.A = P + (long long)z * Sq * Sk; p.a_m = Sk; p.a_k = 1;
    p.Bm = v + b * v_sb + kvh * v_sh; p.b_k = v_ss; p.b_n = 1;
    p.C = out + b * o_sb + h * o_sh; p.c_m = o_ss;
    p.M = Sq; p.N = D; p.K = Sk; p.alpha = 1.f;
    run_tile(p, blockIdx.y * TM, blockIdx.x * TN);
}
