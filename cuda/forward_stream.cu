// Streaming forward for the hot case (see stream.cuh): each thread loads its
// kVecs 16-byte vectors of x (and of the residual) at once, gets the H = W-1
// inputs before each vector from the neighbouring lane by a warp shuffle
// (lane 0 from lane 31's previous vector, or, for the chunk's first vector,
// from one extra load issued with the others), and writes kVecs vectors of y.
// Every byte of x and y moves once, fully coalesced.
#include "launchers.h"
#include "stream.cuh"

namespace jcc::cuda {
namespace {

template <typename T, int kW>
__global__ void __launch_bounds__(kStreamThreads)
    FwdStreamKernel(const ConvArgs a, int64_t warps_per_row) {
  using S = Stream<T>;
  constexpr int N = S::kN, V = S::kVecs, H = kW - 1, kHist = H > 0 ? H : 1;
  static_assert(H < N, "halo must come from one neighbour");
  const WarpChunk wc = LocateWarp(a, warps_per_row, S::kWarpSteps);
  if (!wc.valid) return;
  const int lane = threadIdx.x & 31;
  const int64_t L = a.len;
  const T* xrow = static_cast<const T*>(a.x) + wc.row * L;

  // All loads first: x vectors, the vector before the chunk, the residual.
  uint4 xr[V], rr[V], prev = make_uint4(0, 0, 0, 0);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int64_t t = wc.c0 + int64_t(j * 32 + lane) * N;
    xr[j] = t < L ? LoadRaw16(xrow + t) : make_uint4(0, 0, 0, 0);
  }
  if (H > 0 && lane == 0 && wc.c0 > 0) prev = LoadRaw16(xrow + wc.c0 - N);
  if (a.residual) {
    const T* rrow = static_cast<const T*>(a.residual) + wc.row * L;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int64_t t = wc.c0 + int64_t(j * 32 + lane) * N;
      rr[j] = t < L ? LoadRaw16(rrow + t) : make_uint4(0, 0, 0, 0);
    }
  }
  float w[kW];
  const float bias = LoadTaps<kW>(a, wc.row, w);
  const bool silu = a.act == Activation::kSilu;

  float carry[kHist] = {};
  if (H > 0 && lane == 0) ChunkHistory<T, N, H, kHist>(a, wc.row, wc.c0, prev, carry);
  T* yrow = static_cast<T*>(a.y) + wc.row * L;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    float v[N], h[kHist];
    Unpack<T, N>(xr[j], v);
    HaloFromLeft<N, H, kHist>(v, lane, carry, h);
    float out[N];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      float acc = bias;
#pragma unroll
      for (int k = 0; k < kW; ++k) {
        const int idx = i - H + k;  // compile-time after unrolling
        acc += w[k] * (idx < 0 ? h[H + idx] : v[idx]);
      }
      out[i] = Activate(acc, silu);
    }
    if (a.residual) {
      float r[N];
      Unpack<T, N>(rr[j], r);
#pragma unroll
      for (int i = 0; i < N; ++i) out[i] += r[i];
    }
    const int64_t t = wc.c0 + int64_t(j * 32 + lane) * N;
    if (t < L) StoreVec<T, N>(yrow + t, out);
  }
}

template <typename T, int kW>
cudaError_t LaunchStream(const ConvArgs& a, int64_t warps_per_row, cudaStream_t stream) {
  FwdStreamKernel<T, kW><<<unsigned(StreamBlocks(a, warps_per_row)), kStreamThreads, 0, stream>>>(
      a, warps_per_row);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchT(const ConvArgs& a, int64_t warps_per_row, cudaStream_t stream) {
  switch (a.width) {
    case 1: return LaunchStream<T, 1>(a, warps_per_row, stream);
    case 2: return LaunchStream<T, 2>(a, warps_per_row, stream);
    case 3: return LaunchStream<T, 3>(a, warps_per_row, stream);
    default: return LaunchStream<T, 4>(a, warps_per_row, stream);
  }
}

}  // namespace

int64_t StreamWarpsPerRow(const ConvArgs& a, bool backward, int64_t* chunks_per_warp) {
  const int64_t steps = a.x_dtype == DType::kF32 ? Stream<float>::kWarpSteps : Stream<__half>::kWarpSteps;
  const int64_t per_row = CeilDiv(a.len, steps), rows = a.batch * a.dim;
  int64_t k = 1;
  if (backward)
    while (2 * k <= kMaxChunksPerWarp && 2 * k <= per_row && rows * CeilDiv(per_row, 2 * k) >= 32768)
      k *= 2;
  *chunks_per_warp = k;
  const int64_t warps_per_row = CeilDiv(per_row, k);
  return StreamBlocks(a, warps_per_row) <= INT32_MAX ? warps_per_row : 0;
}

cudaError_t ForwardStream(const ConvArgs& a, const ForwardPlan& p, cudaStream_t stream) {
  switch (a.x_dtype) {
    case DType::kF32: return LaunchT<float>(a, p.warps_per_row, stream);
    case DType::kF16: return LaunchT<__half>(a, p.warps_per_row, stream);
    case DType::kBF16: return LaunchT<__nv_bfloat16>(a, p.warps_per_row, stream);
    default: return cudaErrorNotSupported;
  }
}

}  // namespace jcc::cuda
