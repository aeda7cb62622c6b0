// Splitting a batch row's time axis into independent sequences (see
// SegmentMode in problem.h). Host-side helper for the CPU kernels.
#pragma once

#include <algorithm>
#include <vector>

#include "problem.h"

namespace jcc {

struct Segment {
  int64_t start, end;    // [start, end) along the row's time axis
  int64_t history_row;   // row of initial_states feeding its history, or -1 (zeros)
  int64_t final_row;     // row of final_states it writes, or -1
};

// Out-of-range or decreasing cu_seqlens are clamped and the segments always
// tile [0, len), so bad offsets never read out of bounds or leave y unwritten.
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
      int64_t start = 0;
      for (int64_t t = 1; t <= a.len; ++t) {
        if (t == a.len || s[t] != s[t - 1]) {
          out.push_back({start, t, -1, -1});
          start = t;
        }
      }
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

}  // namespace jcc
