// Device helpers shared by the CUDA kernels: element conversion, vector
// loads/stores, the activation, weight access through a run-time dtype, and
// the segment cursor that tells each time step how much history it may use.
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
__device__ __forceinline__ float ToF(__half v) { return __half2float(v); }
__device__ __forceinline__ float ToF(__nv_bfloat16 v) { return __bfloat162float(v); }

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
    const T* e = reinterpret_cast<const T*>(raw);
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = ToF(e[j]);
  } else if constexpr (kBytes % 8 == 0) {
    uint2 raw[kBytes / 8];
#pragma unroll
    for (int i = 0; i < kBytes / 8; ++i) raw[i] = __ldg(reinterpret_cast<const uint2*>(p) + i);
    const T* e = reinterpret_cast<const T*>(raw);
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = ToF(e[j]);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) out[j] = ToF(p[j]);
  }
}

template <typename T, int N>
__device__ __forceinline__ void StoreVec(T* p, const float (&v)[N]) {
  constexpr int kBytes = N * int(sizeof(T));
  if constexpr (kBytes % 8 == 0) {
    using V = typename std::conditional<kBytes % 16 == 0, uint4, uint2>::type;
    V raw[kBytes / sizeof(V)];
    T* e = reinterpret_cast<T*>(raw);
#pragma unroll
    for (int j = 0; j < N; ++j) e[j] = FromF<T>(v[j]);
#pragma unroll
    for (int i = 0; i < int(kBytes / sizeof(V)); ++i) reinterpret_cast<V*>(p)[i] = raw[i];
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

__device__ __forceinline__ void StoreAnyF(void* base, DType t, int64_t i, float v) {
  switch (t) {
    case DType::kF32: static_cast<float*>(base)[i] = v; break;
    case DType::kF16: static_cast<__half*>(base)[i] = __float2half_rn(v); break;
    case DType::kBF16: static_cast<__nv_bfloat16*>(base)[i] = __float2bfloat16_rn(v); break;
    case DType::kF64: static_cast<double*>(base)[i] = double(v); break;
  }
}

// --- activation ---------------------------------------------------------------
__device__ __forceinline__ float Sigmoid(float v) { return 1.f / (1.f + __expf(-v)); }

__device__ __forceinline__ float Activate(float v, bool silu) { return silu ? v * Sigmoid(v) : v; }

// dy * d act(v) / dv
__device__ __forceinline__ float ActGrad(float v, float dy, bool silu) {
  if (!silu) return dy;
  const float s = Sigmoid(v);
  return dy * s * (1.f + v * (1.f - s));
}

// --- segments -------------------------------------------------------------------
// Segment boundary n of a varlen row, clamped as in csrc/segments.h: the last
// sequence always ends at len. Offsets are assumed non-decreasing (what the
// Python layer checks); other values stay in bounds and every step is written.
__device__ __forceinline__ int64_t VarlenBound(const ConvArgs& a, const int32_t* cu, int64_t n) {
  if (n >= a.num_seqs - 1) return a.len;
  const int64_t v = cu[n + 1];
  return v < 0 ? 0 : (v > a.len ? a.len : v);
}

// Walks a row's time axis forwards and reports, for each step t,
//   m(t) = min(H, t - start): how many of the H previous inputs share t's sequence
//   hrow:  the initial-states row feeding the rest of the window (or -1: zeros)
//   frow, hi: the final-states row of t's sequence and where that sequence ends.
// In kRow mode the window itself holds the history (initial states or zeros
// before t = 0), so m is always H there.
struct SegCursor {
  int64_t start, hi, hrow, frow, n;

  __device__ __forceinline__ void Init(const ConvArgs& a, int64_t b, int64_t t, int H) {
    hi = a.len;
    n = 0;
    hrow = -1;
    frow = b;
    switch (a.mode) {
      case SegmentMode::kRow:
        start = INT64_MIN / 4;
        break;
      case SegmentMode::kSeqIdx: {
        const int32_t* s = a.seq_idx + b * a.len;
        int64_t p = t;
        const int64_t lim = t - H > 0 ? t - H : 0;
        if (t < a.len)
          while (p > lim && s[p - 1] == s[p]) --p;
        start = p;
        break;
      }
      case SegmentMode::kVarlen: {
        const int64_t N = a.num_seqs;
        if (N == 0) {
          start = 0;
          frow = -1;
          break;
        }
        const int32_t* cu = a.cu_seqlens + b * (N + 1);
        int64_t lo = 0, up = N - 1;  // first n with bound(n) > t
        while (lo < up) {
          const int64_t mid = (lo + up) / 2;
          if (VarlenBound(a, cu, mid) > t) up = mid; else lo = mid + 1;
        }
        n = lo;
        const int64_t s0 = n == 0 ? 0 : VarlenBound(a, cu, n - 1);
        start = s0 < t ? s0 : t;
        const int64_t h = VarlenBound(a, cu, n);
        hi = h > start ? h : start;
        SetRows(a, b);
        break;
      }
    }
  }

  __device__ __forceinline__ void SetRows(const ConvArgs& a, int64_t b) {
    const int64_t r = b * a.num_seqs + n;
    hrow = a.initial_states ? r : -1;
    frow = r;
  }

  // Moves to step t, one past the previous one.
  __device__ __forceinline__ void Next(const ConvArgs& a, int64_t b, int64_t t) {
    if (a.mode == SegmentMode::kSeqIdx) {
      if (t < a.len) {
        const int32_t* s = a.seq_idx + b * a.len;
        if (s[t] != s[t - 1]) start = t;
      }
    } else if (a.mode == SegmentMode::kVarlen && a.num_seqs > 0) {
      if (t >= hi && t < a.len) {
        const int32_t* cu = a.cu_seqlens + b * (a.num_seqs + 1);
        while (t >= hi) {
          ++n;
          start = hi;
          const int64_t h = VarlenBound(a, cu, n);
          hi = h > start ? h : start;
        }
        SetRows(a, b);
      }
    }
  }

  __device__ __forceinline__ int M(int64_t t, int H) const {
    const int64_t d = t - start;
    return d < H ? int(d) : H;
  }
};

// --- shared pieces of the convolution kernels -----------------------------------
// Time-tiled kernels (channels-first layout, and any width): a block of
// kThreads threads covers Tiling<T>::kTile consecutive steps of one (batch,
// channel) row, each thread a run of kRun steps: 32 bytes, two 16-byte loads
// in flight per tensor read.
constexpr int kThreads = 128;
template <typename T>
struct Tiling {
  static constexpr int kRun = 32 / int(sizeof(T));
  static constexpr int kTile = kThreads * kRun;
};

// Channels-last kernels (width <= 4): a block of kClX x kClY threads, kClX
// vectors of channels by kClY time slices.
constexpr int kClX = 32;
constexpr int kClY = 4;
constexpr int kClBwdSteps = 128;  // time steps per thread in the channels-last backward
constexpr int kClV = 4;           // channels per thread in the channels-last backward

// Element j of the history window of state row `row`, channel d.
template <typename T>
__device__ __forceinline__ float LoadState(const ConvArgs& a, const void* s, int64_t row,
                                           int64_t d, int64_t j) {
  return ToF(static_cast<const T*>(s)[a.state_layout().At(row, d, j)]);
}

// One run of kRun steps of a (b, d) row starting at r0, zero past len.
template <typename T, int N>
__device__ __forceinline__ void LoadRun(const T* row, int64_t s_time, int64_t r0, int64_t len,
                                        bool vec, float (&v)[N]) {
  if (vec && r0 + N <= len) {
    LoadVec<T, N>(row + r0, v);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j) v[j] = r0 + j < len ? ToF(row[(r0 + j) * s_time]) : 0.f;
  }
}

template <typename T, int N>
__device__ __forceinline__ void StoreRun(T* row, int64_t s_time, int64_t r0, int64_t len, bool vec,
                                         const float (&v)[N]) {
  if (vec && r0 + N <= len) {
    StoreVec<T, N>(row + r0, v);
  } else {
#pragma unroll
    for (int j = 0; j < N; ++j)
      if (r0 + j < len) row[(r0 + j) * s_time] = FromF<T>(v[j]);
  }
}

// Copies a run into shared memory (16-byte aligned) with float4 stores.
template <int N>
__device__ __forceinline__ void StoreShared(float* dst, const float (&v)[N]) {
#pragma unroll
  for (int i = 0; i < N / 4; ++i)
    reinterpret_cast<float4*>(dst)[i] = make_float4(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
}

// kV channels starting at c0 of time step t of a channels-last row.
template <typename T, int kV>
__device__ __forceinline__ void LoadCh(const T* row, int64_t dim, int64_t c0, int64_t t, bool vec,
                                       float (&v)[kV]) {
  const T* p = row + t * dim + c0;
  if (vec) {
    LoadVec<T, kV>(p, v);
  } else {
#pragma unroll
    for (int c = 0; c < kV; ++c) v[c] = c0 + c < dim ? ToF(p[c]) : 0.f;
  }
}

template <typename T, int kV>
__device__ __forceinline__ void StoreCh(T* row, int64_t dim, int64_t c0, int64_t t, bool vec,
                                        const float (&v)[kV]) {
  T* p = row + t * dim + c0;
  if (vec) {
    StoreVec<T, kV>(p, v);
  } else {
#pragma unroll
    for (int c = 0; c < kV; ++c)
      if (c0 + c < dim) p[c] = FromF<T>(v[c]);
  }
}

// kV channels of one time step kept as loaded (raw T, one 8- or 16-byte word):
// half the registers of floats, so more steps' loads can be in flight.
template <typename T, int kV>
struct alignas(kV * sizeof(T)) ChRaw {
  T e[kV];
  __device__ __forceinline__ float operator[](int c) const { return ToF(e[c]); }
};

template <typename T, int kV>
__device__ __forceinline__ ChRaw<T, kV> LoadChRaw(const T* row, int64_t dim, int64_t c0, int64_t t,
                                                  bool vec) {
  ChRaw<T, kV> r;
  const T* p = row + t * dim + c0;
  if (vec) {
    constexpr int kBytes = kV * int(sizeof(T));
    using V = typename std::conditional<kBytes == 16, uint4,
              typename std::conditional<kBytes == 8, uint2, unsigned>::type>::type;
    static_assert(sizeof(V) == kBytes, "one 4-, 8- or 16-byte word");
    *reinterpret_cast<V*>(r.e) = __ldg(reinterpret_cast<const V*>(p));
  } else {
#pragma unroll
    for (int c = 0; c < kV; ++c) r.e[c] = c0 + c < dim ? p[c] : FromF<T>(0.f);
  }
  return r;
}

// Taps and biases of kV consecutive channels-last channels, weight row
// `first` onwards ((groups * dim, W) weights, run-time dtype); channels from
// `count` on read as zero (past the end of dim).
template <int kW, int kV>
__device__ __forceinline__ void LoadClTaps(const ConvArgs& a, int64_t first, int64_t count,
                                           float (&w)[kW][kV], float (&bias)[kV]) {
#pragma unroll
  for (int c = 0; c < kV; ++c) {
    const bool ok = c < count;
#pragma unroll
    for (int k = 0; k < kW; ++k)
      w[k][c] = ok ? LoadAnyF(a.weight, a.w_dtype, (first + c) * kW + k) : 0.f;
    bias[c] = ok && a.bias ? LoadAnyF(a.bias, a.b_dtype, first + c) : 0.f;
  }
}

// History of a channels-last thread at the start of its slice: win[i] = the
// input at step ts - H + i for kV channels from c0 (the initial states, or
// zeros, before step 0). xb points at channel c0 of batch row b; whole vectors.
template <typename T, int kV, int H>
__device__ __forceinline__ void LoadClHistory(const ConvArgs& a, const T* xb, int64_t b, int64_t c0,
                                              int64_t ts, float (*win)[kV]) {
#pragma unroll
  for (int i = 0; i < H; ++i) {
    const int64_t t = ts - H + i;
    if (t >= 0) {
      const ChRaw<T, kV> r = LoadChRaw<T, kV>(xb, a.dim, 0, t, true);
#pragma unroll
      for (int c = 0; c < kV; ++c) win[i][c] = r[c];
    } else {
#pragma unroll
      for (int c = 0; c < kV; ++c)
        win[i][c] = a.initial_states ? LoadState<T>(a, a.initial_states, b, c0 + c, H + t) : 0.f;
    }
  }
}

// Channels-last backward blocks: adds each thread's partial dweight/dbias
// (dw[k][c], k == W for the bias) over the block's kClY time slices, in slice
// order, and writes them to ws[grp][part][d][W + 1] for ReduceKernel.
template <int kW, int kV>
__device__ __forceinline__ void WriteClPartials(const ConvArgs& a, float (*red)[kClX][kV * (kW + 1)],
                                                const float (&dw)[kW + 1][kV], int64_t b, int64_t c0,
                                                int64_t nchunk, int64_t chunk, float* ws) {
#pragma unroll
  for (int k = 0; k <= kW; ++k)
#pragma unroll
    for (int c = 0; c < kV; ++c) red[threadIdx.y][threadIdx.x][k * kV + c] = dw[k][c];
  __syncthreads();
  if (threadIdx.y == 0 && c0 < a.dim) {
    const int64_t bpg = a.batch_per_group(), grp = b / bpg;
    const int64_t nparts = bpg * nchunk, part = (b % bpg) * nchunk + chunk;
    for (int c = 0; c < kV && c0 + c < a.dim; ++c) {
      float* wsrow = ws + ((grp * nparts + part) * a.dim + c0 + c) * (kW + 1);
      for (int k = 0; k <= kW; ++k) {
        float s = 0.f;
        for (int y = 0; y < kClY; ++y) s += red[y][threadIdx.x][k * kV + c];
        wsrow[k] = s;
      }
    }
  }
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

// Ceil division for launch sizes.
__host__ __device__ __forceinline__ int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Channels-last grids are 1-D, the channel groups (kClX x kV channels) of one
// (batch row, time chunk) consecutive: the blocks in flight then read and
// write whole time steps. With the time chunks consecutive instead, the
// row-kernel forward took 207.8 us against 203.5 us (H100, (8,4096,4096) bf16).
__host__ __device__ __forceinline__ int64_t ClGroups(int64_t dim, int kV) {
  return CeilDiv(dim, int64_t(kClX) * kV);
}
inline int64_t ClBlocks(int64_t batch, int64_t nchunk, int64_t dim, int kV) {
  return batch * nchunk * ClGroups(dim, kV);
}
struct ClBlock {
  int64_t b, chunk, c0;  // batch row, time chunk, this thread's first channel
};
template <int kV>
__device__ __forceinline__ ClBlock LocateClBlock(int64_t dim, int64_t nchunk) {
  const int64_t groups = ClGroups(dim, kV), rest = DivFast(blockIdx.x, groups);
  const int64_t b = DivFast(rest, nchunk);
  return {b, rest - b * nchunk, ((blockIdx.x - rest * groups) * kClX + threadIdx.x) * kV};
}

}  // namespace jcc::cuda
