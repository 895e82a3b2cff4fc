// IndexShare attention on Hopper, warp-specialised and persistent (sm_90a, f16/bf16, head
// size 64 or 128, one shared index row): attention_wg.cu's schedule 6 with gathered keys.
//
// Same contract, arguments, task decode (is_decode_task_at), split partials and last-CTA
// merge as is_attn_wg; the work is the same (task, split) items, but the grid is
// min(items, SMs) CTAs and CTA c takes items c, c + gridDim.x, ... A work item is up to
// 128 heads of one (batch, query, kv head) that share an index row (IS_MROWS = 128 rows of
// the wgmma M dimension, two consumer warpgroups of 64) and one split of its columns, in
// tiles of IS_KT (128 or 64) keys: every gathered row is read once for all 128 heads.
//
// Why: the barrier-coupled is_attn_wg gathers with every thread between two __syncthreads,
// so the copies, the index staging and the split merge stall the tensor cores. Here
// (FA3's warp specialisation, as attention's schedule 6):
//   WG0, the producer (setmaxnreg.dec to IS_PREG registers), per item:
//     1. the item's index columns landed (cp.async, issued one item ahead into a two-slot
//        raw buffer): it validates them (while capturing: the rules of is_stage_keys,
//        latching IS_LATCH_BIT), clamps them into the item's key buffer (two slots) with the
//        live length and "hole" flag, and arrives on the slot's "keys" mbarrier;
//     2. K(0) of the item (it streams in while the consumers finish the previous item);
//     3. Q, once the consumers released the Q slot's previous item ("Q empty", when its
//        last S GEMM retired; with IS_Q2 two Q slots, so Q(n + 1) loads under item n);
//        the first item's Q under its index fetch (IS_CLUSTER: after it, see step 1);
//     4. the next item's index columns (cp.async, one commit group);
//     5. K(it + 1), V(it) for every tile into NST-slot rings guarded by full/empty
//        mbarriers (cp.async.mbarrier.arrive.noinc; rows by 16-byte cp.async from the keys).
//   WG1, WG2, the consumers (setmaxnreg.inc to IS_CREG), 64 heads each: attention's loop
//     (S(t+1) and P(t) V(t) issued back to back, softmax(t+1) under P(t) V(t)) and its
//     ping-pong of the two warpgroups on named barriers 1 and 2. An item with at most 64
//     heads leaves WG2 idle (it still waits and releases every slot) and skips the
//     ping-pong. Then the item's rows (one split) or partials, and with several splits the
//     last-arrival merge of is_finish_if_last_v4 over the 256 consumer threads (barrier 3).
// Key slots: the producer stages item n's keys (slot n & 1) once the consumers released
// the slot's previous item n - 2 ("keys empty", after their last softmax of it); one full
// and one empty mbarrier per slot, so no barrier runs two phases ahead of a waiter.
// Every item loads Q and has the Q empty cycle, even one without a key tile (a split past a
// row's padding), so the producer's and the consumers' counts stay in step.
//
// Shared memory (from a 1024-byte aligned base; _index_share_plan._ws_smem mirrors it): Q as HB
// blocks of [128][128 B] (128-byte swizzle), NST K slots, NST V slots (HB blocks of
// [KT keys][128 B] each), 256 bytes of mbarriers, the merge weights [128][IS_WS_MAXS + 1]
// floats (not with IS_Q2 or IS_CLUSTER), two key slots of cps ints, two raw index slots of
// 16 + 8 cps bytes (4 cps with IS_Q2), and with IS_CLUSTER the exchange inbox ((XH + 1)
// rows of 4 KB, 128-byte aligned).
//
// IS_CLUSTER (decode: one item per CTA, two splits per task): clusters of two CTAs, rank =
// split, merge through distributed shared memory instead of global partials and an
// arrival counter. Each thread st.asyncs its rows' (m, l) into the partner's inbox (a
// shared-memory region no loop uses, after the raw index slots) as soon as its last
// softmax ran, and, once its O is final, the half of its granules that the partner
// finishes, each completing bytes on one of the partner's two exchange mbarriers; the
// partner computes the merge weights when the (m, l) have landed and finishes its half
// with is_finish_if_last_v4's arithmetic (the same bits) when the granules have. The
// producer leaves the index rules to the consumers there (they run while K(0) streams in;
// one item per CTA, so the raw slot is never refilled).
//
// The kernel is launched with programmatic dependent launch (index_share.py): it lets the
// stream's next kernel begin launching at once and waits on griddepcontrol before its
// first global access.
//
// Defines: IS_DTYPE (1 f16, 2 bf16), IS_HD (64 or 128), IS_KT (keys per tile, 64 or 128),
// IS_NST (ring slots, 2-4), IS_PREG / IS_CREG (setmaxnreg counts), IS_Q2, IS_CLUSTER and
// IS_CMERGE / IS_CMDS (four- or eight-CTA clusters, see there). IS_XSPLIT (the split last
// P V, see there) follows from them. WS_TRACE / WS_TRACE_SM mark the phase boundaries that
// lab/trace_index_share.py stamps (index_share_trace.cuh: no-ops here). Switches no shipped
// build set (diagnostics, opt-outs): lab/index_share_ws_switches.md.
#include "index_share_mma.cuh"
#include "common.cuh"  // the cluster helpers (IS_CLUSTER)

#ifndef IS_HD
#define IS_HD 128
#endif
#ifndef IS_NST
#define IS_NST 2
#endif
#ifndef IS_PREG
#define IS_PREG 56
#endif
#ifndef IS_CREG
#define IS_CREG 224
#endif
#ifndef IS_Q2
#define IS_Q2 0
#endif
#ifndef IS_CLUSTER
#define IS_CLUSTER 0
#endif
#ifndef IS_KT
#define IS_KT 128
#endif
// IS_CMERGE = C, 4 or 8 (decode at small batches, splitk._ws_decode_split): C splits per
// task, one item per CTA, the task's C CTAs a cluster; each writes its split partials, and
// after a cluster barrier each finishes 1 / C of the task's channels from the C partials in
// L2 (is_combine's arithmetic and bits), instead of a separate is_combine launch (IS_CMDS,
// below: through distributed shared memory instead; builds._ws_variant sets it for eight
// CTAs).
#ifndef IS_CMERGE
#define IS_CMERGE 0
#endif
// IS_CMDS (with IS_CMERGE; builds._ws_variant sets it for eight CTAs): the partials go
// through distributed shared memory instead of L2: once every CTA of the cluster is done with
// its ring (a cluster barrier that the producer takes part in once its copies landed), each
// thread stores its O values and rows' (m, L) straight from registers into the ring of the
// CTA that finishes their channels ([split][row][HD / C] floats, then [split][row] (m, L)
// pairs), and after a second cluster barrier each CTA merges from its own shared memory (the
// same arithmetic, the same bits). H200 (docs/notes/index_share-history.md; 21-22): 0.1-1.2 us
// faster per call than through L2 with eight CTAs (0.4-1.9 in one graph), 0.3-1.7 us slower
// with four. compute-sanitizer's racecheck (2025.3) reports write-after-write hazards between
// the ring's cp.async copies and the partners' stores; it reports the same for a two-CTA
// kernel that orders them by cp.async.wait_group and a release/acquire cluster barrier
// (lab/rc_cluster_probe.py), and none when the first write is a plain store: a limit of the
// tool (docs/notes/sanitize.md).
#ifndef IS_CMDS
#define IS_CMDS 0
#endif
#include "index_share_trace.cuh"  // WS_TRACE, WS_TRACE_SM
#include "index_share_acc.cuh"  // NXRT_WG_AB from IS_DTYPE, wgmma.cuh

