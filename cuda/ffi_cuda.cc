// XLA FFI handlers for platform "CUDA": the shared bindings of ffi_args.h,
// validated on the host, then the launchers of launchers.h on XLA's stream.
#include "ffi_cuda.h"

#include <cuda_runtime.h>

#include <atomic>

#include <string>

#include "ffi_args.h"
#include "launchers.h"

namespace jcc {

// Handler executions so far: when XLA records a handler into a command buffer
// (CUDA graph), replays run the recorded kernels without calling it, which is
// how tests tell that the capture happened.
std::atomic<int64_t> cuda_handler_calls{0};

namespace {

ffi::Error CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return ffi::Error::Success();
  return ffi::Error::Internal(std::string("jax_causal_conv: ") + what + ": " +
                              cudaGetErrorString(err));
}

ffi::Error GpuDType(DType t) {
  if (t == DType::kF64) return Invalid("float64 is CPU-only: use float32, float16 or bfloat16 on GPU");
  return ffi::Error::Success();
}

ffi::Error RunForward(cudaStream_t stream, const ConvArgs& a, void* workspace, int64_t workspace_bytes) {
  JCC_RETURN_IF_ERROR(GpuDType(a.x_dtype));
  return CudaStatus(cuda::Forward(a, workspace, workspace_bytes, stream), "forward kernel launch");
}

// The workspaces (ForwardWorkspaceBytes, BackwardWorkspaceBytes, checked by
// CheckWorkspace) are extra results that XLA allocates, so nothing here
// allocates memory.
ffi::Error CudaForward(cudaStream_t stream, JCC_FORWARD_PARAMS, ffi::Result<ffi::AnyBuffer> workspace) {
  cuda_handler_calls.fetch_add(1, std::memory_order_relaxed);
  ConvArgs a;
  JCC_RETURN_IF_ERROR(MakeForwardArgs(&a, JCC_FORWARD_NAMES));
  JCC_RETURN_IF_ERROR(CheckWorkspace(ForwardWorkspaceBytes(a), workspace));
  return RunForward(stream, a, workspace->untyped_data(), int64_t(workspace->size_bytes()));
}

ffi::Error CudaBackward(cudaStream_t stream, JCC_BACKWARD_PARAMS,
                        ffi::Result<ffi::AnyBuffer> workspace) {
  cuda_handler_calls.fetch_add(1, std::memory_order_relaxed);
  ConvArgs a;
  JCC_RETURN_IF_ERROR(MakeBackwardArgs(&a, JCC_BACKWARD_NAMES));
  JCC_RETURN_IF_ERROR(CheckWorkspace(BackwardWorkspaceBytes(a), workspace));
  JCC_RETURN_IF_ERROR(GpuDType(a.x_dtype));
  return CudaStatus(cuda::Backward(a, workspace->untyped_data(), stream), "backward kernel launch");
}

ffi::Error CudaUpdate(cudaStream_t stream, JCC_UPDATE_PARAMS) {
  cuda_handler_calls.fetch_add(1, std::memory_order_relaxed);
  UpdateArgs u;
  JCC_RETURN_IF_ERROR(MakeUpdateArgs(&u, JCC_UPDATE_NAMES));
  JCC_RETURN_IF_ERROR(GpuDType(u.x_dtype));
  if (conv_state.untyped_data() != new_state->untyped_data() && conv_state.size_bytes() > 0) {
    JCC_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(new_state->untyped_data(), conv_state.untyped_data(),
                        conv_state.size_bytes(), cudaMemcpyDeviceToDevice, stream),
        "state copy"));
  }
  return CudaStatus(cuda::Update(u, stream), "update kernel launch");
}

ffi::Error CudaVarlenStates(cudaStream_t stream, JCC_VARLEN_STATES_PARAMS) {
  cuda_handler_calls.fetch_add(1, std::memory_order_relaxed);
  VarlenStatesArgs v;
  JCC_RETURN_IF_ERROR(MakeVarlenStatesArgs(&v, JCC_VARLEN_STATES_NAMES));
  JCC_RETURN_IF_ERROR(GpuDType(v.x_dtype));
  return CudaStatus(cuda::VarlenStates(v, stream), "varlen_states kernel launch");
}

// (no workspace: the shared-ids kernels serve its seq_idx calls)
ffi::Error CudaForwardV1(cudaStream_t stream, JCC_FORWARD_PARAMS) {
  cuda_handler_calls.fetch_add(1, std::memory_order_relaxed);
  ConvArgs a;
  JCC_RETURN_IF_ERROR(MakeForwardArgs(&a, JCC_FORWARD_NAMES));
  return RunForward(stream, a, nullptr, 0);
}
ffi::Error CudaUpdateV1(cudaStream_t stream, JCC_UPDATE_PARAMS_V1) {
  return CudaUpdate(stream, JCC_UPDATE_NAMES_V1, false);
}
ffi::Error CudaVarlenStatesV1(cudaStream_t stream, JCC_VARLEN_STATES_PARAMS_V1) {
  return CudaVarlenStates(stream, JCC_VARLEN_STATES_NAMES_V1, false);
}

}  // namespace

// Every handler only launches kernels (and, for the update, a device copy)
// on the given stream and allocates nothing: safe to capture into CUDA graphs.
XLA_FFI_DEFINE_HANDLER_SYMBOL(CudaForwardHandler, CudaForward,
                              JCC_FORWARD_BINDING(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>())
                                  .Ret<ffi::AnyBuffer>(),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(CudaBackwardHandler, CudaBackward,
                              JCC_BACKWARD_BINDING(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>())
                                  .Ret<ffi::AnyBuffer>(),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(CudaUpdateHandler, CudaUpdate,
                              JCC_UPDATE_BINDING(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(CudaVarlenStatesHandler, CudaVarlenStates,
                              JCC_VARLEN_STATES_BINDING(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
                              {ffi::Traits::kCmdBufferCompatible});

XLA_FFI_DEFINE_HANDLER_SYMBOL(CudaForwardV1Handler, CudaForwardV1,
                              JCC_FORWARD_BINDING(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(CudaUpdateV1Handler, CudaUpdateV1,
                              JCC_UPDATE_BINDING_V1(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(CudaVarlenStatesV1Handler, CudaVarlenStatesV1,
                              JCC_VARLEN_STATES_BINDING_V1(ffi::Ffi::Bind().Ctx<ffi::PlatformStream<cudaStream_t>>()),
                              {ffi::Traits::kCmdBufferCompatible});

}  // namespace jcc
