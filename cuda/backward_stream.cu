// Streaming backward for the hot case of forward_stream.cu (see stream.cuh).
// Each thread loads its kVecs vectors of x and dy at once, then walks them
// from last to first:
//   g[t] = dy[t] act'(pre[t]),  dx[t] = sum_k w[k] g[t + H - k] (+ dfinal tail)
// The H inputs before a vector come from the lane before (lane 0: lane 31 of
// the previous vector, or the chunk's history); the H values of g after a
// vector from the lane after (lane 31: lane 0 of the next vector, or, past the
// chunk, g recomputed from one extra x and dy vector that lane 31 loads with
// the others). Each warp's partial dweight/dbias go to
// ws[grp][part][d][W + 1] (part = (b % batch_per_group) * chunks + chunk) for
// backward.cu's ReduceKernel to add in a fixed order; dinitial_states is left
// to DInitKernel.
#include "launchers.h"
#include "stream.cuh"

namespace jcc::cuda {
namespace {

template <typename T, int kW>
__global__ void __launch_bounds__(kStreamThreads)
    BwdStreamKernel(const ConvArgs a, int64_t warps_per_row, float* ws) {
  using S = Stream<T>;
  constexpr int N = S::kN, V = S::kVecs, H = kW - 1, kHist = H > 0 ? H : 1;
  static_assert(H < N, "halo must come from one neighbour");
  const WarpChunk wc = LocateWarp(a, warps_per_row, S::kWarpSteps);
  if (!wc.valid) return;
  const int lane = threadIdx.x & 31;
  const int64_t L = a.len, c_end = wc.c0 + S::kWarpSteps;
  const T* xrow = static_cast<const T*>(a.x) + wc.row * L;
  const T* dyrow = static_cast<const T*>(a.dy) + wc.row * L;
  const uint4 zero = make_uint4(0, 0, 0, 0);

  // All loads first.
  uint4 xr[V], dyr[V], prev = zero, nx = zero, ndy = zero;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int64_t t = wc.c0 + int64_t(j * 32 + lane) * N;
    xr[j] = t < L ? LoadRaw16(xrow + t) : zero;
    dyr[j] = t < L ? LoadRaw16(dyrow + t) : zero;
  }
  if (H > 0 && lane == 0 && wc.c0 > 0) prev = LoadRaw16(xrow + wc.c0 - N);
  if (H > 0 && lane == 31 && c_end < L) {
    nx = LoadRaw16(xrow + c_end);
    ndy = LoadRaw16(dyrow + c_end);
  }
  float w[kW];
  const float bias = LoadTaps<kW>(a, wc.row, w);
  const bool silu = a.act == Activation::kSilu;
  const int64_t b = wc.row / a.dim, d = wc.row - b * a.dim;

  float hist[kHist] = {};  // lane 0: inputs before the chunk
  if (H > 0 && lane == 0) ChunkHistory<T, N, H, kHist>(a, wc.row, wc.c0, prev, hist);
  // gcarry (lane 31): g at the H steps after the current vector index.
  float gcarry[kHist] = {};
  if (H > 0 && lane == 31 && c_end < L) {
    float xl[N], xn[N], dn[N];
    Unpack<T, N>(xr[V - 1], xl);
    Unpack<T, N>(nx, xn);
    Unpack<T, N>(ndy, dn);
#pragma unroll
    for (int i = 0; i < H; ++i) {
      float pre = bias;
#pragma unroll
      for (int k = 0; k < kW; ++k) {
        const int idx = i - H + k;
        pre += w[k] * (idx < 0 ? xl[N + idx] : xn[idx]);
      }
      gcarry[i] = ActGrad(pre, dn[i], silu);
    }
  }

