// The channels-last rows' plan (cl_row.cuh): channels a thread, the time
// steps a thread walks and the time chunks of a row.
#include <climits>
#include <cstdlib>

#include "cl_row.cuh"
#include "launchers.h"

namespace jcc::cuda {
namespace {

// The slice, from W = 7 forward and W = 5 backward (below them the longer
// slice measured level on an H100, and on an H200 2-4% slower forward at W
// 5, 6; faster backward at W 5..7 there: thirty-second session): the
// width's base (forward ClFwdSteps, backward kClBwdSteps) or twice it,
// whichever the grid's waves favour. A wave is the blocks the GPU holds at
// once; its time is taken as its blocks' slice plus a set-up: the taps and
// the history read again, and in the backward the partial weight sums
// (each block's reduction, written and summed again by ReduceWeightGrads).
// The set-ups in steps, half the base slice forward and twice it backward,
// lie mid-range of those that picked the faster slice at every measured
// cell (docs/performance-log.md, 2026-11-27, thirteenth session). The
// longer slice halves the blocks: it wins where it saves a wave (1.3 waves
// to 1) or halves many; it loses where the base grid was one wave already.
constexpr int kLongSliceMinWidth[2] = {7, 5};  // forward, backward

int64_t Chunks(const ConvArgs& a, int64_t steps) { return CeilDiv(a.len, int64_t(kClY) * steps); }

int Slice(const ConvArgs& a, bool backward, int base, int blocks_per_sm) {
  if (a.width < kLongSliceMinWidth[backward] || blocks_per_sm <= 0) return base;
  cudaError_t err = cudaSuccess;
  const int64_t sms = CurrentDeviceSms(&err);
  if (err != cudaSuccess) return base;
  const int64_t slots = sms * blocks_per_sm;
  const int64_t setup = backward ? 2 * base : base / 2;
  const int vec = ClRowVec(a, backward);
  auto cost = [&](int64_t steps) {
    return CeilDiv(ClBlocks(a.batch, Chunks(a, steps), a.dim, vec), slots) * (steps + setup);
  };
  return cost(2 * base) < cost(base) ? 2 * base : base;
}

// JCC_CL_FWD_STEPS (a multiple of 8 up to ClFwdMaxSteps) and
// JCC_CL_BWD_STEPS (kClBwdSteps up to ClBwdMaxSteps) override the choice:
// tests and diagnosis. Read at each call, so that one process can compare
// settings (a call captured in a CUDA graph keeps what was read at capture).
int StepsOverride(bool backward, int W) {
  const char* e = std::getenv(backward ? "JCC_CL_BWD_STEPS" : "JCC_CL_FWD_STEPS");
  if (e == nullptr) return 0;
  const int v = std::atoi(e);
  return ClStepsValid(backward, W, v) ? v : 0;
}

}  // namespace

int64_t ClRowChunks(const ConvArgs& a, bool backward, int blocks_per_sm, int* steps) {
  const int W = int(a.width);
  const int set = StepsOverride(backward, W);
  *steps = set ? set : Slice(a, backward, backward ? kClBwdSteps : ClFwdSteps(W), blocks_per_sm);
  const int64_t nchunk = Chunks(a, *steps);
  return ClBlocks(a.batch, nchunk, a.dim, ClRowVec(a, backward)) <= INT_MAX ? nchunk : 0;
}

int ClRowVec(const ConvArgs& a, bool backward) {
  const int W = int(a.width), bytes = DTypeBytes(a.x_dtype);
  return backward ? ClBwdVec(bytes, W) : ClFwdVec(bytes, W);
}

}  // namespace jcc::cuda
