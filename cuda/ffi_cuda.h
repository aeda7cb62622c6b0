// The CUDA handlers, as XLA FFI symbols for the nanobind module to export.
#pragma once

#include <atomic>
#include <cstdint>

#include "xla/ffi/api/ffi.h"

namespace jcc {
extern std::atomic<int64_t> cuda_handler_calls;  // executions of the handlers below

XLA_FFI_DECLARE_HANDLER_SYMBOL(CudaForwardHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CudaBackwardHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CudaUpdateHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CudaVarlenStatesHandler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CudaForwardV1Handler);       // legacy target versions
XLA_FFI_DECLARE_HANDLER_SYMBOL(CudaUpdateV1Handler);
XLA_FFI_DECLARE_HANDLER_SYMBOL(CudaVarlenStatesV1Handler);
}  // namespace jcc
