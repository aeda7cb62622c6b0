// Plain descriptions of one kernel call, shared by the CPU and CUDA kernels,
// the XLA FFI handlers and the DLPack (torch) entry points. Everything the
// kernels need is here: no framework types.
#pragma once

#include <cstdint>

#include "dtype.h"

#if defined(__CUDACC__)
#define JCC_HD __host__ __device__ __forceinline__
#else
#define JCC_HD inline
#endif

namespace jcc {

enum class Activation : int64_t { kNone = 0, kSilu = 1 };

// Widest kernel accepted by every backend.
constexpr int64_t kMaxWidth = 256;

// Element offsets of a (batch, channel, time) tensor stored as (B, D, L)
// ("channels first") or (B, L, D) ("channels last").
struct Layout3 {
  int64_t s_batch, s_chan, s_time;
  static JCC_HD Layout3 Make(int64_t dim, int64_t len, bool channels_last) {
    return channels_last ? Layout3{len * dim, 1, dim} : Layout3{dim * len, len, 1};
  }
  JCC_HD int64_t At(int64_t b, int64_t d, int64_t t) const {
    return b * s_batch + d * s_chan + t * s_time;
  }
};

// How the time axis of each batch row splits into independent sequences.
//  kRow:    one sequence per row; history = initial_states[b] (or zeros).
//  kSeqIdx: seq_idx[b, t] labels the sequences (docs/semantics.md): a tap
//           counts only when its input has the output's id (an equality
//           mask: ids need not be ordered); negative ids are padding (output
//           0, no contribution). The W-1 history positions before t = 0 carry
//           the id seq_idx[b, 0] when initial_states is given (the row's first
//           sequence owns the initial state); final states are those of the
//           row's last non-padding sequence.
//  kVarlen: cu_seqlens is (batch, N+1); in row b, cu_seqlens[b, n] ..
//           cu_seqlens[b, n+1] is sequence n, whose history is
//           initial_states[b*N + n] (or zeros) and whose final states go to
//           final_states[b*N + n]. (A vmapped varlen call has batch > 1.)
enum class SegmentMode : int { kRow = 0, kSeqIdx = 1, kVarlen = 2 };

// Scratch the backward needs for its per-chunk partial weight/bias sums
// (reduced afterwards in a fixed order, for bitwise-reproducible gradients):
// one float per batch row, channel, tap-or-bias and chunk of time steps. No
// CUDA backward plan gives a partial sum to fewer than BackwardChunkSteps
// steps (longer for wide filters, whose partials are larger), so this bounds
// them all. The caller allocates it (XLA, as an extra output: the Python
// package asks the compiled module for the number; torch, through the
// DLPack entry point), so the kernels allocate nothing. After the partial
// sums (16-byte aligned) it also holds, for the channels-first seq_idx
// backward that reads them (cuda/backward_stream.cu), each row's mask words: at most
// 4 bytes a step over whole chunks of up to 1024 steps, and a byte per warp
// step of at least 128 steps (SeqWordsBytes).
JCC_HD int64_t BackwardChunkSteps(int64_t width) { return width <= 16 ? 512 : 4096; }
JCC_HD int64_t SeqWordsBytes(int64_t batch, int64_t len) {
  const int64_t steps = len + 1023;
  return batch * (4 * steps + steps / 128 + 1) + 16;
}
JCC_HD int64_t BackwardWorkspaceBytes(int64_t batch, int64_t dim, int64_t len, int64_t width) {
  const int64_t step = BackwardChunkSteps(width);
  const int64_t chunks = (len + step - 1) / step;
  const int64_t floats = batch * dim * (width + 1) * chunks;
  return 4 * (floats > 0 ? floats : 1) + SeqWordsBytes(batch, len);
}

// Scratch the forward needs: the same mask words, for the channels-first
// seq_idx forward at W <= 16 that reads them (cuda/forward_stream.cu); no
// other forward takes any. The caller allocates it as for the backward.
JCC_HD int64_t ForwardWorkspaceBytes(int64_t batch, int64_t len, int64_t width, int64_t mode,
                                     bool channels_last) {
  const bool words = mode == int64_t(SegmentMode::kSeqIdx) && !channels_last && width >= 1 && width <= 16;
  return words ? SeqWordsBytes(batch, len) : 0;
}

// Forward and backward of the causal depthwise convolution.
//   y[b,d,t] = act(bias[g,d] + sum_k weight[g,d,k] * xp[b,d,t+k]) + residual[b,d,t]
// with g = b / (batch / groups): a vmapped weight becomes `groups` > 1.
struct ConvArgs {
  int64_t batch = 0, dim = 0, len = 0, width = 0;
  int64_t groups = 1;       // weight is (groups, dim, width); batch % groups == 0
  int64_t num_states = 0;   // rows of initial/final states: batch, or batch*N for varlen
  int64_t num_seqs = 0;     // varlen: sequences per row (N)
  bool channels_last = false;         // x, y, residual, dy, dx layout
  bool states_channels_last = false;  // (n, W-1, D) instead of (n, D, W-1)
  Activation act = Activation::kNone;
  SegmentMode mode = SegmentMode::kRow;

