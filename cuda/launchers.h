// CUDA launchers for the causal conv1d kernels. Plain C++ over the
// descriptions of problem.h, independent of XLA: the FFI handlers
// (ffi_cuda.cc) and the DLPack/torch entry points both call these. Every
// launcher runs on `stream`, allocates nothing and returns the launch status.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "problem.h"

namespace jcc::cuda {

// y (and final_states) from x. float32/float16/bfloat16 x only.
cudaError_t Forward(const ConvArgs& a, cudaStream_t stream);

// The streaming kernel of forward_stream.cu for y, when the problem fits it
// (channels-first, no seq_idx/varlen, width <= 4, aligned rows): returns
// false, launching nothing, otherwise.
bool TryForwardStreaming(const ConvArgs& a, cudaStream_t stream, cudaError_t* err);

// The lean channels-last forward of forward_cl_row.cu for y, when the problem
// fits it (one sequence per row, 2 <= width <= 4, whole aligned 16-byte
// channel vectors): returns false, launching nothing, otherwise.
bool TryForwardClRow(const ConvArgs& a, cudaStream_t stream, cudaError_t* err);

// The streaming backward of backward_stream.cu: its warp chunks per row when
// the problem fits it (as TryForwardStreaming), else 0; and its launch,
// writing per-chunk partials to the workspace that Backward then reduces.
int64_t StreamingBackwardTiles(const ConvArgs& a);
cudaError_t BackwardStreaming(const ConvArgs& a, float* ws, cudaStream_t stream);

// The lean channels-last backward of backward_cl_row.cu (one sequence per
// row, 2 <= width <= 4, whole aligned channel vectors) on the plan of
// backward.cu's BwdClKernel.
cudaError_t BackwardClRow(const ConvArgs& a, int64_t nchunk, float* ws, cudaStream_t stream);

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

}  // namespace jcc::cuda
