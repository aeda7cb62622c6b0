// Pieces shared by the streaming kernels (forward_stream.cu,
// backward_stream.cu): channels-first rows of whole aligned 16-byte vectors,
// one sequence per row or seq_idx masks, widths up to 16.
//
// A block's kStreamWarps warps take kStreamWarps consecutive channels of one
// batch row over the same time chunks, so that (seq_idx) the chunk's ids are
// staged once per block. Warp chunk c covers kChunk steps; lane l's vector j
// starts at step c0 + (j * 32 + l) * kN. Each thread issues all its loads
// (kVecs 16-byte vectors per tensor, plus the vectors its halo needs) before
// it uses any. The H = W - 1 inputs before a vector come from the lanes
// behind it by warp shuffles (lane l - q; for the first lanes, the previous
// vector of lane 32 + l - q), the backward's g after a vector likewise from
// the lanes ahead.
//
// Widths are template parameters: 1..8 exactly, 9..12 and 13..16 as the
// buckets 12 and 16, whose first kW - W taps are absent (skipped, never
// multiplied: a NaN or Inf outside the real window must not leak in).
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
  static constexpr int kIdPad = 16;               // ids staged before and after a chunk
  static constexpr int kSlotPad = kIdPad / kN;    // vector slots summarised before and after
};

// The template width for a width: itself up to 8, then 12 or 16.
__host__ __device__ constexpr int StreamBucket(int W) { return W <= 8 ? W : (W <= 12 ? 12 : 16); }

__device__ __forceinline__ uint4 LoadRaw16(const void* p) { return __ldg(static_cast<const uint4*>(p)); }

template <typename T, int N>
__device__ __forceinline__ void Unpack(const uint4& raw, float (&out)[N]) {
  static_assert(N * sizeof(T) == 16, "one 16-byte vector");
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int j = 0; j < N; ++j) out[j] = ToF(e[j]);
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

