// The tensor-core backward (the plan's at W 8; JCC_BWD_MMA: see MmaBackwardFits):
// the streaming family's channels-first rows of whole aligned vectors,
// bfloat16 x, one sequence per row, 2 <= W <= 8. The
// streaming backward spends most of its instructions on the three W-tap sums
// an element (the pre-activation again, dx, dweight); here all three are
// MMAs over the staged chunk, as the forward's tiles (mma.cuh). A warp walks
// a span of chunks of one channel row from its last chunk to its first (the
// g of a chunk's first steps, computed anyway, is the g after the chunk
// before it); per tile of 128 outputs t = t0 + 8j + i (j < 16, i < 8):
//   pre:     C[j][i] = sum_m x[t0 + 8j + m - 8] w[m - i - (8 - H)]   (exact:
//            16-bit x, taps of x's dtype or split into hi + lo as the forward's)
//   g = dy * act'(pre + bias), kept in shared memory as two bfloat16 parts,
//            hi + lo (about 16 more bits: products of either with x or a tap
//            are exact in float);
//   dx:      C[j][i] = sum_m g[t0 + 8j + m] w[i + H - m]
//   dweight: D[m][i] += sum_j x[t0 + 8j + m - 8] g[t0 + 8j + i] (A = the
//            staged x transposed, B = the staged g; D accumulates over the
//            span, and dweight[k] = sum_i D[i + k + 8 - H][i] once at its end:
//            an entry off those diagonals is never read, so an input reaches
//            only the taps whose window holds it).
// A tile whose pre-activation or dx sums are not finite (an Inf or NaN
// input or dy: 0 * Inf in the MMA) is summed again exactly, tap by tap, as
// the forward's. (One difference from the tap-by-tap sums remains: the
// row's last tile also pairs its inputs with the zero g past the row's end,
// so a non-finite input in a row's last W - 1 steps can turn a dweight that
// is already Inf into NaN.) The partial dweight/dbias go to the workspace as the
// streaming backward's (backward_stream.cu), states to StatesGradKernel.

#include "launchers.h"
#include "mma.cuh"
#include "stream.cuh"
#include "cp_async.cuh"

