// Pieces shared by the streaming kernels (forward_stream.cu,
// backward_stream.cu): channels-first rows of whole aligned 16-byte vectors,
// widths up to 16 (seq_idx: stream_ids.cuh).
//
// A block's kStreamWarps warps take kStreamWarps consecutive channels of one
// batch row over the same time chunks. Warp chunk c covers kChunk steps; lane l's vector j
// starts at step c0 + (j * 32 + l) * kN. Each thread issues all its loads
// (kVecs 16-byte vectors per tensor, plus the vectors its halo needs) before
// it uses any. The H = W - 1 inputs before a vector come from the lanes
// behind it by warp shuffles (lane l - q; for the first lanes, the previous
// vector of lane 32 + l - q), the backward's g after a vector likewise from
// the lanes ahead.
//
// Widths are template parameters, each W <= 16 compiled at its own width
// (kW == W: no absent taps; the buckets of 12 and 16 taps that held W 9..16
// before measured slower, docs/performance-log.md, eighteenth session).
#pragma once

#include "common.cuh"
#include "sequences.cuh"

namespace jcc::cuda {

constexpr int kStreamWarps = 4;  // warps (channels) per block
constexpr int kStreamThreads = 32 * kStreamWarps;
constexpr unsigned kFullMask = 0xffffffffu;

template <typename T>
struct Stream {
  static constexpr int kN = 16 / int(sizeof(T));  // elements per 16-byte vector
  static constexpr int kVecs = 4;                 // vectors per lane and tensor
  static constexpr int kChunk = 32 * kVecs * kN;  // steps per warp chunk
};


__device__ __forceinline__ uint4 LoadRaw16(const void* p) { return __ldg(static_cast<const uint4*>(p)); }

// The streaming kernels' passes, for choices made per pass and width.
enum class StreamPass { kForward, kForwardIds, kBackward, kBackwardIds };

// Whether a pass unpacks its 16-bit vectors by whole 32-bit words
// (ElementsToF: fewer instructions) or element by element. Measured per
// pass (docs/performance-log.md, 2026-11-27, twentieth session): by words
// every pass came out level or faster except the dense backward at W 4, 8,
// 12 and 13 (faster at 16; 14, 15 not timed) and the shared-ids forward at
// W 4 (whose registers spill by words at W 3, 4 and 7); those keep the
// elements.
template <StreamPass P>
__host__ __device__ constexpr bool UnpackByWords(int w) {
  return P == StreamPass::kBackward ? w >= 16 : P == StreamPass::kForwardIds ? w >= 8 : true;
}

template <typename T, int N, bool kWords = true>
__device__ __forceinline__ void Unpack(const uint4& raw, float (&out)[N]) {
  static_assert(N * sizeof(T) == 16, "one 16-byte vector");
  ElementsToF<T, N, kWords>(reinterpret_cast<const T*>(&raw), out);
}

// Where a block works: batch row b, channel d = dgroup * 4 + warp, and the
// first chunk of its span. `live`: the warp's channel exists (a warp past
// dim still takes part in the block's barriers).
struct StreamPlace {
  int64_t b, d, first_chunk;
  bool live;
};

__device__ __forceinline__ StreamPlace LocateStream(const ConvArgs& a, int64_t spans_per_row,
                                                    int64_t chunks_per_span) {
  const int64_t dgroups = CeilDiv(a.dim, kStreamWarps);
  const int64_t blk = blockIdx.x;
  const int64_t row_block = blk / spans_per_row, span = blk - row_block * spans_per_row;
  const int64_t b = row_block / dgroups, dg = row_block - b * dgroups;
  const int64_t d = dg * kStreamWarps + (threadIdx.x >> 5);
  return {b, d, span * chunks_per_span, d < a.dim};
}

__host__ __device__ __forceinline__ int64_t StreamBlocks(const ConvArgs& a, int64_t spans_per_row) {
  return a.batch * CeilDiv(a.dim, kStreamWarps) * spans_per_row;
}

// Chunks a warp walks (its span): doubled up to max_chunks while within the
// row's per_row chunks and while at least 32768 warps remain (the plans of
// the streaming forward and backward and of the tensor-core backward)
inline int64_t ChunksPerSpan(int64_t per_row, int64_t rows, int64_t max_chunks) {
  int64_t k = 1;
  while (2 * k <= max_chunks && 2 * k <= per_row && rows * CeilDiv(per_row, 2 * k) >= 32768) k *= 2;
  return k;
}

// The backward's rows of channel row (b, d), channels-first: x (strided
// by whole vectors), dy and dx.
template <typename T>
struct BackwardRows {
  const T* x;
  const T* dy;
  T* dx;
  __device__ __forceinline__ BackwardRows(const ConvArgs& a, int64_t b, int64_t d)
      : x(static_cast<const T*>(a.x) + a.x_layout().At(b, d, 0)) {
    const int64_t row = a.io_layout().At(b, d, 0);
    dy = static_cast<const T*>(a.dy) + row;
    dx = static_cast<T*>(a.dx) + row;
  }
};

// The kW taps of row (b, d) (the streaming kernels run at W == kW), and its
// bias.
template <int kW>
__device__ __forceinline__ float LoadStreamTaps(const ConvArgs& a, int64_t b, int64_t d, float (&w)[kW]) {
  const int64_t wrow = WeightRow(a, b, d);
  LoadAnyRowF<kW>(a.weight, a.w_dtype, wrow * kW, w);
  return a.bias ? LoadAnyF(a.bias, a.b_dtype, wrow) : 0.f;
}

// Lane `lane`'s vector before the chunk, for the halo of the first lanes:
// step t0 = c0 - (32 - lane) * kN; before step 0 the initial states (or
// zeros) element by element.
template <typename T>
__device__ __forceinline__ uint4 LoadVectorBefore(const ConvArgs& a, const T* xrow, int64_t b, int64_t d,
                                                  int64_t t0) {
  constexpr int N = Stream<T>::kN;
  if (t0 >= 0) return LoadRaw16(xrow + t0);
  uint4 raw = make_uint4(0, 0, 0, 0);
  T* e = reinterpret_cast<T*>(&raw);
  const int64_t H = a.width - 1;
#pragma unroll
  for (int i = 0; i < N; ++i) {
    const int64_t p = t0 + i;
    e[i] = p >= 0 ? xrow[p] : (a.initial_states && p + H >= 0 ? static_cast<const T*>(
                                   a.initial_states)[a.state_layout().At(b, d, p + H)] : FromF<T>(0.f));
  }
  return raw;
}

// The backward's loads of one channel row's chunk at c0 (rows of L steps),
// issued together before any is used: xr[j + 1] = x vector j for j = -1 ..
// V (the vector before the chunk, at t_before, for the lanes whose halo
// reaches back there (`before`); vector V for the lanes < kQ where `after`
// (the g of the vector after the chunk is computed, not handed over);
// zeros elsewhere and past the end), dyr[j] = dy vector j for j = 0 .. V
// likewise.
template <typename T, int kQ>
__device__ __forceinline__ void LoadBackwardChunk(const ConvArgs& a, const T* xrow, const T* dyrow, int64_t b,
                                                  int64_t d, int64_t c0, int64_t L, int lane, bool before,
                                                  int64_t t_before, bool after, uint4 (&xr)[Stream<T>::kVecs + 2],
                                                  uint4 (&dyr)[Stream<T>::kVecs + 1]) {
  constexpr int N = Stream<T>::kN, V = Stream<T>::kVecs;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  xr[0] = before ? LoadVectorBefore<T>(a, xrow, b, d, t_before) : zero;
#pragma unroll
  for (int j = 0; j <= V; ++j) {
    const int64_t t = c0 + int64_t(j * 32 + lane) * N;
    const bool ok = t < L && (j < V || (after && lane < kQ));
    xr[j + 1] = ok ? LoadRaw16(xrow + t) : zero;
    dyr[j] = ok ? LoadRaw16(dyrow + t) : zero;
  }
}

// h[i] = the input at step p0 - kH + i (kH = kW - 1) for this lane's vector
// with elements `cur` (vector j) and `prev` (vector j - 1): from lane l - q
// by one shuffle per value. Every lane calls it (shuffles are warp-wide).
// (E: float inputs, or int32 ids.)
template <int N, int kH, typename E>
__device__ __forceinline__ void LeftHalo(const E (&cur)[N], const E (&prev)[N], int lane,
                                         E (&h)[kH > 0 ? kH : 1]) {
#pragma unroll
  for (int i = 0; i < kH; ++i) {
    const int o = kH - i;             // steps before the vector
    const int q = (o + N - 1) / N;    // lanes back
    const int e = q * N - o;          // element of that lane's vector
    const E offer = lane >= 32 - q ? prev[e] : cur[e];
    h[i] = __shfl_sync(kFullMask, offer, (lane - q) & 31);
  }
}

// Vector j of this lane unpacked (cur, from raw `cur_raw`) with the kH
// inputs before it (h, LeftHalo's; `prev_raw`: this lane's vector j - 1).
// Every lane calls it (shuffles).
template <typename T, int N, int kH, bool kWords = true>
__device__ __forceinline__ void UnpackWithHalo(const uint4& cur_raw, const uint4& prev_raw, int lane,
                                               float (&cur)[N], float (&h)[kH > 0 ? kH : 1]) {
  float prev[N];
  Unpack<T, N, kWords>(cur_raw, cur);
  Unpack<T, N, kWords>(prev_raw, prev);
  LeftHalo<N, kH>(cur, prev, lane, h);
}

// r[m] = g at step p0 + N + m (m < kH) for this lane's vector, from lane
// l + q: its vector j (`cur`) or, past lane 31, vector j + 1 (`next`).
template <int N, int kH, typename E>
__device__ __forceinline__ void RightHalo(const E (&cur)[N], const E (&next)[N], int lane,
                                          E (&r)[kH > 0 ? kH : 1]) {
#pragma unroll
  for (int m = 0; m < kH; ++m) {
    const int q = 1 + m / N, e = m % N;
    const E offer = lane < q ? next[e] : cur[e];
    r[m] = __shfl_sync(kFullMask, offer, (lane + q) & 31);
  }
}

// win[i] = the input at step p0 - kH + i of a vector at p0: the kH inputs
// before it (h, from LeftHalo), then its own N.
template <int N, int kH>
__device__ __forceinline__ void InputWindow(const float (&h)[kH > 0 ? kH : 1], const float (&cur)[N],
                                            float (&win)[kH + N]) {
#pragma unroll
  for (int i = 0; i < kH; ++i) win[i] = h[i];
#pragma unroll
  for (int n = 0; n < N; ++n) win[kH + n] = cur[n];
}

// gw[i] = g at step p0 + i of a vector at p0: its own N, then the kH after
// it (r, from RightHalo).
template <int N, int kH>
__device__ __forceinline__ void GradWindow(const float (&g)[N], const float (&r)[kH > 0 ? kH : 1],
                                           float (&gw)[N + kH]) {
#pragma unroll
  for (int n = 0; n < N; ++n) gw[n] = g[n];
#pragma unroll
  for (int m = 0; m < kH; ++m) gw[N + m] = r[m];
}

// The backward's walk over a chunk's V vectors: g of vector j + 1 (g_of,
// every lane), the kH values of g after vector j (RightHalo), then
// body(j, g of vector j, those kH values). Every lane calls it. kFromLast:
// the vectors from V - 1 down to 0, g_of(V) asked first and g_of(0) last
// (a walk over chunks from last to first hands g_of(0) to the chunk before
// as its g_of(V), with no more values held at once).
template <int N, int kH, int V, bool kFromLast = false, typename G, typename Body>
__device__ __forceinline__ void WalkGradVectors(int lane, G&& g_of, Body&& body) {
  float gcur[N], gnext[N];
  if constexpr (kFromLast) {
    g_of(V, gnext);
#pragma unroll
    for (int j = V - 1; j >= 0; --j) {
      g_of(j, gcur);
      float r[kH > 0 ? kH : 1];
      RightHalo<N, kH>(gcur, gnext, lane, r);
      body(j, gcur, r);
#pragma unroll
      for (int n = 0; n < N; ++n) gnext[n] = gcur[n];
    }
  } else {
    g_of(0, gcur);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      g_of(j + 1, gnext);
      float r[kH > 0 ? kH : 1];
      RightHalo<N, kH>(gcur, gnext, lane, r);
      body(j, gcur, r);
#pragma unroll
      for (int n = 0; n < N; ++n) gcur[n] = gnext[n];
    }
  }
}

