// Pieces shared by the channels-last hot kernels (forward_cl_row.cu,
// backward_cl_row.cu): whole aligned vectors of kV channels per thread, a
// block of kClX x kClY threads (kClX channel vectors by kClY time slices).
#pragma once

#include "common.cuh"

namespace jcc::cuda {

// Channels-last kernels (width <= 4): a block of kClX x kClY threads, kClX
// vectors of channels by kClY time slices.
constexpr int kClX = 32;
constexpr int kClY = 4;
constexpr int kClBwdSteps = 128;  // time steps per thread in the channels-last backward
constexpr int kClV = 4;           // channels per thread in the channels-last backward

// kV channels of one time step kept as loaded (raw T, one 8- or 16-byte word):
// half the registers of floats, so more steps' loads can be in flight.
template <typename T, int kV>
struct alignas(kV * sizeof(T)) ChRaw {
  T e[kV];
  __device__ __forceinline__ float operator[](int c) const { return ToF(e[c]); }
};

template <typename T, int kV>
__device__ __forceinline__ ChRaw<T, kV> LoadChRaw(const T* row, int64_t dim, int64_t c0, int64_t t,
                                                  bool vec) {
  ChRaw<T, kV> r;
  const T* p = row + t * dim + c0;
  if (vec) {
    constexpr int kBytes = kV * int(sizeof(T));
    using V = typename std::conditional<kBytes == 16, uint4,
              typename std::conditional<kBytes == 8, uint2, unsigned>::type>::type;
    static_assert(sizeof(V) == kBytes, "one 4-, 8- or 16-byte word");
    *reinterpret_cast<V*>(r.e) = __ldg(reinterpret_cast<const V*>(p));
  } else {
#pragma unroll
    for (int c = 0; c < kV; ++c) r.e[c] = c0 + c < dim ? p[c] : FromF<T>(0.f);
  }
  return r;
}

// Taps and biases of kV consecutive channels-last channels, weight row
// `first` onwards ((groups * dim, W) weights, run-time dtype); channels from
// `count` on read as zero (past the end of dim).
template <int kW, int kV>
__device__ __forceinline__ void LoadClTaps(const ConvArgs& a, int64_t first, int64_t count,
                                           float (&w)[kW][kV], float (&bias)[kV]) {
#pragma unroll
  for (int c = 0; c < kV; ++c) {
    const bool ok = c < count;
#pragma unroll
    for (int k = 0; k < kW; ++k)
      w[k][c] = ok ? LoadAnyF(a.weight, a.w_dtype, (first + c) * kW + k) : 0.f;
    bias[c] = ok && a.bias ? LoadAnyF(a.bias, a.b_dtype, first + c) : 0.f;
  }
}

// History of a channels-last thread at the start of its slice: win[i] = the
// input at step ts - H + i for kV channels from c0 (the initial states, or
// zeros, before step 0). xb points at channel c0 of batch row b; whole vectors.
template <typename T, int kV, int H>
__device__ __forceinline__ void LoadClHistory(const ConvArgs& a, const T* xb, int64_t b, int64_t c0,
                                              int64_t ts, float (*win)[kV]) {
#pragma unroll
  for (int i = 0; i < H; ++i) {
    const int64_t t = ts - H + i;
    if (t >= 0) {
      const ChRaw<T, kV> r = LoadChRaw<T, kV>(xb, a.dim, 0, t, true);
#pragma unroll
      for (int c = 0; c < kV; ++c) win[i][c] = r[c];
    } else {
#pragma unroll
      for (int c = 0; c < kV; ++c)
        win[i][c] = a.initial_states ? LoadState<T>(a, a.initial_states, b, c0 + c, H + t) : 0.f;
    }
  }
}

// Channels-last backward blocks: adds each thread's partial dweight/dbias
// (dw[k][c], k == W for the bias) over the block's kClY time slices, in slice
// order, and writes them to ws[grp][part][d][W + 1] for ReduceKernel.
template <int kW, int kV>
__device__ __forceinline__ void WriteClPartials(const ConvArgs& a, float (*red)[kClX][kV * (kW + 1)],
                                                const float (&dw)[kW + 1][kV], int64_t b, int64_t c0,
                                                int64_t nchunk, int64_t chunk, float* ws) {
#pragma unroll
  for (int k = 0; k <= kW; ++k)
#pragma unroll
    for (int c = 0; c < kV; ++c) red[threadIdx.y][threadIdx.x][k * kV + c] = dw[k][c];
  __syncthreads();
  if (threadIdx.y == 0 && c0 < a.dim) {
    const int64_t bpg = a.batch_per_group(), grp = b / bpg;
    const int64_t nparts = bpg * nchunk, part = (b % bpg) * nchunk + chunk;
    for (int c = 0; c < kV && c0 + c < a.dim; ++c) {
      float* wsrow = ws + ((grp * nparts + part) * a.dim + c0 + c) * (kW + 1);
      for (int k = 0; k <= kW; ++k) {
        float s = 0.f;
        for (int y = 0; y < kClY; ++y) s += red[y][threadIdx.x][k * kV + c];
        wsrow[k] = s;
      }
    }
  }
}

// Channels-last grids are 1-D, the channel groups (kClX x kV channels) of one
// (batch row, time chunk) consecutive: the blocks in flight then read and
// write whole time steps. With the time chunks consecutive instead, the
// row-kernel forward took 207.8 us against 203.5 us (H100, (8,4096,4096) bf16).
__host__ __device__ __forceinline__ int64_t ClGroups(int64_t dim, int kV) {
  return CeilDiv(dim, int64_t(kClX) * kV);
}
inline int64_t ClBlocks(int64_t batch, int64_t nchunk, int64_t dim, int kV) {
  return batch * nchunk * ClGroups(dim, kV);
}
struct ClBlock {
  int64_t b, chunk, c0;  // batch row, time chunk, this thread's first channel
};
template <int kV>
__device__ __forceinline__ ClBlock LocateClBlock(int64_t dim, int64_t nchunk) {
  const int64_t groups = ClGroups(dim, kV), rest = DivFast(blockIdx.x, groups);
  const int64_t b = DivFast(rest, nchunk);
  return {b, rest - b * nchunk, ((blockIdx.x - rest * groups) * kClX + threadIdx.x) * kV};
}

}  // namespace jcc::cuda
