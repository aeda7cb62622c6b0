// The FFI targets a nanobind module hands to Python: the handler capsules of
// one platform, keyed by their versioned target names, and those names by
// role. These names are the only spelling of them: jax_causal_conv reads
// them from the compiled module (target_names()) and registers the
// capsules. A target's name gets a new _vN when its arguments change
// incompatibly, so exported programs never meet a handler they do not fit.
#pragma once

#include <nanobind/nanobind.h>

#include <type_traits>

#include "xla/ffi/api/ffi.h"

namespace jcc {

struct TargetName {
  const char* role;
  const char* name;
};

inline constexpr TargetName kForwardTarget{"forward", "jax_causal_conv_fwd_v1"};
inline constexpr TargetName kBackwardTarget{"backward", "jax_causal_conv_bwd_v2"};  // v2: + workspace
inline constexpr TargetName kUpdateTarget{"update", "jax_causal_conv_update_v1"};
inline constexpr TargetName kVarlenStatesTarget{"varlen_states", "jax_causal_conv_varlen_states_v1"};

template <typename T>
nanobind::capsule HandlerCapsule(T* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, T, XLA_FFI_CallFrame*>,
                "not an XLA FFI handler");
  return nanobind::capsule(reinterpret_cast<void*>(fn));
}

// {role: target name}
inline nanobind::dict TargetNames() {
  nanobind::dict r;
  for (const TargetName& t : {kForwardTarget, kBackwardTarget, kUpdateTarget, kVarlenStatesTarget})
    r[t.role] = t.name;
  return r;
}

// {target name: handler capsule}
template <typename Fwd, typename Bwd, typename Upd, typename Vst>
nanobind::dict Registrations(Fwd* fwd, Bwd* bwd, Upd* update, Vst* varlen_states) {
  nanobind::dict r;
  r[kForwardTarget.name] = HandlerCapsule(fwd);
  r[kBackwardTarget.name] = HandlerCapsule(bwd);
  r[kUpdateTarget.name] = HandlerCapsule(update);
  r[kVarlenStatesTarget.name] = HandlerCapsule(varlen_states);
  return r;
}

}  // namespace jcc