// out += the residual vector `raw`.
template <typename T, int N, bool kWords = true>
__device__ __forceinline__ void AddResidual(const uint4& raw, float (&out)[N]) {
  float r[N];
  Unpack<T, N, kWords>(raw, r);
#pragma unroll
  for (int n = 0; n < N; ++n) out[n] += r[n];
}

// acc + the taps of output n over the window win (win[n + k] is the input
// its tap k reads).
template <int kW, int M>
__device__ __forceinline__ float TapSum(const float (&w)[kW], const float (&win)[M], int n, float acc) {
#pragma unroll
  for (int k = 0; k < kW; ++k) acc += w[k] * win[n + k];
  return acc;
}

// ids of the N steps from p0 (a multiple of N): before step 0 `hist`
// (HistoryId), past the end or when !load kNoId.
template <int N>
__device__ __forceinline__ void LoadStreamIds(const ConvArgs& a, int64_t b, int64_t p0, int32_t hist,
                                              bool load, int32_t (&id)[N]) {
  static_assert(N % 4 == 0, "whole 16-byte words of ids");
  if (!load || p0 < 0 || p0 >= a.len) {
    const int32_t v = load && p0 < 0 ? hist : kNoId;
#pragma unroll
    for (int n = 0; n < N; ++n) id[n] = v;
    return;
  }
  const int4* p = reinterpret_cast<const int4*>(a.seq_idx + b * a.len + p0);
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    const int4 v = __ldg(p + i);
    id[4 * i] = v.x, id[4 * i + 1] = v.y, id[4 * i + 2] = v.z, id[4 * i + 3] = v.w;
  }
}

