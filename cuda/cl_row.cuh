// Pieces shared by the channels-last row kernels (forward_cl_row.cu,
// backward_cl_row.cu): a block of kClX x kClY threads, kClX channel vectors
// by kClY time slices; each thread owns kV channels (an aligned word of
// kV * sizeof(T) bytes: narrower as the width grows, so that the taps and
// the window of the last W - 1 inputs stay in registers) and walks its
// slice of time forwards. Widths up to 16, each compiled at its own width
// (kW == W), as the streaming kernels.
//
// seq_idx and varlen (kMasked): the block stages the ids of its steps once
// (varlen: each step's sequence index, and the sequence's first step). With
// seq_idx (ClMask::kSeqIdx) a thread keeps the ids of its last W steps in
// registers and masks each tap by a select; with varlen a step whose last
// W - 1 ids equal its own (a running count) takes the plain taps, the
// others the masked ones (MaskedClHistory).
#pragma once

#include "common.cuh"
#include "cp_async.cuh"
#include "sequences.cuh"

namespace jcc::cuda {

constexpr int kClX = 32;
constexpr int kClY = 4;
// Time steps per thread, forward: more as the width grows, where each
// slice's set-up (its taps, the history of W - 1 steps read again) costs
// more and a thread holds fewer channels. A call takes the width's base
// slice or twice it (cl_row_plan.cu chooses from the grid's size); the
// kernels size their ids for the longer. W 1..4 take W 5..8's slice,
// word (below) and unrolled groups: with 16-byte words the taps and
// window of 8 channels held 117-148 registers at W 4 at 16-bit types (3-4
// blocks an SM), and the forward ran slower there than at W 5
// (docs/performance-log.md, thirty-fourth session); W 1, in 16-byte words,
// 32-step slices and the step loop before, measured slower than W 2 (and
// faster in W 2's configuration: thirty-fifth session). W 7 / 8 in 4-byte
// words held 80-96 registers against 96-128, and measured 8-17% slower
// (thirty-fifth session).
__host__ __device__ constexpr int ClFwdSteps(int kW) { return kW <= 8 ? 64 : 128; }
__host__ __device__ constexpr int ClFwdMaxSteps(int kW) { return 2 * ClFwdSteps(kW); }
// Time steps per thread, backward: kClBwdSteps or twice it (cl_row_plan.cu;
// W <= 4 has no shared memory left for more ids); never fewer, as a
// block's partial weight sums must cover at least BackwardChunkSteps
// (csrc/problem.h) steps.
constexpr int kClBwdSteps = 128;
__host__ __device__ constexpr int ClBwdMaxSteps(int kW) { return kW <= 4 ? 128 : 256; }
// The slices a kernel of width kW takes: whole staged groups of 8
// steps, within the bounds above (the plan's overrides and the launchers
// check the same rule).
__host__ __device__ constexpr bool ClStepsValid(bool backward, int kW, int steps) {
  return steps % 8 == 0 && (backward ? steps >= kClBwdSteps && steps <= ClBwdMaxSteps(kW)
                                     : steps >= 8 && steps <= ClFwdMaxSteps(kW));
}

// Channels per thread: the forward's word is 8 or 4 bytes as the width
// grows (W 1..8, 9..16); the backward keeps 4 channels (W <= 4), then
// 2, then 1, in words of at least 4 bytes (cp.async's smallest).
__host__ __device__ constexpr int ClFwdVec(int bytes_of_t, int kW) {
  return (kW <= 8 ? 8 : 4) / bytes_of_t;
}
__host__ __device__ constexpr int ClBwdVec(int bytes_of_t, int kW) {
  const int v = kW <= 4 ? 4 : kW <= 8 ? 2 : 1;
  return v * bytes_of_t >= 4 ? v : 4 / bytes_of_t;
}

// Blocks an SM asked of the compiler for the row kernels (0: unbounded).
// The forward asks 4 at W 9..16 (as it did at the buckets 12 and 16, which
// held them before the eighteenth session): unbounded, its seq_idx
// instantiations took 3 blocks' share for a masked body that runs in few
// groups, and measured slower. The backward (compiled at every W) asks 3
// at W 9..12, as the bucket 12 did (168 registers, no spill at 16-bit
// types; unbounded it took 2 blocks' share); 3 at 16 spilled and measured
// slower, as did 5 for the forward at 8. The forward also asks 4 at W 7
// and 5 at W 6, where the seq_idx instantiations took one block fewer
// than dense; the backward's seq_idx instantiations ask 4 at W 5 and 6,
// where unbounded they took 3 blocks' share against dense's 5 (4 fit
// them without a spill and measured 10-13% faster: thirty-second
// session; varlen's, 3 blocks at W 6, not measured). Elsewhere
// unbounded: a bound of 1 let the backward take more registers at W 4 and
// 8 and lose a block, and bounds of 5 on the backward at W 3..7 and on the
// dense forward at W 4 spilled and measured slower (docs/performance-
// log.md, eighth, fifteenth and seventeenth sessions).
__host__ __device__ constexpr int ClFwdMinBlocks(int kW) { return kW >= 9 || kW == 7 ? 4 : kW == 6 ? 5 : 0; }
__host__ __device__ constexpr int ClBwdMinBlocks(int kW, bool seq_idx) {
  return kW > 8 && kW <= 12 ? 3 : seq_idx && (kW == 5 || kW == 6) ? 4 : 0;
}

// kV channels of one time step kept as loaded (raw T, one 4-, 8- or 16-byte
// word): half the registers of floats for 16-bit types.
template <typename T, int kV>
struct alignas(kV * sizeof(T)) ChRaw {
  T e[kV];
  __device__ __forceinline__ float operator[](int c) const {
    if constexpr (std::is_same_v<T, __nv_bfloat16> && kV % 2 == 0)
      return Bf16WordToF(reinterpret_cast<const uint32_t*>(e)[c / 2], c % 2);  // (c known at compile time)
    else
      return ToF(e[c]);
  }
};

template <typename T, int kV>
__device__ __forceinline__ ChRaw<T, kV> LoadChRaw(const T* p) {
  constexpr int kBytes = kV * int(sizeof(T));
  using V = std::conditional_t<kBytes == 16, uint4, std::conditional_t<kBytes == 8, uint2,
            std::conditional_t<kBytes == 4, unsigned, unsigned short>>>;
  static_assert(sizeof(V) == kBytes, "one 2-, 4-, 8- or 16-byte word");
  ChRaw<T, kV> r;
  *reinterpret_cast<V*>(r.e) = __ldg(reinterpret_cast<const V*>(p));
  return r;
}

// Taps (W == kW) and biases of kV consecutive channels, weight row `first`
// onwards.
template <int kW, int kV>
__device__ __forceinline__ void LoadClTaps(const ConvArgs& a, int64_t first, float (&w)[kW][kV],
                                           float (&bias)[kV]) {
  float rows[kV * kW];  // (the kV rows are consecutive: one dtype switch for all)
  LoadAnyRowF<kV * kW>(a.weight, a.w_dtype, first * kW, rows);
#pragma unroll
  for (int c = 0; c < kV; ++c) {
#pragma unroll
    for (int k = 0; k < kW; ++k) w[k][c] = rows[c * kW + k];
  }
  if (a.bias) {
    LoadAnyRowF<kV>(a.bias, a.b_dtype, first, bias);
  } else {
#pragma unroll
    for (int c = 0; c < kV; ++c) bias[c] = 0.f;
  }
}

// win[i] = the input at step ts - H + i for kV channels from c0 (before
// step 0: the initial states (rows mode, seq_idx mode), or zeros).
template <typename T, int kV, int H>
__device__ __forceinline__ void LoadClHistory(const ConvArgs& a, const T* xb, int64_t b, int64_t c0,
                                              int64_t ts, float (*win)[kV]) {
  const int Hreal = int(a.width) - 1;
#pragma unroll
  for (int i = 0; i < H; ++i) {
    const int64_t t = ts - H + i;
    if (t >= 0) {
      const ChRaw<T, kV> r = LoadChRaw<T, kV>(xb + t * a.dim);
#pragma unroll
      for (int c = 0; c < kV; ++c) win[i][c] = r[c];
    } else {
      const bool init = a.initial_states && a.mode != SegmentMode::kVarlen && Hreal + t >= 0;
#pragma unroll
      for (int c = 0; c < kV; ++c)
        win[i][c] = init ? LoadState<T>(a, a.initial_states, b, c0 + c, Hreal + t) : 0.f;
    }
  }
}

// The block's per-step sequence data: ids of steps [t_lo - kPad, t_lo + steps
// + kPad) (kSeqIdx: seq_idx, kHistory before 0; kVarlen: the sequence index,
// kNoId outside [0, len)), and (kVarlen) each step's sequence start; steps
// (the block's, at most kMaxSteps) given to Stage.
template <int kMaxSteps>
struct ClIds {
  static constexpr int kPad = 16;
  static constexpr int kN = kMaxSteps + 2 * kPad;
  int32_t id[kN];
  int32_t start[kN];  // relative to t_lo, floored at -2 kPad (only p >= start tests are made)
  uint8_t kind[kMaxSteps / 4];  // GroupIds of the block's groups of U >= 4 steps (StageGroupKinds)
  int64_t t_lo;
  __device__ __forceinline__ int32_t Id(int64_t t) const { return id[t - t_lo + kPad]; }
  __device__ __forceinline__ int64_t Start(int64_t t) const { return t_lo + start[t - t_lo + kPad]; }
  template <int U>
  __device__ __forceinline__ uint8_t Kind(int64_t t) const { return kind[(t - t_lo) / U]; }

