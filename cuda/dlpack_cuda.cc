// DLPack entry points of `_jcc_cuda` for jax_causal_conv.torch: the CUDA
// launchers (launchers.h) on caller-allocated CUDA arrays, on the caller's
// stream (`stream` is a cudaStream_t as an integer, e.g.
// torch.cuda.current_stream().cuda_stream; 0 is the legacy default stream).
// The same arguments and checks as the CPU entry points (csrc/dlpack_entry.cc),
// plus:
//   bwd_workspace_bytes(x, weight, bias, seq_idx, cu_seqlens, initial_states,
//                       activation, mode, channels_last, states_channels_last)
//   bwd(..., workspace, stream)  # workspace: >= bwd_workspace_bytes bytes
//                                # of device memory, 16-byte aligned
// Nothing here allocates or synchronises. Device-side values (cu_seqlens,
// conv_state_indices) cannot be checked on the host: the kernels clamp bad
// offsets and treat out-of-range state indices as padding rows.
#include <cuda_runtime.h>
#include <nanobind/nanobind.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "dlpack_args.h"
#include "launchers.h"

namespace nb = nanobind;

namespace jcc::dlpack {
namespace {

constexpr int32_t kCuda = nb::device::cuda::value;

cudaStream_t Stream(uintptr_t s) { return reinterpret_cast<cudaStream_t>(s); }

void Check(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("jax_causal_conv: ") + what + ": " +
                             cudaGetErrorString(err));
}

void GpuDType(DType t) {
  if (t == DType::kF64)
    ThrowType("float64 is CPU-only: use float32, float16 or bfloat16 on GPU");
}

// The arrays' device must be the current one: the launchers use it.
void CurrentDevice(const Array& x) {
  int dev = -1;
  Check(cudaGetDevice(&dev), "cudaGetDevice");
  if (dev != x.device_id())
    ThrowValue("x is on cuda:" + std::to_string(x.device_id()) + " but the current device is cuda:" +
               std::to_string(dev) + " (use torch.cuda.device(x.device))");
}

void CudaFwd(JCC_DLPACK_FWD_PARAMS, uintptr_t stream) {
  ConvArgs a = ForwardArgs(kCuda, JCC_DLPACK_FWD_NAMES);
  GpuDType(a.x_dtype);
  CurrentDevice(x);
  // (no workspace: its seq_idx calls take the shared-ids kernels)
  Check(cuda::Forward(a, nullptr, 0, Stream(stream)), "forward kernel launch");
}

size_t CudaBwdWorkspaceBytes(const Array& x, const Array& weight, const Opt& bias,
                             const Opt& seq_idx, const Opt& cu_seqlens, const Opt& initial_states,
                             int64_t activation, int64_t mode, bool channels_last,
                             bool states_channels_last) {
  ConvArgs a = ProblemArgs(kCuda, x, weight, bias, seq_idx, cu_seqlens, initial_states,
                           activation, mode, channels_last, states_channels_last);
  return BackwardWorkspaceBytes(a.batch, a.dim, a.len, a.width);
}

void CudaBwd(JCC_DLPACK_BWD_PARAMS, const Array& workspace, uintptr_t stream) {
  ConvArgs a = BackwardArgs(kCuda, JCC_DLPACK_BWD_NAMES);
  GpuDType(a.x_dtype);
  CurrentDevice(x);
  if (workspace.device_type() != kCuda || workspace.device_id() != x.device_id())
    ThrowValue("workspace must be on the device of x");
  const size_t need = BackwardWorkspaceBytes(a.batch, a.dim, a.len, a.width);
  const size_t have = workspace.nbytes();
  if (have < need)
    ThrowValue("workspace has " + std::to_string(have) + " bytes, " + std::to_string(need) +
               " needed (bwd_workspace_bytes)");
  if (reinterpret_cast<uintptr_t>(workspace.data()) % 16 != 0)
    ThrowValue("workspace must be 16-byte aligned");
  Check(cuda::Backward(a, workspace.data(), Stream(stream)), "backward kernel launch");
}

void CudaUpdate(JCC_DLPACK_UPDATE_PARAMS, uintptr_t stream) {
  UpdateArgs u = UpdateArgsOf(kCuda, JCC_DLPACK_UPDATE_NAMES);
  GpuDType(u.x_dtype);
  CurrentDevice(x);
  Check(cuda::Update(u, Stream(stream)), "update kernel launch");
}

void CudaVarlenStates(JCC_DLPACK_VARLEN_STATES_PARAMS, uintptr_t stream) {
  VarlenStatesArgs v = VarlenStatesArgsOf(kCuda, JCC_DLPACK_VARLEN_STATES_NAMES);
  GpuDType(v.x_dtype);
  CurrentDevice(x);
  Check(cuda::VarlenStates(v, Stream(stream)), "varlen_states kernel launch");
}

}  // namespace
}  // namespace jcc::dlpack

void RegisterDlpackCuda(nb::module_& m) {
  using namespace jcc::dlpack;
  m.def("fwd", &CudaFwd, JCC_DLPACK_FWD_ARGS, nb::arg("stream"),
        "Forward on CUDA arrays (DLPack), on `stream`.");
  m.def("bwd_workspace_bytes", &CudaBwdWorkspaceBytes, nb::arg("x"), nb::arg("weight"),
        nb::arg("bias").none(), nb::arg("seq_idx").none(), nb::arg("cu_seqlens").none(),
        nb::arg("initial_states").none(), nb::arg("activation"), nb::arg("mode"),
        nb::arg("channels_last"), nb::arg("states_channels_last"),
        "Bytes of device workspace bwd needs for these arguments.");
  m.def("bwd", &CudaBwd, JCC_DLPACK_BWD_ARGS, nb::arg("workspace"), nb::arg("stream"),
        "Backward on CUDA arrays (DLPack), on `stream`.");
  m.def("update", &CudaUpdate, JCC_DLPACK_UPDATE_ARGS, nb::arg("stream"),
        "Decode step on CUDA arrays (DLPack), on `stream`; conv_state is updated in place.");
  m.def("varlen_states", &CudaVarlenStates, JCC_DLPACK_VARLEN_STATES_ARGS, nb::arg("stream"),
        "Last state_len inputs of each packed sequence, on CUDA arrays (DLPack), on `stream`.");
}
