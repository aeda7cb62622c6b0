// The channels-last tensor-core forward: channels-last dense bfloat16 or
// float16 x of whole aligned groups of kCh channels, one sequence per row or
// seq_idx, W > 16. Staged like the channels-last wide family (wide_cl.cuh: a
// block of kCh warps takes a group's rows over a span, outputs leave as whole
// rows through the column buffer ys), but the rows are transposed into one
// 16-bit row per channel, which each warp sums on tensor cores as
// forward_mma.cu does (mma.cuh). Groups of 16 channels (32-byte row pieces:
// whole DRAM sectors) where the channels and the shared memory allow
// (W <= 40, one sequence per row), else of kWideClCh = 8 (16-byte pieces).
// seq_idx: a step's id is every channel's, so the block stages the chunk's
// ids once (a 16-byte word a thread, loaded a chunk ahead into registers,
// stored after the barrier that ends the previous chunk's tiles) and each
// warp masks its tiles as forward_mma.cu does.
#include "launchers.h"
#include "mma.cuh"
#include "wide_cl.cuh"

namespace jcc::cuda {
namespace {

// The output columns in ys (row s of channel w at ys[w * kCol + s]): a
// lane's pairs of steps (MmaLaneFirst) go in as 8-byte words, a half-warp's
// 32 consecutive words, with no skew; a column stride of 2 words mod 4 puts
// the two 8-channel pieces of a row that StoreWideClRows's neighbouring
// threads read on different banks.
struct MmaClCols {
  static constexpr int kCol = kWideChunk + 2;
  __device__ static int At(int s) { return s; }
};

// Whether a kernel takes the conflict-free layouts (the swizzled raw rows,
// MmaClCols), by measurement (docs/performance-log.md, twenty-ninth
// session): they gain in the groups of 16, in the masked groups of 8 at 3,
// 5 and 17 k-steps and in the dense ones at 9 and 17; the dense groups of 8
// at 5 k-steps and the masked ones at 9 were slower with them, for a reason
// not found (their registers are the same either way). The dense groups of
// 8 at 3 k-steps (dim not a multiple of 16) are not measured and keep the
// plain layouts.
template <int kCh, bool kMasked, int kNK>
constexpr bool kMmaClSwizzle = kCh == 16 || (kMasked ? kNK <= 5 || kNK == 17 : kNK >= 9);
template <bool kSwizzle>
using MmaClColsOf = std::conditional_t<kSwizzle, MmaClCols, WideClRunCols>;

// A kernel's shared memory in bytes: the raw rows (rx, kMmaStages chunks of
// them), each warp's channel row (xc, 16-bit), the output columns (ys, laid
// out as Cols), masked the ids of the staged steps (ids); the layouts the
// kernel takes (kSwizzle, Cols) decided here once for it and its launch.
template <int kNK, int kCh, bool kMasked>
struct MmaClSmem {
  static constexpr bool kSwizzle = kMmaClSwizzle<kCh, kMasked, kNK>;
  using Cols = MmaClColsOf<kSwizzle>;
  int n, rx, xc, ys, ids, bytes;
  __host__ __device__ MmaClSmem(int W, int elem_bytes) {
    n = MmaBufElems(W);
    rx = 0;
    xc = rx + kMmaStages * n * kCh * elem_bytes;
    ys = xc + kCh * n * elem_bytes;
    ids = ys + kCh * Cols::kCol * 4;
    bytes = ids + (kMasked ? n * 4 : 0);
  }
};

// seq_idx: this thread's 16-byte word of the ids of staged steps o + e
// (e < n; o a multiple of 8 and the row's length of 4, so that a word lies
// wholly before step 0, in the row or past its end): HistoryId before step 0,
// kNoId past the end. Threads past the n / 4 words load nothing.
__device__ __forceinline__ int4 LoadMmaClIds(const ConvArgs& a, int64_t b, int64_t o, int n, int32_t hist) {
  const int64_t t = o + 4 * int(threadIdx.x);
  if (4 * int(threadIdx.x) >= n || t >= a.len) return make_int4(kNoId, kNoId, kNoId, kNoId);
  if (t < 0) return make_int4(hist, hist, hist, hist);
  return __ldg(reinterpret_cast<const int4*>(a.seq_idx + b * a.len + t));
}

// Raw rows i < n (steps o + i; pairs of them per thread; the pieces where
// IssueWideClRows swizzled them) into the channel rows xc + c * n as pairs,
// a 16-byte word of each row at a time; before step 0 the initial states
// (or zeros).
template <typename T, int kCh, bool kSwizzle>
__device__ __forceinline__ void TransposeMmaClRows(const ConvArgs& a, const T* raw, int64_t b, int64_t g, int64_t o,
                                                   int n, T* xc) {
  constexpr int N = 16 / int(sizeof(T)), kWords = kCh / N;  // elements per 16-byte word, words per row
  static_assert(kWords * N == kCh, "a row of the group is whole 16-byte words");
  for (int p = threadIdx.x; p < n / 2; p += 32 * kCh) {
    const int64_t t = o + 2 * p;
#pragma unroll
    for (int v = 0; v < kWords; ++v) {
      T e[2][N];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if (t + r >= 0) {
          const int q = WideClPiece<kSwizzle>((2 * p + r) * kWords + v);
          *reinterpret_cast<uint4*>(e[r]) = reinterpret_cast<const uint4*>(raw)[q];
        } else {
          const int64_t j = t + r + a.width - 1;  // the state's slot
#pragma unroll
          for (int c = 0; c < N; ++c)
            e[r][c] = FromF<T>(a.initial_states && j >= 0
                                   ? LoadState<T>(a, a.initial_states, b, g * kCh + v * N + c, j) : 0.f);
        }
      }
#pragma unroll
      for (int c = 0; c < N; ++c)
        reinterpret_cast<unsigned*>(xc + (v * N + c) * n)[p] = PackBits(e[0][c], e[1][c]);
    }
  }
}

template <typename T, int kNK, int kCh, bool kMasked>
__global__ void __launch_bounds__(32 * kCh, kCh == 16 ? 2 : kNK <= 5 ? 3 : 2)
    FwdMmaClKernel(const ConvArgs a, int64_t spans_per_row) {
  static_assert(!kMasked || (kWideChunk + 256 + 16) / 4 <= 32 * kCh, "a word of ids a thread");
  using Smem = MmaClSmem<kNK, kCh, kMasked>;
  constexpr bool kSwz = Smem::kSwizzle;
  using Cols = typename Smem::Cols;
  extern __shared__ float4 smem_raw[];
  const WideClPlace pl = LocateWideCl<kCh>(a, spans_per_row);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int W = int(a.width), P = MmaHalo(W), nk = MmaKSteps(W);
  const Smem sm(W, int(sizeof(T)));
  char* block = reinterpret_cast<char*>(smem_raw);
  T* rx = reinterpret_cast<T*>(block + sm.rx);
  T* xc = reinterpret_cast<T*>(block + sm.xc);
  float* ys = reinterpret_cast<float*>(block + sm.ys);
  int32_t* ids = reinterpret_cast<int32_t*>(block + sm.ids);
  const int64_t L = a.len, b = pl.b, g = pl.g, d = g * kCh + warp;
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  const T* res = static_cast<const T*>(a.residual);
  const bool silu = a.act == Activation::kSilu;
  unsigned bhi[kNK][2], blo[kNK][2];
  const bool split = MmaTaps<T, kNK>(a, b, d, nk, bhi, blo);
  const int64_t wrow = WeightRow(a, b, d);
  const float bias = a.bias ? LoadAnyF(a.bias, a.b_dtype, wrow) : 0.f;
  const T* mine = xc + warp * sm.n + MmaLaneRow(lane);
  float* col = ys + warp * Cols::kCol;
  const int first = MmaLaneFirst(lane);
  const int32_t hist = kMasked ? HistoryId(a, b) : 0;
  int4 next_ids;  // (masked) this thread's word of the next chunk's ids
  if constexpr (kMasked) next_ids = LoadMmaClIds(a, b, pl.first_chunk * kWideChunk - P, sm.n, hist);

  const int64_t end = Min64(CeilDiv(L, kWideChunk), pl.first_chunk + kWideSpan);
  // chunk first + i's rows in rx buffer i % kMmaStages, a copy group per
  // chunk (empty past the span) as in forward_mma.cu
  auto rows = [&](int64_t ci) { return rx + int(ci - pl.first_chunk) % kMmaStages * sm.n * kCh; };
  auto issue = [&](int64_t ci) {
    if (ci < end)
      IssueWideClRows<T, kCh, kSwz>(a, x, b, g, ci * kWideChunk - P, sm.n, rows(ci));
    else
      CpAsyncCommit();
  };
  for (int i = 0; i < kMmaStages - 1; ++i) issue(pl.first_chunk + i);
  for (int64_t ci = pl.first_chunk; ci < end; ++ci) {
    const int64_t c0 = ci * kWideChunk;
    issue(ci + kMmaStages - 1);  // into chunk ci - 1's buffer, transposed before the last barrier
    CpAsyncWait<kMmaStages - 1>();
    __syncthreads();  // the chunk's rows are in; the previous chunk's outputs are in ys
    if constexpr (kMasked) {  // (every warp is done with the previous chunk's ids)
      if (4 * int(threadIdx.x) < sm.n) reinterpret_cast<int4*>(ids)[threadIdx.x] = next_ids;
      if (ci + 1 < end) next_ids = LoadMmaClIds(a, b, c0 + kWideChunk - P, sm.n, hist);
    }
    if (ci > pl.first_chunk) StoreWideClRows<T, kCh, 8, Cols>(a, y, res, b, g, c0 - kWideChunk, ys);
    TransposeMmaClRows<T, kCh, kSwz>(a, rows(ci), b, g, c0 - P, sm.n, xc);
    __syncthreads();  // the channel rows (and ids) are in; ys is free again
    const T* row = xc + warp * sm.n;  // this warp's channel row
    // tile u's outputs of this lane (acc as MmaTile gives them) to the column
    auto put = [&](int u, const float(&acc)[4], const bool(&live)[4]) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {  // (padding: exactly 0 before the residual)
        const int s = kMmaTile * u + first + 64 * h;
        *reinterpret_cast<float2*>(col + Cols::At(s)) =
            make_float2(live[2 * h] ? Activate(acc[2 * h] + bias, silu) : 0.f,
                        live[2 * h + 1] ? Activate(acc[2 * h + 1] + bias, silu) : 0.f);
      }
    };
    if constexpr (kMasked) {
      const unsigned one = MmaOneIdTiles(ids, P);
#pragma unroll 1
      for (int u = 0; u < kWideChunk / kMmaTile; ++u) {
        if (c0 + kMmaTile * u >= L) break;
        float acc[4];
        bool live[4] = {true, true, true, true};  // (the output is not padding)
        if (one >> u & 1)
          MmaTile<T, kNK>(mine + kMmaTile * u, nk, bhi, blo, split, acc);
        else
          MmaTileMasked<T, kNK>(mine + kMmaTile * u, ids + kMmaTile * u, P, nk, bhi, blo, split, acc, live);
        if (!MmaSumsFinite(acc))  // (mma.cuh says why; deferred, the masked loop spills)
          MmaTileExact<T, kMasked>(a, wrow, row + kMmaTile * u, ids + kMmaTile * u, live, acc);
        put(u, acc, live);
      }
    } else {
      // the sum of this lane's sums of the chunk: not finite when one of them
      // is not (or, harmlessly, when finite ones overflow); the chunk's tiles
      // are then summed again exactly after the loop (mma.cuh says why) and
      // put again by the same thread: the loop keeps only an add a tile.
      const int tiles = int(Min64(kWideChunk / kMmaTile, CeilDiv(L - c0, kMmaTile)));
      const bool all[4] = {true, true, true, true};
      float check = 0.f;
#pragma unroll 1
      for (int u = 0; u < tiles; ++u) {
        float acc[4];
        MmaTile<T, kNK>(mine + kMmaTile * u, nk, bhi, blo, split, acc);
        check += (acc[0] + acc[1]) + (acc[2] + acc[3]);
        put(u, acc, all);
      }
#pragma unroll 1
      for (int u = 0; u < (fabsf(check) < INFINITY ? 0 : tiles); ++u) {  // (rare: a non-finite input or tap)
        float acc[4];
        bool live[4];
        MmaTileExact<T, kMasked>(a, wrow, row + kMmaTile * u, ids + kMmaTile * u, live, acc);
        put(u, acc, live);
      }
    }
  }
  __syncthreads();
  StoreWideClRows<T, kCh, 8, Cols>(a, y, res, b, g, (end - 1) * kWideChunk, ys);
}

