// Channels-last backward for the hot case: one sequence per row (no seq_idx /
// varlen), W <= 4. It keeps only what the plain case needs and stages x and
// dy through shared memory with cp.async, a group of steps ahead (double
// buffered), so many bytes are in flight without holding registers. It
// needs whole, aligned channel vectors (dim % kClV == 0). A block of kClX x
// kClY threads, kClV channels x kClBwdSteps steps per thread; states.cu's
// ReduceKernel adds the partial sums and StatesGradKernel the state terms.
//   g[t] = dy[t] act'(pre[t]),  dx[p] = sum_k w[k] g[p + H - k],
// walking forwards and emitting dx H steps behind the g it computes.
#include "cl_row.cuh"
#include "cp_async.cuh"
#include "launchers.h"

namespace jcc::cuda {
namespace {

// Steps per staged group: 8 x 2 tensors x 8 or 16 bytes per thread, two groups
// in flight (double buffer), 32 KiB of shared memory per block either way.
template <typename T>
struct ClRowStage {
  static constexpr int kU = sizeof(T) >= 4 ? 4 : 8;
};

template <typename T, int kW>
__global__ void __launch_bounds__(kClX * kClY)
    BwdClRowKernel(const ConvArgs a, int64_t nchunk, float* ws) {
  constexpr int H = kW - 1, kHist = H > 0 ? H : 1, kV = kClV, U = ClRowStage<T>::kU;
  constexpr int kThreadsPerBlock = kClX * kClY;
  using Raw = ChRaw<T, kV>;
  // stage[buffer][tensor: x, dy][step][thread]
  __shared__ Raw stage[2][2][U][kThreadsPerBlock];
  __shared__ float red[kClY][kClX][kV * (kW + 1)];
  const int tid = threadIdx.y * kClX + threadIdx.x;
  const int64_t D = a.dim, L = a.len;
  const ClBlock blk = LocateClBlock<kV>(D, nchunk);
  const int64_t b = blk.b, chunk = blk.chunk, c0 = blk.c0;
  const int64_t ts = (chunk * kClY + threadIdx.y) * kClBwdSteps;
  const int64_t te = Min64(L, ts + kClBwdSteps);
  const bool active = c0 < D && ts < te;
  const bool silu = a.act == Activation::kSilu;
  const int64_t grp = b / a.batch_per_group();

  float dw[kW + 1][kV] = {};
  if (active) {
    const T* xb = static_cast<const T*>(a.x) + b * L * D + c0;
    const T* dyb = static_cast<const T*>(a.dy) + b * L * D + c0;
    const int64_t tend = te + H;  // g is needed up to te + H - 1
    const int64_t tload = Min64(tend, L);
    auto stage_group = [&](int64_t t, int buf) {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const bool ok = t + u < tload;
        const int64_t off = ok ? (t + u) * D : 0;
        CpAsync<sizeof(Raw)>(&stage[buf][0][u][tid], xb + off, ok);
        CpAsync<sizeof(Raw)>(&stage[buf][1][u][tid], dyb + off, ok);
      }
      CpAsyncCommit();
    };
    stage_group(ts, 0);  // in flight while the weights and history load

    const int64_t wbase = grp * D;
    float w[kW][kV], bias[kV];
    LoadClTaps<kW, kV>(a, wbase + c0, kV, w, bias);  // whole vectors here
    T* dxb = static_cast<T*>(a.dx) + b * L * D;

    float xw[kHist][kV], gw[kHist][kV] = {};  // input and g at steps t - H .. t - 1
    LoadClHistory<T, kV, H>(a, xb, b, c0, ts, xw);
    int buf = 0;
    for (int64_t t = ts; t < tend; t += U, buf ^= 1) {
      if (t + U < tend) {  // prefetch the next group, then wait for this one
        stage_group(t + U, buf ^ 1);
        CpAsyncWait<1>();
      } else {
        CpAsyncWait<0>();
      }
      for (int u = 0; u < U; ++u) {
        const int64_t tt = t + u;
        if (tt >= tend) break;
        const bool in = tt < tload;
        const Raw xr = stage[buf][0][u][tid], dr = stage[buf][1][u][tid];
        float g[kV], xt[kV];
#pragma unroll
        for (int c = 0; c < kV; ++c) {
          xt[c] = xr[c];  // zero-filled past tload
          float pre = bias[c] + w[H][c] * xt[c];
#pragma unroll
          for (int k = 0; k < H; ++k) pre += w[k][c] * xw[k][c];
          g[c] = in ? ActGrad(pre, dr[c], silu) : 0.f;
        }
        if (tt < te) {
#pragma unroll
          for (int c = 0; c < kV; ++c) {
#pragma unroll
            for (int k = 0; k < H; ++k) dw[k][c] += g[c] * xw[k][c];
            dw[H][c] += g[c] * xt[c];
            dw[kW][c] += g[c];
          }
        }
        // dx at p = tt - H: tap k reads g at p + H - k = tt - k.
        const int64_t p = tt - H;
        if (p >= ts) {
          float out[kV];
#pragma unroll
          for (int c = 0; c < kV; ++c) {
            float acc = w[0][c] * g[c];
#pragma unroll
            for (int k = 1; k < kW; ++k) acc += w[k][c] * gw[H - k][c];
            out[c] = acc;
          }
          StoreVec<T, kV>(dxb + p * D + c0, out);
        }
#pragma unroll
        for (int k = 0; k + 1 < H; ++k)
#pragma unroll
          for (int c = 0; c < kV; ++c) xw[k][c] = xw[k + 1][c], gw[k][c] = gw[k + 1][c];
        if (H > 0) {
#pragma unroll
          for (int c = 0; c < kV; ++c) xw[H - 1][c] = xt[c], gw[H - 1][c] = g[c];
        }
      }
    }
  }
  WriteClPartials<kW, kV>(a, red, dw, b, c0, nchunk, chunk, ws);
}

template <typename T>
cudaError_t LaunchT(const ConvArgs& a, int64_t nchunk, float* ws, cudaStream_t stream) {
  const dim3 grid(unsigned(ClBlocks(a.batch, nchunk, a.dim, kClV)));
  const dim3 block(kClX, kClY);
  switch (a.width) {
    case 2: BwdClRowKernel<T, 2><<<grid, block, 0, stream>>>(a, nchunk, ws); break;
    case 3: BwdClRowKernel<T, 3><<<grid, block, 0, stream>>>(a, nchunk, ws); break;
    default: BwdClRowKernel<T, 4><<<grid, block, 0, stream>>>(a, nchunk, ws); break;
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t BackwardClRow(const ConvArgs& a, const BackwardPlan& p, float* ws, cudaStream_t stream) {
  switch (a.x_dtype) {
    case DType::kF32: return LaunchT<float>(a, p.nchunk, ws, stream);
    case DType::kF16: return LaunchT<__half>(a, p.nchunk, ws, stream);
    case DType::kBF16: return LaunchT<__nv_bfloat16>(a, p.nchunk, ws, stream);
    default: return cudaErrorNotSupported;
  }
}

}  // namespace jcc::cuda
