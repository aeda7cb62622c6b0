// CPU kernels for the causal depthwise conv1d.
//
// Forward (see the section in cpu_kernels_impl.inc): channels-first rows are
// streamed along time, everything else goes through tiles with channels
// innermost; either way the inner loops run over contiguous memory and
// vectorise. Backward: work is split over (weight group, block of kBlock
// channels); each block walks its sequence in time chunks through small
// buffers that keep the W-1 most recent inputs between chunks, and reduces
// the weight gradients in a fixed order. Decode update: one row's channels
// at a time, vectorised over channels for the common single-token step.
#include "cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "parallel.h"
#include "segments.h"

namespace jcc::cpu {

// Maps the pages of [p, p + bytes) that lie wholly inside it for writing, in
// one system call, before a kernel writes all of them. A fresh output buffer
// (XLA's are, for large results) otherwise takes one page fault per 4 KiB
// page, which on a 2-core VM costs about as much as the arithmetic. Contents
// are unchanged; where the call is unsupported this does nothing.
inline void PrefaultForWrite(void* p, int64_t bytes) {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
  constexpr uintptr_t kPage = 4096;
  const uintptr_t lo = (uintptr_t(p) + kPage - 1) & ~(kPage - 1);
  const uintptr_t hi = (uintptr_t(p) + uintptr_t(bytes)) & ~(kPage - 1);
  if (hi > lo) madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_POPULATE_WRITE);
#else
  (void)p, (void)bytes;
#endif
}

// Whether to prefault an output before the kernel writes it: only large ones
// (small buffers come from the heap, mapped already) whose middle page is not
// mapped yet, i.e. fresh allocations; for a reused buffer the call would be
// pure overhead (a walk over its page tables).
inline bool WorthPrefaulting(void* p, int64_t bytes) {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
  constexpr int64_t kMinBytes = int64_t(4) << 20;
  if (bytes < kMinBytes) return false;
  const uintptr_t page = (uintptr_t(p) + uintptr_t(bytes / 2)) & ~uintptr_t(4095);
  unsigned char resident = 1;
  return mincore(reinterpret_cast<void*>(page), 4096, &resident) == 0 && !(resident & 1);
#else
  (void)p, (void)bytes;
  return false;
#endif
}

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
