// Backward kernels. With g[t] = dy[t] * act'(pre[t]):
//   dx[p]      = sum_k w[k] g[p + H - k]   (same sequence only) + dfinal_states tail
//   dweight[k] = sum_t g[t] xp[t - H + k],  dbias = sum_t g[t]
//   dinitial_states: the taps of the first H steps that read the history.
// dweight/dbias are deterministic: every block writes the partial sums of its
// slice of time to a workspace, and ReduceKernel adds them in a fixed order.
// No floating-point atomics anywhere.
#include <algorithm>
#include <climits>

#include "common.cuh"
#include "launchers.h"

namespace jcc::cuda {
namespace {


__host__ __device__ inline int BodyOffset(int H) { return (H + 3) & ~3; }

// Shared memory of the tiled kernel, in 4-byte words.
struct TileSmem {
  int P, xs, gs, ms, hs, dys, wsm, red, total;
  __host__ __device__ TileSmem(int W, bool runtime_width, int kTile) {
    const int H = W - 1;
    P = BodyOffset(H);
    // Fixed width keeps x and g in registers: only m and the dy halo here.
    const int body = runtime_width ? kTile + H : 0;
    xs = 0;                        // [P + kTile + H]: x at t0 - P ..
    gs = xs + (runtime_width ? P + kTile + H : 0);  // [kTile + H]: g at t0 ..
    ms = gs + body;                // [kTile + H]: m at t0 .. (int)
    hs = ms + kTile + H;           // [kTile + H]: history row at t0 .. (int)
    dys = hs + body;               // [H]: dy at the H steps after the tile
    wsm = dys + H;                 // [W] weights (run-time width)
    red = wsm + (runtime_width ? W : 0);  // [warps][W + 1] reduction (fixed width)
    // (+4: the compiler may read a few words past the weights with wide loads)
    total = red + (runtime_width ? 0 : (kThreads / 32) * (W + 1)) + 4;
  }
};

// g at step t of row (b, d), from a window where win[k] is the input at
// t - H + k, masked by the sequence the step belongs to.
template <typename T, int kW>
__device__ __forceinline__ float TapValue(const ConvArgs& a, const float* win, int k, int m,
                                          int64_t hrow, int64_t d, int H) {
  if (k >= H - m) return win[k];
  return hrow >= 0 ? LoadState<T>(a, a.initial_states, hrow, d, k + m) : 0.f;
}

template <typename T, int kW, bool kMasked>
__global__ void __launch_bounds__(kThreads, 4)
    BwdTileKernel(const ConvArgs a, int64_t ntile, int64_t tiles_per_block, int64_t nblocks,
                  float* ws, bool vec) {
  extern __shared__ float smem[];
  constexpr int kRun = Tiling<T>::kRun, kTile = Tiling<T>::kTile;
  const int W = kW > 0 ? kW : int(a.width);
  const int H = W - 1;
  const TileSmem L(W, kW == 0, kTile);
  float* xs = smem + L.xs;
  float* gs = smem + L.gs;
  int* ms = reinterpret_cast<int*>(smem + L.ms);
  int* hs = reinterpret_cast<int*>(smem + L.hs);
  float* wsm = smem + L.wsm;
  float* dys = smem + L.dys;
  const int P = L.P;
  constexpr int kHs = kW > 1 ? kW - 1 : 1;
  __shared__ float tails[kW > 0 ? (kThreads + 1) * kHs : 1];  // fixed width: x run tails
  __shared__ float heads[kW > 0 ? (kThreads + 1) * kHs : 1];  // fixed width: g run heads
  __shared__ float rhal[kHs];                                 // fixed width: x after the tile
  const T* x = static_cast<const T*>(a.x);
  const T* dy = static_cast<const T*>(a.dy);
  const T* dfin = static_cast<const T*>(a.dfinal_states);
  T* dx = static_cast<T*>(a.dx);
  const Layout3 xl = a.x_layout();
  const bool silu = a.act == Activation::kSilu;
  constexpr bool masked = kMasked;  // seq_idx / varlen: steps near sequence starts
  const int64_t nchunk = CeilDiv(ntile, tiles_per_block);
  const int64_t bpg = a.batch_per_group();
  const int64_t nparts = bpg * nchunk;

  for (int64_t blk = blockIdx.x; blk < nblocks; blk += gridDim.x) {
    const int64_t chunk = blk % nchunk, row = blk / nchunk;
    const int64_t b = row / a.dim, d = row % a.dim;
    const int64_t grp = b / bpg;
    const int64_t wrow = grp * a.dim + d;
    const int64_t xoff = xl.At(b, d, 0);
    const T* xr = x + xoff;
    const T* dyr = dy + xoff;
    T* dxr = dx + xoff;

    float w[kW > 0 ? kW : 1];
    if constexpr (kW > 0) {
#pragma unroll
      for (int k = 0; k < kW; ++k) w[k] = LoadAnyF(a.weight, a.w_dtype, wrow * W + k);
    } else {
      for (int k = threadIdx.x; k < W; k += kThreads) wsm[k] = LoadAnyF(a.weight, a.w_dtype, wrow * W + k);
    }
    const float bias = a.bias ? LoadAnyF(a.bias, a.b_dtype, wrow) : 0.f;
    // Partial sums: fixed width, per thread (taps then bias); run-time width,
    // thread i owns taps i, i + kThreads, i + 2 kThreads (index W is the bias).
    float dwp[kW > 0 ? kW + 1 : 3] = {};

    const int64_t tile_end = Min64(ntile, (chunk + 1) * tiles_per_block);
    for (int64_t tile = chunk * tiles_per_block; tile < tile_end; ++tile) {
      const int64_t t0 = tile * kTile;
      const int64_t r0 = t0 + threadIdx.x * kRun;
      float v[kRun], dyv[kRun];
      LoadRun<T>(xr, xl.s_time, r0, a.len, vec, v);
      LoadRun<T>(dyr, xl.s_time, r0, a.len, vec, dyv);
      if constexpr (kW > 0) {
        // Fixed width: runs stay in registers; shared memory carries each
        // thread's last H inputs (row 0: the H inputs before the tile).
#pragma unroll
        for (int i = 0; i < kHs; ++i) tails[(threadIdx.x + 1) * kHs + i] = v[kRun - kHs + i];
      } else {
        StoreShared(xs + P + threadIdx.x * kRun, v);
      }
      for (int i = threadIdx.x; i < 2 * H; i += kThreads) {
        // i < H: left halo; i >= H: right halo after the tile (x and dy).
        const int64_t t = i < H ? t0 - H + i : t0 + kTile + (i - H);
        float hv = 0.f, hd = 0.f;
        if (t >= 0 && t < a.len) {
          hv = ToF(xr[t * xl.s_time]);
          if (i >= H) hd = ToF(dyr[t * xl.s_time]);
        } else if (t < 0 && !masked && a.initial_states) {
          hv = LoadState<T>(a, a.initial_states, b, d, H + t);
        }
        if constexpr (kW > 0) {
          if (i < H) tails[i] = hv; else rhal[i - H] = hv;
        } else {
          xs[i < H ? P - H + i : P + kTile + (i - H)] = hv;
        }
        if (i >= H) dys[i - H] = hd;
      }
      __syncthreads();

      if constexpr (kW > 0) {
        constexpr int kH = kW - 1;
        // Phase A: g at this thread's steps, from the register window.
        float xw[kRun + kH], gr[kRun], dfv[kRun];
#pragma unroll
        for (int i = 0; i < kH; ++i) xw[i] = tails[threadIdx.x * kH + i];
#pragma unroll
        for (int j = 0; j < kRun; ++j) xw[kH + j] = v[j];
        SegCursor cur;
        if (masked) cur.Init(a, b, r0, H);
#pragma unroll
        for (int j = 0; j < kRun; ++j) {
          const int64_t t = r0 + j;
          if (masked && j) cur.Next(a, b, t);
          const int m = masked ? cur.M(t, H) : H;
          float g = 0.f;
          dfv[j] = 0.f;
          if (t < a.len) {
            float tv[kW];
#pragma unroll
            for (int k = 0; k < kW; ++k) {
              tv[k] = xw[j + k];
              if (masked && k < H - m)
                tv[k] = cur.hrow >= 0 ? LoadState<T>(a, a.initial_states, cur.hrow, d, k + m) : 0.f;
            }
            float pre = bias;
#pragma unroll
            for (int k = 0; k < kW; ++k) pre += w[k] * tv[k];
            g = ActGrad(pre, dyv[j], silu);
#pragma unroll
            for (int k = 0; k < kW; ++k) dwp[k] += g * tv[k];
            dwp[kW] += g;
          }
          gr[j] = g;
          if (masked) ms[threadIdx.x * kRun + j] = m;
        }
        if (dfin) {  // the final-states cotangent on each sequence's last H inputs
          SegCursor fc;
          if (a.mode == SegmentMode::kVarlen) fc.Init(a, b, r0, H);
#pragma unroll
          for (int j = 0; j < kRun; ++j) {
            const int64_t t = r0 + j;
            int64_t frow = b, fs = a.len - H;
            if (a.mode == SegmentMode::kVarlen) {
              if (j) fc.Next(a, b, t);
              frow = fc.frow, fs = fc.hi - H;
            }
            if (t < a.len && frow >= 0 && t >= fs) dfv[j] = LoadState<T>(a, dfin, frow, d, t - fs);
          }
        }
        // Heads: row r = thread r's first H g values; row kThreads = the H
        // steps after the tile, computed here by threads 0 .. H-1.
#pragma unroll
        for (int i = 0; i < kH; ++i) heads[threadIdx.x * kH + i] = gr[i];
        if (threadIdx.x < kH) {
          const int i = threadIdx.x;
          const int64_t t = t0 + kTile + i;
          float g = 0.f;
          int m = H;
          if (t < a.len) {
            SegCursor hc;
            hc.hrow = -1;
            if (masked) {
              hc.Init(a, b, t, H);
              m = hc.M(t, H);
            }
            float pre = bias;
#pragma unroll
            for (int k = 0; k < kW; ++k) {
              const int q = i + k;  // in [last H inputs of the tile | right halo]
              float xv = q < kH ? tails[kThreads * kH + q] : rhal[q - kH];
              if (masked && k < H - m)
                xv = hc.hrow >= 0 ? LoadState<T>(a, a.initial_states, hc.hrow, d, k + m) : 0.f;
              pre += w[k] * xv;
            }
            g = ActGrad(pre, dys[i], silu);
          }
          heads[kThreads * kH + i] = g;
          if (masked) ms[kTile + i] = m;
        }
        __syncthreads();

        // Phase B: dx at this thread's steps. Input p feeds step t = p + H - k
        // when t's sequence reaches back to p: m(t) >= H - k.
        float gw[kRun + kH], out[kRun];
#pragma unroll
        for (int j = 0; j < kRun; ++j) gw[j] = gr[j];
#pragma unroll
        for (int i = 0; i < kH; ++i) gw[kRun + i] = heads[(threadIdx.x + 1) * kH + i];
        const int base = threadIdx.x * kRun;
#pragma unroll
        for (int j = 0; j < kRun; ++j) {
          float acc = 0.f;
#pragma unroll
          for (int k = 0; k < kW; ++k) {
            const int i = j + kH - k;
            float g = gw[i];
            if (masked && ms[base + i] < H - k) g = 0.f;
            acc += w[k] * g;
          }
          out[j] = acc + dfv[j];
        }
        StoreRun<T>(dxr, xl.s_time, r0, a.len, vec, out);
      } else {
      // Phase A: g at this thread's steps, and at the H steps after the tile.
      float dfv[kRun];
      {
        SegCursor cur;
        if (masked) cur.Init(a, b, r0, H);
        const float* win = xs + P - H + threadIdx.x * kRun;
#pragma unroll
        for (int j = 0; j < kRun; ++j) {
          const int64_t t = r0 + j;
          if (masked && j) cur.Next(a, b, t);
          const int m = masked ? cur.M(t, H) : H;
          float g = 0.f;
          dfv[j] = 0.f;
          if (t < a.len) {
            float pre = bias;
            if constexpr (kW > 0) {
              float tv[kW];
#pragma unroll
              for (int k = 0; k < kW; ++k) tv[k] = TapValue<T, kW>(a, win + j, k, m, cur.hrow, d, H);
#pragma unroll
              for (int k = 0; k < kW; ++k) pre += w[k] * tv[k];
              g = ActGrad(pre, dyv[j], silu);
#pragma unroll
              for (int k = 0; k < kW; ++k) dwp[k] += g * tv[k];
              dwp[kW] += g;
            } else {
              for (int k = 0; k < W; ++k) pre += wsm[k] * TapValue<T, kW>(a, win + j, k, m, cur.hrow, d, H);
              g = ActGrad(pre, dyv[j], silu);
            }
            if (dfin) {
              int64_t frow = b, fs = a.len - H;
              if (a.mode == SegmentMode::kVarlen) frow = cur.frow, fs = cur.hi - H;
              if (frow >= 0 && t >= fs) dfv[j] = LoadState<T>(a, dfin, frow, d, t - fs);
            }
          }
          const int i = threadIdx.x * kRun + j;
          gs[i] = g;
          if (masked) ms[i] = m, hs[i] = int(cur.hrow);
        }
      }
      for (int i = threadIdx.x; i < H; i += kThreads) {
        const int64_t t = t0 + kTile + i;
        float g = 0.f;
        int m = H;
        SegCursor cur;
        cur.hrow = -1;
        if (t < a.len) {
          if (masked) {
            cur.Init(a, b, t, H);
            m = cur.M(t, H);
          }
          const float* win = xs + P + kTile + i - H;
          float pre = bias;
          for (int k = 0; k < W; ++k)
            pre += (kW > 0 ? w[k < kW ? k : 0] : wsm[k]) * TapValue<T, kW>(a, win, k, m, cur.hrow, d, H);
          g = ActGrad(pre, dys[i], silu);
        }
        gs[kTile + i] = g;
        if (masked) ms[kTile + i] = m, hs[kTile + i] = int(cur.hrow);
      }
      __syncthreads();

      if constexpr (kW == 0) {
        // dweight/dbias: thread per tap over the tile's steps, in order.
        const int n = int(Min64(kTile, a.len - t0));
#pragma unroll
        for (int q = 0; q < 3; ++q) {
          const int k = threadIdx.x + q * kThreads;
          if (k > W) break;
          float acc = 0.f;
          for (int i = 0; i < n; ++i) {
            const float g = gs[i];
            if (k == W) {
              acc += g;
            } else {
              const int m = masked ? ms[i] : H;
              acc += g * TapValue<T, kW>(a, xs + P - H + i, k, m, masked ? hs[i] : -1, d, H);
            }
          }
          dwp[q] += acc;
        }
      }

      // Phase B: dx at this thread's steps. Input p feeds step t = p + H - k
      // when t's sequence reaches back to p: m(t) >= H - k.
      {
        float out[kRun];
        const int base = threadIdx.x * kRun;
        if constexpr (kW > 0) {
          float gw[kRun + kW - 1];
#pragma unroll
          for (int i = 0; i < kRun + kW - 1; ++i) {
            gw[i] = gs[base + i];
            if (masked) {
              // Zeroed per tap below; keep the raw value here.
            }
          }
#pragma unroll
          for (int j = 0; j < kRun; ++j) {
            float acc = 0.f;
#pragma unroll
            for (int k = 0; k < kW; ++k) {
              const int i = j + kW - 1 - k;
              float g = gw[i];
              if (masked && ms[base + i] < H - k) g = 0.f;
              acc += w[k] * g;
            }
            out[j] = acc + dfv[j];
          }
        } else {
#pragma unroll
          for (int j = 0; j < kRun; ++j) {
            float acc = 0.f;
            for (int k = 0; k < W; ++k) {
              const int i = base + j + H - k;
              float g = gs[i];
              if (masked && ms[i] < H - k) g = 0.f;
              acc += wsm[k] * g;
            }
            out[j] = acc + dfv[j];
          }
        }
        StoreRun<T>(dxr, xl.s_time, r0, a.len, vec, out);
      }
      }
      __syncthreads();  // shared memory is refilled by the next tile
    }

    // This block's partial sums, reduced in a fixed order.
    const int64_t part = (b % bpg) * nchunk + chunk;
    float* wsrow = ws + ((grp * nparts + part) * a.dim + d) * (W + 1);
    if constexpr (kW > 0) {
      float* red = smem + L.red;
      const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
      for (int k = 0; k <= kW; ++k) {
        float s = dwp[k];
#pragma unroll
        for (int off = 16; off > 0; off /= 2) s += __shfl_down_sync(0xffffffffu, s, off);
        if (lane == 0) red[warp * (kW + 1) + k] = s;
      }
      __syncthreads();
      if (threadIdx.x <= kW) {
        float s = 0.f;
        for (int i = 0; i < kThreads / 32; ++i) s += red[i * (kW + 1) + threadIdx.x];
        wsrow[threadIdx.x] = s;
      }
      __syncthreads();
    } else {
#pragma unroll
      for (int q = 0; q < 3; ++q) {
        const int k = threadIdx.x + q * kThreads;
        if (k <= W) wsrow[k] = dwp[q];
      }
    }
  }
}

// Channels-last, W <= 4: thread = kClV channels x a slice of kClBwdSteps steps,
// walking forwards. g is computed at step t and dx is emitted H steps later,
// once every g it needs is known.
template <typename T, int kW, bool kMasked>
__global__ void __launch_bounds__(kClX * kClY, 3)
    BwdClKernel(const ConvArgs a, int64_t nchunk, float* ws, bool vec) {
  constexpr int H = kW - 1, kV = kClV;
  __shared__ float red[kClY][kClX][kV * (kW + 1)];
  const int64_t D = a.dim, L = a.len;
  const ClBlock blk = LocateClBlock<kV>(D, nchunk);
  const int64_t b = blk.b, chunk = blk.chunk, c0 = blk.c0;
  const int64_t ts = (chunk * kClY + threadIdx.y) * kClBwdSteps;
  const int64_t te = Min64(L, ts + kClBwdSteps);
  const bool active = c0 < D && ts < te;
  const bool silu = a.act == Activation::kSilu;
  constexpr bool masked = kMasked;  // seq_idx / varlen: steps near sequence starts
  const int64_t bpg = a.batch_per_group(), grp = b / bpg;
  const int64_t wbase = grp * D;
  const T* dfin = static_cast<const T*>(a.dfinal_states);

  float dw[kW + 1][kV] = {};
  if (active) {
    float w[kW][kV], bias[kV];
    LoadClTaps<kW, kV>(a, wbase + c0, D - c0, w, bias);
    const T* xb = static_cast<const T*>(a.x) + b * L * D;
    const T* dyb = static_cast<const T*>(a.dy) + b * L * D;
    T* dxb = static_cast<T*>(a.dx) + b * L * D;

    float xw[H][kV], gw[H][kV];  // input and g at steps t - H .. t - 1
    int mw[H];                   // m at steps t - H .. t - 1
#pragma unroll
    for (int i = 0; i < H; ++i) {
      const int64_t t = ts - H + i;
      mw[i] = H;
#pragma unroll
      for (int c = 0; c < kV; ++c) gw[i][c] = 0.f;
      if (t >= 0) {
        LoadCh<T, kV>(xb, D, c0, t, vec, xw[i]);
      } else {
#pragma unroll
        for (int c = 0; c < kV; ++c)
          xw[i][c] = !masked && a.initial_states && c0 + c < D
                         ? LoadState<T>(a, a.initial_states, b, c0 + c, H + t) : 0.f;
      }
    }
    SegCursor cur, lag;  // at step t, and at the step p = t - H whose dx is emitted
    if (masked) cur.Init(a, b, ts, H);
    if (dfin && a.mode == SegmentMode::kVarlen) lag.Init(a, b, ts, H);
    const int64_t tend = te + H;       // g is needed up to te + H - 1
    const int64_t tload = Min64(tend, L);
    constexpr int U = 2;  // steps whose loads are issued together
    for (int64_t t = ts; t < tend; t += U) {
      ChRaw<T, kV> xv[U], dv[U];
#pragma unroll
      for (int u = 0; u < U; ++u)
        if (t + u < tload) {
          xv[u] = LoadChRaw<T, kV>(xb, D, c0, t + u, vec);
          dv[u] = LoadChRaw<T, kV>(dyb, D, c0, t + u, vec);
        }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t tt = t + u;
        if (tt >= tend) break;
        float g[kV];
        int m = H;
        if (tt < tload) {
          if (masked) {
            if (tt != ts) cur.Next(a, b, tt);
            m = cur.M(tt, H);
          }
#pragma unroll
          for (int c = 0; c < kV; ++c) {
            float tv[kW];
#pragma unroll
            for (int k = 0; k < H; ++k) tv[k] = xw[k][c];
            tv[H] = xv[u][c];
            if (m < H) {
#pragma unroll
              for (int k = 0; k < H; ++k)
                if (k < H - m)
                  tv[k] = cur.hrow >= 0 && c0 + c < D
                              ? LoadState<T>(a, a.initial_states, cur.hrow, c0 + c, k + m) : 0.f;
            }
            float pre = bias[c];
#pragma unroll
            for (int k = 0; k < kW; ++k) pre += w[k][c] * tv[k];
            g[c] = ActGrad(pre, dv[u][c], silu);
            if (tt < te) {
#pragma unroll
              for (int k = 0; k < kW; ++k) dw[k][c] += g[c] * tv[k];
              dw[kW][c] += g[c];
            }
          }
        } else {
#pragma unroll
          for (int c = 0; c < kV; ++c) g[c] = 0.f;
        }
        // dx at p = tt - H: taps k read g at p + H - k = tt - k.
        const int64_t p = tt - H;
        if (p >= ts) {
          float out[kV];
#pragma unroll
          for (int c = 0; c < kV; ++c) {
            float acc = 0.f;
#pragma unroll
            for (int k = 0; k < kW; ++k) {
              float gv = k == 0 ? g[c] : gw[H - k][c];
              const int mk = k == 0 ? m : mw[H - k];
              if (masked && mk < H - k) gv = 0.f;
              acc += w[k][c] * gv;
            }
            out[c] = acc;
          }
          if (dfin) {
            int64_t frow = b, fs = L - H;
            if (a.mode == SegmentMode::kVarlen) {
              if (p != ts) lag.Next(a, b, p);
              frow = lag.frow, fs = lag.hi - H;
            }
            if (frow >= 0 && p >= fs) {
#pragma unroll
              for (int c = 0; c < kV; ++c)
                if (c0 + c < D) out[c] += LoadState<T>(a, dfin, frow, c0 + c, p - fs);
            }
          }
          StoreCh<T, kV>(dxb, D, c0, p, vec, out);
        }
        // Slide the windows.
#pragma unroll
        for (int k = 0; k + 1 < H; ++k) {
          mw[k] = mw[k + 1];
#pragma unroll
          for (int c = 0; c < kV; ++c) xw[k][c] = xw[k + 1][c], gw[k][c] = gw[k + 1][c];
        }
        mw[H - 1] = m;
#pragma unroll
        for (int c = 0; c < kV; ++c) {
          xw[H - 1][c] = tt < tload ? xv[u][c] : 0.f;
          gw[H - 1][c] = g[c];
        }
      }
    }
  }
  WriteClPartials<kW, kV>(a, red, dw, b, c0, nchunk, chunk, ws);
}

// dweight[g, d, k] (k < W) and dbias[g, d] (k == W) from the workspace
// ws[g][part][d][W + 1], summed over parts in a fixed order.
__global__ void ReduceKernel(const ConvArgs a, const float* ws, int64_t nparts) {
  constexpr int kLanes = 8;
  __shared__ float part[kLanes][32];
  const int64_t W1 = a.width + 1, cols_per_group = a.dim * W1;
  const int64_t col = int64_t(blockIdx.x) * 32 + threadIdx.x;
  const bool ok = col < a.groups * cols_per_group;
  const int64_t grp = ok ? col / cols_per_group : 0, rem = col % cols_per_group;
  float s = 0.f;
  if (ok)
    for (int64_t p = threadIdx.y; p < nparts; p += kLanes)
      s += ws[(grp * nparts + p) * cols_per_group + rem];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && ok) {
    float t = 0.f;
    for (int i = 0; i < kLanes; ++i) t += part[i][threadIdx.x];
    const int64_t d = rem / W1, k = rem % W1;
    if (k < a.width) StoreAnyF(a.dweight, a.w_dtype, (grp * a.dim + d) * a.width + k, t);
    else if (a.dbias) StoreAnyF(a.dbias, a.b_dtype, grp * a.dim + d, t);
  }
}

