// The CUDA nanobind module `_jcc_cuda`: the FFI handler capsules for platform
// "CUDA", under the same versioned target names as the CPU ones, and the
// torch (DLPack) entry points.
#include <nanobind/nanobind.h>

#include "ffi_cuda.h"
#include "registrations.h"

namespace nb = nanobind;

void RegisterDlpackCuda(nb::module_& m);  // dlpack_cuda.cc

NB_MODULE(_jcc_cuda, m) {
  m.def("registrations", []() {
    return jcc::Registrations(jcc::Handlers<XLA_FFI_Handler>{
        jcc::CudaForwardHandler, jcc::CudaBackwardHandler, jcc::CudaUpdateHandler,
        jcc::CudaVarlenStatesHandler, jcc::CudaForwardV1Handler, jcc::CudaUpdateV1Handler,
        jcc::CudaVarlenStatesV1Handler});
  });
  m.def("handler_calls", []() { return jcc::cuda_handler_calls.load(); },
        "How many times XLA has executed the CUDA handlers (not counting command-buffer replays).");
  m.attr("strided_x") = true;     // as the CPU module (csrc/module.cc)
  m.attr("compact_args") = true;
  RegisterDlpackCuda(m);
}
