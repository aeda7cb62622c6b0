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

inline constexpr TargetName kForwardTarget{"forward", "jax_causal_conv_fwd_v2"};  // v2: + workspace
inline constexpr TargetName kBackwardTarget{"backward", "jax_causal_conv_bwd_v2"};  // v2: + workspace
inline constexpr TargetName kUpdateTarget{"update", "jax_causal_conv_update_v2"};  // v2: + channels_last
inline constexpr TargetName kVarlenStatesTarget{"varlen_states", "jax_causal_conv_varlen_states_v2"};
// Earlier versions, still registered so that exported programs calling them run.
inline constexpr const char* kForwardV1 = "jax_causal_conv_fwd_v1";
inline constexpr const char* kUpdateV1 = "jax_causal_conv_update_v1";
inline constexpr const char* kVarlenStatesV1 = "jax_causal_conv_varlen_states_v1";

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

// One platform's handlers, current and earlier versions.
template <typename H>
struct Handlers {
  H *forward, *backward, *update, *varlen_states, *forward_v1, *update_v1, *varlen_states_v1;
};

// {target name: handler capsule}
template <typename H>
nanobind::dict Registrations(const Handlers<H>& h) {
  nanobind::dict r;
  r[kForwardTarget.name] = HandlerCapsule(h.forward);
  r[kBackwardTarget.name] = HandlerCapsule(h.backward);
  r[kUpdateTarget.name] = HandlerCapsule(h.update);
  r[kVarlenStatesTarget.name] = HandlerCapsule(h.varlen_states);
  r[kForwardV1] = HandlerCapsule(h.forward_v1);
  r[kUpdateV1] = HandlerCapsule(h.update_v1);
  r[kVarlenStatesV1] = HandlerCapsule(h.varlen_states_v1);
  return r;
}

}  // namespace jcc