// dinitial_states[r, d, q] = sum_{k <= q} w[k] g[lo + q - k] + dfinal_states
// where the history slot is also part of the final states. Thread per (r, d).
template <typename T>
__global__ void DInitKernel(const ConvArgs a) {
  const int64_t W = a.width, H = W - 1, D = a.dim;
  const int64_t total = a.num_states * D;
  const T* x = static_cast<const T*>(a.x);
  const T* dy = static_cast<const T*>(a.dy);
  T* dinit = static_cast<T*>(a.dinitial_states);
  const Layout3 xl = a.x_layout();
  const bool silu = a.act == Activation::kSilu;
  float g[kMaxWidth];
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % D, r = i / D;
    int64_t b = r, lo = 0, hi = a.len;
    if (a.mode == SegmentMode::kVarlen) {
      const int64_t N = a.num_seqs, n = r % N;
      b = r / N;
      const int32_t* cu = a.cu_seqlens + b * (N + 1);
      lo = n == 0 ? 0 : VarlenBound(a, cu, n - 1);
      hi = Max64(VarlenBound(a, cu, n), lo);
    }
    const int64_t wrow = (b / a.batch_per_group()) * D + d;
    const float bias = a.bias ? LoadAnyF(a.bias, a.b_dtype, wrow) : 0.f;
    const int64_t seglen = hi - lo;
    for (int64_t q = 0; q < H; ++q) {
      g[q] = 0.f;
      const int64_t t = lo + q;
      if (q >= seglen) continue;
      float pre = bias;
      for (int64_t k = 0; k < W; ++k) {
        const int64_t p = t - H + k;
        const float xv = p >= lo ? ToF(x[xl.At(b, d, p)]) : LoadState<T>(a, a.initial_states, r, d, H + p - lo);
        pre += LoadAnyF(a.weight, a.w_dtype, wrow * W + k) * xv;
      }
      g[q] = ActGrad(pre, ToF(dy[xl.At(b, d, t)]), silu);
    }
    for (int64_t q = 0; q < H; ++q) {
      float acc = 0.f;
      for (int64_t k = 0; k <= q; ++k) acc += LoadAnyF(a.weight, a.w_dtype, wrow * W + k) * g[q - k];
      const int64_t f = q - seglen;
      if (a.dfinal_states && f >= 0) acc += LoadState<T>(a, a.dfinal_states, r, d, f);
      dinit[a.state_layout().At(r, d, q)] = FromF<T>(acc);
    }
  }
}

