// Decode: the causal conv of S new tokens against a rolling or circular
// state (the general kernel; the one-token hot paths are update_vec.cu and
// update_cl_vec.cu), and the extraction of per-sequence states from a packed
// prefill.
#include <algorithm>
#include <cstdint>

#include "common.cuh"
#include "launchers.h"

namespace jcc::cuda {
namespace {

// Thread per (b, d): y[b, d, :] and the state of channel d in its slot, for
// either layout (UpdateArgs::XAt / StateAt; channels-last threads of a warp
// touch consecutive channels).
template <typename T>
__global__ void UpdateKernel(const UpdateArgs u) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i >= u.batch * u.dim) return;
  // 32-bit division where the sizes allow (the decode path is latency-bound).
  int64_t b, d, g;
  if (u.batch * u.dim <= INT32_MAX) {
    const uint32_t ui = uint32_t(i), dim = uint32_t(u.dim);
    b = ui / dim, d = ui % dim, g = uint32_t(b) / uint32_t(u.batch / u.groups);
  } else {
    b = i / u.dim, d = i % u.dim, g = b / (u.batch / u.groups);
  }
  const int64_t W = u.width, H = W - 1, S = u.seqlen, SL = u.state_len;
  const T* x = static_cast<const T*>(u.x);
  T* y = static_cast<T*>(u.y);
  const int64_t slot = u.conv_state_indices ? int64_t(u.conv_state_indices[b]) : b;
  if (slot < 0 || slot >= u.num_slots) {  // padding row (or a bad index): zeros, state untouched
    for (int64_t s = 0; s < S; ++s) y[u.YAt(b, d, s)] = FromF<T>(0.f);
    return;
  }
  T* st = static_cast<T*>(u.conv_state);
  auto entry = [&](int64_t j) -> T& { return st[u.StateAt(slot, d, j)]; };
  const int64_t wrow = g * u.dim + d;
  const bool silu = u.act == Activation::kSilu;
  const float bias = u.bias ? LoadAnyF(u.bias, u.b_dtype, wrow) : 0.f;
  // Circular buffer: the oldest of the H entries we need sits at `head`.
  const int64_t c = u.cache_seqlens ? int64_t(u.cache_seqlens[b]) : 0;
  int64_t head = SL - H;
  if (u.cache_seqlens && SL > 0) head = ((c - H) % SL + SL) % SL;

  // xp = [H most recent state entries, S new inputs], read on the fly.
  auto xp = [&](int64_t j) -> float {
    if (j >= H) return ToF(x[u.XAt(b, d, j - H)]);
    int64_t q = head + j;
    if (u.cache_seqlens) q %= SL;
    return ToF(entry(q));
  };
  for (int64_t s = 0; s < S; ++s) {
    float acc = bias;
    for (int64_t k = 0; k < W; ++k) acc += LoadAnyF(u.weight, u.w_dtype, wrow * W + k) * xp(s + k);
    y[u.YAt(b, d, s)] = FromF<T>(Activate(acc, silu));
  }
  if (SL == 0) return;
  if (u.cache_seqlens) {
    for (int64_t s = Max64(0, S - SL); s < S; ++s) entry((((c + s) % SL) + SL) % SL) = x[u.XAt(b, d, s)];
  } else if (S >= SL) {
    for (int64_t q = 0; q < SL; ++q) entry(q) = x[u.XAt(b, d, S - SL + q)];
  } else {
    for (int64_t q = 0; q < SL - S; ++q) entry(q) = entry(q + S);
    for (int64_t q = 0; q < S; ++q) entry(SL - S + q) = x[u.XAt(b, d, q)];
  }
}

// states[n, d, j] (or [n, j, d]) = x[hi - SL + j, d] when inside sequence n, else 0.
template <typename T>
__global__ void VarlenStatesKernel(const VarlenStatesArgs v) {
  const int64_t total = v.num_seqs * v.dim * v.state_len;
  const T* x = static_cast<const T*>(v.x);
  T* out = static_cast<T*>(v.states);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    int64_t d, j, n;
    if (v.channels_last) {  // consecutive threads: consecutive channels
      d = i % v.dim, j = (i / v.dim) % v.state_len, n = i / (v.dim * v.state_len);
    } else {
      j = i % v.state_len, d = (i / v.state_len) % v.dim, n = i / (v.dim * v.state_len);
    }
    const int64_t lo = Min64(Max64(v.cu_seqlens[n], 0), v.total);
    const int64_t hi = Min64(Max64(v.cu_seqlens[n + 1], lo), v.total);
    const int64_t t = hi - v.state_len + j;
    out[v.StateAt(n, d, j)] = t >= lo ? x[v.XAt(t, d)] : FromF<T>(0.f);
  }
}

template <typename T>
cudaError_t UpdateT(const UpdateArgs& u, cudaStream_t stream) {
  const int64_t n = u.batch * u.dim;
  if (n == 0) return cudaSuccess;
  cudaError_t err = cudaSuccess;
  if (UpdateVec(u, stream, &err) || UpdateClVec(u, stream, &err)) return err;
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
  return WithFloatType(u.x_dtype, cudaErrorNotSupported,
                       [&](auto t) { return UpdateT<decltype(t)>(u, stream); });
}

cudaError_t VarlenStates(const VarlenStatesArgs& v, cudaStream_t stream) {
  return WithFloatType(v.x_dtype, cudaErrorNotSupported,
                       [&](auto t) { return VarlenStatesT<decltype(t)>(v, stream); });
}

}  // namespace jcc::cuda
