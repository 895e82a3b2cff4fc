// lab/trace_index_share.py's stand-in for attnrt/ops/cuda/index_share_trace.cuh (whose
// WS_TRACE hooks the shipped index_share_ws.cu builds compile to nothing).
//
// Phase stamp k (0-15) of this CTA: 0 start, 1 index columns landed, 2 keys staged,
// 3 producer done issuing, 4 + w K(0) and Q landed, 6 + w loop done, 8 + w the partner's
// half landed, 10 + w rows stored, 12 + w combined, 14 + w staged for the stores (w: the
// consumer warpgroup; stamped by thread 0 of the producer or of warpgroup w). CTA c's
// stamps are part_o's u64 words 32 c + k (%globaltimer, ns) and 32 c + 16 + k (%clock64, the
// SM's cycle counter: with the first, the SM clock the CTA ran at); none when part_o is null.
// Stamp 1 (WS_TRACE_SM) also keeps only 56 bits of its cycle count and carries the CTA's SM
// (%smid) in the top 8 (read at stamp 0 instead, it cost the XSPLIT trace build its wgmma
// pipelining: C7511 under NVRTC 13.5).
#pragma once

#if !IS_CLUSTER
#error "IS_TRACE stamps into part_o, which only the cluster build (IS_CLUSTER) leaves unused"
#endif

#define WS_TRACE_(k, sm)                                                         \
  do {                                                                           \
    unsigned long long t_, c_;                                                   \
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t_));                     \
    asm volatile("mov.u64 %0, %%clock64;\n" : "=l"(c_));                         \
    if (sm) {                                                                    \
      unsigned sm_;                                                              \
      asm volatile("mov.u32 %0, %%smid;\n" : "=r"(sm_));                         \
      c_ = (c_ & ((1ull << 56) - 1)) | ((unsigned long long)(sm_ & 0xFF) << 56); \
    }                                                                            \
    if (part_o) {                                                                \
      unsigned long long* w_ = reinterpret_cast<unsigned long long*>(part_o) + 32 * blockIdx.x; \
      w_[k] = t_;                                                                \
      w_[16 + (k)] = c_;                                                         \
    }                                                                            \
  } while (0)
#define WS_TRACE(k) WS_TRACE_(k, false)
#define WS_TRACE_SM(k) WS_TRACE_(k, true)
