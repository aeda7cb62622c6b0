// CPU kernels for the causal depthwise conv1d.
//
// Work is split over (batch row, block of kBlock channels). Each block walks
// its sequence in time chunks through a small [time][channel] buffer, so the
// inner loops run over contiguous channels and vectorise, whichever layout x
// has. The buffer keeps the W-1 most recent inputs between chunks, which makes
// long sequences, initial states and final states one mechanism.
#include "cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "parallel.h"
#include "segments.h"

namespace jcc::cpu {

namespace generic {
#include "cpu_kernels_impl.inc"
}  // namespace generic

#if defined(__x86_64__) && defined(__GNUC__)
#define JCC_HAVE_AVX2_VARIANT 1
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
#include "cpu_kernels_impl.inc"
}  // namespace avx2
#pragma GCC pop_options
#endif

namespace {
bool UseAvx2() {
#ifdef JCC_HAVE_AVX2_VARIANT
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
#else
  return false;
#endif
}
}  // namespace

#ifdef JCC_HAVE_AVX2_VARIANT
#define JCC_CPU_DISPATCH(fn, a) (UseAvx2() ? avx2::fn(a) : generic::fn(a))
#else
#define JCC_CPU_DISPATCH(fn, a) generic::fn(a)
#endif

void Forward(const ConvArgs& a) { JCC_CPU_DISPATCH(Forward, a); }
void Backward(const ConvArgs& a) { JCC_CPU_DISPATCH(Backward, a); }
void Update(const UpdateArgs& a) { JCC_CPU_DISPATCH(Update, a); }
void VarlenStates(const VarlenStatesArgs& a) { JCC_CPU_DISPATCH(VarlenStates, a); }

}  // namespace jcc::cpu
