// The channels-first decode beside the hot path: the speculative ring
// (cache_seqlens, any state_len >= W - 1) and multi-token steps on a rolling
// state of W - 1 entries, 2 <= W <= 4, dim a multiple of 4, aligned buffers.
// A thread owns C = 4 consecutive channels of one row: the index math, the
// slot and the ring position are done once for them, the taps and biases
// load as words, and the window of each channel's last W - 1 inputs sits in
// registers. Ring entries are addresses here (entry e of channel c at
// c * state_len + e), so no register is indexed at run time. (A thread per
// channel, the general kernel, was bound by instructions: Nsight Compute,
// docs/performance-log.md.)
#include <cstdint>

#include "launchers.h"
#include "update_words.cuh"

namespace jcc::cuda {
namespace {

constexpr int kRingChannels = 4;

// kOne: S == 1 (x and y of the C channels are one word each). kStaged: each
// warp's state block (32 * C channels x state_len, contiguous) moves between
// global and shared memory as coalesced 16-byte words and the threads work on
// it there: read in place, a thread's scattered 2-byte entries would touch
// each sector of the block several times.
template <typename T, int kW, bool kOne, bool kStaged>
__global__ void __launch_bounds__(kUpdateThreads) UpdateRingCfKernel(const UpdateArgs u) {
  constexpr int H = kW - 1, C = kRingChannels;
  extern __shared__ uint4 stage[];
  using Vec = RawVec<T, C * sizeof(T)>;
  const int chunks = int(u.dim / C);
  const int i = blockIdx.x * kUpdateThreads + threadIdx.x;
  if (i >= int(u.batch) * chunks) return;
  const int b = i / chunks, d0 = (i - b * chunks) * C;
  const int S = kOne ? 1 : int(u.seqlen), SL = int(u.state_len);
  // token s of channel d0 + c at c * S + s (x and y)
  const T* xp = static_cast<const T*>(u.x) + (int64_t(b) * u.dim + d0) * S;
  T* yp = static_cast<T*>(u.y) + (int64_t(b) * u.dim + d0) * S;
  const int64_t slot = u.conv_state_indices ? int64_t(u.conv_state_indices[b]) : b;
  if (slot < 0 || slot >= u.num_slots) {  // padding row: zeros, state untouched
    for (int e = 0; e < C * S; ++e) yp[e] = FromF<T>(0.f);
    return;
  }
  T* st = static_cast<T*>(u.conv_state) + (slot * u.dim + d0) * SL;  // entry e of channel c at c * SL + e
  const int lane = threadIdx.x & 31;
  const int block_words = 32 * C * SL * int(sizeof(T)) / 16;  // (a whole number: see TryUpdateRingCf)
  uint4* gblock = reinterpret_cast<uint4*>(st - lane * C * SL);  // the warp's state block
  uint4* sblock = stage + (threadIdx.x >> 5) * block_words;
  if (kStaged) {  // (whole warps: rows, slots and the exit above are warp-uniform)
    for (int q = lane; q < block_words; q += 32) sblock[q] = __ldcs(gblock + q);
    __syncwarp();
    st = reinterpret_cast<T*>(sblock) + lane * C * SL;
  }
  const bool ring = u.cache_seqlens != nullptr;
  // Ring writes go as the tokens do (the window is in registers); tokens
  // before S - SL would be overwritten, so they are skipped.
  const int first_put = S > SL ? S - SL : 0;
  // (a rolling state here has SL == H: its window starts at entry 0)
  const RingEntries ring_at = ring ? RingAt(int(u.cache_seqlens[b]), H, SL, first_put) : RingEntries{0, 0};
  const int head = ring_at.head;
  float win[C][H > 0 ? H : 1];
#pragma unroll
  for (int j = 0; j < H; ++j) {
    const int e = head + j < SL ? head + j : head + j - SL;
#pragma unroll
    for (int c = 0; c < C; ++c) win[c][j] = ToF(st[c * SL + e]);
  }
  const int64_t wrow = int64_t(b / int(u.batch / u.groups)) * u.dim + d0;
  float w[C][kW], bias[C];
  LoadChannelWeights(u, wrow, w, bias);
  const bool silu = u.act == Activation::kSilu;
  int put = ring_at.put;
  for (int s = 0; s < S; ++s) {
    Vec xv, yv;
    if (kOne) xv.Load(xp);
    else
#pragma unroll
      for (int c = 0; c < C; ++c) xv[c] = xp[c * S + s];
#pragma unroll
    for (int c = 0; c < C; ++c) {
      const float xin = ToF(xv[c]);
      float acc = bias[c] + w[c][H] * xin;
#pragma unroll
      for (int j = 0; j < H; ++j) acc += w[c][j] * win[c][j];
      yv[c] = FromF<T>(Activate(acc, silu));
#pragma unroll
      for (int j = 0; j + 1 < H; ++j) win[c][j] = win[c][j + 1];
      if (H > 0) win[c][H - 1] = xin;
      if (ring && s >= first_put) st[c * SL + put] = xv[c];
    }
    if (ring && s >= first_put) put = put + 1 < SL ? put + 1 : 0;
    if (kOne) yv.Store(yp);
    else
#pragma unroll
      for (int c = 0; c < C; ++c) yp[c * S + s] = yv[c];
  }
  if (!ring) {
    // Rolling state: the window holds the last H inputs, oldest first. (The
    // inputs were exact values of T, so the round trip through float is too.)
#pragma unroll
    for (int c = 0; c < C; ++c)
#pragma unroll
      for (int j = 0; j < H; ++j) st[c * SL + j] = FromF<T>(win[c][j]);
  }
  if (kStaged) {
    __syncwarp();
    for (int q = lane; q < block_words; q += 32) __stcs(gblock + q, sblock[q]);
  }
}

// Staging while a block's state blocks fit this much shared memory (4 warps;
// state_len <= 16 for 2-byte types at the default).
constexpr int kRingStageBytes = 16 << 10;

template <typename T, int kW, bool kStaged>
void LaunchUpdateRingCfAs(const UpdateArgs& u, unsigned blocks, int smem, cudaStream_t stream) {
  if (u.seqlen == 1) UpdateRingCfKernel<T, kW, true, kStaged><<<blocks, kUpdateThreads, smem, stream>>>(u);
  else UpdateRingCfKernel<T, kW, false, kStaged><<<blocks, kUpdateThreads, smem, stream>>>(u);
}

template <typename T, int kW>
cudaError_t LaunchUpdateRingCf(const UpdateArgs& u, cudaStream_t stream) {
  const unsigned blocks = unsigned(CeilDiv(u.batch * (u.dim / kRingChannels), kUpdateThreads));
  // Whole warps on one row (dim a multiple of 32 * C channels), the warp's
  // block whole 16-byte words from an aligned base.
  const int64_t smem = int64_t(kUpdateThreads) * kRingChannels * u.state_len * int64_t(sizeof(T));
  const bool staged = u.dim % (32 * kRingChannels) == 0 && smem <= kRingStageBytes &&
                      (32 * kRingChannels * u.state_len * int64_t(sizeof(T))) % 16 == 0 && Aligned16(u.conv_state);
  if (staged) LaunchUpdateRingCfAs<T, kW, true>(u, blocks, int(smem), stream);
  else LaunchUpdateRingCfAs<T, kW, false>(u, blocks, 0, stream);
  return cudaGetLastError();
}

template <typename T>
bool TryUpdateRingCf(const UpdateArgs& u, cudaStream_t stream, cudaError_t* err) {
  // (a rolling state longer than W - 1 shifts all its entries: the general kernel)
  if (u.channels_last || !u.x_dense() || u.seqlen < 1 || u.width < 2 || u.width > 4 ||
      (u.cache_seqlens ? u.state_len < u.width - 1 : u.state_len != u.width - 1) ||
      u.dim % kRingChannels != 0 || !Aligned16(u.x) || !Aligned16(u.y) || !Aligned16(u.weight) ||
      !Aligned16(u.bias) || u.w_dtype == DType::kF64 || u.b_dtype == DType::kF64 ||
      u.batch * (u.dim / kRingChannels) + kUpdateThreads > INT32_MAX)  // 32-bit thread indices
    return false;
  switch (u.width) {
    case 2: *err = LaunchUpdateRingCf<T, 2>(u, stream); break;
    case 3: *err = LaunchUpdateRingCf<T, 3>(u, stream); break;
    default: *err = LaunchUpdateRingCf<T, 4>(u, stream); break;
  }
  return true;
}

}  // namespace

bool UpdateRingCf(const UpdateArgs& u, cudaStream_t stream, cudaError_t* err) {
  return WithFloatType(u.x_dtype, false,
                       [&](auto t) { return TryUpdateRingCf<decltype(t)>(u, stream, err); });
}

}  // namespace jcc::cuda
