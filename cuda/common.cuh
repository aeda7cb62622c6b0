// Device helpers shared by the CUDA kernels: element conversion, vector
// loads/stores, the activation, weight access through a run-time dtype,
// state access, index arithmetic.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "problem.h"

namespace jcc::cuda {

// --- element conversion ------------------------------------------------------
__device__ __forceinline__ float ToF(float v) { return v; }
__device__ __forceinline__ float ToF(double v) { return float(v); }
__device__ __forceinline__ float ToF(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToF(__nv_bfloat16 v) { return __bfloat162float(v); }

// bfloat16 elements held two to a 32-bit word, to float with one integer
// op each: a bfloat16 is a float's upper half, so the low element is the
// word shifted up and the high one the word masked (converting each element
// on its own extracts the high one first: two ops).
__device__ __forceinline__ float Bf16WordToF(uint32_t word, bool high) {
  return __uint_as_float(high ? word & 0xffff0000u : word << 16);
}

// N elements at e to floats; 16-bit elements of an even N by whole 32-bit
// words (bfloat16: Bf16WordToF; float16: a pair at a time), so e must then
// be 4-byte aligned (the callers' elements lie in registers or aligned
// words); element by element where kByWords is false (a caller's measured
// choice: stream.cuh's UnpackByWords).
template <typename T, int N, bool kByWords = true>
__device__ __forceinline__ void ElementsToF(const T* e, float (&out)[N]) {
  if constexpr (kByWords && sizeof(T) == 2 && N % 2 == 0) {
    const uint32_t* w = reinterpret_cast<const uint32_t*>(e);
#pragma unroll
    for (int j = 0; j < N / 2; ++j) {
      if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        out[2 * j] = Bf16WordToF(w[j], false), out[2 * j + 1] = Bf16WordToF(w[j], true);
      } else {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[j]));
        out[2 * j] = f.x, out[2 * j + 1] = f.y;
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = ToF(e[j]);
  }
}

template <typename T> __device__ __forceinline__ T FromF(float v);
template <> __device__ __forceinline__ float FromF<float>(float v) { return v; }
template <> __device__ __forceinline__ __half FromF<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 FromF<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

// N consecutive elements through 16- or 8-byte accesses (p must be aligned).
template <typename T, int N>
__device__ __forceinline__ void LoadVec(const T* p, float (&out)[N]) {
  constexpr int kBytes = N * int(sizeof(T));
  if constexpr (kBytes % 16 == 0) {
    uint4 raw[kBytes / 16];
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) raw[i] = __ldg(reinterpret_cast<const uint4*>(p) + i);
    ElementsToF<T, N>(reinterpret_cast<const T*>(raw), out);
  } else if constexpr (kBytes % 8 == 0) {
    uint2 raw[kBytes / 8];
#pragma unroll
    for (int i = 0; i < kBytes / 8; ++i) raw[i] = __ldg(reinterpret_cast<const uint2*>(p) + i);
    ElementsToF<T, N>(reinterpret_cast<const T*>(raw), out);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = ToF(p[j]);
  }
}

// --- 16-bit elements as words ------------------------------------------------
__device__ __forceinline__ unsigned short Bits(__nv_bfloat16 v) { return __bfloat16_as_ushort(v); }
__device__ __forceinline__ unsigned short Bits(__half v) { return __half_as_ushort(v); }

// Two 16-bit elements as one 32-bit word (first in the low half), as a
// fragment or a staged row holds them.
template <typename T>
__device__ __forceinline__ unsigned PackBits(T first, T second) {
  return unsigned(Bits(first)) | (unsigned(Bits(second)) << 16);
}

// Two floats as a pair of 16-bit T.
template <typename T>
__device__ __forceinline__ unsigned PackPair(float first, float second) {
  return PackBits(FromF<T>(first), FromF<T>(second));
}

// One 16-, 8- or 4-byte store of words to global memory (p aligned), one
// instruction (16 and 8 bytes written in PTX): a store of a uint4 is split
// by the compiler into its fields, which it merges back only where it can
// prove the address aligned (in the channels-last row kernels it could
// not: element stores; docs/performance-log.md, 2026-11-26, eighth session).
__device__ __forceinline__ void StoreWords(void* p, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(a), "r"(b), "r"(c), "r"(d));
}
__device__ __forceinline__ void StoreWords(void* p, uint32_t a, uint32_t b) {
  asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p), "r"(a), "r"(b));
}
__device__ __forceinline__ void StoreWords(void* p, uint32_t a) { *static_cast<uint32_t*>(p) = a; }