// IS_XSPLIT (wherever it applies; docs/notes/index_share-history.md: -0.2 to -0.5 us per N128
// decode call on the H200, bitwise equal): the cluster build at HD 128 and 128-key tiles sends
// its partner's half of O while the last P V's other half runs. For that, V's two 64-channel
// blocks sit swapped in rank 0's slots (the producer's fill), so o[0] is the partner's half in
// both ranks and o[1] their own (the same code in both: per-rank branches there cost ptxas
// registers it could not spare, C7511/C7519).
#define IS_XSPLIT (IS_CLUSTER && IS_HD == 128 && IS_KT == 128)

#define IS_WS_MAXS 8  // most splits per task (the merge weights' shared memory)

static_assert(IS_DTYPE == 1 || IS_DTYPE == 2, "wgmma takes f16 or bf16");
static_assert(IS_HD == 64 || IS_HD == 128, "IS_HD must be 64 or 128");
static_assert(IS_NST >= 2 && IS_NST <= 4, "two to four ring slots");
static_assert(IS_KT == 64 || IS_KT == 128, "tiles of 64 or 128 keys");
static_assert(!(IS_CLUSTER && IS_Q2), "the cluster merge is for two splits; IS_Q2 for one");
static_assert(!IS_CMERGE || (!IS_CLUSTER && !IS_Q2 && (IS_CMERGE == 4 || IS_CMERGE == 8)),
              "IS_CMERGE is 4 or 8 (the cluster's CTAs = splits), without IS_CLUSTER or IS_Q2");
static_assert(!IS_CMDS || IS_CMERGE, "IS_CMDS is a variant of the IS_CMERGE merge");

namespace {

constexpr int HD = IS_HD;
constexpr int HB = HD / 64;          // 64-channel blocks per row
constexpr int CH = HD / 8;           // 16-byte chunks per row
constexpr int BM = 128;              // head rows per item
constexpr int KT = IS_KT;            // keys per tile
constexpr int NS = KT / 2;           // S accumulators per thread (64 rows x KT keys per WG)
constexpr int NST = IS_NST;
constexpr int NTP = 128;             // producer threads
constexpr int NT = 3 * NTP;
constexpr int QBLK = BM * 128;
constexpr int TBLK = KT * 128;
constexpr int Q_BYTES = HB * QBLK;
constexpr int QS = IS_Q2 ? 2 : 1;    // Q slots
constexpr int T_BYTES = HB * TBLK;
constexpr int OFF_K = QS * Q_BYTES;
constexpr int OFF_V = OFF_K + NST * T_BYTES;
constexpr int OFF_BAR = OFF_V + NST * T_BYTES;
constexpr int OFF_W = OFF_BAR + 256;
// Split-merge weights: IS_Q2 does not split, IS_CLUSTER merges through the inbox.
constexpr int OFF_KEY = OFF_W + (IS_Q2 || IS_CLUSTER ? 0 : BM * (IS_WS_MAXS + 1) * 4);
constexpr int RSTEP = NTP / CH;      // rows one pass of the producer copies
constexpr int RPT = KT / RSTEP;      // rows per producer thread per tile
constexpr int EMPTY_ARRIVALS = 8;    // one per consumer warp
constexpr int PREG = IS_PREG, CREG = IS_CREG;
static_assert(PREG % 8 == 0 && CREG % 8 == 0 && PREG >= 24 && CREG <= 256,
              "setmaxnreg counts: multiples of 8 in [24, 256]");
static_assert(NTP * PREG + 2 * NTP * CREG <= 168 * NT, "register reallocation over budget");
static_assert(RSTEP % 8 == 0, "a producer thread's rows share one swizzled chunk position");
static_assert(OFF_KEY % 16 == 0 && QBLK % 1024 == 0 && TBLK % 1024 == 0, "alignment");
static_assert(OFF_KEY <= 232448, "more than the 227 KiB of opt-in shared memory per block");
static_assert(!IS_CMDS || BM * HD * 4 + IS_CMERGE * BM * 8 <= 2 * NST * T_BYTES,
              "IS_CMDS: the task's partials must fit in the K and V rings");
// IS_CLUSTER: granule rows (float4 per consumer thread) of the exchange, see the merge.
constexpr int XH = 4 * HB;               // rows of O a consumer thread sends its partner
constexpr int X_INBOX = (XH + 1) * 4096;  // the partner's rows (a region of its own)

// mbarriers (8 bytes each): keys full and keys empty per key slot, K full, V full, K empty
// and V empty per ring slot, then Q full and Q empty per Q slot.
__device__ __forceinline__ unsigned bar_keys(unsigned b, int s) { return b + 8 * s; }
__device__ __forceinline__ unsigned bar_keysempty(unsigned b, int s) { return b + 8 * (2 + s); }
__device__ __forceinline__ unsigned bar_kfull(unsigned b, int s) { return b + 8 * (4 + s); }
__device__ __forceinline__ unsigned bar_vfull(unsigned b, int s) { return b + 8 * (4 + NST + s); }
__device__ __forceinline__ unsigned bar_kempty(unsigned b, int s) {
  return b + 8 * (4 + 2 * NST + s);
}
__device__ __forceinline__ unsigned bar_vempty(unsigned b, int s) {
  return b + 8 * (4 + 3 * NST + s);
}
__device__ __forceinline__ unsigned bar_q(unsigned b, int s) { return b + 8 * (4 + 4 * NST + s); }
__device__ __forceinline__ unsigned bar_qempty(unsigned b, int s) {
  return b + 8 * (6 + 4 * NST + s);
}
#if IS_CLUSTER
// The exchange's transaction mbarrier after them.
__device__ __forceinline__ unsigned bar_xch(unsigned b) { return b + 8 * (8 + 4 * NST); }
// The partner's rows' (m, L), on their own transaction mbarrier (they are final before the
// last P V, so the merge weights are ready before the O granules land).
__device__ __forceinline__ unsigned bar_xml(unsigned b) { return b + 8 * (9 + 4 * NST); }
#endif
static_assert(8 * (10 + 4 * IS_NST) <= 256, "mbarriers fit their 256 bytes");

constexpr int BAR_PP1 = 1, BAR_PP2 = 2;  // consumer ping-pong (attention's)
#if !IS_Q2 && !IS_CLUSTER
constexpr int BAR_CONS = 3;              // the 256 consumer threads (the last-arrival merge)
#endif
constexpr int BAR_PROD = 4;              // the 128 producer threads

__device__ __forceinline__ unsigned ws_smem_u32(const void* p) {
  return (unsigned)__cvta_generic_to_shared(p);
}

// 4- or 8-byte cp.async (L1-allocating form: the only one for sizes below 16).
__device__ __forceinline__ void cp_async4(unsigned dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ void cp_async8(unsigned dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(src));
}

__device__ __forceinline__ int ws_warp_min(int v) {
  for (int off = 16; off > 0; off >>= 1) v = is_imin(v, __shfl_xor_sync(IS_FULL, v, off));
  return v;
}

#if IS_CLUSTER
// mapa and the cluster barrier halves: common.cuh's nxrt::cluster_* (included above).
// 16 bytes into another CTA's shared memory (an address from cluster_mapa), completing them
// on that CTA's mbarrier `rbar` (also an address from cluster_mapa).
__device__ __forceinline__ void ws_st_async4(unsigned a, float x, float y, float z, float w,
                                             unsigned rbar) {
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];\n"
      ::"r"(a), "f"(x), "f"(y), "f"(z), "f"(w), "r"(rbar)
      : "memory");
}
__device__ __forceinline__ void ws_mbar_expect_tx(unsigned bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
#endif

// Raw index column i of a landed slot (element 16 + i * esz; i = -1 is the column before
// the split), and is_stage_keys' rules for column `col` = c_begin + i with value v.
__device__ __forceinline__ long long ws_raw_at(const unsigned char* raw, bool idx64, int i) {
  return idx64 ? reinterpret_cast<const long long*>(raw)[i]
               : (long long)reinterpret_cast<const int*>(raw)[i];
}
__device__ __forceinline__ bool ws_col_bad(const unsigned char* raw, bool idx64, int i, int col,
                                           long long v, int vbound) {
  const long long prev = col > 0 ? ws_raw_at(raw, idx64, i - 1) : -1;
  return v < -1 || (col == 0 && v == -1) ||
         (v != -1 && (v >= (long long)vbound || (col > 0 && (prev == -1 || v <= prev))));
}

// A 16-byte row chunk, or 16 zero bytes where key < 0 (cp.async's ignore-source predicate:
// src is not read, but it stays a valid address). One setp and one copy per chunk: the
// src-size form needs a select of the size and of the address (docs/notes/index_share-history.md).
#if IS_CLUSTER
// With an L2 cache policy (from createpolicy).
__device__ __forceinline__ void ws_cp_async16_key(unsigned dst, const void* src, int key,
                                                  unsigned long long pol) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.lt.s32 p, %2, 0;\n"
      "cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, p, %3;\n}\n" ::"r"(dst),
      "l"(src), "r"(key), "l"(pol));
}
#else
__device__ __forceinline__ void ws_cp_async16_key(unsigned dst, const void* src, int key) {
  asm volatile("{\n.reg .pred p;\nsetp.lt.s32 p, %2, 0;\n"
               "cp.async.cg.shared.global [%0], [%1], 16, p;\n}\n" ::"r"(dst),
               "l"(src), "r"(key));
}
#endif

