// The seq_idx forward as a dense forward plus a fix (PlanForward's
// ForwardPlan::seq_fix). A dense kernel's output t is already the seq_idx
// output wherever the window of t, steps t - W + 1 .. t, holds t's id only:
// steps before 0 hold the initial states, whose id is seq_idx[b, 0], or
// zeros, right either way when steps 0 .. t hold one id. So the outputs left
// to fix are the padding ones (a negative id: 0, plus the residual) and
// those less than W - 1 steps after a change of id (some step p of their
// window past its first, p >= 1, has seq_idx[p] != seq_idx[p - 1]); this
// kernel writes those, each over the taps of its own id (as MmaTileExact:
// other ids' inputs are left out, not multiplied by 0). Packed rows of a few
// segments leave a few percent of the outputs to fix.
//
// A block per (batch row, chunk of kFixChunk steps, kFixCh channels): it
// stages the ids of its steps and of kFixBack before them, marks the id
// changes and the outputs to fix with ballots, lists the runs of kFixRun
// steps that hold one, and then a thread sums a run of one channel (the
// window's inputs and ids held over kFixRun taps at a time in registers).
#include "launchers.h"
#include "sequences.cuh"

namespace jcc::cuda {
namespace {

constexpr int kFixChunk = 512;   // steps a block
constexpr int kFixBack = 256;    // ids staged before the chunk (W - 1 <= kFixBack)
constexpr int kFixRun = 8;       // consecutive outputs a thread sums
constexpr int kFixCh = 256;      // channels a block (its ids staged and marked once for them)
constexpr int kFixThreads = 256;
constexpr int kFixIds = kFixBack + kFixChunk;
static_assert(kFixChunk == 2 * kFixThreads && kFixChunk / kFixRun <= 64 && 32 % kFixRun == 0 && kFixIds % 32 == 0,
              "the marking below (a run inside one word of fixes)");

// Any bit of bits[lo .. hi] (inclusive, lo <= hi + 1).
__device__ __forceinline__ bool AnyBit(const uint32_t* bits, int lo, int hi) {
  for (int w = lo >> 5; w <= (hi >> 5) && lo <= hi; ++w) {
    const int first = w == (lo >> 5) ? lo & 31 : 0, last = w == (hi >> 5) ? hi & 31 : 31;
    const uint32_t mask = (last == 31 ? ~0u : (2u << last) - 1u) & (~0u << first);
    if (bits[w] & mask) return true;
  }
  return false;
}

template <typename T>
__global__ void __launch_bounds__(kFixThreads) FixSeqIdxKernel(ConvArgs a, int64_t chunks, int64_t groups) {
  __shared__ int32_t ids[kFixIds];              // step c0 - kFixBack + i
  __shared__ uint32_t changes[kFixIds / 32];     // bit i: step p = c0 - kFixBack + i >= 1 has a new id
  __shared__ uint32_t fixes[kFixChunk / 32];     // bit j: output c0 + j is to fix
  __shared__ uint8_t runs[kFixChunk / kFixRun];  // the runs that hold one
  __shared__ int nruns;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t blk = blockIdx.x, c = blk % chunks, g = blk / chunks % groups, b = blk / chunks / groups;
  const int64_t c0 = c * kFixChunk, base = c0 - kFixBack, L = a.len;
  const int W = int(a.width);
  const int32_t hist = HistoryId(a, b);
  for (int i = threadIdx.x; i < kFixIds; i += kFixThreads) ids[i] = IdAt(a, b, base + i, hist);
  __syncthreads();
  for (int w = warp; w < kFixIds / 32; w += kFixThreads / 32) {
    const int i = 32 * w + lane;
    const int64_t p = base + i;  // (bits i >= 1 are read: W - 1 <= kFixBack)
    const bool changed = i >= 1 && p >= 1 && p < L && ids[i] != ids[i - 1];
    const uint32_t m = __ballot_sync(~0u, changed);
    if (lane == 0) changes[w] = m;
  }
  __syncthreads();
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int j = threadIdx.x + kFixThreads * h;
    const int64_t t = c0 + j;
    // a change at some step p of t - W + 2 .. t (p >= 1): two ids in the window
    const int lo = int(Max64(1, t - W + 2) - base), hi = kFixBack + j;
    const bool fix = t < L && (ids[kFixBack + j] < 0 || AnyBit(changes, lo, hi));
    const uint32_t m = __ballot_sync(~0u, fix);
    if (lane == 0) fixes[j >> 5] = m;
  }
  __syncthreads();
  if (warp == 0) {
    int n = 0;
    for (int h = 0; h < kFixChunk / kFixRun; h += 32) {
      const int r = h + lane;
      const bool any = r < kFixChunk / kFixRun && (fixes[r * kFixRun >> 5] >> (r * kFixRun & 31) & 0xffu) != 0;
      const uint32_t m = __ballot_sync(~0u, any);
      if (any) runs[n + __popc(m & ((1u << lane) - 1u))] = uint8_t(r);
      n += __popc(m);
    }
    if (lane == 0) nruns = n;
  }
  __syncthreads();
  const int n = nruns;
  if (n == 0) return;

