// Forward kernels: y = act(bias + sum_k w[k] x[t - H + k]) + residual, and
// the final states.
//
// FwdTileKernel: one (batch, channel) row per block, kTile steps at a time
//   staged in shared memory with the H-step halo; each thread computes kRun
//   consecutive outputs from 16-byte loads. Any layout and any width (the
//   width is a template for W <= 4 and a run-time loop beyond).
// FwdClKernel: channels-last, W <= 4. Each thread owns kV channels (16 bytes)
//   and walks a slice of time with the last H inputs in registers, so every
//   load and store is a coalesced row of channels.
#include <algorithm>
#include <climits>

#include "common.cuh"
#include "launchers.h"

namespace jcc::cuda {
namespace {

constexpr int kClSteps = 64;  // time steps per thread in the channels-last kernel

// Shared-memory offset of the body of a tile: the halo sits just before it,
// and the body starts 16-byte aligned.
__host__ __device__ inline int BodyOffset(int H) { return (H + 3) & ~3; }

// Steps near a sequence start (seq_idx / varlen modes): the window's older
// taps come from the sequence's initial states, or are zero.
template <typename T, int kW, int kRun>
__device__ __forceinline__ void MaskedFix(const ConvArgs& a, int64_t b, int64_t d, int64_t r0, int H,
                                       const float* win, const float* w, float bias, float* out) {
  const int W = H + 1;
  SegCursor cur;
  cur.Init(a, b, r0, H);
  for (int j = 0; j < kRun; ++j) {
    const int64_t t = r0 + j;
    if (j) cur.Next(a, b, t);
    const int m = cur.M(t, H);
    if (m < H && t < a.len) {
      float acc = bias;
      for (int k = 0; k < W; ++k) {
        float xv = win[j + k];
        if (k < H - m)
          xv = cur.hrow >= 0 ? LoadState<T>(a, a.initial_states, cur.hrow, d, k + m) : 0.f;
        acc += w[k] * xv;
      }
      out[j] = acc;
    }
  }
}

template <typename T, int kW, bool kMasked>
__global__ void __launch_bounds__(kThreads, 4)
    FwdTileKernel(const ConvArgs a, int64_t ntile, int64_t tiles_per_block, int64_t nblocks,
                  bool vec) {
  extern __shared__ float smem[];
  constexpr int kRun = Tiling<T>::kRun, kTile = Tiling<T>::kTile;
  const int W = kW > 0 ? kW : int(a.width);
  const int H = W - 1;
  const int P = BodyOffset(H);
  float* xs = smem;               // [P + kTile]: steps t0 - P .. t0 + kTile
  float* wsm = smem + P + kTile;  // run-time width: the weights
  constexpr int kHs = kW > 1 ? kW - 1 : 1;
  __shared__ float tails[kW > 0 ? (kThreads + 1) * kHs : 1];  // fixed width: run tails
  const T* x = static_cast<const T*>(a.x);
  const T* res = static_cast<const T*>(a.residual);
  T* y = static_cast<T*>(a.y);
  const Layout3 xl = a.x_layout();
  const bool silu = a.act == Activation::kSilu;
  constexpr bool masked = kMasked;  // seq_idx / varlen: steps near sequence starts
  const int64_t nchunk = CeilDiv(ntile, tiles_per_block);

  for (int64_t blk = blockIdx.x; blk < nblocks; blk += gridDim.x) {
    const int64_t chunk = blk % nchunk, row = blk / nchunk;
    const int64_t b = row / a.dim, d = row % a.dim;
    const int64_t wrow = (b / a.batch_per_group()) * a.dim + d;
    const T* xr = x + xl.At(b, d, 0);
    const T* rr = res ? res + xl.At(b, d, 0) : nullptr;
    T* yr = y + xl.At(b, d, 0);

    float w[kW > 0 ? kW : 1];
    if constexpr (kW > 0) {
#pragma unroll
      for (int k = 0; k < kW; ++k) w[k] = LoadAnyF(a.weight, a.w_dtype, wrow * W + k);
    } else {
      for (int k = threadIdx.x; k < W; k += kThreads) wsm[k] = LoadAnyF(a.weight, a.w_dtype, wrow * W + k);
    }
    const float bias = a.bias ? LoadAnyF(a.bias, a.b_dtype, wrow) : 0.f;

    const int64_t tile_begin = chunk * tiles_per_block;
    const int64_t tile_end = Min64(ntile, (chunk + 1) * tiles_per_block);
    // Fixed width: the next tile's run is loaded while this one is computed.
    float v[kRun], vn[kRun];
    for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
      const int64_t t0 = tile * kTile;
      const int64_t r0 = t0 + threadIdx.x * kRun;
      const bool more = tile + 1 < tile_end;
      if (kW == 0 || tile == tile_begin) LoadRun<T>(xr, xl.s_time, r0, a.len, vec, v);
      if constexpr (kW > 0) {
        // Fixed width: each thread keeps its run in registers and publishes
        // its last H inputs; row 0 holds the H inputs before the tile.
#pragma unroll
        for (int i = 0; i < kHs; ++i) tails[(threadIdx.x + 1) * kHs + i] = v[kRun - kHs + i];
      } else {
        StoreShared(xs + P + threadIdx.x * kRun, v);
      }
      for (int i = threadIdx.x; i < H; i += kThreads) {
        const int64_t t = t0 - H + i;
        float hv = 0.f;
        if (t >= 0) hv = ToF(xr[t * xl.s_time]);
        else if (!masked && a.initial_states) hv = LoadState<T>(a, a.initial_states, b, d, H + t);
        if constexpr (kW > 0) tails[i] = hv; else xs[P - H + i] = hv;
      }
      float r[kRun];
      if (rr) LoadRun<T>(rr, xl.s_time, r0, a.len, vec, r);
      __syncthreads();

      float out[kRun];
      if constexpr (kW > 0) {
        if (more) LoadRun<T>(xr, xl.s_time, r0 + kTile, a.len, vec, vn);
        // xw[j + k] is the input at step r0 + j - H + k.
        float xw[kRun + kHs];
#pragma unroll
        for (int i = 0; i < kHs; ++i) xw[i] = tails[threadIdx.x * kHs + i];
#pragma unroll
        for (int j = 0; j < kRun; ++j) xw[kHs + j] = v[j];
#pragma unroll
        for (int j = 0; j < kRun; ++j) {
          float acc = bias;
#pragma unroll
          for (int k = 0; k < kW; ++k) acc += w[k] * xw[j + k];
          out[j] = acc;
        }
        if (masked) {
          float win[kRun + kHs], fix[kRun];
#pragma unroll
          for (int i = 0; i < kRun + kHs; ++i) win[i] = xw[i];
#pragma unroll
          for (int j = 0; j < kRun; ++j) fix[j] = out[j];
          MaskedFix<T, kW, kRun>(a, b, d, r0, H, win, w, bias, fix);
#pragma unroll
          for (int j = 0; j < kRun; ++j) out[j] = fix[j];
        }
      } else {
        // win[j + k] is the input at step r0 + j - H + k.
        const float* win = xs + P - H + threadIdx.x * kRun;
#pragma unroll
        for (int j = 0; j < kRun; ++j) {
          float acc = bias;
          for (int k = 0; k < W; ++k) acc += wsm[k] * win[j + k];
          out[j] = acc;
        }
        if (masked) {
          float fix[kRun];
#pragma unroll
          for (int j = 0; j < kRun; ++j) fix[j] = out[j];
          MaskedFix<T, kW, kRun>(a, b, d, r0, H, win, wsm, bias, fix);
#pragma unroll
          for (int j = 0; j < kRun; ++j) out[j] = fix[j];
        }
      }
#pragma unroll
      for (int j = 0; j < kRun; ++j) {
        out[j] = Activate(out[j], silu);
        if (rr) out[j] += r[j];
      }
      StoreRun<T>(yr, xl.s_time, r0, a.len, vec, out);
      __syncthreads();  // xs is refilled by the next tile
      if constexpr (kW > 0) {
        if (more) {
#pragma unroll
          for (int j = 0; j < kRun; ++j) v[j] = vn[j];
        }
      }
    }
  }
}

template <typename T, int kW, int kV, bool kMasked>
__global__ void __launch_bounds__(kClX * kClY, 3)
    FwdClKernel(const ConvArgs a, int64_t nchunk, bool vec) {
  constexpr int H = kW - 1;
  const ClBlock blk = LocateClBlock<kV>(a.dim, nchunk);
  const int64_t b = blk.b, chunk = blk.chunk, c0 = blk.c0;
  if (c0 >= a.dim) return;
  const int64_t D = a.dim, L = a.len;
  const int64_t ts = (chunk * kClY + threadIdx.y) * kClSteps;
  const int64_t te = Min64(L, ts + kClSteps);
  if (ts >= te) return;
  const bool silu = a.act == Activation::kSilu;
  constexpr bool masked = kMasked;  // seq_idx / varlen: steps near sequence starts
  const int64_t wbase = (b / a.batch_per_group()) * D;

  float w[kW][kV], bias[kV];
  LoadClTaps<kW, kV>(a, wbase + c0, D - c0, w, bias);
  const T* xb = static_cast<const T*>(a.x) + b * L * D;
  const T* rb = a.residual ? static_cast<const T*>(a.residual) + b * L * D : nullptr;
  T* yb = static_cast<T*>(a.y) + b * L * D;

  // win[i] holds the input at step t - H + i.
  float win[H][kV];
#pragma unroll
  for (int i = 0; i < H; ++i) {
    const int64_t t = ts - H + i;
    if (t >= 0) {
      LoadCh<T, kV>(xb, D, c0, t, vec, win[i]);
    } else {
#pragma unroll
      for (int c = 0; c < kV; ++c)
        win[i][c] = !masked && a.initial_states && c0 + c < D
                        ? LoadState<T>(a, a.initial_states, b, c0 + c, H + t) : 0.f;
    }
  }
  SegCursor cur;
  if (masked) cur.Init(a, b, ts, H);

  constexpr int U = kV >= 8 ? 2 : 4;  // steps whose loads are issued together
  for (int64_t t = ts; t < te; t += U) {
    float xv[U][kV], rv[U][kV];
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (t + u < te) LoadCh<T, kV>(xb, D, c0, t + u, vec, xv[u]);
    if (rb) {
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (t + u < te) LoadCh<T, kV>(rb, D, c0, t + u, vec, rv[u]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t tt = t + u;
      if (tt >= te) break;
      float out[kV];
#pragma unroll
      for (int c = 0; c < kV; ++c) {
        float acc = bias[c];
#pragma unroll
        for (int k = 0; k < H; ++k) acc += w[k][c] * win[k][c];
        out[c] = acc + w[H][c] * xv[u][c];
      }
      if (masked) {
        if (tt != ts) cur.Next(a, b, tt);
        const int m = cur.M(tt, H);
        if (m < H) {
#pragma unroll
          for (int c = 0; c < kV; ++c) {
            float acc = bias[c];
#pragma unroll
            for (int k = 0; k < H; ++k) {
              float xk = win[k][c];
              if (k < H - m)
                xk = cur.hrow >= 0 && c0 + c < D
                         ? LoadState<T>(a, a.initial_states, cur.hrow, c0 + c, k + m) : 0.f;
              acc += w[k][c] * xk;
            }
            out[c] = acc + w[H][c] * xv[u][c];
          }
        }
      }
#pragma unroll
      for (int c = 0; c < kV; ++c) {
        out[c] = Activate(out[c], silu);
        if (rb) out[c] += rv[u][c];
      }
      StoreCh<T, kV>(yb, D, c0, tt, vec, out);
#pragma unroll
      for (int k = 0; k + 1 < H; ++k)
#pragma unroll
        for (int c = 0; c < kV; ++c) win[k][c] = win[k + 1][c];
#pragma unroll
      for (int c = 0; c < kV; ++c) win[H - 1][c] = xv[u][c];
    }
  }
}

// final_states[r, d, j]: the last H inputs of sequence r's extended input.
template <typename T>
__global__ void FinalStatesKernel(const ConvArgs a) {
  const int64_t H = a.width - 1, D = a.dim;
  const int64_t total = a.num_states * D * H;
  const T* x = static_cast<const T*>(a.x);
  T* fin = static_cast<T*>(a.final_states);
  const Layout3 xl = a.x_layout();
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t j = i % H, d = (i / H) % D, r = i / (H * D);
    int64_t b = r, lo = 0, hi = a.len, hrow = -1;
    if (a.mode == SegmentMode::kRow) {
      hrow = a.initial_states ? r : -1;
    } else if (a.mode == SegmentMode::kVarlen) {
      const int64_t N = a.num_seqs, n = r % N;
      b = r / N;
      const int32_t* cu = a.cu_seqlens + b * (N + 1);
      lo = n == 0 ? 0 : VarlenBound(a, cu, n - 1);
      hi = Max64(VarlenBound(a, cu, n), lo);
      hrow = a.initial_states ? r : -1;
    }
    const int64_t pos = hi - H + j;
    float v = 0.f;
    if (pos >= lo) v = ToF(x[xl.At(b, d, pos)]);
    else if (hrow >= 0) v = LoadState<T>(a, a.initial_states, hrow, d, H + pos - lo);
    fin[a.state_layout().At(r, d, j)] = FromF<T>(v);
  }
}

template <typename T, int kW>
cudaError_t LaunchTile(const ConvArgs& a, cudaStream_t stream) {
  constexpr int kTile = Tiling<T>::kTile;
  const int W = int(a.width), H = W - 1;
  const int64_t ntile = CeilDiv(a.len, kTile);
  const int64_t rows = a.batch * a.dim;
  // About 8k blocks (several tiles each, the next one prefetched): enough to
  // fill the chip many times over.
  const int64_t tpb = std::clamp<int64_t>(rows * ntile / 8192, 1, ntile);
  const int64_t nblocks = rows * CeilDiv(ntile, tpb);
  const bool vec = !a.channels_last && (a.len * sizeof(T)) % 16 == 0 && Aligned(a.x, 16) &&
                   Aligned(a.y, 16) && (!a.residual || Aligned(a.residual, 16));
  // (+4: the compiler may read a few words past the weights with wide loads)
  const size_t smem = kW > 0 ? 0 : sizeof(float) * (BodyOffset(H) + kTile + W + 4);
  const unsigned grid = unsigned(std::min<int64_t>(nblocks, INT_MAX));
  if (a.mode == SegmentMode::kRow)
    FwdTileKernel<T, kW, false><<<grid, kThreads, smem, stream>>>(a, ntile, tpb, nblocks, vec);
  else
    FwdTileKernel<T, kW, true><<<grid, kThreads, smem, stream>>>(a, ntile, tpb, nblocks, vec);
  return cudaGetLastError();
}

template <typename T, int kW>
cudaError_t LaunchCl(const ConvArgs& a, cudaStream_t stream) {
  constexpr int kV = 16 / sizeof(T) > 8 ? 8 : 16 / sizeof(T);
  const int64_t nchunk = CeilDiv(a.len, int64_t(kClSteps) * kClY);
  const int64_t blocks = ClBlocks(a.batch, nchunk, a.dim, kV);
  if (blocks > INT_MAX) return LaunchTile<T, kW>(a, stream);
  const int bytes = kV * int(sizeof(T));
  const bool vec = a.dim % kV == 0 && Aligned(a.x, bytes) && Aligned(a.y, bytes) &&
                   (!a.residual || Aligned(a.residual, bytes));
  const dim3 grid{unsigned(blocks)}, block{kClX, kClY};
  if (a.mode == SegmentMode::kRow)
    FwdClKernel<T, kW, kV, false><<<grid, block, 0, stream>>>(a, nchunk, vec);
  else
    FwdClKernel<T, kW, kV, true><<<grid, block, 0, stream>>>(a, nchunk, vec);
  return cudaGetLastError();
}

template <typename T>
cudaError_t ForwardT(const ConvArgs& a, cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  const bool nonempty = a.batch > 0 && a.dim > 0 && a.len > 0;
  if (nonempty && (TryForwardStreaming(a, stream, &err) || TryForwardClRow(a, stream, &err))) {
    if (err != cudaSuccess) return err;
  } else if (a.batch > 0 && a.dim > 0 && a.len > 0) {
    if (a.channels_last) {
      switch (a.width) {
        case 2: err = LaunchCl<T, 2>(a, stream); break;
        case 3: err = LaunchCl<T, 3>(a, stream); break;
        case 4: err = LaunchCl<T, 4>(a, stream); break;
        default: err = LaunchTile<T, 0>(a, stream); break;
      }
    } else {
      switch (a.width) {
        case 2: err = LaunchTile<T, 2>(a, stream); break;
        case 3: err = LaunchTile<T, 3>(a, stream); break;
        case 4: err = LaunchTile<T, 4>(a, stream); break;
        default: err = LaunchTile<T, 0>(a, stream); break;
      }
    }
    if (err != cudaSuccess) return err;
  }
  const int64_t nfin = a.num_states * a.dim * (a.width - 1);
  if (a.final_states && nfin > 0) {
    const int64_t blocks = std::min<int64_t>(CeilDiv(nfin, 256), 65536);
    FinalStatesKernel<T><<<unsigned(blocks), 256, 0, stream>>>(a);
    err = cudaGetLastError();
  }
  return err;
}

}  // namespace

cudaError_t Forward(const ConvArgs& a, cudaStream_t stream) {
  switch (a.x_dtype) {
    case DType::kF32: return ForwardT<float>(a, stream);
    case DType::kF16: return ForwardT<__half>(a, stream);
    case DType::kBF16: return ForwardT<__nv_bfloat16>(a, stream);
    default: return cudaErrorNotSupported;
  }
}

}  // namespace jcc::cuda
