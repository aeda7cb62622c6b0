// XLA FFI handlers for platform "cpu": check, describe, run the CPU kernel.
#include "ffi_cpu.h"

#include <cstring>

#include "cpu_kernels.h"
#include "ffi_args.h"

namespace jcc {
namespace {

ffi::Error RunForward(const ConvArgs& a) {
  if (a.mode == SegmentMode::kVarlen)
    JCC_RETURN_IF_ERROR(CheckOffsetsOnHost(a.cu_seqlens, a.batch, a.num_seqs + 1, a.len));
  cpu::Forward(a);
  return ffi::Error::Success();
}

// (the workspace unused: checked as the CUDA handler checks it)
ffi::Error CpuForward(JCC_FORWARD_PARAMS, ffi::Result<ffi::AnyBuffer> workspace) {
  ConvArgs a;
  JCC_RETURN_IF_ERROR(MakeForwardArgs(&a, JCC_FORWARD_NAMES));
  JCC_RETURN_IF_ERROR(CheckWorkspace(ForwardWorkspaceBytes(a), workspace));
  return RunForward(a);
}

ffi::Error CpuBackward(JCC_BACKWARD_PARAMS, ffi::Result<ffi::AnyBuffer> workspace) {
  ConvArgs a;
  JCC_RETURN_IF_ERROR(MakeBackwardArgs(&a, JCC_BACKWARD_NAMES));
  JCC_RETURN_IF_ERROR(CheckWorkspace(BackwardWorkspaceBytes(a), workspace));
  if (a.mode == SegmentMode::kVarlen)
    JCC_RETURN_IF_ERROR(CheckOffsetsOnHost(a.cu_seqlens, a.batch, a.num_seqs + 1, a.len));
  cpu::Backward(a);
  return ffi::Error::Success();
}

ffi::Error CpuUpdate(JCC_UPDATE_PARAMS) {
  UpdateArgs u;
  JCC_RETURN_IF_ERROR(MakeUpdateArgs(&u, JCC_UPDATE_NAMES));
  if (conv_state.untyped_data() != new_state->untyped_data())  // not aliased: work on a copy
    std::memcpy(new_state->untyped_data(), conv_state.untyped_data(), conv_state.size_bytes());
  if (u.conv_state_indices) {
    for (int64_t b = 0; b < u.batch; ++b) {
      const int32_t s = u.conv_state_indices[b];
      if (s < -1 || s >= u.num_slots)
        return Invalid("conv_state_indices[" + std::to_string(b) + "] = " + std::to_string(s) +
                       " is outside [-1, " + std::to_string(u.num_slots) + ")");
    }
  }
  cpu::Update(u);
  return ffi::Error::Success();
}

ffi::Error CpuVarlenStates(JCC_VARLEN_STATES_PARAMS) {
  VarlenStatesArgs v;
  JCC_RETURN_IF_ERROR(MakeVarlenStatesArgs(&v, JCC_VARLEN_STATES_NAMES));
  JCC_RETURN_IF_ERROR(CheckOffsetsOnHost(v.cu_seqlens, 1, v.num_seqs + 1, v.total));
  cpu::VarlenStates(v);
  return ffi::Error::Success();
}

ffi::Error CpuForwardV1(JCC_FORWARD_PARAMS) {
  ConvArgs a;
  JCC_RETURN_IF_ERROR(MakeForwardArgs(&a, JCC_FORWARD_NAMES));
  return RunForward(a);
}
ffi::Error CpuUpdateV1(JCC_UPDATE_PARAMS_V1) { return CpuUpdate(JCC_UPDATE_NAMES_V1, false); }
ffi::Error CpuVarlenStatesV1(JCC_VARLEN_STATES_PARAMS_V1) {
  return CpuVarlenStates(JCC_VARLEN_STATES_NAMES_V1, false);
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(CpuForwardHandler, CpuForward,
                              JCC_FORWARD_BINDING(ffi::Ffi::Bind()).Ret<ffi::AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(CpuBackwardHandler, CpuBackward,
                              JCC_BACKWARD_BINDING(ffi::Ffi::Bind()).Ret<ffi::AnyBuffer>());
XLA_FFI_DEFINE_HANDLER_SYMBOL(CpuUpdateHandler, CpuUpdate, JCC_UPDATE_BINDING(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CpuVarlenStatesHandler, CpuVarlenStates,
                              JCC_VARLEN_STATES_BINDING(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CpuForwardV1Handler, CpuForwardV1, JCC_FORWARD_BINDING(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CpuUpdateV1Handler, CpuUpdateV1, JCC_UPDATE_BINDING_V1(ffi::Ffi::Bind()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(CpuVarlenStatesV1Handler, CpuVarlenStatesV1,
                              JCC_VARLEN_STATES_BINDING_V1(ffi::Ffi::Bind()));

}  // namespace jcc
