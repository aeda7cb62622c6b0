// The CPU forward (see forward.inc).
#define JCC_CPU_UNIT "cpu/forward.inc"
#include "cpu/unit.inc"

namespace jcc::cpu {
JCC_CPU_ENTRY(Forward, ConvArgs, ForwardT)
}  // namespace jcc::cpu
