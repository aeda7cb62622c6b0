// The CPU nanobind module `_jcc_cpu`: the FFI handler capsules for platform
// "cpu", keyed by their versioned target names.
#include <nanobind/nanobind.h>

#include <type_traits>

#include "ffi_cpu.h"
#include "problem.h"

namespace nb = nanobind;

void RegisterDlpackCpu(nb::module_& m);  // dlpack_entry.cc: the torch (DLPack) entry points

namespace {

template <typename T>
nb::capsule Capsule(T* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, T, XLA_FFI_CallFrame*>,
                "not an XLA FFI handler");
  return nb::capsule(reinterpret_cast<void*>(fn));
}

}  // namespace

NB_MODULE(_jcc_cpu, m) {
  m.def("registrations", []() {
    nb::dict r;
    r["jax_causal_conv_fwd_v1"] = Capsule(jcc::CpuForwardHandler);
    r["jax_causal_conv_bwd_v1"] = Capsule(jcc::CpuBackwardHandler);
    r["jax_causal_conv_update_v1"] = Capsule(jcc::CpuUpdateHandler);
    r["jax_causal_conv_varlen_states_v1"] = Capsule(jcc::CpuVarlenStatesHandler);
    return r;
  });
  m.attr("max_width") = jcc::kMaxWidth;
  RegisterDlpackCpu(m);
}
