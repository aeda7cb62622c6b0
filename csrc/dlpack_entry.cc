// DLPack entry points of `_jcc_cpu` for jax_causal_conv.torch: the CPU
// kernels on caller-allocated CPU arrays (torch tensors through nb::ndarray),
// with the same checks as the XLA FFI handlers. No PyTorch headers: any
// DLPack producer works.
//
//   fwd(x, weight, bias, residual, seq_idx, cu_seqlens, initial_states, y,
//       final_states, activation, mode, channels_last, states_channels_last)
//   bwd(x, weight, bias, seq_idx, cu_seqlens, initial_states, dy, dfinal_states,
//       dx, dweight, dbias, dinitial_states, activation, mode, channels_last,
//       states_channels_last)
//   update(x, conv_state, weight, bias, cache_seqlens, conv_state_indices, y,
//          activation)            # conv_state updated in place
//   varlen_states(x, cu_seqlens, states)
//
// Shapes, dtypes and attributes mean what the FFI bindings of ffi_args.h say
// (x is (B, D, L), or (B, L, D) with channels_last; weight (groups, D, W); ...).
// Every array must be C-contiguous in that shape; optional ones may be None.
#include <nanobind/nanobind.h>

#include <string>

#include "cpu_kernels.h"
#include "dlpack_args.h"

namespace nb = nanobind;

namespace jcc::dlpack {
namespace {

constexpr int32_t kCpu = nb::device::cpu::value;

// Host tensors: varlen offsets are checked before the kernel reads them.
void CheckVarlenOnHost(const ConvArgs& a) {
  if (a.mode == SegmentMode::kVarlen)
    Raise(CheckOffsetsOnHost(a.cu_seqlens, a.batch, a.num_seqs + 1, a.len));
}

void CpuFwd(JCC_DLPACK_FWD_PARAMS) {
  ConvArgs a = ForwardArgs(kCpu, JCC_DLPACK_FWD_NAMES);
  CheckVarlenOnHost(a);
  nb::gil_scoped_release release;
  cpu::Forward(a);
}

void CpuBwd(JCC_DLPACK_BWD_PARAMS) {
  ConvArgs a = BackwardArgs(kCpu, JCC_DLPACK_BWD_NAMES);
  CheckVarlenOnHost(a);
  nb::gil_scoped_release release;
  cpu::Backward(a);
}

void CpuUpdate(JCC_DLPACK_UPDATE_PARAMS) {
  UpdateArgs u = UpdateArgsOf(kCpu, JCC_DLPACK_UPDATE_NAMES);
  if (u.conv_state_indices) {
    for (int64_t b = 0; b < u.batch; ++b) {
      const int32_t s = u.conv_state_indices[b];
      if (s < -1 || s >= u.num_slots)
        ThrowValue("conv_state_indices[" + std::to_string(b) + "] = " + std::to_string(s) +
                   " is outside [-1, " + std::to_string(u.num_slots) + ")");
    }
  }
  nb::gil_scoped_release release;
  cpu::Update(u);
}

void CpuVarlenStates(JCC_DLPACK_VARLEN_STATES_PARAMS) {
  VarlenStatesArgs v = VarlenStatesArgsOf(kCpu, JCC_DLPACK_VARLEN_STATES_NAMES);
  Raise(CheckOffsetsOnHost(v.cu_seqlens, 1, v.num_seqs + 1, v.total));
  nb::gil_scoped_release release;
  cpu::VarlenStates(v);
}

}  // namespace
}  // namespace jcc::dlpack

void RegisterDlpackCpu(nb::module_& m) {
  using namespace jcc::dlpack;
  m.def("fwd", &CpuFwd, JCC_DLPACK_FWD_ARGS, "Forward on CPU arrays (DLPack).");
  m.def("bwd", &CpuBwd, JCC_DLPACK_BWD_ARGS, "Backward on CPU arrays (DLPack).");
  m.def("update", &CpuUpdate, JCC_DLPACK_UPDATE_ARGS,
        "Decode step on CPU arrays (DLPack); conv_state is updated in place.");
  m.def("varlen_states", &CpuVarlenStates, JCC_DLPACK_VARLEN_STATES_ARGS,
        "Last state_len inputs of each packed sequence, on CPU arrays (DLPack).");
}
