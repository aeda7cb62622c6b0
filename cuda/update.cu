// Decode: the causal conv of S new tokens against a rolling or circular state,
// and the extraction of per-sequence states from a packed prefill.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>

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

// The decode hot path: one new token, state_len == W - 1 (2 <= W <= 4),
// dim a multiple of 4, 16-byte aligned buffers. Each thread owns C = 4 or 8
// consecutive channels and a run of batch rows, so x, y and the state rows
// move in whole words (C channels x H entries are contiguous). What made it
// faster, measured on an H100 (cuda/NOTES.md): 8-channel state rows moving
// as warp-wide coalesced words through shared memory, marked streaming (it
// is not read again until the next step), 32-bit index math, and, when the
// batch is larger than the GPU holds at once, several rows per thread with
// the next row's loads in flight while the current one is computed.
constexpr int kUpdateThreads = 128;

// Whether rows of C channels may go through shared memory: it pays for
// 8-channel rows (48-byte state rows for 2-byte types), not for 4-channel ones
// (H100, B=64, D=4096: 3.07 us unstaged against 3.11).
__host__ __device__ constexpr bool StagesRows(int C) { return C == 8; }

// The widest word (16, 8 or 4 bytes) that divides kBytes.
template <int kBytes>
using WordOf = std::conditional_t<kBytes % 16 == 0, uint4, std::conditional_t<kBytes % 8 == 0, uint2, uint32_t>>;

template <typename T, int kBytes>
struct RawVec {  // kBytes of T in the widest whole words
  using Word = WordOf<kBytes>;
  static_assert(kBytes % 4 == 0, "whole 4-byte words");
  static constexpr int kWords = kBytes / int(sizeof(Word));
  Word w[kWords];
  __device__ __forceinline__ void Load(const T* p) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = __ldg(reinterpret_cast<const Word*>(p) + i);
  }
  __device__ __forceinline__ void Zero() {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = Word{};
  }
  __device__ __forceinline__ void Store(T* p) const {
#pragma unroll
    for (int i = 0; i < kWords; ++i) reinterpret_cast<Word*>(p)[i] = w[i];
  }
  __device__ __forceinline__ T& operator[](int j) { return reinterpret_cast<T*>(w)[j]; }
  __device__ __forceinline__ T operator[](int j) const { return reinterpret_cast<const T*>(w)[j]; }
};

