// The channels-last decode hot path: one new token, state_len == W - 1,
// whole aligned channel words of kBytes (16 or 8). A thread owns C =
// kBytes / sizeof(T) channels of one row: x, y and each of the H state
// entries are one word at a stride of dim (coalesced across the warp), the
// weights C x W contiguous. 8-byte words while the whole grid of them fits
// on the GPU at once (twice the threads share each row's latency), else
// 16, as the channels-first path chooses 4 or 8 channels.
#include <cstdint>

#include "launchers.h"
#include "update_words.cuh"

namespace jcc::cuda {
namespace {

template <typename T, int kW, int kBytes>
__global__ void __launch_bounds__(kUpdateThreads) UpdateClVecKernel(const UpdateArgs u) {
  constexpr int H = kW - 1, C = kBytes / int(sizeof(T));
  using Vec = RawVec<T, kBytes>;
  const int64_t chunks = u.dim / C;
  const int64_t i = blockIdx.x * int64_t(kUpdateThreads) + threadIdx.x;
  if (i >= u.batch * chunks) return;
  const int64_t b = i / chunks, d0 = (i - b * chunks) * C;
  const int64_t slot = u.conv_state_indices ? int64_t(u.conv_state_indices[b]) : b;
  T* yp = static_cast<T*>(u.y) + b * u.dim + d0;
  if (slot < 0 || slot >= u.num_slots) {  // padding row: zeros, state untouched
    Vec z;
    z.Zero();
    z.Store(yp);
    return;
  }
  T* st = static_cast<T*>(u.conv_state) + slot * H * u.dim + d0;  // entry j at st + j * dim
  Vec xv, ev[H > 0 ? H : 1];
  xv.Load(static_cast<const T*>(u.x) + b * u.dim + d0);
#pragma unroll
  for (int j = 0; j < H; ++j)
#pragma unroll
    for (int q = 0; q < Vec::kWords; ++q)
      ev[j].w[q] = __ldcs(reinterpret_cast<const typename Vec::Word*>(st + j * u.dim) + q);
  const int64_t wrow = (b / (u.batch / u.groups)) * u.dim + d0;
  float w[C][kW], bias[C];
  LoadRowF<C * kW>(u.weight, u.w_dtype, wrow * kW, &w[0][0]);
  if (u.bias) LoadRowF<C>(u.bias, u.b_dtype, wrow, bias);
  else
#pragma unroll
    for (int c = 0; c < C; ++c) bias[c] = 0.f;
  // Ring of exactly H entries: the oldest (window slot 0) is where the new token goes.
  const int head = u.cache_seqlens ? int(((int64_t(u.cache_seqlens[b]) % H) + H) % H) : 0;
  const bool silu = u.act == Activation::kSilu;
  Vec yv;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    float acc = bias[c] + w[c][H] * ToF(xv[c]);
#pragma unroll
    for (int j = 0; j < H; ++j) {
      // window slot j is entry (head + j) mod H: select by compile-time indices
      float v = ToF(ev[j][c]);
      if (u.cache_seqlens) {
#pragma unroll
        for (int k = 1; k < H; ++k)
          if (head == k) v = ToF(ev[(j + k) % H][c]);
      }
      acc += w[c][j] * v;
    }
    yv[c] = FromF<T>(Activate(acc, silu));
  }
  yv.Store(yp);
  using Word = typename Vec::Word;
  if (u.cache_seqlens) {  // the new token replaces the oldest entry
#pragma unroll
    for (int k = 0; k < H; ++k)
      if (head == k)
#pragma unroll
        for (int q = 0; q < Vec::kWords; ++q) __stcs(reinterpret_cast<Word*>(st + k * u.dim) + q, xv.w[q]);
  } else {  // shift down by one entry, the token last
#pragma unroll
    for (int j = 0; j < H; ++j) {
      const Vec& nv = j + 1 < H ? ev[j + 1] : xv;
#pragma unroll
      for (int q = 0; q < Vec::kWords; ++q) __stcs(reinterpret_cast<Word*>(st + j * u.dim) + q, nv.w[q]);
    }
  }
}

template <typename T, int kW, int kBytes>
cudaError_t LaunchUpdateClVec(const UpdateArgs& u, cudaStream_t stream) {
  const unsigned blocks = unsigned(CeilDiv(u.batch * (u.dim / (kBytes / int(sizeof(T)))), kUpdateThreads));
  UpdateClVecKernel<T, kW, kBytes><<<blocks, kUpdateThreads, 0, stream>>>(u);
  return cudaGetLastError();
}

template <typename T, int kW>
cudaError_t LaunchUpdateClVecBest(const UpdateArgs& u, cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  const int sms = CurrentDeviceSms(&err);
  if (err != cudaSuccess) return err;
  constexpr int kWide = 16 / int(sizeof(T)), kNarrow = 8 / int(sizeof(T));
  if (u.dim % kWide != 0 ||
      u.batch * (u.dim / kNarrow) <= ResidentThreads<UpdateClVecKernel<T, kW, 8>>(sms))
    return LaunchUpdateClVec<T, kW, 8>(u, stream);
  return LaunchUpdateClVec<T, kW, 16>(u, stream);
}

// The channels-last hot path, when the problem fits it (false: launch nothing).
template <typename T>
bool TryUpdateClVec(const UpdateArgs& u, cudaStream_t stream, cudaError_t* err) {
  if (!u.channels_last || !u.x_dense() || u.seqlen != 1 || u.width < 2 || u.width > 4 ||
      u.state_len != u.width - 1 || u.dim % (8 / int(sizeof(T))) != 0 || !Aligned16(u.x) || !Aligned16(u.y) ||
      !Aligned16(u.conv_state) || !Aligned16(u.weight) || !Aligned16(u.bias) ||
      u.w_dtype == DType::kF64 || u.b_dtype == DType::kF64)
    return false;
  switch (u.width) {
    case 2: *err = LaunchUpdateClVecBest<T, 2>(u, stream); break;
    case 3: *err = LaunchUpdateClVecBest<T, 3>(u, stream); break;
    default: *err = LaunchUpdateClVecBest<T, 4>(u, stream); break;
  }
  return true;
}

}  // namespace

bool UpdateClVec(const UpdateArgs& u, cudaStream_t stream, cudaError_t* err) {
  return WithFloatType(u.x_dtype, false,
                       [&](auto t) { return TryUpdateClVec<decltype(t)>(u, stream, err); });
}

}  // namespace jcc::cuda
