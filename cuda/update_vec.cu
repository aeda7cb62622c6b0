// The channels-first decode hot path: one new token, state_len == W - 1
// (2 <= W <= 4), dim a multiple of 4, 16-byte aligned buffers. Each thread
// owns C = 4 or 8 consecutive channels and a run of batch rows, so x, y and
// the state rows move in whole words (C channels x H entries are
// contiguous). What made it faster (docs/performance-log.md): 8-channel
// state rows moving as warp-wide coalesced words through shared memory,
// marked streaming (it is not read again until the next step), 32-bit
// index math, and, when the batch is larger than the GPU holds at once,
// several rows per thread with the next row's loads in flight while the
// current one is computed.
#include <algorithm>
#include <cstdint>

#include "launchers.h"
#include "update_words.cuh"

namespace jcc::cuda {
namespace {

// Whether rows of C channels may go through shared memory: it pays for
// 8-channel rows (48-byte state rows for 2-byte types), not for 4-channel
// ones (measured: docs/performance-log.md).
__host__ __device__ constexpr bool StagesRows(int C) { return C == 8; }

// The hot-path grid (RowsPlan), and whether each warp's state rows are
// contiguous and go through shared memory (StagesRows).
struct UpdatePlan : RowsPlan {
  bool staged = false;
};

// One batch row's share of a thread: its loads, issued before they are used.
template <typename T, int kW, int C>
struct UpdateRow {
  static constexpr int H = kW - 1;
  RawVec<T, C * sizeof(T)> x;
  RawVec<T, C * H * sizeof(T)> s;  // this thread's words, or (staged) word q * 32 + lane
  T* st;
  int head;  // circular buffer: the oldest entry, the one the new token replaces
  bool live;  // else a padding row: y = 0, state kept

