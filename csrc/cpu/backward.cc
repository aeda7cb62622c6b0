// The CPU backward (see backward.inc).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "cpu/block.h"
#include "cpu/fresh_output.h"
#include "cpu/variants.h"
#include "cpu_kernels.h"
#include "parallel.h"
#include "segments.h"

namespace jcc::cpu {

namespace generic {
#include "cpu/helpers.inc"
#include "cpu/backward.inc"
}  // namespace generic

#if JCC_CPU_AVX2
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
#include "cpu/helpers.inc"
#include "cpu/backward.inc"
}  // namespace avx2
#pragma GCC pop_options
#endif

JCC_CPU_ENTRY(Backward, ConvArgs, BackwardT)

}  // namespace jcc::cpu