// n consecutive elements from element `first` (a multiple of n) of a
// run-time-dtype array, as floats: raw word loads, then one switch. The word
// divides n 2-byte elements, so `first` is aligned to it for any dtype.
template <int n>
__device__ __forceinline__ void LoadRowF(const void* base, DType t, int64_t first, float* out) {
  using Word = WordOf<n * 2>;
  constexpr int kWords = n * 4 / int(sizeof(Word));  // enough for float32; half used for 2-byte types
  Word raw[kWords];
  const int bytes = t == DType::kF32 ? 4 : 2;
  const Word* p = reinterpret_cast<const Word*>(static_cast<const char*>(base) + first * bytes);
#pragma unroll
  for (int i = 0; i < kWords; ++i)
    if (i * int(sizeof(Word)) < n * bytes) raw[i] = __ldg(p + i);
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

// How the hot-path grid covers (batch, dim / C), C = 4 or 8 channels per
// thread: thread t owns channel group t % chunks of rows
// [rg * rows, rg * rows + rows), rg = t / chunks.
struct UpdatePlan {
  int32_t chunks = 0;       // dim / C
  int32_t row_groups = 0;   // ceil(batch / rows)
  int32_t rows = 1;         // batch rows per thread
  int32_t group_rows = 1;   // batch / groups: rows sharing one weight row
  bool staged = false;      // each warp's state rows are contiguous and go through shared memory (StagesRows)
};

// One batch row's share of a thread: its loads, issued before they are used.
template <typename T, int kW, int C>
struct UpdateRow {
  static constexpr int H = kW - 1;
  RawVec<T, C * sizeof(T)> x;
  RawVec<T, C * H * sizeof(T)> s;  // this thread's words, or (staged) word q * 32 + lane
  T* st;
  int head;  // circular buffer: the oldest entry, the one the new token replaces
  bool live;  // else a padding row: y = 0, state kept

  __device__ __forceinline__ void Load(const UpdateArgs& u, int b, int d0, int lane, bool staged) {
    const int64_t slot = u.conv_state_indices ? int64_t(u.conv_state_indices[b]) : b;
    live = slot >= 0 && slot < u.num_slots;
    st = static_cast<T*>(u.conv_state) + (slot * u.dim + d0) * H;
    x.Load(static_cast<const T*>(u.x) + int64_t(b) * u.dim + d0);
    head = u.cache_seqlens ? int(((int64_t(u.cache_seqlens[b]) % H) + H) % H) : 0;
    // Streaming loads: the state is not read again before the next step.
    using Word = typename decltype(s)::Word;
    const Word* src = reinterpret_cast<const Word*>(staged ? st - lane * C * H : st);
    if (!live) s.Zero();
    else
#pragma unroll
      for (int q = 0; q < s.kWords; ++q) s.w[q] = __ldcs(staged ? src + q * 32 + lane : src + q);
  }
};

// y and the new state rows of C channels.
template <typename T, int kW, int C, bool kCircular>
__device__ __forceinline__ void UpdateChannels(const UpdateRow<T, kW, C>& r, const float (&w)[C][kW],
                                               const float (&bias)[C], bool silu,
                                               RawVec<T, C * sizeof(T)>& yv,
                                               RawVec<T, C * (kW - 1) * sizeof(T)>& out) {
  constexpr int H = kW - 1;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    float row[H];
#pragma unroll
    for (int q = 0; q < H; ++q) row[q] = ToF(r.s[c * H + q]);
    const float xin = ToF(r.x[c]);
    float acc = bias[c] + w[c][H] * xin;
    // win[j] = entry (head + j) mod H, by whole compile-time rotations (a
    // run-time index would put the rows in local memory)
    float win[H];
#pragma unroll
    for (int j = 0; j < H; ++j) win[j] = row[j];
    if (kCircular) {
#pragma unroll
      for (int k = 1; k < H; ++k)
        if (r.head == k) {
#pragma unroll
          for (int j = 0; j < H; ++j) win[j] = row[(j + k) % H];
        }
    }
#pragma unroll
    for (int j = 0; j < H; ++j) acc += w[c][j] * win[j];
    yv[c] = FromF<T>(r.live ? Activate(acc, silu) : 0.f);
#pragma unroll
    for (int q = 0; q < H; ++q) {
      float nv;
      if (kCircular) nv = q == r.head ? xin : row[q];  // replace the oldest
      else nv = q + 1 < H ? row[q + 1] : xin;          // shift left
      out[c * H + q] = FromF<T>(nv);
    }
  }
}

