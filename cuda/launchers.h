// CUDA entry points for the causal conv1d kernels. Plain C++ over the
// descriptions of problem.h, independent of XLA: the FFI handlers
// (ffi_cuda.cc) and the DLPack/torch entry points both call the four public
// launchers below. Every launcher runs on `stream`, allocates nothing and
// returns the launch status.
//
// A call's kernel family is chosen once, by PlanForward / PlanBackward
// (dispatch.cu); each family's file then runs the typed kernel for the
// dtype and width:
//   kStream (forward_stream.cu, backward_stream.cu): channels-first rows of
//     whole aligned 16-byte vectors (x may be strided by whole vectors), one
//     sequence per row or seq_idx, W <= 16;
//   kMma (forward_mma.cu, mma.cuh): the forward of the same rows of
//     bfloat16 or float16 x, one sequence per row or seq_idx, W > 16, summed
//     on tensor cores; (backward_mma.cu: a backward of bfloat16 rows at
//     W 2..8 on tensor cores, the plan's at W 8 where it walks the longest
//     spans: MmaBackwardFits);
//   kMmaCl (forward_mma_cl.cu): forward only, kWideCl's problems of 16-bit
//     x (W > 16), summed on tensor cores;
//   (both tensor-core forwards take seq_idx up to a width as their dense
//     kernel plus forward_seq_fix.cu, which writes the outputs near an id
//     change and the padding ones again; dispatch.cu's SeqFixMaxWidth);
//   kWide (forward_wide.cu, backward_wide.cu, wide.cuh, wide_cf.cuh): the same rows,
//     W > 16 at a run-time width;
//   kWideCl (forward_wide_cl.cu, backward_wide_cl.cu, wide_cl.cuh):
//     channels-last, dense x of whole aligned groups of kWideClCh channels,
//     one sequence per row or seq_idx, W > 16 (the wide family's work);
//   kClRow (forward_cl_row.cu, backward_cl_row.cu, cl_row.cuh; its plan
//     in cl_row_plan.cu): channels-last, whole aligned channel vectors,
//     dense x, every sequence mode, W <= 16;
//   kTile (forward_tile.cu, backward_tile.cu, tile.cuh): everything else:
//     any layout, width, alignment, strides and sequence mode.
// states.cu holds the per-state-row kernels (final states, the initial-state
// gradient and the final-state cotangent) and the fixed-order reduction of
// the weight-gradient partial sums.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "problem.h"