// Lane k's partial sum `mine` of tap k (k == kW: the bias) of the warp's
// span of row (b, d) into the backward workspace: ws[grp][part][d][kW + 1]
// with part = (b % batch_per_group) * spans + span (states.cu's
// ReduceKernel reads it). Lanes past kW write nothing.
template <int kW>
__device__ __forceinline__ void StoreSpanPartial(const ConvArgs& a, float* ws, int64_t b, int64_t d,
                                                 int64_t spans_per_row, int64_t span, int lane, float mine) {
  if (lane > kW) return;
  const int64_t bpg = BatchPerGroupFast(a), grp = DivFast(b, bpg);
  const int64_t nparts = bpg * spans_per_row;
  const int64_t partidx = (b - grp * bpg) * spans_per_row + span;
  ws[((grp * nparts + partidx) * a.dim + d) * (kW + 1) + lane] = mine;
}

// The warp's sums of part[0 .. kW] (a fixed order, so the same bits every
// run): lane k's return value is sum k.
template <int kW>
__device__ __forceinline__ float WarpTapSums(const float (&part)[kW + 1], int lane) {
  // By halving exchanges: the kW + 1 sums padded to P; at offset o = 16,
  // 8, .. a lane keeps half of its c values (the upper half when lane & o)
  // and adds the partner's copy of that half, until one value is left:
  // lane l then holds sum l / (32 / P) over the lanes that share l's bits
  // from 32 / P up, and butterflies over the lower bits finish it (P - 1 +
  // log2(32 / P), and one to hand each sum to its lane: P + log2(32 / P)
  // shuffles instead of 5 (kW + 1)).
  constexpr int P = kW + 1 <= 2 ? 2 : kW + 1 <= 4 ? 4 : kW + 1 <= 8 ? 8 : kW + 1 <= 16 ? 16 : 32;
  static_assert(kW + 1 <= 32, "a lane per sum");
  float v[P];
#pragma unroll
  for (int i = 0; i < P; ++i) v[i] = i <= kW ? part[i] : 0.f;
  constexpr int kLevels = P == 2 ? 1 : P == 4 ? 2 : P == 8 ? 3 : P == 16 ? 4 : 5;
#pragma unroll
  for (int lvl = 0; lvl < kLevels; ++lvl) {  // c = P >> lvl values, offset 16 >> lvl
    const int h = (P >> lvl) / 2, off = 16 >> lvl;
    const bool hi = lane & off;
#pragma unroll
    for (int i = 0; i < P / 2; ++i)
      if (i < h) v[i] = (hi ? v[i + h] : v[i]) + __shfl_xor_sync(kFullMask, hi ? v[i] : v[i + h], off);
  }
#pragma unroll
  for (int lvl = kLevels; lvl < 5; ++lvl) v[0] += __shfl_xor_sync(kFullMask, v[0], 16 >> lvl);
  return P == 32 ? v[0] : __shfl_sync(kFullMask, v[0], (lane * (32 / P)) & 31);
}

}  // namespace jcc::cuda
