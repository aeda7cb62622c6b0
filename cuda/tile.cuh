// The general kernel family ("tile"): any layout, any width (a run-time
// loop), any alignment or x strides, every sequence mode. A block of
// kTileWarps warps owns kTileC = 32 channels (a warp's lanes) of one batch
// row and walks time tiles of kTileT steps. Each tile's inputs are staged
// once into shared memory as float, steps as rows and channels as columns
// (channels-first x is transposed on the way in), so every lane reads its
// channel's column and a warp's reads are conflict-free. A warp computes a
// run of kTileR consecutive steps: kTileR accumulators per lane, the taps
// in chunks of 8 with a sliding window of inputs in registers (8 new inputs
// and 8 taps per 8 x kTileR multiply-adds), so wide filters run near the
// FMA rate. Outputs whose window leaves their sequence take MaskedPre
// (sequences.cuh).
#pragma once

#include "common.cuh"
#include "sequences.cuh"

namespace jcc::cuda {

constexpr int kTileC = 32;      // channels per block
constexpr int kTileWarps = 8;   // warps per block
constexpr int kTileR = 16;      // steps per warp run
constexpr int kTileT = kTileWarps * kTileR;  // steps per tile
constexpr int kTileThreads = 32 * kTileWarps;
constexpr int kTileLd = kTileC + 1;  // padded row: a transposed store hits 32 banks

// A staged block of rows (steps) x 32 channels, row r at p + r * kTileLd.
struct TileRows {
  float* p;
  __device__ __forceinline__ float& operator()(int r, int c) const { return p[r * kTileLd + c]; }
};

// Where a block works: batch row b, channels [c0, c0 + 32), weight group g.
struct TileWhere {
  int64_t b, c0, g;
  int nc;  // channels present (the last block of a row may have fewer than 32)
};

__device__ __forceinline__ TileWhere LocateTileBlock(const ConvArgs& a, int64_t blk, int64_t* tile_index,
                                                     int64_t ntiles) {
  const int64_t groups = CeilDiv(a.dim, kTileC);
  TileWhere w;
  if (a.channels_last) {  // channel groups of one (row, time tile) consecutive
    const int64_t rest = blk / groups;
    w.c0 = (blk - rest * groups) * kTileC;
    w.b = rest / ntiles;
    *tile_index = rest - w.b * ntiles;
  } else {  // time tiles of one row consecutive
    const int64_t rest = blk / ntiles;
    *tile_index = blk - rest * ntiles;
    w.b = rest / groups;
    w.c0 = (rest - w.b * groups) * kTileC;
  }
  w.g = w.b / a.batch_per_group();
  w.nc = int(Min64(kTileC, a.dim - w.c0));
  return w;
}

// Input at step t of channel c0 + c for staging: x, or (t < 0, rows and
// seq_idx modes) the initial states, or zeros.
template <typename T>
__device__ __forceinline__ float StageValue(const ConvArgs& a, const T* x, Layout3 xl, const TileWhere& w,
                                            int c, int64_t t) {
  if (c >= w.nc || t >= a.len) return 0.f;
  if (t >= 0) return ToF(x[xl.At(w.b, w.c0 + c, t)]);
  if (a.initial_states && a.mode != SegmentMode::kVarlen)
    return LoadState<T>(a, a.initial_states, w.b, w.c0 + c, t + a.width - 1);
  return 0.f;
}

// rows[r][c] = `src` (layout `lay`) at step t_first + r, r < n: a warp per
// row (channels-last) or per channel (channels-first: steps along the lanes,
// stored transposed). `value(c, t)` supplies out-of-range steps.
template <typename T, typename Value>
__device__ __forceinline__ void StageRows(const ConvArgs& a, TileRows rows, int64_t t_first, int n,
                                          Value value) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (a.channels_last) {
    for (int r = warp; r < n; r += kTileWarps) rows(r, lane) = value(lane, t_first + r);
  } else {
    for (int c = warp; c < kTileC; c += kTileWarps)
      for (int r = lane; r < n; r += 32) rows(r, c) = value(c, t_first + r);
  }
}

// The taps of the block's channels, taps[k * 32 + c] (zeros past dim), and their biases.
__device__ __forceinline__ void StageTaps(const ConvArgs& a, const TileWhere& w, float* taps, float* bias) {
  const int W = int(a.width);
  for (int i = threadIdx.x; i < W * kTileC; i += kTileThreads) {
    const int k = i / kTileC, c = i % kTileC;
    taps[i] = c < w.nc ? LoadAnyF(a.weight, a.w_dtype, (w.g * a.dim + w.c0 + c) * W + k) : 0.f;
  }
  for (int c = threadIdx.x; c < kTileC; c += kTileThreads)
    bias[c] = c < w.nc && a.bias ? LoadAnyF(a.bias, a.b_dtype, w.g * a.dim + w.c0 + c) : 0.f;
}

