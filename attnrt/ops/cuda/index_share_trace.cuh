// The phase boundaries of index_share_ws.cu that lab/trace_index_share.py stamps: no-ops
// here. The tool compiles the kernel with lab/index_share_trace.cuh in this header's place,
// whose WS_TRACE(k) stores %globaltimer and %clock64 as stamp k (0-15) of the CTA, and
// WS_TRACE_SM(k) the CTA's SM too (see there for the stamps and their layout).
#pragma once

#define WS_TRACE(k) \
  do {              \
  } while (0)
#define WS_TRACE_SM(k) WS_TRACE(k)
