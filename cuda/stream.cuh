// Pieces shared by the streaming kernels (forward_stream.cu, backward_stream.cu):
// channels-first rows, one sequence per row, width <= 4, rows a whole number
// of 16-byte vectors. Work is cut into warp chunks: warp chunk c of a row
// covers steps [c * kWarpSteps, (c + 1) * kWarpSteps), and lane l's vector j
// starts at step c0 + (j * 32 + l) * kN. Each thread issues all of its loads
// (kVecs 16-byte vectors per tensor) before it uses any of them, so many bytes
// are in flight per thread, and the per-thread set-up (index divisions, weight
// loads) is paid once per kVecs vectors.
#pragma once

#include "common.cuh"

namespace jcc::cuda {

constexpr int kStreamWarps = 4;  // warps per block
constexpr int kStreamThreads = 32 * kStreamWarps;
constexpr unsigned kFullMask = 0xffffffffu;

template <typename T>
struct Stream {
  static constexpr int kN = 16 / int(sizeof(T));  // elements per 16-byte vector
  static constexpr int kVecs = 4;                 // vectors per thread and tensor
  static constexpr int kWarpSteps = 32 * kVecs * kN;
};

// Where a warp works: its row (b * dim + d), its index within the row, and
// the first step of its span. Whole warps leave together when past the last
// row (so shuffles stay legal).
struct WarpChunk {
  int64_t row, index, c0;
  bool valid;
};

__device__ __forceinline__ WarpChunk LocateWarp(const ConvArgs& a, int64_t warps_per_row,
                                                int64_t warp_steps) {
  const int64_t gw = int64_t(blockIdx.x) * kStreamWarps + (threadIdx.x >> 5);
  const int64_t row = DivFast(gw, warps_per_row), index = gw - row * warps_per_row;
  return {row, index, index * warp_steps, row < a.batch * a.dim};
}

__device__ __forceinline__ uint4 LoadRaw16(const void* p) {
  return __ldg(static_cast<const uint4*>(p));
}

template <typename T, int N>
__device__ __forceinline__ void Unpack(const uint4& raw, float (&out)[N]) {
  static_assert(N * sizeof(T) == 16, "one 16-byte vector");
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int j = 0; j < N; ++j) out[j] = ToF(e[j]);
}

// The weights of row `row` (run-time dtype) and its bias.
template <int kW>
__device__ __forceinline__ float LoadTaps(const ConvArgs& a, int64_t row, float (&w)[kW]) {
  const int64_t b = DivFast(row, a.dim), d = row - b * a.dim;
  const int64_t wrow = a.groups == 1 ? d : DivFast(b, BatchPerGroupFast(a)) * a.dim + d;
#pragma unroll
  for (int k = 0; k < kW; ++k) w[k] = LoadAnyF(a.weight, a.w_dtype, wrow * kW + k);
  return a.bias ? LoadAnyF(a.bias, a.b_dtype, wrow) : 0.f;
}

// h[i] = input at step c0 - H + i for the warp's first lane: the tail of the
// vector before the chunk, or the initial states (zeros) before step 0.
template <typename T, int N, int H, int kHist>
__device__ __forceinline__ void ChunkHistory(const ConvArgs& a, int64_t row, int64_t c0,
                                             const uint4& prev, float (&h)[kHist]) {
  if (c0 > 0) {
    float p[N];
    Unpack<T, N>(prev, p);
#pragma unroll
    for (int i = 0; i < H; ++i) h[i] = p[N - H + i];
  } else {
    const int64_t b = row / a.dim, d = row - b * a.dim;
#pragma unroll
    for (int i = 0; i < H; ++i)
      h[i] = a.initial_states ? LoadState<T>(a, a.initial_states, b, d, i) : 0.f;
  }
}

// Tail-to-next-lane halo: given each lane's vector v (of vector index j),
// h[i] = v[N - H + i] of the lane before; lane 0 takes `carry` (the previous
// vector index's lane-31 tail, or the chunk history), and `carry` becomes this
// index's lane-31 tail for the next one.
template <int N, int H, int kHist>
__device__ __forceinline__ void HaloFromLeft(const float (&v)[N], int lane, float (&carry)[kHist],
                                             float (&h)[kHist]) {
#pragma unroll
  for (int i = 0; i < H; ++i) {
    const float s = __shfl_sync(kFullMask, v[N - H + i], (lane + 31) & 31);
    h[i] = lane == 0 ? carry[i] : s;
    carry[i] = s;  // on lane 0: lane 31's tail
  }
}

// Blocks for a problem: warps_per_row chunks per row, kStreamWarps per block.
inline int64_t StreamBlocks(const ConvArgs& a, int64_t warps_per_row) {
  return CeilDiv(a.batch * a.dim * warps_per_row, int64_t(kStreamWarps));
}

// The backward gives each warp a span of up to kMaxChunksPerWarp chunks of
// one row: as many as keep >= 32768 warps in the grid (enough to fill
// every SM many times over).
constexpr int kMaxChunksPerWarp = 4;

}  // namespace jcc::cuda
