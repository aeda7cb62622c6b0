// The streaming kernels' seq_idx path with the ids shared by channels
// (FwdStreamIdsKernel, BwdStreamIdsKernel; chosen by dispatch.cu's
// SharedIds): every W <= 16, each compiled at its own width (these kernels
// have no absent taps).
//
// A warp takes kIdChannels channels of one batch row over the same chunk. It
// first turns the ids of its vectors into one mask word per vector
// (TapMaskWord; the backward's dx also DxMaskWord), then runs the plain
// streaming pass channel after channel; a vector whose masks are not all
// set, warp-wide, takes its taps through selects (an input of another
// sequence is never multiplied). The ids are read once per kIdChannels
// channels, and no id is held while the channels run; the channels' taps
// are read once too, into the warp's shared memory (IdTaps).
#pragma once

#include <cstddef>
#include <type_traits>

#include "cp_async.cuh"
#include "stream.cuh"

namespace jcc::cuda {

// (8 measured faster than 4, and 4 than 2: docs/performance-log.md, 2026-11-26;
// 16 mixed at the large shapes and 20-40% slower at the small ones, thirty-sixth session)
constexpr int kIdChannels = 8;

__host__ __device__ __forceinline__ int64_t IdGroupsPerRow(int64_t dim) {
  return CeilDiv(dim, int64_t(kStreamWarps) * kIdChannels);
}

__host__ __device__ __forceinline__ int64_t IdStreamBlocks(const ConvArgs& a, int64_t spans_per_row) {
  return a.batch * IdGroupsPerRow(a.dim) * spans_per_row;
}

// The forward's staging slots of one warp for one channel's chunk (copied
// by cp.async while the warp works on the channel before): x[j] for the
// chunk's vectors j < V, x[V] the vector before the chunk (lanes >= 32 - kQ).
// Each lane writes and reads only its own column (no barrier).
template <typename T>
struct ForwardStage {
  uint4 x[Stream<T>::kVecs + 1][32];
};

// Issues (and commits as one group) the copies of channel row xrow's chunk
// at c0 into s; a vector before step 0 (initial states or zeros) is stored
// directly.
template <typename T>
__device__ __forceinline__ void StageForwardChunk(const ConvArgs& a, const T* xrow, int64_t b, int64_t d,
                                                  int64_t c0, int lane, bool before, int64_t t_before,
                                                  ForwardStage<T>& s) {
  constexpr int N = Stream<T>::kN, V = Stream<T>::kVecs;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int64_t t = c0 + int64_t(j * 32 + lane) * N;
    CpAsync<16>(&s.x[j][lane], t < a.len ? xrow + t : xrow, t < a.len);
  }
  if (before && t_before < 0)
    s.x[V][lane] = LoadVectorBefore<T>(a, xrow, b, d, t_before);
  else
    CpAsync<16>(&s.x[V][lane], before ? xrow + t_before : xrow, before);
  CpAsyncCommit();
}

// The backward's staging slots of one warp for one channel's chunk
// (LoadBackwardChunk's vectors, copied by cp.async while the warp works on
// the channel before): x[j] and dy[j] for the chunk's vectors j < V; the
// vector before the chunk of lane 32 - kQ + i in x_before[i], the vectors
// after it of lane i < kQ in x_after[i] and dy_after[i] (slots for those
// lanes only, where whole rows of slots had measured slower at 16-bit W
// 5..8: docs/performance-log.md, 2026-11-27, eleventh session). Each lane
// writes and reads only its own slots (no barrier), except the steps
// around the chunk's end, which StagedXAt and StagedDyAfter read across
// lanes (after CpAsyncWait, whose copies each lane waited for itself:
// the caller's __syncwarp orders them). x_after follows x, so that the
// steps around the chunk's end lie in a row.
template <typename T>
struct BackwardStage {
  static constexpr int V = Stream<T>::kVecs;
  static constexpr int kQMax = (15 + Stream<T>::kN - 1) / Stream<T>::kN;  // the most lanes a halo reaches (W 16)
  uint4 x[V][32], x_after[kQMax], dy[V][32], dy_after[kQMax], x_before[kQMax];
};

