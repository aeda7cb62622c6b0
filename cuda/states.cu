// The small kernels around the convolution, blocks of (state row, slice of
// channels): a row's channels spread over gridDim.y blocks, so that a few
// rows (batch 1) still fill the GPU:
//   FinalStatesKernel: final_states (forward);
//   StatesGradKernel: dinitial_states, and the final-states cotangent added
//     to dx / dinitial_states (backward, after the main kernel wrote dx),
//     a warp per group of channels, lanes over the history slots;
//   ReduceKernel: dweight/dbias from the per-block partial sums, in a fixed
//     order (deterministic).
// A state row's "final window" is the H inputs final_states copies: the
// last H steps of its sequence (kRow: the row; kVarlen: sequence n; kSeqIdx:
// the row's last non-padding sequence, ending at its last valid token), each
// counting only when it belongs to that sequence (else 0), steps before the
// sequence read its initial states.
#include <algorithm>

#include "launchers.h"
#include "sequences.cuh"

namespace jcc::cuda {
namespace {

constexpr int kStatesThreads = 256;

// Where state row r's sequence lies in batch row b: [lo, e) with e the end
// of its last valid step; for kSeqIdx its id (`any` false: no valid step).
struct StateSeq {
  int64_t b, lo, e;
  int32_t id, hist_id;
  bool any;
};

// Block-wide: the state row's sequence (every thread gets the same answer).
__device__ StateSeq LocateStateSeq(const ConvArgs& a, int64_t r) {
  StateSeq s{r, 0, a.len, 0, kNoId, true};
  if (a.mode == SegmentMode::kVarlen) {
    const int64_t N = a.num_seqs;
    s.b = r / N;
    const int64_t n = r - s.b * N;
    const int32_t* cu = a.cu_seqlens + s.b * (N + 1);
    s.lo = n == 0 ? 0 : VarlenBound(a, cu, n - 1);
    s.e = Max64(VarlenBound(a, cu, n), s.lo);
  } else if (a.mode == SegmentMode::kSeqIdx) {
    __shared__ unsigned long long end;  // 1 + the last valid step, 0 if none
    if (threadIdx.x == 0) end = 0;
    __syncthreads();
    const int32_t* sid = a.seq_idx + r * a.len;
    unsigned long long mine = 0;
    for (int64_t t = threadIdx.x; t < a.len; t += blockDim.x)
      if (sid[t] >= 0) mine = (unsigned long long)(t + 1);
    if (mine) atomicMax(&end, mine);
    __syncthreads();
    s.e = int64_t(end);
    s.any = s.e > 0;
    s.id = s.any ? sid[s.e - 1] : kNoId;
    s.hist_id = HistoryId(a, r);
    s.lo = INT64_MIN / 4;  // ids decide
    __syncthreads();  // `end` is reused by the next row
  }
  return s;
}

// Final-window slot j of state row r: the step it copies (`step` >= 0), or
// the initial-states slot (`init_j` >= 0), or neither (a zero).
struct FinalSlot {
  int64_t step;   // >= 0: x at this step
  int64_t init_j; // >= 0: initial_states[r, :, init_j]
};

__device__ __forceinline__ FinalSlot FinalSlotOf(const ConvArgs& a, const StateSeq& s, int64_t j) {
  const int64_t H = a.width - 1;
  FinalSlot f{-1, -1};
  if (a.mode == SegmentMode::kSeqIdx && !s.any) {  // no valid step: the initial states
    if (a.initial_states) f.init_j = j;
    return f;
  }
  const int64_t q = s.e - H + j;
  if (a.mode == SegmentMode::kSeqIdx) {
    const int32_t id = IdAt(a, s.b, q, s.hist_id);
    if (id != s.id) return f;
    if (q >= 0) f.step = q;
    else f.init_j = q + H;  // (a matching id before 0 means initial states exist)
    return f;
  }
  const int64_t lo = a.mode == SegmentMode::kVarlen ? s.lo : 0;
  if (q >= lo) f.step = q;
  else if (a.initial_states) f.init_j = q - lo + H;
  return f;
}

template <typename T>
__global__ void __launch_bounds__(kStatesThreads) FinalStatesKernel(const ConvArgs a) {
  const int64_t H = a.width - 1, D = a.dim;
  const T* x = static_cast<const T*>(a.x);
  const T* init = static_cast<const T*>(a.initial_states);
  T* fin = static_cast<T*>(a.final_states);
  const Layout3 xl = a.x_layout(), sl = a.state_layout();
  for (int64_t r = blockIdx.x; r < a.num_states; r += gridDim.x) {
    const StateSeq s = LocateStateSeq(a, r);
    for (int64_t i = blockIdx.y * int64_t(blockDim.x) + threadIdx.x; i < D * H;
         i += int64_t(gridDim.y) * blockDim.x) {
      const int64_t d = sl.s_chan == 1 ? i % D : i / H, j = sl.s_chan == 1 ? i / D : i % H;
      const FinalSlot f = FinalSlotOf(a, s, j);
      float v = 0.f;
      if (f.step >= 0) v = ToF(x[xl.At(s.b, d, f.step)]);
      else if (f.init_j >= 0) v = ToF(init[sl.At(r, d, f.init_j)]);
      fin[sl.At(r, d, j)] = FromF<T>(v);
    }
  }
}

// g at step t of row b, channel d, under the masks (for the initial-state
// gradient: steps reading the history), from the staged inputs of steps
// `first` onwards (xin) and taps. hrow: the sequence's initial-states row;
// start: its first step (kVarlen), else 0.
template <typename T>
__device__ float GradAt(const ConvArgs& a, int64_t b, int64_t d, int64_t t, int64_t start, int64_t hrow,
                        int32_t hist_id, int64_t first, const float* xin, const float* taps, float bias) {
  auto x_at = [&](int64_t p) { return xin[p - first]; };
  auto w_at = [&](int k) { return taps[k]; };
  auto id_at = [&](int64_t p) { return IdAt(a, b, p, hist_id); };
  float pre;
  if (!MaskedPre<T>(a, t, int(a.width), bias, x_at, w_at, id_at, start, hrow, d, &pre)) return 0.f;
  return ActGrad(pre, ToF(static_cast<const T*>(a.dy)[a.io_layout().At(b, d, t)]), a.act == Activation::kSilu);
}

// The input a window reads at step p of row b, channel d: x (zero past the
// row's end), before step 0 the initial states or zeros (kVarlen: the masks
// read its history themselves).
template <typename T>
__device__ __forceinline__ float InputAt(const ConvArgs& a, int64_t b, int64_t d, int64_t p) {
  if (p >= 0) return p < a.len ? ToF(static_cast<const T*>(a.x)[a.x_layout().At(b, d, p)]) : 0.f;
  return a.mode == SegmentMode::kVarlen || !a.initial_states ? 0.f
                                                             : LoadState<T>(a, a.initial_states, b, d, p + a.width - 1);
}

// A warp per (state row, group of C channels), S = 32 / C lanes a channel
// over its H history slots (C = 1 from H = 17 on, lanes then loop): the
// channel's taps and the inputs of steps lo - H .. lo + H staged in the
// warp's shared memory, g of the sequence's first H steps (each a W-tap
// pre-activation) into the warp's shared g, then dinitial_states slot j =
// sum_{i <= j} w[j - i] g[i] into its shared acc, the final-states
// cotangent added there (slots before the sequence) or to dx, and acc out.
__host__ __device__ __forceinline__ int StatesLanes(int H) {  // S: a power of two >= H, at most 32
  int n = 1;
  while (n < H && n < 32) n *= 2;
  return n;
}
// A warp's shared floats: g[C][H], acc[C][H], taps[C][W], inputs[C][2H].
__host__ __device__ __forceinline__ int StatesWarpWords(int W) {
  const int H = W - 1;
  return 32 / StatesLanes(H) * (2 * H + W + 2 * H);
}

template <typename T>
__global__ void __launch_bounds__(kStatesThreads) StatesGradKernel(const ConvArgs a) {
  extern __shared__ float states_smem[];
  const int W = int(a.width), H = W - 1, S = StatesLanes(H), C = 32 / S;
  const int64_t D = a.dim;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  const int c = lane / S, j0 = lane % S;  // this lane's channel in the group, first slot
  float* mine = states_smem + StatesWarpWords(W) * warp;
  float* g = mine + c * H;
  float* acc = mine + C * H + c * H;
  float* taps = mine + 2 * C * H + c * W;
  float* xin = mine + 2 * C * H + C * W + c * 2 * H;
  const T* dfin = static_cast<const T*>(a.dfinal_states);
  T* dinit = static_cast<T*>(a.dinitial_states);
  T* dx = static_cast<T*>(a.dx);
  const Layout3 io = a.io_layout(), sl = a.state_layout();
  for (int64_t r = blockIdx.x; r < a.num_states; r += gridDim.x) {
    const StateSeq s = LocateStateSeq(a, r);  // (block-wide)
    const int64_t lo = a.mode == SegmentMode::kVarlen ? s.lo : 0;
    const int64_t hrow = a.mode == SegmentMode::kVarlen && a.initial_states ? r : -1;
    for (int64_t d0 = (int64_t(blockIdx.y) * nwarps + warp) * C; d0 < D; d0 += int64_t(gridDim.y) * nwarps * C) {
      const int64_t d = d0 + c;
      const bool live = d < D;  // (every lane takes part in the warp's syncs)
      const int64_t wrow = (s.b / a.batch_per_group()) * D + d;
      if (dinit) {  // g of step lo + i, where it reads the history (kSeqIdx: the history's id)
        for (int k = j0; live && k < W; k += S) taps[k] = LoadAnyF(a.weight, a.w_dtype, wrow * W + k);
        for (int i = j0; live && i < 2 * H; i += S) xin[i] = InputAt<T>(a, s.b, d, lo - H + i);
        const float bias = a.bias && live ? LoadAnyF(a.bias, a.b_dtype, wrow) : 0.f;
        __syncwarp();
        for (int i = j0; live && i < H; i += S) {
          const int64_t t = lo + i;
          const bool reads = t < s.e && (a.mode != SegmentMode::kSeqIdx || IdAt(a, s.b, t, s.hist_id) == s.hist_id);
          g[i] = reads ? GradAt<T>(a, s.b, d, t, lo, hrow, s.hist_id, lo - H, xin, taps, bias) : 0.f;
        }
        __syncwarp();
      }
      for (int j = j0; live && j < H; j += S) {  // history slot j is read by tap j - i of step lo + i
        float v = 0.f;
        if (dinit)
          for (int i = 0; i <= j; ++i) v += taps[j - i] * g[i];
        acc[j] = v;
      }
      __syncwarp();
      if (dfin) {  // (slot j of the final window goes to one step or one history slot: no two lanes meet)
        for (int j = j0; live && j < H; j += S) {
          const FinalSlot f = FinalSlotOf(a, s, j);
          const float gf = ToF(dfin[sl.At(r, d, j)]);
          if (f.step >= 0) {
            T* p = dx + io.At(s.b, d, f.step);
            *p = FromF<T>(ToF(*p) + gf);
          } else if (f.init_j >= 0) {
            acc[f.init_j] += gf;
          }
        }
        __syncwarp();
      }
      if (dinit)
        for (int j = j0; live && j < H; j += S) dinit[sl.At(r, d, j)] = FromF<T>(acc[j]);
      __syncwarp();  // the warp's shared memory is reused by the next group
    }
  }
}

// dweight[g, d, k] (k < W) and dbias[g, d] (k == W) from the workspace
// ws[g][part][d][W + 1], summed over parts in a fixed order.
__global__ void ReduceKernel(const ConvArgs a, const float* ws, int64_t nparts) {
  constexpr int kLanes = 8;
  __shared__ float part[kLanes][32];
  const int64_t W1 = a.width + 1, cols_per_group = a.dim * W1;
  const int64_t col = int64_t(blockIdx.x) * 32 + threadIdx.x;
  const bool ok = col < a.groups * cols_per_group;
  const int64_t grp = ok ? col / cols_per_group : 0, rem = col % cols_per_group;
  float s = 0.f;
  if (ok)
    for (int64_t p = threadIdx.y; p < nparts; p += kLanes)
      s += ws[(grp * nparts + p) * cols_per_group + rem];
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && ok) {
    float t = 0.f;
    for (int i = 0; i < kLanes; ++i) t += part[i][threadIdx.x];
    const int64_t d = rem / W1, k = rem % W1;
    if (k < a.width) StoreAnyF(a.dweight, a.w_dtype, (grp * a.dim + d) * a.width + k, t);
    else if (a.dbias) StoreAnyF(a.dbias, a.b_dtype, grp * a.dim + d, t);
  }
}

template <typename T>
cudaError_t FinalStatesT(const ConvArgs& a, cudaStream_t stream) {
  const dim3 blocks(unsigned(Min64(a.num_states, 65536)),
                    unsigned(Min64(CeilDiv(a.dim * (a.width - 1), int64_t(kStatesThreads)), 1024)));
  FinalStatesKernel<T><<<blocks, kStatesThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

template <typename T>
cudaError_t StatesGradT(const ConvArgs& a, cudaStream_t stream) {
  constexpr int kWarps = kStatesThreads / 32;
  const int H = int(a.width - 1), C = 32 / StatesLanes(H);
  const int64_t groups = CeilDiv(a.dim, int64_t(C));
  const dim3 blocks(unsigned(Min64(a.num_states, 65536)), unsigned(Min64(CeilDiv(groups, int64_t(kWarps)), 1024)));
  const size_t smem = size_t(kWarps) * StatesWarpWords(int(a.width)) * sizeof(float);
  StatesGradKernel<T><<<blocks, kStatesThreads, smem, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

cudaError_t FinalStates(const ConvArgs& a, cudaStream_t stream) {
  if (!a.final_states || a.width < 2 || a.num_states == 0 || a.dim == 0) return cudaSuccess;
  return WithFloatType(a.x_dtype, cudaErrorNotSupported,
                       [&](auto t) { return FinalStatesT<decltype(t)>(a, stream); });
}

cudaError_t StatesGrad(const ConvArgs& a, cudaStream_t stream) {
  if ((!a.dinitial_states && !a.dfinal_states) || a.width < 2 || a.num_states == 0 || a.dim == 0)
    return cudaSuccess;
  return WithFloatType(a.x_dtype, cudaErrorNotSupported,
                       [&](auto t) { return StatesGradT<decltype(t)>(a, stream); });
}

cudaError_t ReduceWeightGrads(const ConvArgs& a, const float* ws, int64_t nparts, cudaStream_t stream) {
  const int64_t cols = a.groups * a.dim * (a.width + 1);
  if (cols == 0) return cudaSuccess;
  ReduceKernel<<<unsigned(CeilDiv(cols, 32)), dim3(32, 8), 0, stream>>>(a, ws, nparts);
  return cudaGetLastError();
}

}  // namespace jcc::cuda
