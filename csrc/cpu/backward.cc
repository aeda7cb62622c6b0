// The CPU backward (see backward.inc).
#define JCC_CPU_UNIT "cpu/backward.inc"
#include "cpu/unit.inc"

namespace jcc::cpu {
JCC_CPU_ENTRY(Backward, ConvArgs, BackwardT)
}  // namespace jcc::cpu
