// The mma forward (tensor cores): channels-first rows of whole aligned
// vectors of bfloat16 or float16 x, one sequence per row or seq_idx, W > 16.
// A warp walks a span of its channel row like the wide family (wide_cf.cuh
// stages the raw inputs), but sums on tensor cores: the 128 outputs of a
// tile, y[t0 + 8j + i] (j < 16 segments, i < 8), are C = A B with
//   A[j][m] = x[t0 + 8j + m - P]        (16 x K, read by ldmatrix straight
//                                         from the staged row: row j of A
//                                         starts 8 steps after row j - 1)
//   B[m][i] = w[m - i - (P - H)]        (K x 8, the taps; zero off [0, W))
// with P = H rounded up to 8 (16-byte aligned rows) and K = P + 8 rounded
// up to 16. Float weights (other than x's dtype) are split into two 16-bit
// parts, hi + lo, each its own B: products then keep ~16 more bits.
// seq_idx: the ids are staged beside x; a tile whose window holds one live
// id (MmaOneIdTiles, once a chunk) is summed as above, any other once per
// distinct id among its outputs with A masked to that id's inputs (padding
// outputs are 0). A tile with a non-finite sum (an Inf or NaN input, or taps
// not finite in 16 bits) is summed again exactly, tap by tap inside each
// window (MmaTileExact), so that such an input reaches only the outputs
// whose window holds it (dense: after the chunk's tile loop).
#include "launchers.h"
#include "mma.cuh"
#include "wide_cf.cuh"  // IssueWideX

