// Element types the kernels read and write, and scalar conversions to the
// float32 (or float64) accumulator. Host-only: CUDA code uses its own
// intrinsics from cuda_fp16.h / cuda_bf16.h.
#pragma once

#include <cstdint>
#include <cstring>

namespace jcc {

enum class DType : int { kF32 = 0, kF16 = 1, kBF16 = 2, kF64 = 3 };

inline const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32: return "float32";
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
    case DType::kF64: return "float64";
  }
  return "?";
}

inline int DTypeBytes(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kF64: return 8;
  }
  return 0;
}

// 16-bit storage types; arithmetic always happens after conversion.
struct Half { uint16_t bits; };
struct BFloat16 { uint16_t bits; };

inline float BitsToFloat(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
inline uint32_t FloatToBits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }

inline float ToFloat(BFloat16 v) { return BitsToFloat(uint32_t(v.bits) << 16); }

inline BFloat16 ToBFloat16(float f) {
  uint32_t u = FloatToBits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return BFloat16{uint16_t((u >> 16) | 0x40)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return BFloat16{uint16_t(u >> 16)};
}

inline float ToFloat(Half h) {
  uint32_t sign = uint32_t(h.bits & 0x8000u) << 16;
  uint32_t exp = (h.bits >> 10) & 0x1fu;
  uint32_t man = h.bits & 0x3ffu;
  if (exp == 0x1f) return BitsToFloat(sign | 0x7f800000u | (man << 13));  // inf / nan
  if (exp == 0) {
    if (man == 0) return BitsToFloat(sign);
    // subnormal half: value = man * 2^-24
    float v = float(man) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  return BitsToFloat(sign | ((exp + 112u) << 23) | (man << 13));
}

inline Half ToHalf(float f) {
  uint32_t u = FloatToBits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return Half{uint16_t(sign | 0x7e00u)};  // nan
  if (absu >= 0x477ff000u) return Half{uint16_t(sign | 0x7c00u)};  // overflow to inf (after rounding)
  if (absu < 0x38800000u) {  // result is subnormal or zero: round man * 2^24
    float a = BitsToFloat(absu) * 16777216.0f;  // exact scaling by 2^24
    // nearbyint-style round half to even without <cmath> rounding modes
    uint32_t q = uint32_t(a);
    float rem = a - float(q);
    if (rem > 0.5f || (rem == 0.5f && (q & 1u))) ++q;
    return Half{uint16_t(sign | q)};
  }
  uint32_t exp = (absu >> 23) - 112u;
  uint32_t man = absu & 0x7fffffu;
  uint32_t h = (exp << 10) | (man >> 13);
  uint32_t rest = man & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // may carry into exponent: correct
  return Half{uint16_t(sign | h)};
}

}  // namespace jcc