namespace jcc::cuda {
namespace {

constexpr int kBmChunk = kWideChunk;  // steps a warp chunk
constexpr int kBmP = 8;               // staged inputs before a chunk (>= H)
constexpr int kBmStages = 3;          // chunks of x and dy staged: two in flight while one is summed
constexpr int kBmMaxSpan = 8;         // chunks a span at most
// A warp's shared memory, in 16-bit elements (each part whole 16-byte rows):
// kBmStages x (x of steps c0 - 8 .. c0 + C, dy of c0 .. c0 + C), then g's
// hi and lo parts of steps c0 .. c0 + C + 8 (and 8 spare).
constexpr int kBmX = kBmChunk + kBmP, kBmStage = kBmX + kBmChunk, kBmG = kBmChunk + 16;
constexpr int kBmWarpElems = kBmStages * kBmStage + 2 * kBmG;

// B fragments (16 x 8) of the taps (MmaTapFragment): entry (m, i) is
// w[tap(m, i)], zero off [0, kW); this lane's column is i = lane / 4.
template <typename T, int kW, typename F>
__device__ __forceinline__ void TapFragments(const float (&w)[kW], F&& tap, unsigned (&hi)[1][2],
                                             unsigned (&lo)[1][2]) {
  const int i = (threadIdx.x & 31) >> 2;
  MmaTapFragment<T>(0, [&](int m) {
    const int k = tap(m, i);
    float v = 0.f;
#pragma unroll
    for (int q = 0; q < kW; ++q) v = k == q ? w[q] : v;  // (no local array indexed at run time)
    return v;
  }, hi[0], lo[0]);
}

// g into its two parts at staged step e (even) of the hi and lo buffers: a
// pair of outputs. (A part hi that is not finite makes lo NaN here: the
// tile loop mends it.)
template <typename T>
__device__ __forceinline__ void StoreGPair(T* ghi, T* glo, int e, float g0, float g1) {
  const unsigned hi = PackPair<T>(g0, g1);
  float h0, h1;
  UnpackPair<T>(hi, h0, h1);
  *reinterpret_cast<unsigned*>(ghi + e) = hi;
  *reinterpret_cast<unsigned*>(glo + e) = PackPair<T>(g0 - h0, g1 - h1);
}

template <typename T, int kW>
__global__ void __launch_bounds__(kStreamThreads, 6)
    BwdMmaKernel(const ConvArgs a, int64_t spans_per_row, int chunks_per_span, float* ws) {
  extern __shared__ float4 smem_raw[];
  constexpr int H = kW - 1;
  static_assert(kW >= 2 && H <= kBmP, "one k-step of 16: W - 1 <= 8 (and MmaHalo(W) == 8 for the exact sums)");
  const StreamPlace pl = LocateStream(a, spans_per_row, chunks_per_span);
  if (!pl.live) return;  // (a warp's work is its own: no block barrier)
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  T* const base = reinterpret_cast<T*>(smem_raw) + kBmWarpElems * warp;
  T* const ghi = base + kBmStages * kBmStage;
  T* const glo = ghi + kBmG;
  const int64_t L = a.len, b = pl.b, d = pl.d;
  const BackwardRows<T> rows(a, b, d);
  const T* xrow = rows.x;
  const T* dyrow = rows.dy;
  T* dxrow = rows.dx;
  // (opaque to the compiler, so that it keeps the rows' addresses rather
  // than computing them again from the arguments at every copy)
  asm("" : "+l"(xrow), "+l"(dyrow), "+l"(dxrow));
  const bool silu = a.act == Activation::kSilu;
  float w[kW];
  const float bias = LoadStreamTaps<kW>(a, b, d, w);
  const bool split = a.w_dtype != a.x_dtype;
  unsigned pre_hi[1][2], pre_lo[1][2], dx_hi[1][2], dx_lo[1][2];
  TapFragments<T, kW>(w, [](int m, int i) { return m - i - (kBmP - H); }, pre_hi, pre_lo);
  TapFragments<T, kW>(w, [](int m, int i) { return i + H - m; }, dx_hi, dx_lo);
  // this lane's ldmatrix rows: A as the forward's (x for pre, g for dx);
  // A = x transposed (dweight: matrix q of the four at rows 8 (q >> 1) of
  // the tile's 16, columns 8 (q & 1)); B = g transposed (matrices hi rows
  // 0..7, 8..15, then lo's).
  const int arow = MmaLaneRow(lane), first = MmaLaneFirst(lane);
  const int trow = 8 * ((lane & 7) + 8 * (lane >> 4)) + 8 * ((lane >> 3) & 1);
  const int grow = (lane >> 4) * kBmG + 64 * ((lane >> 3) & 1) + 8 * (lane & 7);

  const int64_t chunk_end = Min64(CeilDiv(L, kBmChunk), pl.first_chunk + chunks_per_span);
  const int count = int(chunk_end - pl.first_chunk);
  // the q-th chunk walked (chunk_end - 1 - q) into stage q % kBmStages: a
  // copy group per chunk (empty past the span)
  // (unrolled by the lane's vectors from one address a tensor: the loop of
  // IssueWideX recomputed the row's address for every vector)
  auto issue = [&](int q) {
    if (q < count) {
      const int64_t c0 = (chunk_end - 1 - q) * kBmChunk;
      T* xs = base + q % kBmStages * kBmStage + 8 * lane;
      T* dys = xs + kBmX;
      const int64_t t0 = c0 + 8 * lane;  // this lane's first dy vector; x's from t0 - kBmP
      const T* dyp = dyrow + t0;
      const T* xp = xrow + (t0 - kBmP);
#pragma unroll
      for (int i = 0; i < kBmChunk / 8 / 32; ++i) {
        const bool in = t0 + 256 * i < L;
        CpAsync<16>(dys + 256 * i, in ? dyp + 256 * i : dyrow, in);
      }
#pragma unroll
      for (int i = 0; i < (kBmX / 8 + 31) / 32; ++i) {
        if (32 * (i + 1) > kBmX / 8 && lane + 32 * i >= kBmX / 8) break;
        const int64_t t = t0 - kBmP + 256 * i;
        if (i > 0 || t >= 0) CpAsync<16>(xs + 256 * i, t < L ? xp + 256 * i : xrow, t < L);
      }
      // (t < 0 only for the row's first vector: the initial states or zeros)
      if (c0 == 0 && lane == 0) *reinterpret_cast<uint4*>(xs) = LoadVectorBefore<T>(a, xrow, b, d, -kBmP);
    }
    CpAsyncCommit();
  };
  for (int q = 0; q < kBmStages - 1; ++q) issue(q);

  // g of the 8 steps after the span (the dx of its last outputs), one a lane
  {
    const int64_t s = chunk_end * kBmChunk + lane;
    float g = 0.f;
    if (lane < 8 && s < L) {
      float acc = bias;
#pragma unroll
      for (int k = 0; k < kW; ++k) acc = fmaf(w[k], ToF(xrow[s - H + k]), acc);
      g = ActGrad(acc, ToF(dyrow[s]), silu);
    }
    const float other = __shfl_down_sync(kFullMask, g, 1);
    if (lane < 8 && (lane & 1) == 0) StoreGPair<T>(ghi, glo, kBmChunk + lane, g, other);
  }

  float D[4] = {0.f, 0.f, 0.f, 0.f};  // D[m][i]: rows lane / 4 (+ 8), columns 2 (lane % 4) (+1)
  float gsum = 0.f;                   // dbias
  for (int q = 0; q < count; ++q) {
    const int64_t c0 = (chunk_end - 1 - q) * kBmChunk;
    const T* xs = base + q % kBmStages * kBmStage;
    const T* dys = xs + kBmX;
    CpAsyncWait<kBmStages - 2>();  // this chunk's copies (the next ones' stay in flight)
    __syncwarp();
    issue(q + kBmStages - 1);  // into the stage of the chunk walked before, whose readers are done
    if (q > 0 && lane < 8) {   // the g after this chunk: the first 8 steps of the chunk walked before
      unsigned* p = reinterpret_cast<unsigned*>(lane < 4 ? ghi : glo);
      p[kBmChunk / 2 + (lane & 3)] = p[lane & 3];
    }
    __syncwarp();
    const int rem = int(Min64(L - c0, kBmChunk));  // the chunk's steps in the row
    T* dxl = dxrow + c0 + first;
    // the chunk's tiles, the last first (a tile's dx reads the next one's
    // first g); the activation fixed (a branch a chunk, not a test an output)
    auto tiles = [&](auto act_silu) {  // (Fixed)
#pragma unroll 1
      for (int o = kBmChunk - kMmaTile; o >= 0; o -= kMmaTile) {
        // g of the tile (a tile past the row's end too: the tile before
        // reads its first 8, zero there)
        float acc[4];
        MmaTile<T, 1>(xs + o + arow, 1, pre_hi, pre_lo, split, acc);
        // (rare: again tap by tap, as the streaming kernels. Not MmaTileExact:
        // inlined, its taps read by dtype from global memory put address
        // arithmetic into every tile of this loop.)
        if (!MmaSumsFinite(acc)) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const T* src = xs + o + first + (i & 1) + 64 * (i >> 1) + kBmP - H;  // x at t - H
            float v = 0.f;
#pragma unroll
            for (int k = 0; k < kW; ++k) v += w[k] * ToF(src[k]);
            acc[i] = v;
          }
        }
        float g[4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float d0, d1;
          UnpackPair<T>(*reinterpret_cast<const unsigned*>(dys + o + first + 64 * h), d0, d1);
          g[2 * h] = ActGrad(acc[2 * h] + bias, d0, act_silu);
          g[2 * h + 1] = ActGrad(acc[2 * h + 1] + bias, d1, act_silu);
        }
        if (o + kMmaTile > rem) {  // (the row's last tiles)
#pragma unroll
          for (int i = 0; i < 4; ++i) g[i] = o + first + (i & 1) + 64 * (i >> 1) < rem ? g[i] : 0.f;
        }
        const float gs = (g[0] + g[1]) + (g[2] + g[3]);
        gsum += gs;
        StoreGPair<T>(ghi, glo, o + first, g[0], g[1]);
        StoreGPair<T>(ghi, glo, o + first + 64, g[2], g[3]);
        if (!(fabsf(gs) < INFINITY)) {  // (rare; or finite ones overflowed, harmless)
          // lo as 0 where hi is not finite (not Inf - Inf): hi + lo is g, and
          // an Inf g meets the dweight's inputs as itself
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int e = o + first + (i & 1) + 64 * (i >> 1);
            if (!(fabsf(ToF(ghi[e])) < INFINITY)) glo[e] = FromF<T>(0.f);
          }
        }
        __syncwarp();
        // dx: g (hi, then lo) times the reversed taps
        float dx[4] = {0.f, 0.f, 0.f, 0.f};
        unsigned f[4];
        LdMatrixX4(ghi + o + arow, f);
        Mma16816<T>(dx, f, dx_hi[0][0], dx_hi[0][1]);
        if (split) Mma16816<T>(dx, f, dx_lo[0][0], dx_lo[0][1]);
        LdMatrixX4(glo + o + arow, f);
        Mma16816<T>(dx, f, dx_hi[0][0], dx_hi[0][1]);
        if (!MmaSumsFinite(dx)) {  // (rare: a non-finite g; again tap by tap, the streaming order)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int e = o + first + (i & 1) + 64 * (i >> 1) + H;  // g at t + H - k: e - k
            float v = 0.f;
#pragma unroll
            for (int k = 0; k < kW; ++k) v += w[k] * (ToF(ghi[e - k]) + ToF(glo[e - k]));
            dx[i] = v;
          }
        }
        if (o + first < rem) *reinterpret_cast<unsigned*>(dxl + o) = PackPair<T>(dx[0], dx[1]);
        if (o + first + 64 < rem) *reinterpret_cast<unsigned*>(dxl + o + 64) = PackPair<T>(dx[2], dx[3]);
        // dweight: D += x^T g (hi and lo)
        unsigned xa[4], gb[4];
        LdMatrixX4Trans(xs + o + trow, xa);
        LdMatrixX4Trans(ghi + o + grow, gb);
        Mma16816<T>(D, xa, gb[0], gb[1]);
        Mma16816<T>(D, xa, gb[2], gb[3]);
      }
    };
    silu ? tiles(Fixed<true>()) : tiles(Fixed<false>());
    __syncwarp();  // (the chunk's g and stage read by every lane before they are refilled)
  }

  // dweight[k] from the diagonals of D, dbias, reduced over the warp as the
  // streaming backward's; lane k writes slot k (the bias's: kW)
  float part[kW + 1];
