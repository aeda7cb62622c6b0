// The wide family (forward_wide.cu, backward_wide.cu): channels-first rows
// of whole aligned 16-byte vectors (the streaming family's rows) for widths
// past the streaming family's templates, W > 16, at a run-time width.
//
// A block's kWideWarps warps take consecutive channels of one batch row over
// the same span of kWideSpan chunks (as in stream.cuh). Per chunk of
// kWideChunk steps a warp stages its window of inputs once into its own
// shared memory as floats (coalesced 16-byte loads), then lane l computes
// the kWideR consecutive outputs from step c0 + kWideR * l: kWideR
// accumulators, the taps in groups of 8 over a sliding window of inputs in
// registers (8 new inputs and 8 taps, both from shared memory, per 8 x
// kWideR multiply-adds). Staged index e is stored at WideAt(e) = e + e / 32,
// so that the lanes' reads (runs kWideR apart) and the staging stores (whole
// vectors) fall in distinct banks. No block barrier: each warp owns its
// shared memory.
//
// seq_idx: the ids are staged beside x. A chunk whose window holds one live
// id takes the plain taps; otherwise the outputs are computed in passes, one
// per id of a lane's run (usually one): pass s reads the window with the
// inputs of other ids as zeros, and keeps the outputs whose id is s.
#pragma once

#include "stream.cuh"

namespace jcc::cuda {

constexpr int kWideWarps = kStreamWarps;      // warps (channels) per block
constexpr int kWideR = 16;                    // outputs per lane run
constexpr int kWideChunk = 32 * kWideR;       // steps per warp chunk
constexpr int kWideSpan = 8;                  // chunks per warp span (the backward's partial sums)
static_assert(kWideChunk * kWideSpan >= 4096, "BackwardChunkSteps of W > 16 (csrc/problem.h)");

__host__ __device__ constexpr int WideAt(int e) { return e + (e >> 5); }
// Staged halo: H = W - 1 rounded up to whole runs (and so to whole vectors).
__host__ __device__ constexpr int WideHalo(int W) { return (W - 1 + kWideR - 1) / kWideR * kWideR; }

// A warp's shared memory, in 4-byte words: the staged inputs (xs), the
// backward's g (gs), the taps, the backward's dweight sums (dws), the ids.
struct WideSmem {
  int nx, ng;                   // staged steps of x and of g
  int xs, gs, taps, dws, ids;   // offsets
  int words;                    // per warp
  __host__ __device__ WideSmem(int W, bool backward, bool masked) {
    const int hp = WideHalo(W);
    nx = backward ? 2 * hp + kWideChunk : hp + kWideChunk;
    ng = backward ? kWideChunk + hp : 0;
    xs = 0;
    gs = xs + WideAt(nx) + 1;
    taps = gs + (backward ? WideAt(ng) + 1 : 0);
    dws = taps + W;
    ids = dws + (backward ? W : 0);
    words = ids + (masked ? nx : 0);
  }
};

// xs[WideAt(e)] = the input at step o + e, e < n (o and n whole vectors):
// before step 0 the initial states or zeros, past the row's end zeros.
// Every lane issues kU loads before it stores any.
template <typename T>
__device__ __forceinline__ void StageWideX(const ConvArgs& a, const T* xrow, int64_t b, int64_t d, int64_t o,
                                           int n, float* xs) {
  constexpr int N = 16 / int(sizeof(T)), kU = 4;
  const int lane = threadIdx.x & 31, nv = n / N;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int v0 = 0; v0 < nv; v0 += 32 * kU) {
    uint4 raw[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int v = v0 + u * 32 + lane;
      const int64_t t = o + int64_t(v) * N;
      raw[u] = v >= nv || t >= a.len ? zero : (t >= 0 ? LoadRaw16(xrow + t) : LoadVectorBefore<T>(a, xrow, b, d, t));
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int v = v0 + u * 32 + lane;
      if (v >= nv) break;
      float f[N];
      Unpack<T, N>(raw[u], f);
#pragma unroll
      for (int i = 0; i < N; ++i) xs[WideAt(v * N + i)] = f[i];
    }
  }
}

