// The seq_idx forward as a dense forward plus a fix (PlanForward's
// ForwardPlan::seq_fix; seq_fix.cuh says which outputs a dense forward gets
// wrong). This kernel writes those, each over the taps of its own id (as
// MmaTileExact: other ids' inputs are left out, not multiplied by 0).
// Packed rows of a few segments leave a few percent of the outputs to fix.
//
// A block per (batch row, chunk of kFixChunk steps, kFixCh channels): it
// stages the ids of its steps and of kFixBack before them, marks the id
// changes and the outputs to fix with ballots, lists the runs of kFixRun
// steps that hold one, and then a thread sums a run of one channel (the
// window's inputs and ids held over kFixRun taps at a time in registers).
// Where no id returns within a window (IdReturns, the usual packed rows),
// an output's inputs of its id are those from its run's start on: the
// thread skips the taps before and compares no ids (SumRunTapsFrom).
#include "launchers.h"
#include "seq_fix.cuh"

namespace jcc::cuda {
namespace {

constexpr int kFixRun = 8;       // consecutive outputs a thread sums
constexpr int kFixCh = 256;      // channels a block (its ids staged and marked once for them)
constexpr int kFixThreads = 256;
constexpr int kFixIds = kFixBack + kFixChunk;
// The widest W whose blocks check IdReturns (its windows' lowest step,
// kFixBack - 2 W + 3 at the chunk's first output, staged); wider W compare
// every tap's id.
constexpr int kFixSimpleMaxW = 128;
static_assert(kFixChunk == 2 * kFixThreads && kFixChunk / kFixRun <= 64 && 32 % kFixRun == 0 && kFixIds % 32 == 0,
              "the marking below (a run inside one word of fixes)");

// The DType of a 16-bit x (the kernel's T).
template <typename T>
constexpr DType k16BitDType = std::is_same_v<T, __half> ? DType::kF16 : DType::kBF16;

// acc[o] += the taps of output t0 + o (o < kFixRun) whose input has the
// output's id sid[o]: tap k reads input q = o + k (from the step of output
// t0's tap 0), whose id is wid[q], its value load_x(q) for q < lim (inputs
// from lim on count as absent: past the row's end or past t0 + kFixRun - 1);
// load_w(k) the weight of tap k. kFixRun taps of every output at a time,
// the window's 2 kFixRun - 1 inputs and ids in registers.
template <typename LoadX, typename LoadW>
__device__ __forceinline__ void SumRunTaps(int W, int lim, const int32_t* wid, const int32_t (&sid)[kFixRun],
                                           LoadX load_x, LoadW load_w, float (&acc)[kFixRun]) {
  for (int kb = 0; kb < W; kb += kFixRun) {
    const int kmax = W - kb;  // this block's taps k < kmax
    float xv[2 * kFixRun - 1], wv[kFixRun];
    int32_t iv[2 * kFixRun - 1];
#pragma unroll
    for (int i = 0; i < 2 * kFixRun - 1; ++i) {
      const bool in = kb + i < lim;
      xv[i] = in ? load_x(kb + i) : 0.f;
      iv[i] = in ? wid[kb + i] : kNoId;
    }
#pragma unroll
    for (int k = 0; k < kFixRun; ++k) wv[k] = k < kmax ? load_w(kb + k) : 0.f;
#pragma unroll
    for (int o = 0; o < kFixRun; ++o)
#pragma unroll
      for (int k = 0; k < kFixRun; ++k)
        if (k < kmax && iv[o + k] == sid[o]) acc[o] += wv[k] * xv[o + k];
  }
}

// The same sum where no id returns within a window (IdReturns): output o's
// inputs of its id are q >= lo[o] (its run's start; lo[o] >= W + kFixRun:
// none, an output not fixed), so the taps before the first such input are
// skipped and the blocks of taps where every output's inputs are all its
// own are summed without a mask.
template <typename LoadX, typename LoadW>
__device__ __forceinline__ void SumRunTapsFrom(int W, int lim, const int (&lo)[kFixRun], LoadX load_x,
                                               LoadW load_w, float (&acc)[kFixRun]) {
  int first_tap = W, all_own = 0;  // taps from all_own on: every fixed output's inputs its own
#pragma unroll
  for (int o = 0; o < kFixRun; ++o)
    if (lo[o] < W + kFixRun) {
      first_tap = min(first_tap, lo[o] - o);
      all_own = max(all_own, lo[o] - o);
    }
  for (int kb = max(first_tap, 0); kb < W; kb += kFixRun) {
    const int kmax = W - kb;  // this block's taps k < kmax
    float xv[2 * kFixRun - 1], wv[kFixRun];
#pragma unroll
    for (int i = 0; i < 2 * kFixRun - 1; ++i) xv[i] = kb + i < lim ? load_x(kb + i) : 0.f;
#pragma unroll
    for (int k = 0; k < kFixRun; ++k) wv[k] = k < kmax ? load_w(kb + k) : 0.f;
    if (kb >= all_own && kmax >= kFixRun) {
#pragma unroll
      for (int o = 0; o < kFixRun; ++o)
#pragma unroll
        for (int k = 0; k < kFixRun; ++k) acc[o] += wv[k] * xv[o + k];
    } else {
#pragma unroll
      for (int o = 0; o < kFixRun; ++o)
#pragma unroll
        for (int k = 0; k < kFixRun; ++k)
          if (k < kmax && o + kb + k >= lo[o]) acc[o] += wv[k] * xv[o + k];
    }
  }
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
  const int64_t c0 = c * kFixChunk, base = c0 - kFixBack;
  const int W = int(a.width);
  StageFixIds(a, b, base, kFixIds, ids, changes);
  __syncthreads();
  const bool clash = W > kFixSimpleMaxW || IdReturns(ids, changes, kFixIds, W);
  BallotWords(kFixChunk / 32, fixes, [&](int j) { return FixedOutput(a, ids, changes, base, kFixBack + j); });
  const bool simple = !__syncthreads_or(clash);
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
    if (live) {
      const int64_t first = t0 - W + 1;  // the step of output t0's tap 0
      const int32_t* wid = ids + (first - base);  // (>= ids: W - 1 <= kFixBack)
      const int64_t sx = xl.s_time;
      // inside the row, 32-bit offsets and typed weights; else (the first
      // outputs, which read the initial states) every load as the dense
      // kernels read it
      if (first >= 0 && (sx < 0 ? -sx : sx) * (W + kFixRun) < INT32_MAX &&
          (a.w_dtype == DType::kF32 || a.w_dtype == k16BitDType<T>)) {
        const T* xr = static_cast<const T*>(a.x) + xl.At(b, d, first);
        const int sxi = int(sx), lim = int(Min64(W + kFixRun - 1, a.len - first));
        int lo[kFixRun];  // (simple) output o's first input of its id
#pragma unroll
        for (int o = 0; o < kFixRun; ++o)
          lo[o] = simple && (live >> o & 1) ? LastBit(changes, kFixBack + j0 + o) - (kFixBack + j0 - W + 1)
                                            : W + kFixRun;
        auto sum = [&](auto load_x, auto load_w) {
          if (simple)
            SumRunTapsFrom(W, lim, lo, load_x, load_w, acc);
          else
            SumRunTaps(W, lim, wid, sid, load_x, load_w, acc);
        };
        auto with_w = [&](auto load_x) {
          if (a.w_dtype == DType::kF32) {
            const float* wr = static_cast<const float*>(a.weight) + wrow * W;
            sum(load_x, [&](int k) { return wr[k]; });
          } else {
            const T* wr = static_cast<const T*>(a.weight) + wrow * W;
            sum(load_x, [&](int k) { return ToF(wr[k]); });
          }
        };
        // (contiguous steps, as channels-first: the loads' offsets immediate)
        if (sxi == 1)
          with_w([&](int q) { return ToF(xr[q]); });
        else
          with_w([&](int q) { return ToF(xr[q * sxi]); });
      } else {
        SumRunTaps(
            W, W + kFixRun - 1, wid, sid, [&](int q) { return FixInput<T>(a, xl, b, d, first + q); },
            [&](int k) { return LoadAnyF(a.weight, a.w_dtype, wrow * W + k); }, acc);
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
