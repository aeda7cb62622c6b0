// Splitting a batch row's time axis into segments (see SegmentMode in
// problem.h), for the CPU kernels. A segment is a maximal run of steps that
// share one sequence; every output of a segment reads the segment's "stream":
// its H = W-1 history values followed by its own inputs. The history is
// where the modes differ:
//  kRow, kVarlen: the segment's initial-states row, or zeros;
//  kSeqIdx: the H positions before the segment's start, each counting when
//    it has the segment's id (an equality mask: ids may repeat after other
//    ids), positions before t = 0 reading the initial states when the row's
//    first id is the segment's.
// Padding segments (kSeqIdx, negative id) output zeros and take no part.
#pragma once

#include <algorithm>
#include <vector>

#include "problem.h"

namespace jcc {

struct Segment {
  int64_t start, end;    // [start, end) along the row's time axis
  int64_t history_row;   // row of initial_states its history (or, kSeqIdx, positions < 0) reads, or -1
  int64_t final_row;     // row of final_states it writes, or -1
  bool masked = false;   // kSeqIdx: history from earlier positions of the same id
  bool padding = false;  // kSeqIdx: negative id
};

// Where history slot i of a segment (stream position i, time step
// start - H + i) comes from: x at step x_pos, or initial_states[init_row, init_j],
// or nothing (a zero).
struct HistorySlot {
  int64_t x_pos = -1, init_row = -1, init_j = 0;
};

inline HistorySlot SlotOf(const ConvArgs& a, int64_t b, const Segment& s, int64_t i) {
  const int64_t H = a.width - 1;
  HistorySlot h;
  if (!s.masked) {
    if (s.history_row >= 0) h.init_row = s.history_row, h.init_j = i;
    return h;
  }
  const int64_t p = s.start - H + i;
  const int32_t* sid = a.seq_idx + b * a.len;
  if (p >= 0) {
    if (sid[p] == sid[s.start]) h.x_pos = p;
  } else if (s.history_row >= 0) {
    h.init_row = s.history_row, h.init_j = p + H;
  }
  return h;
}

// The row's segments, in order. Out-of-range or decreasing cu_seqlens are
// clamped and the segments always tile [0, len), so bad offsets never read
// out of bounds or leave y unwritten. In kSeqIdx mode the row's last
// non-padding segment writes the final states (see RowFinalFallback).
inline void RowSegments(const ConvArgs& a, int64_t b, std::vector<Segment>& out) {
  out.clear();
  const bool has_init = a.initial_states != nullptr;
  const bool has_final = a.final_states != nullptr || a.dfinal_states != nullptr;
  switch (a.mode) {
    case SegmentMode::kRow:
      out.push_back({0, a.len, has_init ? b : -1, has_final ? b : -1});
      break;
    case SegmentMode::kSeqIdx: {
      const int32_t* s = a.seq_idx + b * a.len;
      int64_t start = 0, last_valid = -1;
      for (int64_t t = 1; t <= a.len; ++t) {
        if (t == a.len || s[t] != s[t - 1]) {
          Segment seg{start, t, has_init && s[start] == s[0] ? b : -1, -1};
          seg.masked = true;
          seg.padding = s[start] < 0;
          if (!seg.padding) last_valid = int64_t(out.size());
          out.push_back(seg);
          start = t;
        }
      }
      if (has_final && last_valid >= 0) out[last_valid].final_row = b;
      break;
    }
    case SegmentMode::kVarlen: {
      const int64_t N = a.num_seqs;
      const int32_t* cu = a.cu_seqlens + b * (N + 1);
      int64_t prev = 0;
      for (int64_t n = 0; n < N; ++n) {
        int64_t lo = prev;
        int64_t hi = n + 1 == N ? a.len : std::clamp<int64_t>(cu[n + 1], lo, a.len);
        out.push_back({lo, hi, has_init ? b * N + n : -1, has_final ? b * N + n : -1});
        prev = hi;
      }
      if (N == 0) out.push_back({0, a.len, -1, -1});  // malformed offsets: still write y
      break;
    }
  }
}

// kSeqIdx rows with no non-padding step write their initial states (or
// zeros) as final states: true when row b is such a row.
inline bool RowFinalFallback(const ConvArgs& a, int64_t b) {
  if (a.mode != SegmentMode::kSeqIdx) return false;
  const int32_t* s = a.seq_idx + b * a.len;
  for (int64_t t = 0; t < a.len; ++t)
    if (s[t] >= 0) return false;
  return true;
}

}  // namespace jcc
