// The CPU nanobind module `_jcc_cpu`: the FFI handler capsules for platform
// "cpu", and the torch (DLPack) entry points.
#include <nanobind/nanobind.h>

#include "ffi_cpu.h"
#include "problem.h"
#include "registrations.h"

namespace nb = nanobind;

void RegisterDlpackCpu(nb::module_& m);  // dlpack_entry.cc

NB_MODULE(_jcc_cpu, m) {
  m.def("registrations", []() {
    return jcc::Registrations(jcc::Handlers<XLA_FFI_Handler>{
        jcc::CpuForwardHandler, jcc::CpuBackwardHandler, jcc::CpuUpdateHandler,
        jcc::CpuVarlenStatesHandler, jcc::CpuForwardV1Handler, jcc::CpuUpdateV1Handler,
        jcc::CpuVarlenStatesV1Handler});
  });
  m.def("backward_workspace_bytes", &jcc::BackwardWorkspaceBytes, nb::arg("batch"),
        nb::arg("dim"), nb::arg("len"), nb::arg("width"),
        "Bytes of the backward's workspace result (see csrc/problem.h).");
  m.def("forward_workspace_bytes", &jcc::ForwardWorkspaceBytes, nb::arg("batch"), nb::arg("len"),
        nb::arg("width"), nb::arg("mode"), nb::arg("channels_last"),
        "Bytes of the forward's workspace result (see csrc/problem.h).");
  m.def("target_names", &jcc::TargetNames, "{role: versioned FFI target name}.");
  m.attr("max_width") = jcc::kMaxWidth;
  // The DLPack entry points take x as a strided view (problem.h), and
  // compact weight/bias/one-token shapes (dlpack_args.h).
  m.attr("strided_x") = true;
  m.attr("compact_args") = true;
  RegisterDlpackCpu(m);
}