struct Plan {
  bool stream = false;   // backward_stream.cu's kernel
  bool cl = false;       // channels-last kernel
  int64_t ntile = 0, tpb = 1, nblocks = 0, nchunk = 0, nparts = 0;
};

Plan MakePlan(const ConvArgs& a, bool allow_stream = true) {
  Plan p;
  if (a.batch == 0 || a.dim == 0 || a.len == 0) return p;
  if (const int64_t tiles = allow_stream ? StreamingBackwardTiles(a) : 0) {
    p.stream = true;
    p.nchunk = tiles;
    p.nparts = a.batch_per_group() * p.nchunk;
    return p;
  }
  p.cl = a.channels_last && a.width >= 2 && a.width <= 4;
  if (p.cl) {
    p.nchunk = CeilDiv(a.len, int64_t(kClBwdSteps) * kClY);
    if (ClBlocks(a.batch, p.nchunk, a.dim, kClV) > INT_MAX) p.cl = false;
  }
  if (!p.cl) {
    const int64_t kTile = int64_t(kThreads) * (32 / DTypeBytes(a.x_dtype));
    p.ntile = CeilDiv(a.len, kTile);
    const int64_t rows = a.batch * a.dim;
    p.tpb = std::clamp<int64_t>(rows * p.ntile / 16384, 1, p.ntile);
    p.nchunk = CeilDiv(p.ntile, p.tpb);
    p.nblocks = rows * p.nchunk;
  }
  p.nparts = a.batch_per_group() * p.nchunk;
  return p;
}