namespace jcc::cuda {
namespace {

// The ids of steps o .. o + n (whole words of 4, o a multiple of 4) into
// ids, by the whole block (its warps share a batch row): copies where in the
// row (no commit: the x copies' group takes them), else HistoryId before
// step 0 and kNoId past the end.
__device__ __forceinline__ void IssueMmaIds(const ConvArgs& a, int64_t b, int64_t o, int n, int32_t hist,
                                            int32_t* ids) {
  const int32_t* row = a.seq_idx + b * a.len;
  for (int v = threadIdx.x; v < n / 4; v += kStreamThreads) {
    const int64_t t = o + 4 * v;
    if (t >= 0 && t < a.len) {
      CpAsync<16>(ids + 4 * v, row + t, true);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) ids[4 * v + i] = t < 0 ? hist : kNoId;
    }
  }
}

// Outputs p[0], p[1] from their sums (padding, not live: exactly 0 before
// the residual r, read where has_res). has_res and silu: bools, or Fixed.
template <typename T, typename R, typename S>
__device__ __forceinline__ void StoreMmaPair(T* p, const T* r, float s0, float s1, bool live0, bool live1,
                                             float bias, S silu, R has_res) {
  float v0 = live0 ? Activate(s0 + bias, silu) : 0.f;
  float v1 = live1 ? Activate(s1 + bias, silu) : 0.f;
  if (has_res) {
    float r0, r1;
    UnpackPair<T>(__ldg(reinterpret_cast<const unsigned*>(r)), r0, r1);
    v0 += r0, v1 += r1;
  }
  *reinterpret_cast<unsigned*>(p) = PackPair<T>(v0, v1);
}

// Shared memory of a block, in bytes.
__host__ __device__ __forceinline__ int MmaSmemBytes(int W, bool masked, int elem_bytes) {
  return kMmaStages * MmaBufElems(W) * (kStreamWarps * elem_bytes + (masked ? 4 : 0));
}

template <typename T, int kNK, bool kMasked>
__global__ void __launch_bounds__(kStreamThreads, kNK <= 3 ? 7 : kNK <= 5 ? 6 : kNK <= 9 ? 4 : 3)
    FwdMmaKernel(const ConvArgs a, int64_t spans_per_row) {
  extern __shared__ float4 smem_raw[];
  const StreamPlace pl = LocateStream(a, spans_per_row, kWideSpan);
  // whole warps; masked, a warp past dim still stages ids and takes part in
  // the block barriers
  if (!kMasked && !pl.live) return;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int W = int(a.width), P = MmaHalo(W), nk = MmaKSteps(W), nbuf = MmaBufElems(W);
  T* bufs = reinterpret_cast<T*>(smem_raw) + kMmaStages * nbuf * warp;
  // (masked: after the x buffers of all warps, the block's id buffers)
  int32_t* idbufs = reinterpret_cast<int32_t*>(reinterpret_cast<T*>(smem_raw) + kStreamWarps * kMmaStages * nbuf);
  const int64_t L = a.len, b = pl.b, d = pl.live ? pl.d : 0;
  const T* xrow = static_cast<const T*>(a.x) + a.x_layout().At(b, d, 0);
  const int64_t row = a.io_layout().At(b, d, 0);
  const T* res = a.residual ? static_cast<const T*>(a.residual) + row : nullptr;
  T* yrow = static_cast<T*>(a.y) + row;
  const bool silu = a.act == Activation::kSilu;
  unsigned bhi[kNK][2], blo[kNK][2];
  const bool split = MmaTaps<T, kNK>(a, b, d, nk, bhi, blo);
  const int64_t wrow = WeightRow(a, b, d);
  const float bias = a.bias ? LoadAnyF(a.bias, a.b_dtype, wrow) : 0.f;
  const int lrow = MmaLaneRow(lane), first = MmaLaneFirst(lane);
  const int32_t hist = kMasked ? HistoryId(a, b) : 0;

  const int64_t end = Min64(CeilDiv(L, kWideChunk), pl.first_chunk + kWideSpan);
  // chunk first + i in buffer i % kMmaStages; a copy group per chunk (empty
  // past the span), so that "all but the last kMmaStages - 1 groups" are
  // this chunk's
  auto issue = [&](int64_t ci) {
    if (ci < end) {
      const int stage = int(ci - pl.first_chunk) % kMmaStages;
      if constexpr (kMasked) IssueMmaIds(a, b, ci * kWideChunk - P, nbuf, hist, idbufs + stage * nbuf);
      if (pl.live) {
        IssueWideX<T>(a, xrow, b, d, ci * kWideChunk - P, nbuf, bufs + stage * nbuf);
        return;
      }
    }
    CpAsyncCommit();
  };
  for (int i = 0; i < kMmaStages - 1; ++i) issue(pl.first_chunk + i);
  for (int64_t ci = pl.first_chunk; ci < end; ++ci) {
    const int64_t c0 = ci * kWideChunk;
    const T* cur = bufs + int(ci - pl.first_chunk) % kMmaStages * nbuf;
    const int32_t* ids = idbufs + int(ci - pl.first_chunk) % kMmaStages * nbuf;
    CpAsyncWait<kMmaStages - 2>();  // this chunk's copies (the next chunk's stay in flight)
    if constexpr (kMasked) {
      __syncthreads();  // the block's copies of the ids are in; every warp is done with chunk ci - 1
    } else {
      __syncwarp();
    }
    issue(ci + kMmaStages - 1);  // into the buffers of chunk ci - 1, whose readers are done
    if constexpr (kMasked) {
      // (masked: 64-bit offsets and a run-time residual test; the dense
      // loop's 32-bit offsets and fixed residual spill here at the block
      // bound and cost time; the activation fixed, a copy each)
      const unsigned one = MmaOneIdTiles(ids, P);
      auto tiles = [&](auto act_silu) {  // (Fixed)
#pragma unroll 1
        for (int u = 0; u < kWideChunk / kMmaTile; ++u) {
          if (!pl.live) break;
          const int64_t t0 = c0 + kMmaTile * u;
          if (t0 >= L) break;
          float acc[4];
          bool live[4] = {true, true, true, true};  // (the output is not padding)
          const T* arow = cur + kMmaTile * u + lrow;
          if (one >> u & 1)
            MmaTile<T, kNK>(arow, nk, bhi, blo, split, acc);
          else
            MmaTileMasked<T, kNK>(arow, ids + kMmaTile * u, P, nk, bhi, blo, split, acc, live);
          if (!MmaSumsFinite(acc)) MmaTileExact<T, kMasked>(a, wrow, cur + kMmaTile * u, ids + kMmaTile * u, live, acc);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int64_t t = t0 + first + 64 * h;
            if (t < L)  // (L is whole vectors: both steps or neither)
              StoreMmaPair<T>(yrow + t, res ? res + t : nullptr, acc[2 * h], acc[2 * h + 1], live[2 * h],
                              live[2 * h + 1], bias, act_silu, res != nullptr);
          }
        }
      };
      silu ? tiles(Fixed<true>()) : tiles(Fixed<false>());
    } else {
      // Dense: the chunk's tiles with the residual's presence and the
      // activation fixed (a branch a chunk, not a test an output); offsets
      // from the chunk in 32 bits.
      const int rem = int(Min64(L - c0, kWideChunk));  // the chunk's steps in the row
      T* ychunk = yrow + c0;
      const T* rchunk = res ? res + c0 : nullptr;
      auto chunk = [&](auto has_res, auto act_silu) {  // (Fixed)
        // the outputs of this lane of the tile at offset o (acc as MmaTile gives them) to y
        auto store = [&](int o, const float(&acc)[4], const bool(&live)[4]) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const int e = o + first + 64 * h;
            if (e < rem)  // (L is whole vectors: both steps or neither)
              StoreMmaPair<T>(ychunk + e, rchunk + e, acc[2 * h], acc[2 * h + 1], live[2 * h], live[2 * h + 1],
                              bias, act_silu, has_res);
          }
        };
        // the sum of this lane's sums of the chunk: not finite when one of
        // them is not (or, harmlessly, when finite ones overflow). The
        // chunk's tiles are then summed again exactly after the loop, from
        // the chunk still staged, and stored again by the same thread (the
        // later store stays): the loop keeps only an add a tile.
        float check = 0.f;
        const bool all[4] = {true, true, true, true};
#pragma unroll 1
        for (int o = 0; o < kWideChunk; o += kMmaTile) {
          if (o >= rem) break;
          float acc[4];
          MmaTile<T, kNK>(cur + o + lrow, nk, bhi, blo, split, acc);
          check += (acc[0] + acc[1]) + (acc[2] + acc[3]);
          store(o, acc, all);
        }
        if (fabsf(check) < INFINITY) return;
#pragma unroll 1
        for (int o = 0; o < rem; o += kMmaTile) {  // (rare: a non-finite input or tap)
          float acc[4];
          bool live[4];
          MmaTileExact<T, kMasked>(a, wrow, cur + o, ids + o, live, acc);
          store(o, acc, live);
        }
      };
      using Yes = Fixed<true>;
      using No = Fixed<false>;
      if (res) {
        silu ? chunk(Yes(), Yes()) : chunk(Yes(), No());
      } else {
        silu ? chunk(No(), Yes()) : chunk(No(), No());
      }
    }
    __syncwarp();  // this buffer's readers are done before it is refilled
  }
}

template <typename T>
cudaError_t LaunchT(const ConvArgs& a, int64_t spans_per_row, cudaStream_t stream) {
  const bool masked = a.mode == SegmentMode::kSeqIdx;
  const size_t smem = size_t(MmaSmemBytes(int(a.width), masked, int(sizeof(T))));
  return WithKSteps(int(a.width), [&](auto nk) {
    constexpr int kNK = decltype(nk)::value;
    return LaunchWithSmem(masked ? FwdMmaKernel<T, kNK, true> : FwdMmaKernel<T, kNK, false>,
                          StreamBlocks(a, spans_per_row), kStreamThreads, smem, 0, stream, a, spans_per_row);
  });
}

}  // namespace

cudaError_t ForwardMma(const ConvArgs& a, const ForwardPlan& p, cudaStream_t stream) {
  return With16BitType(a.x_dtype, cudaErrorNotSupported,
                       [&](auto t) { return LaunchT<decltype(t)>(a, p.spans_per_row, stream); });
}

}  // namespace jcc::cuda