// The taps of row (b, d), right-aligned in a bucket of kW (w[k] for k <
// pad = kW - W are absent), and its bias.
template <int kW>
__device__ __forceinline__ float LoadStreamTaps(const ConvArgs& a, int64_t b, int64_t d, int pad,
                                                float (&w)[kW]) {
  const int W = int(a.width);
  const int64_t wrow = (a.groups == 1 ? 0 : DivFast(b, BatchPerGroupFast(a)) * a.dim) + d;
#pragma unroll
  for (int k = 0; k < kW; ++k) w[k] = k >= pad ? LoadAnyF(a.weight, a.w_dtype, wrow * W + k - pad) : 0.f;
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

// h[i] = the input at step p0 - kH + i (kH = kW - 1) for this lane's vector
// with elements `cur` (vector j) and `prev` (vector j - 1): from lane l - q
// by one shuffle per value. Every lane calls it (shuffles are warp-wide).
template <int N, int kH>
__device__ __forceinline__ void LeftHalo(const float (&cur)[N], const float (&prev)[N], int lane,
                                         float (&h)[kH > 0 ? kH : 1]) {
#pragma unroll
  for (int i = 0; i < kH; ++i) {
    const int o = kH - i;             // steps before the vector
    const int q = (o + N - 1) / N;    // lanes back
    const int e = q * N - o;          // element of that lane's vector
    const float offer = lane >= 32 - q ? prev[e] : cur[e];
    h[i] = __shfl_sync(kFullMask, offer, (lane - q) & 31);
  }
}

// r[m] = g at step p0 + N + m (m < kH) for this lane's vector, from lane
// l + q: its vector j (`cur`) or, past lane 31, vector j + 1 (`next`).
template <int N, int kH>
__device__ __forceinline__ void RightHalo(const float (&cur)[N], const float (&next)[N], int lane,
                                          float (&r)[kH > 0 ? kH : 1]) {
#pragma unroll
  for (int m = 0; m < kH; ++m) {
    const int q = 1 + m / N, e = m % N;
    const float offer = lane < q ? next[e] : cur[e];
    r[m] = __shfl_sync(kFullMask, offer, (lane + q) & 31);
  }
}

// seq_idx of a block's chunk in shared memory: ids of steps
// [c0 - kIdPad, c0 + kChunk + kIdPad), and for each vector slot s (steps
// c0 + s * N ..) whether its ids are all one id and which. Slots run from
// -kSlotPad to kVecs * 32 + kSlotPad.
template <typename T>
struct StreamIds {
  using S = Stream<T>;
  static constexpr int kIds = S::kChunk + 2 * S::kIdPad;
  static constexpr int kSlots = S::kVecs * 32 + 2 * S::kSlotPad;
  int32_t id[kIds];
  int32_t slot_id[kSlots];
  uint8_t slot_uniform[kSlots];

  __device__ __forceinline__ int32_t At(int64_t c0, int64_t t) const { return id[t - c0 + S::kIdPad]; }
  __device__ __forceinline__ bool Uniform(int s) const { return slot_uniform[s + S::kSlotPad]; }
  __device__ __forceinline__ int32_t SlotId(int s) const { return slot_id[s + S::kSlotPad]; }

  // Block-wide (call with every thread, then __syncthreads()).
  __device__ __forceinline__ void Stage(const ConvArgs& a, int64_t b, int64_t c0, int32_t hist) {
    constexpr int kPer = (kIds + kStreamThreads - 1) / kStreamThreads;
    int32_t v[kPer];
#pragma unroll
    for (int u = 0; u < kPer; ++u) {  // all loads first
      const int i = threadIdx.x + u * kStreamThreads;
      v[u] = i < kIds ? IdAt(a, b, c0 - S::kIdPad + i, hist) : 0;
    }
#pragma unroll
    for (int u = 0; u < kPer; ++u) {
      const int i = threadIdx.x + u * kStreamThreads;
      if (i < kIds) id[i] = v[u];
    }
  }
  __device__ __forceinline__ void Summarise() {  // after Stage's barrier
    for (int s = threadIdx.x; s < kSlots; s += kStreamThreads) {
      const int32_t* p = id + s * S::kN;  // slot s - kSlotPad starts at step c0 + (s - kSlotPad) * N
      bool uni = true;
#pragma unroll
      for (int i = 1; i < S::kN; ++i) uni = uni && p[i] == p[0];
      slot_id[s] = p[0];
      slot_uniform[s] = uni;
    }
  }
  // Whether every output of vector slot s reads only its own id's inputs:
  // the slot and the `lanes` slots before it (forward) or after it (the
  // backward's dx) hold one id, not padding.
  __device__ __forceinline__ bool Clean(int s, int lanes, bool after) const {
    const int32_t x = SlotId(s);
    bool ok = Uniform(s) && x >= 0;
    for (int q = 1; q <= lanes; ++q) {
      const int t = after ? s + q : s - q;
      ok = ok && Uniform(t) && SlotId(t) == x;
    }
    return ok;
  }
};

// Per-thread shared scratch for the masked (rare) path: the window of a
// vector and the taps, so that its loops run over run-time indices without
// pushing the clean path's registers to local memory. A thread's area
// starts kScratch words apart (odd: no bank conflicts between lanes).
template <int kW, int N>
struct StreamScratch {
  static constexpr int kWin = kW - 1 + N;
  static constexpr int kScratch = (kWin + 2 * N) | 1;  // window (or g and its halo) + out
  float area[kStreamThreads * kScratch];
  float taps[kStreamWarps][kW > 0 ? kW : 1];
  __device__ __forceinline__ float* Mine() { return area + threadIdx.x * kScratch; }
};

// The same interface without seq_idx: every vector is clean.
struct NoStreamIds {
  __device__ __forceinline__ int32_t At(int64_t, int64_t) const { return 0; }
  __device__ __forceinline__ bool Clean(int, int, bool) const { return true; }
};

template <typename T, bool kMasked>
using StreamIdsOf = std::conditional_t<kMasked, StreamIds<T>, NoStreamIds>;

}  // namespace jcc::cuda
