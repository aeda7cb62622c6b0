// A strided 2-D view the CPU kernels use for tensors and scratch tiles.
// Defined outside the instruction-set namespaces: its trivial accessor is
// compiled once, generically, and inlined into both variants.
#pragma once

#include <cstdint>

namespace jcc::cpu {

// Element (step j, channel c) at p[j * s_step + c * s_chan].
template <typename V>
struct Block2 {
  V* p;
  int64_t s_step, s_chan;
  V& operator()(int64_t j, int64_t c) const { return p[j * s_step + c * s_chan]; }
  operator Block2<const V>() const { return {p, s_step, s_chan}; }
};

// A read-only block parameter that does not take part in template argument
// deduction, so a Block2<Acc> converts to it where Acc is deduced elsewhere.
template <typename V>
struct NoDeduce {
  using type = V;
};
template <typename V>
using ConstBlock = Block2<const typename NoDeduce<V>::type>;

}  // namespace jcc::cpu