// Element i of x from the chunk's end (step c0 + kChunk + i; i from
// -kChunk to kQ N - 1), and of dy (i from 0 to kQ N - 1), as float.
template <typename T>
__device__ __forceinline__ float StagedXAt(const BackwardStage<T>& s, int i) {
  static_assert(offsetof(BackwardStage<T>, x_after) == sizeof(BackwardStage<T>::x), "x_after follows x");
  return ToF(reinterpret_cast<const T*>(&s)[Stream<T>::kChunk + i]);
}
template <typename T>
__device__ __forceinline__ float StagedDyAfter(const BackwardStage<T>& s, int i) {
  return ToF(reinterpret_cast<const T*>(s.dy_after)[i]);
}

// Issues (and commits as one group) the copies of channel row xrow / dyrow's
// chunk at c0 into s; a vector before step 0 (initial states or zeros) is
// stored directly.
template <typename T, int kQ>
__device__ __forceinline__ void StageBackwardChunk(const ConvArgs& a, const T* xrow, const T* dyrow, int64_t b,
                                                   int64_t d, int64_t c0, int lane, bool before,
                                                   int64_t t_before, BackwardStage<T>& s) {
  constexpr int N = Stream<T>::kN, V = Stream<T>::kVecs;
  static_assert(kQ <= BackwardStage<T>::kQMax, "an edge slot per lane that needs one");
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int64_t t = c0 + int64_t(j * 32 + lane) * N;
    const bool ok = t < a.len;
    CpAsync<16>(&s.x[j][lane], ok ? xrow + t : xrow, ok);
    CpAsync<16>(&s.dy[j][lane], ok ? dyrow + t : dyrow, ok);
  }
  if (lane < kQ) {
    const int64_t t = c0 + int64_t(V * 32 + lane) * N;
    const bool ok = t < a.len;
    CpAsync<16>(&s.x_after[lane], ok ? xrow + t : xrow, ok);
    CpAsync<16>(&s.dy_after[lane], ok ? dyrow + t : dyrow, ok);
  }
  if (before) {
    uint4* slot = &s.x_before[lane - (32 - kQ)];
    if (t_before >= 0)
      CpAsync<16>(slot, xrow + t_before, true);
    else
      *slot = LoadVectorBefore<T>(a, xrow, b, d, t_before);
  }
  CpAsyncCommit();
}

// LoadBackwardChunk's x vectors of the chunk read from the staged slots
// (their copies waited for) one at a time, where the walk needs them: x
// vector i - 1 for i = 1 .. V, and for i = 0 the vector before the chunk
// (lanes >= 32 - kQ; zeros on the others). Read as needed (as are the dy
// vectors, s.dy[j][lane]), the chunk's vectors are not all held in
// registers at once. (The steps after the chunk are read one a lane:
// StagedXAt, StagedDyAfter.)
template <typename T, int kQ>
__device__ __forceinline__ uint4 StagedX(const BackwardStage<T>& s, int lane, int i) {
  if (i == 0) {
    const bool before = kQ > 0 && lane >= 32 - kQ;
    return before ? s.x_before[before ? lane - (32 - kQ) : 0] : make_uint4(0, 0, 0, 0);  // (index clamped: no read)
  }
  return s.x[i - 1][lane];
}

// Where a warp of these kernels works: batch row b, channels d0 ..
// d0 + kIdChannels - 1 (those below dim), chunk `span` of the row. `live`:
// d0 < dim (no barrier in these kernels: a dead warp returns).
struct IdPlace {
  int64_t b, d0, span;
  bool live;
};

__device__ __forceinline__ IdPlace LocateIdStream(const ConvArgs& a, int64_t spans_per_row) {
  const int64_t groups = IdGroupsPerRow(a.dim), blk = blockIdx.x;
  const int64_t row_block = blk / spans_per_row, span = blk - row_block * spans_per_row;
  const int64_t b = row_block / groups, grp = row_block - b * groups;
  const int64_t d0 = (grp * kStreamWarps + (threadIdx.x >> 5)) * kIdChannels;
  return {b, d0, span, d0 < a.dim};
}

