// Decode: the causal conv of S new tokens against a rolling or circular state,
// and the extraction of per-sequence states from a packed prefill.
#include <algorithm>
#include <cstdint>

#include "common.cuh"
#include "launchers.h"

namespace jcc::cuda {
namespace {

// Thread per (b, d): y[b, d, :] and the state row of its slot.
template <typename T>
__global__ void UpdateKernel(const UpdateArgs u) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= u.batch * u.dim) return;
  // 32-bit division where the sizes allow (the hot decode path is latency-bound).
  int64_t b, d, g;
  if (u.batch * u.dim <= INT32_MAX) {
    const uint32_t ui = uint32_t(i), dim = uint32_t(u.dim);
    b = ui / dim, d = ui % dim, g = uint32_t(b) / uint32_t(u.batch / u.groups);
  } else {
    b = i / u.dim, d = i % u.dim, g = b / (u.batch / u.groups);
  }
  const int64_t W = u.width, H = W - 1, S = u.seqlen, SL = u.state_len;
  const T* xr = static_cast<const T*>(u.x) + i * S;
  T* yr = static_cast<T*>(u.y) + i * S;
  const int64_t slot = u.conv_state_indices ? int64_t(u.conv_state_indices[b]) : b;
  if (slot < 0 || slot >= u.num_slots) {  // padding row (or a bad index): zeros, state untouched
    for (int64_t s = 0; s < S; ++s) yr[s] = FromF<T>(0.f);
    return;
  }
  T* st = static_cast<T*>(u.conv_state) + (slot * u.dim + d) * SL;
  const int64_t wrow = g * u.dim + d;
  const bool silu = u.act == Activation::kSilu;
  const float bias = u.bias ? LoadAnyF(u.bias, u.b_dtype, wrow) : 0.f;
  // Circular buffer: the oldest of the H entries we need sits at `head`.
  const int64_t c = u.cache_seqlens ? int64_t(u.cache_seqlens[b]) : 0;
  int64_t head = SL - H;
  if (u.cache_seqlens && SL > 0) head = ((c - H) % SL + SL) % SL;

  if (W <= 4 && S == 1 && SL <= 4) {  // the decode hot path: everything in registers
    // The whole state row (rolling) or the H entries before `head` (circular),
    // all loads issued before any store.
    float w[4] = {0.f, 0.f, 0.f, 0.f}, xp[4] = {0.f, 0.f, 0.f, 0.f};
    T row[4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (k < W) w[k] = LoadAnyF(u.weight, u.w_dtype, wrow * W + k);
    const T xin = xr[0];
#pragma unroll
    for (int q = 0; q < 4; ++q)
      if (q < SL) row[q] = st[q];
    // xp[j] = state entry head + j (mod SL) for j < H, then the new input.
#pragma unroll
    for (int j = 0; j < 3; ++j) {
      int64_t q = head + j;
      if (q >= SL) q -= SL;
#pragma unroll
      for (int r = 0; r < 4; ++r)
        if (j < H && r == q) xp[j] = ToF(row[r]);
    }
    float acc = bias;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float xv = k == H ? ToF(xin) : xp[k];
      if (k < W) acc += w[k] * xv;
    }
    yr[0] = FromF<T>(Activate(acc, silu));
    if (SL == 0) return;
    if (u.cache_seqlens) {
      st[((c % SL) + SL) % SL] = xin;
    } else {
#pragma unroll
      for (int q = 0; q + 1 < 4; ++q)
        if (q + 1 < SL) st[q] = row[q + 1];
      st[SL - 1] = xin;
    }
    return;
  }

  // General: xp = [H most recent state entries, S new inputs], read on the fly.
  auto xp = [&](int64_t j) -> float {
    if (j >= H) return ToF(xr[j - H]);
    int64_t q = head + j;
    if (u.cache_seqlens) q %= SL;
    return ToF(st[q]);
  };
  for (int64_t s = 0; s < S; ++s) {
    float acc = bias;
    for (int64_t k = 0; k < W; ++k) acc += LoadAnyF(u.weight, u.w_dtype, wrow * W + k) * xp(s + k);
    yr[s] = FromF<T>(Activate(acc, silu));
  }
  if (SL == 0) return;
  if (u.cache_seqlens) {
    for (int64_t s = Max64(0, S - SL); s < S; ++s) st[(((c + s) % SL) + SL) % SL] = xr[s];
  } else if (S >= SL) {
    for (int64_t q = 0; q < SL; ++q) st[q] = xr[S - SL + q];
  } else {
    for (int64_t q = 0; q < SL - S; ++q) st[q] = st[q + S];
    for (int64_t q = 0; q < S; ++q) st[SL - S + q] = xr[q];
  }
}

