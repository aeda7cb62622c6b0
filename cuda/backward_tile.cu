// The general backward (tile.cuh). With g = dy * act'(pre) (zero on padding
// and past the end):
//   dx[p] = sum_k w[k] g[p + H - k] over outputs of p's sequence,
//   dweight[k] = sum_t g[t] tap_k(t), dbias = sum_t g[t],
// tap_k(t) the (masked) input tap k of output t reads. A block owns 32
// channels of one batch row and a chunk of consecutive time tiles; per tile
// it stages x (H before to H after), dy, and the sequence data, computes g
// into shared memory, then dweight/dbias partials (warps split over chunks
// of 8 taps and over time, reduced in a fixed order into per-block sums), then
// dx. The block's sums go to the workspace (ReduceKernel adds the blocks in a
// fixed order). dinitial_states and the final-states cotangent are left to
// StatesGradKernel (states.cu).
#include "launchers.h"
#include "tile.cuh"

namespace jcc::cuda {
namespace {

// Shared-memory layout of one block, in floats (then the sequence data).
struct BwdTileSmem {
  int nx, ng, x, g, taps, bias, dwacc, red, floats;
  __host__ __device__ explicit BwdTileSmem(int W) {
    const int H = W - 1;
    nx = kTileT + 2 * H + kTileR;  // x at steps t0 - H .. (a run past the tile reads up to here)
    ng = kTileT + H + kTileR;      // dy, then g, at steps t0 ..
    x = 0;
    g = x + nx * kTileLd;
    taps = g + ng * kTileLd;
    bias = taps + W * kTileC;
    dwacc = bias + kTileC;                    // [W + 1][32]: the block's dweight, dbias (k == W)
    red = dwacc + (W + 1) * kTileC;           // [warps][9][32]: partial sums over time parts
    floats = (red + kTileWarps * 9 * kTileC + 3) / 4 * 4;
  }
  __host__ __device__ size_t Bytes() const {
    return size_t(floats) * sizeof(float) + size_t(nx) * (sizeof(int32_t) + 2 * sizeof(int64_t));
  }
};

template <typename T>
__global__ void __launch_bounds__(kTileThreads, 2)
    BwdTileKernel(const ConvArgs a, int64_t ntiles, int64_t tiles_per_chunk, int64_t nblocks,
                  float* ws) {
  extern __shared__ float4 smem_raw[];
  const int W = int(a.width), H = W - 1;
  const BwdTileSmem L(W);
  float* sm = reinterpret_cast<float*>(smem_raw);
  TileRows xs{sm + L.x}, gs{sm + L.g};
  float* taps = sm + L.taps;
  float* bias = sm + L.bias;
  float* dwacc = sm + L.dwacc;
  float* red = sm + L.red;
  char* tail = reinterpret_cast<char*>(sm + L.floats);
  TileSeq seq{reinterpret_cast<int32_t*>(tail + 2 * sizeof(int64_t) * L.nx),
              reinterpret_cast<int64_t*>(tail), reinterpret_cast<int64_t*>(tail) + L.nx};
  const T* x = static_cast<const T*>(a.x);
  const T* dy = static_cast<const T*>(a.dy);
  T* dx = static_cast<T*>(a.dx);
  const Layout3 xl = a.x_layout(), io = a.io_layout();
  const bool silu = a.act == Activation::kSilu;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t nchunk = CeilDiv(ntiles, tiles_per_chunk);
  const int nkc = (W + 7) / 8;  // chunks of 8 taps
  // dweight work: warp -> (tap chunk, time part); parts split a tile's steps.
  const int parts = nkc >= kTileWarps ? 1 : kTileWarps / nkc;

  for (int64_t blk = blockIdx.x; blk < nblocks; blk += gridDim.x) {
    int64_t chunk;
    const TileWhere w = LocateTileBlock(a, blk, &chunk, nchunk);
    __syncthreads();  // the previous block's readers are done
    StageTaps(a, w, taps, bias);
    for (int i = threadIdx.x; i < (W + 1) * kTileC; i += kTileThreads) dwacc[i] = 0.f;
    const int64_t tile_end = Min64(ntiles, (chunk + 1) * tiles_per_chunk);
    for (int64_t tile = chunk * tiles_per_chunk; tile < tile_end; ++tile) {
      const int64_t t0 = tile * kTileT, t_first = t0 - H;
      __syncthreads();
      StageRows<T>(a, xs, t_first, L.nx,
                   [&](int c, int64_t t) { return StageValue<T>(a, x, xl, w, c, t); });
      StageRows<T>(a, gs, t0, L.ng, [&](int c, int64_t t) {
        return c < w.nc && t < a.len ? ToF(dy[io.At(w.b, w.c0 + c, t)]) : 0.f;
      });
      StageSeq(a, w, seq, t_first, L.nx);
      __syncthreads();

      auto x_at = [&](int64_t p) { return xs(int(p - t_first), lane); };
      auto w_at = [&](int k) { return taps[k * kTileC + lane]; };
      auto id_at = [&](int64_t p) { return seq.id[p - t_first]; };
      // Whether output t (at seq row r) is a live output, and its start / state row.
      auto seq_start = [&](int r) { return a.mode == SegmentMode::kVarlen ? seq.start[r] : int64_t(0); };
      auto seq_hrow = [&](int r) { return a.mode == SegmentMode::kVarlen ? seq.hrow[r] : int64_t(-1); };

      // g at steps t0 + j, j < kTileT + H (runs of kTileR; rows past the end hold zeros).
      for (int j0 = warp * kTileR; j0 < kTileT + H; j0 += kTileWarps * kTileR) {
        float acc[kTileR];
#pragma unroll
        for (int j = 0; j < kTileR; ++j) acc[j] = bias[lane];
        unsigned live = ~0u;
        if (RunIsClean(a, seq, t_first, j0, kTileR, H)) {
          if (silu) RunTaps(xs, j0, lane, taps, W, acc);
        } else {
#pragma unroll
          for (int j = 0; j < kTileR; ++j) {
            const int r = j0 + H + j;
            if (!MaskedPre<T>(a, t_first + r, W, bias[lane], x_at, w_at, id_at, seq_start(r),
                              seq_hrow(r), w.c0 + lane, &acc[j]))
              live &= ~(1u << j);
          }
        }
#pragma unroll
        for (int j = 0; j < kTileR; ++j) {
          const float d = gs(j0 + j, lane);
          const bool ok = (live >> j) & 1 && t0 + j0 + j < a.len;
          gs(j0 + j, lane) = ok ? (silu ? ActGrad(acc[j], d, true) : d) : 0.f;
        }
      }
      __syncthreads();

      // dweight/dbias over this tile's outputs: warp -> chunk kc (taps 8 kc ..), part.
      for (int job = warp; job < nkc * parts; job += kTileWarps) {
        const int kc = job / parts, part = job % parts;
        const int j_lo = kTileT * part / parts, j_hi = kTileT * (part + 1) / parts;
        const int k0 = kc * 8;
        float acc[9] = {};  // 8 taps, then the bias
        for (int j0 = j_lo; j0 < j_hi; j0 += 8) {
          float g[8];
#pragma unroll
          for (int u = 0; u < 8; ++u) g[u] = j0 + u < j_hi ? gs(j0 + u, lane) : 0.f;
          if (RunIsClean(a, seq, t_first, j0, 8, H)) {
            float win[15];
#pragma unroll
            for (int q = 0; q < 15; ++q) win[q] = k0 + q < W + 7 ? xs(j0 + k0 + q, lane) : 0.f;
#pragma unroll
            for (int q = 0; q < 8; ++q)
#pragma unroll
              for (int u = 0; u < 8; ++u) acc[q] += g[u] * win[u + q];
          } else {
#pragma unroll
            for (int u = 0; u < 8; ++u) {
              const int r = j0 + H + u;
              const int64_t t = t_first + r;
              const int32_t id = a.mode == SegmentMode::kSeqIdx ? seq.id[r] : 0;
#pragma unroll
              for (int q = 0; q < 8; ++q)
                if (k0 + q < W)
                  acc[q] += g[u] * MaskedTap<T>(a, t, k0 + q, H, x_at, id_at, id, seq_start(r),
                                                seq_hrow(r), w.c0 + lane);
            }
          }
          if (kc == 0) {
#pragma unroll
            for (int u = 0; u < 8; ++u) acc[8] += g[u];
          }
        }
        if (parts == 1) {
#pragma unroll
          for (int q = 0; q < 8; ++q)
            if (k0 + q < W) dwacc[(k0 + q) * kTileC + lane] += acc[q];
          if (kc == 0) dwacc[W * kTileC + lane] += acc[8];
        } else {
#pragma unroll
          for (int q = 0; q < 9; ++q) red[(warp * 9 + q) * kTileC + lane] = acc[q];
        }
      }
      if (parts > 1) {  // the parts of each chunk, in order
        __syncthreads();
        for (int job = warp; job < nkc; job += kTileWarps) {
          float s[9] = {};
          for (int p = 0; p < parts; ++p)
#pragma unroll
            for (int q = 0; q < 9; ++q) s[q] += red[((job * parts + p) * 9 + q) * kTileC + lane];
#pragma unroll
          for (int q = 0; q < 8; ++q)
            if (job * 8 + q < W) dwacc[(job * 8 + q) * kTileC + lane] += s[q];
          if (job == 0) dwacc[W * kTileC + lane] += s[8];
        }
      }

      // dx at steps t0 + r0 + j from g at rows r0 + j .. r0 + j + H (taps reversed).
      const int r0 = warp * kTileR;
      float acc[kTileR] = {};
      if (RunIsClean(a, seq, t_first, r0 + H, kTileR, H)) {
        RunTaps<true>(gs, r0, lane, taps, W, acc);
      } else {
#pragma unroll
        for (int j = 0; j < kTileR; ++j) {
          const int64_t p = t0 + r0 + j;
          const int32_t idp = a.mode == SegmentMode::kSeqIdx ? seq.id[r0 + j + H] : 0;
          float s = 0.f;
          for (int k = 0; k < W; ++k) {
            const int rt = r0 + j + 2 * H - k;  // seq row of output t = p + H - k
            const bool same = a.mode == SegmentMode::kSeqIdx ? seq.id[rt] == idp
                                                              : p >= seq_start(rt);
            if (same) s += w_at(k) * gs(r0 + j + H - k, lane);
          }
          acc[j] = s;
        }
      }
      if (a.channels_last) {
        if (lane < w.nc) {
#pragma unroll
          for (int j = 0; j < kTileR; ++j) {
            const int64_t t = t0 + r0 + j;
            if (t >= a.len) break;
            dx[io.At(w.b, w.c0 + lane, t)] = FromF<T>(acc[j]);
          }
        }
      } else {  // through shared memory (x is no longer needed), then along rows
        __syncthreads();
#pragma unroll
        for (int j = 0; j < kTileR; ++j) xs(r0 + j, lane) = acc[j];
        __syncthreads();
        for (int c = warp; c < w.nc; c += kTileWarps)
          for (int r = lane; r < kTileT && t0 + r < a.len; r += 32)
            dx[io.At(w.b, w.c0 + c, t0 + r)] = FromF<T>(xs(r, c));
      }
    }
    __syncthreads();
    // The block's partial sums: ws[grp][part][d][W + 1].
    const int64_t bpg = a.batch_per_group(), nparts = bpg * nchunk;
    const int64_t part = (w.b % bpg) * nchunk + chunk;
    for (int i = threadIdx.x; i < (W + 1) * kTileC; i += kTileThreads) {
      const int k = i / kTileC, c = i % kTileC;
      if (c < w.nc) ws[((w.g * nparts + part) * a.dim + w.c0 + c) * (W + 1) + k] = dwacc[i];
    }
  }
}

template <typename T>
cudaError_t LaunchBwdTile(const ConvArgs& a, const BackwardPlan& p, float* ws, cudaStream_t stream) {
  const BwdTileSmem L(int(a.width));
  const size_t smem = L.Bytes();
  const int64_t nblocks = a.batch * CeilDiv(a.dim, kTileC) * p.nchunk;
  return LaunchWithSmem(BwdTileKernel<T>, Min64(nblocks, int64_t(1) << 30), kTileThreads, smem, 0, stream, a,
                        p.ntiles, p.tiles_per_chunk, nblocks, ws);
}

}  // namespace

BackwardPlan TileBackwardPlan(const ConvArgs& a) {
  BackwardPlan p;
  p.family = BackwardPlan::kTile;
  p.ntiles = CeilDiv(a.len, kTileT);
  p.tiles_per_chunk = CeilDiv(BackwardChunkSteps(a.width), kTileT);
  p.nchunk = CeilDiv(p.ntiles, p.tiles_per_chunk);
  return p;
}

cudaError_t BackwardTile(const ConvArgs& a, const BackwardPlan& p, float* ws, cudaStream_t stream) {
  return WithFloatType(a.x_dtype, cudaErrorNotSupported,
                       [&](auto t) { return LaunchBwdTile<decltype(t)>(a, p, ws, stream); });
}

}  // namespace jcc::cuda