// ids[e] = the id of step o + e, e < n (HistoryId before step 0, kNoId past
// the end). Returns, warp-uniform, whether steps [o + lo, o + n) all hold
// one live id.
__device__ __forceinline__ bool StageWideIds(const ConvArgs& a, int64_t b, int64_t o, int n, int lo,
                                             int32_t hist, int32_t* ids) {
  const int lane = threadIdx.x & 31;
  int32_t mn = INT32_MAX, mx = INT32_MIN;
  for (int q = lane; q < n / 4; q += 32) {
    int32_t v[4];
    LoadStreamIds<4>(a, b, o + 4 * q, hist, true, v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      ids[4 * q + i] = v[i];
      if (4 * q + i >= lo) mn = min(mn, v[i]), mx = max(mx, v[i]);
    }
  }
  mn = __reduce_min_sync(kFullMask, mn);
  mx = __reduce_max_sync(kFullMask, mx);
  return mn == mx && mn >= 0;
}

// The taps of channel row (b, d) into taps[0..W), its bias returned.
__device__ __forceinline__ float StageWideTaps(const ConvArgs& a, int64_t b, int64_t d, float* taps) {
  const int W = int(a.width), lane = threadIdx.x & 31;
  const int64_t wrow = (a.groups == 1 ? 0 : DivFast(b, BatchPerGroupFast(a)) * a.dim) + d;
  for (int k = lane; k < W; k += 32) taps[k] = LoadAnyF(a.weight, a.w_dtype, wrow * W + k);
  return a.bias ? LoadAnyF(a.bias, a.b_dtype, wrow) : 0.f;
}

// The staged value at index i; kMasked: zero unless its id is s.
template <bool kMasked>
__device__ __forceinline__ float WideIn(const float* src, const int32_t* ids, int32_t s, int i) {
  const float v = src[WideAt(i)];
  if constexpr (kMasked) return ids[i] == s ? v : 0.f;
  return v;
}

// acc[j] += sum_{k < W} tap(k) * in(i0 + j + k) for j < kWideR, with
// tap(k) = taps[k] (kReverse: taps[W - 1 - k]); in = WideIn.
template <bool kMasked, bool kReverse>
__device__ __forceinline__ void WideTaps(const float* src, const int32_t* ids, int32_t s, int i0,
                                         const float* taps, int W, float (&acc)[kWideR]) {
  constexpr int R = kWideR, kWin = R + 7;
  float win[kWin];
  int k = 0;
  for (; k + 8 <= W; k += 8) {
    if (k == 0) {
#pragma unroll
      for (int q = 0; q < kWin; ++q) win[q] = WideIn<kMasked>(src, ids, s, i0 + q);
    } else {  // slide by 8
#pragma unroll
      for (int q = 0; q < kWin - 8; ++q) win[q] = win[q + 8];
#pragma unroll
      for (int q = kWin - 8; q < kWin; ++q) win[q] = WideIn<kMasked>(src, ids, s, i0 + k + q);
    }
    float wk[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) wk[q] = taps[kReverse ? W - 1 - k - q : k + q];
#pragma unroll
    for (int q = 0; q < 8; ++q)
#pragma unroll
      for (int j = 0; j < R; ++j) acc[j] += wk[q] * win[j + q];
  }
  for (; k < W; ++k) {
    const float wk = taps[kReverse ? W - 1 - k : k];
#pragma unroll
    for (int j = 0; j < R; ++j) acc[j] += wk * WideIn<kMasked>(src, ids, s, i0 + k + j);
  }
}

// dst[lane / 4] += the warp's sum of v[lane / 4] (lanes 0, 4, .., 28 add):
// the 8 sums by halving exchanges, 9 shuffles instead of 8 x 5.
__device__ __forceinline__ void AddWarpSums8(const float (&v)[8], float* dst) {
  const int lane = threadIdx.x & 31;
  float u4[4], u2[2];
  bool hi = lane & 16;  // keeps sums 4..7, hands 0..3 to lane ^ 16
#pragma unroll
  for (int i = 0; i < 4; ++i)
    u4[i] = (hi ? v[i + 4] : v[i]) + __shfl_xor_sync(kFullMask, hi ? v[i] : v[i + 4], 16);
  hi = lane & 8;
#pragma unroll
  for (int i = 0; i < 2; ++i)
    u2[i] = (hi ? u4[i + 2] : u4[i]) + __shfl_xor_sync(kFullMask, hi ? u4[i] : u4[i + 2], 8);
  hi = lane & 4;
  float u = (hi ? u2[1] : u2[0]) + __shfl_xor_sync(kFullMask, hi ? u2[0] : u2[1], 4);
  u += __shfl_xor_sync(kFullMask, u, 2);
  u += __shfl_xor_sync(kFullMask, u, 1);
  if ((lane & 3) == 0) dst[lane >> 2] += u;
}

