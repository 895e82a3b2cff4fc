// attention_rows.cu — per-row kernels of the attention op:
//   attn_softmax  the unfused path's masked softmax over the f32 score rows, in place
//   attn_combine  merges split-KV partials (f32 O, running max, row sum) into the output
//
// Compile-time: NXRT_T (float | __half | __nv_bfloat16), the output / mask element type.
#include "attention_util.cuh"

#ifndef NXRT_T
#define NXRT_T float
#endif

typedef NXRT_T T;
using namespace nxrt;

constexpr int SOFTMAX_THREADS = 256;

// Block-wide reduction through shared memory (`red` holds one float per warp).
template <bool MAX>
__device__ __forceinline__ float block_reduce(float x, float* red) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    x = MAX ? warp_max(x) : warp_sum(x);
    if (lane == 0) red[warp] = x;
    __syncthreads();
    float y = lane < SOFTMAX_THREADS / 32 ? red[lane] : (MAX ? neg_inf() : 0.f);
    y = MAX ? warp_max(y) : warp_sum(y);
    __syncthreads();  // `red` is reused by the next reduction
    return y;
}

// One block per score row (b, h, i) of S = scale * Q Kᵀ, f32 [B*H*Sq, Sk] (row pitch Sk).
// Applies softcap, the additive mask and causal/window visibility, then writes the
// probabilities back in place; a row with no visible key becomes all zeros.
// Each thread touches the same columns in every pass, so in-place updates need no barrier.
extern "C" __global__ void __launch_bounds__(SOFTMAX_THREADS)
attn_softmax(float* __restrict__ S, const T* __restrict__ mask, int B, int H, int Sq, int Sk,
             int mask_planes, int causal, int window, float softcap) {
    __shared__ float red[SOFTMAX_THREADS / 32];
    const long long row = blockIdx.x;
    const int i = (int)(row % Sq);
    const long long bh = row / Sq;
    const int b = (int)(bh / H);
    const int p = Sk - Sq + i;
    float* s = S + row * Sk;
    const T* mrow = nullptr;
    if (mask_planes > 0) {
        long long plane = 0;
        if (mask_planes == B * H) plane = bh;
        else if (mask_planes == B) plane = b;
        mrow = mask + (plane * Sq + i) * (long long)Sk;
    }

    float mx = neg_inf();
    for (int j = threadIdx.x; j < Sk; j += SOFTMAX_THREADS) {
        float x = s[j];
        if (softcap > 0.f) x = softcap * tanhf(x / softcap);
        if (mrow) x += to_float(mrow[j]);
        if (!nxrt_attn::visible(j, p, Sk, causal, window)) x = neg_inf();
        s[j] = x;
        mx = fmaxf(mx, x);
    }
    mx = block_reduce<true>(mx, red);
    const float m_use = mx == neg_inf() ? 0.f : mx;

    float sum = 0.f;
    for (int j = threadIdx.x; j < Sk; j += SOFTMAX_THREADS) {
        const float e = expf(s[j] - m_use);  // -inf gives 0
        s[j] = e;
        sum += e;
    }
    sum = block_reduce<false>(sum, red);
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    for (int j = threadIdx.x; j < Sk; j += SOFTMAX_THREADS) s[j] *= inv;
}

// One warp per output row (b, h, i): O = sum_s 2^(m_s - M) o_s / sum_s 2^(m_s - M) l_s with
// M = max_s m_s (log2 units). Splits that saw no visible key have m_s = -inf and are skipped;
// a row with none at all becomes zeros.
extern "C" __global__ void __launch_bounds__(128)
attn_combine(const float* __restrict__ ws_o, const float* __restrict__ ws_ml,
             T* __restrict__ out, int B, int H, int Sq, int D, int splits, long long o_sb,
             long long o_sh, long long o_ss) {
    const long long n_rows = (long long)B * H * Sq;
    const long long row = (long long)blockIdx.x * 4 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= n_rows) return;
    float M = neg_inf();
    for (int s = 0; s < splits; ++s) M = fmaxf(M, ws_ml[2 * (s * n_rows + row)]);
    float L = 0.f;
    for (int s = 0; s < splits; ++s) {
        const float m = ws_ml[2 * (s * n_rows + row)];
        if (m != neg_inf()) L += exp2f(m - M) * ws_ml[2 * (s * n_rows + row) + 1];
    }
    const float inv = L > 0.f ? 1.f / L : 0.f;
    const int i = (int)(row % Sq);
    const long long bh = row / Sq;
    const int b = (int)(bh / H), h = (int)(bh % H);
    T* orow = out + b * o_sb + h * o_sh + i * o_ss;
    for (int c = lane; c < D; c += 32) {
        float acc = 0.f;
        for (int s = 0; s < splits; ++s) {
            const float m = ws_ml[2 * (s * n_rows + row)];
            if (m != neg_inf()) acc += exp2f(m - M) * ws_o[(s * n_rows + row) * D + c];
        }
        orow[c] = from_float<T>(acc * inv);
    }
}
