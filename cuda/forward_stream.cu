// Streaming forward for the hot case: channels-first x, one sequence per row
// (no seq_idx / varlen), width <= 4, rows whose length is a multiple of one
// 16-byte vector. Each thread reads one 16-byte vector of x, gets the H = W-1
// inputs before it from the neighbouring lane by a warp shuffle (lane 0 reads
// them from global memory, or from the initial states at t < 0), and writes
// one 16-byte vector of y: every byte moves once, fully coalesced.
#include "common.cuh"
#include "launchers.h"

namespace jcc::cuda {
namespace {

constexpr int kStreamThreads = 256;

template <typename T>
struct StreamVec {
  static constexpr int kN = 16 / int(sizeof(T));  // elements per thread
};

template <typename T, int kW>
__global__ void __launch_bounds__(kStreamThreads)
    FwdStreamKernel(const ConvArgs a, int64_t tiles_per_row) {
  constexpr int N = StreamVec<T>::kN;
  constexpr int H = kW - 1;
  static_assert(H < N, "halo must come from one neighbour");
  const int64_t blk = blockIdx.x;
  const int64_t row = blk / tiles_per_row;  // b * dim + d
  const int64_t t0 = (blk % tiles_per_row) * (int64_t(kStreamThreads) * N) +
                     int64_t(threadIdx.x) * N;
  const bool active = t0 < a.len;
  const int64_t b = row / a.dim, d = row % a.dim;
  const T* xrow = static_cast<const T*>(a.x) + row * a.len;

  float v[N];
  if (active) {
    LoadVec<T, N>(xrow + t0, v);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = 0.f;
  }
  // h[j] = x[t0 - H + j]
  float h[H > 0 ? H : 1];
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < H; ++j) h[j] = __shfl_up_sync(0xffffffffu, v[N - H + j], 1);
  if (lane == 0 && active) {
#pragma unroll
    for (int j = 0; j < H; ++j) {
      const int64_t p = t0 - H + j;
      if (p >= 0)
        h[j] = ToF(xrow[p]);
      else
        h[j] = a.initial_states ? LoadState<T>(a, a.initial_states, b, d, H + p) : 0.f;
    }
  }
  if (!active) return;

  const int64_t wrow = (b / a.batch_per_group()) * a.dim + d;
  float w[kW];
#pragma unroll
  for (int k = 0; k < kW; ++k) w[k] = LoadAnyF(a.weight, a.w_dtype, wrow * kW + k);
  const float bias = a.bias ? LoadAnyF(a.bias, a.b_dtype, wrow) : 0.f;
  const bool silu = a.act == Activation::kSilu;

  float r[N];
  if (a.residual) LoadVec<T, N>(static_cast<const T*>(a.residual) + row * a.len + t0, r);
  float out[N];
#pragma unroll
  for (int i = 0; i < N; ++i) {
    float acc = bias;
#pragma unroll
    for (int k = 0; k < kW; ++k) {
      const int idx = i - H + k;  // compile-time after unrolling
      acc += w[k] * (idx < 0 ? h[H + idx] : v[idx]);
    }
    acc = Activate(acc, silu);
    out[i] = a.residual ? acc + r[i] : acc;
  }
  StoreVec<T, N>(static_cast<T*>(a.y) + row * a.len + t0, out);
}

template <typename T, int kW>
cudaError_t LaunchStream(const ConvArgs& a, cudaStream_t stream) {
  constexpr int N = StreamVec<T>::kN;
  const int64_t tiles_per_row = CeilDiv(a.len, int64_t(kStreamThreads) * N);
  const int64_t blocks = a.batch * a.dim * tiles_per_row;
  if (blocks > INT32_MAX) return cudaErrorInvalidConfiguration;
  FwdStreamKernel<T, kW><<<unsigned(blocks), kStreamThreads, 0, stream>>>(a, tiles_per_row);
  return cudaGetLastError();
}

bool Aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T>
bool TryStreamT(const ConvArgs& a, cudaStream_t stream, cudaError_t* err) {
  constexpr int N = StreamVec<T>::kN;
  const int64_t blocks = a.batch * a.dim * CeilDiv(a.len, int64_t(kStreamThreads) * N);
  if (a.channels_last || a.mode != SegmentMode::kRow || a.width > 4 || a.len % N != 0 ||
      !Aligned16(a.x) || !Aligned16(a.y) || !Aligned16(a.residual) || blocks > INT32_MAX)
    return false;
  switch (a.width) {
    case 1: *err = LaunchStream<T, 1>(a, stream); break;
    case 2: *err = LaunchStream<T, 2>(a, stream); break;
    case 3: *err = LaunchStream<T, 3>(a, stream); break;
    default: *err = LaunchStream<T, 4>(a, stream); break;
  }
  return true;
}

}  // namespace

bool TryForwardStreaming(const ConvArgs& a, cudaStream_t stream, cudaError_t* err) {
  switch (a.x_dtype) {
    case DType::kF32: return TryStreamT<float>(a, stream, err);
    case DType::kF16: return TryStreamT<__half>(a, stream, err);
    case DType::kBF16: return TryStreamT<__nv_bfloat16>(a, stream, err);
    default: return false;
  }
}

}  // namespace jcc::cuda