#pragma unroll
  for (int k = 0; k < kW; ++k) part[k] = 0.f;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int k = (lane >> 2) + 8 * (e >> 1) - (2 * (lane & 3) + (e & 1)) - (kBmP - H);
#pragma unroll
    for (int q = 0; q < kW; ++q) part[q] += k == q ? D[e] : 0.f;
  }
  part[kW] = gsum;
  StoreSpanPartial<kW>(a, ws, b, d, spans_per_row, pl.first_chunk / chunks_per_span, lane,
                       WarpTapSums<kW>(part, lane));
}

// Chunks a span: the most (up to kBmMaxSpan) that leaves at least 32768
// warps.
int64_t DefaultSpan(const ConvArgs& a) {
  return ChunksPerSpan(CeilDiv(a.len, kBmChunk), a.batch * a.dim, kBmMaxSpan);
}

}  // namespace

// The plan takes it at W 8 where its span is the longest: on the H200 its
// time is about level across W 2..8 there, and the streaming backward's
// grows with W, below it up to W 7; at spans of one chunk (the small,
// launch-bound shapes) it was slower at W 8 too (docs/performance-log.md,
// thirty-fourth session). JCC_BWD_MMA=1 takes it at every W 2..8 and
// span, JCC_BWD_MMA=0 never (tests and diagnosis; read at each call).
bool MmaBackwardFits(const ConvArgs& a) {
  const int forced = EnvDigit("JCC_BWD_MMA", "01");
  if (forced == 0) return false;
  const bool fits = (kBuiltTypes & 4) != 0 && a.x_dtype == DType::kBF16 &&
                    a.mode == SegmentMode::kRow && a.width >= 2 && a.width <= 8;
  return fits && (forced == 1 || (a.width == 8 && DefaultSpan(a) == kBmMaxSpan));
}

