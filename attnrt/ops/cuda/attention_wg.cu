// attention_wg.cu — fused attention forward with Hopper warpgroup MMA (wgmma): sm_90a only.
//
// Same contract, parameters, row packing and split-KV partials as attention_fused_tc.cu (see
// attention_util.cuh). Work item (x, y) is what that kernel's CTA (blockIdx.x, blockIdx.y)
// does: x = (b*Hkv + kvh) * row_tiles + reversed row tile, y = split; BM = 128 packed query
// rows against BN-key tiles (BN = 128, or NXRT_WG_BN).
//
// FA3's warp-specialised, persistent schedule (details at the block before the kernel):
// 384 threads = a cp.async producer warpgroup filling mbarrier-guarded two-slot K/V rings and
// two consumer warpgroups of 64 query rows each (the wgmma M) whose GEMMs ping-pong against
// each other's softmax. Launch min(work items, SMs) CTAs (gridDim.y 1); CTA c takes items
// c, c + gridDim.x, ... Shared memory holds Q (128 x D) and the rings (BN x D per slot), all
// in the wgmma "128-byte swizzle" layout of paged_mla_wg.cu: 64-channel blocks of
// [rows][128 bytes], 16-byte chunk c of row r stored at chunk c ^ (r & 7), blocks 1024-byte
// aligned. Per tile and consumer warpgroup:
//   S = Q Kᵀ   wgmma m64nBNk16, A = Q and B = K from shared memory (both K-major);
//   softmax    in registers (a quad holds a row's BN keys), exp2 with scale·log2e folded;
//              tiles that need it (causal diagonal, window edge, past Sk, softcap, mask) take
//              the per-element logit transform;
//   O += P V   wgmma with A = P from registers (the S accumulator layout re-packed to
//              f16/bf16), B = V from shared memory N-major ("transposed", imm-trans-b = 1:
//              keys are the rows of the stored tile); S(t+1) is issued before P(t) V(t), so
//              softmax(t+1) runs while the tensor cores still do P(t) V(t).
// Defines: NXRT_BF16 (0/1), HEAD_DIM (64 or 128: the runtime D must equal it), NXRT_WG_BN
// (keys per tile: 128 by default, or 176), MIN_BLOCKS (ignored: one CTA per SM), and
// NXRT_WG_SCHED, the order in which a CTA takes its work items:
//   6  item i = (i % n_x, i / n_x) of the (n_x = B*Hkv*row_tiles, splits) grid, so the CTAs
//      of a round share the K/V rows of few heads in L2.
//   7  items dealt longest first in snake order (for causal masking).
// Only these two schedules ship; schedules 0-5 (no warp specialisation, three-slot rings,
// one CTA per item) and the NXRT_WG_PREG / NXRT_WG_CREG register overrides are in git
// history: see lab/attention_wg_schedules.md.
// Shared memory: HEAD_DIM/64 * (128*128 + 4*BN*128) + 256 bytes of mbarriers + 1024 bytes
// (attention/builds.py's build_smem_bytes).
#include "attention_util.cuh"

#ifndef NXRT_BF16
#define NXRT_BF16 1
#endif
#ifndef HEAD_DIM
#define HEAD_DIM 128
#endif
#if !defined(NXRT_WG_SCHED) || (NXRT_WG_SCHED != 6 && NXRT_WG_SCHED != 7)
#error "NXRT_WG_SCHED must be 6 or 7 (the others: lab/attention_wg_schedules.md)"
#endif

#if NXRT_BF16
typedef __nv_bfloat16 T;
#define NXRT_WG_AB "bf16.bf16"
#else
typedef __half T;
#define NXRT_WG_AB "f16.f16"
#endif

using namespace nxrt;
using namespace nxrt_attn;

// NVRTC emits each namespace-scope constexpr below as a global of the module: adding,
// removing or reordering one changes the shipped CUBINs (tools/cubin_hashes.py).