template <typename T, int kW>
cudaError_t LaunchTile(const ConvArgs& a, const Plan& p, float* ws, cudaStream_t stream) {
  const int W = int(a.width);
  const TileSmem L(W, kW == 0, Tiling<T>::kTile);
  const size_t smem = sizeof(float) * L.total;
  const bool masked = a.mode != SegmentMode::kRow;
  auto* kernel = masked ? BwdTileKernel<T, kW, true> : BwdTileKernel<T, kW, false>;
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  const bool vec = !a.channels_last && (a.len * sizeof(T)) % 16 == 0 && Aligned(a.x, 16) &&
                   Aligned(a.dy, 16) && Aligned(a.dx, 16);
  const unsigned grid = unsigned(std::min<int64_t>(p.nblocks, INT_MAX));
  kernel<<<grid, kThreads, smem, stream>>>(a, p.ntile, p.tpb, p.nblocks, ws, vec);
  return cudaGetLastError();
}

template <typename T, int kW>
cudaError_t LaunchCl(const ConvArgs& a, const Plan& p, float* ws, cudaStream_t stream) {
  const int bytes = kClV * int(sizeof(T));
  const bool vec = a.dim % kClV == 0 && Aligned(a.x, bytes) && Aligned(a.dy, bytes) &&
                   Aligned(a.dx, bytes);
  if (vec && a.mode == SegmentMode::kRow) return BackwardClRow(a, p.nchunk, ws, stream);
  const dim3 grid(unsigned(ClBlocks(a.batch, p.nchunk, a.dim, kClV)));
  if (a.mode == SegmentMode::kRow)
    BwdClKernel<T, kW, false><<<grid, dim3(kClX, kClY), 0, stream>>>(a, p.nchunk, ws, vec);
  else
    BwdClKernel<T, kW, true><<<grid, dim3(kClX, kClY), 0, stream>>>(a, p.nchunk, ws, vec);
  return cudaGetLastError();
}

