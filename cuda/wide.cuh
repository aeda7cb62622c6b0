// The wide families' work (W > 16 at a run-time width): the channels-first
// one (wide_cf.cuh: forward_wide.cu, backward_wide.cu) on rows of whole
// aligned 16-byte vectors (the streaming family's rows), the channels-last
// one (wide_cl.cuh) on block-staged rows of 8 channels; both run the
// per-warp work below on a window staged as described here.
//
// Channels-first, a block's kWideWarps warps take consecutive channels of
// one batch row over the same span of kWideSpan chunks (as in stream.cuh). Per chunk of
// kWideChunk steps from c0 a warp copies its window of x into its own
// shared memory (cp.async, the next chunk's copy in flight while it computes
// on this one) and writes it out as floats, staged index e = step - (c0 - H)
// + kWideR (the vectors' elements before the window land in the first run
// unchecked), so that lane l's outputs c0 + kWideR * l + j read the window
// of run l + 1: e = kWideR * (l + 1) + m, m < kWideR + H. Index e is stored at WideAt(e), 17
// slots per 16 steps: the lanes' reads fall in distinct banks, and within a
// window every offset is a compile-time constant past a per-lane base. Lane
// l keeps kWideR accumulators and takes the taps in groups of 8 over a
// sliding window of inputs in registers (8 new inputs and 8 taps, from
// shared memory, per 8 x kWideR multiply-adds). No block barrier: each warp
// owns its shared memory.
//
// seq_idx: the ids are staged beside x, once in the window's layout (idx)
// and once in the outputs' (ido: e = step - c0). A chunk whose window holds
// one live id takes the plain taps; otherwise each lane makes one masked
// pass, for the id s of its run's first live output (the window read with
// the inputs of other ids as zeros, the outputs of id s kept), and the few
// outputs of a run's other ids (the lane whose run holds an id change) are
// then summed by the whole warp, a pair of lanes an output (WidePasses).
#pragma once

#include "cp_async.cuh"
#include "stream.cuh"