namespace jcc::cuda {

// --- public ---------------------------------------------------------------------

// y (and final_states) from x. float32/float16/bfloat16 x only. The
// channels-first seq_idx forward may use `workspace` (workspace_bytes of
// device memory, at least ForwardWorkspaceBytes from problem.h, contents
// ignored; nullptr / 0: none, and it takes a kernel that needs none).
cudaError_t Forward(const ConvArgs& a, void* workspace, int64_t workspace_bytes, cudaStream_t stream);

// dx, dweight, dbias, dinitial_states. dweight/dbias are reduced in a fixed
// order through `workspace` (BackwardWorkspaceBytes(batch, dim, len, width)
// bytes of device memory, from problem.h, 4-byte aligned, contents ignored),
// so results are bitwise reproducible.
cudaError_t Backward(const ConvArgs& a, void* workspace, cudaStream_t stream);

// Decode step, in place on u.conv_state (the caller copies the old state
// there first when the buffers differ).
cudaError_t Update(const UpdateArgs& u, cudaStream_t stream);

// Last state_len inputs of each packed sequence.
cudaError_t VarlenStates(const VarlenStatesArgs& v, cudaStream_t stream);

// --- plans and families (internal to the CUDA module) ----------------------------

struct ForwardPlan {
  enum Family { kNone, kStream, kMma, kWide, kMmaCl, kWideCl, kClRow, kTile } family = kNone;
  int64_t spans_per_row = 0;  // kStream: warp spans per row; kMma(Cl), kWide(Cl): spans per row
  int64_t chunks_per_span = 1;  // kStream: warp chunks a warp walks (1: seq_idx)
  // seq_idx run as the family's dense forward, then FixSeqIdxForward
  bool seq_fix = false;
  // kStream seq_idx: the dense streaming kernel reading each row's mask
  // words from the workspace, made there by a pre-pass (dispatch.cu's
  // SeqWordsForward), instead of the shared-ids kernel
  bool seq_words = false;
};

struct BackwardPlan {
  enum Family { kNone, kStream, kMma, kWide, kWideCl, kClRow, kTile } family = kNone;
  int64_t chunks_per_span = 1;  // kStream, kMma: warp chunks a warp walks (kStream seq_idx: 1)
  int64_t nchunk = 0;   // partial sums per (batch row, channel): spans or time chunks
                        // (kClRow: completed by its launcher, as are nparts and steps)
  int64_t ntiles = 0, tiles_per_chunk = 1;         // kTile
  int64_t nparts = 0;   // partial sums per (weight group, channel)
  int steps = 0;        // kClRow: time steps a thread walks (the launcher's)
  // kStream seq_idx: the dense streaming kernel reading each row's mask
  // words, made once by a pre-pass (dispatch.cu's SeqWordsBackward: long
  // rows at W 2..16), instead of the shared-ids kernel
  bool seq_words = false;
};

ForwardPlan PlanForward(const ConvArgs& a, int64_t workspace_bytes);
BackwardPlan PlanBackward(const ConvArgs& a);

// The backward's partial dweight / dbias sums, in floats: the start of its
// workspace (BackwardWorkspaceBytes, csrc/problem.h, bounds it)
inline int64_t BackwardPartialFloats(const ConvArgs& a, const BackwardPlan& p) {
  return a.groups * p.nparts * a.dim * (a.width + 1);
}

// A plan's switch in the environment, read at each call (tests, A/B,
// diagnosis): the digit `name` holds when it is one of `allowed`'s, else -1
inline int EnvDigit(const char* name, const char* allowed) {
  const char* e = std::getenv(name);
  return e != nullptr && e[0] != 0 && e[1] == 0 && std::strchr(allowed, e[0]) != nullptr ? e[0] - '0' : -1;
}

// Family launchers, given a plan of their family.
// (ws: the forward's workspace, for p.seq_words)
cudaError_t ForwardStream(const ConvArgs& a, const ForwardPlan& p, void* ws, int64_t ws_bytes,
                          cudaStream_t stream);
cudaError_t ForwardMma(const ConvArgs& a, const ForwardPlan& p, cudaStream_t stream);
cudaError_t ForwardMmaCl(const ConvArgs& a, const ForwardPlan& p, cudaStream_t stream);
cudaError_t ForwardWide(const ConvArgs& a, const ForwardPlan& p, cudaStream_t stream);
cudaError_t ForwardWideCl(const ConvArgs& a, const ForwardPlan& p, cudaStream_t stream);
cudaError_t ForwardClRow(const ConvArgs& a, const ForwardPlan& p, cudaStream_t stream);
cudaError_t ForwardTile(const ConvArgs& a, cudaStream_t stream);
// seq_idx: the outputs a dense forward got wrong (forward_seq_fix.cu)
cudaError_t FixSeqIdxForward(const ConvArgs& a, cudaStream_t stream);
cudaError_t BackwardStream(const ConvArgs& a, const BackwardPlan& p, float* ws, cudaStream_t stream);
cudaError_t BackwardMma(const ConvArgs& a, const BackwardPlan& p, float* ws, cudaStream_t stream);
cudaError_t BackwardWide(const ConvArgs& a, const BackwardPlan& p, float* ws, cudaStream_t stream);
cudaError_t BackwardWideCl(const ConvArgs& a, const BackwardPlan& p, float* ws, cudaStream_t stream);
// (completes the plan: its slice, chunks and parts, from the kernel's occupancy)
cudaError_t BackwardClRow(const ConvArgs& a, BackwardPlan& p, float* ws, cudaStream_t stream);
cudaError_t BackwardTile(const ConvArgs& a, const BackwardPlan& p, float* ws, cudaStream_t stream);

// Plan pieces each family computes for itself (0 / kNone: it does not fit).
int64_t StreamSpans(const ConvArgs& a, int64_t max_chunks_per_span, int64_t* chunks_per_span);
int64_t WideSpans(const ConvArgs& a);  // spans per row, either wide family
// kMma's backward (backward_mma.cu): whether a problem of the streaming
// rows takes it (W 8 at its longest span; JCC_BWD_MMA=1: W 2..8, =0:
// never), and its spans per row
bool MmaBackwardFits(const ConvArgs& a);
int64_t MmaBackwardSpans(const ConvArgs& a, int64_t* chunks_per_span);
constexpr int kWideClCh = 8;  // channels (warps) per block of the channels-last wide family
// kClRow (cl_row_plan.cu): time chunks per row; *steps gets the time steps
// a thread walks. The plan asks with blocks_per_sm 0 (the width's base
// slice, or JCC_CL_*_STEPS): at least as many chunks as the launch's, so
// that what fits there fits the launch; the launcher, typed, asks again
// with its kernel's blocks an SM, which may double the slice.
int64_t ClRowChunks(const ConvArgs& a, bool backward, int blocks_per_sm, int* steps);
int ClRowVec(const ConvArgs& a, bool backward);  // channels per thread
BackwardPlan TileBackwardPlan(const ConvArgs& a);

// The decode hot paths (update_vec.cu, update_cl_vec.cu, update_ring_cf.cu):
// false when the call does not fit them (nothing launched), else the launch
// status in *err.
bool UpdateVec(const UpdateArgs& u, cudaStream_t stream, cudaError_t* err);
bool UpdateClVec(const UpdateArgs& u, cudaStream_t stream, cudaError_t* err);
bool UpdateRingCf(const UpdateArgs& u, cudaStream_t stream, cudaError_t* err);

// The current device's SM count, asked of the runtime once per device (the
// query is host time on every decode step: docs/performance-log.md);
// dispatch.cu.
int CurrentDeviceSms(cudaError_t* err);

// states.cu
cudaError_t FinalStates(const ConvArgs& a, cudaStream_t stream);
cudaError_t StatesGrad(const ConvArgs& a, cudaStream_t stream);
cudaError_t ReduceWeightGrads(const ConvArgs& a, const float* ws, int64_t nparts, cudaStream_t stream);

}  // namespace jcc::cuda
