// seq_idx as a dense kernel plus a fix (PlanForward / PlanBackward's
// seq_fix): what the fix kernels share (forward_seq_fix.cu,
// backward_seq_fix.cu). A dense output t is already the seq_idx output
// wherever the window of t, steps t - W + 1 .. t, holds t's id only: steps
// before 0 hold the initial states, whose id is seq_idx[b, 0], or zeros,
// right either way when steps 0 .. t hold one id. The outputs to fix are
// the padding ones (a negative id) and those less than W - 1 steps after a
// change of id (some step p of their window past its first, p >= 1, has
// seq_idx[p] != seq_idx[p - 1]). A block of the fix kernels takes a batch
// row's chunks of kFixChunk steps and marks, from the ids staged around a
// chunk, the id changes and then what it must redo, each a bit a step
// (warp ballots into shared words).
#pragma once

#include "sequences.cuh"

namespace jcc::cuda {

constexpr int kFixChunk = 512;  // steps a block marks at once
constexpr int kFixBack = 256;   // ids staged before the chunk (W - 1 <= kFixBack)

// Any bit of bits[lo .. hi] (inclusive; none when lo > hi).
__device__ __forceinline__ bool AnyBit(const uint32_t* bits, int lo, int hi) {
  for (int w = lo >> 5; w <= (hi >> 5) && lo <= hi; ++w) {
    const int first = w == (lo >> 5) ? lo & 31 : 0, last = w == (hi >> 5) ? hi & 31 : 31;
    const uint32_t mask = (last == 31 ? ~0u : (2u << last) - 1u) & (~0u << first);
    if (bits[w] & mask) return true;
  }
  return false;
}

// The highest set bit of bits[0 .. i] (-1: none).
__device__ __forceinline__ int LastBit(const uint32_t* bits, int i) {
  int w = i >> 5;
  uint32_t m = bits[w] & (~0u >> (31 - (i & 31)));
  while (m == 0 && w > 0) m = bits[--w];
  return m != 0 ? 32 * w + 31 - __clz(int(m)) : -1;
}

// Whether an id returns within a window in the staged range: some change of
// id at i >= W - 1 (a marked step of nonnegative id) whose id is also at a
// step of i - W + 1 .. i - 1. Where none does, the inputs of an output's own
// id in its window are exactly the steps from its run's start (the last
// change at or before it) on. Each thread checks its share; the caller
// combines them (__syncthreads_or).
__device__ __forceinline__ bool IdReturns(const int32_t* ids, const uint32_t* changes, int n, int W) {
  bool clash = false;
  for (int i = W - 1 + int(threadIdx.x); i < n; i += int(blockDim.x)) {
    const int32_t v = ids[i];
    if (v < 0 || !(changes[i >> 5] >> (i & 31) & 1u)) continue;
    for (int j = i - W + 1; j < i; ++j) clash |= ids[j] == v;
  }
  return clash;
}

// bits[w] = the ballot of on(32 w + lane) for w < words, by the block's
// warps (whole warps: every lane calls).
template <typename On>
__device__ __forceinline__ void BallotWords(int words, uint32_t* bits, On on) {
  const int lane = threadIdx.x & 31;
  for (int w = int(threadIdx.x >> 5); w < words; w += int(blockDim.x >> 5)) {
    const uint32_t m = __ballot_sync(~0u, on(32 * w + lane));
    if (lane == 0) bits[w] = m;
  }
}

// ids[i] = the id of step base + i (i < n; HistoryId before step 0, kNoId
// past the end), by the block; then changes[i / 32] bit i % 32 = step
// base + i (1 <= it < len) has a new id (i >= 1), n a multiple of 32. (The
// caller's barrier between the two: none inside after the ballots.)
__device__ __forceinline__ void StageFixIds(const ConvArgs& a, int64_t b, int64_t base, int n, int32_t* ids,
                                            uint32_t* changes) {
  const int32_t hist = HistoryId(a, b);
  for (int i = threadIdx.x; i < n; i += blockDim.x) ids[i] = IdAt(a, b, base + i, hist);
  __syncthreads();
  BallotWords(n / 32, changes, [&](int i) {
    const int64_t p = base + i;
    return i >= 1 && p >= 1 && p < a.len && ids[i] != ids[i - 1];
  });
}

// Whether output t = base + i is to fix (t < len): padding, or a change of
// id at a step of t - W + 2 .. t (from the marks of StageFixIds; needs
// i - W + 2 >= 1 wherever t - W + 2 >= 1).
__device__ __forceinline__ bool FixedOutput(const ConvArgs& a, const int32_t* ids, const uint32_t* changes,
                                            int64_t base, int i) {
  const int64_t t = base + i;
  if (t >= a.len) return false;
  const int lo = int(Max64(1, t - a.width + 2) - base);
  return ids[i] < 0 || AnyBit(changes, lo, i);
}

// Input p of row b, channel d as the dense kernels read it: x, before step 0
// the initial states (or zeros), past the end zeros.
template <typename T>
__device__ __forceinline__ float FixInput(const ConvArgs& a, const Layout3& xl, int64_t b, int64_t d, int64_t p) {
  if (p < 0) return a.initial_states ? LoadState<T>(a, a.initial_states, b, d, p + a.width - 1) : 0.f;
  return p < a.len ? ToF(static_cast<const T*>(a.x)[xl.At(b, d, p)]) : 0.f;
}

}  // namespace jcc::cuda
