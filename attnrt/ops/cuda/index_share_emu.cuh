// Host emulation of the CUDA features the IndexShare kernels use, for the CPU tests only
// (g++ -DNXRT_EMU, built into a shared library and driven through ctypes). Never part of
// a device build: index_share_common.cuh includes it only under NXRT_EMU.
//
// Each CUDA thread is a fiber (ucontext to start, _setjmp/_longjmp to switch); blocks run
// one after another. Warp collectives (shuffles, votes, ldmatrix, mma) exchange values
// through per-warp slots between two warp barriers, so a collective that not all 32 lanes
// reach deadlocks and is reported, as is a __syncthreads() some threads skip. cp.async
// copies are deferred until the matching wait_group, so a missing wait reads stale data.
#pragma once
#include <cmath>
#include <csetjmp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <ucontext.h>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __shared__ static

struct __half { unsigned short x; };
struct __nv_bfloat16 { unsigned short x; };
struct __half2 { __half x, y; };
struct __nv_bfloat162 { __nv_bfloat16 x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(8) float2 { float x, y; };
inline float2 make_float2(float a, float b) { return float2{a, b}; }
struct alignas(16) float4 { float x, y, z, w; };
inline float4 make_float4(float a, float b, float c, float d) { return float4{a, b, c, d}; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }  // one rounding each, as on the device
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }

inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline float __half2float(__half h) { _Float16 v; std::memcpy(&v, &h.x, 2); return (float)v; }
inline __half __float2half_rn(float f) { _Float16 v = (_Float16)f; __half h; std::memcpy(&h.x, &v, 2); return h; }
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline float __bfloat162float(__nv_bfloat16 b) { return __uint_as_float((unsigned)b.x << 16); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  unsigned x = __float_as_uint(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{(unsigned short)((x >> 16) | 0x40)};
  x += 0x7fffu + ((x >> 16) & 1u);
  return __nv_bfloat16{(unsigned short)(x >> 16)};
}
inline __half2 __floats2half2_rn(float a, float b) { return __half2{__float2half_rn(a), __float2half_rn(b)}; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return __nv_bfloat162{__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
using std::exp2f;
using std::fmaxf;
using std::isfinite;

namespace emu {

struct Dim3 { unsigned x = 1, y = 1, z = 1; };
struct CpCopy { void* dst; const void* src; int n; };

struct Fiber {
  ucontext_t uc;
  jmp_buf jb;
  std::vector<char> stack;
  bool started = false, done = false;
  Dim3 tid;
  std::vector<std::vector<CpCopy>> groups;  // committed cp.async groups, oldest first
  std::vector<CpCopy> open;                 // not yet committed
};

struct Warp {
  int arrived = 0;
  unsigned gen = 0;
  alignas(16) unsigned char slot[32][160];
};

struct State {
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  jmp_buf sched;
  jmp_buf bail;  // fail() jumps back to the exported launch entry
  int cur = -1;
  int block_arrived = 0;
  unsigned block_gen = 0;
  Dim3 grid, block, bid;
  std::vector<unsigned char> dyn;
  long long progress = 0;
  void (*body)(void*) = nullptr;
  void* arg = nullptr;
  char error[256] = {0};
};

inline State& st() { static State s; return s; }
inline Fiber& me() { return st().fibers[st().cur]; }

[[noreturn]] inline void fail(const char* msg) {
  std::snprintf(st().error, sizeof st().error, "%s", msg);
  _longjmp(st().bail, 1);
}

inline void yield() {
  if (!_setjmp(me().jb)) _longjmp(st().sched, 1);
}

inline void trampoline() {
  st().body(st().arg);
  me().done = true;
  st().progress++;
  _longjmp(st().sched, 1);
}

inline void warp_barrier() {
  Warp& w = st().warps[st().cur / 32];
  const unsigned g = w.gen;
  if (++w.arrived == 32) {
    w.arrived = 0;
    w.gen++;
    st().progress++;
    return;
  }
  while (w.gen == g) yield();
}

inline void block_barrier() {
  State& s = st();
  const unsigned g = s.block_gen;
  if (++s.block_arrived == (int)s.fibers.size()) {
    s.block_arrived = 0;
    s.block_gen++;
    s.progress++;
    return;
  }
  while (s.block_gen == g) yield();
}

inline int lane() { return st().cur & 31; }
inline unsigned char* my_slot() { return st().warps[st().cur / 32].slot[lane()]; }
inline unsigned char* slot_of(int l) { return st().warps[st().cur / 32].slot[l]; }

template <typename T>
T exchange(T v, int src_lane) {
  static_assert(sizeof(T) <= 160, "slot too small");
  std::memcpy(my_slot(), &v, sizeof(T));
  warp_barrier();
  T out;
  std::memcpy(&out, slot_of(src_lane & 31), sizeof(T));
  warp_barrier();
  return out;
}

// Every lane's value, in one exchange (two warp barriers).
template <typename T>
void gather_all(const T& mine, T* all) {
  static_assert(sizeof(T) <= 160, "slot too small");
  std::memcpy(my_slot(), &mine, sizeof(T));
  warp_barrier();
  for (int i = 0; i < 32; ++i) std::memcpy(&all[i], slot_of(i), sizeof(T));
  warp_barrier();
}

inline void cp_flush_groups(size_t keep) {
  auto& gs = me().groups;
  while (gs.size() > keep) {
    for (auto& c : gs.front()) {
      if (c.n) std::memcpy(c.dst, c.src, 16);
      else std::memset(c.dst, 0, 16);
    }
    gs.erase(gs.begin());
  }
}

// Run `body(arg)` for every thread of every block.
inline void launch(Dim3 grid, Dim3 block, size_t smem, void (*body)(void*), void* arg) {
  State& s = st();
  const unsigned nthreads = block.x * block.y * block.z;
  if (nthreads % 32) fail("block size must be a multiple of 32");
  s.grid = grid;
  s.block = block;
  s.body = body;
  s.arg = arg;
  s.dyn.assign(smem + 16, 0xA5);  // poisoned: kernels must not read what they did not write
  s.fibers.clear();
  s.fibers.resize(nthreads);
  s.warps.assign(nthreads / 32, Warp());
  for (auto& f : s.fibers) f.stack.resize(256 * 1024);
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        s.bid = Dim3{bx, by, bz};
        s.block_arrived = 0;
        for (unsigned i = 0; i < nthreads; ++i) {
          Fiber& f = s.fibers[i];
          f.started = f.done = false;
          f.groups.clear();
          f.open.clear();
          f.tid = Dim3{i % block.x, (i / block.x) % block.y, i / (block.x * block.y)};
          getcontext(&f.uc);
          f.uc.uc_stack.ss_sp = f.stack.data();
          f.uc.uc_stack.ss_size = f.stack.size();
          f.uc.uc_link = nullptr;
          makecontext(&f.uc, trampoline, 0);
        }
        for (auto& w : s.warps) { w.arrived = 0; }
        bool all_done = false;
        while (!all_done) {
          const long long before = s.progress;
          all_done = true;
          for (unsigned i = 0; i < nthreads; ++i) {
            Fiber& f = s.fibers[i];
            if (f.done) continue;
            all_done = false;
            s.cur = (int)i;
            if (!_setjmp(s.sched)) {
              if (!f.started) {
                f.started = true;
                ucontext_t here;
                swapcontext(&here, &f.uc);
              } else {
                _longjmp(f.jb, 1);
              }
            }
          }
          if (!all_done && s.progress == before) {
            // Nobody passed a barrier in a whole round: threads wait on ones that left.
            static char msg[128];
            std::snprintf(msg, sizeof msg, "deadlock in block (%u,%u,%u): a barrier or warp "
                          "collective was not reached by every thread", bx, by, bz);
            fail(msg);
          }
        }
        s.cur = -1;
      }
}

template <typename... A>
struct Call {
  void (*fn)(A...);
  std::tuple<A...> args;
  static void run(void* p) {
    auto* c = static_cast<Call*>(p);
    std::apply(c->fn, c->args);
  }
};

template <typename T>
T read_arg(void* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename... A, size_t... I>
std::tuple<A...> unpack(void** args, std::index_sequence<I...>) {
  return std::tuple<A...>(read_arg<A>(args[I])...);
}

template <typename... A>
int launch_kernel(void (*fn)(A...), void** args, unsigned gx, unsigned gy, unsigned gz,
                  unsigned bx, unsigned by, unsigned bz, size_t smem) {
  static Call<A...> c;  // static: survives a bail-out longjmp
  c = Call<A...>{fn, unpack<A...>(args, std::index_sequence_for<A...>{})};
  st().error[0] = 0;
  if (_setjmp(st().bail)) {
    st().cur = -1;
    return 1;
  }
  launch(Dim3{gx, gy, gz}, Dim3{bx, by, bz}, smem, &Call<A...>::run, &c);
  return 0;
}

template <typename... A>
int param_sizes(void (*)(A...), int* out) {
  int sizes[] = {(int)sizeof(A)..., 0};
  for (size_t i = 0; i < sizeof...(A); ++i) out[i] = sizes[i];
  return (int)sizeof...(A);
}

}  // namespace emu

#define threadIdx (emu::me().tid)
#define blockIdx (emu::st().bid)
#define blockDim (emu::st().block)
#define gridDim (emu::st().grid)

inline unsigned char* emu_dynamic_smem() { return emu::st().dyn.data(); }
// The kernel's own account of the dynamic shared memory it uses must fit the launch's.
inline void emu_check_dynamic_smem(size_t need) {
  if (need + 16 > emu::st().dyn.size()) emu::fail("kernel needs more dynamic shared memory than launched");
}
inline void __syncthreads() { emu::block_barrier(); }
template <typename T>
inline T __shfl_xor_sync(unsigned, T v, int mask) { return emu::exchange(v, emu::lane() ^ mask); }
template <typename T>
inline T __shfl_sync(unsigned, T v, int src) { return emu::exchange(v, src); }
inline int __any_sync(unsigned, int p) {
  int v[32], any = 0;
  emu::gather_all(p ? 1 : 0, v);
  for (int i = 0; i < 32; ++i) any |= v[i];
  return any;
}
inline int __all_sync(unsigned, int p) {
  int v[32], all = 1;
  emu::gather_all(p ? 1 : 0, v);
  for (int i = 0; i < 32; ++i) all &= v[i];
  return all;
}
inline unsigned atomicOr(unsigned* p, unsigned v) { unsigned o = *p; *p |= v; return o; }
inline int atomicMax(int* p, int v) { int o = *p; if (v > o) *p = v; return o; }
inline unsigned atomicAdd(unsigned* p, unsigned v) { unsigned o = *p; *p += v; return o; }
inline void __threadfence() {}  // blocks run one after another: stores are already visible
inline float __ldcg(const float* p) { return *p; }
inline float4 __ldcg(const float4* p) { return *p; }

inline void emu_cp_async16(void* dst, const void* src, int n) {
  if (reinterpret_cast<uintptr_t>(dst) % 16) emu::fail("cp.async destination not 16-byte aligned");
  if (n && reinterpret_cast<uintptr_t>(src) % 16) emu::fail("cp.async source not 16-byte aligned");
  emu::me().open.push_back(emu::CpCopy{dst, src, n});
}
inline void emu_cp_async_commit() {
  emu::me().groups.push_back(emu::me().open);
  emu::me().open.clear();
}
inline void emu_cp_async_wait(int n) { emu::cp_flush_groups((size_t)n); }

// ldmatrix .x4: lane l addresses row (l & 7) of matrix (l >> 3).
inline void emu_ldmatrix_x4(unsigned* r, const void* p, bool trans) {
  if (reinterpret_cast<uintptr_t>(p) % 16) emu::fail("ldmatrix row address not 16-byte aligned");
  const unsigned char* rows[32];
  const unsigned char* mine = static_cast<const unsigned char*>(p);
  emu::gather_all(mine, rows);
  const int l = emu::lane();
  for (int j = 0; j < 4; ++j) {
    unsigned short e0, e1;
    if (!trans) {  // row l/4, columns 2(l%4), 2(l%4)+1
      std::memcpy(&e0, rows[j * 8 + l / 4] + (l % 4) * 4, 2);
      std::memcpy(&e1, rows[j * 8 + l / 4] + (l % 4) * 4 + 2, 2);
    } else {  // rows 2(l%4), 2(l%4)+1 at column l/4
      std::memcpy(&e0, rows[j * 8 + 2 * (l % 4)] + (l / 4) * 2, 2);
      std::memcpy(&e1, rows[j * 8 + 2 * (l % 4) + 1] + (l / 4) * 2, 2);
    }
    r[j] = (unsigned)e0 | ((unsigned)e1 << 16);
  }
}

inline float emu_half_bits(unsigned short u, int dtype) {
  return dtype == 1 ? __half2float(__half{u}) : __bfloat162float(__nv_bfloat16{u});
}

// m16n8k16 row.col, fragments as in the PTX ISA ("Matrix Fragments for mma.m16n8k16").
inline void emu_mma16816(float* d, const unsigned* a, unsigned b0, unsigned b1, int dtype) {
  struct Frag { unsigned a[4], b[2]; float c[4]; };
  Frag mine{{a[0], a[1], a[2], a[3]}, {b0, b1}, {d[0], d[1], d[2], d[3]}};
  Frag all[32];
  emu::gather_all(mine, all);
  auto A = [&](int row, int col) {  // a_i: row g (+8 for i%4 >= 2), col 2t (+8 for i >= 4)
    const int g = row % 8, tq = (col % 8) / 2;
    const int reg = (row >= 8 ? 1 : 0) + (col >= 8 ? 2 : 0);
    const unsigned w = all[g * 4 + tq].a[reg];
    return emu_half_bits((unsigned short)((col & 1) ? (w >> 16) : (w & 0xffff)), dtype);
  };
  auto B = [&](int k, int n) {  // b_i: row (k) 2t (+8 for i >= 2), col (n) g
    const int tq = (k % 8) / 2;
    const unsigned w = all[n * 4 + tq].b[k >= 8 ? 1 : 0];
    return emu_half_bits((unsigned short)((k & 1) ? (w >> 16) : (w & 0xffff)), dtype);
  };
  const int l = emu::lane(), g = l / 4, tq = l % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = g + (i >= 2 ? 8 : 0), col = tq * 2 + (i & 1);
    float acc = mine.c[i];
    for (int k = 0; k < 16; ++k) acc += A(row, k) * B(k, col);
    d[i] = acc;
  }
}

#define IS_EMU_EXPORT(name)                                                                  \
  extern "C" int emu_launch_##name(void** args, unsigned gx, unsigned gy, unsigned gz,        \
                                   unsigned bx, unsigned by, unsigned bz, size_t smem) {      \
    return emu::launch_kernel(name, args, gx, gy, gz, bx, by, bz, smem);                      \
  }                                                                                           \
  extern "C" const char* emu_error_##name() { return emu::st().error; }                       \
  extern "C" int emu_params_##name(int* out) { return emu::param_sizes(name, out); }
