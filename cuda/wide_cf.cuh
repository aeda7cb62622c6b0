// The channels-first staging of the wide family (forward_wide.cu,
// backward_wide.cu): a warp's own window of one channel row of whole
// aligned 16-byte vectors (wide.cuh describes the layout), copied with
// cp.async and converted to floats, the ids beside it, and a lane's runs of
// a row read and written as whole vectors.
#pragma once

#include "cp_async.cuh"
#include "wide.cuh"

namespace jcc::cuda {

// A warp's staging, for width W and elem_bytes-byte x (all counts in steps;
// the shared memory in 4-byte words, per warp, a multiple of 4):
//   x window (xs, idx): steps c0 - H .. c0 + kWideChunk (+ hp backward, for
//     the g of the runs after the chunk), hp = H rounded up to whole runs,
//     after one run's slots for the steps the first vectors hold before it;
//   raw: the whole 16-byte vectors that cover it, from c0 - hv;
//   g (gs, backward) and the outputs' ids (ido): steps c0 .. c0 + no.
struct WideSmem {
  int H, hp, hv, nx, nraw, no;
  int xs, gs, taps, dws, idx, ido, raw, words;
  __host__ __device__ WideSmem(int W, bool backward, bool masked, int elem_bytes) {
    H = W - 1;
    hp = RoundUp(H, kWideR);
    hv = RoundUp(H, 16 / elem_bytes);
    nx = H + kWideChunk + (backward ? hp : 0);
    nraw = hv + kWideChunk + (backward ? hp : 0);
    no = kWideChunk + (backward ? hp : 0);
    // (each window array with kWideR slots to spare: WideWindow's last group)
    xs = 0;
    gs = xs + WideAt(nx + 2 * kWideR);
    taps = RoundUp(gs + (backward ? WideAt(no + kWideR) : 0), 4);
    dws = taps + WideTapWords(W, backward);
    idx = dws + (backward ? W : 0);
    ido = idx + (masked ? WideAt(nx + 2 * kWideR) : 0);
    raw = RoundUp(ido + (masked ? WideAt(no + kWideR) : 0), 4);
    words = raw + nraw * elem_bytes / 4;
  }
};

// Staging x through the warp's raw buffer: IssueWideX starts the copies of
// the vectors of steps o .. o + n into it (cp.async: no registers held;
// before step 0 the initial states or zeros, past the row's end zeros),
// ConvertWideX waits for them and writes raw element i out as float to
// xs[WideAt(i + kWideR - skip)], skip < kWideR: no bounds to check.
template <typename T>
__device__ __forceinline__ void IssueWideX(const ConvArgs& a, const T* xrow, int64_t b, int64_t d, int64_t o,
                                           int n, T* raw) {
  constexpr int N = 16 / int(sizeof(T));
  const int lane = threadIdx.x & 31;
  for (int v = lane; v < n / N; v += 32) {
    const int64_t t = o + int64_t(v) * N;
    if (t >= 0)
      CpAsync<16>(raw + v * N, t < a.len ? xrow + t : xrow, t < a.len);
    else  // the initial states: the row's first chunk only
      *reinterpret_cast<uint4*>(raw + v * N) = LoadVectorBefore<T>(a, xrow, b, d, t);
  }
  CpAsyncCommit();
}

template <typename T>
__device__ __forceinline__ void ConvertWideX(int n, int skip, const T* raw, float* xs) {
  constexpr int N = 16 / int(sizeof(T));
  CpAsyncWait<0>();
  __syncwarp();
  for (int v = threadIdx.x & 31; v < n / N; v += 32) {
    float f[N];
    Unpack<T, N>(*reinterpret_cast<const uint4*>(raw + v * N), f);
    const int e = v * N + kWideR - skip, r = e & 15;
    float* p = xs + WideAt(e);
#pragma unroll
    for (int i = 0; i < N; ++i) p[i + ((r + i) >> 4)] = f[i];
  }
}

// The ids of steps o .. o + n (o whole 16-byte words of ids; HistoryId
// before step 0, kNoId past the end; as StagedId), kU words of 4 in flight per lane:
// raw element i goes to idx[WideAt(i + kWideR - skip)] (x's layout), and to
// ido[WideAt(e)] for e = i - skip - H in [0, no) (the outputs'). Returns,
// warp-uniform, whether the window's steps all hold one live id (the steps
// CountedSteps counts).
__device__ __forceinline__ bool StageWideIds(const ConvArgs& a, int64_t b, int64_t o, int n, int skip,
                                             const WideSmem& sm, int32_t hist, int32_t* idx, int32_t* ido) {
  constexpr int kU = 8;
  const int lane = threadIdx.x & 31;
  int32_t mn = INT32_MAX, mx = INT32_MIN;
  const StepRange counted = CountedSteps(a, o + skip, n - skip, hist);  // (e's range)
  for (int q0 = 0; q0 < n / 4; q0 += 32 * kU) {
    int32_t v[kU][4];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int q = q0 + u * 32 + lane;
      LoadStreamIds<4>(a, b, o + 4 * q, hist, q < n / 4, v[u]);
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int q = q0 + u * 32 + lane;
      if (q >= n / 4) break;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int e = 4 * q + i - skip;  // step c0 - H + e
        const int32_t id = StagedId(v[u][i]);
        idx[WideAt(e + kWideR)] = id;
        if (e >= counted.lo && e < counted.hi) mn = min(mn, id), mx = max(mx, id);
        if (e >= sm.H && e - sm.H < sm.no) ido[WideAt(e - sm.H)] = id;
      }
    }
  }
  mn = __reduce_min_sync(kFullMask, mn);
  mx = __reduce_max_sync(kFullMask, mx);
  return mn == mx && mn >= 0;
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