// The taps and bias of a warp's kIdChannels channels, loaded once before
// the channels run (a few per lane, each converted from its dtype once):
// the channel loop then reads them back from shared memory instead of
// finding each channel's weight row and switching on the dtype per tap.
// v[ch][k] = tap k of channel d0 + ch, v[ch][kW] its bias (0 past dim).
template <int kW>
struct alignas(16) IdTaps {
  static constexpr int kStride = (kW + 1 + 3) / 4 * 4;  // whole 16-byte rows
  static constexpr int kPerLane = (kIdChannels * (kW + 1) + 31) / 32;
  float v[kIdChannels][kStride];
};

// Whether the kernels load their taps before the ids (their latency then
// passes under the ids' loads, their registers held through the masks'
// making) or after: measured per width and element size
// (docs/performance-log.md, 2026-11-26, ninth session); after only at W = 8
// with 16-bit elements, whose masks take the most registers (and, not
// measured, at the 16-bit W > 8, whose masks take more).
template <typename T>
__host__ __device__ constexpr bool IdTapsEarly(int w) { return !(w >= 8 && sizeof(T) == 2); }

// This lane's share of the warp's taps (element lane + 32 r of the
// channels' (kW + 1)-long rows); StoreIdTaps puts them in place.
template <int kW>
__device__ __forceinline__ void LoadIdTaps(const ConvArgs& a, int64_t b, int64_t d0, int lane,
                                           float (&v)[IdTaps<kW>::kPerLane]) {
  const int64_t wrow0 = WeightRow(a, b, d0);  // (channel d0 + ch: row wrow0 + ch)
#pragma unroll
  for (int r = 0; r < IdTaps<kW>::kPerLane; ++r) {
    const int i = lane + 32 * r, ch = i / (kW + 1), k = i - ch * (kW + 1);
    v[r] = 0.f;
    if (ch < kIdChannels && d0 + ch < a.dim) {
      const int64_t wrow = wrow0 + ch;
      v[r] = k < kW ? LoadAnyF(a.weight, a.w_dtype, wrow * kW + k) : a.bias ? LoadAnyF(a.bias, a.b_dtype, wrow) : 0.f;
    }
  }
}

// Every lane calls it (ends with __syncwarp).
template <int kW>
__device__ __forceinline__ void StoreIdTaps(const float (&v)[IdTaps<kW>::kPerLane], int lane, IdTaps<kW>& t) {
#pragma unroll
  for (int r = 0; r < IdTaps<kW>::kPerLane; ++r) {
    const int i = lane + 32 * r, ch = i / (kW + 1), k = i - ch * (kW + 1);
    if (ch < kIdChannels) t.v[ch][k] = v[r];
  }
  __syncwarp();
}

// Channel ch's taps (w) and bias (returned), by whole 16-byte reads.
template <int kW>
__device__ __forceinline__ float IdChannelTaps(const IdTaps<kW>& t, int ch, float (&w)[kW]) {
  constexpr int S = IdTaps<kW>::kStride;
  float row[S];
#pragma unroll
  for (int q = 0; q < S / 4; ++q) {
    const float4 f = reinterpret_cast<const float4*>(t.v[ch])[q];
    row[4 * q] = f.x, row[4 * q + 1] = f.y, row[4 * q + 2] = f.z, row[4 * q + 3] = f.w;
  }
#pragma unroll
  for (int k = 0; k < kW; ++k) w[k] = row[k];
  return row[kW];
}

// Mask words past 64 bits (16-bit types at W 9..16: 72 to 128 bits):
// K 32-bit words, bit p in word p / 32. Every bit position the kernels
// test is a compile-time constant, so a bit costs what it costs in one
// integer.
template <int K>
struct alignas(K == 4 ? 16 : 4) MaskWords {  // (whole 16-byte reads of 4 words)
  uint32_t w[K];
};

// A vector's mask word: bit n kH + k for tap k < kH of output (or input) n,
// bit N kH + n for output (input) n not padding; All(): no bit masks.
template <int N, int kH>
struct IdMask {
  static constexpr int kBits = N * kH + N;
  using Word = std::conditional_t<(kBits <= 32), uint32_t,
                                  std::conditional_t<(kBits <= 64), unsigned long long, MaskWords<(kBits + 31) / 32>>>;
  __host__ __device__ static constexpr Word All() {
    if constexpr (kBits <= 64) {
      return kBits == 8 * int(sizeof(Word)) ? ~Word(0) : (Word(1) << kBits) - 1;
    } else {
      Word m{};
      for (int i = 0; i < (kBits + 31) / 32; ++i)
        m.w[i] = kBits - 32 * i >= 32 ? ~0u : (1u << (kBits - 32 * i)) - 1;
      return m;
    }
  }
};

