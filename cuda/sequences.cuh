// The sequence modes on the device (problem.h: SegmentMode; docs/semantics.md).
// Every kernel family reads a window of inputs x[t - H .. t] for output t; a
// "clean" output is one whose whole window belongs to its own sequence, so
// the plain taps apply. The others go through MaskedPre below:
//   kRow:    every output is clean (positions t < 0 hold the initial states
//            or zeros in the staged window);
//   kSeqIdx: tap k counts when the id of its input equals the output's id
//            (positions t < 0 carry HistoryId: seq_idx[b, 0] with initial
//            states, else kNoId); negative ids are padding: no output;
//   kVarlen: inputs before the output's sequence start come from that
//            sequence's initial-states row (or are zeros).
#pragma once

#include <climits>

#include "common.cuh"

namespace jcc::cuda {

// An id no output has (outputs with negative ids are padding anyway).
constexpr int32_t kNoId = INT32_MIN;

// An id as the wide families stage it: every padding id as -1, so that no
// staged input holds kNoId, the id of a pass that takes no output
// (WidePasses): a padding input of the user's id INT32_MIN would enter that
// pass's dweight terms (0 * Inf where the input is not finite).
__device__ __forceinline__ int32_t StagedId(int32_t id) { return id < 0 ? -1 : id; }

// The steps t0 + [lo, hi) of a wide chunk's window (n steps from t0) whose
// ids count when the chunk is tested for one live id (then it runs the plain
// taps): steps past the row's end, and before its start without initial
// states, hold zeros in x and in the dy of g, so the plain taps add nothing
// from them (a non-finite tap times such a zero gives NaN, as the dense rows
// and the reference do). Computed once a chunk, not once an id.
struct StepRange {
  int lo, hi;
};
__device__ __forceinline__ StepRange CountedSteps(const ConvArgs& a, int64_t t0, int n, int32_t hist_id) {
  const int lo = hist_id == kNoId ? int(Min64(Max64(-t0, 0), n)) : 0;
  const int hi = int(Max64(Min64(a.len - t0, n), 0));
  return {lo, hi};
}

// The id of row b's first step in kSeqIdx mode (an empty row: kNoId).
__device__ __forceinline__ int32_t RowFirstId(const ConvArgs& a, int64_t b) {
  return a.len > 0 ? a.seq_idx[b * a.len] : kNoId;
}

// The id positions t < 0 of row b carry in kSeqIdx mode. (The length test
// written here too: in this form every kernel's SASS is what it was before
// RowFirstId; without it the channels-last rows' setup compiled otherwise.)
__device__ __forceinline__ int32_t HistoryId(const ConvArgs& a, int64_t b) {
  return a.initial_states && a.len > 0 ? RowFirstId(a, b) : kNoId;
}

// The id of step t of row b in kSeqIdx mode (any t; past the end: kNoId).
__device__ __forceinline__ int32_t IdAt(const ConvArgs& a, int64_t b, int64_t t, int32_t hist_id) {
  if (t < 0) return hist_id;
  return t < a.len ? a.seq_idx[b * a.len + t] : kNoId;
}

// Boundary n of a varlen row (clamped as in csrc/segments.h: the last
// sequence always ends at len; out-of-range or decreasing offsets stay in
// bounds and every step belongs to some sequence).
__device__ __forceinline__ int64_t VarlenBound(const ConvArgs& a, const int32_t* cu, int64_t n) {
  if (n >= a.num_seqs - 1) return a.len;
  const int64_t v = cu[n + 1];
  return v < 0 ? 0 : (v > a.len ? a.len : v);
}

// The varlen sequence holding step t of row b: its index n and its start.
struct VarlenSeq {
  int64_t n, start, end;
};

__device__ __forceinline__ VarlenSeq VarlenSeqOf(const ConvArgs& a, int64_t b, int64_t t) {
  const int64_t N = a.num_seqs;
  if (N <= 0) return {0, 0, a.len};
  const int32_t* cu = a.cu_seqlens + b * (N + 1);
  int64_t lo = 0, up = N - 1;  // first n with bound(n) > t
  while (lo < up) {
    const int64_t mid = (lo + up) / 2;
    if (VarlenBound(a, cu, mid) > t) up = mid; else lo = mid + 1;
  }
  const int64_t s = lo == 0 ? 0 : VarlenBound(a, cu, lo - 1);
  const int64_t e = VarlenBound(a, cu, lo);
  return {lo, s < t ? s : t, e > s ? e : s};
}

// The value tap k of output t reads under the masks: x_at(p) is the staged
// input at step p = t - H + k (for p < 0 the initial states or zeros).
// kSeqIdx: zero unless id_at(p) is t's id `id`; kVarlen: before t's sequence
// start `start`, its initial-states row `hrow` (-1: zeros) at channel d.
template <typename T, typename XAt, typename IdFn>
__device__ __forceinline__ float MaskedTap(const ConvArgs& a, int64_t t, int k, int H, XAt x_at,
                                           IdFn id_at, int32_t id, int64_t start, int64_t hrow,
                                           int64_t d) {
  const int64_t p = t - H + k;
  if (a.mode == SegmentMode::kSeqIdx) return id_at(p) == id ? x_at(p) : 0.f;
  if (a.mode == SegmentMode::kVarlen && p < start) {
    if (hrow < 0) return 0.f;
    return ToF(static_cast<const T*>(a.initial_states)[a.state_layout().At(hrow, d, p - start + H)]);
  }
  return x_at(p);
}

// Pre-activation of output t under the masks (MaskedTap), taps w_at(k).
// Returns false for a padding output (kSeqIdx, negative id), whose
// convolution output is 0.
template <typename T, typename XAt, typename WAt, typename IdFn>
__device__ __forceinline__ bool MaskedPre(const ConvArgs& a, int64_t t, int W, float bias, XAt x_at,
                                          WAt w_at, IdFn id_at, int64_t start, int64_t hrow,
                                          int64_t d, float* pre) {
  const int32_t id = a.mode == SegmentMode::kSeqIdx ? id_at(t) : 0;
  if (id < 0) return false;
  float acc = bias;
  for (int k = 0; k < W; ++k)
    acc += w_at(k) * MaskedTap<T>(a, t, k, W - 1, x_at, id_at, id, start, hrow, d);
  *pre = acc;
  return true;
}

}  // namespace jcc::cuda