namespace {

constexpr int DP = HEAD_DIM;
constexpr int BM = 128;          // packed query rows per CTA
// Keys per tile: 128, or NXRT_WG_BN.
#ifdef NXRT_WG_BN
constexpr int BN = NXRT_WG_BN;
static_assert(NXRT_WG_BN == 128 || NXRT_WG_BN == 176, "NXRT_WG_BN: 128 or 176");
#else
constexpr int BN = 128;
#endif
// A producer warpgroup and two consumer warpgroups (see the block before the kernel).
constexpr int NT = 384;
constexpr int HB = DP / 64;      // 64-channel blocks per row
constexpr int CH = DP / 8;       // 16-byte chunks per row
constexpr int QBLK = BM * 128;   // one 64-channel block of Q
constexpr int TBLK = BN * 128;   // one 64-channel block of a K or V tile
constexpr int Q_BYTES = HB * QBLK;
constexpr int T_BYTES = HB * TBLK;
constexpr int OFF_KV = Q_BYTES;  // the K and V rings follow Q
constexpr int SMEM_USED = Q_BYTES + 4 * T_BYTES;  // Q, two ring slots each of K and V
// The mbarriers, in 256 bytes after the tiles.
constexpr int BAR_BYTES = 256;
constexpr int SMEM_BYTES = SMEM_USED + BAR_BYTES + 1024;  // + slack to align the base to 1 KiB
static_assert(SMEM_BYTES <= 232448, "more than the 227 KiB of opt-in shared memory per block");

static_assert(DP == 64 || DP == 128, "HEAD_DIM must be 64 or 128");
static_assert(QBLK % 1024 == 0 && TBLK % 1024 == 0 && OFF_KV % 1024 == 0,
              "swizzle atoms must be 1024-byte aligned");

#include "wgmma.cuh"

}  // namespace

// Epilogue (per thread, no shared memory): with one split the normalised output rows (a row
// that saw no visible key has l = 0 and o = 0: zeros), else this split's unnormalised partial
// O and its (m, l) for attn_combine.
__device__ __forceinline__ void store_rows(float (&o)[HB][32], const float (&l_run)[2],
                                           const float (&m_run)[2], const Row (&rows)[2],
                                           int split, int splits, T* __restrict__ out,
                                           float* __restrict__ ws_o, float* __restrict__ ws_ml,
                                           long long n_rows, int D, int tq) {
    float l_row[2];
#pragma unroll
    for (int x = 0; x < 2; ++x) l_row[x] = quad_sum(l_run[x]);
    if (splits == 1) {
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            if (!rows[x].valid) continue;
            const float inv = l_row[x] > 0.f ? 1.f / l_row[x] : 0.f;
            T* orow = out + rows[x].o_off + 2 * tq;
#pragma unroll
            for (int qb = 0; qb < HB; ++qb)
#pragma unroll
                for (int j = 0; j < 8; ++j)
                    store2(orow + 64 * qb + 8 * j, o[qb][4 * j + 2 * x] * inv,
                           o[qb][4 * j + 2 * x + 1] * inv);
        }
    } else {
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            if (!rows[x].valid) continue;
            const long long pr = (long long)split * n_rows + rows[x].orow;
            float* po = ws_o + pr * D + 2 * tq;
#pragma unroll
            for (int qb = 0; qb < HB; ++qb)
#pragma unroll
                for (int j = 0; j < 8; ++j)
                    store2(po + 64 * qb + 8 * j, o[qb][4 * j + 2 * x], o[qb][4 * j + 2 * x + 1]);
            if (tq == 0) {
                ws_ml[2 * pr] = m_run[x];
                ws_ml[2 * pr + 1] = l_row[x];
            }
        }
    }
}

namespace {

constexpr int NS = BN / 2;                    // S accumulators per thread (a quad: BN keys)
constexpr int NST = 2;                        // K/V ring slots
constexpr int OFF_K = Q_BYTES;                  // K ring slot i at OFF_K + i T_BYTES
constexpr int OFF_V = Q_BYTES + NST * T_BYTES;  // V ring slot i at OFF_V + i T_BYTES
static_assert(SMEM_USED == OFF_V + NST * T_BYTES, "the rings fill the layout of SMEM_BYTES");

// S = Q Kᵀ for this warpgroup's 64 rows against the BN keys at sK (both K-major, swizzled);
// issued only (the caller commits and waits). K = D in 16-channel steps: 4 per 128-byte row.
__device__ __forceinline__ void issue_s(float (&s)[NS], unsigned qa, unsigned sK) {
#pragma unroll
    for (int ks = 0; ks < DP / 16; ++ks) {
        const unsigned qoff = (ks >> 2) * QBLK + (ks & 3) * 32;
        const unsigned koff = (ks >> 2) * TBLK + (ks & 3) * 32;
#if defined(NXRT_WG_BN) && NXRT_WG_BN == 176
        wg_ss176(s, desc_sw128(qa + qoff, 16, 1024), desc_sw128(sK + koff, 16, 1024),
                 ks > 0 ? 1 : 0);
#else
        wg_ss128(s, desc_sw128(qa + qoff, 16, 1024), desc_sw128(sK + koff, 16, 1024),
                 ks > 0 ? 1 : 0);
#endif
    }
}

// O += P V: P from registers (k-step kk = keys 16 kk .. +15), V at sV N-major; issued only.
// D 128: one m64n128k16 per k-step (the A registers read once, not once per 64 channels).
__device__ __forceinline__ void issue_pv(float (&o)[HB][32], const unsigned (&pa)[BN / 16][4],
                                         unsigned sV) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
#if HEAD_DIM == 128
        wg_rs128(o[0], o[1], pa[kk], desc_sw128(sV + kk * (16 * 128), TBLK, 1024));
#else
        wg_rs(o[0], pa[kk], desc_sw128(sV + kk * (16 * 128), TBLK, 1024));
#endif
    }
}