  __device__ __forceinline__ void Load(const UpdateArgs& u, int b, int d0, int lane, bool staged) {
    const int64_t slot = u.conv_state_indices ? int64_t(u.conv_state_indices[b]) : b;
    live = slot >= 0 && slot < u.num_slots;
    st = static_cast<T*>(u.conv_state) + (slot * u.dim + d0) * H;
    x.Load(static_cast<const T*>(u.x) + int64_t(b) * u.dim + d0);
    head = u.cache_seqlens ? int(((int64_t(u.cache_seqlens[b]) % H) + H) % H) : 0;
    // Streaming loads: the state is not read again before the next step.
    using Word = typename decltype(s)::Word;
    const Word* src = reinterpret_cast<const Word*>(staged ? st - lane * C * H : st);
    if (!live) s.Zero();
    else
#pragma unroll
      for (int q = 0; q < s.kWords; ++q) s.w[q] = __ldcs(staged ? src + q * 32 + lane : src + q);
  }
};

// y and the new state rows of C channels.
template <typename T, int kW, int C, bool kCircular>
__device__ __forceinline__ void UpdateChannels(const UpdateRow<T, kW, C>& r, const float (&w)[C][kW],
                                               const float (&bias)[C], bool silu,
                                               RawVec<T, C * sizeof(T)>& yv,
                                               RawVec<T, C * (kW - 1) * sizeof(T)>& out) {
  constexpr int H = kW - 1;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    float row[H];
#pragma unroll
    for (int q = 0; q < H; ++q) row[q] = ToF(r.s[c * H + q]);
    const float xin = ToF(r.x[c]);
    float acc = bias[c] + w[c][H] * xin;
    // win[j] = entry (head + j) mod H, by whole compile-time rotations (a
    // run-time index would put the rows in local memory)
    float win[H];
#pragma unroll
    for (int j = 0; j < H; ++j) win[j] = row[j];
    if (kCircular) {
#pragma unroll
      for (int k = 1; k < H; ++k)
        if (r.head == k) {
#pragma unroll
          for (int j = 0; j < H; ++j) win[j] = row[(j + k) % H];
        }
    }
#pragma unroll
    for (int j = 0; j < H; ++j) acc += w[c][j] * win[j];
    yv[c] = FromF<T>(r.live ? Activate(acc, silu) : 0.f);
#pragma unroll
    for (int q = 0; q < H; ++q) {
      float nv;
      if (kCircular) nv = q == r.head ? xin : row[q];  // replace the oldest
      else nv = q + 1 < H ? row[q + 1] : xin;          // shift left
      out[c * H + q] = FromF<T>(nv);
    }
  }
}

// (4 blocks per SM for 2-byte types; float32 would spill there)
template <typename T, int kW, int C>
__global__ void __launch_bounds__(kUpdateThreads, sizeof(T) == 2 ? 4 : 3)
    UpdateVecKernel(const UpdateArgs u, const UpdatePlan p) {
  constexpr int H = kW - 1;
  using Row = UpdateRow<T, kW, C>;
  using Word = typename decltype(Row::s)::Word;
  constexpr int kWords = decltype(Row::s)::kWords;
  // A warp's 32 x kWords state words: loaded and stored by word (coalesced),
  // used by thread. Each lane writes only the slots it read, so one
  // __syncwarp per change of direction suffices.
  __shared__ Word stage[kUpdateThreads / 32][32 * kWords];
  const int t = blockIdx.x * kUpdateThreads + threadIdx.x;
  if (t >= p.row_groups * p.chunks) return;  // whole warps when staged
  const int lane = threadIdx.x & 31;
  const int rg = t / p.chunks, d0 = (t - rg * p.chunks) * C;
  const int b0 = rg * p.rows, b1 = min(int(u.batch), b0 + p.rows);
  Word* buf = stage[threadIdx.x >> 5];
  const bool staged = StagesRows(C) && p.staged;  // so unstaged widths compile without it
  const bool silu = u.act == Activation::kSilu;

  float w[C][kW], bias[C];
  auto load_weights = [&](int g) {  // the taps and biases of these C channels in weight group g
    const int64_t wrow = int64_t(g) * u.dim + d0;
    LoadChannelWeights(u, wrow, w, bias);
  };
  auto finish = [&](Row& r, int b) {  // everything after the loads of row b
    if (staged && r.live) {  // word q * 32 + lane -> this thread's words
#pragma unroll
      for (int q = 0; q < kWords; ++q) buf[q * 32 + lane] = r.s.w[q];
      __syncwarp();
#pragma unroll
      for (int q = 0; q < kWords; ++q) r.s.w[q] = buf[lane * kWords + q];
    }
    RawVec<T, C * sizeof(T)> yv;
    RawVec<T, C * H * sizeof(T)> out;  // the new state rows
    if (u.cache_seqlens) UpdateChannels<T, kW, C, true>(r, w, bias, silu, yv, out);
    else UpdateChannels<T, kW, C, false>(r, w, bias, silu, yv, out);
    yv.Store(static_cast<T*>(u.y) + int64_t(b) * u.dim + d0);
    if (!r.live) return;
    if (staged) {  // back to word order, then coalesced streaming stores
#pragma unroll
      for (int q = 0; q < kWords; ++q) buf[lane * kWords + q] = out.w[q];
      __syncwarp();
      Word* dst = reinterpret_cast<Word*>(r.st - lane * C * H);
#pragma unroll
      for (int q = 0; q < kWords; ++q) __stcs(dst + q * 32 + lane, buf[q * 32 + lane]);
    } else {
#pragma unroll
      for (int q = 0; q < kWords; ++q) __stcs(reinterpret_cast<Word*>(r.st) + q, out.w[q]);
    }
  };

  Row cur;
  cur.Load(u, b0, d0, lane, staged);
  if (p.rows == 1) {  // straight line: the latency-bound small batch
    load_weights(b0 / p.group_rows);
    finish(cur, b0);
    return;
  }
  WalkRows(p, b0, b1, cur, [&](Row& r, int b) { r.Load(u, b, d0, lane, staged); }, load_weights, finish);
}

template <typename T, int kW, int C>
cudaError_t LaunchUpdateVec(const UpdateArgs& u, int64_t resident, cudaStream_t stream) {
  UpdatePlan p;
  static_cast<RowsPlan&>(p) = PlanRows(u, u.dim / C, resident);
  p.staged = StagesRows(C) && p.chunks % 32 == 0;
  UpdateVecKernel<T, kW, C><<<p.Blocks(), kUpdateThreads, 0, stream>>>(u, p);
  return cudaGetLastError();
}

// 4 channels per thread while the whole grid is resident at once, one row
// per thread: twice the warps then share each row's latency. Past that, 8
// channels and several rows per thread (both measured faster there:
// docs/performance-log.md).
template <typename T, int kW>
cudaError_t LaunchUpdateVecBest(const UpdateArgs& u, cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  const int sms = CurrentDeviceSms(&err);
  if (err != cudaSuccess) return err;
  const int64_t resident4 = ResidentThreads<UpdateVecKernel<T, kW, 4>>(sms);
  if (u.dim % 8 != 0 || u.batch * (u.dim / 4) <= resident4) return LaunchUpdateVec<T, kW, 4>(u, resident4, stream);
  return LaunchUpdateVec<T, kW, 8>(u, ResidentThreads<UpdateVecKernel<T, kW, 8>>(sms), stream);
}

template <typename T>
bool TryUpdateVec(const UpdateArgs& u, cudaStream_t stream, cudaError_t* err) {
  // (the weights and bias may also be float64 on the CPU only; here they are
  // float32/float16/bfloat16, whose 4-channel rows are whole 8-byte words)
  if (u.channels_last || !u.x_dense() || u.seqlen != 1 || u.width < 2 || u.width > 4 ||
      u.state_len != u.width - 1 ||
      u.dim % 4 != 0 || !Aligned16(u.x) || !Aligned16(u.y) ||
      !Aligned16(u.conv_state) || !Aligned16(u.weight) || !Aligned16(u.bias) ||
      u.w_dtype == DType::kF64 || u.b_dtype == DType::kF64 ||
      u.batch * (u.dim / 4) + kUpdateThreads > INT32_MAX)  // 32-bit thread indices
    return false;
  switch (u.width) {
    case 2: *err = LaunchUpdateVecBest<T, 2>(u, stream); break;
    case 3: *err = LaunchUpdateVecBest<T, 3>(u, stream); break;
    default: *err = LaunchUpdateVecBest<T, 4>(u, stream); break;
  }
  return true;
}

}  // namespace

bool UpdateVec(const UpdateArgs& u, cudaStream_t stream, cudaError_t* err) {
  return WithFloatType(u.x_dtype, false,
                       [&](auto t) { return TryUpdateVec<decltype(t)>(u, stream, err); });
}

}  // namespace jcc::cuda