namespace jcc::cuda {

constexpr int kWideWarps = kStreamWarps;      // warps (channels) per block
constexpr int kWideR = 16;                    // outputs per lane run
constexpr int kWideChunk = 32 * kWideR;       // steps per warp chunk
constexpr int kWideSpan = 8;                  // chunks per warp span (the backward's partial sums)
static_assert(kWideChunk * kWideSpan >= 4096, "BackwardChunkSteps of W > 16 (csrc/problem.h)");

__host__ __device__ constexpr int WideAt(int e) { return e + (e >> 4); }
__host__ __device__ constexpr int RoundUp(int n, int m) { return (n + m - 1) / m * m; }
// Words of a warp's staged taps (StageWideTaps).
__host__ __device__ constexpr int WideTapWords(int W, bool backward) { return RoundUp(W, 8) * (backward ? 2 : 1); }

// The taps of channel row (b, d) into taps[0..RoundUp(W, 8)) (zeros past
// W: whole 16-byte words for WideTaps), backward also reversed after them;
// its bias returned.
__device__ __forceinline__ float StageWideTaps(const ConvArgs& a, int64_t b, int64_t d, bool backward,
                                               float* taps) {
  const int W = int(a.width), lane = threadIdx.x & 31, rw = RoundUp(W, 8);
  const int64_t wrow = WeightRow(a, b, d);
  for (int k = lane; k < rw; k += 32) {
    taps[k] = k < W ? LoadAnyF(a.weight, a.w_dtype, wrow * W + k) : 0.f;
    if (backward) taps[rw + k] = k < W ? LoadAnyF(a.weight, a.w_dtype, wrow * W + W - 1 - k) : 0.f;
  }
  return a.bias ? LoadAnyF(a.bias, a.b_dtype, wrow) : 0.f;
}

// The staged value at slot p; kMasked: zero unless its id is s.
template <bool kMasked>
__device__ __forceinline__ float WideIn(const float* src, const int32_t* ids, int32_t s, int p) {
  const float v = src[p];
  if constexpr (kMasked) return ids[p] == s ? v : 0.f;
  return v;
}

// Walks run `run`'s window for the taps k < W in groups of 8: group(k, n,
// win) for the n (<= 8, less only for the last) taps from k, with win[i] =
// element k + i of the window (i < kWideR + 7, a sliding register window:
// 8 new elements per group, at compile-time offsets). The last group's
// window may reach past the staged elements it uses (WideSmem leaves room);
// its taps past W are skipped, never multiplied.
template <bool kMasked, typename Group>
__device__ __forceinline__ void WideWindow(const float* src, const int32_t* ids, int32_t s, int run, int W,
                                           Group&& group) {
  constexpr int kWin = kWideR + 7;
  float win[kWin];
  // element 16 kb + c (c < 32) at base + 17 kb + c + c / 16: constant offsets
  const int base = 17 * run;
  auto in = [&](int kb, int c) { return WideIn<kMasked>(src, ids, s, base + 17 * kb + c + (c >> 4)); };
  auto step = [&](int k, int kb, int h, int n) {  // the group of taps k = 16 kb + 8 h
    if (k == 0) {
#pragma unroll
      for (int q = 0; q < kWin; ++q) win[q] = in(0, q);
    } else {
#pragma unroll
      for (int q = 0; q < kWin - 8; ++q) win[q] = win[q + 8];
#pragma unroll
      for (int q = 0; q < 8; ++q) win[kWin - 8 + q] = in(kb, 8 * h + kWin - 8 + q);
    }
    group(k, n, win);
  };
  int k = 0, kb = 0;
  for (; k + 16 <= W; k += 16, ++kb) {
    step(k, kb, 0, 8);
    step(k + 8, kb, 1, 8);
  }
  if (k + 8 <= W) step(k, kb, 0, 8), k += 8;
  if (k < W) step(k, kb, (k & 8) >> 3, W - k);
}

// acc[j] += sum_{k < W} tap(k) * (element j + k of run's window), j <
// kWideR, with tap(k) = taps[k] (kReverse: the reversed copy, taps[W - 1
// - k]; StageWideTaps' layout), 8 taps in two 16-byte reads.
template <bool kMasked, bool kReverse>
__device__ __forceinline__ void WideTaps(const float* src, const int32_t* ids, int32_t s, int run,
                                         const float* taps, int W, float (&acc)[kWideR]) {
  const float* t = taps + (kReverse ? RoundUp(W, 8) : 0);
  WideWindow<kMasked>(src, ids, s, run, W, [&](int k, int n, const float (&win)[kWideR + 7]) {
    const float4 lo = *reinterpret_cast<const float4*>(t + k), hi = *reinterpret_cast<const float4*>(t + k + 4);
    const float tk[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      if (q >= n) break;
      const float wk = tk[q];
#pragma unroll
      for (int j = 0; j < kWideR; ++j) acc[j] += wk * win[j + q];
    }
  });
}

// A pass of pre-activations: out[j] = bias + the taps over run's window
// (masked: inputs of id s only), for the bits j of take.
template <bool kMasked>
__device__ __forceinline__ void WidePre(const float* xs, const int32_t* idx, int32_t s, bool masked,
                                        unsigned take, int run, const float* taps, int W, float bias,
                                        float (&out)[kWideR]) {
  float acc[kWideR];
#pragma unroll
  for (int j = 0; j < kWideR; ++j) acc[j] = bias;
  if (masked)
    WideTaps<kMasked, false>(xs, idx, s, run, taps, W, acc);
  else
    WideTaps<false, false>(xs, idx, s, run, taps, W, acc);
#pragma unroll
  for (int j = 0; j < kWideR; ++j)
    if ((take >> j) & 1) out[j] = acc[j];
}

// dst[lane / 4] += the warp's sum of v[lane / 4] for lane / 4 < n (lanes
// 0, 4, .., 28 add): the 8 sums by halving exchanges, 9 shuffles instead
// of 8 x 5.
__device__ __forceinline__ void AddWarpSums8(const float (&v)[8], float* dst, int n) {
  const int lane = threadIdx.x & 31;
  float u4[4], u2[2];
  bool hi = lane & 16;  // keeps sums 4..7, hands 0..3 to lane ^ 16
#pragma unroll
  for (int i = 0; i < 4; ++i)
    u4[i] = (hi ? v[i + 4] : v[i]) + __shfl_xor_sync(kFullMask, hi ? v[i] : v[i + 4], 16);
  hi = lane & 8;
#pragma unroll
  for (int i = 0; i < 2; ++i)
    u2[i] = (hi ? u4[i + 2] : u4[i]) + __shfl_xor_sync(kFullMask, hi ? u4[i] : u4[i + 2], 8);
  hi = lane & 4;
  float u = (hi ? u2[1] : u2[0]) + __shfl_xor_sync(kFullMask, hi ? u2[0] : u2[1], 4);
  u += __shfl_xor_sync(kFullMask, u, 2);
  u += __shfl_xor_sync(kFullMask, u, 1);
  if ((lane & 3) == 0 && (lane >> 2) < n) dst[lane >> 2] += u;
}

// dws[k] += the warp's sum over its lanes of sum_j g[j] * (element j + k
// of run's window), k < W: the dweight shares of the lanes' runs. Every
// lane calls it (shuffles).
template <bool kMasked>
__device__ __forceinline__ void WideDweight(const float* src, const int32_t* ids, int32_t s, int run,
                                            const float (&g)[kWideR], int W, float* dws) {
  WideWindow<kMasked>(src, ids, s, run, W, [&](int k, int n, const float (&win)[kWideR + 7]) {
    float part[8];
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      part[q] = 0.f;
      if (q >= n) continue;
#pragma unroll
      for (int j = 0; j < kWideR; ++j) part[q] += g[j] * win[j + q];
    }
    AddWarpSums8(part, dws + k, n);
  });
}

