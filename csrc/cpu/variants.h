// Instruction-set variants of the CPU kernels. Each kernel unit
// (forward.cc, backward.cc, update.cc) compiles its body twice, in the
// namespaces `generic` (any x86-64/ARM CPU) and `avx2` (AVX2, FMA, F16C, by
// #pragma GCC target), and its entry point picks one at run time. The
// bodies are plain includes so both variants come from one source.
#pragma once

#include <type_traits>

#include "dtype.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)  // (#pragma GCC target)
#include <immintrin.h>
#define JCC_CPU_AVX2 1
#else
#define JCC_CPU_AVX2 0
#endif

namespace jcc::cpu {

inline bool UseAvx2() {
#if JCC_CPU_AVX2
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          __builtin_cpu_supports("f16c");
  return yes;
#else
  return false;
#endif
}

// fn(T*, Acc*) (null pointers as type tags) for x's element type and its accumulator.
template <typename Fn>
void WithXType(DType t, Fn fn) {
  switch (t) {
    case DType::kF32: return fn(static_cast<float*>(nullptr), static_cast<float*>(nullptr));
    case DType::kF16: return fn(static_cast<Half*>(nullptr), static_cast<float*>(nullptr));
    case DType::kBF16: return fn(static_cast<BFloat16*>(nullptr), static_cast<float*>(nullptr));
    case DType::kF64: return fn(static_cast<double*>(nullptr), static_cast<double*>(nullptr));
  }
}

template <typename P>
using Pointee = std::remove_pointer_t<P>;

}  // namespace jcc::cpu

// The entry point `Name(const Args& a)` calling VARIANT::Body<T, Acc>(a).
#if JCC_CPU_AVX2
#define JCC_CPU_ENTRY(Name, Args, Body)                                         \
  void Name(const Args& a) {                                                    \
    WithXType(a.x_dtype, [&](auto* t, auto* acc) {                              \
      using T = Pointee<decltype(t)>;                                           \
      using Acc = Pointee<decltype(acc)>;                                       \
      if (UseAvx2()) avx2::Body<T, Acc>(a);                                     \
      else generic::Body<T, Acc>(a);                                            \
    });                                                                         \
  }
#else
#define JCC_CPU_ENTRY(Name, Args, Body)                                         \
  void Name(const Args& a) {                                                    \
    WithXType(a.x_dtype, [&](auto* t, auto* acc) {                              \
      generic::Body<Pointee<decltype(t)>, Pointee<decltype(acc)>>(a);           \
    });                                                                         \
  }
#endif