// (4 blocks per SM for 2-byte types; float32 would spill there)
template <typename T, int kW, int C>
__global__ void __launch_bounds__(kUpdateThreads, sizeof(T) == 2 ? 4 : 3)
    UpdateVecKernel(const UpdateArgs u, const UpdatePlan p) {
  constexpr int H = kW - 1;
  using Row = UpdateRow<T, kW, C>;
  using Word = typename decltype(Row::s)::Word;
  constexpr int kWords = decltype(Row::s)::kWords;
  // A warp's 32 x kWords state words: loaded and stored by word (coalesced),
  // used by thread. Each lane writes only the slots it read, so one
  // __syncwarp per change of direction suffices.
  __shared__ Word stage[kUpdateThreads / 32][32 * kWords];
  const int t = blockIdx.x * kUpdateThreads + threadIdx.x;
  if (t >= p.row_groups * p.chunks) return;  // whole warps when staged
  const int lane = threadIdx.x & 31;
  const int rg = t / p.chunks, d0 = (t - rg * p.chunks) * C;
  const int b0 = rg * p.rows, b1 = min(int(u.batch), b0 + p.rows);
  Word* buf = stage[threadIdx.x >> 5];
  const bool staged = StagesRows(C) && p.staged;  // so unstaged widths compile without it
  const bool silu = u.act == Activation::kSilu;

  float w[C][kW], bias[C];
  auto load_weights = [&](int g) {  // the taps and biases of these C channels in weight group g
    const int64_t wrow = int64_t(g) * u.dim + d0;
    LoadRowF<C * kW>(u.weight, u.w_dtype, wrow * kW, &w[0][0]);
    if (u.bias) LoadRowF<C>(u.bias, u.b_dtype, wrow, bias);
    else
#pragma unroll
      for (int c = 0; c < C; ++c) bias[c] = 0.f;
  };
  auto finish = [&](Row& r, int b) {  // everything after the loads of row b
    if (staged && r.live) {  // word q * 32 + lane -> this thread's words
#pragma unroll
      for (int q = 0; q < kWords; ++q) buf[q * 32 + lane] = r.s.w[q];
      __syncwarp();
#pragma unroll
      for (int q = 0; q < kWords; ++q) r.s.w[q] = buf[lane * kWords + q];
    }
    RawVec<T, C * sizeof(T)> yv;
    RawVec<T, C * H * sizeof(T)> out;  // the new state rows
    if (u.cache_seqlens) UpdateChannels<T, kW, C, true>(r, w, bias, silu, yv, out);
    else UpdateChannels<T, kW, C, false>(r, w, bias, silu, yv, out);
    yv.Store(static_cast<T*>(u.y) + int64_t(b) * u.dim + d0);
    if (!r.live) return;
    if (staged) {  // back to word order, then coalesced streaming stores
#pragma unroll
      for (int q = 0; q < kWords; ++q) buf[lane * kWords + q] = out.w[q];
      __syncwarp();
      Word* dst = reinterpret_cast<Word*>(r.st - lane * C * H);
#pragma unroll
      for (int q = 0; q < kWords; ++q) __stcs(dst + q * 32 + lane, buf[q * 32 + lane]);
    } else {
#pragma unroll
      for (int q = 0; q < kWords; ++q) __stcs(reinterpret_cast<Word*>(r.st) + q, out.w[q]);
    }
  };

  Row cur;
  cur.Load(u, b0, d0, lane, staged);
  if (p.rows == 1) {  // straight line: the latency-bound small batch
    load_weights(b0 / p.group_rows);
    finish(cur, b0);
    return;
  }
  Row next;
  int wgroup = -1;
  for (int b = b0; b < b1; ++b) {
    if (b + 1 < b1) next.Load(u, b + 1, d0, lane, staged);
    const int g = b / p.group_rows;
    if (g != wgroup) load_weights(wgroup = g);
    finish(cur, b);
    cur = next;
  }
}

bool Aligned16(const void* p) { return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Threads of UpdateVecKernel<T, kW, C> a GPU of `sms` SMs holds at once.
template <typename T, int kW, int C>
int64_t ResidentThreads(int sms) {
  static const int blocks_per_sm = [] {
    int b = 0;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, UpdateVecKernel<T, kW, C>, kUpdateThreads, 0) ==
                   cudaSuccess
               ? b
               : 1;
  }();
  return int64_t(std::max(sms, 1)) * std::max(blocks_per_sm, 1) * kUpdateThreads;
}

// Rows per thread: one, unless the (batch, dim / C) grid is larger than
// the GPU holds at once; then as many as spread the rows evenly over it.
template <typename T, int kW, int C>
cudaError_t LaunchUpdateVec(const UpdateArgs& u, int64_t resident, cudaStream_t stream) {
  UpdatePlan p;
  p.chunks = int32_t(u.dim / C);
  p.staged = StagesRows(C) && p.chunks % 32 == 0;
  p.group_rows = int32_t(u.batch / u.groups);
  p.rows = int32_t(std::max<int64_t>(1, CeilDiv(u.batch * p.chunks, resident)));
  p.row_groups = int32_t(CeilDiv(u.batch, p.rows));
  const unsigned blocks = unsigned(CeilDiv(int64_t(p.row_groups) * p.chunks, kUpdateThreads));
  UpdateVecKernel<T, kW, C><<<blocks, kUpdateThreads, 0, stream>>>(u, p);
  return cudaGetLastError();
}