  const Layout3 io = a.io_layout(), xl = a.x_layout();
  const T* x = static_cast<const T*>(a.x);
  const T* res = static_cast<const T*>(a.residual);
  T* y = static_cast<T*>(a.y);
  const bool silu = a.act == Activation::kSilu;
  // channels-first: a warp's threads take consecutive runs of one channel;
  // channels-last: consecutive channels of one run (coalesced either way)
  const int nch = int(Min64(kFixCh, a.dim - g * kFixCh));  // the block's channels
  for (int item = threadIdx.x; item < n * nch; item += kFixThreads) {
    const int ch = a.channels_last ? item % nch : item / n, r = a.channels_last ? item / nch : item % n;
    const int64_t d = g * kFixCh + ch;
    const int j0 = runs[r] * kFixRun;  // the run's first step in the chunk
    const int64_t t0 = c0 + j0;
    const unsigned todo = fixes[j0 >> 5] >> (j0 & 31) & 0xffu;
    int32_t sid[kFixRun];
    unsigned live = 0;  // fixed outputs that are not padding
#pragma unroll
    for (int o = 0; o < kFixRun; ++o) {
      sid[o] = ids[kFixBack + j0 + o];
      if ((todo >> o & 1) && sid[o] >= 0) live |= 1u << o;
    }
    const int64_t wrow = WeightRow(a, b, d);
    const float bias = a.bias ? LoadAnyF(a.bias, a.b_dtype, wrow) : 0.f;
    float acc[kFixRun] = {};
    auto x_at = [&](int64_t p) -> float {
      if (p < 0) return a.initial_states ? LoadState<T>(a, a.initial_states, b, d, p + W - 1) : 0.f;
      return p < L ? ToF(x[xl.At(b, d, p)]) : 0.f;
    };
    if (live) {
      // taps kb .. kb + kFixRun - 1 of outputs t0 + o read steps
      // t0 - W + 1 + kb + i (i = o + k < 2 kFixRun - 1)
      for (int kb = 0; kb < W; kb += kFixRun) {
        float xv[2 * kFixRun - 1], wv[kFixRun];
        int32_t iv[2 * kFixRun - 1];
#pragma unroll
        for (int i = 0; i < 2 * kFixRun - 1; ++i) {
          // (the taps k < W read steps up to t0 + kFixRun - 1 only; p - base
          // >= kFixBack - W + 1 >= 0)
          const int64_t p = t0 - W + 1 + kb + i;
          const bool in = p < t0 + kFixRun;
          xv[i] = in ? x_at(p) : 0.f;
          iv[i] = in ? ids[int(p - base)] : kNoId;
        }
#pragma unroll
        for (int k = 0; k < kFixRun; ++k)
          wv[k] = kb + k < W ? LoadAnyF(a.weight, a.w_dtype, wrow * W + kb + k) : 0.f;
#pragma unroll
        for (int o = 0; o < kFixRun; ++o)
#pragma unroll
          for (int k = 0; k < kFixRun; ++k)
            if (kb + k < W && iv[o + k] == sid[o]) acc[o] += wv[k] * xv[o + k];
      }
    }
#pragma unroll
    for (int o = 0; o < kFixRun; ++o) {
      const int64_t t = t0 + o;
      if (!(todo >> o & 1)) continue;  // (t < L: fixes marks none past the end)
      const int64_t e = io.At(b, d, t);
      float v = live >> o & 1 ? Activate(acc[o] + bias, silu) : 0.f;
      if (res) v += ToF(res[e]);
      y[e] = FromF<T>(v);
    }
  }
}

}  // namespace

cudaError_t FixSeqIdxForward(const ConvArgs& a, cudaStream_t stream) {
  if (a.width - 1 > kFixBack) return cudaErrorInvalidValue;  // (W <= 257)
  const int64_t chunks = CeilDiv(a.len, kFixChunk), groups = CeilDiv(a.dim, kFixCh);
  const int64_t blocks = a.batch * chunks * groups;
  if (blocks == 0) return cudaSuccess;
  if (blocks > INT32_MAX) return cudaErrorInvalidConfiguration;
  return With16BitType(a.x_dtype, cudaErrorNotSupported, [&](auto t) {
    using T = decltype(t);
    FixSeqIdxKernel<T><<<unsigned(blocks), kFixThreads, 0, stream>>>(a, chunks, groups);
    return cudaGetLastError();
  });
}

}  // namespace jcc::cuda
