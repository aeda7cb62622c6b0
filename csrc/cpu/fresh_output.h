// Fresh output buffers for the CPU forward (generic code, no instruction-set
// variant: system calls only).
#pragma once

#include <cstdint>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace jcc::cpu {

// Fresh output buffers. XLA allocates a large result anew on each call (and
// unmaps it when freed), so the forward's first touch of every 4 KiB page
// costs a page fault, a zeroed page and a memory-cgroup charge: on a 2-core
// VM, measured, more than the convolution itself. For such an output the
// forward asks for transparent huge pages on it (512x fewer of those) and
// lets each work item map its own stretch in one system call before writing
// it. Neither changes any contents, and unsupported calls are ignored.

#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
constexpr uintptr_t kPageBytes = 4096, kHugePageBytes = uintptr_t(2) << 20;

// The part of [p, p + bytes) made of whole `unit`-aligned blocks, or false.
inline bool AlignedInterior(void* p, int64_t bytes, uintptr_t unit, uintptr_t* lo,
                            uintptr_t* len) {
  const uintptr_t a = (uintptr_t(p) + unit - 1) & ~(unit - 1);
  const uintptr_t b = (uintptr_t(p) + uintptr_t(bytes)) & ~(unit - 1);
  *lo = a, *len = b > a ? b - a : 0;
  return b > a;
}
#endif

// Whether y, which the forward writes in full, is a fresh allocation worth
// prefaulting: large (small buffers are heap memory, mapped already) and its
// middle page not mapped yet (for a reused buffer prefaulting would only walk
// its page tables). If so, also hints huge pages for it when it is big enough
// to be a mapping of its own (glibc mmaps 32 MiB and up), so that the hint
// goes away with the buffer.
inline bool PrepareFreshOutput(void* y, int64_t bytes) {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
  constexpr int64_t kMinBytes = int64_t(4) << 20, kHugeMinBytes = int64_t(32) << 20;
  if (bytes < kMinBytes) return false;
  const uintptr_t mid = (uintptr_t(y) + uintptr_t(bytes / 2)) & ~(kPageBytes - 1);
  unsigned char resident = 1;
  if (mincore(reinterpret_cast<void*>(mid), kPageBytes, &resident) != 0 || (resident & 1))
    return false;
  uintptr_t lo, len;
  if (bytes >= kHugeMinBytes && AlignedInterior(y, bytes, kHugePageBytes, &lo, &len))
    madvise(reinterpret_cast<void*>(lo), len, MADV_HUGEPAGE);
  return true;
#else
  (void)y, (void)bytes;
  return false;
#endif
}

// Maps the pages wholly inside [p, p + bytes) for writing, in one system call.
inline void PrefaultForWrite(void* p, int64_t bytes) {
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
  uintptr_t lo, len;
  if (AlignedInterior(p, bytes, kPageBytes, &lo, &len))
    madvise(reinterpret_cast<void*>(lo), len, MADV_POPULATE_WRITE);
#else
  (void)p, (void)bytes;
#endif
}

}  // namespace jcc::cpu