// Bit p of a mask word, and setting it.
__device__ __forceinline__ bool Bit(uint32_t m, int p) { return (m >> p) & 1; }
__device__ __forceinline__ bool Bit(unsigned long long m, int p) { return (m >> p) & 1; }
template <int K>
__device__ __forceinline__ bool Bit(const MaskWords<K>& m, int p) {
  // (the word by selects, not by indexing the array with p: the same for a
  // p known at compile time, and p may be known only at run time
  // (AfterStepTaps); the indexing compiled the 16-bit W 16 shared-ids
  // backward's masked steps slower: docs/performance-log.md, 2026-11-28)
  uint32_t v = 0;
#pragma unroll
  for (int i = 0; i < K; ++i) v = (p >> 5) == i ? m.w[i] : v;
  return (v >> (p & 31)) & 1;
}
__device__ __forceinline__ void SetBit(uint32_t& m, int p, bool v) { m |= uint32_t(v) << p; }
__device__ __forceinline__ void SetBit(unsigned long long& m, int p, bool v) { m |= (unsigned long long)(v) << p; }
template <int K>
__device__ __forceinline__ void SetBit(MaskWords<K>& m, int p, bool v) { m.w[p >> 5] |= uint32_t(v) << (p & 31); }

// A mask word from another lane.
__device__ __forceinline__ uint32_t ShflWord(uint32_t m, int src) { return __shfl_sync(kFullMask, m, src); }
__device__ __forceinline__ unsigned long long ShflWord(unsigned long long m, int src) {
  return __shfl_sync(kFullMask, m, src);
}
template <int K>
__device__ __forceinline__ MaskWords<K> ShflWord(const MaskWords<K>& m, int src) {
  MaskWords<K> r;
#pragma unroll
  for (int i = 0; i < K; ++i) r.w[i] = __shfl_sync(kFullMask, m.w[i], src);
  return r;
}

// Keeps a word in registers as one value: without it the compiler keeps
// every bit's compare live until its use instead.
__device__ __forceinline__ void Opaque(uint32_t& v) { asm volatile("" : "+r"(v)); }
__device__ __forceinline__ void Opaque(unsigned long long& v) { asm volatile("" : "+l"(v)); }
template <int K>
__device__ __forceinline__ void Opaque(MaskWords<K>& v) {
#pragma unroll
  for (int i = 0; i < K; ++i) Opaque(v.w[i]);
}

// Whether a vector's window (its ids cur and the kH ids of the halo on
// one side) holds one live id (W = 1: every id live): its word is All().
template <int N, int kH>
__device__ __forceinline__ bool OneLiveId(const int32_t (&cur)[N], const int32_t (&halo)[kH > 0 ? kH : 1]) {
  bool one = cur[0] >= 0;
#pragma unroll
  for (int n = 1; n < N; ++n) one &= kH == 0 ? cur[n] >= 0 : cur[n] == cur[0];
#pragma unroll
  for (int i = 0; i < kH; ++i) one &= halo[i] == cur[0];
  return one;
}

// The taps' word of a vector with ids cur (steps p0 ..; h[i]: the id of step
// p0 - kH + i, LeftHalo's): bit n kH + k when output n is not padding and
// the input its tap k reads (step p0 + n - kH + k) has its id, bit N kH + n
// when output n is not padding.
template <int N, int kH>
__device__ __forceinline__ typename IdMask<N, kH>::Word TapMaskWord(const int32_t (&cur)[N],
                                                                    const int32_t (&h)[kH > 0 ? kH : 1]) {
  using Word = typename IdMask<N, kH>::Word;
  Word m{};
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int k = 0; k < kH; ++k)
      SetBit(m, n * kH + k, cur[n] >= 0 && (n + k < kH ? h[n + k] : cur[n + k - kH]) == cur[n]);
    SetBit(m, N * kH + n, cur[n] >= 0);
  }
  Opaque(m);
  return m;
}

