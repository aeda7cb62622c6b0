// Streaming forward for channels-first rows of whole aligned 16-byte
// vectors (see stream.cuh): each thread loads its kVecs vectors of x (and of
// the residual) at once, plus the vector before the chunk when its halo
// reaches there, gets the kW - 1 inputs before each vector from the lanes
// behind by shuffles, and writes kVecs vectors of y. Every byte of x and y
// moves once, fully coalesced. seq_idx (W <= 16): FwdStreamIdsKernel below
// (stream_ids.cuh), or (dispatch.cu's SeqWordsForward) this kernel reading
// mask words that seq_words.cuh's pre-pass makes once a row.
#include "launchers.h"
#include "seq_words.cuh"
#include "stream.cuh"
#include "stream_ids.cuh"

namespace jcc::cuda {
namespace {

// kWalk (spans of more than one chunk, dispatch.cu's ForwardSpanChunks):
// the warp walks chunks_per_span chunks, its setup paid once; the vector
// before each later chunk is the last one of the chunk before.
// (Blocks an SM asked of the compiler, walking: 6, where the 16-bit W 9..16
// took 116-118 registers unbounded, 4 blocks, and fit 6 blocks' 80 with no
// spill to W 14 (a few bytes at 15, 16) and measured faster; float32 W
// 9..16 keeps 4, where 6 was level or slower: docs/performance-log.md,
// twenty-second session.)
// kSeq (walking): seq_idx, each vector's tap word read from `sw`
// (seq_words.cuh), the masked sum of stream_ids.cuh where a warp step's words
// are not all set.
template <typename T, int kW, bool kWalk, bool kSeq>
__global__ void __launch_bounds__(kStreamThreads, !kWalk ? 0 : kW <= 8 || sizeof(T) == 2 ? 6 : 4)
    FwdStreamKernel(const ConvArgs a, int64_t spans_per_row, int chunks_per_span, SeqWords sw) {
  using S = Stream<T>;
  constexpr int N = S::kN, V = S::kVecs, kH = kW - 1, kHs = kH > 0 ? kH : 1;
  using Word = typename IdMask<N, kH>::Word;
  static_assert(kWalk || !kSeq, "the words forward walks (a span of one chunk is a walk of one)");
  constexpr bool kWords = UnpackByWords<StreamPass::kForward>(kW);
  constexpr int kQ = (kH + N - 1) / N;  // lanes back a halo reaches
  const StreamPlace pl = LocateStream(a, spans_per_row, kWalk ? chunks_per_span : 1);
  if (!pl.live) return;  // whole warps
  const int lane = threadIdx.x & 31;
  const int64_t L = a.len, b = pl.b, d = pl.d;
  const T* xrow = static_cast<const T*>(a.x) + a.x_layout().At(b, d, 0);
  const int64_t row = a.io_layout().At(b, d, 0);
  const int64_t chunk_end = kWalk ? Min64(CeilDiv(L, int64_t(S::kChunk)), pl.first_chunk + chunks_per_span) : 0;

  // xr[j + 1] = vector j of the chunk, xr[0] = the vector before it (lanes
  // whose halo reaches there; kWalk: after the span's first chunk, the last
  // vector of the chunk before). The taps are loaded with the first chunk.
  uint4 xr[V + 1], rr[V];
  float w[kW], bias = 0.f;
  bool head = true;  // the span's first chunk
  int64_t ci = pl.first_chunk;
  do {
    const int64_t c0 = ci * S::kChunk;
    // All loads first.
    const uint4 zero = make_uint4(0, 0, 0, 0);
    const bool before = kQ > 0 && lane >= 32 - kQ;
    const int64_t t_before = c0 - (32 - lane) * N;
    if (head) xr[0] = before ? LoadVectorBefore<T>(a, xrow, b, d, t_before) : zero;
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int64_t t = c0 + int64_t(j * 32 + lane) * N;
      xr[j + 1] = t < L ? LoadRaw16(xrow + t) : zero;
    }
    const T* res = a.residual ? static_cast<const T*>(a.residual) + row : nullptr;
    if (res) {
#pragma unroll
      for (int j = 0; j < V; ++j) {
        const int64_t t = c0 + int64_t(j * 32 + lane) * N;
        rr[j] = t < L ? LoadRaw16(res + t) : zero;
      }
    }
    if (head) bias = LoadStreamTaps<kW>(a, b, d, w);
    const bool silu = a.act == Activation::kSilu;
    T* yrow = static_cast<T*>(a.y) + row;
    // kSeq: bit j of tap_plain: warp step j of the chunk has every tap word
    // set (past the row: set); vector j's word at wv + 32 j
    uint32_t tap_plain = ~0u;
    const uint64_t wv = kSeq ? sw.ChunkVector(b, ci, V, lane) : 0;
    if constexpr (kSeq) {
      const int64_t st = ci * V + lane;
      tap_plain = __ballot_sync(kFullMask, lane >= V || st >= sw.nsteps || (sw.plain[b * sw.nsteps + st] & 1));
    }

#pragma unroll
    for (int j = 0; j < V; ++j) {
      float cur[N], h[kHs];
      UnpackWithHalo<T, N, kH, kWords>(xr[j + 1], xr[j], lane, cur, h);  // (every lane: shuffles)
      const int64_t p0 = c0 + int64_t(j * 32 + lane) * N;
      float win[kH + N];  // win[i] is the input at step p0 - kH + i
      InputWindow<N, kH>(h, cur, win);
      if (p0 >= L) continue;
      float out[N];
      if (kSeq && !((tap_plain >> j) & 1)) {
        MaskedOutputs<N, kH>(w, win, static_cast<const Word*>(sw.tap)[wv + j * 32], bias, silu, out);
      } else {
#pragma unroll
        for (int n = 0; n < N; ++n) out[n] = Activate(TapSum(w, win, n, bias), silu);
      }
      if (res) AddResidual<T, N, kWords>(rr[j], out);
      StoreVec<T, N>(yrow + p0, out);
    }
    if constexpr (kWalk) xr[0] = xr[V];
    head = false;
  } while (kWalk && ++ci < chunk_end);
}

// The shared-ids forward's static shared memory (the warps' taps).
template <int kW>
using FwdIdsShared = IdTaps<kW>[kStreamWarps];

// Whether the shared-ids forward reads its staged x vectors from shared
// memory as the walk needs them, not all into registers first: only at
// W 9..12 (float32 9..11), where the registers that frees buy a fifth block
// an SM. Elsewhere it would read each vector twice (as itself, then as the
// next one's halo) and gain no block.
template <typename T, int kW>
__host__ __device__ constexpr bool FwdIdsReadsLazily() {
  return kW > 8 && kW <= (sizeof(T) == 2 ? 12 : 11);
}

// (Blocks an SM asked of the compiler: without a bound it takes registers
// that leave room for 4; from W = 5 on the mask words need more than 6
// blocks' share without spilling. 5 at W 9..12 with the lazy reads (no
// spill; 16-bit W 13..16 would spill 4-28 bytes at 5); 4 past those.)
template <typename T, int kW>
__global__ void __launch_bounds__(kStreamThreads, kW <= 4 ? 6 : kW <= 8 || FwdIdsReadsLazily<T, kW>() ? 5 : 4)
    FwdStreamIdsKernel(const ConvArgs a, int64_t spans_per_row) {
  using S = Stream<T>;
  constexpr int N = S::kN, V = S::kVecs, kH = kW - 1, kHs = kH > 0 ? kH : 1;
  constexpr bool kLazy = FwdIdsReadsLazily<T, kW>();
  constexpr bool kWords = UnpackByWords<StreamPass::kForwardIds>(kW);
  constexpr int kQ = (kH + N - 1) / N;  // lanes back a halo reaches
  static_assert(kW >= 1 && kW <= 16, "launched at W == kW (WithExactWidth16): the taps are read kW a row");
  const IdPlace pl = LocateIdStream(a, spans_per_row);
  if (!pl.live) return;  // whole warps
  const int lane = threadIdx.x & 31;
  const int64_t L = a.len, c0 = pl.span * S::kChunk, b = pl.b, d0 = pl.d0;
  const int32_t hist = HistoryId(a, b);
  const bool before = kQ > 0 && lane >= 32 - kQ;
  const int64_t t_before = c0 - (32 - lane) * N;
  // Channel ch's x chunk is copied into the warp's staging buffer ch % 2
  // (dynamic shared memory: 2 ForwardStage a warp); channel 0's while the
  // masks are made.
  extern __shared__ uint4 stage_mem[];
  ForwardStage<T>* stages = reinterpret_cast<ForwardStage<T>*>(stage_mem) + 2 * (threadIdx.x >> 5);
  auto stage = [&](int ch) {
    const int64_t d = d0 + ch;
    StageForwardChunk<T>(a, static_cast<const T*>(a.x) + a.x_layout().At(b, d, 0), b, d, c0, lane, before,
                         t_before, stages[ch & 1]);
  };
  stage(0);
  float tap_share[IdTaps<kW>::kPerLane];
  if constexpr (IdTapsEarly<T>(kW)) LoadIdTaps<kW>(a, b, d0, lane, tap_share);
  ChunkMasks<N, kH, V, false> m;
  LoadChunkMasks(a, b, c0, hist, lane, m);
  __shared__ FwdIdsShared<kW> taps;
  IdTaps<kW>& my_taps = taps[threadIdx.x >> 5];
  if constexpr (!IdTapsEarly<T>(kW)) LoadIdTaps<kW>(a, b, d0, lane, tap_share);
  StoreIdTaps(tap_share, lane, my_taps);

  const bool silu = a.act == Activation::kSilu;
  const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll 1  // (one channel's vectors in registers at a time)
  for (int ch = 0; ch < kIdChannels; ++ch) {
    const int64_t d = d0 + ch;
    if (d >= a.dim) break;  // (warp-uniform)
    const int64_t row = a.io_layout().At(b, d, 0);
    const T* res = a.residual ? static_cast<const T*>(a.residual) + row : nullptr;
    T* yrow = static_cast<T*>(a.y) + row;
    uint4 xr[kLazy ? 1 : V + 1], rr[V];
    if (ch + 1 < kIdChannels && d + 1 < a.dim) {
      stage(ch + 1);
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    // x vector i - 1 of the chunk (i = 0: the one before it), from the
    // staged slots: copied into xr now, or read there as the walk needs it
    const ForwardStage<T>& st = stages[ch & 1];
    auto staged = [&](int i) { return i > 0 ? st.x[i - 1][lane] : before ? st.x[V][lane] : zero; };
    if constexpr (!kLazy) {
#pragma unroll
      for (int i = 0; i <= V; ++i) xr[i] = staged(i);
    }
    auto xv = [&](int i) {
      if constexpr (kLazy) {
        return staged(i);
      } else {
        return xr[i];
      }
    };
#pragma unroll
    for (int j = 0; j < V; ++j) {
      const int64_t t = c0 + int64_t(j * 32 + lane) * N;
      rr[j] = res && t < L ? LoadRaw16(res + t) : zero;
    }
    float w[kW];
    const float bias = IdChannelTaps(my_taps, ch, w);
#pragma unroll
    for (int j = 0; j < V; ++j) {
      float cur[N], h[kHs];
      UnpackWithHalo<T, N, kH, kWords>(xv(j + 1), xv(j), lane, cur, h);  // (every lane: shuffles)
      const int64_t p0 = c0 + int64_t(j * 32 + lane) * N;
      if (p0 >= L) continue;
      float win[kH + N];  // win[i] is the input at step p0 - kH + i
      InputWindow<N, kH>(h, cur, win);
      float out[N];
      if ((m.tap_plain >> j) & 1) {
#pragma unroll
        for (int n = 0; n < N; ++n) out[n] = Activate(TapSum(w, win, n, bias), silu);
      } else {
        MaskedOutputs<N, kH>(w, win, m.tap[j], bias, silu, out);
      }
      if (res) AddResidual<T, N, kWords>(rr[j], out);
      StoreVec<T, N>(yrow + p0, out);
    }
  }
}

template <typename T, int kW>
cudaError_t LaunchStream(const ConvArgs& a, const ForwardPlan& p, cudaStream_t stream) {
  const int64_t spans = p.spans_per_row;
  const int chunks = int(p.chunks_per_span);
  (chunks > 1 ? FwdStreamKernel<T, kW, true, false> : FwdStreamKernel<T, kW, false, false>)
      <<<unsigned(StreamBlocks(a, spans)), kStreamThreads, 0, stream>>>(a, spans, chunks, SeqWords{});
  return cudaGetLastError();
}

// seq_idx with the words made first (p.seq_words), in the workspace
template <typename T, int kW>
cudaError_t LaunchStreamWords(const ConvArgs& a, const ForwardPlan& p, void* ws, int64_t ws_bytes,
                              cudaStream_t stream) {
  SeqWords sw;
  const cudaError_t err = MakeSeqWords<T, kW, false>(a, ws, ws_bytes, stream, &sw);
  if (err != cudaSuccess) return err;
  FwdStreamKernel<T, kW, true, true><<<unsigned(StreamBlocks(a, p.spans_per_row)), kStreamThreads, 0, stream>>>(
      a, p.spans_per_row, int(p.chunks_per_span), sw);
  return cudaGetLastError();
}

// seq_idx (the plan gave one chunk a span)
template <typename T, int kW>
cudaError_t LaunchStreamIds(const ConvArgs& a, const ForwardPlan& p, cudaStream_t stream) {
  return LaunchWithSmem(FwdStreamIdsKernel<T, kW>, IdStreamBlocks(a, p.spans_per_row), kStreamThreads,
                        2 * kStreamWarps * sizeof(ForwardStage<T>), sizeof(FwdIdsShared<kW>), stream, a,
                        p.spans_per_row);
}

template <typename T>
cudaError_t LaunchT(const ConvArgs& a, const ForwardPlan& p, void* ws, int64_t ws_bytes, cudaStream_t stream) {
  return WithExactWidth16(int(a.width), [&](auto w) {
    constexpr int kW = decltype(w)::value;
    if (a.mode != SegmentMode::kSeqIdx) return LaunchStream<T, kW>(a, p, stream);
    if (p.seq_words) return LaunchStreamWords<T, kW>(a, p, ws, ws_bytes, stream);
    return LaunchStreamIds<T, kW>(a, p, stream);
  });
}

}  // namespace

int64_t StreamSpans(const ConvArgs& a, int64_t max_chunks_per_span, int64_t* chunks_per_span) {
  const int64_t steps = a.x_dtype == DType::kF32 ? Stream<float>::kChunk : Stream<__half>::kChunk;
  const int64_t per_row = CeilDiv(a.len, steps);
  const int64_t k = ChunksPerSpan(per_row, a.batch * a.dim, max_chunks_per_span);
  *chunks_per_span = k;
  const int64_t spans = CeilDiv(per_row, k);
  return StreamBlocks(a, spans) <= INT32_MAX ? spans : 0;
}

cudaError_t ForwardStream(const ConvArgs& a, const ForwardPlan& p, void* ws, int64_t ws_bytes,
                          cudaStream_t stream) {
  return WithFloatType(a.x_dtype, cudaErrorNotSupported,
                       [&](auto t) { return LaunchT<decltype(t)>(a, p, ws, ws_bytes, stream); });
}

}  // namespace jcc::cuda
