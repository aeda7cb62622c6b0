// Streaming backward for the rows of forward_stream.cu (see stream.cuh). A
// warp owns a span of chunks of one channel row and walks them from its last
// to its first, so that a chunk's vector-0 g, computed anyway, serves as the
// right halo of the chunk before it and only the span's last chunk computes
// the g of the vector after it; per
// chunk each thread loads its kVecs vectors of x and dy at once (plus the
// vector before the chunk for the x halo and, for the first lanes in the
// span's last chunk, the vector after it), then for each vector
//   g = dy * act'(pre)  (pre recomputed from x; zero on padding / past the end),
//   dweight[k] += g * x[t - H + k],  dbias += g,
//   dx = sum_k w[k] g[t + H - k],
// the H inputs before a vector from the lanes behind and the H values of g
// after it from the lanes ahead, by shuffles; g of the vector after the
// span is computed by the lanes that load it. seq_idx: BwdStreamIdsKernel
// below (stream_ids.cuh), compiled at each W <= 16, or (long rows at W 2..16:
// dispatch.cu's SeqWordsBackward) this kernel reading mask words that
// seq_words.cuh's pre-pass makes once a row. The warp's partial
// dweight/dbias go to
// ws[grp][part][d][W + 1] (part = (b % batch_per_group) * spans + span) for
// states.cu's ReduceKernel; dinitial_states and the final-states cotangent
// are left to StatesGradKernel.
#include "launchers.h"
#include "stream.cuh"
#include "seq_words.cuh"
#include "stream_ids.cuh"

