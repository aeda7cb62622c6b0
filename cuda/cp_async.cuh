// Asynchronous global -> shared copies (sm_80+ cp.async) for the lean
// channels-last kernels: a thread stages the next group of time steps while
// it computes on the current one, without holding the bytes in registers.
#pragma once

#include "common.cuh"

namespace jcc::cuda {

// Copies one kBytes word global -> shared without passing through registers
// (zero-filled when !valid; src must still be a mapped address).
// Each asm names a "memory" clobber: without it the compiler may move an
// ordinary shared-memory read of a slot across the wait (or a copy), and
// the kernels that read their own slots have no barrier to stop it.
template <int kBytes>
__device__ __forceinline__ void CpAsync(void* dst, const void* src, bool valid) {
  const unsigned s = unsigned(__cvta_generic_to_shared(dst));
  const int n = valid ? kBytes : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(s), "l"(src), "n"(kBytes), "r"(n) : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory"); }


}  // namespace jcc::cuda