// Per-step sequence data of rows t_first .. t_first + n: ids (kSeqIdx), or
// the sequence start and initial-states row of each step (kVarlen).
struct TileSeq {
  int32_t* id;       // kSeqIdx
  int64_t* start;    // kVarlen
  int64_t* hrow;     // kVarlen: initial-states row, or -1
};

__device__ __forceinline__ void StageSeq(const ConvArgs& a, const TileWhere& w, TileSeq s, int64_t t_first,
                                         int n) {
  if (a.mode == SegmentMode::kSeqIdx) {
    const int32_t hist = HistoryId(a, w.b);
    for (int r = threadIdx.x; r < n; r += kTileThreads) s.id[r] = IdAt(a, w.b, t_first + r, hist);
  } else if (a.mode == SegmentMode::kVarlen) {
    for (int r = threadIdx.x; r < n; r += kTileThreads) {
      const int64_t t = t_first + r;
      if (t < 0 || t >= a.len) {
        s.start[r] = t < 0 ? t : a.len, s.hrow[r] = -1;
        continue;
      }
      const VarlenSeq q = VarlenSeqOf(a, w.b, t);
      s.start[r] = q.start;
      s.hrow[r] = a.initial_states ? w.b * a.num_seqs + q.n : -1;
    }
  }
}

// Whether every output of rows [r0 + H, r0 + H + n) of a window staged from
// step t_first (row r <-> step t_first + r) reads only its own sequence:
// then the plain taps apply. Warp-uniform.
__device__ __forceinline__ bool RunIsClean(const ConvArgs& a, TileSeq s, int64_t t_first, int r0, int n,
                                           int H) {
  if (a.mode == SegmentMode::kRow) return true;
  const int lane = threadIdx.x & 31;
  bool ok = true;
  if (a.mode == SegmentMode::kSeqIdx) {
    const int32_t id = s.id[r0];
    for (int r = lane; r < n + H; r += 32) ok = ok && s.id[r0 + r] == id;
    ok = ok && id >= 0;
  } else {  // the last output's sequence started at or before the window's first step
    ok = s.start[r0 + H + n - 1] <= t_first + r0;
  }
  return __all_sync(0xffffffffu, ok);
}

// acc[j] += sum_k tap(k) * rows(r0 + j + k, c) for j < kTileR, k < W, with
// tap(k) = taps[k] (or, kReverse, taps[W-1-k]: the backward's dx): the taps
// in chunks of 8 over a sliding window of kTileR + 7 inputs.
template <bool kReverse = false>
__device__ __forceinline__ void RunTaps(TileRows rows, int r0, int c, const float* taps, int W,
                                        float (&acc)[kTileR]) {
  constexpr int R = kTileR, kWin = R + 7;
  int k = 0;
  if (W >= 8) {
    float win[kWin];
#pragma unroll
    for (int q = 0; q < kWin; ++q) win[q] = rows(r0 + q, c);
    for (; k + 8 <= W; k += 8) {
      float wk[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) wk[q] = taps[(kReverse ? W - 1 - k - q : k + q) * kTileC + c];
#pragma unroll
      for (int q = 0; q < 8; ++q)
#pragma unroll
        for (int j = 0; j < R; ++j) acc[j] += wk[q] * win[j + q];
      if (k + 16 <= W) {  // slide by 8 for the next full chunk
#pragma unroll
        for (int q = 0; q < kWin - 8; ++q) win[q] = win[q + 8];
#pragma unroll
        for (int q = kWin - 8; q < kWin; ++q) win[q] = rows(r0 + k + 8 + q, c);
      }
    }
  }
  for (; k < W; ++k) {
    const float wk = taps[(kReverse ? W - 1 - k : k) * kTileC + c];
#pragma unroll
    for (int j = 0; j < R; ++j) acc[j] += wk * rows(r0 + k + j, c);
  }
}

// Shared memory of a tile kernel, in bytes: `rows` staged rows of floats per
// buffer, `bufs` buffers, the taps, and per-row sequence data.
__host__ __device__ __forceinline__ size_t TileSmemBytes(int rows, int bufs, int W) {
  size_t bytes = size_t(bufs) * rows * kTileLd * sizeof(float);
  bytes += size_t(W) * kTileC * sizeof(float) + kTileC * sizeof(float);  // taps, bias
  bytes = (bytes + 15) & ~size_t(15);
  bytes += size_t(rows) * (sizeof(int32_t) + 2 * sizeof(int64_t));         // ids or varlen data
  return bytes;
}

}  // namespace jcc::cuda