// The dx word of a vector with ids cur (r[m]: the id of step p0 + N + m,
// RightHalo's): bit n kH + k (k < kH) when the output whose tap k reads
// input n (step p0 + n + kH - k) has input n's id, bit N kH + n when input n
// is not padding (its dx is 0).
template <int N, int kH>
__device__ __forceinline__ typename IdMask<N, kH>::Word DxMaskWord(const int32_t (&cur)[N],
                                                                   const int32_t (&r)[kH > 0 ? kH : 1]) {
  using Word = typename IdMask<N, kH>::Word;
  Word m{};
#pragma unroll
  for (int n = 0; n < N; ++n) {
#pragma unroll
    for (int k = 0; k < kH; ++k) {
      const int i = n + kH - k;
      SetBit(m, n * kH + k, (i < N ? cur[i] : r[i - N]) == cur[n]);
    }
    SetBit(m, N * kH + n, cur[n] >= 0);
  }
  Opaque(m);
  return m;
}

// The words of a chunk's vectors: tap[j] for vectors j < kG (the forward's
// kG = V; the backward's V + 1: the vector after the chunk too, whose ids
// the lanes < kQ load) and, kDx, dx[j] for j < V. Bit j of tap_plain /
// dx_plain: every lane's word j is All() or past the end (a plain step).
template <int N, int kH, int V, bool kDx>
struct ChunkMasks {
  using Word = typename IdMask<N, kH>::Word;
  static constexpr int kG = kDx ? V + 1 : V;
  Word tap[kG], dx[kDx ? V : 1];
  uint32_t tap_plain = 0, dx_plain = 0;
};

// Every lane calls it (shuffles). kChunkOnly: no tap word for the vector
// after the chunk (tap[V] left unset; the words pre-pass stores the
// chunk's own vectors only), though its ids are still loaded for dx[V - 1].
template <bool kChunkOnly = false, int N, int kH, int V, bool kDx>
__device__ __forceinline__ void LoadChunkMasks(const ConvArgs& a, int64_t b, int64_t c0, int32_t hist, int lane,
                                               ChunkMasks<N, kH, V, kDx>& m) {
  using M = IdMask<N, kH>;
  constexpr int kQ = (kH + N - 1) / N, kG = ChunkMasks<N, kH, V, kDx>::kG;
  int32_t prev[N], cur[N], next[N];
  LoadStreamIds<N>(a, b, c0 - (32 - lane) * N, hist, kQ > 0 && lane >= 32 - kQ, prev);
  LoadStreamIds<N>(a, b, c0 + lane * N, hist, true, cur);
#pragma unroll
  for (int j = 0; j < (kChunkOnly ? V : kG); ++j) {
    const int64_t p0 = c0 + int64_t(j * 32 + lane) * N;
    const bool dead = p0 >= a.len || (j == V && lane >= kQ);
    if (j + 1 < kG) LoadStreamIds<N>(a, b, p0 + 32 * N, hist, j + 1 < V || lane < kQ, next);
    // (a warp step whose windows all hold one live id skips the words: its
    // word would be All() on every lane, and no one reads it)
    int32_t h[kH > 0 ? kH : 1];
    LeftHalo<N, kH>(cur, prev, lane, h);
    if (__all_sync(kFullMask, dead || OneLiveId<N, kH>(cur, h)))
      m.tap[j] = M::All(), m.tap_plain |= 1u << j;
    else
      m.tap[j] = TapMaskWord<N, kH>(cur, h);
    if constexpr (kDx) {
      if (j < V) {
        int32_t r[kH > 0 ? kH : 1];
        RightHalo<N, kH>(cur, next, lane, r);
        if (__all_sync(kFullMask, dead || OneLiveId<N, kH>(cur, r)))
          m.dx[j] = M::All(), m.dx_plain |= 1u << j;
        else
          m.dx[j] = DxMaskWord<N, kH>(cur, r);
      }
    }
    if (j + 1 < kG) {
#pragma unroll
      for (int n = 0; n < N; ++n) prev[n] = cur[n], cur[n] = next[n];
    }
  }
}

