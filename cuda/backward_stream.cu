// Streaming backward for the hot case of forward_stream.cu (see stream.cuh).
// A warp owns a span of up to kMaxChunksPerWarp warp chunks of one row and
// walks them from last to first, so its set-up (row, weights) and its partial
// dweight/dbias are paid once per span. For each chunk each thread loads its
// kVecs vectors of x and dy at once, then walks them from last to first:
//   g[t] = dy[t] act'(pre[t]),  dx[t] = sum_k w[k] g[t + H - k] (+ dfinal tail)
// The H inputs before a vector come from the lane before (lane 0: lane 31 of
// the previous vector, or the chunk's history); the H values of g after a
// vector from the lane after (lane 31: lane 0 of the next vector, or of the
// chunk after, handed over from the previous iteration; past the span, g
// recomputed from one extra x and dy vector that lane 31 loads). Each warp's
// partial dweight/dbias go to ws[grp][part][d][W + 1] (part = (b %
// batch_per_group) * warps_per_row + the warp's index in its row) for
// states.cu's ReduceKernel to add in a fixed order; dinitial_states and the
// final-state cotangent are left to StatesGradKernel.
#include "launchers.h"
#include "stream.cuh"

namespace jcc::cuda {
namespace {

template <typename T, int kW>
__global__ void __launch_bounds__(kStreamThreads)
    BwdStreamKernel(const ConvArgs a, int64_t warps_per_row, int chunks_per_warp, float* ws) {
  using S = Stream<T>;
  constexpr int N = S::kN, V = S::kVecs, H = kW - 1, kHist = H > 0 ? H : 1;
  constexpr int kVecStride = 32 * N;  // steps between a lane's vectors
  constexpr int kWarpSteps = S::kWarpSteps;
  static_assert(H < N, "halo must come from one neighbour");
  const WarpChunk wc = LocateWarp(a, warps_per_row, int64_t(kWarpSteps) * chunks_per_warp);
  if (!wc.valid) return;
  const int lane = threadIdx.x & 31;
  const int64_t L = a.len;
  const int64_t span_end = Min64(L, wc.c0 + int64_t(kWarpSteps) * chunks_per_warp);
  const int nchunks = int(CeilDiv(span_end - wc.c0, kWarpSteps));
  float w[kW];
  const float bias = LoadTaps<kW>(a, wc.row, w);
  const bool silu = a.act == Activation::kSilu;
  const int64_t b = DivFast(wc.row, a.dim), d = wc.row - b * a.dim;
  const T* xrow = static_cast<const T*>(a.x) + wc.row * L;
  const T* dyrow = static_cast<const T*>(a.dy) + wc.row * L;
  T* dxrow = static_cast<T*>(a.dx) + wc.row * L;
  const uint4 zero = make_uint4(0, 0, 0, 0);

  float part[kW + 1] = {};   // partial dweight (k < W) and dbias (k == W)
  // Lane 31: g at the H steps after the current chunk; for the span's last
  // chunk, recomputed from the vector after the span (zero past the row's end).
  float gafter[kHist] = {};
  if (H > 0 && lane == 31 && span_end < L) {
    float xl[N], xn[N], dn[N];
    Unpack<T, N>(LoadRaw16(xrow + span_end - N), xl);
    Unpack<T, N>(LoadRaw16(xrow + span_end), xn);
    Unpack<T, N>(LoadRaw16(dyrow + span_end), dn);
#pragma unroll
    for (int i = 0; i < H; ++i) {
      float pre = bias;
#pragma unroll
      for (int k = 0; k < kW; ++k) {
        const int idx = i - H + k;
        pre += w[k] * (idx < 0 ? xl[N + idx] : xn[idx]);
      }
      gafter[i] = ActGrad(pre, dn[i], silu);
    }
  }
  for (int ci = nchunks - 1; ci >= 0; --ci) {
    const int64_t c0 = wc.c0 + int64_t(ci) * kWarpSteps;
    // This lane's vector j covers steps t0 + j * kVecStride + [0, N); `left`
    // steps of the row remain from t0 (vector j exists iff j * kVecStride < left).
    const int64_t t0 = c0 + int64_t(lane) * N, left = L - t0;
    const T* xp = xrow + t0;
    const T* dyp = dyrow + t0;

    // All loads first.
    uint4 xr[V], dyr[V], prev = zero;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const bool ok = j * kVecStride < left;
      xr[j] = ok ? LoadRaw16(xp + j * kVecStride) : zero;
      dyr[j] = ok ? LoadRaw16(dyp + j * kVecStride) : zero;
    }
    if (H > 0 && lane == 0 && c0 > 0) prev = LoadRaw16(xp - N);
    // The H inputs before the chunk (lane 0; initial states or zeros at step 0).
    float hist[kHist] = {};
    if (H > 0 && lane == 0) ChunkHistory<T, N, H, kHist>(a, wc.row, c0, prev, hist);

    float ghead[kHist] = {};  // g at the first H steps of vector j + 1 (lane 0 hands it to lane 31)
#pragma unroll
    for (int j = V - 1; j >= 0; --j) {
      // win = x[t - H .. t + N) for this vector's first step t. One shuffle
      // per halo value: lanes 1..31 take lane - 1's tail of vector j; lane 0
      // takes lane 31's tail of vector j - 1, which lane 31 offers instead.
      float win[H + N];
      Unpack<T, N>(xr[j], *reinterpret_cast<float(*)[N]>(win + H));
      if (H > 0) {
        float before[N];
        Unpack<T, N>(xr[j > 0 ? j - 1 : 0], before);
#pragma unroll
        for (int i = 0; i < H; ++i) {
          const float offer = lane == 31 ? before[N - H + i] : win[N + i];
          const float s = __shfl_sync(kFullMask, offer, (lane + 31) & 31);
          win[i] = lane == 0 && j == 0 ? hist[i] : s;
        }
      }
      const bool live = j * kVecStride < left;
      // ge = g[t .. t + N + H): this vector's g, then the H after it (lanes
      // 0..30 from lane + 1's vector j, lane 31 from lane 0's vector j + 1).
      float dyv[N], ge[N + kHist];
      Unpack<T, N>(dyr[j], dyv);
#pragma unroll
      for (int i = 0; i < N; ++i) {
        float g = dyv[i];
        if (silu) {
          float pre = bias;
#pragma unroll
          for (int k = 0; k < kW; ++k) pre += w[k] * win[i + k];
          g = ActGrad(pre, dyv[i], true);
        }
        ge[i] = live ? g : 0.f;
      }
#pragma unroll
      for (int i = 0; i < H; ++i) {
        const float offer = lane == 0 ? ghead[i] : ge[i];
        const float s = __shfl_sync(kFullMask, offer, (lane + 1) & 31);
        ge[N + i] = lane == 31 && j == V - 1 ? gafter[i] : s;
        ghead[i] = ge[i];
      }
      if (!live) continue;
#pragma unroll
      for (int i = 0; i < N; ++i) {
#pragma unroll
        for (int k = 0; k < kW; ++k) part[k] += ge[i] * win[i + k];
        part[kW] += ge[i];
      }
      float dx[N];
#pragma unroll
      for (int i = 0; i < N; ++i) {
        float acc = 0.f;
#pragma unroll
        for (int k = 0; k < kW; ++k) acc += w[k] * ge[i + H - k];
        dx[i] = acc;
      }
      StoreVec<T, N>(dxrow + t0 + j * kVecStride, dx);
    }
    // Lane 0's head of this chunk is what follows the chunk before it.
#pragma unroll
    for (int i = 0; i < H; ++i) gafter[i] = __shfl_sync(kFullMask, ghead[i], 0);
  }