// Rows x = 0 (g) / 1 (g + 8) of O scaled by alpha[x]; skipped when no row of the warp has a
// new maximum (alpha 1: x * 1 is exact), which is most tiles once the maxima settle.
__device__ __forceinline__ void rescale_o(float (&o)[HB][32], const float (&alpha)[2]) {
    if (!__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) return;
#pragma unroll
    for (int qb = 0; qb < HB; ++qb)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            o[qb][4 * j + 0] *= alpha[0];
            o[qb][4 * j + 1] *= alpha[0];
            o[qb][4 * j + 2] *= alpha[1];
            o[qb][4 * j + 3] *= alpha[1];
        }
}

// fast_tanh (attention_util.cuh) with an approximate divide: an IEEE divide has a slow-path
// subroutine call, and registers live across it spill (at D64 with 2 CTAs per SM). 2/(1+e)
// with e = inf gives 0 (tanh 1), e = 0 gives 2 (tanh -1); error ~2 ulp of the quotient.
__device__ __forceinline__ float tanh_approx(float x) {
    return 1.f - __fdividef(2.f, 1.f + exp2f(x * (2.f * kLog2e)));
}

// Online softmax of one tile in place: s (raw scores of keys kb..kb+BN-1; s[4 j + e] is key
// kb + 8 j + 2 tq + (e & 1) of row x = e >> 1) becomes P = 2^(logit - m) in f32; m_run and
// l_run (this thread's share of the row sums) advance; alpha gets the factor the caller must
// apply to O before the next O += P V.
__device__ __forceinline__ void softmax_tile(float (&s)[NS], const Work& w, const Row (&rows)[2],
                                             int kb, int tq, int Sq, int Sk, int causal,
                                             int window, bool general, float softcap,
                                             float inv_softcap, float scale, float scale_log2,
                                             const T* __restrict__ mask, float (&m_run)[2],
                                             float (&l_run)[2], float (&alpha)[2]) {
    const bool check = !tile_fully_visible(w, BM, kb, BN, Sq, Sk, causal, window);
    // Fast tiles keep the raw scores: the maxima are taken raw and scaled once (scale > 0 and
    // rounding is monotonic, so max(s) * c == max(s * c) exactly), and the scale folds into
    // the exponent's FFMA below.
    const bool raw = !general && !check;
    float tmax[2] = {neg_inf(), neg_inf()};
    if (raw) {
#pragma unroll
        for (int i = 0; i < NS; ++i) tmax[(i >> 1) & 1] = fmaxf(tmax[(i >> 1) & 1], s[i]);
        tmax[0] *= scale_log2;
        tmax[1] *= scale_log2;
    } else {
        // Tile column c (key kb + c) is visible to row x iff lo[x] <= c < hi[x] (visible():
        // key < Sk, key <= p if causal, p - key <= window if windowed).
        const int sk_rel = Sk - kb;
        int lo[2], hi[2];
#pragma unroll
        for (int x = 0; x < 2; ++x) {
            hi[x] = causal ? min(sk_rel, rows[x].p + 1 - kb) : sk_rel;
            lo[x] = window >= 0 ? rows[x].p - window - kb : -(1 << 30);
        }
        if (general) {
            // This thread's first mask element of each row in this tile, laundered through
            // an empty asm so the compiler cannot hoist NS per-element addresses out of the
            // key loop (that costs ~NS registers: spills at D64 with 2 CTAs per SM).
            const T* mrow[2];
#pragma unroll
            for (int x = 0; x < 2; ++x) {
                mrow[x] = mask + (rows[x].m_off >= 0 ? rows[x].m_off + kb + 2 * tq : 0);
                asm volatile("" : "+l"(mrow[x]));
            }
            const int c_lim = sk_rel - 2 * tq;  // column offset o = 8 jj + (e & 1) < c_lim
#pragma unroll
            for (int jj = 0; jj < NS / 4; ++jj) {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int i = 4 * jj + e;
                    const int x = e >> 1;
                    const int oc = 8 * jj + (e & 1);
                    float y = s[i] * scale;
                    if (softcap > 0.f) y = softcap * tanh_approx(y * inv_softcap);
                    if (rows[x].m_off >= 0 && oc < c_lim) y += to_float(mrow[x][oc]);
                    s[i] = y * kLog2e;
                }
                // At most 4 mask loads in flight (hoisting all NS costs NS registers).
                asm volatile("" ::: "memory");
            }
        } else {
#pragma unroll
            for (int i = 0; i < NS; ++i) s[i] *= scale_log2;
        }
#pragma unroll
        for (int i = 0; i < NS; ++i) {
            const int x = (i >> 1) & 1;
            const int c = 8 * (i >> 2) + 2 * tq + (i & 1);
            if (c < lo[x] || c >= hi[x]) s[i] = neg_inf();
            tmax[x] = fmaxf(tmax[x], s[i]);
        }
    }
    float m_use[2];
