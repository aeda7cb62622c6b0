// The wide backward (wide.cuh): the rows of forward_wide.cu. A warp walks
// its span's chunks from the last to the first. Per chunk it stages x of
// steps c0 - H .. c0 + kWideChunk + hp (hp: H rounded up to whole runs),
// then lane l, for
// its run of kWideR steps from p0 = c0 + kWideR * l,
//   g = dy * act'(pre)  (pre recomputed from x; zero on padding / past the end)
//   into the warp's g buffer, whose steps c0 + kWideChunk .. + hp hold the
//   first g of the chunk after (handed over from the chunk walked before;
//   for the span's last chunk computed here by the first lanes),
//   dweight[k] += g * x[t - H + k] (summed over the warp into shared memory),
//   dbias += g,
//   dx = sum_k w[k] g[t + H - k]  (reading the g buffer).
// seq_idx passes as in the forward (wide.cuh): pass s reads inputs (and g)
// of id s only and takes the run's outputs (and inputs) of id s. The warp's
// partial dweight/dbias go to ws[grp][part][d][W + 1] (part = (b %
// batch_per_group) * spans + span) for states.cu's ReduceKernel;
// dinitial_states and the final-states cotangent are left to StatesGradKernel.
#include "launchers.h"
#include "wide.cuh"

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
  const T* xrow = static_cast<const T*>(a.x) + a.x_layout().At(b, d, 0);
  const int64_t row = a.io_layout().At(b, d, 0);
  const T* dyrow = static_cast<const T*>(a.dy) + row;
  T* dxrow = static_cast<T*>(a.dx) + row;
  const bool silu = a.act == Activation::kSilu;
  const int32_t hist = kMasked ? HistoryId(a, b) : 0;
  const float bias = StageWideTaps(a, b, d, taps);
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

    // g of the run from step c0 + kWideR * run
    auto g_of = [&](int run, float (&g)[kWideR]) {
      const int64_t p0 = c0 + kWideR * run;
      auto own = [&](int j) { return ido[WideAt(kWideR * run + j)]; };
      float dy[kWideR];
      LoadWideRun<T>(dyrow, p0, L, dy);
      float pre[kWideR] = {};
      auto pres = [&](int32_t s, bool masked, unsigned take) {
        WidePre<kMasked>(xs, idx, s, masked, take, run + 1, taps, W, bias, pre);
      };
      unsigned live = ~0u;
      if (silu) {
        if constexpr (kMasked)
          live = WidePasses(clean, ido[0], own, pres);
        else
          pres(0, false, ~0u);
      } else if constexpr (kMasked) {
#pragma unroll
        for (int j = 0; j < kWideR; ++j) live &= own(j) >= 0 ? ~0u : ~(1u << j);
      }
#pragma unroll
      for (int j = 0; j < kWideR; ++j)
        g[j] = (live >> j) & 1 ? (silu ? ActGrad(pre[j], dy[j], true) : dy[j]) : 0.f;
    };

    // g of the chunk's runs into the g buffer; first, for the span's last
    // chunk, g of the steps after it (zeros past the row), by the first lanes
    // (the others repeat the last of those runs: the passes shuffle). One
    // call site of g_of, so that it is inlined once.
    const int nahead = hp / kWideR;
    for (int ahead = ci == last; ahead >= 0; --ahead) {
      const int run = ahead ? kWideChunk / kWideR + min(lane, nahead - 1) : lane;
      float gr[kWideR];
      g_of(run, gr);
      if (!ahead || lane < nahead)
#pragma unroll
        for (int j = 0; j < kWideR; ++j) gs[WideAt(kWideR * run + j)] = gr[j];
    }
    const int64_t p0 = c0 + kWideR * lane;
    auto own = [&](int j) { return ido[WideAt(kWideR * lane + j)]; };
    float g[kWideR];  // this lane's own, written above
#pragma unroll
    for (int j = 0; j < kWideR; ++j) g[j] = gs[WideAt(kWideR * lane + j)], dbias += g[j];

    // dweight: pass s takes the g of the outputs of id s over inputs of id s
    auto dweight = [&](int32_t s, bool masked, unsigned take) {
      float gt[kWideR];
#pragma unroll
      for (int j = 0; j < kWideR; ++j) gt[j] = (take >> j) & 1 ? g[j] : 0.f;
      if (masked)
        WideDweight<kMasked>(xs, idx, s, lane + 1, gt, W, dws);
      else
        WideDweight<false>(xs, idx, s, lane + 1, gt, W, dws);
    };
    if constexpr (kMasked)
      WidePasses(clean, ido[0], own, dweight);
    else
      dweight(0, false, ~0u);
    __syncwarp();  // the g buffer is complete

    // dx of the run's inputs: pass s sums the g of outputs of id s into the
    // inputs of id s (padding inputs get none: their outputs' g is 0 anyway)
    float dx[kWideR] = {};
    auto dxs = [&](int32_t s, bool masked, unsigned take) {
      float acc[kWideR] = {};
      if (masked)
        WideTaps<kMasked, true>(gs, ido, s, lane, taps, W, acc);
      else
        WideTaps<false, true>(gs, ido, s, lane, taps, W, acc);
#pragma unroll
      for (int j = 0; j < kWideR; ++j)
        if ((take >> j) & 1) dx[j] = acc[j];
    };
    if constexpr (kMasked)
      WidePasses(clean, ido[0], own, dxs);
    else
      dxs(0, false, ~0u);
    if (p0 < L) StoreWideRun<T>(dxrow, p0, L, dx);
  }

  // The warp's partial dweight (dws) and dbias.
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) dbias += __shfl_xor_sync(kFullMask, dbias, off);
  __syncwarp();
  const int64_t bpg = BatchPerGroupFast(a), grp = DivFast(b, bpg);
  const int64_t nparts = bpg * spans_per_row;
  const int64_t partidx = (b - grp * bpg) * spans_per_row + pl.first_chunk / kWideSpan;
  float* out = ws + ((grp * nparts + partidx) * a.dim + d) * (W + 1);
  for (int k = lane; k < W; k += 32) out[k] = dws[k];
  if (lane == 0) out[W] = dbias;
}

template <typename T>
cudaError_t LaunchT(const ConvArgs& a, const BackwardPlan& p, float* ws, cudaStream_t stream) {
  const bool masked = a.mode == SegmentMode::kSeqIdx;
  const size_t smem = size_t(kWideWarps) * WideSmem(int(a.width), true, masked, int(sizeof(T))).words * 4;
  auto* kernel = masked ? BwdWideKernel<T, true> : BwdWideKernel<T, false>;
  if (smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  kernel<<<unsigned(StreamBlocks(a, p.nchunk)), kStreamThreads, smem, stream>>>(a, p.nchunk, ws);
  return cudaGetLastError();
}

}  // namespace

cudaError_t BackwardWide(const ConvArgs& a, const BackwardPlan& p, float* ws, cudaStream_t stream) {
  return WithFloatType(a.x_dtype, cudaErrorNotSupported,
                       [&](auto t) { return LaunchT<decltype(t)>(a, p, ws, stream); });
}

}  // namespace jcc::cuda
