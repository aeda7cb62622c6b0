// Decode: the causal conv of S new tokens against a rolling or circular
// state (the general kernel; the hot paths for W <= 4 are update_vec.cu,
// update_cl_vec.cu and update_ring_cf.cu), and the extraction of
// per-sequence states from a packed prefill.
#include <algorithm>
#include <cstdint>

#include "common.cuh"
#include "launchers.h"
#include "update_words.cuh"

namespace jcc::cuda {
namespace {

// Thread per (b, d): y[b, d, :] and the state of channel d in its slot, for
// either layout (consecutive threads take consecutive channels). Serves the
// multi-token steps and the speculative ring (state_len > W - 1), so it keeps
// the window of the last W inputs in registers (kMaxW >= W slots, the window
// right-aligned so every index is a compile-time one), the taps loaded once,
// and walks the ring with wrap-around increments instead of a division per
// entry. kMaxW == 0: any width, inputs read from memory per tap.
template <typename T, int kMaxW>
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
  const int W = int(u.width), H = W - 1, S = int(u.seqlen), SL = int(u.state_len);
  // Element strides between consecutive tokens of x and y and entries of the state.
  const int64_t xs = u.channels_last ? (u.x_row_stride ? u.x_row_stride : u.dim) : 1;
  const int64_t ys = u.channels_last ? u.dim : 1;
  const int64_t ss = u.channels_last ? u.dim : 1;
  const T* x = static_cast<const T*>(u.x) + u.XAt(b, d, 0);
  T* y = static_cast<T*>(u.y) + u.YAt(b, d, 0);
  const int64_t slot = u.conv_state_indices ? int64_t(u.conv_state_indices[b]) : b;
  if (slot < 0 || slot >= u.num_slots) {  // padding row (or a bad index): zeros, state untouched
    for (int s = 0; s < S; ++s) y[s * ys] = FromF<T>(0.f);
    return;
  }
  T* st = static_cast<T*>(u.conv_state) + u.StateAt(slot, d, 0);
  const int64_t wrow = g * u.dim + d;
  const bool silu = u.act == Activation::kSilu;
  const float bias = u.bias ? LoadAnyF(u.bias, u.b_dtype, wrow) : 0.f;
  // Circular buffer: the oldest of the H entries we need sits at `head`;
  // token s goes to entry (c + s) mod SL.
  const bool ring = u.cache_seqlens != nullptr && SL > 0;
  const int c = ring ? int(u.cache_seqlens[b]) : 0;
  auto wrap = [SL](int q) { return q >= SL ? q - SL : q; };  // q < 2 * SL
  int head = SL - H, put = 0;  // put: the entry token 0 would take
  if (ring) {
    const RingEntries e = RingAt(c, H, SL, 0);
    head = e.head, put = e.put;
  }

  if constexpr (kMaxW > 0) {
    float w[kMaxW], win[kMaxW];  // both right-aligned: slot kMaxW - W + k holds tap k
#pragma unroll
    for (int k = 0; k < kMaxW; ++k) {
      const int j = k - (kMaxW - W);  // the tap / state entry of slot k
      w[k] = j >= 0 ? LoadAnyF(u.weight, u.w_dtype, wrow * W + j) : 0.f;
      win[k] = j >= 0 && j < H ? ToF(st[wrap(head + j) * ss]) : 0.f;
    }
    // Writing the ring as the tokens go is safe: its H read entries are in
    // registers. Tokens before S - SL would be overwritten; skip them.
    const int first_put = S > SL ? S - SL : 0;
    if (ring) put = wrap(put + first_put % SL);
    for (int s = 0; s < S; ++s) {
      const T xv = x[s * xs];
      win[kMaxW - 1] = ToF(xv);
      float acc = bias;
#pragma unroll
      for (int k = 0; k < kMaxW; ++k)
        if (k >= kMaxW - W) acc += w[k] * win[k];
      y[s * ys] = FromF<T>(Activate(acc, silu));
#pragma unroll
      for (int k = 0; k + 1 < kMaxW; ++k) win[k] = win[k + 1];
      if (ring && s >= first_put) {
        st[put * ss] = xv;
        put = wrap(put + 1);
      }
    }
  } else {
    // xp = [H most recent state entries, S new inputs], read on the fly.
    auto xp = [&](int j) -> float { return j >= H ? ToF(x[(j - H) * xs]) : ToF(st[wrap(head + j) * ss]); };
    for (int s = 0; s < S; ++s) {
      float acc = bias;
      for (int k = 0; k < W; ++k) acc += LoadAnyF(u.weight, u.w_dtype, wrow * W + k) * xp(s + k);
      y[s * ys] = FromF<T>(Activate(acc, silu));
    }
    if (ring) {
      const int first_put = S > SL ? S - SL : 0;
      put = wrap(put + first_put % SL);
      for (int s = first_put; s < S; ++s, put = wrap(put + 1)) st[put * ss] = x[s * xs];
    }
  }
  if (SL == 0 || ring) return;
  // Rolling state: shift left by S, the new tokens at the end.
  if (S >= SL) {
    for (int q = 0; q < SL; ++q) st[q * ss] = x[(S - SL + q) * xs];
  } else {
    for (int q = 0; q < SL - S; ++q) st[q * ss] = st[(q + S) * ss];
    for (int q = 0; q < S; ++q) st[(SL - S + q) * ss] = x[q * xs];
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
  if (UpdateVec(u, stream, &err) || UpdateClVec(u, stream, &err) || UpdateRingCf(u, stream, &err)) return err;
  const unsigned blocks = unsigned(CeilDiv(n, 256));
  if (u.width <= 4) UpdateKernel<T, 4><<<blocks, 256, 0, stream>>>(u);
  else if (u.width <= 8) UpdateKernel<T, 8><<<blocks, 256, 0, stream>>>(u);
  else UpdateKernel<T, 0><<<blocks, 256, 0, stream>>>(u);
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
