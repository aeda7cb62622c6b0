// The CPU decode update and varlen_states (see update.inc).
#define JCC_CPU_UNIT "cpu/update.inc"
#include "cpu/unit.inc"

namespace jcc::cpu {
JCC_CPU_ENTRY(Update, UpdateArgs, UpdateT)
JCC_CPU_ENTRY(VarlenStates, VarlenStatesArgs, VarlenStatesAny)
}  // namespace jcc::cpu
