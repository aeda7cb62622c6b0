// Pieces shared by the decode hot paths (update_vec.cu, update_cl_vec.cu):
// the block size, whole-word vectors of any byte count, weight rows of a
// run-time dtype loaded as words.
#pragma once

#include <cstdint>
#include <type_traits>

#include "common.cuh"

namespace jcc::cuda {

constexpr int kUpdateThreads = 128;

// The widest word (16, 8 or 4 bytes) that divides kBytes.
template <int kBytes>
using WordOf = std::conditional_t<kBytes % 16 == 0, uint4, std::conditional_t<kBytes % 8 == 0, uint2, uint32_t>>;

template <typename T, int kBytes>
struct RawVec {  // kBytes of T in the widest whole words
  using Word = WordOf<kBytes>;
  static_assert(kBytes % 4 == 0, "whole 4-byte words");
  static constexpr int kWords = kBytes / int(sizeof(Word));
  Word w[kWords];
  __device__ __forceinline__ void Load(const T* p) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = __ldg(reinterpret_cast<const Word*>(p) + i);
  }
  __device__ __forceinline__ void Zero() {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = Word{};
  }
  __device__ __forceinline__ void Store(T* p) const {
#pragma unroll
    for (int i = 0; i < kWords; ++i) reinterpret_cast<Word*>(p)[i] = w[i];
  }
  // Streaming (evict-first) loads and stores: decode states, not read again
  // before the next step.
  __device__ __forceinline__ void LoadStreaming(const T* p) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = __ldcs(reinterpret_cast<const Word*>(p) + i);
  }
  __device__ __forceinline__ void StoreStreaming(T* p) const {
#pragma unroll
    for (int i = 0; i < kWords; ++i) __stcs(reinterpret_cast<Word*>(p) + i, w[i]);
  }
  __device__ __forceinline__ T& operator[](int j) { return reinterpret_cast<T*>(w)[j]; }
  __device__ __forceinline__ T operator[](int j) const { return reinterpret_cast<const T*>(w)[j]; }
};

// n consecutive elements from element `first` (a multiple of n) of a
// run-time-dtype array, as floats: raw word loads, then one switch. The word
// divides n 2-byte elements, so `first` is aligned to it for any dtype.
template <int n>
__device__ __forceinline__ void LoadRowF(const void* base, DType t, int64_t first, float* out) {
  using Word = WordOf<n * 2>;
  constexpr int kWords = n * 4 / int(sizeof(Word));  // enough for float32; half used for 2-byte types
  Word raw[kWords];
  const int bytes = t == DType::kF32 ? 4 : 2;
  const Word* p = reinterpret_cast<const Word*>(static_cast<const char*>(base) + first * bytes);
#pragma unroll
  for (int i = 0; i < kWords; ++i)
    if (i * int(sizeof(Word)) < n * bytes) raw[i] = __ldg(p + i);
  switch (t) {
    case DType::kF32:
#pragma unroll
      for (int j = 0; j < n; ++j) out[j] = reinterpret_cast<const float*>(raw)[j];
      break;
    case DType::kF16:
#pragma unroll
      for (int j = 0; j < n; ++j) out[j] = __half2float(reinterpret_cast<const __half*>(raw)[j]);
      break;
    default:
#pragma unroll
      for (int j = 0; j < n; ++j) out[j] = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(raw)[j]);
      break;
  }
}

// Ring entries of a step after `seen` tokens (state_len SL >= H): the oldest
// of the window's H entries, (seen - H) mod SL, and the entry of the step's
// token `first`, (seen + first) mod SL. For any int `seen`: the remainder
// comes first, so nothing overflows.
struct RingEntries {
  int head, put;
};

__host__ __device__ __forceinline__ RingEntries RingAt(int seen, int H, int SL, int first) {
  int r = seen % SL;
  if (r < 0) r += SL;
  int head = r - H;  // >= -SL
  if (head < 0) head += SL;
  int put = r + first % SL;  // < 2 SL
  if (put >= SL) put -= SL;
  return {head, put};
}

// How a decode step's grid covers (batch, dim / C), C channels a thread:
// thread t owns channel group t % chunks of rows [rg * rows, rg * rows +
// rows), rg = t / chunks. One row a thread unless that grid is larger than
// the GPU holds at once (`resident` threads); then as many as spread the
// rows evenly over it.
struct RowsPlan {
  int32_t chunks = 0;       // dim / C
  int32_t row_groups = 0;   // ceil(batch / rows)
  int32_t rows = 1;         // batch rows per thread
  int32_t group_rows = 1;   // batch / groups: rows sharing one weight row
  unsigned Blocks() const { return unsigned(CeilDiv(int64_t(row_groups) * chunks, kUpdateThreads)); }
};

inline RowsPlan PlanRows(const UpdateArgs& u, int64_t chunks, int64_t resident) {
  RowsPlan p;
  p.chunks = int32_t(chunks);
  p.group_rows = int32_t(u.batch / u.groups);
  const int64_t rows = CeilDiv(u.batch * chunks, resident);
  p.rows = int32_t(rows > 1 ? rows : 1);
  p.row_groups = int32_t(CeilDiv(u.batch, p.rows));
  return p;
}

// Rows b0 .. b1 - 1 of a thread, `cur` holding row b0's loads: the next
// row's loads (load(row, b)) go out before this one is finished (finish(row,
// b)); the weights are (re)loaded (weights(g)) where the weight group changes.
template <typename Row, typename Load, typename Weights, typename Finish>
__device__ __forceinline__ void WalkRows(const RowsPlan& p, int b0, int b1, Row& cur, Load load,
                                         Weights weights, Finish finish) {
  Row next;
  int wgroup = -1;
  for (int b = b0; b < b1; ++b) {
    if (b + 1 < b1) load(next, b + 1);
    const int g = b / p.group_rows;
    if (g != wgroup) weights(wgroup = g);
    finish(cur, b);
    cur = next;
  }
}

// The taps (C x W, row `wrow` of the weight onwards) and biases of C
// consecutive channels, as floats (bias 0 without one).
template <int C, int kW>
__device__ __forceinline__ void LoadChannelWeights(const UpdateArgs& u, int64_t wrow, float (&w)[C][kW],
                                                   float (&bias)[C]) {
  LoadRowF<C * kW>(u.weight, u.w_dtype, wrow * kW, &w[0][0]);
  if (u.bias) LoadRowF<C>(u.bias, u.b_dtype, wrow, bias);
  else
#pragma unroll
    for (int c = 0; c < C; ++c) bias[c] = 0.f;
}

inline bool Aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Threads of kKernel (kUpdateThreads a block) that a GPU of `sms` SMs holds
// at once; its occupancy asked once.
template <auto kKernel>
int64_t ResidentThreads(int sms) {
  return int64_t(sms > 1 ? sms : 1) * BlocksPerSm<kKernel, kUpdateThreads>() * kUpdateThreads;
}

}  // namespace jcc::cuda