// One arrival per warp on an "empty" mbarrier (after the warp's reads of the slot).
__device__ __forceinline__ void ws_release(unsigned bar, int lane) {
  __syncwarp();
  if (lane == 0) mbar_arrive(bar);
}

}  // namespace

extern "C" __global__ void __launch_bounds__(NT, 1)
#if IS_CLUSTER
    __cluster_dims__(2, 1, 1)
#elif IS_CMERGE
    __cluster_dims__(IS_CMERGE, 1, 1)
#endif
    is_attn_ws(IS_ATTN_PARAMS) {
  extern __shared__ __align__(16) unsigned char smem_raw[];
  // Keys and raw index slots follow the fixed layout; cps sizes them.
  const int key_bytes = 2 * cps * 4;
  const int raw_slot = 16 + (IS_Q2 ? 4 : 8) * cps;  // IS_Q2: int32 indices only
  // IS_CLUSTER: the exchange inbox (X_INBOX bytes) after the raw slots, 128-byte aligned.
  const int xin_off = (OFF_KEY + key_bytes + 2 * raw_slot + 127) & ~127;
  {
    unsigned dyn;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(dyn));
    // A short launch would write past the end; another block shape would hang the
    // barriers; more splits than the merge weights hold would overrun them: return at once
    // (after the programmatic wait below, so that even such a grid completes only after
    // its predecessor, as a kernel launched programmatically after it assumes).
    bool refuse = (long long)dyn < 1024LL + (IS_CLUSTER ? xin_off + X_INBOX
                                                         : OFF_KEY + key_bytes + 2 * raw_slot) ||
                  blockDim.x != (unsigned)NT || blockDim.y != 1u || blockDim.z != 1u ||
                  S > (IS_Q2 ? 1 : IS_WS_MAXS) || (IS_Q2 && idx64);
#if IS_CLUSTER
    // One item per CTA, the two splits of a task in one cluster (uniform: both CTAs leave).
    refuse = refuse || S != 2 || (int)gridDim.x != items || (items & 1);
#elif IS_CMERGE
    // One item per CTA, the splits of a task in one cluster (uniform: all CTAs leave).
    refuse = refuse || S != IS_CMERGE || (int)gridDim.x != items;
#endif
    if (refuse) {
      asm volatile("griddepcontrol.wait;\n" ::: "memory");
      return;
    }
  }
  if (threadIdx.x == 0) WS_TRACE(0);
  unsigned char* smem = smem_raw + ((1024u - (ws_smem_u32(smem_raw) & 1023u)) & 1023u);
  const unsigned sbase = ws_smem_u32(smem);
  const unsigned bars = sbase + OFF_BAR;
  int* s_keys = reinterpret_cast<int*>(smem + OFF_KEY);            // [2][cps]
  unsigned char* s_raw = smem + OFF_KEY + key_bytes;                 // [2][raw_slot]
#if !IS_Q2 && !IS_CLUSTER
  float* s_w = reinterpret_cast<float*>(smem + OFF_W);
#endif
  __shared__ int s_meta[2][2];  // per key slot: live length, hole (a -1 before it)
  __shared__ int s_red[4][2];   // producer warps' live / first -1
#if !IS_Q2 && !IS_CLUSTER
  __shared__ int s_flag;
#endif

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  // The warpgroup, broadcast from lane 0 so the compiler knows it is warp-uniform: the
  // shared-memory addresses and wgmma descriptors derived from it then stay in uniform
  // registers (no per-descriptor R2UR moves in the consumers' loop).
  const int wg = __shfl_sync(IS_FULL, tid >> 7, 0), wq = warp & 3;
  const int g = lane >> 2, tq = lane & 3;
  const int Nkv = N / G;
  const int n_rounds = (items + (int)gridDim.x - 1) / (int)gridDim.x;
#if IS_CLUSTER
  // Cluster rank = blockIdx.x & 1 = the split: item (task, s) of CTA pair blockIdx.x >> 1.
  const int cl_rank = (int)(blockIdx.x & 1u);
  auto item_at = [&](int r) {
    const int pair = (int)(blockIdx.x >> 1);
    return ((pair / U) * 2 + cl_rank) * U + pair % U + r * (int)gridDim.x;
  };
#elif IS_CMERGE
  // Cluster rank = blockIdx.x % C = the split: item (task, s) of cluster blockIdx.x / C.
  const int cl_rank = (int)(blockIdx.x % IS_CMERGE);
  auto item_at = [&](int r) {
    const int cl = (int)(blockIdx.x / IS_CMERGE);
    return ((cl / U) * IS_CMERGE + cl_rank) * U + cl % U + r * (int)gridDim.x;
  };
#else
  auto item_at = [&](int r) { return (int)blockIdx.x + r * (int)gridDim.x; };
#endif
  auto task_of = [&](int item) {
    return is_decode_task_at(item, Sq, G, U, HBK, shared_idx, S, BM);
  };

  if (tid == 0) {
    for (int i = 0; i < QS; ++i) {
      mbar_init(bar_q(bars, i), NTP);
      mbar_init(bar_qempty(bars, i), EMPTY_ARRIVALS);
    }
    mbar_init(bar_keys(bars, 0), NTP);
    mbar_init(bar_keys(bars, 1), NTP);
    mbar_init(bar_keysempty(bars, 0), EMPTY_ARRIVALS);
    mbar_init(bar_keysempty(bars, 1), EMPTY_ARRIVALS);
#pragma unroll
    for (int s = 0; s < NST; ++s) {
      mbar_init(bar_kfull(bars, s), NTP);
      mbar_init(bar_vfull(bars, s), NTP);
      mbar_init(bar_kempty(bars, s), EMPTY_ARRIVALS);
      mbar_init(bar_vempty(bars, s), EMPTY_ARRIVALS);
    }
#if IS_CLUSTER
    mbar_init(bar_xch(bars), 1);
    mbar_init(bar_xml(bars), 1);
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
  }
  __syncthreads();  // the last CTA-wide barrier
  // Programmatic dependent launch (index_share launches this kernel with it; both are
  // no-ops otherwise): the stream's next kernel may begin launching now, and nothing of
  // global memory is touched until the previous kernel has completed and its writes are
  // visible. Only the set-up above (shared memory, mbarriers) overlaps that kernel's end.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#if IS_CLUSTER
  nxrt::cluster_arrive_relaxed();  // phase 1: the exchange mbarrier is initialised (waited below)
