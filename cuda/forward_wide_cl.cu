// The channels-last wide forward (wide_cl.cuh): per chunk the block stages
// the rows of steps c0 - H .. c0 + kWideChunk, each warp computes its
// channel's runs as forward_wide.cu does into the output rows, and the block
// writes them back as whole rows (plus the residual) beside the next chunk's
// staging (two block barriers per chunk).
#include "launchers.h"
#include "wide_cl.cuh"

namespace jcc::cuda {
namespace {

template <typename T, bool kMasked>
__global__ void __launch_bounds__(kWideClThreads, 2)
    FwdWideClKernel(const ConvArgs a, int64_t spans_per_row) {
  extern __shared__ float4 smem_raw[];
  const WideClPlace pl = LocateWideCl(a, spans_per_row);
  const int warp = threadIdx.x >> 5, W = int(a.width);
  const WideClSmem sm(W, false, kMasked, int(sizeof(T)));
  const int H = sm.H;
  float* block = reinterpret_cast<float*>(smem_raw);
  float* mine = block + warp * sm.warp_words;
  float* xs = mine + sm.xs;
  float* taps = mine + sm.taps;
  int32_t* idx = reinterpret_cast<int32_t*>(block + sm.idx);
  int32_t* ido = reinterpret_cast<int32_t*>(block + sm.ido);
  float* ys = block + sm.ys;
  T* rx = reinterpret_cast<T*>(block + sm.rx);
  const int64_t L = a.len, b = pl.b, g = pl.g;
  const T* x = static_cast<const T*>(a.x);
  const bool silu = a.act == Activation::kSilu;
  const int32_t hist = kMasked ? HistoryId(a, b) : 0;
  const float bias = StageWideTaps(a, b, g * kWideClCh + warp, false, taps);

  const int64_t end = Min64(CeilDiv(L, kWideChunk), pl.first_chunk + kWideSpan);
  IssueWideClRows<T>(a, x, b, g, pl.first_chunk * kWideChunk - H, sm.nx, rx);
  T* y = static_cast<T*>(a.y);
  const T* res = static_cast<const T*>(a.residual);
  for (int64_t ci = pl.first_chunk; ci < end; ++ci) {
    const int64_t c0 = ci * kWideChunk;
    CpAsyncWait<0>();
    __syncthreads();  // the chunk's rows are in; the previous chunk's outputs are in ys
    if (ci > pl.first_chunk) StoreWideClRows<T>(a, y, res, b, g, c0 - kWideChunk, ys);
    ConvertWideClRows<T>(a, rx, b, g, c0 - H, sm.nx, block + sm.xs, sm.warp_words, kWideR);
    bool clean = true;
    if constexpr (kMasked) clean = StageWideClIds(a, b, c0 - H, sm, hist, idx, ido);
    clean = __syncthreads_and(clean);  // (and ys is free again)
    // the next chunk's rows, in flight during this chunk's work
    if (ci + 1 < end) IssueWideClRows<T>(a, x, b, g, c0 + kWideChunk - H, sm.nx, rx);

    float out[kWideR] = {};
    WideForwardRun<kMasked>(xs, idx, ido, clean, taps, W, bias, silu, out);
    PutWideClRun(ys, out);
  }
  __syncthreads();
  StoreWideClRows<T>(a, y, res, b, g, (end - 1) * kWideChunk, ys);
}

template <typename T>
cudaError_t LaunchT(const ConvArgs& a, int64_t spans_per_row, cudaStream_t stream) {
  const bool masked = a.mode == SegmentMode::kSeqIdx;
  const size_t smem = size_t(WideClSmem(int(a.width), false, masked, int(sizeof(T))).words) * 4;
  return LaunchWithSmem(masked ? FwdWideClKernel<T, true> : FwdWideClKernel<T, false>,
                        WideClBlocks(a, spans_per_row), kWideClThreads, smem, 0, stream, a, spans_per_row);
}

}  // namespace

cudaError_t ForwardWideCl(const ConvArgs& a, const ForwardPlan& p, cudaStream_t stream) {
  return WithFloatType(a.x_dtype, cudaErrorNotSupported,
                       [&](auto t) { return LaunchT<decltype(t)>(a, p.spans_per_row, stream); });
}

}  // namespace jcc::cuda
