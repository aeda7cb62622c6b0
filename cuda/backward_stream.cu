// Streaming backward for the hot case of forward_stream.cu (channels-first,
// one sequence per row, width <= 4, 16-byte aligned rows). Each thread owns
// one 16-byte vector of steps: x before it comes from lane - 1 and g after it
// from lane + 1 by warp shuffles (the warp's edge lanes read global memory).
//   g[t] = dy[t] act'(pre[t]),  dx[t] = sum_k w[k] g[t + H - k] (+ dfinal tail)
// Each block's partial dweight/dbias go to ws[g][part][d][W + 1] (as the tiled
// kernels lay it out) for backward.cu's ReduceKernel to add in a fixed order;
// dinitial_states is left to DInitKernel.
#include "common.cuh"
#include "launchers.h"

namespace jcc::cuda {
namespace {

constexpr int kStreamThreads = 256;
constexpr int kWarps = kStreamThreads / 32;

template <typename T>
struct StreamVec {
  static constexpr int kN = 16 / int(sizeof(T));
};

template <typename T, int kW>
__global__ void __launch_bounds__(kStreamThreads)
    BwdStreamKernel(const ConvArgs a, int64_t tiles_per_row, float* ws) {
  constexpr int N = StreamVec<T>::kN;
  constexpr int H = kW - 1;
  constexpr int kHist = H > 0 ? H : 1;
  const int64_t row = blockIdx.x / tiles_per_row, tile = blockIdx.x % tiles_per_row;
  const int64_t t0 = tile * (int64_t(kStreamThreads) * N) + int64_t(threadIdx.x) * N;
  const bool active = t0 < a.len;
  const int64_t L = a.len, b = row / a.dim, d = row % a.dim;
  const int lane = threadIdx.x & 31;
  const T* xrow = static_cast<const T*>(a.x) + row * L;
  const T* dyrow = static_cast<const T*>(a.dy) + row * L;

  const int64_t wrow = (b / a.batch_per_group()) * a.dim + d;
  float w[kW];
#pragma unroll
  for (int k = 0; k < kW; ++k) w[k] = LoadAnyF(a.weight, a.w_dtype, wrow * kW + k);
  const float bias = a.bias ? LoadAnyF(a.bias, a.b_dtype, wrow) : 0.f;
  const bool silu = a.act == Activation::kSilu;

  // Input at step p (history from the initial states or zeros before 0).
  auto x_at = [&](int64_t p) -> float {
    if (p >= 0) return p < L ? ToF(xrow[p]) : 0.f;
    return a.initial_states ? LoadState<T>(a, a.initial_states, b, d, H + p) : 0.f;
  };
  // g at step p, computed from global memory (warp edges only).
  auto g_at = [&](int64_t p) -> float {
    if (p >= L) return 0.f;
    if (!silu) return ToF(dyrow[p]);
    float pre = bias;
#pragma unroll
    for (int k = 0; k < kW; ++k) pre += w[k] * x_at(p - H + k);
    return ActGrad(pre, ToF(dyrow[p]), true);
  };

  // win = x[t0 - H .. t0 + N)
  float win[H + N];
  float* v = win + H;
  float dyv[N];
  if (active) {
    LoadVec<T, N>(xrow + t0, *reinterpret_cast<float(*)[N]>(v));
    LoadVec<T, N>(dyrow + t0, dyv);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = dyv[j] = 0.f;
  }
#pragma unroll
  for (int j = 0; j < H; ++j) win[j] = __shfl_up_sync(0xffffffffu, v[N - H + j], 1);
  if (lane == 0 && active) {
#pragma unroll
    for (int j = 0; j < H; ++j) win[j] = x_at(t0 - H + j);
  }

  // ge = g[t0 .. t0 + N + H): own steps, then the next H from lane + 1
  float ge[N + kHist];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    if (silu) {
      float pre = bias;
#pragma unroll
      for (int k = 0; k < kW; ++k) pre += w[k] * win[i + k];
      ge[i] = active ? ActGrad(pre, dyv[i], true) : 0.f;
    } else {
      ge[i] = dyv[i];
    }
  }
#pragma unroll
  for (int j = 0; j < H; ++j) ge[N + j] = __shfl_down_sync(0xffffffffu, ge[j], 1);
  if (lane == 31 && active) {
#pragma unroll
    for (int j = 0; j < H; ++j) ge[N + j] = g_at(t0 + N + j);
  }

