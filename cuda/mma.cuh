// Tensor-core primitives of the mma family (forward_mma.cu; sm_80+):
// ldmatrix from shared memory and the m16n8k16 MMA of 16-bit inputs into
// float accumulators. The products of 16-bit inputs are exact in float, so
// a convolution summed this way is as accurate as float FMAs.
#pragma once

#include "common.cuh"

namespace jcc::cuda {

// Four 8x8 matrices of 16-bit elements: lane 8i + r gives the address of
// row r of matrix i (16 bytes, 16-byte aligned); r[i] receives this lane's
// pair of matrix i (row lane / 4, columns 2 (lane % 4) and + 1).
__device__ __forceinline__ void LdMatrixX4(const void* p, unsigned (&r)[4]) {
  const unsigned s = unsigned(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s)
               : "memory");
}

// c += A (16 x 16, row-major fragments a) * B (16 x 8, column fragments b0, b1).
template <typename T>
__device__ __forceinline__ void Mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<T, __half>, "16-bit inputs only");
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ unsigned short Bits(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
__device__ __forceinline__ unsigned short Bits(__half v) { return __half_as_ushort(v); }

// Two floats as a pair of T (first in the low half), as a fragment holds them.
template <typename T>
__device__ __forceinline__ unsigned PackPair(float first, float second) {
  return unsigned(Bits(FromF<T>(first))) | (unsigned(Bits(FromF<T>(second))) << 16);
}

// The floats of a pair of T.
template <typename T>
__device__ __forceinline__ void UnpackPair(unsigned u, float& first, float& second) {
  T e[2];
  memcpy(e, &u, 4);
  first = ToF(e[0]), second = ToF(e[1]);
}

}  // namespace jcc::cuda