#endif

  if (wg == 0) {
    // ======== Producer.
    setmaxnreg_dec<PREG>();
    const int p = tid;
    const int c = p % CH, r0 = p / CH;
    // Index columns of `item` into raw slot `slot`: element i of the split at byte
    // 16 + i * esz, the column before the split (the left neighbour the rules need) just
    // below it. One commit group.
    auto fetch_index = [&](int item, int slot) {
      const IsTask t = task_of(item);
      const int c_begin = t.s * cps;
      const int ncols = is_split_cols(K, c_begin, cps);
      const long long irow = ((t.b * HI + t.ih) * (long long)Sq + t.qi) * K + c_begin;
      const unsigned dst = ws_smem_u32(s_raw + slot * raw_slot) + 16;
      for (int i = p - (c_begin > 0 ? 1 : 0); i < ncols; i += NTP) {
        if (idx64)
          cp_async8(dst + 8 * i, static_cast<const long long*>(idx) + irow + i);
        else
          cp_async4(dst + 4 * i, static_cast<const int*>(idx) + irow + i);
      }
      is_cp_async_commit();
    };
    // Q of item `t` into Q slot qn % QS (rows past nh zero), once the consumers released
    // the slot's previous item.
    auto load_q = [&](const IsTask& t, int qn) {
      if (qn >= QS) mbar_wait(bar_qempty(bars, qn % QS), ((qn - QS) / QS) & 1);
      const unsigned sq = sbase + (qn % QS) * Q_BYTES;
#pragma unroll 4
      for (int kq = 0; kq < BM / RSTEP; ++kq) {
        const int rr = r0 + kq * RSTEP;
        const bool ok = rr < t.nh;
        const is_t* src =
            ok ? q + ((t.b * N + t.h0 + rr) * (long long)Sq + t.qi) * HD + c * 8 : q;
        is_cp_async16_s(sq + sw_off(rr, c, QBLK), src, ok ? 16 : 0);
      }
      cp_async_mbar_arrive(bar_q(bars, qn % QS));
    };
    int gt = 0, qn = 0;  // ring tiles and items issued so far
    if (n_rounds > 0 && item_at(0) < items) {
      fetch_index(item_at(0), 0);
#if !IS_CLUSTER
      // The first item's Q does not depend on its indices: it loads under their fetch
      // (after the commit, so the index wait below does not wait for it).
      load_q(task_of(item_at(0)), 0);
#endif
    }
    for (int r = 0; r < n_rounds; ++r) {
      const int item = item_at(r);
      if (item >= items) break;
      const IsTask t = task_of(item);
      const int slot = qn & 1;
      // 1. Keys: this item's raw columns landed for every producer thread, and the
      // consumers are done with the key slot's previous item (n - 2).
      is_cp_async_wait(0);
      if (p == 0) WS_TRACE_SM(1);  // with the CTA's SM
#if IS_CLUSTER
      // The CTA's one item: its index columns had the memory system to themselves (with Q
      // beside them they landed ~0.6 us later, H200 trace). A Q larger than a K tile (128
      // heads at 64-key tiles) goes now, under the key staging; otherwise after K(0)'s
      // gathers, so that the consumers' first wait is for both at once (docs/notes/index_share-history.md).
      if (t.nh > KT) load_q(t, qn);
#endif
      if (qn >= 2) mbar_wait(bar_keysempty(bars, slot), ((qn - 2) >> 1) & 1);
      named_bar_sync(BAR_PROD, NTP);
      const int c_begin = t.s * cps;
      const int ncols = is_split_cols(K, c_begin, cps);
      const unsigned char* raw = s_raw + slot * raw_slot + 16;
      int* keys = s_keys + slot * cps;
      int live = 0, fneg = 1 << 30;
      bool bad = false;
      // While capturing, the rules run here, or (IS_CLUSTER: one item per CTA, so the raw
      // slot is never refilled) in the consumers while they wait for K(0), off this path.
      const bool check = latch && !IS_CLUSTER;
      const int vbound = (check && valid_len) ? valid_len[t.b] : bound;
      for (int i = p; i < ncols; i += NTP) {
        const long long v = ws_raw_at(raw, idx64, i);
        int key = -1;
        if (v >= 0) {
          key = v < (long long)bound ? (int)v : bound - 1;
          live = i + 1;
        } else {
          fneg = is_imin(fneg, i);
        }
        keys[i] = key;
        if (check) bad = bad || ws_col_bad(raw, idx64, i, c_begin + i, v, vbound);
      }
      // Pad to whole tiles (cps is a multiple of KT): the consumers read keys without a
      // bound check.
      for (int i = ncols + p; i < (ncols + KT - 1) / KT * KT; i += NTP) keys[i] = -1;
      if (bad) atomicOr(latch, IS_LATCH_BIT);
      live = is_warp_max(live);
      fneg = ws_warp_min(fneg);
      if (lane == 0) {
        s_red[warp][0] = live;
        s_red[warp][1] = fneg;
      }
      named_bar_sync(BAR_PROD, NTP);
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        live = is_imax(live, s_red[w][0]);
        fneg = is_imin(fneg, s_red[w][1]);
      }
      if (p == 0) {
        s_meta[slot][0] = live;
        s_meta[slot][1] = fneg < live ? 1 : 0;
      }
      mbar_arrive(bar_keys(bars, slot));  // release: the keys and s_meta above

      // Rows: every producer thread copies chunk c of rows r0 + k RSTEP of a tile; sources
      // from this thread's chunk of row 0 of each segment (segment 1 offset by -len0 rows).
      const long long bh = t.b * Nkv + t.kvh;
      const long long base0 = bh * (long long)len0, base1 = bh * (long long)len1 - len0;
      const int ntiles = (live + KT - 1) / KT;
      if (p == 0) WS_TRACE(2);
#if IS_CLUSTER
      // Decode reads each gathered row once per call: an evict-first L2 policy lets the
      // rows leave L2 before other lines (H200: decode 0.5-1 us faster, docs/notes/index_share-history.md).
      unsigned long long evict_first;
      asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(evict_first));
#endif
      auto fill = [&](unsigned full, unsigned empty, int gi, unsigned ring, int tile,
                      const is_t* p0, const is_t* p1, int cd) {
        const int st = gi % NST, u = gi / NST;
        if (u > 0) mbar_wait(empty + 8 * st, (u - 1) & 1);
        const unsigned d = ring + st * T_BYTES + sw_off(r0, cd, TBLK);
        // Column col0 + k RSTEP, laundered so the compiler does not keep RPT column
        // constants live across the loop (spills at IS_PREG registers).
        int col0 = tile * KT + r0;
        asm volatile("" : "+r"(col0));
        int kj[RPT];
#pragma unroll
        for (int k = 0; k < RPT; ++k) kj[k] = keys[col0 + k * RSTEP];  // -1 padded to tiles
#pragma unroll
        for (int k = 0; k < RPT; ++k) {
          // A padded column (-1) copies zeros, addressing row 0 (of segment 1 if len0 is 0).
          const int kk = kj[k] > 0 ? kj[k] : 0;
          const is_t* src = (kk >= len0 ? p1 : p0) + (long long)kk * HD;
#if IS_CLUSTER
          ws_cp_async16_key(d + k * RSTEP * 128, src, kj[k], evict_first);
#else
          ws_cp_async16_key(d + k * RSTEP * 128, src, kj[k]);
#endif
        }
        cp_async_mbar_arrive(full + 8 * st);
      };
      const is_t* kp0 = k0 + base0 * HD + c * 8;
      const is_t* kp1 = k1 + base1 * HD + c * 8;
      const is_t* vp0 = v0 + base0 * HD + c * 8;
      const is_t* vp1 = v1 + base1 * HD + c * 8;
