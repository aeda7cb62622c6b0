// The general forward (tile.cuh): y = act(bias + sum_k w[k] x[t - H + k])
// (+ residual), any layout, width, alignment and sequence mode. Per tile:
// stage the kTileT + H inputs (and, masked modes, the per-step sequence
// data), then each warp computes its run; channels-first outputs go back
// through shared memory so that rows are written whole.
#include "launchers.h"
#include "tile.cuh"

namespace jcc::cuda {
namespace {

template <typename T>
__global__ void __launch_bounds__(kTileThreads, kTileBlocksPerSm)
    FwdTileKernel(const ConvArgs a, int64_t ntiles, int64_t nblocks) {
  extern __shared__ float4 smem_raw[];
  const int W = int(a.width), H = W - 1;
  const int nrows = kTileT + H;
  float* base = reinterpret_cast<float*>(smem_raw);
  TileRows xs{base};
  float* taps = base + nrows * kTileLd;
  float* bias = taps + W * kTileC;
  char* tail = reinterpret_cast<char*>(smem_raw) +
               ((size_t(nrows) * kTileLd + size_t(W) * kTileC + kTileC) * sizeof(float) + 15) / 16 * 16;
  TileSeq seq{reinterpret_cast<int32_t*>(tail + 2 * sizeof(int64_t) * nrows),
              reinterpret_cast<int64_t*>(tail), reinterpret_cast<int64_t*>(tail) + nrows};
  const T* x = static_cast<const T*>(a.x);
  const T* res = static_cast<const T*>(a.residual);
  T* y = static_cast<T*>(a.y);
  const Layout3 xl = a.x_layout(), io = a.io_layout();
  const bool silu = a.act == Activation::kSilu;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  for (int64_t blk = blockIdx.x; blk < nblocks; blk += gridDim.x) {
    int64_t tile;
    const TileWhere w = LocateTileBlock(a, blk, &tile, ntiles);
    const int64_t t0 = tile * kTileT, t_first = t0 - H;
    __syncthreads();  // the previous tile's readers are done
    StageTaps(a, w, taps, bias);
    StageRows<T>(a, xs, t_first, nrows,
                 [&](int c, int64_t t) { return StageValue<T>(a, x, xl, w, c, t); });
    StageSeq(a, w, seq, t_first, nrows);
    __syncthreads();

    // This warp's run: outputs t0 + r0 + j, whose windows are rows r0 + j ..
    const int r0 = warp * kTileR;
    float acc[kTileR];
    unsigned valid = ~0u;  // bit j: output j is not padding
#pragma unroll
    for (int j = 0; j < kTileR; ++j) acc[j] = bias[lane];
    if (RunIsClean(a, seq, t_first, r0, kTileR, H)) {
      RunTaps(xs, r0, lane, taps, W, acc);
    } else {
      auto x_at = [&](int64_t p) { return xs(int(p - t_first), lane); };
      auto w_at = [&](int k) { return taps[k * kTileC + lane]; };
      auto id_at = [&](int64_t p) { return seq.id[p - t_first]; };
#pragma unroll
      for (int j = 0; j < kTileR; ++j) {
        const int r = r0 + H + j;
        const int64_t start = a.mode == SegmentMode::kVarlen ? seq.start[r] : 0;
        const int64_t hrow = a.mode == SegmentMode::kVarlen ? seq.hrow[r] : -1;
        if (!MaskedPre<T>(a, t_first + r, W, bias[lane], x_at, w_at, id_at, start, hrow,
                          w.c0 + lane, &acc[j]))
          valid &= ~(1u << j);
      }
    }
#pragma unroll
    for (int j = 0; j < kTileR; ++j) acc[j] = (valid >> j) & 1 ? Activate(acc[j], silu) : 0.f;

    if (a.channels_last) {  // a warp writes whole steps of 32 channels
      if (lane < w.nc) {
#pragma unroll
        for (int j = 0; j < kTileR; ++j) {
          const int64_t t = t0 + r0 + j;
          if (t >= a.len) break;
          const int64_t o = io.At(w.b, w.c0 + lane, t);
          y[o] = FromF<T>(acc[j] + (res ? ToF(res[o]) : 0.f));
        }
      }
    } else {  // through shared memory, then along each channel's row
      __syncthreads();  // every warp is done reading xs
#pragma unroll
      for (int j = 0; j < kTileR; ++j) xs(r0 + j, lane) = acc[j];
      __syncthreads();
      for (int c = warp; c < w.nc; c += kTileWarps)
        for (int r = lane; r < kTileT && t0 + r < a.len; r += 32) {
          const int64_t o = io.At(w.b, w.c0 + c, t0 + r);
          y[o] = FromF<T>(xs(r, c) + (res ? ToF(res[o]) : 0.f));
        }
    }
  }
}

template <typename T>
cudaError_t LaunchFwdTile(const ConvArgs& a, cudaStream_t stream) {
  const int64_t ntiles = CeilDiv(a.len, kTileT);
  const int64_t nblocks = a.batch * CeilDiv(a.dim, kTileC) * ntiles;
  const size_t smem = TileSmemBytes(kTileT + int(a.width) - 1, 1, int(a.width));
  return LaunchWithSmem(FwdTileKernel<T>, Min64(nblocks, int64_t(1) << 30), kTileThreads, smem, 0, stream, a,
                        ntiles, nblocks);
}

}  // namespace

cudaError_t ForwardTile(const ConvArgs& a, cudaStream_t stream) {
  return WithFloatType(a.x_dtype, cudaErrorNotSupported,
                       [&](auto t) { return LaunchFwdTile<decltype(t)>(a, stream); });
}

}  // namespace jcc::cuda
