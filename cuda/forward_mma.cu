// The mma forward (tensor cores): channels-first rows of whole aligned
// vectors of bfloat16 or float16 x, one sequence per row, W > 16. A warp
// walks a span of its channel row like the wide family (wide_cf.cuh stages
// the raw inputs), but sums on tensor cores: the 128 outputs of a tile,
// y[t0 + 8j + i] (j < 16 segments, i < 8), are C = A B with
//   A[j][m] = x[t0 + 8j + m - P]        (16 x K, read by ldmatrix straight
//                                         from the staged row: row j of A
//                                         starts 8 steps after row j - 1)
//   B[m][i] = w[m - i - (P - H)]        (K x 8, the taps; zero off [0, W))
// with P = H rounded up to 8 (16-byte aligned rows) and K = P + 8 rounded
// up to 16. Float weights (other than x's dtype) are split into two 16-bit
// parts, hi + lo, each its own B: products then keep ~16 more bits.
#include "launchers.h"
#include "mma.cuh"
#include "wide_cf.cuh"  // IssueWideX

namespace jcc::cuda {
namespace {

template <typename T, int kNK>
__global__ void __launch_bounds__(kStreamThreads, kNK <= 3 ? 6 : (kNK <= 5 ? 5 : 1)) FwdMmaKernel(const ConvArgs a, int64_t spans_per_row) {
  extern __shared__ float4 smem_raw[];
  const StreamPlace pl = LocateStream(a, spans_per_row, kWideSpan);
  if (!pl.live) return;  // whole warps; no block barriers
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int W = int(a.width), P = MmaHalo(W), nk = MmaKSteps(W), nbuf = MmaBufElems(W);
  T* bufs = reinterpret_cast<T*>(smem_raw) + kMmaStages * nbuf * warp;
  const int64_t L = a.len, b = pl.b, d = pl.d;
  const T* xrow = static_cast<const T*>(a.x) + a.x_layout().At(b, d, 0);
  const int64_t row = a.io_layout().At(b, d, 0);
  const T* res = a.residual ? static_cast<const T*>(a.residual) + row : nullptr;
  T* yrow = static_cast<T*>(a.y) + row;
  const bool silu = a.act == Activation::kSilu;
  unsigned bhi[kNK][2], blo[kNK][2];
  const bool split = MmaTaps<T, kNK>(a, b, d, nk, bhi, blo);
  const int64_t wrow = (a.groups == 1 ? 0 : DivFast(b, BatchPerGroupFast(a)) * a.dim) + d;
  const float bias = a.bias ? LoadAnyF(a.bias, a.b_dtype, wrow) : 0.f;
  const int lrow = MmaLaneRow(lane), first = MmaLaneFirst(lane);

  const int64_t end = Min64(CeilDiv(L, kWideChunk), pl.first_chunk + kWideSpan);
  // chunk first + i in buffer i % kMmaStages; a copy group per chunk (empty
  // past the span), so that "all but the last kMmaStages - 1 groups" are
  // this chunk's
  auto issue = [&](int64_t ci) {
    if (ci < end)
      IssueWideX<T>(a, xrow, b, d, ci * kWideChunk - P, nbuf, bufs + (ci - pl.first_chunk) % kMmaStages * nbuf);
    else
      CpAsyncCommit();
  };
  for (int i = 0; i < kMmaStages - 1; ++i) issue(pl.first_chunk + i);
  for (int64_t ci = pl.first_chunk; ci < end; ++ci) {
    const int64_t c0 = ci * kWideChunk;
    const T* cur = bufs + (ci - pl.first_chunk) % kMmaStages * nbuf;
    issue(ci + kMmaStages - 1);  // into the buffer of chunk ci - 1, whose readers are done
    CpAsyncWait<kMmaStages - 1>();
    __syncwarp();
#pragma unroll 1
    for (int u = 0; u < kWideChunk / kMmaTile; ++u) {
      const int64_t t0 = c0 + kMmaTile * u;
      if (t0 >= L) break;
      float acc[4];
      MmaTile<T, kNK>(cur + kMmaTile * u + lrow, nk, bhi, blo, split, acc);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t t = t0 + first + 64 * h;
        if (t >= L) continue;  // (L is whole vectors: both steps or neither)
        float v0 = Activate(acc[2 * h] + bias, silu), v1 = Activate(acc[2 * h + 1] + bias, silu);
        if (res) {
          float r0, r1;
          UnpackPair<T>(__ldg(reinterpret_cast<const unsigned*>(res + t)), r0, r1);
          v0 += r0, v1 += r1;
        }
        *reinterpret_cast<unsigned*>(yrow + t) = PackPair<T>(v0, v1);
      }
    }
    __syncwarp();  // this buffer's readers are done before it is refilled
  }
}

template <typename T>
cudaError_t LaunchT(const ConvArgs& a, int64_t spans_per_row, cudaStream_t stream) {
  const size_t smem = size_t(kStreamWarps) * kMmaStages * MmaBufElems(int(a.width)) * sizeof(T);
  return WithKSteps(int(a.width), [&](auto nk) {
    return LaunchWithSmem(FwdMmaKernel<T, decltype(nk)::value>, StreamBlocks(a, spans_per_row), kStreamThreads,
                          smem, stream, a, spans_per_row);
  });
}

}  // namespace

cudaError_t ForwardMma(const ConvArgs& a, const ForwardPlan& p, cudaStream_t stream) {
  if (a.x_dtype == DType::kBF16) return LaunchT<__nv_bfloat16>(a, p.spans_per_row, stream);
  if (a.x_dtype == DType::kF16) return LaunchT<__half>(a, p.spans_per_row, stream);
  return cudaErrorNotSupported;
}

}  // namespace jcc::cuda