namespace jcc::cuda {
namespace {

// (Blocks an SM asked of the compiler: unbounded it took 128 registers at
// W <= 8, 4 blocks; more blocks measured faster, and ptxas fits W <= 4 in 6
// blocks' share and W <= 8 in 5 without more than a word of spill. W 9..16
// took 158-191 registers unbounded (2-3 blocks); 4 blocks' 128 measured
// faster: docs/performance-log.md, 2026-11-27, sixteenth session.)
// kSeq: seq_idx, each vector's mask words read from `sw` (seq_words.cuh),
// the masked paths of stream_ids.cuh where a warp step's words are
// not all set. Its 16-bit W 7 / 8 spilled 20-64 bytes in 5 blocks' share and
// measured faster in 4 (docs/performance-log.md, thirty-sixth session).
template <typename T, int kW, bool kSeq>
__global__ void __launch_bounds__(kStreamThreads, kW <= 4 ? 6 : kW <= 8 ? (kSeq && kW >= 7 && sizeof(T) == 2 ? 4 : 5) : 4)
    BwdStreamKernel(const ConvArgs a, int64_t spans_per_row, int chunks_per_span, float* ws, SeqWords sw) {
  using S = Stream<T>;
  constexpr int N = S::kN, V = S::kVecs, kH = kW - 1, kHs = kH > 0 ? kH : 1;
  using Word = typename IdMask<N, kH>::Word;
  constexpr bool kWords = UnpackByWords<StreamPass::kBackward>(kW);
  constexpr int kQ = (kH + N - 1) / N;  // lanes a halo reaches
  const StreamPlace pl = LocateStream(a, spans_per_row, chunks_per_span);
  if (!pl.live) return;  // whole warps
  const int lane = threadIdx.x & 31;
  const int64_t L = a.len, b = pl.b, d = pl.d;
  const int64_t nchunks = CeilDiv(L, int64_t(S::kChunk));
  const int64_t chunk_end = Min64(nchunks, pl.first_chunk + chunks_per_span);
  const BackwardRows<T> rows(a, b, d);
  const T* xrow = rows.x;
  const T* dyrow = rows.dy;
  T* dxrow = rows.dx;
  const bool silu = a.act == Activation::kSilu;
  float w[kW];
  const float bias = LoadStreamTaps<kW>(a, b, d, w);
  float part[kW + 1] = {};  // partial dweight (taps 0 .. kW - 1) and dbias (index kW)
  // g of vector 0 of the chunk after (lanes < kQ: the right halo of the
  // chunk's last vectors), handed over from the chunk walked before: the
  // span is walked from its last chunk to its first, so only the span's
  // last chunk computes the g of the vector after it.
  float g_after[N] = {};

  for (int64_t ci = chunk_end - 1; ci >= pl.first_chunk; --ci) {
    const int64_t c0 = ci * S::kChunk;
    const bool first_walked = ci == chunk_end - 1;  // (warp-uniform)
    // All loads first: xr[j + 1] = x vector j (j = -1 .. V: before the
    // chunk, its vectors, after it), dyr[j] = dy vector j (j = 0 .. V; the
    // vectors after the chunk only where first_walked).
    uint4 xr[V + 2], dyr[V + 1];
    const bool before = kQ > 0 && lane >= 32 - kQ;
    const int64_t t_before = c0 - (32 - lane) * N;
    LoadBackwardChunk<T, kQ>(a, xrow, dyrow, b, d, c0, L, lane, before, t_before, first_walked, xr, dyr);
    // kSeq: bit j of tap_plain / dx_plain: warp step j of the chunk (j == V:
    // the next chunk's first) has every word set (past the row: set)
    uint32_t tap_plain = ~0u, dx_plain = ~0u;
    // kSeq: vector j's words at wv + 32 j (p0 / N without a signed division)
    const uint64_t wv = kSeq ? sw.ChunkVector(b, ci, V, lane) : 0;
    if constexpr (kSeq) {
      const int64_t st = ci * V + (lane < V ? lane : V);
      const uint32_t bits = st < sw.nsteps ? sw.plain[b * sw.nsteps + st] : 3u;
      tap_plain = __ballot_sync(kFullMask, bits & 1) & ((2u << V) - 1);
      dx_plain = __ballot_sync(kFullMask, bits & 2) & ((1u << V) - 1);
    }

    // g of vector j (j == V: the vector after the chunk, lanes < kQ; asked
    // only in the span's last chunk), and for j < V this vector's share of
    // dweight/dbias. Every lane calls it.
    auto computed_g = [&](int j, float (&g)[N]) {
      float cur[N], h[kHs], dyv[N];
      UnpackWithHalo<T, N, kH, kWords>(xr[j + 1], xr[j], lane, cur, h);
      Unpack<T, N, kWords>(dyr[j], dyv);
      const int64_t p0 = c0 + int64_t(j * 32 + lane) * N;
      const bool dead = p0 >= L || (j == V && lane >= kQ);
#pragma unroll
      for (int n = 0; n < N; ++n) g[n] = 0.f;
      if (dead) return;
      float win[kH + N];  // win[i] is the input at step p0 - kH + i
      InputWindow<N, kH>(h, cur, win);
      if (kSeq && !((tap_plain >> j) & 1)) {
        const Word mj = static_cast<const Word*>(sw.tap)[wv + j * 32];
        return MaskedGrad<N, kH>(w, win, dyv, bias, silu, mj, j < V, g, part);
      }
      // g and the dweight/dbias shares over the taps present
#pragma unroll
      for (int n = 0; n < N; ++n) {
        g[n] = silu ? ActGrad(TapSum(w, win, n, bias), dyv[n], true) : dyv[n];
        if (j < V) {
#pragma unroll
          for (int k = 0; k < kW; ++k)
            part[k] += g[n] * win[n + k];
          part[kW] += g[n];
        }
      }
    };
    // computed_g, but the vector after the chunk handed over: g_after is
    // g_of(0) of chunk ci + 1, walked just before (the walk asks g_of(V)
    // first and g_of(0) last). Lanes >= kQ carry their own vector 0's g
    // there, not zeros: RightHalo reads `next` only from lanes < kQ.
    auto g_of = [&](int j, float (&g)[N]) {
      if (j == V && !first_walked) {
#pragma unroll
        for (int n = 0; n < N; ++n) g[n] = g_after[n];
        return;
      }
      computed_g(j, g);
      if (j == 0) {
#pragma unroll
        for (int n = 0; n < N; ++n) g_after[n] = g[n];
      }
    };

    WalkGradVectors<N, kH, V, true>(lane, g_of, [&](int j, const float(&gcur)[N], const float(&r)[kHs]) {
      const int64_t p0 = c0 + int64_t(j * 32 + lane) * N;
      if (p0 < L) {
        float gw[N + kH];  // gw[i] is g at step p0 + i
        GradWindow<N, kH>(gcur, r, gw);
        float dx[N];
        if (kSeq && !((dx_plain >> j) & 1)) {
          const Word mj = static_cast<const Word*>(sw.dx)[wv + j * 32];
          MaskedDx<N, kH, false>(w, gw, mj, dx);
        } else {
#pragma unroll
          for (int n = 0; n < N; ++n) {
            float acc = 0.f;
#pragma unroll
            for (int k = 0; k < kW; ++k)  // tap k of output p + kH - k reads this input
              acc += w[k] * gw[n + kH - k];
            dx[n] = acc;
          }
        }
        StoreVec<T, N>(dxrow + p0, dx);
      }
    });
  }

  // Warp reduction, then lane k writes tap k's partial.
  StoreSpanPartial<kW>(a, ws, b, d, spans_per_row, pl.first_chunk / chunks_per_span, lane,
                       WarpTapSums<kW>(part, lane));
}

// The kernel's static shared memory: the warps' mask words (each lane
// reads back only its own: no barrier) and taps.
template <typename T, int kW>
struct BwdIdsShared {
  using Masks = ChunkMasks<Stream<T>::kN, kW - 1, Stream<T>::kVecs, true>;
  typename Masks::Word tap[kStreamWarps][Masks::kG][32], dx[kStreamWarps][Stream<T>::kVecs][32];
  IdTaps<kW> taps[kStreamWarps];
};

// seq_idx at W <= 16 (W == kW) with the ids shared by kIdChannels channels a warp
// (stream_ids.cuh): the mask words of one chunk (a span is one chunk) are made
// once; then each channel runs BwdStreamKernel's pass, a warp step whose
// words are not all set through selects, and writes its partial
// dweight/dbias to ws as BwdStreamKernel does.
// Each channel's chunk is staged (BackwardStage, cp.async) while the
// channel before it runs.
// (Blocks an SM asked of the compiler: 4. Unbounded it takes all 255
// registers at some widths, for 2 blocks. With the staged vectors read as
// the walk needs them (StagedX, st.dy), 4 blocks' 128 registers leave no
// spill at 16 bits, at most 12 bytes at float32 W 12..14; 16-bit W 9..16
// use 48-54 KB of shared memory a block (past 48 KiB from W 12, raised by
// LaunchWithSmem). 5 blocks measured slower at W <= 4 in the eleventh
// session, and mixed at W <= 8 in the twenty-first: slower at W 4 and at
// float32 W 8, slightly faster at bf16 W 2, 3, 7, 8 (docs/performance-log.md).)
template <typename T, int kW>
__global__ void __launch_bounds__(kStreamThreads, 4)
    BwdStreamIdsKernel(const ConvArgs a, int64_t spans_per_row, float* ws) {
  using S = Stream<T>;
  constexpr int N = S::kN, V = S::kVecs, kH = kW - 1, kHs = kH > 0 ? kH : 1;
  constexpr bool kWords = UnpackByWords<StreamPass::kBackwardIds>(kW);
  constexpr int kQ = (kH + N - 1) / N;  // lanes a halo reaches
  static_assert(kW >= 1 && kW <= 16, "launched at W == kW (WithExactWidth16): the taps are read kW a row");
  const IdPlace pl = LocateIdStream(a, spans_per_row);
  if (!pl.live) return;  // whole warps
  const int lane = threadIdx.x & 31;
  const int64_t L = a.len, c0 = pl.span * S::kChunk, b = pl.b;
  const int32_t hist = HistoryId(a, b);
  const bool before = kQ > 0 && lane >= 32 - kQ;
  const int64_t t_before = c0 - (32 - lane) * N;
  const int warp = threadIdx.x >> 5;
  // Channel ch's chunk is copied into the warp's staging buffer ch % 2
  // (dynamic shared memory: 2 BackwardStage a warp); channel 0's while the
  // masks are made.
  extern __shared__ uint4 stage_mem[];
  BackwardStage<T>* stages = reinterpret_cast<BackwardStage<T>*>(stage_mem) + 2 * warp;
  auto stage = [&](int ch) {
    const int64_t d = pl.d0 + ch;
    StageBackwardChunk<T, kQ>(a, static_cast<const T*>(a.x) + a.x_layout().At(b, d, 0),
                              static_cast<const T*>(a.dy) + a.io_layout().At(b, d, 0), b, d, c0, lane, before,
                              t_before, stages[ch & 1]);
  };
  stage(0);
  // The words wait in shared memory while the channels run, plain bits in
  // registers.
  using Sh = BwdIdsShared<T, kW>;
  using Masks = typename Sh::Masks;
  using Word = typename Masks::Word;
  __shared__ Sh sh;
  uint32_t tap_plain, dx_plain, after_taps;
  float tap_share[IdTaps<kW>::kPerLane];
  if constexpr (IdTapsEarly<T>(kW)) LoadIdTaps<kW>(a, b, pl.d0, lane, tap_share);
  {
    Masks m;
    LoadChunkMasks(a, b, c0, hist, lane, m);
#pragma unroll
    for (int j = 0; j < Masks::kG; ++j) sh.tap[warp][j][lane] = m.tap[j];
#pragma unroll
    for (int j = 0; j < V; ++j) sh.dx[warp][j][lane] = m.dx[j];
    tap_plain = m.tap_plain, dx_plain = m.dx_plain;
    after_taps = AfterStepTaps(m, lane);
  }
  const Word(&my_tap)[Masks::kG][32] = sh.tap[warp];
  const Word(&my_dx)[V][32] = sh.dx[warp];
  IdTaps<kW>& my_taps = sh.taps[warp];
  if constexpr (!IdTapsEarly<T>(kW)) LoadIdTaps<kW>(a, b, pl.d0, lane, tap_share);
  StoreIdTaps(tap_share, lane, my_taps);
  const bool silu = a.act == Activation::kSilu;
  const int64_t part = b * spans_per_row + pl.span;  // (BwdStreamKernel's grp * nparts + partidx)

#pragma unroll 1  // (one channel's vectors in registers at a time)
  for (int ch = 0; ch < kIdChannels; ++ch) {
    const int64_t d = pl.d0 + ch;
    if (d >= a.dim) break;  // (warp-uniform)
    T* dxrow = static_cast<T*>(a.dx) + a.io_layout().At(b, d, 0);
    __syncwarp();  // (the channel before read this buffer across lanes: g_after)
    if (ch + 1 < kIdChannels && d + 1 < a.dim) {
      stage(ch + 1);
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncwarp();  // (every lane's copies landed: g_after reads across lanes)
    const BackwardStage<T>& st = stages[ch & 1];
    float w[kW];
    const float bias = IdChannelTaps(my_taps, ch, w);
    float sums[kW + 1] = {};  // partial dweight and dbias (index kW)

    // g of the vector after the chunk (lanes < kQ; only its first kH steps
    // are read): lane l < kH works out step c_end + l alone, from the staged
    // steps around the chunk's end, and lanes < kQ gather their N. One
    // output a lane, where the vector's own pass would take N on every lane.
    auto g_after = [&](float (&g)[N]) {
      float one = 0.f;
      if (lane < kH && c0 + S::kChunk + lane < L && ((after_taps >> kW) & 1)) {
        float acc = bias;
        if ((tap_plain >> V) & 1) {  // (TapSum's order)
#pragma unroll
          for (int k = 0; k < kW; ++k) acc = fmaf(w[k], StagedXAt(st, lane - kH + k), acc);
        } else {  // (MaskedTapSum's)
          acc = fmaf(w[kH], StagedXAt(st, lane), acc);
#pragma unroll
          for (int k = 0; k < kH; ++k)
            acc = (after_taps >> k) & 1 ? fmaf(w[k], StagedXAt(st, lane - kH + k), acc) : acc;
        }
        const float dy = StagedDyAfter(st, lane);
        one = silu ? ActGrad(acc, dy, true) : dy;
      }
#pragma unroll
      for (int n = 0; n < N; ++n) g[n] = __shfl_sync(kFullMask, one, (lane * N + n) & 31);
    };

    // g of vector j (j == V: g_after) and for j < V its share of
    // dweight/dbias. Every lane calls it.
    auto g_of = [&](int j, float (&g)[N]) {
      if (j == V) return g_after(g);
      float cur[N], h[kHs], dyv[N];
      UnpackWithHalo<T, N, kH, kWords>(StagedX<T, kQ>(st, lane, j + 1), StagedX<T, kQ>(st, lane, j), lane, cur,
                                       h);
      Unpack<T, N, kWords>(st.dy[j][lane], dyv);
      const int64_t p0 = c0 + int64_t(j * 32 + lane) * N;
#pragma unroll
      for (int n = 0; n < N; ++n) g[n] = 0.f;
      if (p0 >= L || (j == V && lane >= kQ)) return;
      float win[kH + N];  // win[i] is the input at step p0 - kH + i
      InputWindow<N, kH>(h, cur, win);
      if ((tap_plain >> j) & 1) {
#pragma unroll
        for (int n = 0; n < N; ++n) {
          g[n] = silu ? ActGrad(TapSum(w, win, n, bias), dyv[n], true) : dyv[n];
          if (j < V) {
#pragma unroll
            for (int k = 0; k < kW; ++k) sums[k] += g[n] * win[n + k];
            sums[kW] += g[n];
          }
        }
      } else {
        MaskedGrad<N, kH>(w, win, dyv, bias, silu, my_tap[j][lane], j < V, g, sums);
      }
    };

    WalkGradVectors<N, kH, V>(lane, g_of, [&](int j, const float(&gcur)[N], const float(&r)[kHs]) {
      const int64_t p0 = c0 + int64_t(j * 32 + lane) * N;
      if (p0 < L) {
        float gw[N + kH];  // gw[i] is g at step p0 + i
        GradWindow<N, kH>(gcur, r, gw);
        // dx[n] = sum over the outputs that take input n (output n + kH - k
        // by its tap k) of their own sequence; padding inputs 0
        float dx[N];
        const Word& mj = my_dx[j][lane];
        if ((dx_plain >> j) & 1)  // (two call sites: the plain one has no test)
          MaskedDx<N, kH, true>(w, gw, mj, dx);
        else
          MaskedDx<N, kH, false>(w, gw, mj, dx);
        StoreVec<T, N>(dxrow + p0, dx);
      }
    });

    const float mine = WarpTapSums<kW>(sums, lane);
    if (lane <= kW) ws[(part * a.dim + d) * (kW + 1) + lane] = mine;
  }
}

template <typename T, int kW>
cudaError_t LaunchBwdStream(const ConvArgs& a, const BackwardPlan& p, float* ws, cudaStream_t stream) {
  BwdStreamKernel<T, kW, false><<<unsigned(StreamBlocks(a, p.nchunk)), kStreamThreads, 0, stream>>>(
      a, p.nchunk, int(p.chunks_per_span), ws, SeqWords{});
  return cudaGetLastError();
}

// seq_idx with the words made first (p.seq_words), in the workspace after
// the partial sums (SeqWordsBytes, csrc/problem.h)
template <typename T, int kW>
cudaError_t LaunchBwdStreamWords(const ConvArgs& a, const BackwardPlan& p, float* ws, cudaStream_t stream) {
  const int64_t partial = BackwardPartialFloats(a, p);
  SeqWords sw;
  const cudaError_t err = MakeSeqWords<T, kW, true>(
      a, ws + partial, BackwardWorkspaceBytes(a.batch, a.dim, a.len, a.width) - 4 * partial, stream, &sw);
  if (err != cudaSuccess) return err;
  BwdStreamKernel<T, kW, true><<<unsigned(StreamBlocks(a, p.nchunk)), kStreamThreads, 0, stream>>>(
      a, p.nchunk, int(p.chunks_per_span), ws, sw);
  return cudaGetLastError();
}

// seq_idx (the plan gave one chunk a span)
template <typename T, int kW>
cudaError_t LaunchBwdStreamIds(const ConvArgs& a, const BackwardPlan& p, float* ws, cudaStream_t stream) {
  return LaunchWithSmem(BwdStreamIdsKernel<T, kW>, IdStreamBlocks(a, p.nchunk), kStreamThreads,
                        2 * kStreamWarps * sizeof(BackwardStage<T>), sizeof(BwdIdsShared<T, kW>), stream, a,
                        p.nchunk, ws);
}

template <typename T>
cudaError_t LaunchT(const ConvArgs& a, const BackwardPlan& p, float* ws, cudaStream_t stream) {
  return WithExactWidth16(int(a.width), [&](auto w) {
    constexpr int kW = decltype(w)::value;
    if (a.mode != SegmentMode::kSeqIdx) return LaunchBwdStream<T, kW>(a, p, ws, stream);
    if (p.seq_words) return LaunchBwdStreamWords<T, kW>(a, p, ws, stream);
    return LaunchBwdStreamIds<T, kW>(a, p, ws, stream);
  });
}

}  // namespace

cudaError_t BackwardStream(const ConvArgs& a, const BackwardPlan& p, float* ws, cudaStream_t stream) {
  return WithFloatType(a.x_dtype, cudaErrorNotSupported,
                       [&](auto t) { return LaunchT<decltype(t)>(a, p, ws, stream); });
}

}  // namespace jcc::cuda