#pragma unroll
    for (int x = 0; x < 2; ++x) {
        tmax[x] = quad_max(tmax[x]);
        alpha[x] = online_rescale(m_run[x], tmax[x], m_use[x]);
        l_run[x] *= alpha[x];
    }
    // One FFMA per element either way: raw tiles scale here, the others were scaled above
    // (times 1 is exact); a masked -inf gives 0.
    const float k = raw ? scale_log2 : 1.f;
#pragma unroll
    for (int i = 0; i < NS; ++i) {
        const int x = (i >> 1) & 1;
        const float p = ex2_ftz(fmaf(s[i], k, -m_use[x]));
        l_run[x] += p;
        s[i] = p;
    }
}

// P (f32, accumulator layout) -> the A operand of P V: k-step kk covers keys 16 kk .. +15;
// register 0/2: row g (keys lo/hi 8), 1/3: row g + 8.
__device__ __forceinline__ void pack_p(unsigned (&pa)[BN / 16][4], const float (&s)[NS]) {
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
        pa[j >> 1][2 * (j & 1) + 0] = pack2<T>(s[4 * j + 0], s[4 * j + 1]);
        pa[j >> 1][2 * (j & 1) + 1] = pack2<T>(s[4 * j + 2], s[4 * j + 3]);
    }
}

}  // namespace

// ---- FA3 warp specialisation. 384 threads = three warpgroups:
//   WG0, the producer (setmaxnreg.dec to PREG registers): Q once, then K and V tiles into
//       NST-slot rings with cp.async; each thread's copies of a tile arrive (on landing) on
//       the tile's "full" mbarrier (cp.async.mbarrier.arrive.noinc, count 128). Before it
//       refills a slot it waits on the slot's "empty" mbarrier.
//   WG1, WG2, the consumers (setmaxnreg.inc to CREG registers), 64 query rows each (tile
//       rows 64 (wg - 1) ..), each running its own loop: S(t+1) and P(t) V(t) issued back
//       to back, softmax(t+1) under P(t) V(t). A warp releases a K slot (one arrival of
//       8 on "empty") once its S retired, a V slot once its P V retired.
//   Ping-pong (FA3 §3.1): named barrier 1 + c is "consumer c may issue": c syncs on it
//   before issuing its GEMMs of a tile and arrives on the other's right after, so one
//   warpgroup's softmax runs while the other's GEMMs occupy the tensor cores. WG1 arrives on
//   its own barrier once at the start (it goes first). Both consumers run the same tiles,
//   so the syncs and arrivals pair up; the one arrival left at the end is harmless.
// No __syncthreads after the role split.
// Persistent: each CTA loops over work items; both roles walk the same item sequence and
// count ring tiles across items (tile gt of the CTA in slot gt % NST), so no barrier is
// re-initialised. Each item leaves one arrival on named barrier 1 (see above):
// the next item's "consumer 0 goes first". The last V slot of an item is released like the
// others (the producer reuses it), and the consumers release Q ("Q empty", one arrival per
// consumer warp) once the item's S GEMMs have all retired.

