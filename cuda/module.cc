// The CUDA nanobind module `_jcc_cuda`: the FFI handler capsules for
// platform "CUDA", under the same versioned target names as the CPU ones.
#include <nanobind/nanobind.h>

#include <type_traits>

#include "ffi_cuda.h"
#include "problem.h"

namespace nb = nanobind;

void RegisterDlpackCuda(nb::module_& m);  // dlpack_cuda.cc: the torch (DLPack) entry points

namespace {

template <typename T>
nb::capsule Capsule(T* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, T, XLA_FFI_CallFrame*>,
                "not an XLA FFI handler");
  return nb::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

NB_MODULE(_jcc_cuda, m) {
  m.def("registrations", []() {
    nb::dict r;
    r["jax_causal_conv_fwd_v1"] = Capsule(jcc::CudaForwardHandler);
    r["jax_causal_conv_bwd_v1"] = Capsule(jcc::CudaBackwardHandler);
    r["jax_causal_conv_update_v1"] = Capsule(jcc::CudaUpdateHandler);
    r["jax_causal_conv_varlen_states_v1"] = Capsule(jcc::CudaVarlenStatesHandler);
    return r;
  });
  m.attr("max_width") = jcc::kMaxWidth;
  RegisterDlpackCuda(m);
}
