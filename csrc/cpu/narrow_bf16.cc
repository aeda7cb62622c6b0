// See narrow_bf16.h.
#include "cpu/narrow_bf16.h"

// (The avx512bf16 target needs GCC 10 or Clang 11 at least; older
// compilers build the scalar form.)
#if defined(__x86_64__) && ((defined(__clang__) && __clang_major__ >= 11) || \
                            (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 10))
#include <immintrin.h>
#define JCC_NATIVE_BF16 1
#else
#define JCC_NATIVE_BF16 0
#endif

namespace jcc::cpu {

#if JCC_NATIVE_BF16

bool HasNativeBf16() {
  static const bool yes = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return yes;
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))
void NarrowToBf16(const float* src, BFloat16* dst, int64_t n) {
  const __m512i exp = _mm512_set1_epi32(0x7f800000), man = _mm512_set1_epi32(0x007fffff);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = n - j >= 16 ? __mmask16(0xffff) : __mmask16((1u << (n - j)) - 1);
    const __m512 v = _mm512_maskz_loadu_ps(m, src + j);
    const __m512i u = _mm512_castps_si512(v);
    // denormal lanes (exponent 0, mantissa not 0): the instruction would flush them
    const __mmask16 den = _mm512_mask_test_epi32_mask(_mm512_mask_testn_epi32_mask(m, u, exp), u, man);
    if (den != 0) {
      for (int64_t i = j; i < j + 16 && i < n; ++i) dst[i] = ToBFloat16(src[i]);
    } else {
      _mm256_mask_storeu_epi16(dst + j, m, __m256i(_mm512_cvtneps_pbh(v)));
    }
  }
}

#else

bool HasNativeBf16() { return false; }
void NarrowToBf16(const float* src, BFloat16* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = ToBFloat16(src[i]);
}

#endif

}  // namespace jcc::cpu