#if IS_XSPLIT
      const int cv = cl_rank == 0 ? c ^ 8 : c;  // V's 16-byte chunk c lands in the other block
#else
      const int cv = c;
#endif
      // 2. K(0).
      if (ntiles > 0)
        fill(bar_kfull(bars, 0), bar_kempty(bars, 0), gt, sbase + OFF_K, 0, kp0, kp1, c);
      // 3. Q (the first item's is on its way; IS_CLUSTER: see step 1).
#if IS_CLUSTER
      if (t.nh <= KT) load_q(t, qn);
#else
      if (r > 0) load_q(t, qn);
#endif
      // 4. The next item's index columns.
      if (r + 1 < n_rounds && item_at(r + 1) < items) fetch_index(item_at(r + 1), slot ^ 1);
      // 5. K(it + 1), V(it).
      for (int it = 0; it < ntiles; ++it) {
        if (it + 1 < ntiles)
          fill(bar_kfull(bars, 0), bar_kempty(bars, 0), gt + it + 1, sbase + OFF_K, it + 1, kp0,
               kp1, c);
        fill(bar_vfull(bars, 0), bar_vempty(bars, 0), gt + it, sbase + OFF_V, it, vp0, vp1, cv);
      }
      gt += ntiles;
      ++qn;
    }
    if (p == 0) WS_TRACE(3);
    // Stay until every copy has landed (and so has arrived on its barrier).
    is_cp_async_commit();
    is_cp_async_wait(0);
#if IS_CLUSTER
    nxrt::cluster_wait();  // phase 1 (every thread of the cluster takes part)
#elif IS_CMDS
    // The ring's copies landed (waited above): the first of the merge's two cluster barriers
    // (below), released by the copying threads themselves to the CTAs that write their
    // partials into this ring. (Ordered through the consumers too, which waited for every
    // copy on the ring's mbarriers, but compute-sanitizer's racecheck follows only a cp.async
    // wait and a barrier of the copying thread.) The producer leaves before the second
    // cluster barrier, which exited threads do not hold up. The warp reconverges first: the
    // cluster barrier is warp-aligned.
    __syncwarp();
    nxrt::cluster_arrive_release();
    nxrt::cluster_wait();
#endif
    return;
  }

  // ======== Consumers: warpgroup cw = wg - 1 owns item rows 64 cw .. 64 cw + 63.
  setmaxnreg_inc<CREG>();
  const int cw = wg - 1;
  const int ctid = tid - NTP;
  (void)ctid;  // (the split merges use it)
  const unsigned qa0 = sbase + 64 * cw * 128;  // this WG's 64 rows of Q slot 0
  const int bar_mine = BAR_PP1 + cw, bar_other = BAR_PP2 - cw;
  const int row0 = 64 * cw + 16 * wq + g;  // this thread's item rows row0 and row0 + 8
  if (cw == 0) named_bar_arrive(BAR_PP1, 2 * NTP);  // consumer 0 goes first
  int gt = 0, qn = 0;

  for (int r = 0; r < n_rounds; ++r) {
    const int item = item_at(r);
    if (item >= items) break;
    const IsTask t = task_of(item);
    const int slot = qn & 1;
    const int qslot = qn % QS;
    const unsigned qa = qa0 + qslot * Q_BYTES;
    mbar_wait(bar_keys(bars, slot), (qn >> 1) & 1);
#if IS_CLUSTER
    nxrt::cluster_wait();  // phase 1: the partner's exchange mbarriers are initialised
    if (latch) {
      // The index rules (the producer only clamped): 256 threads, while K(0) streams in.
      const unsigned char* raw = s_raw + slot * raw_slot + 16;
      const int c_begin = t.s * cps;
      const int ncols = is_split_cols(K, c_begin, cps);
      const int vbound = valid_len ? valid_len[t.b] : bound;
      bool bad = false;
      for (int i = ctid; i < ncols; i += 2 * NTP)
        bad = bad || ws_col_bad(raw, idx64, i, c_begin + i, ws_raw_at(raw, idx64, i), vbound);
      if (bad) atomicOr(latch, IS_LATCH_BIT);
    }
#endif
    const int live = s_meta[slot][0];
    const bool hole = s_meta[slot][1] != 0;
    const int* keys = s_keys + slot * cps;
    const int ntiles = (live + KT - 1) / KT;
    const bool active = 64 * cw < t.nh;  // this warpgroup has heads in the item
    const bool pp = t.nh > 64;            // both have: ping-pong

    float o[HB][32];
#pragma unroll
    for (int qb = 0; qb < HB; ++qb)
#pragma unroll
      for (int i = 0; i < 32; ++i) o[qb][i] = 0.f;
    float s[NS];
#pragma unroll
    for (int i = 0; i < NS; ++i) s[i] = 0.f;
    unsigned pa[KT / 16][4];
    float m_run[2] = {is_neg_inf(), is_neg_inf()};  // log2 domain
    float l_run[2] = {0.f, 0.f};
    float corr[2] = {1.f, 1.f};

    // Descriptors: one per operand base, then + (byte offset >> 4) per k-step (the address
    // field is bits 0-13 of addr >> 4; shared addresses stay below 256 KiB, so no carry).
    auto issue_s = [&](int st) {
      const unsigned long long dq = desc_sw128(qa, 16, 1024);
      const unsigned long long dk = desc_sw128(sbase + OFF_K + st * T_BYTES, 16, 1024);
#pragma unroll
      for (int ks = 0; ks < HD / 16; ++ks) {
        const unsigned qoff = (ks >> 2) * QBLK + (ks & 3) * 32;
        const unsigned koff = (ks >> 2) * TBLK + (ks & 3) * 32;
#if IS_KT == 128
        wg_ss128(s, dq + (qoff >> 4), dk + (koff >> 4), ks > 0 ? 1 : 0);
#else
        wg_ss(s, dq + (qoff >> 4), dk + (koff >> 4), ks > 0 ? 1 : 0);
#endif
      }
    };
    auto issue_pv = [&](int st) {
      const unsigned long long dv = desc_sw128(sbase + OFF_V + st * T_BYTES, TBLK, 1024);
#pragma unroll
      for (int kk = 0; kk < KT / 16; ++kk) {
#if IS_HD == 128
        wg_rs128(o[0], o[1], pa[kk], dv + (kk * 16 * 128 >> 4));
#else
        wg_rs(o[0], pa[kk], dv + (kk * 16 * 128 >> 4));
#endif
      }
    };
    // Online softmax of tile `tile` in place (is_attn_wg's arithmetic over KT keys): raw
    // scores become P = 2^(logit - m); m_run, l_run advance; corr is O's factor.
    // s[4 j + e] is column KT tile + 8 j + 2 tq + (e & 1) of row x = e >> 1.
    auto softmax = [&](int tile) {
      const int kc = tile * KT;
      float tmax[2] = {is_neg_inf(), is_neg_inf()};
      const bool raw = !has_bias && (tile + 1) * KT <= live && !hole;
      if (raw) {
        float t2[2][2];
#pragma unroll
        for (int x = 0; x < 2; ++x) t2[x][0] = t2[x][1] = is_neg_inf();
#pragma unroll
        for (int i = 0; i < NS; ++i) {
          const int x = (i >> 1) & 1, qq = (i >> 2) & 1;
          t2[x][qq] = fmaxf(t2[x][qq], s[i]);
        }
#pragma unroll
        for (int x = 0; x < 2; ++x) tmax[x] = __fmul_rn(fmaxf(t2[x][0], t2[x][1]), scale_log2);
      } else {
        // Branch-free: a masked column (key -1; the producer pads the key slot with -1 to
        // whole tiles) scores -inf. The thread's two rows share its column pairs: one int2
        // of keys per 8-column block j, loads capped at 4 in flight by memory clobbers (so
        // the compiler cannot hoist all of them into registers). With a bias, the thread's
        // two bias rows (a row past nh reads row 0: dropped), laundered likewise.
        const is_t* brow[2] = {nullptr, nullptr};
        if (has_bias) {
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            const int row = row0 + 8 * x < t.nh ? row0 + 8 * x : 0;
            brow[x] = bias + t.b * bsb + (long long)(t.h0 + row) * bsh + (long long)t.qi * bsq;
            asm volatile("" : "+l"(brow[x]));
          }
        }
#pragma unroll
        for (int j = 0; j < NS / 4; ++j) {
          const int2 kp = *reinterpret_cast<const int2*>(keys + kc + 8 * j + 2 * tq);
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int i = 4 * j + e, x = e >> 1;
            const int key = (e & 1) ? kp.y : kp.x;
            float v = __fmul_rn(s[i], scale_log2);
            if (has_bias)
              v = __fmaf_rn(is_to_f32(brow[x][(long long)(key > 0 ? key : 0) * bsk]), IS_LOG2E, v);
            s[i] = key >= 0 ? v : is_neg_inf();
            tmax[x] = fmaxf(tmax[x], s[i]);
          }
          if ((j & 3) == 3) asm volatile("" ::: "memory");
        }
      }
      is_softmax_step<NS>(s, tmax, raw ? scale_log2 : 1.f, m_run, l_run, corr);
    };
    auto pack = [&]() { is_acc_pack<NS>(pa, s); };
    auto rescale = [&]() { is_acc_rescale<HB>(o, corr); };

    mbar_wait(bar_q(bars, qslot), (qn / QS) & 1);