  // Warp reduction (a fixed butterfly), then lane k writes part k.
  float mine = 0.f;
#pragma unroll
  for (int k = 0; k <= kW; ++k) {
    float s = part[k];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(kFullMask, s, off);
    if (lane == k) mine = s;
  }
  if (lane <= kW) {
    const int64_t bpg = BatchPerGroupFast(a), grp = DivFast(b, bpg);
    const int64_t nparts = bpg * warps_per_row, partidx = (b - grp * bpg) * warps_per_row + wc.index;
    ws[((grp * nparts + partidx) * a.dim + d) * (kW + 1) + lane] = mine;
  }
}

template <typename T, int kW>
cudaError_t LaunchBwdStream(const ConvArgs& a, const BackwardPlan& p, float* ws, cudaStream_t stream) {
  BwdStreamKernel<T, kW><<<unsigned(StreamBlocks(a, p.warps_per_row)), kStreamThreads, 0, stream>>>(
      a, p.warps_per_row, int(p.chunks_per_warp), ws);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchT(const ConvArgs& a, const BackwardPlan& p, float* ws, cudaStream_t stream) {
  switch (a.width) {
    case 1: return LaunchBwdStream<T, 1>(a, p, ws, stream);
    case 2: return LaunchBwdStream<T, 2>(a, p, ws, stream);
    case 3: return LaunchBwdStream<T, 3>(a, p, ws, stream);
    default: return LaunchBwdStream<T, 4>(a, p, ws, stream);
  }
}

}  // namespace

cudaError_t BackwardStream(const ConvArgs& a, const BackwardPlan& p, float* ws, cudaStream_t stream) {
  switch (a.x_dtype) {
    case DType::kF32: return LaunchT<float>(a, p, ws, stream);
    case DType::kF16: return LaunchT<__half>(a, p, ws, stream);
    case DType::kBF16: return LaunchT<__nv_bfloat16>(a, p, ws, stream);
    default: return cudaErrorNotSupported;
  }
}

}  // namespace jcc::cuda
