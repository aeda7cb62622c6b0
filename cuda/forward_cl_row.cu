// Channels-last forward for the hot case: one sequence per row (no seq_idx /
// varlen), 2 <= W <= 4, whole aligned 16-byte channel vectors. A block of
// kClX x kClY threads; each thread owns one 16-byte vector of channels and a
// slice of kClFwdSteps time steps, and stages x (and the residual) through
// shared memory with cp.async one group of steps ahead, so loads stay in
// flight while it computes. final_states are written by states.cu.
#include <climits>

#include "cl_row.cuh"
#include "cp_async.cuh"
#include "launchers.h"

namespace jcc::cuda {
namespace {

// Time steps per thread. 32 rather than 64: shorter blocks leave a shorter
// tail of partly filled waves (H100, (8,4096,4096) bf16: 199-200 us against
// 204 us; 16 or 24 steps, 48, or 4-step groups were no better, cuda/NOTES.md).
constexpr int kClFwdSteps = 32;
constexpr int kStage = 8;        // steps per staged group

template <typename T, int kW>
__global__ void __launch_bounds__(kClX * kClY)
    FwdClRowKernel(const ConvArgs a, int64_t nchunk) {
  constexpr int H = kW - 1, kV = 16 / int(sizeof(T)), U = kStage;
  constexpr int kThreadsPerBlock = kClX * kClY;
  using Raw = ChRaw<T, kV>;
  // stage[buffer][tensor: x, residual][step][thread], dynamic: the residual
  // half only when there is a residual
  extern __shared__ uint4 smem_raw[];
  const bool has_res = a.residual != nullptr;
  auto slot = [&](int buf, int tensor, int u) -> Raw& {
    Raw* base = reinterpret_cast<Raw*>(smem_raw);
    const int tensors = has_res ? 2 : 1;
    return base[((buf * tensors + tensor) * U + u) * kThreadsPerBlock + threadIdx.y * kClX +
                threadIdx.x];
  };
  const int64_t D = a.dim, L = a.len;
  const ClBlock blk = LocateClBlock<kV>(a.dim, nchunk);
  const int64_t b = blk.b, chunk = blk.chunk, c0 = blk.c0;
  const int64_t ts = (chunk * kClY + threadIdx.y) * kClFwdSteps;
  const int64_t te = Min64(L, ts + kClFwdSteps);
  if (c0 >= D || ts >= te) return;
  const T* xb = static_cast<const T*>(a.x) + b * L * D + c0;
  const T* rb = has_res ? static_cast<const T*>(a.residual) + b * L * D + c0 : nullptr;
  T* yb = static_cast<T*>(a.y) + b * L * D + c0;
  auto stage_group = [&](int64_t t, int buf) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const bool ok = t + u < te;
      const int64_t off = ok ? (t + u) * D : 0;
      CpAsync<sizeof(Raw)>(&slot(buf, 0, u), xb + off, ok);
      if (has_res) CpAsync<sizeof(Raw)>(&slot(buf, 1, u), rb + off, ok);
    }
    CpAsyncCommit();
  };
  stage_group(ts, 0);  // in flight while the weights and history load

  const int64_t wbase = (b / a.batch_per_group()) * D + c0;
  float w[kW][kV], bias[kV];
  LoadClTaps<kW, kV>(a, wbase, kV, w, bias);  // whole vectors here
  float win[H][kV];  // input at steps t - H .. t - 1
  LoadClHistory<T, kV, H>(a, xb, b, c0, ts, win);
  const bool silu = a.act == Activation::kSilu;
  int buf = 0;
  for (int64_t t = ts; t < te; t += U, buf ^= 1) {
    if (t + U < te) {  // prefetch the next group, then wait for this one
      stage_group(t + U, buf ^ 1);
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    for (int u = 0; u < U && t + u < te; ++u) {
      const Raw xr = slot(buf, 0, u);
      float out[kV];
#pragma unroll
      for (int c = 0; c < kV; ++c) {
        const float xt = xr[c];
        float acc = bias[c] + w[H][c] * xt;
#pragma unroll
        for (int k = 0; k < H; ++k) acc += w[k][c] * win[k][c];
        out[c] = Activate(acc, silu);
#pragma unroll
        for (int k = 0; k + 1 < H; ++k) win[k][c] = win[k + 1][c];
        win[H - 1][c] = xt;
      }
      if (has_res) {
        const Raw rr = slot(buf, 1, u);
#pragma unroll
        for (int c = 0; c < kV; ++c) out[c] += rr[c];
      }
      StoreVec<T, kV>(yb + (t + u) * D, out);
    }
  }
}

template <typename T, int kW>
cudaError_t Launch(const ConvArgs& a, int64_t nchunk, cudaStream_t stream) {
  const size_t smem = size_t(2) * (a.residual ? 2 : 1) * kStage * kClX * kClY * 16;
  auto* kernel = FwdClRowKernel<T, kW>;
  if (smem > 48 * 1024) {
    const cudaError_t e =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  constexpr int kV = 16 / int(sizeof(T));
  kernel<<<unsigned(ClBlocks(a.batch, nchunk, a.dim, kV)), dim3(kClX, kClY), smem, stream>>>(a, nchunk);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchT(const ConvArgs& a, int64_t nchunk, cudaStream_t stream) {
  switch (a.width) {
    case 2: return Launch<T, 2>(a, nchunk, stream);
    case 3: return Launch<T, 3>(a, nchunk, stream);
    default: return Launch<T, 4>(a, nchunk, stream);
  }
}

}  // namespace

int64_t ClRowChunks(const ConvArgs& a, bool backward) {
  const int64_t steps = backward ? int64_t(kClBwdSteps) * kClY : int64_t(kClFwdSteps) * kClY;
  const int64_t vec = backward ? kClV : 16 / DTypeBytes(a.x_dtype);
  const int64_t nchunk = CeilDiv(a.len, steps);
  return ClBlocks(a.batch, nchunk, a.dim, int(vec)) <= INT_MAX ? nchunk : 0;
}

cudaError_t ForwardClRow(const ConvArgs& a, const ForwardPlan& p, cudaStream_t stream) {
  switch (a.x_dtype) {
    case DType::kF32: return LaunchT<float>(a, p.nchunk, stream);
    case DType::kF16: return LaunchT<__half>(a, p.nchunk, stream);
    case DType::kBF16: return LaunchT<__nv_bfloat16>(a, p.nchunk, stream);
    default: return cudaErrorNotSupported;
  }
}

}  // namespace jcc::cuda