// The decode hot path: one new token, state_len == W - 1 (2 <= W <= 4),
// dim a multiple of 8, 16-byte aligned buffers. Each thread owns 8
// consecutive channels of one batch row, so x, y and the state rows move in
// 16-byte vectors (8 channels x H entries are contiguous), and every load is
// issued before the first use: the one-token step is latency-bound, and a
// thread per channel left too little in flight.
constexpr int kVecChannels = 8;
constexpr int kUpdateThreads = 128;

template <typename T, int kBytes>
struct RawVec {  // kBytes of T in 16-byte words
  static_assert(kBytes % 16 == 0, "whole 16-byte words");
  uint4 w[kBytes / 16];
  __device__ __forceinline__ void Load(const T* p) {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) w[i] = __ldg(reinterpret_cast<const uint4*>(p) + i);
  }
  __device__ __forceinline__ void Zero() {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) w[i] = make_uint4(0, 0, 0, 0);
  }
  __device__ __forceinline__ void Store(T* p) const {
#pragma unroll
    for (int i = 0; i < kBytes / 16; ++i) reinterpret_cast<uint4*>(p)[i] = w[i];
  }
  __device__ __forceinline__ T& operator[](int j) { return reinterpret_cast<T*>(w)[j]; }
};

// n consecutive elements from element `first` of a run-time-dtype array
// (16-byte aligned there), as floats: raw 16-byte loads, then one switch.
template <int n>
__device__ __forceinline__ void LoadRowF(const void* base, DType t, int64_t first, float* out) {
  constexpr int kWords = (n * 4 + 15) / 16;  // enough for float32; fewer used for 2-byte types
  uint4 raw[kWords];
  const int bytes = t == DType::kF32 ? 4 : 2;
  const uint4* p = reinterpret_cast<const uint4*>(static_cast<const char*>(base) + first * bytes);
#pragma unroll
  for (int i = 0; i < kWords; ++i)
    if (i * 16 < n * bytes) raw[i] = __ldg(p + i);
  switch (t) {
    case DType::kF32:
#pragma unroll
      for (int j = 0; j < n; ++j) out[j] = reinterpret_cast<const float*>(raw)[j];
      break;
    case DType::kF16:
#pragma unroll
      for (int j = 0; j < n; ++j) out[j] = __half2float(reinterpret_cast<const __half*>(raw)[j]);
      break;
    default:
#pragma unroll
      for (int j = 0; j < n; ++j) out[j] = __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(raw)[j]);
      break;
  }
}

template <typename T, int kW>
__global__ void __launch_bounds__(kUpdateThreads) UpdateVecKernel(const UpdateArgs u) {
  constexpr int C = kVecChannels, H = kW - 1;
  const int64_t chunks = u.dim / C;
  const int64_t i = blockIdx.x * int64_t(kUpdateThreads) + threadIdx.x;
  if (i >= u.batch * chunks) return;
  const int64_t b = i / chunks, d0 = (i - b * chunks) * C;
  const int64_t slot = u.conv_state_indices ? int64_t(u.conv_state_indices[b]) : b;
  const bool live = slot >= 0 && slot < u.num_slots;  // else a padding row: y = 0, state kept
  T* st = static_cast<T*>(u.conv_state) + (slot * u.dim + d0) * H;
  RawVec<T, C * sizeof(T)> xv;
  RawVec<T, C * H * sizeof(T)> sv;
  xv.Load(static_cast<const T*>(u.x) + b * u.dim + d0);
  if (live) sv.Load(st);
  else sv.Zero();
  const int64_t wrow = (b / (u.batch / u.groups)) * u.dim + d0;
  // The 8 channels' taps (8 x kW contiguous) and biases, as raw 16-byte words
  // loaded at once; converted after one switch on the (run-time) dtype, so
  // no load waits inside a per-element switch.
  float w[C][kW], bias[C];
  LoadRowF<C * kW>(u.weight, u.w_dtype, wrow * kW, &w[0][0]);
  if (u.bias) LoadRowF<C>(u.bias, u.b_dtype, wrow, bias);
  else
#pragma unroll
    for (int c = 0; c < C; ++c) bias[c] = 0.f;
  // Circular buffer: the oldest entry, and the one the new token replaces.
  int head = 0;
  if (u.cache_seqlens) head = int(((int64_t(u.cache_seqlens[b]) % H) + H) % H);
  const bool silu = u.act == Activation::kSilu;
  float row[C][H > 0 ? H : 1];  // the state rows, unpacked
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int q = 0; q < H; ++q) row[c][q] = ToF(sv[c * H + q]);
  RawVec<T, C * sizeof(T)> yv;
  RawVec<T, C * H * sizeof(T)> out;  // the new state rows