// Chunks a span: DefaultSpan's, or JCC_BWD_MMA_SPAN = 1, 2, 4 or 8 (tests
// and diagnosis: the hand-over between chunks at small shapes), read at
// each call as dispatch.cu's JCC_FWD_SPAN is.
int64_t MmaBackwardSpans(const ConvArgs& a, int64_t* chunks_per_span) {
  const int64_t per_row = CeilDiv(a.len, kBmChunk);
  int64_t k = DefaultSpan(a);
  if (const int forced = EnvDigit("JCC_BWD_MMA_SPAN", "1248"); forced > 0) k = forced;
  *chunks_per_span = k;
  const int64_t spans = CeilDiv(per_row, k);
  return StreamBlocks(a, spans) <= INT32_MAX ? spans : 0;
}

cudaError_t BackwardMma(const ConvArgs& a, const BackwardPlan& p, float* ws, cudaStream_t stream) {
  return IfTypeBuilt<4, __nv_bfloat16>(cudaErrorNotSupported, [&](auto t) {
    using T = decltype(t);
    return WithWidthAmong<2, 3, 4, 5, 6, 7, 8>(int(a.width), [&](auto w) {
      constexpr int kW = decltype(w)::value;
      return LaunchWithSmem(BwdMmaKernel<T, kW>, StreamBlocks(a, p.nchunk), kStreamThreads,
                            size_t(kStreamWarps) * kBmWarpElems * sizeof(T), 0, stream, a, p.nchunk,
                            int(p.chunks_per_span), ws);
    });
  });
}

}  // namespace jcc::cuda