#if IS_CLUSTER
    // The rows' L (quad sums of l_run; final after the last softmax): sent ahead to the
    // partner and used by the merge. The threads that send (the active warpgroups) and the
    // partner's rank.
    float Lq[2] = {0.f, 0.f};
    const int nsrc = t.nh > 64 ? 2 * NTP : NTP;
    const unsigned peer = (unsigned)(cl_rank ^ 1);
    bool sent = false;  // IS_XSPLIT: this thread's granules left with the last P V
    // The granule block this CTA finishes (J / XH == keep): its own rank's, but o[1] in
    // both ranks with IS_XSPLIT.
    const int keep = IS_XSPLIT ? 1 : cl_rank;
    // The other half's granules (J / XH != keep) straight from registers into the partner's
    // inbox (granule row k of thread ctid at byte 16 (256 k + ctid)), completing bytes on its
    // exchange mbarrier. (Unrolled over every granule, so the register indices are constants.)
    auto send_granules = [&]() {
      const unsigned rx = nxrt::cluster_mapa(sbase + (unsigned)xin_off + 16u * ctid, peer);
      const unsigned rbar = nxrt::cluster_mapa(bar_xch(bars), peer);
#pragma unroll
      for (int J = 0; J < 8 * HB; ++J) {
        const float* v = &o[J >> 3][4 * (J & 7)];
        if (J / XH != keep) ws_st_async4(rx + 4096u * (J % XH), v[0], v[1], v[2], v[3], rbar);
      }
    };
#endif
    if (!active) {
      // Idle (the item has at most 64 heads): only the waits and releases of the loop.
      for (int it = 0; it < ntiles; ++it) {
        const int gi = gt + it, st = gi % NST;
        mbar_wait(bar_kfull(bars, st), (gi / NST) & 1);
        ws_release(bar_kempty(bars, st), lane);
        mbar_wait(bar_vfull(bars, st), (gi / NST) & 1);
        ws_release(bar_vempty(bars, st), lane);
      }
      ws_release(bar_qempty(bars, qslot), lane);
      ws_release(bar_keysempty(bars, slot), lane);
      gt += ntiles;
    } else {
      if (ntiles > 0) {
        const int st = gt % NST;
        mbar_wait(bar_kfull(bars, st), (gt / NST) & 1);
        if ((ctid & 127) == 0) WS_TRACE(4 + cw);
        fence_proxy_async();  // the landed cp.async bytes (Q too), visible to wgmma
        if (pp) named_bar_sync(bar_mine, 2 * NTP);
        wg_fence();
        issue_s(st);
        wg_commit();
        if (pp) named_bar_arrive(bar_other, 2 * NTP);
        wg_wait0();
        fence_regs(s);
        ws_release(bar_kempty(bars, st), lane);
        if (ntiles == 1) ws_release(bar_qempty(bars, qslot), lane);  // the item's S GEMMs retired
        softmax(0);
        pack();
      }
      for (int it = 0; it + 1 < ntiles; ++it) {
        const int g0 = gt + it, g1 = g0 + 1;
        const int st0 = g0 % NST, st1 = g1 % NST;
        // K(t+1) is issued before V(t) and lands first: S(t+1) goes as soon as it has, and
        // V(t) is waited for only before P(t) V(t) (docs/notes/index_share-history.md).
        mbar_wait(bar_kfull(bars, st1), (g1 / NST) & 1);
        fence_proxy_async();
        if (pp) named_bar_sync(bar_mine, 2 * NTP);
        wg_fence();
        issue_s(st1);
        wg_commit();
        rescale();  // O is no wgmma's accumulator now: P(t-1) V(t-1) retired
#pragma unroll
        for (int qb = 0; qb < HB; ++qb) fence_regs(o[qb]);
        mbar_wait(bar_vfull(bars, st0), (g0 / NST) & 1);
        fence_proxy_async();
        wg_fence();
        issue_pv(st0);
        wg_commit();
        if (pp) named_bar_arrive(bar_other, 2 * NTP);
        wg_wait1();  // S(t+1) retired; P(t) V(t) may still run
        fence_regs(s);
        ws_release(bar_kempty(bars, st1), lane);
        if (it + 2 == ntiles) ws_release(bar_qempty(bars, qslot), lane);  // the last S retired
        softmax(it + 1);
        wg_wait0();
#pragma unroll
        for (int qb = 0; qb < HB; ++qb) fence_regs(o[qb]);
        fence_regs(s);
        ws_release(bar_vempty(bars, st0), lane);
        pack();
      }
      // Q is released (the producer may load the next item's) once the item's last S GEMM
      // retired, above; an item without a tile releases it here. Every read of the keys
      // is done: their slot may take the item after next.
      if (ntiles == 0) ws_release(bar_qempty(bars, qslot), lane);
      ws_release(bar_keysempty(bars, slot), lane);
#if IS_CLUSTER
      {
        // The rows' (m, L) are final (the last softmax ran): to the partner now, on their
        // own mbarrier, so that its merge weights are computed while the last P V runs and
        // the O granules travel (H200: the stores 0.25 us earlier, docs/notes/index_share-history.md).
        Lq[0] = is_quad_sum(l_run[0]);
        Lq[1] = is_quad_sum(l_run[1]);
        if (ctid == 0) ws_mbar_expect_tx(bar_xml(bars), 16u * (unsigned)nsrc);
        ws_st_async4(nxrt::cluster_mapa(sbase + (unsigned)xin_off + 16u * ctid, peer) + 4096u * XH,
                     m_run[0], m_run[1], Lq[0], Lq[1], nxrt::cluster_mapa(bar_xml(bars), peer));
      }
#endif
      if (ntiles > 0) {
        const int gl = gt + ntiles - 1, st = gl % NST;
        mbar_wait(bar_vfull(bars, st), (gl / NST) & 1);
        fence_proxy_async();
        rescale();
#pragma unroll
        for (int qb = 0; qb < HB; ++qb) fence_regs(o[qb]);
        wg_fence();
#if IS_XSPLIT
        // The last P V as two m64n64 halves (the same bits as one m64n128), o[0] (the
        // partner's half, see IS_XSPLIT) first: its granules leave by st.async while o[1]'s
        // half runs (granule J is o[J / 8], XH = 8).
        const unsigned long long dv = desc_sw128(sbase + OFF_V + st * T_BYTES, TBLK, 1024);
#pragma unroll
        for (int kk = 0; kk < KT / 16; ++kk) wg_rs(o[0], pa[kk], dv + (kk * 16 * 128 >> 4));
        wg_commit();
#pragma unroll
        for (int kk = 0; kk < KT / 16; ++kk)
          wg_rs(o[1], pa[kk], dv + ((TBLK + kk * 16 * 128) >> 4));
        wg_commit();
        wg_wait1();
        fence_regs(o[0]);
        send_granules();  // keep = 1: exactly o[0], final here (o[1] is still accumulating)
        sent = true;
#else
        issue_pv(st);
        wg_commit();
#endif
        wg_wait0();
#pragma unroll
        for (int qb = 0; qb < HB; ++qb) fence_regs(o[qb]);
        ws_release(bar_vempty(bars, st), lane);
        gt += ntiles;
      }
    }
    if ((ctid & 127) == 0) WS_TRACE(6 + cw);
    ++qn;