// Groups of 16 channels where they divide dim and two blocks of them fit an
// SM's shared memory and registers (W <= 40), one sequence per row (with the
// ids, two blocks of 16 fit only up to W = 32; seq_idx keeps groups of 8
// until a 16-channel masked kernel is measured), else groups of kWideClCh.
template <typename T>
cudaError_t LaunchT(const ConvArgs& a, int64_t spans_per_row, cudaStream_t stream) {
  const int W = int(a.width);
  const bool masked = a.mode == SegmentMode::kSeqIdx;
  return WithKSteps(W, [&](auto nk) {
    constexpr int kNK = decltype(nk)::value;
    if constexpr (kNK <= 3) {
      if (a.dim % 16 == 0 && !masked)
        return LaunchWithSmem(FwdMmaClKernel<T, kNK, 16, false>, WideClBlocks<16>(a, spans_per_row), 32 * 16,
                              size_t(MmaClSmem<kNK, 16, false>(W, int(sizeof(T))).bytes), 0, stream, a, spans_per_row);
    }
    return LaunchWithSmem(masked ? FwdMmaClKernel<T, kNK, kWideClCh, true> : FwdMmaClKernel<T, kNK, kWideClCh, false>,
                          WideClBlocks(a, spans_per_row), kWideClThreads,
                          size_t(masked ? MmaClSmem<kNK, kWideClCh, true>(W, int(sizeof(T))).bytes
                                        : MmaClSmem<kNK, kWideClCh, false>(W, int(sizeof(T))).bytes),
                          0, stream, a, spans_per_row);
  });
}

}  // namespace

cudaError_t ForwardMmaCl(const ConvArgs& a, const ForwardPlan& p, cudaStream_t stream) {
  return With16BitType(a.x_dtype, cudaErrorNotSupported,
                       [&](auto t) { return LaunchT<decltype(t)>(a, p.spans_per_row, stream); });
}

}  // namespace jcc::cuda