#pragma unroll
  for (int c = 0; c < C; ++c) {
    const float xin = ToF(xv[c]);
    float acc = bias[c] + w[c][H] * xin;
    // win[j] = entry (head + j) mod H, by whole compile-time rotations (a
    // run-time index would put the rows in local memory)
    float win[H > 0 ? H : 1];
#pragma unroll
    for (int j = 0; j < H; ++j) win[j] = row[c][j];
#pragma unroll
    for (int r = 1; r < H; ++r)
      if (head == r) {
#pragma unroll
        for (int j = 0; j < H; ++j) win[j] = row[c][(j + r) % H];
      }
#pragma unroll
    for (int j = 0; j < H; ++j) acc += w[c][j] * win[j];
    yv[c] = FromF<T>(live ? Activate(acc, silu) : 0.f);
#pragma unroll
    for (int q = 0; q < H; ++q) {
      float nv;
      if (u.cache_seqlens) nv = q == head ? xin : row[c][q];  // replace the oldest
      else nv = q + 1 < H ? row[c][q + 1] : xin;              // shift left
      out[c * H + q] = FromF<T>(nv);
    }
  }
  yv.Store(static_cast<T*>(u.y) + b * u.dim + d0);
  if (!live) return;
  out.Store(st);
}

bool Aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <typename T>
bool TryUpdateVec(const UpdateArgs& u, cudaStream_t stream, cudaError_t* err) {
  // (the weights and bias may also be float64 on the CPU only; here they are
  // float32/float16/bfloat16, whose 8-channel rows are whole 16-byte words)
  if (u.seqlen != 1 || u.width < 2 || u.width > 4 || u.state_len != u.width - 1 ||
      u.dim % kVecChannels != 0 || !Aligned16(u.x) || !Aligned16(u.y) ||
      !Aligned16(u.conv_state) || !Aligned16(u.weight) || !Aligned16(u.bias) ||
      u.w_dtype == DType::kF64 || u.b_dtype == DType::kF64)
    return false;
  const unsigned blocks = unsigned(CeilDiv(u.batch * (u.dim / kVecChannels), kUpdateThreads));
  switch (u.width) {
    case 2: UpdateVecKernel<T, 2><<<blocks, kUpdateThreads, 0, stream>>>(u); break;
    case 3: UpdateVecKernel<T, 3><<<blocks, kUpdateThreads, 0, stream>>>(u); break;
    default: UpdateVecKernel<T, 4><<<blocks, kUpdateThreads, 0, stream>>>(u); break;
  }
  *err = cudaGetLastError();
  return true;
}

// states[n, d, j] = x[hi - SL + j, d] when inside sequence n, else 0.
template <typename T>
__global__ void VarlenStatesKernel(const VarlenStatesArgs v) {
  const int64_t total = v.num_seqs * v.dim * v.state_len;
  const T* x = static_cast<const T*>(v.x);
  T* out = static_cast<T*>(v.states);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t d = i % v.dim, j = (i / v.dim) % v.state_len, n = i / (v.dim * v.state_len);
    const int64_t lo = Min64(Max64(v.cu_seqlens[n], 0), v.total);
    const int64_t hi = Min64(Max64(v.cu_seqlens[n + 1], lo), v.total);
    const int64_t t = hi - v.state_len + j;
    out[(n * v.dim + d) * v.state_len + j] = t >= lo ? x[t * v.dim + d] : FromF<T>(0.f);
  }
}

template <typename T>
cudaError_t UpdateT(const UpdateArgs& u, cudaStream_t stream) {
  const int64_t n = u.batch * u.dim;
  if (n == 0) return cudaSuccess;
  cudaError_t err = cudaSuccess;
  if (TryUpdateVec<T>(u, stream, &err)) return err;
  UpdateKernel<T><<<unsigned(CeilDiv(n, 256)), 256, 0, stream>>>(u);
  return cudaGetLastError();
}

template <typename T>
cudaError_t VarlenStatesT(const VarlenStatesArgs& v, cudaStream_t stream) {
  const int64_t n = v.num_seqs * v.dim * v.state_len;
  if (n == 0) return cudaSuccess;
  VarlenStatesKernel<T><<<unsigned(std::min<int64_t>(CeilDiv(n, 256), 65536)), 256, 0, stream>>>(v);
  return cudaGetLastError();
}

}  // namespace

cudaError_t Update(const UpdateArgs& u, cudaStream_t stream) {
  switch (u.x_dtype) {
    case DType::kF32: return UpdateT<float>(u, stream);
    case DType::kF16: return UpdateT<__half>(u, stream);
    case DType::kBF16: return UpdateT<__nv_bfloat16>(u, stream);
    default: return cudaErrorNotSupported;
  }
}

cudaError_t VarlenStates(const VarlenStatesArgs& v, cudaStream_t stream) {
  switch (v.x_dtype) {
    case DType::kF32: return VarlenStatesT<float>(v, stream);
    case DType::kF16: return VarlenStatesT<__half>(v, stream);
    case DType::kBF16: return VarlenStatesT<__nv_bfloat16>(v, stream);
    default: return cudaErrorNotSupported;
  }
}

}  // namespace jcc::cuda