namespace {

constexpr int NTP = 128;  // producer threads (WG0)
constexpr int PREG = 40;   // producer registers per thread after setmaxnreg.dec
constexpr int CREG = 232;  // consumer registers per thread after setmaxnreg.inc
static_assert(PREG % 8 == 0 && CREG % 8 == 0 && PREG >= 24 && CREG <= 256,
              "setmaxnreg counts: multiples of 8 in [24, 256]");
// The launch holds 168 registers x 384 threads (ptxas: 65536 / 384 rounded down to 8); the
// producer's release must cover the consumers' increase, or setmaxnreg.inc never returns.
static_assert(NTP * PREG + 2 * NTP * CREG <= 168 * NT, "register reallocation over budget");
// mbarriers (8 bytes each) at OFF_BAR: Q full, then per ring slot K full, V full, K empty,
// V empty, then Q empty.
constexpr int OFF_BAR = SMEM_USED;
constexpr int NBAR = 2 + 4 * NST;
static_assert(NBAR * 8 <= BAR_BYTES, "mbarriers fit their area");
static_assert(BN * CH % NTP == 0 && BM * CH % NTP == 0 && NTP % CH == 0,
              "every producer thread copies the same chunk column of every 128/CH-th row");
constexpr int EMPTY_ARRIVALS = 8;  // one per consumer warp

__device__ __forceinline__ unsigned bar_q(unsigned bars) { return bars; }
__device__ __forceinline__ unsigned bar_kfull(unsigned bars, int s) { return bars + 8 * (1 + s); }
__device__ __forceinline__ unsigned bar_vfull(unsigned bars, int s) {
    return bars + 8 * (1 + NST + s);
}
__device__ __forceinline__ unsigned bar_kempty(unsigned bars, int s) {
    return bars + 8 * (1 + 2 * NST + s);
}
__device__ __forceinline__ unsigned bar_vempty(unsigned bars, int s) {
    return bars + 8 * (1 + 3 * NST + s);
}
__device__ __forceinline__ unsigned bar_qempty(unsigned bars) { return bars + 8 * (1 + 4 * NST); }

// Producer thread p's copies of the BN key rows from key j0 into a swizzled tile (zero-fill
// past Sk). p copies chunk c = p % CH of rows p / CH + k NTP / CH; NTP / CH is a multiple of
// 8, so the swizzled chunk position is the same in all of them: one shared address and one
// source pointer per thread, each advanced by a constant per row (no per-row index math:
// this loop is the producer's whole issue cost, and the consumers wait on it).
__device__ __forceinline__ void produce_tile(unsigned dst, const T* __restrict__ base,
                                             long long s_s, int j0, int Sk, int p) {
    constexpr int RSTEP = NTP / CH;
    const int c = p % CH;
    const int r0 = p / CH;
    const T* src = base + (long long)(j0 + r0) * s_s + c * 8;
    const unsigned d = dst + sw_off(r0, c, TBLK);
    if (j0 + BN <= Sk && s_s == DP) {
        // Every row in range and rows packed (the usual [.., S, D] layout): constant offsets,
        // one instruction per copy.
#pragma unroll
        for (int k = 0; k < BN / RSTEP; ++k)
            cp_async_16_s(d + k * RSTEP * 128, src + k * RSTEP * DP, 16);
        return;
    }
    const int left = Sk - j0 - r0;  // row k is in range iff k RSTEP < left
    const long long step = (long long)RSTEP * s_s;
#pragma unroll
    for (int k = 0; k < BN / RSTEP; ++k) {
        const bool ok = k * RSTEP < left;
        cp_async_16_s(d + k * RSTEP * 128, ok ? src : base, ok ? 16 : 0);
        src += step;
    }
}

// One arrival per warp on an "empty" mbarrier once the warp's wgmma reads of the slot are
// done (the caller has waited on the wgmma group; wait_group is warp-synchronous).
__device__ __forceinline__ void release_slot(unsigned bar, int lane) {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(NT, 1)
attn_fused_wg(NXRT_ATTN_FUSED_PARAMS(T)) {
    // Declared 16-byte aligned only, so the compiler cannot fold the runtime round-up below.
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // A launch with less dynamic shared memory than this layout would write past the end;
    // one with other than 384 threads would leave the barriers waiting for warps that do not
    // exist (a hang): both return at once (the output stays unwritten).
    if (dynamic_smem_bytes() < (unsigned)SMEM_BYTES || blockDim.x != (unsigned)NT ||
        blockDim.y != 1u || blockDim.z != 1u)
        return;
    // Swizzle atoms start on 1024-byte boundaries (descriptor base_offset 0).
    unsigned char* smem = smem_raw + ((1024u - (smem_u32(smem_raw) & 1023u)) & 1023u);
    const unsigned sbase = smem_u32(smem);
    const unsigned bars = sbase + OFF_BAR;

    const int tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2, wq = warp & 3;  // warpgroup (0 producer), warp within it
    const int g = lane >> 2, tq = lane & 3;

    // Work items: rounds of gridDim.x items, CTA c taking item c of each round. Schedule 6:
    // item i is (i % n_x, i / n_x), so the CTAs of a round share the K/V rows of few heads in
    // L2. Schedule 7 (for causal masking, where the last row tile of a head sees the most
    // keys): item i is the (i / n_bh)-th longest row tile of (head, split) i % n_bh, and odd
    // rounds run the CTAs in reverse ("snake"), so that every CTA's total stays close to the
    // mean.
    const int n_x = B * Hkv * row_tiles;
    const int n_items = n_x * splits;
#if NXRT_WG_SCHED == 7
    const int n_bh = B * Hkv * splits;
    const int n_rounds = (n_items + (int)gridDim.x - 1) / (int)gridDim.x;
    auto item_at = [&](int r) {
        return r * (int)gridDim.x +
               ((r & 1) ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x);
    };
    auto work = [&](int item) {
        const int rank = item / n_bh, j = item - rank * n_bh;
        const int bh = j / splits;
        return decode_work_at(bh * row_tiles + rank, j - bh * splits, BM, BN, B, H, Hkv, Sq, Sk,
                              causal, window, row_tiles, splits);
    };
#else  // NXRT_WG_SCHED == 6
    const int n_rounds = (n_items + (int)gridDim.x - 1) / (int)gridDim.x;
    auto item_at = [&](int r) { return (int)blockIdx.x + r * (int)gridDim.x; };
    auto work = [&](int item) {
        const int y = item / n_x;
        return decode_work_at(item - y * n_x, y, BM, BN, B, H, Hkv, Sq, Sk, causal, window,
                              row_tiles, splits);
    };
#endif

    if (tid == 0) {
        mbar_init(bar_q(bars), NTP);
        mbar_init(bar_qempty(bars), EMPTY_ARRIVALS);
#pragma unroll
        for (int s = 0; s < NST; ++s) {
            mbar_init(bar_kfull(bars, s), NTP);
            mbar_init(bar_vfull(bars, s), NTP);
            mbar_init(bar_kempty(bars, s), EMPTY_ARRIVALS);
            mbar_init(bar_vempty(bars, s), EMPTY_ARRIVALS);
        }
    }
    __syncthreads();  // the barriers are initialised before anyone uses them (last CTA-wide sync)

    if (wg == 0) {
        // ======== Producer. Ring tile gt (counted over all of this CTA's items) goes to slot
        // gt % NST, its u-th use (u = gt / NST); the consumers' release of use u - 1
        // completes phase u - 1 of the slot's "empty" barrier.
        setmaxnreg_dec<PREG>();
        const int p = tid;
        int gt = 0, qn = 0;  // ring tiles and Q loads issued so far
        auto fill = [&](unsigned full, unsigned empty, int g, unsigned dst, const T* base,
                        long long s_s, int j0) {
            const int slot = g % NST, u = g / NST;
            if (u > 0) mbar_wait(empty + 8 * slot, (u - 1) & 1);
            produce_tile(dst + slot * T_BYTES, base, s_s, j0, Sk, p);
            cp_async_mbar_arrive(full + 8 * slot);
        };
        for (int r = 0; r < n_rounds; ++r) {
            const int item = item_at(r);
            if (item >= n_items) continue;
            const Work w = work(item);
            const int n_tiles = w.t_end - w.t_beg;
            if (n_tiles <= 0) continue;
            const T* kbase = k + w.b * k_sb + w.kvh * k_sh;
            const T* vbase = v + w.b * v_sb + w.kvh * v_sh;
            // K(0) first: it streams in while the consumers finish the previous item.
            fill(bar_kfull(bars, 0), bar_kempty(bars, 0), gt, sbase + OFF_K, kbase, k_ss,
                 w.t_beg * BN);
            // Q (zero for packed rows past R), on its own barrier, once every consumer warp
            // has retired its S GEMMs of the previous item.
            if (qn > 0) mbar_wait(bar_qempty(bars), (qn - 1) & 1);
            {
                constexpr int RSTEP = NTP / CH;
                const int c = p % CH;
#pragma unroll 4
                for (int kq = 0; kq < BM / RSTEP; ++kq) {
                    const int rr = p / CH + kq * RSTEP;
                    const int r = w.r0 + rr;
                    const bool ok = r < w.R;
                    const T* src = q;
                    if (ok) {
                        const int i = r / w.G;
                        const int h = w.kvh * w.G + (r - i * w.G);
                        src = q + w.b * q_sb + h * q_sh + i * q_ss + c * 8;
                    }
                    cp_async_16(smem + sw_off(rr, c, QBLK), src, ok ? 16 : 0);
                }
                cp_async_mbar_arrive(bar_q(bars));
                ++qn;
            }
            // Then per it: K(it + 1), V(it) (the order the consumers need them).
            for (int it = 0; it < n_tiles; ++it) {
                if (it + 1 < n_tiles)
                    fill(bar_kfull(bars, 0), bar_kempty(bars, 0), gt + it + 1, sbase + OFF_K,
                         kbase, k_ss, (w.t_beg + it + 1) * BN);
                fill(bar_vfull(bars, 0), bar_vempty(bars, 0), gt + it, sbase + OFF_V, vbase,
                     v_ss, (w.t_beg + it) * BN);
            }
            gt += n_tiles;
        }
        // Stay until every copy has landed (and so has arrived on its barrier).
        cp_async_commit();
        cp_async_wait<0>();
        return;
    }

    // ======== Consumers: warpgroup cw = wg - 1 owns tile rows 64 cw .. 64 cw + 63.
    setmaxnreg_inc<CREG>();
    const int cw = wg - 1;
    const bool general = softcap > 0.f || mask_planes > 0;
    const float scale_log2 = scale * kLog2e;
    const float inv_softcap = softcap > 0.f ? 1.f / softcap : 0.f;
    const unsigned qa = sbase + 64 * cw * 128;  // this WG's 64 rows of Q (8 KB, 1024-aligned)
    const int bar_mine = 1 + cw, bar_other = 2 - cw;  // named barriers 1, 2 (0: __syncthreads)
    // Consumer 0 issues first. Once per CTA: every item's ping-pong leaves one arrival on
    // barrier 1, the next item's first turn (one left at exit is harmless).
    if (cw == 0) named_bar_arrive(1, 2 * NTP);
    int gt = 0, qn = 0;  // ring tiles and Q loads consumed so far (as the producer counts)

    for (int r = 0; r < n_rounds; ++r) {
        const int item = item_at(r);
        if (item >= n_items) continue;
        const Work w = work(item);
        const int n_tiles = w.t_end - w.t_beg;

        // This thread's two rows in the wgmma accumulator layout: warp wq of consumer cw owns
        // tile rows 64 cw + 16 wq .. +15; x = 0: row g, x = 1: row g + 8.
        Row rows[2];
#pragma unroll
        for (int x = 0; x < 2; ++x)
            rows[x] = make_row(w, w.r0 + 64 * cw + 16 * wq + g + 8 * x, B, H, Sq, Sk, q_sb, q_sh,
                               q_ss, o_sb, o_sh, o_ss, mask_planes);

        // O[:, 64 qb + 8 j + 2 tq + (e & 1)] of row x = e >> 1 is o[qb][4 j + e].
        float o[HB][32];
#pragma unroll
        for (int qb = 0; qb < HB; ++qb)
#pragma unroll
            for (int i = 0; i < 32; ++i) o[qb][i] = 0.f;
        float s[NS];
#pragma unroll
        for (int i = 0; i < NS; ++i) s[i] = 0.f;
        unsigned pa[BN / 16][4];
        float m_run[2] = {neg_inf(), neg_inf()};
        float l_run[2] = {0.f, 0.f};
        float alpha[2] = {1.f, 1.f};  // pending rescale of O, applied before the next O += P V

        if (n_tiles > 0) {
            mbar_wait(bar_q(bars), qn & 1);
            mbar_wait(bar_kfull(bars, gt % NST), (gt / NST) & 1);
            fence_proxy_async();  // the landed cp.async bytes, visible to wgmma (async proxy)
            named_bar_sync(bar_mine, 2 * NTP);
            wg_fence();
            issue_s(s, qa, sbase + OFF_K + (gt % NST) * T_BYTES);
            wg_commit();
            named_bar_arrive(bar_other, 2 * NTP);
            wg_wait0();
            fence_regs(s);
            release_slot(bar_kempty(bars, gt % NST), lane);
            softmax_tile(s, w, rows, w.t_beg * BN, tq, Sq, Sk, causal, window, general, softcap,
                         inv_softcap, scale, scale_log2, mask, m_run, l_run, alpha);
            pack_p(pa, s);
        }

        // Iteration it (tile t = t_beg + it, it + 1 < n_tiles): on entry pa = P(t) and O lacks
        // the factor alpha of softmax(t); K(t+1) is in slot (gt + it + 1) % NST, V(t) in
        // (gt + it) % NST.
        for (int it = 0; it + 1 < n_tiles; ++it) {
            const int t = w.t_beg + it;
            const int g0 = gt + it, g1 = g0 + 1;
            const int slot = g0 % NST, slot1 = g1 % NST;
            mbar_wait(bar_kfull(bars, slot1), (g1 / NST) & 1);
            mbar_wait(bar_vfull(bars, slot), (g0 / NST) & 1);
            fence_proxy_async();
            named_bar_sync(bar_mine, 2 * NTP);  // this consumer's turn on the tensor cores
            // S(t+1) = Q K(t+1)ᵀ, then O = alpha O + P(t) V(t), two groups in this order.
            wg_fence();
            issue_s(s, qa, sbase + OFF_K + slot1 * T_BYTES);
            wg_commit();
            rescale_o(o, alpha);  // O is no wgmma's accumulator now: P(t-1) V(t-1) was retired
#pragma unroll
            for (int qb = 0; qb < HB; ++qb) fence_regs(o[qb]);
            wg_fence();
            issue_pv(o, pa, sbase + OFF_V + slot * T_BYTES);
            wg_commit();
            named_bar_arrive(bar_other, 2 * NTP);  // the other consumer's turn

            // S(t+1) retired (groups retire in order); P(t) V(t) may still run: softmax(t+1)
            // touches only s, m_run, l_run and alpha (not o, not pa) until wait_group 0.
            wg_wait1();
            fence_regs(s);
            release_slot(bar_kempty(bars, slot1), lane);
            softmax_tile(s, w, rows, (t + 1) * BN, tq, Sq, Sk, causal, window, general, softcap,
                         inv_softcap, scale, scale_log2, mask, m_run, l_run, alpha);
            wg_wait0();
            // Pins both: O's next use and the overwrite of pa (P(t) was wgmma input) stay after
            // the wait.
#pragma unroll
            for (int qb = 0; qb < HB; ++qb) fence_regs(o[qb]);
            fence_regs(s);
            release_slot(bar_vempty(bars, slot), lane);
            pack_p(pa, s);
        }

        if (n_tiles > 0) {
            // Every S GEMM of this item has retired: the producer may load the next item's Q.
            release_slot(bar_qempty(bars), lane);
            // Last tile: O = alpha O + P V with V(t_end - 1) (outside the ping-pong: both
            // consumers have issued all their S GEMMs by now).
            const int gl = gt + n_tiles - 1;
            mbar_wait(bar_vfull(bars, gl % NST), (gl / NST) & 1);
            fence_proxy_async();
            rescale_o(o, alpha);
#pragma unroll
            for (int qb = 0; qb < HB; ++qb) fence_regs(o[qb]);
            wg_fence();
            issue_pv(o, pa, sbase + OFF_V + (gl % NST) * T_BYTES);
            wg_commit();
            wg_wait0();
#pragma unroll
            for (int qb = 0; qb < HB; ++qb) fence_regs(o[qb]);
            release_slot(bar_vempty(bars, gl % NST), lane);
            gt += n_tiles;
            ++qn;
        }

        // ---- Epilogue (per thread, no shared memory: nothing to synchronise). The rows are
        // rebuilt from laundered indices, so their output offsets hold no registers across
        // the main loop.
        {
            Work we = w;
            int rbase = w.r0 + 64 * cw + 16 * wq + g;
            asm volatile("" : "+r"(we.b), "+r"(we.kvh), "+r"(rbase));
#pragma unroll
            for (int x = 0; x < 2; ++x)
                rows[x] = make_row(we, rbase + 8 * x, B, H, Sq, Sk, q_sb, q_sh, q_ss, o_sb, o_sh,
                                   o_ss, mask_planes);
        }
        store_rows(o, l_run, m_run, rows, w.split, splits, out, ws_o, ws_ml,
                   (long long)B * H * Sq, D, tq);
    }  // items
}