template <typename T>
cudaError_t BackwardT(const ConvArgs& a, float* ws, cudaStream_t stream) {
  const Plan p = MakePlan(a);
  // Every plan's partial sums fit BackwardWorkspaceBytes (csrc/problem.h).
  if (a.groups * p.nparts * a.dim * (a.width + 1) * 4 >
      BackwardWorkspaceBytes(a.batch, a.dim, a.len, a.width))
    return cudaErrorInvalidValue;
  cudaError_t err = cudaSuccess;
  if (p.nparts > 0) {
    if (p.stream) {
      err = BackwardStreaming(a, ws, stream);
    } else if (p.cl) {
      switch (a.width) {
        case 2: err = LaunchCl<T, 2>(a, p, ws, stream); break;
        case 3: err = LaunchCl<T, 3>(a, p, ws, stream); break;
        default: err = LaunchCl<T, 4>(a, p, ws, stream); break;
      }
    } else {
      switch (a.width) {
        case 2: err = LaunchTile<T, 2>(a, p, ws, stream); break;
        case 3: err = LaunchTile<T, 3>(a, p, ws, stream); break;
        case 4: err = LaunchTile<T, 4>(a, p, ws, stream); break;
        default: err = LaunchTile<T, 0>(a, p, ws, stream); break;
      }
    }
    if (err != cudaSuccess) return err;
  }
  const int64_t cols = a.groups * a.dim * (a.width + 1);
  if (cols > 0) {
    ReduceKernel<<<unsigned(CeilDiv(cols, 32)), dim3(32, 8), 0, stream>>>(a, ws, p.nparts);
    if ((err = cudaGetLastError()) != cudaSuccess) return err;
  }
  const int64_t nstate = a.num_states * a.dim;
  if (a.dinitial_states && a.width > 1 && nstate > 0) {
    DInitKernel<T><<<unsigned(std::min<int64_t>(CeilDiv(nstate, 128), 65536)), 128, 0, stream>>>(a);
    err = cudaGetLastError();
  }
  return err;
}

}  // namespace

cudaError_t Backward(const ConvArgs& a, void* workspace, cudaStream_t stream) {
  float* ws = static_cast<float*>(workspace);
  switch (a.x_dtype) {
    case DType::kF32: return BackwardT<float>(a, ws, stream);
    case DType::kF16: return BackwardT<__half>(a, ws, stream);
    case DType::kBF16: return BackwardT<__nv_bfloat16>(a, ws, stream);
    default: return cudaErrorNotSupported;
  }
}

}  // namespace jcc::cuda