// dws[k] += the warp's sum over its lanes of sum_j g[j] * in(i0 + j + k),
// k < W (the dweight shares of the lanes' runs); in = WideIn. Every lane
// calls it (shuffles).
template <bool kMasked>
__device__ __forceinline__ void WideDweight(const float* src, const int32_t* ids, int32_t s, int i0,
                                            const float (&g)[kWideR], int W, float* dws) {
  constexpr int R = kWideR, kWin = R + 7;
  float win[kWin];
  int k = 0;
  for (; k + 8 <= W; k += 8) {
    if (k == 0) {
#pragma unroll
      for (int q = 0; q < kWin; ++q) win[q] = WideIn<kMasked>(src, ids, s, i0 + q);
    } else {
#pragma unroll
      for (int q = 0; q < kWin - 8; ++q) win[q] = win[q + 8];
#pragma unroll
      for (int q = kWin - 8; q < kWin; ++q) win[q] = WideIn<kMasked>(src, ids, s, i0 + k + q);
    }
    float part[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      part[q] = 0.f;
#pragma unroll
      for (int j = 0; j < R; ++j) part[q] += g[j] * win[j + q];
    }
    AddWarpSums8(part, dws + k);
  }
  for (; k < W; ++k) {
    float part = 0.f;
#pragma unroll
    for (int j = 0; j < R; ++j) part += g[j] * WideIn<kMasked>(src, ids, s, i0 + k + j);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(kFullMask, part, off);
    if ((threadIdx.x & 31) == 0) dws[k] += part;
  }
}

// A lane's run under seq_idx, pass by pass: f(s, masked, take) for each id
// s of the run's live outputs, `take` the bits of the outputs whose id is s
// (masked: inputs of other ids are to read as zeros). A clean chunk is one
// unmasked pass taking every output. `own(j)`: output j's id. Returns the
// bits of the live (non-padding) outputs. Every lane calls it: clean is
// warp-uniform and the passes go on while any lane has outputs left.
template <typename Own, typename F>
__device__ __forceinline__ unsigned WidePasses(bool clean, int32_t clean_id, Own own, F&& f) {
  if (clean) {
    f(clean_id, false, ~0u);
    return ~0u;
  }
  unsigned live = 0;
#pragma unroll
  for (int j = 0; j < kWideR; ++j) live |= own(j) >= 0 ? 1u << j : 0u;
  unsigned todo = live;
  while (__any_sync(kFullMask, todo != 0)) {
    const int32_t s = todo ? own(__ffs(todo) - 1) : kNoId;
    unsigned take = 0;
#pragma unroll
    for (int j = 0; j < kWideR; ++j) take |= ((todo >> j) & 1) && own(j) == s ? 1u << j : 0u;
    f(s, true, take);
    todo &= ~take;
  }
  return live;
}

// Stores a lane's run of outputs (steps p0 .. p0 + kWideR) as whole vectors
// up to the row's end (len is whole vectors).
template <typename T>
__device__ __forceinline__ void StoreWideRun(T* row, int64_t p0, int64_t len, const float (&v)[kWideR]) {
  constexpr int N = 16 / int(sizeof(T));
#pragma unroll
  for (int q = 0; q < kWideR / N; ++q) {
    if (p0 + q * N >= len) break;
    float part[N];
#pragma unroll
    for (int i = 0; i < N; ++i) part[i] = v[q * N + i];
    StoreVec<T, N>(row + p0 + q * N, part);
  }
}

// A lane's run of a tensor (steps p0 .. p0 + kWideR), zeros past the end.
template <typename T>
__device__ __forceinline__ void LoadWideRun(const T* row, int64_t p0, int64_t len, float (&v)[kWideR]) {
  constexpr int N = 16 / int(sizeof(T));
#pragma unroll
  for (int q = 0; q < kWideR / N; ++q) {
    float part[N];
    if (p0 + q * N < len) {
      Unpack<T, N>(LoadRaw16(row + p0 + q * N), part);
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) part[i] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < N; ++i) v[q * N + i] = part[i];
  }
}

}  // namespace jcc::cuda