  DType x_dtype = DType::kF32, w_dtype = DType::kF32, b_dtype = DType::kF32;
  const void* x = nullptr;
  // x may be a strided view (DLPack callers): its innermost axis is unit
  // stride (time for channels-first, channels for channels-last); these are
  // the batch stride and the stride of the other axis, in elements. 0: dense,
  // like y. Every other tensor is dense in its layout.
  int64_t x_batch_stride = 0, x_row_stride = 0;
  const void* weight = nullptr;
  const void* bias = nullptr;        // optional, (groups, dim)
  const void* residual = nullptr;    // optional, like x (forward only)
  const int32_t* seq_idx = nullptr;  // kSeqIdx: (batch, len)
  const int32_t* cu_seqlens = nullptr;  // kVarlen: (batch, num_seqs + 1)
  const void* initial_states = nullptr;  // optional, x dtype

  // forward outputs
  void* y = nullptr;
  void* final_states = nullptr;  // optional, x dtype

  // backward inputs / outputs
  const void* dy = nullptr;
  const void* dfinal_states = nullptr;  // optional
  void* dx = nullptr;
  void* dweight = nullptr;          // weight dtype
  void* dbias = nullptr;            // bias dtype, when bias is present
  void* dinitial_states = nullptr;  // x dtype, when initial states are present

  JCC_HD int64_t state_len() const { return width - 1; }
  // y, residual, dy and dx (dense).
  JCC_HD Layout3 io_layout() const { return Layout3::Make(dim, len, channels_last); }
  // x: dense, or the strided view described above.
  JCC_HD Layout3 x_layout() const {
    Layout3 l = io_layout();
    if (x_batch_stride) l.s_batch = x_batch_stride;
    if (x_row_stride) (channels_last ? l.s_time : l.s_chan) = x_row_stride;
    return l;
  }
  JCC_HD Layout3 state_layout() const {
    return Layout3::Make(dim, width - 1, states_channels_last);
  }
  JCC_HD int64_t batch_per_group() const { return batch / groups; }
};

// Decode step: S new tokens per row against a rolling (or circular) state.
// Channels-first: x and y (batch, dim, seqlen), conv_state (num_slots, dim,
// state_len). Channels-last: x and y (batch, seqlen, dim), conv_state
// (num_slots, state_len, dim), the layout JAX models keep caches in.
struct UpdateArgs {
  int64_t batch = 0, dim = 0, seqlen = 0, width = 0;
  int64_t groups = 1;        // weight (groups, dim, width); batch % groups == 0
  int64_t num_slots = 0, state_len = 0;
  bool channels_last = false;
  Activation act = Activation::kNone;
  DType x_dtype = DType::kF32, w_dtype = DType::kF32, b_dtype = DType::kF32;
  const void* x = nullptr;
  void* conv_state = nullptr;         // updated in place
  const void* weight = nullptr;
  const void* bias = nullptr;
  const int32_t* cache_seqlens = nullptr;      // optional (batch,): circular buffer
  const int32_t* conv_state_indices = nullptr; // optional (batch,): slot per row, -1 = pad
  void* y = nullptr;
  // x may be a strided view (DLPack callers), as ConvArgs::x: unit stride
  // along its last axis, these strides for the other two; 0: dense.
  int64_t x_batch_stride = 0, x_row_stride = 0;
  // Element offsets: token s of channel d in row b of y (dense) and of x,
  // and entry j of channel d in state slot n.
  JCC_HD int64_t YAt(int64_t b, int64_t d, int64_t s) const {
    return channels_last ? (b * seqlen + s) * dim + d : (b * dim + d) * seqlen + s;
  }
  JCC_HD int64_t XAt(int64_t b, int64_t d, int64_t s) const {
    const int64_t sb = x_batch_stride ? x_batch_stride : dim * seqlen;
    const int64_t sr = x_row_stride ? x_row_stride : (channels_last ? dim : seqlen);
    return channels_last ? b * sb + s * sr + d : b * sb + d * sr + s;
  }
  JCC_HD bool x_dense() const { return x_batch_stride == 0 && x_row_stride == 0; }
  JCC_HD int64_t StateAt(int64_t n, int64_t d, int64_t j) const {
    return channels_last ? (n * state_len + j) * dim + d : (n * dim + d) * state_len + j;
  }
};

// Last state_len inputs of each packed sequence, zero-padded on the left:
// states (num_seqs, dim, state_len), or (num_seqs, state_len, dim) with
// channels_last.
struct VarlenStatesArgs {
  int64_t total = 0, dim = 0, num_seqs = 0, state_len = 0;
  bool channels_last = false;
  DType x_dtype = DType::kF32;
  const void* x = nullptr;            // (total, dim), rows x_row_stride apart (0: dim)
  int64_t x_row_stride = 0;
  const int32_t* cu_seqlens = nullptr;  // (num_seqs + 1)
  void* states = nullptr;
  JCC_HD int64_t XAt(int64_t t, int64_t d) const { return t * (x_row_stride ? x_row_stride : dim) + d; }
  JCC_HD int64_t StateAt(int64_t n, int64_t d, int64_t j) const {
    return channels_last ? (n * state_len + j) * dim + d : (n * dim + d) * state_len + j;
  }
};

}  // namespace jcc
