// The channels-first seq_idx backward's fix (BackwardPlan::seq_fix): after
// BwdStreamKernel<.., kSeqFixRows> ran a row's dense pass, a warp per
// (row, channel, span) recomputes exactly the vectors of its span with the
// fix bit (seq_words.cuh's SeqWords: those near an id change or holding
// padding, whose dx the dense pass did not write and whose dweight / dbias
// shares it left out), a vector a lane: g of the vector's outputs and of
// the kH after them over the taps of each output's own id (a select of the
// sum, as the masked paths: no input of another id reaches it), the
// vector's shares, and dx over the outputs of each input's id. The warp's
// shares are added to the span's partial sums (the dense pass stored them:
// one writer each, in stream order, so the sums keep their fixed order).
#pragma once

#include "seq_fix.cuh"
#include "seq_words.cuh"
#include "stream.cuh"

namespace jcc::cuda {

// Lane's vector with its first step p0 (a fix bit's): dx written, its
// shares of dweight (part[0 .. kW - 1]) and dbias (part[kW]) added.
template <typename T, int kW>
__device__ __forceinline__ void FixStreamVector(const ConvArgs& a, const BackwardRows<T>& rows, int64_t b,
                                                int64_t d, int64_t p0, const float (&w)[kW], float bias,
                                                int32_t hist, float (&part)[kW + 1]) {
  constexpr int N = Stream<T>::kN, kH = kW - 1, M = N + 2 * kH, G = N + kH;
  const int64_t L = a.len;
  const bool silu = a.act == Activation::kSilu;
  constexpr int kB = (kH + N - 1) / N;  // whole vectors the window reaches on each side
  float xv[M];    // xv[i], iv[i]: input p0 - kH + i and its id
  int32_t iv[M];  // (before step 0: the initial states or zeros, HistoryId; past the end: 0, kNoId)
  float dyv[G];   // dy of output p0 + u (past the end: 0)
  if (p0 >= kB * N && p0 + (kB + 1) * N <= L) {  // inside the row: whole vectors, no tests
    const int32_t* ids = a.seq_idx + b * L + p0 - kH;
#pragma unroll
    for (int i = 0; i < M; ++i) iv[i] = ids[i];
#pragma unroll
    for (int j = -kB; j <= kB; ++j) {
      float v[N];
      Unpack<T, N>(LoadRaw16(rows.x + p0 + j * N), v);
#pragma unroll
      for (int n = 0; n < N; ++n)
        if (j * N + n + kH >= 0 && j * N + n + kH < M) xv[j * N + n + kH] = v[n];
      if (j >= 0) {
        Unpack<T, N>(LoadRaw16(rows.dy + p0 + j * N), v);
#pragma unroll
        for (int n = 0; n < N; ++n)
          if (j * N + n < G) dyv[j * N + n] = v[n];
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < M; ++i) {
      const int64_t p = p0 - kH + i;
      iv[i] = IdAt(a, b, p, hist);
      xv[i] = p < 0 ? (a.initial_states ? LoadState<T>(a, a.initial_states, b, d, p + kH) : 0.f)
                    : p < L ? ToF(rows.x[p]) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < G; ++u) dyv[u] = p0 + u < L ? ToF(rows.dy[p0 + u]) : 0.f;
  }
  float g[G];  // g[u]: g of output p0 + u (padding, past the end: 0)
#pragma unroll
  for (int u = 0; u < G; ++u) {
    const int32_t id = iv[u + kH];
    float acc = bias;
#pragma unroll
    for (int k = 0; k < kW; ++k) acc = iv[u + k] == id ? fmaf(w[k], xv[u + k], acc) : acc;
    const bool live = p0 + u < L && id >= 0;
    g[u] = live ? (silu ? ActGrad(acc, dyv[u], true) : dyv[u]) : 0.f;
  }
  float dx[N];
#pragma unroll
  for (int u = 0; u < N; ++u) {
    const int32_t id = iv[u + kH];  // input p0 + u's, and output p0 + u's
    if (id >= 0) {  // (padding and past the end: no share; their g is 0, their inputs may not be finite)
#pragma unroll
      for (int k = 0; k < kW; ++k) part[k] = iv[u + k] == id ? fmaf(g[u], xv[u + k], part[k]) : part[k];
      part[kW] += g[u];
    }
    float acc = 0.f;
#pragma unroll
    for (int k = 0; k < kW; ++k)  // output p0 + u + kH - k by its tap k
      acc = iv[u + 2 * kH - k] == id ? fmaf(w[k], g[u + kH - k], acc) : acc;
    dx[u] = id >= 0 ? acc : 0.f;
  }
  if (p0 + N <= L) {
    StoreVec<T, N>(rows.dx + p0, dx);
  } else {
#pragma unroll
    for (int u = 0; u < N; ++u)
      if (p0 + u < L) rows.dx[p0 + u] = FromF<T>(dx[u]);
  }
}

// Launched as BwdStreamKernel (the same plan, blocks and spans), after it.
template <typename T, int kW>
__global__ void __launch_bounds__(kStreamThreads)
    BwdStreamFixKernel(const ConvArgs a, int64_t spans_per_row, int chunks_per_span, float* ws, SeqWords sw) {
  using S = Stream<T>;
  constexpr int N = S::kN, V = S::kVecs;
  static_assert(4 * V <= 32, "a span's warp steps: a lane each (kMaxSpanChunks 4)");
  const StreamPlace pl = LocateStream(a, spans_per_row, chunks_per_span);
  if (!pl.live || sw.Heavy(pl.b)) return;  // whole warps
  const int lane = threadIdx.x & 31;
  const int64_t b = pl.b, d = pl.d, nchunks = CeilDiv(a.len, int64_t(S::kChunk));
  const int64_t s0 = pl.first_chunk * V;  // the span's first warp step
  const int ns = int((Min64(nchunks, pl.first_chunk + chunks_per_span) - pl.first_chunk) * V);
  // lane q < ns holds warp step s0 + q's fix word, and the fix bits up to it
  const uint32_t word = lane < ns ? sw.fix[b * sw.nsteps + s0 + lane] : 0u;
  int upto = __popc(word);
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int v = __shfl_up_sync(kFullMask, upto, off);
    if (lane >= off) upto += v;
  }
  const int total = __shfl_sync(kFullMask, upto, 31);
  if (total == 0) return;
  float w[kW];
  const float bias = LoadStreamTaps<kW>(a, b, d, w);
  const BackwardRows<T> rows(a, b, d);
  const int32_t hist = HistoryId(a, b);
  float part[kW + 1] = {};
  for (int first = 0; first < total; first += 32) {  // (warp-uniform)
    const int r = first + lane;  // the lane's fix bit, counted from the span's first
    int64_t v = -1;              // its vector in the row
    for (int q = 0; q < ns; ++q) {
      const int hi = __shfl_sync(kFullMask, upto, q);
      const uint32_t wq = __shfl_sync(kFullMask, word, q);
      const int lo = hi - __popc(wq);
      if (r >= lo && r < hi) v = (s0 + q) * 32 + int(__fns(wq, 0, r - lo + 1));
    }
    if (v >= 0) FixStreamVector<T, kW>(a, rows, b, d, v * N, w, bias, hist, part);
  }
  StoreSpanPartial<kW, true>(a, ws, b, d, spans_per_row, pl.first_chunk / chunks_per_span, lane,
                             WarpTapSums<kW>(part, lane));
}

}  // namespace jcc::cuda