// The taps of step c_end + lane (lane < kH; c_end: the chunk's end, the
// output n = lane % N of the vector after the chunk, lane / N's tap word):
// bit k when its tap k counts (tap kH, on its own step, always: as
// MaskedTapSum), bit kH + 1 when it is not padding. Every lane calls it
// (shuffles).
template <int N, int kH, int V, bool kDx>
__device__ __forceinline__ uint32_t AfterStepTaps(const ChunkMasks<N, kH, V, kDx>& m, int lane) {
  static_assert(kDx, "the backward's words: the vector after the chunk has one");
  if ((m.tap_plain >> V) & 1) return (2u << (kH + 1)) - 1;  // (warp-uniform)
  const auto word = ShflWord(m.tap[V], (lane / N) & 31);
  const int n = lane % N;
  uint32_t bits = 1u << kH;
#pragma unroll
  for (int k = 0; k < kH; ++k) bits |= uint32_t(Bit(word, n * kH + k)) << k;
  return bits | uint32_t(Bit(word, N * kH + n)) << (kH + 1);
}

// Output n's pre-activation over the window win (win[n + k]: the input its
// tap k reads) with tap mask word m: a tap of another sequence leaves acc
// as it is (a select of the sum, so that neither a non-finite input there
// nor a non-finite weight on it reaches the output, as in the reference).
template <int N, int kH, typename Word, int M>
__device__ __forceinline__ float MaskedTapSum(const float (&w)[kH + 1], const float (&win)[M], int n, const Word& m,
                                              float acc) {
  acc = fmaf(w[kH], win[kH + n], acc);
#pragma unroll
  for (int k = 0; k < kH; ++k) acc = Bit(m, n * kH + k) ? fmaf(w[k], win[n + k], acc) : acc;
  return acc;
}

// The activated outputs of a vector whose tap word mj is not All() over the
// window win (padding outputs: 0, a select: no branch per output).
template <int N, int kH, typename Word, int M>
__device__ __forceinline__ void MaskedOutputs(const float (&w)[kH + 1], const float (&win)[M], const Word& mj,
                                              float bias, bool silu, float (&out)[N]) {
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const float v = Activate(MaskedTapSum<N, kH>(w, win, n, mj, bias), silu);
    out[n] = Bit(mj, N * kH + n) ? v : 0.f;
  }
}

// g of a vector whose tap word mj is not All() (padding outputs: 0) over
// the window win (win[n + k]: the input its tap k reads) and dy, and, where
// `share`, its share of dweight / dbias added to sums (sums[kH + 1]: the
// bias): a tap of another sequence, by selects, adds nothing (a padding
// output's tap bits are clear: TapMaskWord).
template <int N, int kH, typename Word, int M>
__device__ __forceinline__ void MaskedGrad(const float (&w)[kH + 1], const float (&win)[M], const float (&dyv)[N],
                                           float bias, bool silu, const Word& mj, bool share, float (&g)[N],
                                           float (&sums)[kH + 2]) {
#pragma unroll
  for (int n = 0; n < N; ++n) {  // (padding outputs: g = 0 and no share; selects, no branch per output)
    const bool live = Bit(mj, N * kH + n);
    const float gv = silu ? ActGrad(MaskedTapSum<N, kH>(w, win, n, mj, bias), dyv[n], true) : dyv[n];
    g[n] = live ? gv : 0.f;
    if (share) {
#pragma unroll
      for (int k = 0; k < kH; ++k) sums[k] = Bit(mj, n * kH + k) ? fmaf(g[n], win[n + k], sums[k]) : sums[k];
      sums[kH] = live ? fmaf(g[n], win[kH + n], sums[kH]) : sums[kH];
      sums[kH + 1] += g[n];
    }
  }
}

// dx of a vector from g around it (gw[i]: g at the vector's step i), dx
// word mj (kPlain: every bit set, no test): the outputs that take input n
// (output n + kH - k by its tap k) of its own sequence; padding inputs 0.
template <int N, int kH, bool kPlain, typename Word>
__device__ __forceinline__ void MaskedDx(const float (&w)[kH + 1], const float (&gw)[N + kH], const Word& mj,
                                         float (&dx)[N]) {
#pragma unroll
  for (int n = 0; n < N; ++n) {
    float acc = w[kH] * gw[n];
#pragma unroll
    for (int k = 0; k < kH; ++k)  // (a select of the sum, as MaskedTapSum)
      acc = kPlain || Bit(mj, n * kH + k) ? fmaf(w[k], gw[n + kH - k], acc) : acc;
    dx[n] = kPlain || Bit(mj, N * kH + n) ? acc : 0.f;
  }
}

}  // namespace jcc::cuda