// N consecutive elements of global memory through 16-, 8- or 4-byte
// stores (p must be aligned), the words built in registers.
template <typename T, int N>
__device__ __forceinline__ void StoreVec(T* p, const float (&v)[N]) {
  constexpr int kBytes = N * int(sizeof(T));
  if constexpr (kBytes % 4 == 0) {
    constexpr int kWords = kBytes / 4;
    uint32_t w[kWords];
#pragma unroll
    for (int i = 0; i < kWords; ++i) {
      if constexpr (sizeof(T) == 4) {
        w[i] = __float_as_uint(v[i]);
      } else {
        w[i] = PackPair<T>(v[2 * i], v[2 * i + 1]);
      }
    }
    uint32_t* q = reinterpret_cast<uint32_t*>(p);
    if constexpr (kWords % 4 == 0) {
#pragma unroll
      for (int i = 0; i < kWords; i += 4) StoreWords(q + i, w[i], w[i + 1], w[i + 2], w[i + 3]);
    } else if constexpr (kWords % 2 == 0) {
#pragma unroll
      for (int i = 0; i < kWords; i += 2) StoreWords(q + i, w[i], w[i + 1]);
    } else {
#pragma unroll
      for (int i = 0; i < kWords; ++i) StoreWords(q + i, w[i]);
    }
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) p[j] = FromF<T>(v[j]);
  }
}

// --- weights and bias: dtype known only at run time --------------------------
__device__ __forceinline__ float LoadAnyF(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::kF32: return static_cast<const float*>(base)[i];
    case DType::kF16: return __half2float(static_cast<const __half*>(base)[i]);
    case DType::kBF16: return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[i]);
    case DType::kF64: return float(static_cast<const double*>(base)[i]);
  }
  return 0.f;
}

// out[k] = element first + k of base (dtype t) for k < N: one switch on the
// dtype for the row, where LoadAnyF per element switches N times.
template <int N>
__device__ __forceinline__ void LoadAnyRowF(const void* base, DType t, int64_t first, float (&out)[N]) {
  auto row = [&](const auto* p) {
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = ToF(p[first + k]);
  };
  switch (t) {
    case DType::kF32: row(static_cast<const float*>(base)); return;
    case DType::kF16: row(static_cast<const __half*>(base)); return;
    case DType::kBF16: row(static_cast<const __nv_bfloat16*>(base)); return;
    case DType::kF64: row(static_cast<const double*>(base)); return;
  }
#pragma unroll
  for (int k = 0; k < N; ++k) out[k] = 0.f;
}

__device__ __forceinline__ void StoreAnyF(void* base, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(base)[i] = v; break;
    case DType::kF16: static_cast<__half*>(base)[i] = __float2half_rn(v); break;
    case DType::kBF16: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v); break;
    case DType::kF64: static_cast<double*>(base)[i] = double(v); break;
  }
}

// --- the launchers' one dtype switch ----------------------------------------
// A development build (CMake's JCC_DEV_DTYPES, for a device call that times
// one dtype: tools/device_build.sh) compiles the kernels of the dtypes in
// JCC_DEV_DTYPE_MASK only (1 float32, 2 float16, 4 bfloat16); the others
// answer `otherwise`. Every build for users has all three.
#ifndef JCC_DEV_DTYPE_MASK
#define JCC_DEV_DTYPE_MASK 7
#endif
constexpr int kBuiltTypes = JCC_DEV_DTYPE_MASK;

// f(T()) when the build has T (kBit of kBuiltTypes), else `otherwise`.
template <int kBit, typename T, typename R, typename F>
R IfTypeBuilt(R otherwise, F&& f) {
  if constexpr ((kBuiltTypes & kBit) != 0) return f(T());
  else return otherwise;
}

// f(T()) with T the float type of dtype t (float32, float16, bfloat16), or
// `otherwise` for any other dtype (float64 is CPU-only).
template <typename R, typename F>
R WithFloatType(DType t, R otherwise, F&& f) {
  switch (t) {
    case DType::kF32: return IfTypeBuilt<1, float>(otherwise, f);
    case DType::kF16: return IfTypeBuilt<2, __half>(otherwise, f);
    case DType::kBF16: return IfTypeBuilt<4, __nv_bfloat16>(otherwise, f);
    default: return otherwise;
  }
}

// The same for the 16-bit types only (the tensor-core kernels).
template <typename R, typename F>
R With16BitType(DType t, R otherwise, F&& f) {
  switch (t) {
    case DType::kBF16: return IfTypeBuilt<4, __nv_bfloat16>(otherwise, f);
    case DType::kF16: return IfTypeBuilt<2, __half>(otherwise, f);
    default: return otherwise;
  }
}