#if IS_CLUSTER
    // ---- The split merge with the partner CTA (rank = split; see the header). Each thread
    // owns float4 granules of O (J = 0 .. 8 HB - 1: rows g, g + 8 of its warp's slab, two
    // adjacent columns of block J); granules J / XH == keep are the half this CTA finishes
    // (channels HD / 2 rank .. + HD / 2 - 1; in o[1] with IS_XSPLIT). The other half goes
    // straight from registers to the partner's inbox by st.async (granule row k of thread
    // ctid at byte 16 (256 k + ctid)), completing bytes on its exchange mbarrier (IS_XSPLIT:
    // already sent with the last P V); the thread's (m0, m1, L0, L1) went ahead to inbox row
    // XH (on bar_xml, before the last P V). The inbox is a region no loop uses, so each warp
    // sends as soon as its own O is final, and the thread with the same ctid in the partner
    // (the same rows and columns) finishes from its registers and the inbox.
    if (active) {
      if (ctid == 0) ws_mbar_expect_tx(bar_xch(bars), XH * 16u * (unsigned)nsrc);
      if (!sent) send_granules();
      const float4* xi = reinterpret_cast<const float4*>(smem + xin_off) + ctid;
      // The partner's (m, L) landed: the weights. Then its granules (below). (A CTA leaves
      // only after both waits, so no CTA exits while its partner still writes into it; the
      // sender's st.asyncs come from registers, so it may leave with its own in flight.)
      mbar_wait(bar_xml(bars), 0);
      const float4 pml = xi[256 * XH];
      const float mo[2] = {pml.x, pml.y}, lo[2] = {pml.z, pml.w};
      float w0[2], w1[2], wl[2], wi[2];
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        // is_finish_if_last_v4's weights and normaliser, split 0 first.
        const float m0 = cl_rank == 0 ? m_run[x] : mo[x], m1 = cl_rank == 0 ? mo[x] : m_run[x];
        const float l0 = cl_rank == 0 ? Lq[x] : lo[x], l1 = cl_rank == 0 ? lo[x] : Lq[x];
        const float M = fmaxf(fmaxf(is_neg_inf(), m0), m1);
        float a0 = 0.f, a1 = 0.f, L = 0.f;
        if (M != is_neg_inf()) {
          a0 = exp2f(m0 - M);
          L = __fmaf_rn(l0, a0, L);
          a1 = exp2f(m1 - M);
          L = __fmaf_rn(l1, a1, L);
        }
        w0[x] = a0;
        w1[x] = a1;
        wl[x] = L;
        wi[x] = is_recip(L);
      }
      mbar_wait(bar_xch(bars), 0);  // the partner's granules
      if ((ctid & 127) == 0) WS_TRACE(8 + cw);
      // O = (o0 a0 + o1 a1) / L as is_finish_if_last_v4 rounds it (explicit FMAs, then
      // times 1 / L): the same bits as every other merge of the plan. out[c][x]: the bf16
      // pair of row g + 8 x, columns 8 (rank XH + c) + 2 tq + {0, 1}.
      unsigned out[XH][2];
#pragma unroll
      for (int J = 0; J < 8 * HB; ++J) {
        if (J / XH != keep) continue;
        const int c = J % XH;
        const float* v = &o[J >> 3][4 * (J & 7)];
        const float4 ot = xi[256 * c];
        const float own4[4] = {v[0], v[1], v[2], v[3]}, oth4[4] = {ot.x, ot.y, ot.z, ot.w};
#pragma unroll
        for (int x = 0; x < 2; ++x) {
          const float* p0 = cl_rank == 0 ? own4 : oth4;
          const float* p1 = cl_rank == 0 ? oth4 : own4;
          const float ea = __fmaf_rn(p1[2 * x], w1[x], __fmaf_rn(p0[2 * x], w0[x], 0.f));
          const float eb = __fmaf_rn(p1[2 * x + 1], w1[x], __fmaf_rn(p0[2 * x + 1], w0[x], 0.f));
          out[c][x] = is_pack2(is_norm(ea, wl[x], wi[x]), is_norm(eb, wl[x], wi[x]));
        }
      }
      if ((ctid & 127) == 0) WS_TRACE(12 + cw);
      const long long yrow0 = (t.b * N + t.h0 + row0 - g) * (long long)Sq + t.qi;  // warp row 0
      if (pp) {
        // Both warpgroups store (twice the stores of 64 heads, where 4-byte pieces of 8 rows
        // per instruction cost more than a shared-memory round trip, H200): the warp's own
        // inbox slots (rows 0 .. XH / 2 - 1 of its 32 columns, read above) stage its 16 rows
        // x XH 16-byte chunks, chunk c of row r at unit r XH + (c ^ (r % XH)) (conflict-free
        // writes at XH 8, two-way at XH 4), and go out as whole 16-byte chunks of
        // consecutive columns.
        __syncwarp();
        unsigned* stage = reinterpret_cast<unsigned*>(smem + xin_off) + 4 * 32 * (ctid >> 5);
        auto unit = [&](int u) { return 4 * (256 * (u >> 5) + (u & 31)); };  // in words
#pragma unroll
        for (int c = 0; c < XH; ++c)
#pragma unroll
          for (int x = 0; x < 2; ++x) {
            const int r = g + 8 * x;
            stage[unit(r * XH + (c ^ (r % XH))) + tq] = out[c][x];
          }
        __syncwarp();
        if ((ctid & 127) == 0) WS_TRACE(14 + cw);
#pragma unroll
        for (int k = 0; k < 16 * XH / 32; ++k) {
          const int u = lane + 32 * k, r = u / XH, c = (u % XH) ^ (r % XH);
          const uint4 val = *reinterpret_cast<const uint4*>(stage + unit(u));
          if (row0 - g + r < t.nh)
            *reinterpret_cast<uint4*>(y + (yrow0 + r * (long long)Sq) * HD +
                                      8 * (cl_rank * XH + c)) = val;
        }
      } else {
#pragma unroll
        for (int c = 0; c < XH; ++c)
#pragma unroll
          for (int x = 0; x < 2; ++x)
            if (row0 + 8 * x < t.nh)
              *reinterpret_cast<unsigned*>(y + (yrow0 + (g + 8 * x) * (long long)Sq) * HD +
                                           8 * (cl_rank * XH + c) + 2 * tq) = out[c][x];
      }
    }
    if ((ctid & 127) == 0) WS_TRACE(10 + cw);
    (void)part_o;
    (void)part_ml;
    (void)counters;
