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

// y of a word of C channels: bias + the taps on the window (the last H
// inputs, oldest first) and the token x, activated; zeros unless `live`.
template <typename T, int kW, int kBytes>
__device__ __forceinline__ RawVec<T, kBytes> ChannelWordY(const RawVec<T, kBytes>& x,
                                                          const RawVec<T, kBytes> (&win)[kW > 1 ? kW - 1 : 1],
                                                          const float (&w)[kBytes / sizeof(T)][kW],
                                                          const float (&bias)[kBytes / sizeof(T)], bool silu,
                                                          bool live = true) {
  constexpr int H = kW - 1, C = kBytes / int(sizeof(T));
  RawVec<T, kBytes> y;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    float acc = bias[c] + w[c][H] * ToF(x[c]);
#pragma unroll
    for (int j = 0; j < H; ++j) acc += w[c][j] * ToF(win[j][c]);
    y[c] = FromF<T>(live ? Activate(acc, silu) : 0.f);
  }
  return y;
}

// Multi-token steps (S > 1): a thread per row and word of channels, the
// window sliding in registers.
template <typename T, int kW, int kBytes>
__global__ void __launch_bounds__(kUpdateThreads) UpdateClVecKernel(const UpdateArgs u) {
  constexpr int H = kW - 1, C = kBytes / int(sizeof(T));
  using Vec = RawVec<T, kBytes>;
  const int64_t chunks = u.dim / C;
  const int64_t i = blockIdx.x * int64_t(kUpdateThreads) + threadIdx.x;
  if (i >= u.batch * chunks) return;
  const int64_t b = i / chunks, d0 = (i - b * chunks) * C;
  const int S = int(u.seqlen), SL = int(u.state_len);
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
  // Ring writes go as the tokens do (the window is in registers); tokens
  // before S - SL would be overwritten, so they are skipped.
  const int first_put = S > SL ? S - SL : 0;
  const RingEntries ring_at = ring ? RingAt(int(u.cache_seqlens[b]), H, SL, first_put) : RingEntries{0, 0};
  const int head = ring_at.head;
  Vec win[H > 0 ? H : 1];
#pragma unroll
  for (int j = 0; j < H; ++j) win[j].LoadStreaming(st + (head + j < SL ? head + j : head + j - SL) * u.dim);
  const int64_t wrow = (b / (u.batch / u.groups)) * u.dim + d0;
  float w[C][kW], bias[C];
  LoadChannelWeights(u, wrow, w, bias);
  const bool silu = u.act == Activation::kSilu;
  int put = ring_at.put;
  auto token = [&](int s) {
    Vec xv;
    xv.Load(xp + s * u.dim);
    ChannelWordY<T, kW, kBytes>(xv, win, w, bias, silu).Store(yp + s * u.dim);
    if (ring && s >= first_put) {
      xv.StoreStreaming(st + put * u.dim);
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
  for (int j = 0; j < H; ++j) win[j].StoreStreaming(st + j * u.dim);
}

// One batch row's loads for a thread's C channels (the decode step),
// issued before they are used.
template <typename T, int kW, int kBytes>
struct ClStepRow {
  static constexpr int H = kW - 1;
  using Vec = RawVec<T, kBytes>;
  Vec x, win[H > 0 ? H : 1];  // the token, and the last H inputs, oldest first
  T* st;                      // entry e of the slot at st + e * dim
  int put;                    // the ring entry the token goes to
  bool live;                  // else a padding row: y = 0, state kept

  __device__ __forceinline__ void Load(const UpdateArgs& u, int b, int d0) {
    const int SL = int(u.state_len);
    const int64_t slot = u.conv_state_indices ? int64_t(u.conv_state_indices[b]) : b;
    live = slot >= 0 && slot < u.num_slots;
    x.Load(static_cast<const T*>(u.x) + int64_t(b) * u.dim + d0);
    st = static_cast<T*>(u.conv_state) + (live ? slot : 0) * SL * u.dim + d0;
    int head = 0;  // a rolling state is the last H inputs, oldest first
    put = 0;
    if (u.cache_seqlens) {  // a ring of SL >= H entries: token t at entry t mod SL
      const RingEntries e = RingAt(u.cache_seqlens[b], H, SL, 0);
      head = e.head, put = e.put;
    }
#pragma unroll
    for (int j = 0; j < H; ++j) {
      const int e = head + j < SL ? head + j : head + j - SL;
      if (live) win[j].LoadStreaming(st + e * u.dim);
      else win[j].Zero();
    }
  }
};

// The decode step (S == 1): one row a thread while the grid fits on the
// GPU at once, else several (RowsPlan), the next row's loads in flight while
// this one is computed, as the channels-first path. kRows: several rows a
// thread (else one, as straight-line code: fewer registers).
template <typename T, int kW, int kBytes, bool kRows>
__global__ void __launch_bounds__(kUpdateThreads) UpdateClStepKernel(const UpdateArgs u, const RowsPlan p) {
  constexpr int H = kW - 1, C = kBytes / int(sizeof(T));
  using Row = ClStepRow<T, kW, kBytes>;
  using Vec = typename Row::Vec;
  const int t = blockIdx.x * kUpdateThreads + threadIdx.x;
  if (t >= p.row_groups * p.chunks) return;
  const int rg = t / p.chunks, d0 = (t - rg * p.chunks) * C;
  const int b0 = rg * p.rows, b1 = min(int(u.batch), b0 + p.rows);
  const bool silu = u.act == Activation::kSilu;
  float w[C][kW], bias[C];
  auto load_weights = [&](int g) {  // the taps and biases of these C channels in weight group g
    const int64_t wrow = int64_t(g) * u.dim + d0;
    LoadChannelWeights(u, wrow, w, bias);
  };
  auto finish = [&](const Row& r, int b) {  // everything after the loads of row b
    ChannelWordY<T, kW, kBytes>(r.x, r.win, w, bias, silu, r.live).Store(static_cast<T*>(u.y) + int64_t(b) * u.dim + d0);
    if (!r.live) return;
    if (u.cache_seqlens) {  // the token replaces the entry H behind the next one
      r.x.StoreStreaming(r.st + r.put * u.dim);
    } else {  // shift down by one entry, the token last
#pragma unroll
      for (int j = 0; j < H; ++j) {
        const Vec& nv = j + 1 < H ? r.win[j + 1] : r.x;
        nv.StoreStreaming(r.st + j * u.dim);
      }
    }
  };
  Row cur;
  cur.Load(u, b0, d0);
  if (!kRows) {  // straight line: the latency-bound small batch
    load_weights(b0 / p.group_rows);
    finish(cur, b0);
    return;
  }
  WalkRows(p, b0, b1, cur, [&](Row& r, int b) { r.Load(u, b, d0); }, load_weights, finish);
}

template <typename T, int kW, int kBytes>
cudaError_t LaunchUpdateClStep(const UpdateArgs& u, int64_t resident, cudaStream_t stream) {
  const RowsPlan p = PlanRows(u, u.dim / (kBytes / int(sizeof(T))), resident);
  if (p.rows == 1) UpdateClStepKernel<T, kW, kBytes, false><<<p.Blocks(), kUpdateThreads, 0, stream>>>(u, p);
  else UpdateClStepKernel<T, kW, kBytes, true><<<p.Blocks(), kUpdateThreads, 0, stream>>>(u, p);
  return cudaGetLastError();
}

template <typename T, int kW, int kBytes>
cudaError_t LaunchUpdateClVec(const UpdateArgs& u, cudaStream_t stream) {
  const unsigned blocks = unsigned(CeilDiv(u.batch * (u.dim / (kBytes / int(sizeof(T)))), kUpdateThreads));
  UpdateClVecKernel<T, kW, kBytes><<<blocks, kUpdateThreads, 0, stream>>>(u);
  return cudaGetLastError();
}

// 8-byte words while their grid of one row a thread fits on the GPU at once,
// else 16-byte words (and, for the decode step, several rows a thread).
template <typename T, int kW>
cudaError_t LaunchUpdateClVecBest(const UpdateArgs& u, cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  const int sms = CurrentDeviceSms(&err);
  if (err != cudaSuccess) return err;
  constexpr int kWide = 16 / int(sizeof(T)), kNarrow = 8 / int(sizeof(T));
  const int64_t resident8 = ResidentThreads<UpdateClStepKernel<T, kW, 8, false>>(sms);
  const bool narrow = u.dim % kWide != 0 || u.batch * (u.dim / kNarrow) <= resident8;
  if (u.seqlen > 1) return narrow ? LaunchUpdateClVec<T, kW, 8>(u, stream) : LaunchUpdateClVec<T, kW, 16>(u, stream);
  if (narrow) return LaunchUpdateClStep<T, kW, 8>(u, resident8, stream);
  return LaunchUpdateClStep<T, kW, 16>(u, ResidentThreads<UpdateClStepKernel<T, kW, 16, true>>(sms), stream);
}

// The channels-last hot path, when the problem fits it (false: launch nothing).
template <typename T>
bool TryUpdateClVec(const UpdateArgs& u, cudaStream_t stream, cudaError_t* err) {
  // (a rolling state longer than W - 1 shifts all its entries: the general kernel)
  if (!u.channels_last || !u.x_dense() || u.seqlen < 1 || u.width < 2 || u.width > 4 ||
      (u.cache_seqlens ? u.state_len < u.width - 1 : u.state_len != u.width - 1) ||
      u.dim % (8 / int(sizeof(T))) != 0 || !Aligned16(u.x) || !Aligned16(u.y) ||
      !Aligned16(u.conv_state) || !Aligned16(u.weight) || !Aligned16(u.bias) ||
      u.w_dtype == DType::kF64 || u.b_dtype == DType::kF64 ||
      u.batch * (u.dim / (8 / int(sizeof(T)))) + kUpdateThreads > INT32_MAX)  // 32-bit thread indices
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
