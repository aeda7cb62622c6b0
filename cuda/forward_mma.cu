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
#include "wide_cf.cuh"

namespace jcc::cuda {
namespace {

constexpr int kMmaTile = 128;  // outputs per tile: 16 segments of 8 steps

__host__ __device__ __forceinline__ int MmaHalo(int W) { return RoundUp(W - 1, 8); }        // P
__host__ __device__ __forceinline__ int MmaKSteps(int W) { return (MmaHalo(W) + 8 + 15) / 16; }
// Staged steps of a chunk: c0 - P .. c0 + kWideChunk + 16 (ldmatrix reads
// up to 16 past the chunk, where B is zero; zero past the row's end).
__host__ __device__ __forceinline__ int MmaBufElems(int W) { return kWideChunk + MmaHalo(W) + 16; }

// This lane's B fragments of taps group (b, d) for k-steps kk < nk: the
// pairs of rows 16 kk + 2 (lane % 4) (+1) and + 8 (+9) of column lane / 4.
// Returns whether the lo parts are needed (weights not of x's dtype).
template <typename T, int kNK>
__device__ __forceinline__ bool MmaTaps(const ConvArgs& a, int64_t b, int64_t d, int nk, unsigned (&hi)[kNK][2],
                                        unsigned (&lo)[kNK][2]) {
  const int W = int(a.width), lane = threadIdx.x & 31, col = lane >> 2, shift = MmaHalo(W) - (W - 1);
  const int64_t wrow = (a.groups == 1 ? 0 : DivFast(b, BatchPerGroupFast(a)) * a.dim) + d;
  auto tap = [&](int m) {
    const int k = m - col - shift;
    return k >= 0 && k < W ? LoadAnyF(a.weight, a.w_dtype, wrow * W + k) : 0.f;
  };
  auto rest = [](float w) { return w - ToF(FromF<T>(w)); };
#pragma unroll
  for (int kk = 0; kk < kNK; ++kk) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int m = 16 * kk + 2 * (lane & 3) + 8 * h;
      const float w0 = kk < nk ? tap(m) : 0.f, w1 = kk < nk ? tap(m + 1) : 0.f;
      hi[kk][h] = PackPair<T>(w0, w1);
      lo[kk][h] = PackPair<T>(rest(w0), rest(w1));
    }
  }
  return a.w_dtype != a.x_dtype;
}

template <typename T, int kNK>
__global__ void __launch_bounds__(kStreamThreads) FwdMmaKernel(const ConvArgs a, int64_t spans_per_row) {
  extern __shared__ float4 smem_raw[];
  const StreamPlace pl = LocateStream(a, spans_per_row, kWideSpan);
  if (!pl.live) return;  // whole warps; no block barriers
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int W = int(a.width), P = MmaHalo(W), nk = MmaKSteps(W), nbuf = MmaBufElems(W);
  T* bufs = reinterpret_cast<T*>(smem_raw) + 2 * nbuf * warp;
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
  // this lane's ldmatrix row: row (lane % 8) + 8 (matrix & 1) of A, columns
  // from 8 (matrix >> 1); the C pairs it receives: rows lane / 4 (+ 8),
  // columns 2 (lane % 4) (+1): steps t0 + first (+ 64) (+1)
  const int lrow = 8 * ((lane & 7) + 8 * ((lane >> 3) & 1)) + 8 * (lane >> 4);
  const int first = 8 * (lane >> 2) + 2 * (lane & 3);

  const int64_t end = Min64(CeilDiv(L, kWideChunk), pl.first_chunk + kWideSpan);
  IssueWideX<T>(a, xrow, b, d, pl.first_chunk * kWideChunk - P, nbuf, bufs);
  for (int64_t ci = pl.first_chunk; ci < end; ++ci) {
    const int64_t c0 = ci * kWideChunk;
    const T* cur = bufs + ((ci - pl.first_chunk) & 1) * nbuf;
    if (ci + 1 < end) {  // the next chunk's x, in flight during this chunk's work
      IssueWideX<T>(a, xrow, b, d, c0 + kWideChunk - P, nbuf, bufs + ((ci + 1 - pl.first_chunk) & 1) * nbuf);
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncwarp();
#pragma unroll 1
    for (int u = 0; u < kWideChunk / kMmaTile; ++u) {
      const int64_t t0 = c0 + kMmaTile * u;
      if (t0 >= L) break;
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
      const T* arow = cur + kMmaTile * u + lrow;
#pragma unroll
      for (int kk = 0; kk < kNK; ++kk) {
        if (kk >= nk) break;
        unsigned frag[4];
        LdMatrixX4(arow + 16 * kk, frag);
        Mma16816<T>(acc, frag, bhi[kk][0], bhi[kk][1]);
        if (split) Mma16816<T>(acc, frag, blo[kk][0], blo[kk][1]);
      }
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

template <typename T, int kNK>
cudaError_t LaunchT(const ConvArgs& a, int64_t spans_per_row, cudaStream_t stream) {
  const size_t smem = size_t(kStreamWarps) * 2 * MmaBufElems(int(a.width)) * sizeof(T);
  return LaunchWithSmem(FwdMmaKernel<T, kNK>, StreamBlocks(a, spans_per_row), kStreamThreads, smem, stream, a,
                        spans_per_row);
}

template <typename T>
cudaError_t LaunchNK(const ConvArgs& a, int64_t spans_per_row, cudaStream_t stream) {
  const int nk = MmaKSteps(int(a.width));  // k-step buckets: W <= 40, 72, 136, 256
  if (nk <= 3) return LaunchT<T, 3>(a, spans_per_row, stream);
  if (nk <= 5) return LaunchT<T, 5>(a, spans_per_row, stream);
  if (nk <= 9) return LaunchT<T, 9>(a, spans_per_row, stream);
  return LaunchT<T, 17>(a, spans_per_row, stream);
}

}  // namespace

cudaError_t ForwardMma(const ConvArgs& a, const ForwardPlan& p, cudaStream_t stream) {
  if (a.x_dtype == DType::kBF16) return LaunchNK<__nv_bfloat16>(a, p.spans_per_row, stream);
  if (a.x_dtype == DType::kF16) return LaunchNK<__half>(a, p.spans_per_row, stream);
  return cudaErrorNotSupported;
}

}  // namespace jcc::cuda
