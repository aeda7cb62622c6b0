// Float -> bfloat16 over contiguous runs with the AVX512-BF16 conversion
// instruction where the CPU has it (x86-64; built by GCC 10+ or Clang 11+),
// in place of the scalar round-to-nearest-even that the compiler
// vectorises (four times the time over floats in L1). The result is bit for
// bit ToBFloat16's (dtype.h): the instruction flushes denormal inputs to
// zero, so a vector holding one takes the scalar path (checked over all
// 2^32 float bit patterns when it was written).
#pragma once

#include <cstdint>

#include "dtype.h"

namespace jcc::cpu {

// Whether NarrowToBf16 may be called (the CPU has AVX512-BF16, BW and VL).
bool HasNativeBf16();

// dst[i] = ToBFloat16(src[i]) for i < n. Only where HasNativeBf16().
void NarrowToBf16(const float* src, BFloat16* dst, int64_t n);

}  // namespace jcc::cpu
