// The one dispatch of the convolution kernels: which family runs a call
// (launchers.h lists them) is decided here, from the problem alone, once;
// the family's launcher then picks its typed kernel for the dtype and width.
#include <climits>

#include "common.cuh"
#include "launchers.h"

namespace jcc::cuda {
namespace {

bool Aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// What the two hot families share: one sequence per row (initial states
// allowed), dense x, a width they are compiled for.
bool HotShape(const ConvArgs& a, int min_w) {
  return a.mode == SegmentMode::kRow && a.x_batch_stride == 0 && a.x_row_stride == 0 &&
         a.width >= min_w && a.width <= 4 && a.x_dtype != DType::kF64;
}

// Channels-first rows of whole aligned 16-byte vectors.
bool StreamFits(const ConvArgs& a, const void* in2, const void* out) {
  const int64_t n = 16 / DTypeBytes(a.x_dtype);
  return !a.channels_last && HotShape(a, 1) && a.len % n == 0 && Aligned16(a.x) &&
         Aligned16(in2) && Aligned16(out);
}

// Channels-last rows of whole aligned channel vectors (the backward's are
// narrower: kClV channels).
bool ClRowFits(const ConvArgs& a, int64_t vec, const void* in2, const void* out) {
  const size_t bytes = size_t(vec) * DTypeBytes(a.x_dtype);
  auto aligned = [&](const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0; };
  return a.channels_last && HotShape(a, 2) && a.dim % vec == 0 && aligned(a.x) && aligned(in2) &&
         aligned(out);
}

}  // namespace

ForwardPlan PlanForward(const ConvArgs& a) {
  ForwardPlan p;
  if (a.batch == 0 || a.dim == 0 || a.len == 0) return p;
  int64_t unused;
  if (StreamFits(a, a.residual, a.y) && (p.warps_per_row = StreamWarpsPerRow(a, false, &unused)) > 0) {
    p.family = ForwardPlan::kStream;
  } else if (ClRowFits(a, 16 / DTypeBytes(a.x_dtype), a.residual, a.y) &&
             (p.nchunk = ClRowChunks(a, false)) > 0) {
    p.family = ForwardPlan::kClRow;
  } else {
    p.family = ForwardPlan::kTile;
  }
  return p;
}

BackwardPlan PlanBackward(const ConvArgs& a) {
  BackwardPlan p;
  if (a.batch == 0 || a.dim == 0 || a.len == 0) return p;
  if (StreamFits(a, a.dy, a.dx) &&
      (p.warps_per_row = StreamWarpsPerRow(a, true, &p.chunks_per_warp)) > 0) {
    p.family = BackwardPlan::kStream;
    p.nchunk = p.warps_per_row;
  } else if (ClRowFits(a, 4, a.dy, a.dx) && (p.nchunk = ClRowChunks(a, true)) > 0) {
    p.family = BackwardPlan::kClRow;
  } else {
    p = TileBackwardPlan(a);
  }
  p.nparts = a.batch_per_group() * p.nchunk;
  return p;
}

cudaError_t Forward(const ConvArgs& a, cudaStream_t stream) {
  if (a.x_dtype == DType::kF64) return cudaErrorNotSupported;
  const ForwardPlan p = PlanForward(a);
  cudaError_t err = cudaSuccess;
  switch (p.family) {
    case ForwardPlan::kStream: err = ForwardStream(a, p, stream); break;
    case ForwardPlan::kClRow: err = ForwardClRow(a, p, stream); break;
    case ForwardPlan::kTile: err = ForwardTile(a, stream); break;
    case ForwardPlan::kNone: break;
  }
  if (err != cudaSuccess) return err;
  return FinalStates(a, stream);
}

cudaError_t Backward(const ConvArgs& a, void* workspace, cudaStream_t stream) {
  if (a.x_dtype == DType::kF64) return cudaErrorNotSupported;
  float* ws = static_cast<float*>(workspace);
  const BackwardPlan p = PlanBackward(a);
  // Every plan's partial sums fit BackwardWorkspaceBytes (csrc/problem.h).
  if (a.groups * p.nparts * a.dim * (a.width + 1) * 4 >
      BackwardWorkspaceBytes(a.batch, a.dim, a.len, a.width))
    return cudaErrorInvalidValue;
  cudaError_t err = cudaSuccess;
  switch (p.family) {
    case BackwardPlan::kStream: err = BackwardStream(a, p, ws, stream); break;
    case BackwardPlan::kClRow: err = BackwardClRow(a, p, ws, stream); break;
    case BackwardPlan::kTile: err = BackwardTile(a, p, ws, stream); break;
    case BackwardPlan::kNone: break;
  }
  if (err != cudaSuccess) return err;
  if ((err = ReduceWeightGrads(a, ws, p.nparts, stream)) != cudaSuccess) return err;
  return StatesGrad(a, stream);
}

}  // namespace jcc::cuda