// The current device's SM count, asked of the runtime once per device: the
// query is host time on every decode step (H100, a 256-step lax.scan of
// updates: 0.3-1.5 us less per step with the count cached in 5 of 6
// alternating rounds, 0.2 us more in one).
int CurrentDeviceSms(cudaError_t* err) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> sms_of[kMaxDevices] = {};
  int device = 0, sms = 0;
  *err = cudaGetDevice(&device);
  if (*err != cudaSuccess) return 0;
  const bool cached = device >= 0 && device < kMaxDevices;
  if (cached && (sms = sms_of[device].load(std::memory_order_relaxed)) > 0) return sms;
  *err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (*err == cudaSuccess && cached) sms_of[device].store(sms, std::memory_order_relaxed);
  return sms;
}

// 4 channels per thread while the whole grid is resident at once, one row
// per thread: twice the warps then share each row's latency (H100, B=64,
// D=4096: 3.10 against 3.22 us per layer). Past that, 8 channels and several
// rows per thread (B=256, D=8192: 12.0 against 12.6 us with 4).
template <typename T, int kW>
cudaError_t LaunchUpdateVecBest(const UpdateArgs& u, cudaStream_t stream) {
  cudaError_t err = cudaSuccess;
  const int sms = CurrentDeviceSms(&err);
  if (err != cudaSuccess) return err;
  const int64_t resident4 = ResidentThreads<T, kW, 4>(sms);
  if (u.dim % 8 != 0 || u.batch * (u.dim / 4) <= resident4) return LaunchUpdateVec<T, kW, 4>(u, resident4, stream);
  return LaunchUpdateVec<T, kW, 8>(u, ResidentThreads<T, kW, 8>(sms), stream);
}

template <typename T>
bool TryUpdateVec(const UpdateArgs& u, cudaStream_t stream, cudaError_t* err) {
  // (the weights and bias may also be float64 on the CPU only; here they are
  // float32/float16/bfloat16, whose 4-channel rows are whole 8-byte words)
  if (u.channels_last || !u.x_dense() || u.seqlen != 1 || u.width < 2 || u.width > 4 ||
      u.state_len != u.width - 1 ||
      u.dim % 4 != 0 || !Aligned16(u.x) || !Aligned16(u.y) ||
      !Aligned16(u.conv_state) || !Aligned16(u.weight) || !Aligned16(u.bias) ||
      u.w_dtype == DType::kF64 || u.b_dtype == DType::kF64 ||
      u.batch * (u.dim / 4) + kUpdateThreads > INT32_MAX)  // 32-bit thread indices
    return false;
  switch (u.width) {
    case 2: *err = LaunchUpdateVecBest<T, 2>(u, stream); break;
    case 3: *err = LaunchUpdateVecBest<T, 3>(u, stream); break;
    default: *err = LaunchUpdateVecBest<T, 4>(u, stream); break;
  }
  return true;
}

