// The channels-last decode hot path: S >= 1 new tokens against a rolling
// state of W - 1 entries or a ring of any length (cache_seqlens: speculative
// decoding), whole aligned channel words of kBytes (16 or 8). A thread owns C =
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

// kOne: S == 1, the decode step, as straight-line code (fewer registers).
template <typename T, int kW, int kBytes, bool kOne>
__global__ void __launch_bounds__(kUpdateThreads) UpdateClVecKernel(const UpdateArgs u) {
  constexpr int H = kW - 1, C = kBytes / int(sizeof(T));
  using Vec = RawVec<T, kBytes>;
  using Word = typename Vec::Word;
  const int64_t chunks = u.dim / C;
  const int64_t i = blockIdx.x * int64_t(kUpdateThreads) + threadIdx.x;
  if (i >= u.batch * chunks) return;
  const int64_t b = i / chunks, d0 = (i - b * chunks) * C;
  const int S = kOne ? 1 : int(u.seqlen), SL = int(u.state_len);
  const int64_t slot = u.conv_state_indices ? int64_t(u.conv_state_indices[b]) : b;
  const T* xp = static_cast<const T*>(u.x) + b * S * u.dim + d0;  // token s at xp + s * dim
  T* yp = static_cast<T*>(u.y) + b * S * u.dim + d0;
  if (slot < 0 || slot >= u.num_slots) {  // padding row: zeros, state untouched
    Vec z;
    z.Zero();
    for (int s = 0; s < S; ++s) z.Store(yp + s * u.dim);
    return;
  }
  T* st = static_cast<T*>(u.conv_state) + slot * SL * u.dim + d0;  // entry j at st + j * dim
  // The window: entry (head + j) mod SL is input j of the last H. A ring of
  // SL >= H entries (cache_seqlens) puts token s at entry (seen + s) mod SL;
  // else the state is exactly the last H inputs, oldest first (head 0).
  const bool ring = u.cache_seqlens != nullptr;
  const int seen = ring ? int(u.cache_seqlens[b]) : 0;
  const int head = ring ? ((seen - H) % SL + SL) % SL : 0;
  Vec win[H > 0 ? H : 1];
#pragma unroll
  for (int j = 0; j < H; ++j) {
    const int e = head + j < SL ? head + j : head + j - SL;
#pragma unroll
    for (int q = 0; q < Vec::kWords; ++q) win[j].w[q] = __ldcs(reinterpret_cast<const Word*>(st + e * u.dim) + q);
  }
  const int64_t wrow = (b / (u.batch / u.groups)) * u.dim + d0;
  float w[C][kW], bias[C];
  LoadRowF<C * kW>(u.weight, u.w_dtype, wrow * kW, &w[0][0]);
  if (u.bias) LoadRowF<C>(u.bias, u.b_dtype, wrow, bias);
  else
#pragma unroll
    for (int c = 0; c < C; ++c) bias[c] = 0.f;
  const bool silu = u.act == Activation::kSilu;
  // Ring writes go as the tokens do (the window is in registers); tokens
  // before S - SL would be overwritten, so they are skipped.
  const int first_put = S > SL ? S - SL : 0;
  int put = ring ? ((seen + first_put) % SL + SL) % SL : 0;
  auto token = [&](int s) {
    Vec xv, yv;
    xv.Load(xp + s * u.dim);
#pragma unroll
    for (int c = 0; c < C; ++c) {
      float acc = bias[c] + w[c][H] * ToF(xv[c]);
#pragma unroll
      for (int j = 0; j < H; ++j) acc += w[c][j] * ToF(win[j][c]);
      yv[c] = FromF<T>(Activate(acc, silu));
    }
    yv.Store(yp + s * u.dim);
    if (ring && s >= first_put) {
#pragma unroll
      for (int q = 0; q < Vec::kWords; ++q) __stcs(reinterpret_cast<Word*>(st + put * u.dim) + q, xv.w[q]);
      put = put + 1 < SL ? put + 1 : 0;
    }
#pragma unroll
    for (int j = 0; j + 1 < H; ++j) win[j] = win[j + 1];
    if (H > 0) win[H - 1] = xv;
  };
  for (int s = 0; s < S; ++s) token(s);
  if (ring) return;
  // Rolling state: the window now holds the last H inputs, oldest first.
#pragma unroll
  for (int j = 0; j < H; ++j)
#pragma unroll
    for (int q = 0; q < Vec::kWords; ++q) __stcs(reinterpret_cast<Word*>(st + j * u.dim) + q, win[j].w[q]);
}

template <typename T, int kW, int kBytes>
cudaError_t LaunchUpdateClVec(const UpdateArgs& u, cudaStream_t stream) {
  const unsigned blocks = unsigned(CeilDiv(u.batch * (u.dim / (kBytes / int(sizeof(T)))), kUpdateThreads));
  if (u.seqlen == 1) UpdateClVecKernel<T, kW, kBytes, true><<<blocks, kUpdateThreads, 0, stream>>>(u);
  else UpdateClVecKernel<T, kW, kBytes, false><<<blocks, kUpdateThreads, 0, stream>>>(u);
  return cudaGetLastError();
}

template <typename T, int kW>
cudaError_t LaunchUpdateClVecBest(const UpdateArgs& u, cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  const int sms = CurrentDeviceSms(&err);
  if (err != cudaSuccess) return err;
  constexpr int kWide = 16 / int(sizeof(T)), kNarrow = 8 / int(sizeof(T));
  if (u.dim % kWide != 0 ||
      u.batch * (u.dim / kNarrow) <= ResidentThreads<UpdateClVecKernel<T, kW, 8, true>>(sms))
    return LaunchUpdateClVec<T, kW, 8>(u, stream);
  return LaunchUpdateClVec<T, kW, 16>(u, stream);
}

// The channels-last hot path, when the problem fits it (false: launch nothing).
template <typename T>
bool TryUpdateClVec(const UpdateArgs& u, cudaStream_t stream, cudaError_t* err) {
  // (a rolling state longer than W - 1 shifts all its entries: the general kernel)
  if (!u.channels_last || !u.x_dense() || u.seqlen < 1 || u.width < 2 || u.width > 4 ||
      (u.cache_seqlens ? u.state_len < u.width - 1 : u.state_len != u.width - 1) || u.dim % (8 / int(sizeof(T))) != 0 || !Aligned16(u.x) || !Aligned16(u.y) ||
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