// A lane's run under seq_idx: one pass f(s, masked, take) for the id s of
// the run's first live output, `take` the outputs of id s (masked: inputs
// of other ids read as zeros); then the outputs of the run's other ids (a
// run that holds an id change: usually one lane a change) spread over the
// warp: left(L, bits) for each lane L with some, `bits` them, which every
// lane calls and in which lane j < kWideR takes output j of L's run (a
// second pass would cost the warp a whole pass for those few outputs). A
// clean chunk is one unmasked pass taking every output. `own(j)`: output
// j's id. Returns the bits of the live (non-padding) outputs. Every lane
// calls it: clean is warp-uniform.
template <typename Own, typename F, typename Left>
__device__ __forceinline__ unsigned WidePasses(bool clean, int32_t clean_id, Own own, F&& f, Left&& left) {
  if (clean) {
    f(clean_id, false, ~0u);
    return ~0u;
  }
  unsigned live = 0;
#pragma unroll
  for (int j = 0; j < kWideR; ++j) live |= own(j) >= 0 ? 1u << j : 0u;
  if (!__any_sync(kFullMask, live != 0)) return 0u;
  const int32_t s = live ? own(__ffs(live) - 1) : kNoId;
  unsigned take = 0;
#pragma unroll
  for (int j = 0; j < kWideR; ++j) take |= ((live >> j) & 1) && own(j) == s ? 1u << j : 0u;
  f(s, true, take);
  const unsigned rest = live & ~take;
  for (unsigned lanes = __ballot_sync(kFullMask, rest != 0); lanes != 0; lanes &= lanes - 1) {
    const int L = __ffs(lanes) - 1;
    left(L, __shfl_sync(kFullMask, rest, L));
  }
  return live;
}

// One output of a leftover (WidePasses), by a pair of lanes (j and j +
// 16, every lane calls): the sum over k < W of tap(k) * element e0 + k of
// a staged array (src, its ids alongside; WideAt layout) whose id is s,
// other ids' elements as zeros (WideIn's), plus `init`; the lower lane of
// the pair sums the even taps, the upper the odd ones. Lanes that take no
// output pass on = false. kReverse: the reversed taps (StageWideTaps').
template <bool kReverse>
__device__ __forceinline__ float WideMaskedSum(bool on, const float* src, const int32_t* ids, int32_t s, int e0,
                                               const float* taps, int W, float init) {
  const float* t = taps + (kReverse ? RoundUp(W, 8) : 0);
  const int h = (threadIdx.x >> 4) & 1;
  float acc = h == 0 ? init : 0.f;
  if (on) {
#pragma unroll 4
    for (int k = h; k < W; k += 2) {
      const int p = WideAt(e0 + k);
      acc = fmaf(t[k], ids[p] == s ? src[p] : 0.f, acc);
    }
  }
  return acc + __shfl_xor_sync(kFullMask, acc, 16);
}

// Lane L's v[j] = lane j's x, for the bits j of `bits` (every lane calls).
__device__ __forceinline__ void TakeFromLanes(int L, unsigned bits, float x, float (&v)[kWideR]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int j = 0; j < kWideR; ++j) {
    const float y = __shfl_sync(kFullMask, x, j);
    if (lane == L && ((bits >> j) & 1)) v[j] = y;
  }
}

// The leftovers `bits` of lane L (WidePasses) into out[j] of lane L: output
// j's id at ido[WideAt(o0 + j)], its sum over src (ids alongside) from
// element e0 + j (WideMaskedSum, taps reversed where kReverse), plus init.
// The pre-activations: src x, o0 = kWideR * run, e0 = o0 + kWideR (the
// window's run after it); dx: src g, e0 = o0.
template <bool kReverse>
__device__ __forceinline__ void WideLeftSums(const float* src, const int32_t* ids, const int32_t* ido, int L,
                                             unsigned bits, int o0, int e0, const float* taps, int W,
                                             float init, float (&out)[kWideR]) {
  const int j = threadIdx.x & (kWideR - 1);
  const bool on = (bits >> j) & 1;
  const float v = WideMaskedSum<kReverse>(on, src, ids, on ? ido[WideAt(o0 + j)] : kNoId, e0 + j, taps, W, init);
  TakeFromLanes(L, bits, v, out);
}