// The channels-last decode hot path: one new token, state_len == W - 1,
// whole aligned 16-byte channel vectors. A thread owns C channels of one
// row: x, y and each of the H state entries are one 16-byte word at a
// stride of dim (coalesced across the warp), the weights C x W contiguous.
template <typename T, int kW>
__global__ void __launch_bounds__(kUpdateThreads) UpdateClVecKernel(const UpdateArgs u) {
  constexpr int H = kW - 1, C = 16 / int(sizeof(T));
  using Vec = RawVec<T, 16>;
  const int64_t chunks = u.dim / C;
  const int64_t i = blockIdx.x * int64_t(kUpdateThreads) + threadIdx.x;
  if (i >= u.batch * chunks) return;
  const int64_t b = i / chunks, d0 = (i - b * chunks) * C;
  const int64_t slot = u.conv_state_indices ? int64_t(u.conv_state_indices[b]) : b;
  T* yp = static_cast<T*>(u.y) + b * u.dim + d0;
  if (slot < 0 || slot >= u.num_slots) {  // padding row: zeros, state untouched
    Vec z;
    z.Zero();
    z.Store(yp);
    return;
  }
  T* st = static_cast<T*>(u.conv_state) + slot * H * u.dim + d0;  // entry j at st + j * dim
  Vec xv, ev[H > 0 ? H : 1];
  xv.Load(static_cast<const T*>(u.x) + b * u.dim + d0);
#pragma unroll
  for (int j = 0; j < H; ++j)
#pragma unroll
    for (int q = 0; q < Vec::kWords; ++q)
      ev[j].w[q] = __ldcs(reinterpret_cast<const typename Vec::Word*>(st + j * u.dim) + q);
  const int64_t wrow = (b / (u.batch / u.groups)) * u.dim + d0;
  float w[C][kW], bias[C];
  LoadRowF<C * kW>(u.weight, u.w_dtype, wrow * kW, &w[0][0]);
  if (u.bias) LoadRowF<C>(u.bias, u.b_dtype, wrow, bias);
  else
#pragma unroll
    for (int c = 0; c < C; ++c) bias[c] = 0.f;
  // Ring of exactly H entries: the oldest (window slot 0) is where the new token goes.
  const int head = u.cache_seqlens ? int(((int64_t(u.cache_seqlens[b]) % H) + H) % H) : 0;
  const bool silu = u.act == Activation::kSilu;
  Vec yv;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    float acc = bias[c] + w[c][H] * ToF(xv[c]);
#pragma unroll
    for (int j = 0; j < H; ++j) {
      // window slot j is entry (head + j) mod H: select by compile-time indices
      float v = ToF(ev[j][c]);
      if (u.cache_seqlens) {
#pragma unroll
        for (int k = 1; k < H; ++k)
          if (head == k) v = ToF(ev[(j + k) % H][c]);
      }
      acc += w[c][j] * v;
    }
    yv[c] = FromF<T>(Activate(acc, silu));
  }
  yv.Store(yp);
  using Word = typename Vec::Word;
  if (u.cache_seqlens) {  // the new token replaces the oldest entry
#pragma unroll
    for (int k = 0; k < H; ++k)
      if (head == k)
#pragma unroll
        for (int q = 0; q < Vec::kWords; ++q) __stcs(reinterpret_cast<Word*>(st + k * u.dim) + q, xv.w[q]);
  } else {  // shift down by one entry, the token last
#pragma unroll
    for (int j = 0; j < H; ++j) {
      const Vec& nv = j + 1 < H ? ev[j + 1] : xv;
#pragma unroll
      for (int q = 0; q < Vec::kWords; ++q) __stcs(reinterpret_cast<Word*>(st + j * u.dim) + q, nv.w[q]);
    }
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

// The channels-last hot path, when the problem fits it (false: launch nothing).
template <typename T>
bool TryUpdateClVec(const UpdateArgs& u, cudaStream_t stream, cudaError_t* err) {
  constexpr int C = 16 / int(sizeof(T));
  if (!u.channels_last || !u.x_dense() || u.seqlen != 1 || u.width < 2 || u.width > 4 ||
      u.state_len != u.width - 1 || u.dim % C != 0 || !Aligned16(u.x) || !Aligned16(u.y) ||
      !Aligned16(u.conv_state) || !Aligned16(u.weight) || !Aligned16(u.bias) ||
      u.w_dtype == DType::kF64 || u.b_dtype == DType::kF64)
    return false;
  const unsigned blocks = unsigned(CeilDiv(u.batch * (u.dim / C), kUpdateThreads));
  switch (u.width) {
    case 2: UpdateClVecKernel<T, 2><<<blocks, kUpdateThreads, 0, stream>>>(u); break;
    case 3: UpdateClVecKernel<T, 3><<<blocks, kUpdateThreads, 0, stream>>>(u); break;
    default: UpdateClVecKernel<T, 4><<<blocks, kUpdateThreads, 0, stream>>>(u); break;
  }
  *err = cudaGetLastError();
  return true;
}

template <typename T>
cudaError_t UpdateT(const UpdateArgs& u, cudaStream_t stream) {
  const int64_t n = u.batch * u.dim;
  if (n == 0) return cudaSuccess;
  cudaError_t err = cudaSuccess;
  if (TryUpdateVec<T>(u, stream, &err) || TryUpdateClVec<T>(u, stream, &err)) return err;
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
