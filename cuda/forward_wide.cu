// The wide forward (wide.cuh, wide_cf.cuh): channels-first rows of whole aligned
// vectors, W > 16 at a run-time width. Per chunk a warp stages the inputs
// of steps c0 - H .. c0 + kWideChunk, then each lane computes its run of
// kWideR outputs and writes them as whole vectors.
#include "launchers.h"
#include "wide_cf.cuh"
#include "wide_cl.cuh"

namespace jcc::cuda {
namespace {

template <typename T, bool kMasked>
__global__ void __launch_bounds__(kStreamThreads, kMasked ? 4 : 5)
    FwdWideKernel(const ConvArgs a, int64_t spans_per_row) {
  extern __shared__ float4 smem_raw[];
  const StreamPlace pl = LocateStream(a, spans_per_row, kWideSpan);
  if (!pl.live) return;  // whole warps; no block barriers
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int W = int(a.width);
  const WideSmem sm(W, false, kMasked, int(sizeof(T)));
  const int H = sm.H;
  float* mine = reinterpret_cast<float*>(smem_raw) + warp * sm.words;
  float* xs = mine + sm.xs;
  float* taps = mine + sm.taps;
  int32_t* idx = reinterpret_cast<int32_t*>(mine + sm.idx);  // ids, the window's layout
  int32_t* ido = reinterpret_cast<int32_t*>(mine + sm.ido);  // ids, the outputs' layout
  T* raw = reinterpret_cast<T*>(mine + sm.raw);
  const int64_t L = a.len, b = pl.b, d = pl.d;
  const T* xrow = static_cast<const T*>(a.x) + a.x_layout().At(b, d, 0);
  const int64_t row = a.io_layout().At(b, d, 0);
  const T* res = a.residual ? static_cast<const T*>(a.residual) + row : nullptr;
  T* yrow = static_cast<T*>(a.y) + row;
  const bool silu = a.act == Activation::kSilu;
  const int32_t hist = kMasked ? HistoryId(a, b) : 0;
  const float bias = StageWideTaps(a, b, d, false, taps);

  const int64_t end = Min64(CeilDiv(L, kWideChunk), pl.first_chunk + kWideSpan);
  IssueWideX<T>(a, xrow, b, d, pl.first_chunk * kWideChunk - sm.hv, sm.nraw, raw);
  for (int64_t ci = pl.first_chunk; ci < end; ++ci) {
    const int64_t c0 = ci * kWideChunk;
    __syncwarp();  // the previous chunk's readers are done
    ConvertWideX<T>(sm.nraw, sm.hv - H, raw, xs);
    bool clean = true;
    if constexpr (kMasked) clean = StageWideIds(a, b, c0 - sm.hv, sm.nraw, sm.hv - H, sm, hist, idx, ido);
    __syncwarp();
    // the next chunk's x, in flight during this chunk's work
    if (ci + 1 < end) IssueWideX<T>(a, xrow, b, d, c0 + kWideChunk - sm.hv, sm.nraw, raw);

    // this lane's outputs: steps p0 + j, whose windows are run lane + 1's
    const int64_t p0 = c0 + kWideR * lane;
    float out[kWideR] = {};
    WideForwardRun<kMasked>(xs, idx, ido, clean, taps, W, bias, silu, out);
    if (p0 >= L) continue;
    if (res) {
      float r[kWideR];
      LoadWideRun<T>(res, p0, L, r);
#pragma unroll
      for (int j = 0; j < kWideR; ++j) out[j] += r[j];
    }
    StoreWideRun<T>(yrow, p0, L, out);
  }
}

template <typename T>
cudaError_t LaunchT(const ConvArgs& a, int64_t spans_per_row, cudaStream_t stream) {
  const bool masked = a.mode == SegmentMode::kSeqIdx;
  const size_t smem = size_t(kWideWarps) * WideSmem(int(a.width), false, masked, int(sizeof(T))).words * 4;
  return LaunchWithSmem(masked ? FwdWideKernel<T, true> : FwdWideKernel<T, false>,
                        StreamBlocks(a, spans_per_row), kStreamThreads, smem, 0, stream, a, spans_per_row);
}

}  // namespace

int64_t WideSpans(const ConvArgs& a) {
  const int64_t spans = CeilDiv(a.len, int64_t(kWideChunk) * kWideSpan);
  return (a.channels_last ? WideClBlocks(a, spans) : StreamBlocks(a, spans)) <= INT32_MAX ? spans : 0;
}

cudaError_t ForwardWide(const ConvArgs& a, const ForwardPlan& p, cudaStream_t stream) {
  return WithFloatType(a.x_dtype, cudaErrorNotSupported,
                       [&](auto t) { return LaunchT<decltype(t)>(a, p.spans_per_row, stream); });
}

}  // namespace jcc::cuda