// The leftover pre-activations of lane L's run `run_l` into out[j] of lane L.
__device__ __forceinline__ void WideLeftPre(const float* xs, const int32_t* idx, const int32_t* ido, int L,
                                            unsigned bits, int run_l, const float* taps, int W, float bias,
                                            float (&out)[kWideR]) {
  WideLeftSums<false>(xs, idx, ido, L, bits, kWideR * run_l, kWideR * (run_l + 1), taps, W, bias, out);
}

// A lane's outputs for the chunk staged in xs (idx, ido: its ids), steps
// c0 + kWideR * lane + j: activated, zeros on padding (out zeroed first).
template <bool kMasked>
__device__ __forceinline__ void WideForwardRun(const float* xs, const int32_t* idx, const int32_t* ido,
                                               bool clean, const float* taps, int W, float bias, bool silu,
                                               float (&out)[kWideR]) {
  const int lane = threadIdx.x & 31;
  auto pres = [&](int32_t s, bool masked, unsigned take) {
    WidePre<kMasked>(xs, idx, s, masked, take, lane + 1, taps, W, bias, out);
  };
  auto left = [&](int L, unsigned bits) { WideLeftPre(xs, idx, ido, L, bits, L, taps, W, bias, out); };
  unsigned live = ~0u;  // bit j: output j is not padding
  if constexpr (kMasked)
    live = WidePasses(clean, ido[0], [&](int j) { return ido[WideAt(kWideR * lane + j)]; }, pres, left);
  else
    pres(0, false, ~0u);
#pragma unroll
  for (int j = 0; j < kWideR; ++j) out[j] = (live >> j) & 1 ? Activate(out[j], silu) : 0.f;
}

