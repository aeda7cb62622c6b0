// The channels-last wide family (forward_wide_cl.cu, backward_wide_cl.cu):
// channels-last, dense x of whole aligned groups of kWideClCh channels,
// W > 16 at a run-time width, one sequence per row or seq_idx. It runs the
// wide family's per-channel work (wide.cuh: a warp per channel, lane l on
// the run of kWideR outputs from c0 + kWideR * l) unchanged; only the
// staging differs. A block's kWideClCh warps take the channels of one group
// (warp w: channel kWideClCh * g + w) of a batch row over a span of
// kWideSpan chunks. Per chunk the block copies the rows (steps) of its
// channels, 16 or 32 bytes each, into a shared raw buffer (cp.async; the next
// chunk's rows in flight while it computes on this one), then each thread
// writes a row out as floats into the warps' windows (wide.cuh's layout).
// The warps' output runs come back through a shared buffer (WideClOut) and
// leave as whole rows. seq_idx: the ids of a step are every channel's, so
// one staged copy serves the block, and "the chunk is clean" is
// block-uniform.
#pragma once

#include "wide.cuh"

namespace jcc::cuda {

constexpr int kWideClThreads = 32 * kWideClCh;
// Output row s of the chunk, channel w at ys[w * kWideClCol + WideClOut(s)]:
// a column per warp, skewed by 4 words per 16 rows (a lane's run is stored
// as 4 conflict-free 16-byte words; the rows are read conflict-free).
__host__ __device__ constexpr int WideClOut(int s) { return s + 4 * (s >> 4); }
constexpr int kWideClCol = WideClOut(kWideChunk);
// That layout as StoreWideClRows takes it (the tensor-core forward has its own).
struct WideClRunCols {
  static constexpr int kCol = kWideClCol;
  __device__ static int At(int s) { return WideClOut(s); }
};

// Where the raw rows' 16-byte piece q lies (in pieces) when IssueWideClRows
// swizzles: XORed with the index of its 128-byte line (mod 8), a permutation
// inside each line, so that 8 threads reading pieces 2 or 4 apart (the
// tensor-core forward's transposition) hit 8 different banks' words.
__host__ __device__ constexpr int WideClSwizzled(int q) { return q ^ ((q >> 3) & 7); }
// Where piece q lies, swizzled or not (IssueWideClRows writes it there, the
// reader finds it there).
template <bool kSwizzle>
__host__ __device__ constexpr int WideClPiece(int q) { return kSwizzle ? WideClSwizzled(q) : q; }

// A block's shared memory, in 4-byte words: per warp (warp_words each) the
// x window (xs), and backward the g buffer (gs), the dy of the chunk's and
// the next runs (dys), then taps and dweight sums; after the warps the ids
// (idx: the window's layout, ido: the outputs'), the output rows (ys) and
// the raw rows of x (rx: steps c0 - H .. c0 + kWideChunk (+ hp backward))
// and backward dy (rdy: steps c0 .. c0 + kWideChunk + hp).
struct WideClSmem {
  int H, hp, nx, no;
  int xs, gs, dys, taps, dws, warp_words;
  int idx, ido, ys, rx, rdy, words;
  __host__ __device__ WideClSmem(int W, bool backward, bool masked, int elem_bytes) {
    H = W - 1;
    hp = RoundUp(H, kWideR);
    nx = H + kWideChunk + (backward ? hp : 0);
    no = kWideChunk + (backward ? hp : 0);
    // (the window arrays as in WideSmem: kWideR slots to spare)
    xs = 0;
    gs = xs + WideAt(nx + 2 * kWideR);
    dys = gs + (backward ? WideAt(no + kWideR) : 0);
    taps = RoundUp(dys + (backward ? WideAt(no) : 0), 4);
    dws = taps + WideTapWords(W, backward);
    warp_words = RoundUp(dws + (backward ? W : 0), 4);
    idx = kWideClCh * warp_words;
    ido = idx + (masked ? WideAt(nx + 2 * kWideR) : 0);
    ys = RoundUp(ido + (masked ? WideAt(no + kWideR) : 0), 4);
    rx = RoundUp(ys + kWideClCh * kWideClCol, 4);
    rdy = rx + nx * kWideClCh * elem_bytes / 4;
    words = rdy + (backward ? no * kWideClCh * elem_bytes / 4 : 0);
  }
};

// Where a block works: batch row b, channel group g (channels kWideClCh * g
// ..), the first chunk of its span. Groups of one span are consecutive
// blocks, so that the rows' sectors shared by neighbouring groups are read
// from DRAM once.
struct WideClPlace {
  int64_t b, g, first_chunk;
};

// (kCh: channels per group, kWideClCh but for the channels-last tensor-core
// forward's wider groups)
template <int kCh = kWideClCh>
__device__ __forceinline__ WideClPlace LocateWideCl(const ConvArgs& a, int64_t spans_per_row) {
  const int64_t groups = a.dim / kCh, blk = blockIdx.x;
  const int64_t rest = blk / groups, b = rest / spans_per_row;
  return {b, blk - rest * groups, (rest - b * spans_per_row) * kWideSpan};
}

template <int kCh = kWideClCh>
__host__ __device__ __forceinline__ int64_t WideClBlocks(const ConvArgs& a, int64_t spans_per_row) {
  return a.batch * (a.dim / kCh) * spans_per_row;
}

// Starts the copies of the group's rows of steps o .. o + n of src (a
// channels-last tensor like y) into raw[i * kCh ..] (the 16-byte pieces
// moved by WideClSwizzled where kSwizzle: n * kCh / 64 whole 128-byte lines);
// zeros past the row's end; steps before 0 are left to the caller. (A block
// of kCh warps; consecutive threads copy the consecutive 16-byte pieces of a
// row.)
template <typename T, int kCh = kWideClCh, bool kSwizzle = false>
__device__ __forceinline__ void IssueWideClRows(const ConvArgs& a, const T* src, int64_t b, int64_t g, int64_t o,
                                                int n, T* raw) {
  constexpr int N = 16 / int(sizeof(T)), P = kCh / N;  // elements, pieces per row
  const T* row0 = src + a.io_layout().At(b, g * kCh, 0);
  for (int q = threadIdx.x; q < n * P; q += 32 * kCh) {
    const int i = q / P, piece = q - i * P;
    const int64_t t = o + i;
    if (t >= 0)
      CpAsync<16>(raw + WideClPiece<kSwizzle>(q) * N, t < a.len ? row0 + t * a.dim + piece * N : row0,
                  t < a.len);
  }
  CpAsyncCommit();
}

// Raw rows i < n (steps o + i) out as floats: channel w to dst + w *
// warp_words + WideAt(i + off) (warp w's window). Steps before 0: the
// initial states (or zeros). The caller waits for the copies and syncs.
template <typename T>
__device__ __forceinline__ void ConvertWideClRows(const ConvArgs& a, const T* raw, int64_t b, int64_t g, int64_t o,
                                                  int n, float* dst, int warp_words, int off) {
  constexpr int N = 16 / int(sizeof(T)), P = kWideClCh / N;
  for (int i = threadIdx.x; i < n; i += kWideClThreads) {
    float v[kWideClCh];
    const int64_t t = o + i;
    if (t >= 0) {
#pragma unroll
      for (int p = 0; p < P; ++p) {
        float part[N];
        Unpack<T, N>(reinterpret_cast<const uint4*>(raw)[i * P + p], part);  // (one 16-byte read)
#pragma unroll
        for (int c = 0; c < N; ++c) v[p * N + c] = part[c];
      }
    } else {
      const int64_t j = t + a.width - 1;  // the state's slot
#pragma unroll
      for (int c = 0; c < kWideClCh; ++c)
        v[c] = a.initial_states && j >= 0 ? LoadState<T>(a, a.initial_states, b, g * kWideClCh + c, j) : 0.f;
    }
    float* p = dst + WideAt(i + off);
#pragma unroll
    for (int c = 0; c < kWideClCh; ++c) p[c * warp_words] = v[c];
  }
}

// The ids of the window's steps o .. o + sm.nx (HistoryId before step 0,
// kNoId past the end; as StagedId) into idx[WideAt(i + kWideR)], and of the outputs'
// steps o + H .. + sm.no into ido[WideAt(e)]. Returns this thread's share
// of "every step holds one live id" (the steps CountedSteps counts; the
// caller ANDs it over the block).
__device__ __forceinline__ bool StageWideClIds(const ConvArgs& a, int64_t b, int64_t o, const WideClSmem& sm,
                                               int32_t hist, int32_t* idx, int32_t* ido) {
  const int32_t first = StagedId(IdAt(a, b, o + sm.H, hist));  // (the chunk's first step: always counted)
  const StepRange counted = CountedSteps(a, o, sm.nx, hist);
  bool one = first >= 0;
  for (int i = threadIdx.x; i < sm.nx; i += kWideClThreads) {
    const int32_t id = StagedId(IdAt(a, b, o + i, hist));
    idx[WideAt(i + kWideR)] = id;
    const int e = i - sm.H;
    if (e >= 0 && e < sm.no) ido[WideAt(e)] = id;
    one = one && (id == first || i < counted.lo || i >= counted.hi);
  }
  return one;
}

// This warp's run (steps kWideR * lane + j of the chunk) into the rows.
__device__ __forceinline__ void PutWideClRun(float* ys, const float (&v)[kWideR]) {
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  float4* p = reinterpret_cast<float4*>(ys + w * kWideClCol + WideClOut(kWideR * lane));
#pragma unroll
  for (int q = 0; q < kWideR / 4; ++q) p[q] = make_float4(v[4 * q], v[4 * q + 1], v[4 * q + 2], v[4 * q + 3]);
}

// The chunk's rows (steps c0 + s, up to the row's end) to dst as whole rows
// of the group's channels, plus the residual's when res; row s of channel w
// at ys[w * Out::kCol + Out::At(s)].
// (A block of kCh warps, a thread per kPiece channels of a row: consecutive
// threads store a row's consecutive pieces.)
template <typename T, int kCh = kWideClCh, int kPiece = kCh, typename Out = WideClRunCols>
__device__ __forceinline__ void StoreWideClRows(const ConvArgs& a, T* dst, const T* res, int64_t b, int64_t g,
                                                int64_t c0, const float* ys) {
  constexpr int P = kCh / kPiece;  // pieces per row
  const Layout3 io = a.io_layout();
  for (int q = threadIdx.x; q < kWideChunk * P; q += 32 * kCh) {
    const int s = q / P, c1 = (q - s * P) * kPiece;  // the row, its piece's first channel
    if (c0 + s >= a.len) break;
    const int64_t o = io.At(b, g * kCh + c1, c0 + s);
    float v[kPiece], r[kPiece];
#pragma unroll
    for (int c = 0; c < kPiece; ++c) v[c] = ys[(c1 + c) * Out::kCol + Out::At(s)];
    if (res) {
      LoadVec<T, kPiece>(res + o, r);
#pragma unroll
      for (int c = 0; c < kPiece; ++c) v[c] += r[c];
    }
    StoreVec<T, kPiece>(dst + o, v);
  }
}

}  // namespace jcc::cuda