  // Block-wide; then __syncthreads().
  __device__ void Stage(const ConvArgs& a, int64_t b, int64_t lo, int steps) {
    const int tid = threadIdx.y * blockDim.x + threadIdx.x, nthreads = blockDim.x * blockDim.y;
    if (tid == 0) t_lo = lo;
    const int32_t hist = a.mode == SegmentMode::kSeqIdx ? HistoryId(a, b) : kNoId;
    for (int i = tid; i < steps + 2 * kPad; i += nthreads) {
      const int64_t t = lo - kPad + i;
      if (a.mode == SegmentMode::kSeqIdx) {
        id[i] = IdAt(a, b, t, hist);
      } else if (t < 0 || t >= a.len) {
        id[i] = kNoId, start[i] = int32_t(t - lo);
      } else {
        const VarlenSeq q = VarlenSeqOf(a, b, t);
        id[i] = int32_t(q.n), start[i] = int32_t(Max64(q.start - lo, -2 * kPad));
      }
    }
  }
};

// The same interface without sequence data (one sequence per row).
struct NoClIds {
  __device__ __forceinline__ int32_t Id(int64_t) const { return 0; }
  __device__ __forceinline__ int64_t Start(int64_t) const { return 0; }
  template <int U>
  __device__ __forceinline__ uint8_t Kind(int64_t) const { return 0; }
};

template <int kMaxSteps, bool kMasked>
using ClIdsOf = std::conditional_t<kMasked, ClIds<kMaxSteps>, NoClIds>;

// The sequence masks a row kernel compiles: none (one sequence per row);
// seq_idx only, every width (each tap's mask from a window of ids kept in
// registers, a select per tap, no branch: the varlen history path's
// registers stay out; at W 12 and 16 it measured 2.6x faster in
// the backward than kAny, docs/performance-log.md, 2026-11-26, eighth
// session); or any mode, chosen at run time (varlen).
enum class ClMask { kNone, kSeqIdx, kAny };

template <int kW, typename F>
__host__ cudaError_t WithClMask(const ConvArgs& a, F&& f) {
  using N = std::integral_constant<ClMask, ClMask::kNone>;
  using S = std::integral_constant<ClMask, ClMask::kSeqIdx>;
  using A = std::integral_constant<ClMask, ClMask::kAny>;
  if (a.mode == SegmentMode::kRow) return f(N());
  if (a.mode == SegmentMode::kSeqIdx) return f(S());
  return f(A());
}

// ClMask::kAny (kCount): how many of the H steps before ts share ts's id,
// counted back until one differs; 0 otherwise.
template <int H, bool kCount, typename Ids>
__device__ __forceinline__ int SameIdRunBefore(const Ids& ids, int64_t ts) {
  int run = 0;
  if constexpr (kCount) {
    const int32_t id0 = ids.Id(ts);
    for (int k = 1; k <= H && ids.Id(ts - k) == id0; ++k) run = k;
  }
  return run;
}

// How a row kernel compiles one step of its walk: kChecked (the step may
// lie outside the slice; masks by kMask; the activation read at run time),
// kMasked (inside the slice, kSeqIdx masks), kDense (inside the slice, in a
// window of one sequence: no masks). Whole groups of U inside steps are
// unrolled, so the register window moves by renaming.
enum class StepKind { kChecked, kMasked, kDense };

// Masked kernels: what the ids of steps t - H .. t + U - 1 (a group of U
// steps and the window before it) hold: one sequence (id >= 0; the group
// can take the dense steps), padding only (every output and every dx of
// the group is zero), or anything else.
enum class GroupIds { kMixed, kOneSequence, kPadding };
template <int H, int U, typename Ids>
__device__ __forceinline__ GroupIds ClassifyGroup(const Ids& ids, int64_t t) {
  const int32_t id0 = ids.Id(t + U - 1);
  bool same = true, padding = id0 < 0;
#pragma unroll
  for (int i = -H; i < U - 1; ++i) {
    const int32_t id = ids.Id(t + i);
    same &= id == id0;
    padding &= id < 0;
  }
  return padding ? GroupIds::kPadding : same && id0 >= 0 ? GroupIds::kOneSequence : GroupIds::kMixed;
}

// Block-wide, after the ids' barrier; then __syncthreads(). The kinds of the
// block's groups of U steps from t_lo (`steps`: the block's, whole groups),
// one group a thread: classified once, not by each warp at each group
// (its H + U id loads and tests were about a tenth of a masked walk's
// instructions).
template <int H, int U, int kMaxSteps>
__device__ __forceinline__ void StageGroupKinds(ClIds<kMaxSteps>& ids, int steps) {
  static_assert(U >= 4 && ClIds<kMaxSteps>::kPad >= H, "kind[] holds groups of 4 steps or more");
  const int tid = threadIdx.y * blockDim.x + threadIdx.x, nthreads = blockDim.x * blockDim.y;
  for (int g = tid; g < steps / U; g += nthreads)
    ids.kind[g] = uint8_t(ClassifyGroup<H, U>(ids, ids.t_lo + int64_t(g) * U));
}

// The register window win[0 .. H) (steps t - H .. t - 1) moved past a group
// of U steps whose values at step t + u are next(u).
template <int H, int U, int kV, typename Next>
__device__ __forceinline__ void ShiftWindow(float (*win)[kV], Next&& next) {
#pragma unroll
  for (int k = 0; k < H; ++k) {
    if (k + U < H) {
#pragma unroll
      for (int c = 0; c < kV; ++c) win[k][c] = win[k + U][c];
    } else {
      next(k + U - H, win[k]);
    }
  }
}

// The row kernels stage x (and dy / the residual) in groups of U steps
// through shared memory, double buffered with cp.async: group t + U goes
// into buffer buf ^ 1 while group t, in buf, is waited for (after the last
// group nothing more starts).
template <int U, typename Stage>
__device__ __forceinline__ void StageNextGroup(int64_t t, int64_t end, int buf, Stage&& stage) {
  if (t + U < end) {
    stage(t + U, buf ^ 1);
    CpAsyncWait<1>();
  } else {
    CpAsyncWait<0>();
  }
}

// ClMask::kSeqIdx: id[i] = the id of step t - H + i (i <= H), for the
// current step t; Next(t) shifts in step t's id.
template <int H>
struct ClIdWindow {
  int32_t id[H + 1];
  template <typename Ids>
  __device__ __forceinline__ void Start(const Ids& ids, int64_t ts) {
#pragma unroll
    for (int i = 0; i < H; ++i) id[i + 1] = ids.Id(ts - H + i);
  }
  template <typename Ids>
  __device__ __forceinline__ void Next(const Ids& ids, int64_t t) {
#pragma unroll
    for (int i = 0; i < H; ++i) id[i] = id[i + 1];
    id[H] = ids.Id(t);
  }
  // whether step t - H + i belongs to step t - H + j's sequence
  __device__ __forceinline__ bool Same(int i, int j) const { return id[i] == id[j]; }
};

// The value tap k (< H) of output t reads when its input's id differs
// from the output's id `id`: zero, or (kVarlen with initial states) the
// history slot of t's sequence. c: channel.
template <typename T, typename Ids>
__device__ __forceinline__ float MaskedClHistory(const ConvArgs& a, const Ids& ids, int64_t b,
                                                 int64_t t, int k, int H, int32_t id, int64_t c) {
  // id < 0: an output past the row's end (the backward computes its taps
  // before knowing it is dead); it has no sequence, hence no history.
  if (a.mode != SegmentMode::kVarlen || !a.initial_states || id < 0) return 0.f;
  // p: the step tap k reads; the state row holds the W - 1 steps before
  // the sequence start
  const int64_t p = t - H + k, start = ids.Start(t);
  return LoadState<T>(a, a.initial_states, b * a.num_seqs + id, c, p - start + (a.width - 1));
}

// Channels-last grids are 1-D, the channel groups (kClX x kV channels) of one
// (batch row, time chunk) consecutive: the blocks in flight then read and
// write whole time steps.
__host__ __device__ __forceinline__ int64_t ClGroups(int64_t dim, int kV) {
  return CeilDiv(dim, int64_t(kClX) * kV);
}
inline int64_t ClBlocks(int64_t batch, int64_t nchunk, int64_t dim, int kV) {
  return batch * nchunk * ClGroups(dim, kV);
}
struct ClBlock {
  int64_t b, chunk, c0;  // batch row, time chunk, this thread's first channel
};
template <int kV>
__device__ __forceinline__ ClBlock LocateClBlock(int64_t dim, int64_t nchunk) {
  const int64_t groups = ClGroups(dim, kV), rest = DivFast(blockIdx.x, groups);
  const int64_t b = DivFast(rest, nchunk);
  return {b, rest - b * nchunk, ((blockIdx.x - rest * groups) * kClX + threadIdx.x) * kV};
}

// What a row kernel does with its staged group of U steps from t (`inside`:
// the group lies where the unrolled kinds may run): `dense()` for a group
// of one sequence (or any group, unmasked), `padding()` for padding only,
// otherwise the masked walk resumed from the ids (kSeqIdx: the window of
// ids; kAny: the running count of equal ids), `masked()` unrolled where
// kUnrollMasked, else `checked()` step by step.
template <ClMask kMask, int H, int U, bool kUnrollMasked, typename Ids, typename Dense,
          typename Padding, typename Masked, typename Checked>
__device__ __forceinline__ void WalkGroup(const Ids& ids, int64_t t, int64_t ts, bool inside,
                                          ClIdWindow<H>& idw, int& run, Dense&& dense,
                                          Padding&& padding, Masked&& masked, Checked&& checked) {
  constexpr bool kMasked = kMask != ClMask::kNone, kIds = kMask == ClMask::kSeqIdx;
  const GroupIds kinds = kMasked && inside ? GroupIds(ids.template Kind<U>(t)) : GroupIds::kMixed;
  if (inside && (!kMasked || kinds == GroupIds::kOneSequence)) return dense();
  if (kinds == GroupIds::kPadding) return padding();
  // (a dense group does not track the ids)
  if constexpr (kIds) idw.Start(ids, t);
  if constexpr (kMasked && !kIds) {
    if (t != ts) run = SameIdRunBefore<H, true>(ids, t - 1);
  }
  if constexpr (kIds && kUnrollMasked) {
    if (inside) return masked();
  }
  checked();
}

}  // namespace jcc::cuda
