// The wide backward (wide.cuh, wide_cf.cuh): the rows of forward_wide.cu. A warp walks
// its span's chunks from the last to the first. Per chunk it stages x of
// steps c0 - H .. c0 + kWideChunk + hp (hp: H rounded up to whole runs),
// hands the first g of the chunk walked before over to the end of its g
// buffer, and runs WideBackwardRun (g, dweight, dbias, dx of its lanes'
// runs). The warp's partial dweight/dbias go to the workspace
// (StoreWidePartials); dinitial_states and the final-states cotangent are
// left to StatesGradKernel.
#include "launchers.h"
#include "wide_cf.cuh"

namespace jcc::cuda {
namespace {

template <typename T, bool kMasked>
__global__ void __launch_bounds__(kStreamThreads, kMasked ? 3 : 4)
    BwdWideKernel(const ConvArgs a, int64_t spans_per_row, float* ws) {
  extern __shared__ float4 smem_raw[];
  const StreamPlace pl = LocateStream(a, spans_per_row, kWideSpan);
  if (!pl.live) return;  // whole warps; no block barriers
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int W = int(a.width);
  const WideSmem sm(W, true, kMasked, int(sizeof(T)));
  const int H = sm.H, hp = sm.hp;
  float* mine = reinterpret_cast<float*>(smem_raw) + warp * sm.words;
  float* xs = mine + sm.xs;
  float* gs = mine + sm.gs;
  float* taps = mine + sm.taps;
  float* dws = mine + sm.dws;
  int32_t* idx = reinterpret_cast<int32_t*>(mine + sm.idx);  // ids, the window's layout
  int32_t* ido = reinterpret_cast<int32_t*>(mine + sm.ido);  // ids of the g buffer's steps
  T* raw = reinterpret_cast<T*>(mine + sm.raw);
  const int64_t L = a.len, b = pl.b, d = pl.d;
  const BackwardRows<T> rows(a, b, d);
  const T* xrow = rows.x;
  const T* dyrow = rows.dy;
  T* dxrow = rows.dx;
  const bool silu = a.act == Activation::kSilu;
  const int32_t hist = kMasked ? HistoryId(a, b) : 0;
  const float bias = StageWideTaps(a, b, d, true, taps);
  for (int k = lane; k < W; k += 32) dws[k] = 0.f;
  float dbias = 0.f;
  const int64_t last = Min64(CeilDiv(L, kWideChunk), pl.first_chunk + kWideSpan) - 1;

  IssueWideX<T>(a, xrow, b, d, last * kWideChunk - sm.hv, sm.nraw, raw);
  for (int64_t ci = last; ci >= pl.first_chunk; --ci) {
    const int64_t c0 = ci * kWideChunk;
    __syncwarp();  // the previous chunk's readers are done
    ConvertWideX<T>(sm.nraw, sm.hv - H, raw, xs);
    bool clean = true;
    if constexpr (kMasked) clean = StageWideIds(a, b, c0 - sm.hv, sm.nraw, sm.hv - H, sm, hist, idx, ido);
    if (ci != last)  // hand over the first g of the chunk walked before
      for (int e = lane; e < hp; e += 32) gs[WideAt(kWideChunk + e)] = gs[WideAt(e)];
    __syncwarp();
    // the next chunk's x, in flight during this chunk's work
    if (ci > pl.first_chunk) IssueWideX<T>(a, xrow, b, d, c0 - kWideChunk - sm.hv, sm.nraw, raw);

    float dx[kWideR];
    WideBackwardRun<kMasked>(xs, gs, idx, ido, clean, taps, dws, W, hp, bias, silu, ci == last,
                             [&](int run, float (&dy)[kWideR]) {
                               LoadWideRun<T>(dyrow, c0 + kWideR * run, L, dy);
                             },
                             dbias, dx);
    const int64_t p0 = c0 + kWideR * lane;
    if (p0 < L) StoreWideRun<T>(dxrow, p0, L, dx);
  }

  StoreWidePartials(a, ws, spans_per_row, b, d, pl.first_chunk / kWideSpan, dws, dbias);
}

template <typename T>
cudaError_t LaunchT(const ConvArgs& a, const BackwardPlan& p, float* ws, cudaStream_t stream) {
  const bool masked = a.mode == SegmentMode::kSeqIdx;
  const size_t smem = size_t(kWideWarps) * WideSmem(int(a.width), true, masked, int(sizeof(T))).words * 4;
  return LaunchWithSmem(masked ? BwdWideKernel<T, true> : BwdWideKernel<T, false>,
                        StreamBlocks(a, p.nchunk), kStreamThreads, smem, 0, stream, a, p.nchunk, ws);
}

}  // namespace

cudaError_t BackwardWide(const ConvArgs& a, const BackwardPlan& p, float* ws, cudaStream_t stream) {
  return WithFloatType(a.x_dtype, cudaErrorNotSupported,
                       [&](auto t) { return LaunchT<decltype(t)>(a, p, ws, stream); });
}

}  // namespace jcc::cuda
