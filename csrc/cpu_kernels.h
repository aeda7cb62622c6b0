// C++ CPU kernels. Arguments are validated by the caller (ffi_args.h).
#pragma once

#include "problem.h"

namespace jcc::cpu {

void Forward(const ConvArgs& a);
void Backward(const ConvArgs& a);
void Update(const UpdateArgs& a);
void VarlenStates(const VarlenStatesArgs& a);

}  // namespace jcc::cpu