  // partial dweight (k < W) and dbias (k == W) of this thread's steps
  float part[kW + 1];
#pragma unroll
  for (int k = 0; k <= kW; ++k) part[k] = 0.f;
  if (active) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
#pragma unroll
      for (int k = 0; k < kW; ++k) part[k] += ge[i] * win[i + k];
      part[kW] += ge[i];
    }
    float dx[N];
    const int64_t fin0 = L - H;  // first step whose input is also a final state
#pragma unroll
    for (int i = 0; i < N; ++i) {
      float acc = 0.f;
#pragma unroll
      for (int k = 0; k < kW; ++k) acc += w[k] * ge[i + H - k];
      const int64_t p = t0 + i;
      if (a.dfinal_states && p >= fin0) acc += LoadState<T>(a, a.dfinal_states, b, d, p - fin0);
      dx[i] = acc;
    }
    StoreVec<T, N>(static_cast<T*>(a.dx) + row * L + t0, dx);
  }

  // Block reduction in a fixed order: warp butterfly, then warps in order.
  __shared__ float red[kWarps][kW + 1];
#pragma unroll
  for (int k = 0; k <= kW; ++k) {
    float s = part[k];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) red[threadIdx.x / 32][k] = s;
  }
  __syncthreads();
  if (threadIdx.x <= kW) {
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) s += red[i][threadIdx.x];
    const int64_t bpg = a.batch_per_group(), grp = b / bpg;
    const int64_t nparts = bpg * tiles_per_row, partidx = (b % bpg) * tiles_per_row + tile;
    ws[((grp * nparts + partidx) * a.dim + d) * (kW + 1) + threadIdx.x] = s;
  }
}

template <typename T, int kW>
cudaError_t LaunchBwdStream(const ConvArgs& a, float* ws, cudaStream_t stream) {
  const int64_t tiles = StreamingBackwardTiles(a);
  BwdStreamKernel<T, kW><<<unsigned(a.batch * a.dim * tiles), kStreamThreads, 0, stream>>>(
      a, tiles, ws);
  return cudaGetLastError();
}

bool Aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T>
cudaError_t LaunchT(const ConvArgs& a, float* ws, cudaStream_t stream) {
  switch (a.width) {
    case 1: return LaunchBwdStream<T, 1>(a, ws, stream);
    case 2: return LaunchBwdStream<T, 2>(a, ws, stream);
    case 3: return LaunchBwdStream<T, 3>(a, ws, stream);
    default: return LaunchBwdStream<T, 4>(a, ws, stream);
  }
}

}  // namespace

int64_t StreamingBackwardTiles(const ConvArgs& a) {
  const int64_t n = 16 / DTypeBytes(a.x_dtype);
  const bool fits = a.x_dtype != DType::kF64 && !a.channels_last && a.mode == SegmentMode::kRow &&
                    a.width <= 4 && a.len > 0 && a.len % n == 0 && Aligned16(a.x) &&
                    Aligned16(a.dy) && Aligned16(a.dx);
  if (!fits) return 0;
  const int64_t tiles = CeilDiv(a.len, int64_t(kStreamThreads) * n);
  return a.batch * a.dim * tiles <= INT32_MAX ? tiles : 0;
}

cudaError_t BackwardStreaming(const ConvArgs& a, float* ws, cudaStream_t stream) {
  switch (a.x_dtype) {
    case DType::kF32: return LaunchT<float>(a, ws, stream);
    case DType::kF16: return LaunchT<__half>(a, ws, stream);
    case DType::kBF16: return LaunchT<__nv_bfloat16>(a, ws, stream);
    default: return cudaErrorNotSupported;
  }
}

}  // namespace jcc::cuda
