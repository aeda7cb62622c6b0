// The CPU handlers, as XLA FFI symbols for the nanobind module to export.
#pragma once

#include "xla/ffi/api/ffi.h"

namespace jcc {
XLA_FFI_DECLARE_HANDLER_SYMBOL(CpuForwardHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CpuBackwardHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CpuUpdateHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CpuVarlenStatesHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CpuForwardV1Handler);       // legacy target versions
XLA_FFI_DECLARE_HANDLER_SYMBOL(CpuUpdateV1Handler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CpuVarlenStatesV1Handler);
}  // namespace jcc
