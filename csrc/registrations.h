// The FFI targets a nanobind module hands to Python: the handler capsules of
// one platform, keyed by their versioned target names (jax_causal_conv/_ffi.py
// registers them). A target's name gets a new _vN when its arguments change
// incompatibly, so exported programs never meet a handler they do not fit.
#pragma once

#include <nanobind/nanobind.h>

#include <type_traits>

#include "xla/ffi/api/ffi.h"

namespace jcc {

template <typename T>
nanobind::capsule HandlerCapsule(T* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, T, XLA_FFI_CallFrame*>,
                "not an XLA FFI handler");
  return nanobind::capsule(reinterpret_cast<void*>(fn));
}

template <typename Fwd, typename Bwd, typename Upd, typename Vst>
nanobind::dict Registrations(Fwd* fwd, Bwd* bwd, Upd* update, Vst* varlen_states) {
  nanobind::dict r;
  r["jax_causal_conv_fwd_v1"] = HandlerCapsule(fwd);
  r["jax_causal_conv_bwd_v2"] = HandlerCapsule(bwd);  // v2: + workspace result
  r["jax_causal_conv_update_v1"] = HandlerCapsule(update);
  r["jax_causal_conv_varlen_states_v1"] = HandlerCapsule(varlen_states);
  return r;
}

}  // namespace jcc