#else
    // ---- The item's rows (one split) or partials (is_attn_wg's stores).
#if IS_CMDS
    // Every CTA of the cluster is done with its ring (its consumers' last wgmma retired, its
    // producer's copies landed: the producer takes part in this barrier, see there): from
    // here the rings hold the partials. (Reconverged first: the barrier is warp-aligned.)
    __syncwarp();
    nxrt::cluster_arrive_release();
    nxrt::cluster_wait();
    // The ring of each rank (O at [split][row][HD / C] floats, (m, L) pairs after them).
    unsigned xring[IS_CMERGE];
#pragma unroll
    for (int k = 0; k < IS_CMERGE; ++k) xring[k] = nxrt::cluster_mapa(sbase + OFF_K, (unsigned)k);
#endif
    if (active) {
#pragma unroll
      for (int x = 0; x < 2; ++x) {
        const int row = row0 + 8 * x;
        const float L = is_quad_sum(l_run[x]);
        if (row >= t.nh) continue;
        if (S == 1) {
          // One reciprocal per row (a divide per element cost ~15 % of the consumers'
          // instructions per item); a row that saw no key (L = 0, O = 0) gives zeros.
          const float inv = L > 0.f ? 1.f / L : 0.f;
          is_t* yr = y + ((t.b * N + t.h0 + row) * (long long)Sq + t.qi) * HD + 2 * tq;
#pragma unroll
          for (int qb = 0; qb < HB; ++qb)
#pragma unroll
            for (int j = 0; j < 8; ++j)
              *reinterpret_cast<unsigned*>(yr + 64 * qb + 8 * j) =
                  is_pack2(o[qb][4 * j + 2 * x] * inv, o[qb][4 * j + 2 * x + 1] * inv);
        } else {
#if IS_CMDS
          // Channel 64 qb + 8 j + 2 tq (+1) is finished by rank (64 qb + 8 j) / CW.
          constexpr int CW = HD / IS_CMERGE;
          const unsigned orow = (unsigned)((cl_rank * BM + row) * CW) * 4u;
#pragma unroll
          for (int qb = 0; qb < HB; ++qb)
#pragma unroll
            for (int j = 0; j < 8; ++j) {
              const int ch = 64 * qb + 8 * j;
              nxrt::st_cluster_f32x2(xring[ch / CW] + orow + (unsigned)(ch % CW + 2 * tq) * 4u,
                                     o[qb][4 * j + 2 * x], o[qb][4 * j + 2 * x + 1]);
            }
          if (tq == 0) {
            const unsigned oml = (unsigned)(BM * HD * 4 + (cl_rank * BM + row) * 8);
#pragma unroll
            for (int k = 0; k < IS_CMERGE; ++k) nxrt::st_cluster_f32x2(xring[k] + oml, m_run[x], L);
          }
#else
          is_acc_store_partial<HB>(o, x, m_run[x], L, part_o, part_ml,
                                   is_prow(t.b, t.qi, Sq, N, t.h0 + row, S, t.s), tq);
#endif
        }
      }
    }
#if IS_CMERGE
    {
      // Every CTA of the cluster has written its partials (each thread's stores are ordered
      // before the barrier by its release arrive, the reads below after it by the acquire
      // wait; the producer threads have left or leave without touching memory again): this
      // CTA finishes channels CW rank .. CW rank + CW - 1 of the task's rows from the C
      // partials in L2 (IS_CMDS: in its own ring, written there by the partners before the
      // second barrier), a thread per (row, half of those channels): every load (C (m, l)
      // pairs, C x CT values) issued at once, one L2 round trip; then is_merge_batched's
      // arithmetic (the weights once per row: the same values for every channel).
      __syncwarp();  // (the stores above diverge; the cluster barrier is warp-aligned)
      nxrt::cluster_arrive_release();
      nxrt::cluster_wait();
      constexpr int C = IS_CMERGE;
      constexpr int CW = HD / C, CT = CW / 2, NV = CT / 4;  // channels per CTA, thread; float4s
      const int r = ctid >> 1;
      if (r < t.nh) {
        const int d0 = cl_rank * CW + (ctid & 1) * CT;
        float mv[C], lv[C];
        float4 ov[C][NV];
#if IS_CMDS
        // From this CTA's ring (IS_CMDS above).
        const float* xo = reinterpret_cast<const float*>(smem + OFF_K);
#pragma unroll
        for (int sp = 0; sp < C; ++sp) {
          const float2 ml = reinterpret_cast<const float2*>(xo + BM * HD)[sp * BM + r];
          mv[sp] = ml.x;
          lv[sp] = ml.y;
#pragma unroll
          for (int v = 0; v < NV; ++v)
            ov[sp][v] = reinterpret_cast<const float4*>(xo + (sp * BM + r) * CW + (ctid & 1) * CT)[v];
        }
#else
        const long long prow = is_prow(t.b, t.qi, Sq, N, t.h0 + r, C, 0);  // split 0
#pragma unroll
        for (int sp = 0; sp < C; ++sp) {
          mv[sp] = __ldcg(part_ml + 2 * (prow + sp));
          lv[sp] = __ldcg(part_ml + 2 * (prow + sp) + 1);
#pragma unroll
          for (int v = 0; v < NV; ++v)
            ov[sp][v] = __ldcg(reinterpret_cast<const float4*>(part_o + (prow + sp) * HD + d0) + v);
        }
#endif
        float M = is_neg_inf();
#pragma unroll
        for (int sp = 0; sp < C; ++sp) M = fmaxf(M, mv[sp]);
        float L = 0.f, oc[CT];
#pragma unroll
        for (int c = 0; c < CT; ++c) oc[c] = 0.f;
        if (M != is_neg_inf()) {
#pragma unroll
          for (int sp = 0; sp < C; ++sp) {
            const float a = exp2f(mv[sp] - M);
            L = __fmaf_rn(lv[sp], a, L);
#pragma unroll
            for (int v = 0; v < NV; ++v) {
              oc[4 * v] = __fmaf_rn(ov[sp][v].x, a, oc[4 * v]);
              oc[4 * v + 1] = __fmaf_rn(ov[sp][v].y, a, oc[4 * v + 1]);
              oc[4 * v + 2] = __fmaf_rn(ov[sp][v].z, a, oc[4 * v + 2]);
              oc[4 * v + 3] = __fmaf_rn(ov[sp][v].w, a, oc[4 * v + 3]);
            }
          }
        }
        const float inv = is_recip(L);
        unsigned pk[CT / 2];
#pragma unroll
        for (int c = 0; c < CT / 2; ++c)
          pk[c] = is_pack2(is_norm(oc[2 * c], L, inv), is_norm(oc[2 * c + 1], L, inv));
        is_t* yr = y + ((t.b * N + t.h0 + r) * (long long)Sq + t.qi) * HD + d0;
        if constexpr (CT >= 8) {
#pragma unroll
          for (int u = 0; u < CT / 8; ++u)
            reinterpret_cast<uint4*>(yr)[u] =
                make_uint4(pk[4 * u], pk[4 * u + 1], pk[4 * u + 2], pk[4 * u + 3]);
        } else {
          *reinterpret_cast<uint2*>(yr) = make_uint2(pk[0], pk[1]);
        }
      }
    }
    (void)counters;
#elif !IS_Q2
    if (S > 1 && counters)
      is_finish_if_last_v4_by<2 * NTP, HD>(counters, t.task, S, part_o, part_ml, y, t.b, t.qi, Sq,
                                           N, t.h0, t.nh, &s_flag, s_w, ctid,
                                           [] { named_bar_sync(BAR_CONS, 2 * NTP); });
#endif
#endif  // IS_CLUSTER
  }
  (void)H;
  (void)lpk;
  (void)stages;
}