// --- the templated families' one width switch (W <= 16) ----------------------
// f(std::integral_constant<int, W>()) when W is one of kWs, else
// cudaErrorInvalidValue.
template <int... kWs, typename F>
cudaError_t WithWidthAmong(int W, F&& f) {
  cudaError_t err = cudaErrorInvalidValue;
  (void)((W == kWs && ((err = f(std::integral_constant<int, kWs>())), true)) || ...);
  return err;
}

// f(std::integral_constant<int, W>()) for W 1..16: the streaming and the
// channels-last row kernels are compiled at every width (no absent taps).
template <typename F>
cudaError_t WithExactWidth16(int W, F&& f) {
  return WithWidthAmong<1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16>(W, f);
}

// --- activation ---------------------------------------------------------------
// ex2 and rcp in their flush-to-zero forms whatever -ftz says (the build
// keeps subnormals for the sums, as XLA:GPU does; a sigmoid's value needs
// none, and the forms that handle them cost extra instructions).
__device__ __forceinline__ float Sigmoid(float v) {
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(v * -1.4426950408889634f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.f + e));
  return r;
}

__device__ __forceinline__ float Activate(float v, bool silu) { return silu ? v * Sigmoid(v) : v; }

// dy * d act(v) / dv
__device__ __forceinline__ float ActGrad(float v, float dy, bool silu) {
  if (!silu) return dy;
  const float s = Sigmoid(v);
  return dy * s * (1.f + v * (1.f - s));
}

// Element j of the history window of state row `row`, channel d.
template <typename T>
__device__ __forceinline__ float LoadState(const ConvArgs& a, const void* s, int64_t row,
                                           int64_t d, int64_t j) {
  return ToF(static_cast<const T*>(s)[a.state_layout().At(row, d, j)]);
}

inline bool Aligned(const void* p, int bytes) {
  return (reinterpret_cast<uintptr_t>(p) % bytes) == 0;
}

__host__ __device__ __forceinline__ int64_t Min64(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ int64_t Max64(int64_t a, int64_t b) { return a > b ? a : b; }

// n / d for n >= 0, d > 0, through the 32-bit sequence when both fit. nvcc
// already emits such a run-time bypass for a plain 64-bit division; this only
// makes it explicit (it was not measured apart from the other changes).
__host__ __device__ __forceinline__ int64_t DivFast(int64_t n, int64_t d) {
  if (((n | d) >> 32) == 0) return int64_t(uint32_t(n) / uint32_t(d));
  return n / d;
}

// a.batch_per_group() by DivFast, for kernels that find it per thread.
__device__ __forceinline__ int64_t BatchPerGroupFast(const ConvArgs& a) { return DivFast(a.batch, a.groups); }
// The row of weight (and bias) that channel d of batch row b uses (vmapped
// weights: one (dim, W) block per group of batch rows).
__device__ __forceinline__ int64_t WeightRow(const ConvArgs& a, int64_t b, int64_t d) {
  return (a.groups == 1 ? 0 : DivFast(b, BatchPerGroupFast(a)) * a.dim) + d;
}

// Ceil division for launch sizes.
__host__ __device__ __forceinline__ int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A kernel as a type, so that a dispatch can hand it on as a compile-time
// constant (BlocksPerSm's parameter).
template <auto kKernel>
using KernelTag = std::integral_constant<decltype(kKernel), kKernel>;

// Blocks of kKernel (kThreads a block, kSmem bytes of dynamic shared
// memory, at most the default 48 KiB) that one SM holds at once: the
// runtime's occupancy for its registers and shared memory, asked once; at
// least 1.
template <auto kKernel, int kThreads, size_t kSmem = 0>
int BlocksPerSm() {
  static const int n = [] {
    int b = 0;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kKernel, kThreads, kSmem) == cudaSuccess && b > 0 ? b : 1;
  }();
  return n;
}

// Launch of a family kernel with `smem` bytes of dynamic shared memory
// beside `static_smem` bytes of its own (past 48 KiB together, the kernel's
// limit is raised first; per launch: the setting is per device).
template <typename Kernel, typename... Args>
cudaError_t LaunchWithSmem(Kernel* kernel, int64_t blocks, dim3 threads, size_t smem, size_t static_smem,
                           cudaStream_t stream, Args... args) {
  if (smem + static_smem > 48 * 1024) {
    const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    if (e != cudaSuccess) return e;
  }
  kernel<<<unsigned(blocks), threads, smem, stream>>>(args...);
  return cudaGetLastError();
}

}  // namespace jcc::cuda
