// The channels-last wide backward (wide_cl.cuh): the blocks of
// forward_wide_cl.cu walk their span's chunks from the last to the first,
// as backward_wide.cu's warps do. Per chunk the block stages the rows of x
// (steps c0 - H .. c0 + kWideChunk + hp) and of dy (c0 .. c0 + kWideChunk
// + hp), each warp hands its g buffer's first hp steps over to its end and
// runs WideBackwardRun for its channel into the output rows, and the block
// writes dx back as whole rows beside the next chunk's staging. Partial
// dweight/dbias per warp as in backward_wide.cu.
#include "launchers.h"
#include "wide_cl.cuh"

namespace jcc::cuda {
namespace {

template <typename T, bool kMasked>
__global__ void __launch_bounds__(kWideClThreads, 2)
    BwdWideClKernel(const ConvArgs a, int64_t spans_per_row, float* ws) {
  extern __shared__ float4 smem_raw[];
  const WideClPlace pl = LocateWideCl(a, spans_per_row);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, W = int(a.width);
  const WideClSmem sm(W, true, kMasked, int(sizeof(T)));
  const int H = sm.H, hp = sm.hp;
  float* block = reinterpret_cast<float*>(smem_raw);
  float* mine = block + warp * sm.warp_words;
  float* xs = mine + sm.xs;
  float* gs = mine + sm.gs;
  const float* dys = mine + sm.dys;
  float* taps = mine + sm.taps;
  float* dws = mine + sm.dws;
  int32_t* idx = reinterpret_cast<int32_t*>(block + sm.idx);
  int32_t* ido = reinterpret_cast<int32_t*>(block + sm.ido);
  float* ys = block + sm.ys;
  T* rx = reinterpret_cast<T*>(block + sm.rx);
  T* rdy = reinterpret_cast<T*>(block + sm.rdy);
  const int64_t L = a.len, b = pl.b, g = pl.g, d = g * kWideClCh + warp;
  const T* x = static_cast<const T*>(a.x);
  const T* dy = static_cast<const T*>(a.dy);
  T* dxp = static_cast<T*>(a.dx);
  const bool silu = a.act == Activation::kSilu;
  const int32_t hist = kMasked ? HistoryId(a, b) : 0;
  const float bias = StageWideTaps(a, b, d, true, taps);
  for (int k = lane; k < W; k += 32) dws[k] = 0.f;
  float dbias = 0.f;
  const int64_t last = Min64(CeilDiv(L, kWideChunk), pl.first_chunk + kWideSpan) - 1;

  auto issue = [&](int64_t c0) {
    IssueWideClRows<T>(a, x, b, g, c0 - H, sm.nx, rx);
    IssueWideClRows<T>(a, dy, b, g, c0, sm.no, rdy);
  };
  issue(last * kWideChunk);
  for (int64_t ci = last; ci >= pl.first_chunk; --ci) {
    const int64_t c0 = ci * kWideChunk;
    CpAsyncWait<0>();
    __syncthreads();  // the chunk's rows are in; the chunk walked before left its dx in ys
    if (ci != last) StoreWideClRows<T>(a, dxp, nullptr, b, g, c0 + kWideChunk, ys);
    ConvertWideClRows<T>(a, rx, b, g, c0 - H, sm.nx, block + sm.xs, sm.warp_words, kWideR);
    ConvertWideClRows<T>(a, rdy, b, g, c0, sm.no, block + sm.dys, sm.warp_words, 0);
    if (ci != last)  // hand over the first g of the chunk walked before
      for (int e = lane; e < hp; e += 32) gs[WideAt(kWideChunk + e)] = gs[WideAt(e)];
    bool clean = true;
    if constexpr (kMasked) clean = StageWideClIds(a, b, c0 - H, sm, hist, idx, ido);
    clean = __syncthreads_and(clean);  // (and ys is free again)
    // the next chunk's rows, in flight during this chunk's work
    if (ci > pl.first_chunk) issue(c0 - kWideChunk);

    float dx[kWideR];
    WideBackwardRun<kMasked>(xs, gs, idx, ido, clean, taps, dws, W, hp, bias, silu, ci == last,
                             [&](int run, float (&v)[kWideR]) {
#pragma unroll
                               for (int j = 0; j < kWideR; ++j) v[j] = dys[WideAt(kWideR * run + j)];
                             },
                             dbias, dx);
    PutWideClRun(ys, dx);
  }
  __syncthreads();
  StoreWideClRows<T>(a, dxp, nullptr, b, g, pl.first_chunk * kWideChunk, ys);
  StoreWidePartials(a, ws, spans_per_row, b, d, pl.first_chunk / kWideSpan, dws, dbias);
}

template <typename T>
cudaError_t LaunchT(const ConvArgs& a, const BackwardPlan& p, float* ws, cudaStream_t stream) {
  const bool masked = a.mode == SegmentMode::kSeqIdx;
  const size_t smem = size_t(WideClSmem(int(a.width), true, masked, int(sizeof(T))).words) * 4;
  return LaunchWithSmem(masked ? BwdWideClKernel<T, true> : BwdWideClKernel<T, false>,
                        WideClBlocks(a, p.nchunk), kWideClThreads, smem, 0, stream, a, p.nchunk, ws);
}

}  // namespace

cudaError_t BackwardWideCl(const ConvArgs& a, const BackwardPlan& p, float* ws, cudaStream_t stream) {
  return WithFloatType(a.x_dtype, cudaErrorNotSupported,
                       [&](auto t) { return LaunchT<decltype(t)>(a, p, ws, stream); });
}

}  // namespace jcc::cuda