// A warp's backward work on the chunk staged in xs (idx, ido: its ids;
// gs: its g buffer, whose steps kWideChunk .. + hp hold the first g of the
// chunk after, handed over by the caller unless `last`): for each run from
// step c0 + kWideR * run, with dy_of(run, dy) its dy (zeros past the row),
//   g = dy * act'(pre)  (pre recomputed from x; zero on padding)
// into gs (`last`: the runs after the chunk too, by the first lanes; the
// others repeat the last of those runs: the passes shuffle; one call site
// of the run's g, so that it is inlined once); then
//   dws[k] += g * x[t - H + k] (summed over the warp), dbias += g,
//   dx = sum_k w[k] g[t + H - k]  for this lane's run.
// seq_idx passes as in the forward: pass s reads inputs (and g) of id s
// only and takes the run's outputs (and inputs) of id s.
template <bool kMasked, typename DyOf>
__device__ __forceinline__ void WideBackwardRun(const float* xs, float* gs, const int32_t* idx,
                                                const int32_t* ido, bool clean, const float* taps, float* dws,
                                                int W, int hp, float bias, bool silu, bool last, DyOf&& dy_of,
                                                float& dbias, float (&dx)[kWideR]) {
  const int lane = threadIdx.x & 31;
  const int nahead = hp / kWideR;
  auto g_of = [&](int run, float (&g)[kWideR]) {
    auto own = [&](int j) { return ido[WideAt(kWideR * run + j)]; };
    float dy[kWideR];
    dy_of(run, dy);
    float pre[kWideR] = {};
    auto pres = [&](int32_t s, bool masked, unsigned take) {
      WidePre<kMasked>(xs, idx, s, masked, take, run + 1, taps, W, bias, pre);
    };
    auto left = [&](int L, unsigned bits) {
      // (lanes >= nahead only repeat the last run after the chunk: theirs
      // are not summed)
      const int run_l = __shfl_sync(kFullMask, run, L);
      if (run_l < kWideChunk / kWideR || L < nahead) WideLeftPre(xs, idx, ido, L, bits, run_l, taps, W, bias, pre);
    };
    unsigned live = ~0u;
    if (silu) {
      if constexpr (kMasked)
        live = WidePasses(clean, ido[0], own, pres, left);
      else
        pres(0, false, ~0u);
    } else if constexpr (kMasked) {
#pragma unroll
      for (int j = 0; j < kWideR; ++j) live &= own(j) >= 0 ? ~0u : ~(1u << j);
    }
#pragma unroll
    for (int j = 0; j < kWideR; ++j)
      g[j] = (live >> j) & 1 ? (silu ? ActGrad(pre[j], dy[j], true) : dy[j]) : 0.f;
  };
  for (int ahead = last; ahead >= 0; --ahead) {
    const int run = ahead ? kWideChunk / kWideR + min(lane, nahead - 1) : lane;
    float gr[kWideR];
    g_of(run, gr);
    if (!ahead || lane < nahead)
#pragma unroll
      for (int j = 0; j < kWideR; ++j) gs[WideAt(kWideR * run + j)] = gr[j];
  }
  auto own = [&](int j) { return ido[WideAt(kWideR * lane + j)]; };
  float g[kWideR];  // this lane's own, written above
#pragma unroll
  for (int j = 0; j < kWideR; ++j) g[j] = gs[WideAt(kWideR * lane + j)], dbias += g[j];

  // dweight: pass s takes the g of the outputs of id s over inputs of id s
  auto dweight = [&](int32_t s, bool masked, unsigned take) {
    float gt[kWideR];
#pragma unroll
    for (int j = 0; j < kWideR; ++j) gt[j] = (take >> j) & 1 ? g[j] : 0.f;
    if (masked)
      WideDweight<kMasked>(xs, idx, s, lane + 1, gt, W, dws);
    else
      WideDweight<false>(xs, idx, s, lane + 1, gt, W, dws);
  };
  // the leftovers' shares: lane k takes tap k (and k + 32 ..) of each
  auto dweight_left = [&](int L, unsigned bits) {
    __syncwarp();  // (dws: AddWarpSums8's writers are other lanes)
    for (int k0 = 0; k0 < W; k0 += 32) {
      const int k = k0 + lane;
      float acc = 0.f;
#pragma unroll
      for (int j = 0; j < kWideR; ++j) {
        const float gj = __shfl_sync(kFullMask, g[j], L);
        if (!((bits >> j) & 1)) continue;
        const int p = WideAt(kWideR * (L + 1) + j + k);
        if (k < W && idx[p] == ido[WideAt(kWideR * L + j)]) acc = fmaf(gj, xs[p], acc);
      }
      if (k < W) dws[k] += acc;
    }
    __syncwarp();
  };
  if constexpr (kMasked)
    WidePasses(clean, ido[0], own, dweight, dweight_left);
  else
    dweight(0, false, ~0u);
  __syncwarp();  // the g buffer is complete

  // dx of the run's inputs: pass s sums the g of outputs of id s into the
  // inputs of id s (padding inputs get none: their outputs' g is 0 anyway)
#pragma unroll
  for (int j = 0; j < kWideR; ++j) dx[j] = 0.f;
  auto dxs = [&](int32_t s, bool masked, unsigned take) {
    float acc[kWideR] = {};
    if (masked)
      WideTaps<kMasked, true>(gs, ido, s, lane, taps, W, acc);
    else
      WideTaps<false, true>(gs, ido, s, lane, taps, W, acc);
#pragma unroll
    for (int j = 0; j < kWideR; ++j)
      if ((take >> j) & 1) dx[j] = acc[j];
  };
  auto dx_left = [&](int L, unsigned bits) {
    WideLeftSums<true>(gs, ido, ido, L, bits, kWideR * L, kWideR * L, taps, W, 0.f, dx);
  };
  if constexpr (kMasked)
    WidePasses(clean, ido[0], own, dxs, dx_left);
  else
    dxs(0, false, ~0u);
}

// The warp's partial dweight (dws[0..W)) and dbias (this lane's share,
// summed over the warp here) of channel d, span `span` of batch row b, to
// ws[grp][part][d][W + 1] (part = (b % batch_per_group) * spans + span) for
// states.cu's ReduceKernel. Every lane calls it.
__device__ __forceinline__ void StoreWidePartials(const ConvArgs& a, float* ws, int64_t spans_per_row,
                                                  int64_t b, int64_t d, int64_t span, const float* dws,
                                                  float dbias) {
  const int lane = threadIdx.x & 31, W = int(a.width);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) dbias += __shfl_xor_sync(kFullMask, dbias, off);
  __syncwarp();
  const int64_t bpg = BatchPerGroupFast(a), grp = DivFast(b, bpg);
  const int64_t nparts = bpg * spans_per_row;
  const int64_t partidx = (b - grp * bpg) * spans_per_row + span;
  float* out = ws + ((grp * nparts + partidx) * a.dim + d) * (W + 1);
  for (int k = lane; k < W; k += 32) out[k] = dws[k];
  if (lane == 0) out[W] = dbias;
}

}  // namespace jcc::cuda