  float part[kW + 1] = {};  // partial dweight (k < W) and dbias (k == W)
  T* dxrow = static_cast<T*>(a.dx) + wc.row * L;
  const int64_t fin0 = L - H;  // first step whose input is also a final state
#pragma unroll
  for (int j = V - 1; j >= 0; --j) {
    const int64_t t0 = wc.c0 + int64_t(j * 32 + lane) * N;
    // win = x[t0 - H .. t0 + N)
    float win[H + N];
    Unpack<T, N>(xr[j], *reinterpret_cast<float(*)[N]>(win + H));
#pragma unroll
    for (int i = 0; i < H; ++i) {
      const float s = __shfl_sync(kFullMask, win[N + i], (lane + 31) & 31);
      float left = hist[i];
      if (j > 0) {  // lane 31's tail of the previous vector index
        float pv[N];
        Unpack<T, N>(xr[j > 0 ? j - 1 : 0], pv);
        left = __shfl_sync(kFullMask, pv[N - H + i], 31);
      }
      win[i] = lane == 0 ? left : s;
    }
    // ge = g[t0 .. t0 + N + H)
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
      ge[i] = t0 < L ? g : 0.f;
    }
#pragma unroll
    for (int i = 0; i < H; ++i) {
      const float s = __shfl_sync(kFullMask, ge[i], (lane + 1) & 31);
      ge[N + i] = lane == 31 ? gcarry[i] : s;
      gcarry[i] = s;  // on lane 31: lane 0's head, the next vector index down
    }
    if (t0 >= L) continue;
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
      const int64_t p = t0 + i;
      if (a.dfinal_states && p >= fin0) acc += LoadState<T>(a, a.dfinal_states, b, d, p - fin0);
      dx[i] = acc;
    }
    StoreVec<T, N>(dxrow + t0, dx);
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
    const int64_t bpg = a.batch_per_group(), grp = b / bpg, chunk = wc.c0 / S::kWarpSteps;
    const int64_t nparts = bpg * warps_per_row, partidx = (b % bpg) * warps_per_row + chunk;
    ws[((grp * nparts + partidx) * a.dim + d) * (kW + 1) + lane] = mine;
  }
}

template <typename T, int kW>
cudaError_t LaunchBwdStream(const ConvArgs& a, int64_t warps_per_row, float* ws,
                            cudaStream_t stream) {
  BwdStreamKernel<T, kW><<<unsigned(StreamBlocks(a, warps_per_row)), kStreamThreads, 0, stream>>>(
      a, warps_per_row, ws);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchT(const ConvArgs& a, float* ws, cudaStream_t stream) {
  const int64_t warps_per_row = StreamingBackwardTiles(a);
  switch (a.width) {
    case 1: return LaunchBwdStream<T, 1>(a, warps_per_row, ws, stream);
    case 2: return LaunchBwdStream<T, 2>(a, warps_per_row, ws, stream);
    case 3: return LaunchBwdStream<T, 3>(a, warps_per_row, ws, stream);
    default: return LaunchBwdStream<T, 4>(a, warps_per_row, ws, stream);
  }
}

int64_t WarpSteps(DType t) {
  switch (t) {
    case DType::kF32: return Stream<float>::kWarpSteps;
    default: return Stream<__half>::kWarpSteps;
  }
}

}  // namespace

int64_t StreamingBackwardTiles(const ConvArgs& a) {
  const int64_t n = 16 / DTypeBytes(a.x_dtype);
  const bool fits = a.x_dtype != DType::kF64 && !a.channels_last && a.mode == SegmentMode::kRow &&
                    a.width <= 4 && a.len > 0 && a.len % n == 0 && Aligned16(a.x) &&
                    Aligned16(a.dy) && Aligned16(a.dx);
  if (!fits) return 0;
  const int64_t warps_per_row = CeilDiv(a.len, WarpSteps(a.x_dtype));
  return StreamBlocks(a, warps_per_row) <= INT32_MAX ? warps_per_row : 0;
}

cudaError_t BackwardStreaming(const ConvArgs& a, float* ws, cudaStream_t stream) {
  switch (a.x_dtype) {
    case DType::kF32: return LaunchT<float>(a, ws, stream);
    case DType::kF16: return LaunchT<__half>(a, ws, stream);
    case DType::kBF16: return LaunchT<__nv_bfloat16>(a, ws, stream);
    default: return cudaErrorNotSupported;
  }
}

}  // namespace jcc::cuda
