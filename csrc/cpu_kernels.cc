// CPU kernels for the causal depthwise conv1d.
//
// Work is split over (batch row, block of kBlock channels). Each block walks
// its sequence in time chunks through a small [time][channel] buffer, so the
// inner loops run over contiguous channels and vectorise, whichever layout x
// has. The buffer keeps the W-1 most recent inputs between chunks, which makes
// long sequences, initial states and final states one mechanism.
#include "cpu_kernels.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "segments.h"

namespace jcc::cpu {
namespace {

constexpr int kBlock = 16;      // channels per work item
constexpr int64_t kChunk = 256;  // time steps per buffer fill

template <typename Acc>
inline Acc Sigmoid(Acc v) { return Acc(1) / (Acc(1) + std::exp(-v)); }

template <typename Acc>
inline Acc Activate(Acc v, Activation act) {
  return act == Activation::kSilu ? v * Sigmoid(v) : v;
}

// d act(v) / dv times dy.
template <typename Acc>
inline Acc ActivationGrad(Acc v, Acc dy, Activation act) {
  if (act != Activation::kSilu) return dy;
  Acc s = Sigmoid(v);
  return dy * s * (Acc(1) + v * (Acc(1) - s));
}

// Calls fn(item) for item in [0, n) on all cores. Items are independent, so
// the result does not depend on the schedule.
template <typename Fn>
void ParallelFor(int64_t n, int64_t work_per_item, Fn fn) {
#if defined(_OPENMP)
  if (n > 1 && n * work_per_item > (int64_t(1) << 15)) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) fn(i);
}

// The channel block [d0, d0 + nc) of one weight group, as accumulator arrays.
template <typename Acc>
struct BlockWeights {
  std::vector<Acc> w;  // [width][kBlock]
  Acc bias[kBlock];
  void Load(const ConvArgs& a, int64_t g, int64_t d0, int nc) {
    w.assign(a.width * kBlock, Acc(0));
    for (int c = 0; c < kBlock; ++c) bias[c] = Acc(0);
    for (int c = 0; c < nc; ++c) {
      int64_t row = g * a.dim + d0 + c;
      for (int64_t k = 0; k < a.width; ++k)
        w[k * kBlock + c] = LoadAny<Acc>(a.weight, a.w_dtype, row * a.width + k);
      if (a.bias) bias[c] = LoadAny<Acc>(a.bias, a.b_dtype, row);
    }
  }
  // The taps reversed and no bias: dx[j] = sum_m w[W-1-m] * g[j + m].
  BlockWeights Transposed(int64_t width) const {
    BlockWeights r;
    r.w.assign(w.size(), Acc(0));
    for (int64_t k = 0; k < width; ++k)
      for (int c = 0; c < kBlock; ++c) r.w[k * kBlock + c] = w[(width - 1 - k) * kBlock + c];
    for (int c = 0; c < kBlock; ++c) r.bias[c] = Acc(0);
    return r;
  }
};

// A tile of kBlock channels x `rows` time steps in a scratch buffer. With
// kTimeInner (channels-first x) each channel's steps are contiguous, else
// each step's channels are: either way the innermost loops below run over
// contiguous memory, in the order Each() picks, and vectorise.
template <bool kTimeInner>
struct Tile {
  int64_t rows;
  int64_t At(int64_t j, int c) const { return kTimeInner ? c * rows + j : j * kBlock + c; }
  template <typename Fn>
  static void Each(int64_t n, int nc, Fn fn) {
    if (kTimeInner) {
      for (int c = 0; c < nc; ++c)
        for (int64_t j = 0; j < n; ++j) fn(j, c);
    } else {
      for (int64_t j = 0; j < n; ++j)
        for (int c = 0; c < nc; ++c) fn(j, c);
    }
  }
};

// Copies steps [t0, t0+n) of channels [d0, d0+nc) of row b between a strided
// tensor and a tile, starting at tile step j0.
template <bool TI, typename T, typename Acc>
void Gather(const T* src, Layout3 lay, int64_t b, int64_t d0, int nc, int64_t t0, int64_t n,
            Acc* buf, Tile<TI> tile, int64_t j0 = 0) {
  const T* base = src + lay.At(b, d0, t0);
  Tile<TI>::Each(n, nc, [&](int64_t j, int c) {
    buf[tile.At(j0 + j, c)] = Load<Acc>(base + c * lay.s_chan + j * lay.s_time);
  });
}

template <bool TI, typename T, typename Acc>
void Scatter(const Acc* buf, Tile<TI> tile, int64_t j0, Layout3 lay, int64_t b, int64_t d0,
             int nc, int64_t t0, int64_t n, T* dst) {
  T* base = dst + lay.At(b, d0, t0);
  Tile<TI>::Each(n, nc, [&](int64_t j, int c) {
    Store<Acc>(base + c * lay.s_chan + j * lay.s_time, buf[tile.At(j0 + j, c)]);
  });
}

// out[j, c] = bias[c] + sum_k w[k, c] * in[j + k, c] for j in [0, n).
// Small widths (the hot path) are unrolled so each output stays in a register.
template <int kW, bool TI, typename Acc>
void TapsFixed(const BlockWeights<Acc>& bw, const Acc* in, Tile<TI> ti, int64_t n, Acc* out,
               Tile<TI> to) {
  Tile<TI>::Each(n, kBlock, [&](int64_t j, int c) {
    Acc acc = bw.bias[c];
    for (int k = 0; k < kW; ++k) acc += bw.w[k * kBlock + c] * in[ti.At(j + k, c)];
    out[to.At(j, c)] = acc;
  });
}

template <bool TI, typename Acc>
void Taps(const BlockWeights<Acc>& bw, int64_t W, const Acc* in, Tile<TI> ti, int64_t n,
          Acc* out, Tile<TI> to) {
  switch (W) {
    case 1: return TapsFixed<1>(bw, in, ti, n, out, to);
    case 2: return TapsFixed<2>(bw, in, ti, n, out, to);
    case 3: return TapsFixed<3>(bw, in, ti, n, out, to);
    case 4: return TapsFixed<4>(bw, in, ti, n, out, to);
  }
  Tile<TI>::Each(n, kBlock, [&](int64_t j, int c) { out[to.At(j, c)] = bw.bias[c]; });
  for (int64_t k = 0; k < W; ++k) {
    const Acc* wk = bw.w.data() + k * kBlock;
    Tile<TI>::Each(n, kBlock, [&](int64_t j, int c) {
      out[to.At(j, c)] += wk[c] * in[ti.At(j + k, c)];
    });
  }
}

template <bool TI, typename T, typename Acc>
void ForwardBlock(const ConvArgs& a, int64_t b, int64_t d0, std::vector<Segment>& segs) {
  const int nc = int(std::min<int64_t>(kBlock, a.dim - d0));
  const int64_t W = a.width, H = W - 1;
  const Layout3 xl = a.x_layout(), sl = a.state_layout();
  const T* x = static_cast<const T*>(a.x);
  const T* res = static_cast<const T*>(a.residual);
  const T* init = static_cast<const T*>(a.initial_states);
  T* y = static_cast<T*>(a.y);
  T* fin = static_cast<T*>(a.final_states);

  BlockWeights<Acc> bw;
  bw.Load(a, b / a.batch_per_group(), d0, nc);
  const Tile<TI> tb{kChunk + H}, to{kChunk};
  std::vector<Acc> buf((kChunk + H) * kBlock, Acc(0));  // steps: [H history | chunk]
  std::vector<Acc> out(kChunk * kBlock), rbuf(res ? kChunk * kBlock : 0);
  auto clear_history = [&] {
    Tile<TI>::Each(H, kBlock, [&](int64_t j, int c) { buf[tb.At(j, c)] = Acc(0); });
  };

  RowSegments(a, b, segs);
  for (const Segment& s : segs) {
    clear_history();
    if (s.history_row >= 0) Gather(init, sl, s.history_row, d0, nc, 0, H, buf.data(), tb);
    for (int64_t c0 = s.start; c0 < s.end; c0 += kChunk) {
      const int64_t n = std::min(kChunk, s.end - c0);
      Gather(x, xl, b, d0, nc, c0, n, buf.data(), tb, H);
      Taps(bw, W, buf.data(), tb, n, out.data(), to);
      if (a.act == Activation::kSilu)
        Tile<TI>::Each(n, nc, [&](int64_t j, int c) {
          out[to.At(j, c)] = Activate(out[to.At(j, c)], a.act);
        });
      if (res) {
        Gather(res, xl, b, d0, nc, c0, n, rbuf.data(), to);
        Tile<TI>::Each(n, nc, [&](int64_t j, int c) { out[to.At(j, c)] += rbuf[to.At(j, c)]; });
      }
      Scatter(out.data(), to, 0, xl, b, d0, nc, c0, n, y);
      // Keep the H most recent inputs as the next chunk's history.
      Tile<TI>::Each(H, nc, [&](int64_t j, int c) { buf[tb.At(j, c)] = buf[tb.At(j + n, c)]; });
    }
    if (s.final_row >= 0 && fin) Scatter(buf.data(), tb, 0, sl, s.final_row, d0, nc, 0, H, fin);
  }
  if (a.mode == SegmentMode::kSeqIdx && fin) {
    // Row-level final states: the last H inputs of the row, zero-padded.
    clear_history();
    const int64_t take = std::min(H, a.len);
    Gather(x, xl, b, d0, nc, a.len - take, take, buf.data(), tb, H - take);
    Scatter(buf.data(), tb, 0, sl, b, d0, nc, 0, H, fin);
  }
}

// Backward of one (weight group, channel block): loops over the group's batch
// rows in a fixed order, so dweight/dbias are reduced deterministically.
template <bool TI, typename T, typename Acc>
void BackwardBlock(const ConvArgs& a, int64_t g, int64_t d0, std::vector<Segment>& segs) {
  const int nc = int(std::min<int64_t>(kBlock, a.dim - d0));
  const int64_t W = a.width, H = W - 1;
  const Layout3 xl = a.x_layout(), sl = a.state_layout();
  const T* x = static_cast<const T*>(a.x);
  const T* dy = static_cast<const T*>(a.dy);
  const T* init = static_cast<const T*>(a.initial_states);
  const T* dfin = static_cast<const T*>(a.dfinal_states);
  T* dx = static_cast<T*>(a.dx);
  T* dinit = static_cast<T*>(a.dinitial_states);

  BlockWeights<Acc> bw;
  bw.Load(a, g, d0, nc);
  const BlockWeights<Acc> bwt = bw.Transposed(W);
  const Tile<TI> tl{kChunk + H}, tc{kChunk}, th{std::max<int64_t>(H, 1)};
  std::vector<Acc> xb((kChunk + H) * kBlock), gb((kChunk + H) * kBlock);
  std::vector<Acc> pre(kChunk * kBlock), dyb(kChunk * kBlock), dxb(kChunk * kBlock);
  std::vector<Acc> fb(th.rows * kBlock), dh(th.rows * kBlock);
  std::vector<Acc> dw(W * kBlock, Acc(0));
  Acc db[kBlock] = {};
  auto zero = [&](std::vector<Acc>& v, Tile<TI> t, int64_t j0, int64_t n) {
    Tile<TI>::Each(n, kBlock, [&](int64_t j, int c) { v[t.At(j0 + j, c)] = Acc(0); });
  };

  const int64_t bpg = a.batch_per_group();
  for (int64_t b = g * bpg; b < (g + 1) * bpg; ++b) {
    RowSegments(a, b, segs);
    for (const Segment& s : segs) {
      // Which final-state row receives this segment's tail, and where that tail starts.
      int64_t frow = s.final_row, fin_start = s.end - H;
      if (a.mode == SegmentMode::kSeqIdx) frow = b, fin_start = a.len - H;
      if (!dfin) frow = -1;
      if (frow >= 0) Gather(dfin, sl, frow, d0, nc, 0, H, fb.data(), th);
      // gb steps [n, n+H) carry g = dL/dpre at the H steps after the current chunk.
      zero(gb, tl, 0, kChunk + H);
      for (int64_t c1 = s.end; c1 > s.start; c1 -= kChunk) {
        const int64_t c0 = std::max(s.start, c1 - kChunk), n = c1 - c0;
        // Move the carry (g at c1 .. c1+H) to sit right after this chunk (backwards: may overlap).
        for (int64_t j = H - 1; j >= 0; --j)
          for (int c = 0; c < kBlock; ++c) gb[tl.At(n + j, c)] = gb[tl.At(j, c)];
        // History: H inputs before c0, from x, initial states or zeros.
        zero(xb, tl, 0, H);
        const int64_t from_x = std::min(H, c0 - s.start);
        if (from_x > 0) Gather(x, xl, b, d0, nc, c0 - from_x, from_x, xb.data(), tl, H - from_x);
        if (from_x < H && s.history_row >= 0)
          Gather(init, sl, s.history_row, d0, nc, from_x, H - from_x, xb.data(), tl);
        Gather(x, xl, b, d0, nc, c0, n, xb.data(), tl, H);
        Gather(dy, xl, b, d0, nc, c0, n, dyb.data(), tc);
        // g = dy * act'(pre); dweight[k] += sum_j g[j] x[j+k]; dbias += sum_j g[j]
        if (a.act == Activation::kSilu) {
          Taps(bw, W, xb.data(), tl, n, pre.data(), tc);
          Tile<TI>::Each(n, nc, [&](int64_t j, int c) {
            gb[tl.At(j, c)] = ActivationGrad(pre[tc.At(j, c)], dyb[tc.At(j, c)], a.act);
          });
        } else {
          Tile<TI>::Each(n, nc, [&](int64_t j, int c) { gb[tl.At(j, c)] = dyb[tc.At(j, c)]; });
        }
        for (int c = 0; c < nc; ++c) {
          Acc sum = 0;
          for (int64_t j = 0; j < n; ++j) sum += gb[tl.At(j, c)];
          db[c] += sum;
        }
        for (int64_t k = 0; k < W; ++k)
          for (int c = 0; c < nc; ++c) {
            Acc sum = 0;
            for (int64_t j = 0; j < n; ++j) sum += gb[tl.At(j, c)] * xb[tl.At(j + k, c)];
            dw[k * kBlock + c] += sum;
          }
        // dx[t] = sum_k w[k] * g[t + H - k] (+ the final-state cotangent on the tail).
        Taps(bwt, W, gb.data(), tl, n, dxb.data(), tc);
        if (frow >= 0) {
          const int64_t f0 = std::max<int64_t>(0, fin_start - c0);  // first chunk step on the tail
          Tile<TI>::Each(std::max<int64_t>(0, n - f0), nc, [&](int64_t j, int c) {
            dxb[tc.At(f0 + j, c)] += fb[th.At(c0 + f0 + j - fin_start, c)];
          });
        }
        Scatter(dxb.data(), tc, 0, xl, b, d0, nc, c0, n, dx);
      }
      if (s.history_row >= 0 && dinit) {
        // gb steps [0, H) now hold g at the segment's first H steps (zeros past its end).
        zero(dh, th, 0, H);
        for (int64_t p = 0; p < H; ++p) {
          for (int64_t k = 0; k <= p; ++k)
            for (int c = 0; c < kBlock; ++c)
              dh[th.At(p, c)] += bw.w[k * kBlock + c] * gb[tl.At(p - k, c)];
          const int64_t f = p - (s.end - s.start);  // final-state index of history slot p
          if (frow >= 0 && f >= 0)
            for (int c = 0; c < kBlock; ++c) dh[th.At(p, c)] += fb[th.At(f, c)];
        }
        Scatter(dh.data(), th, 0, sl, s.history_row, d0, nc, 0, H, dinit);
      }
    }
  }
  for (int c = 0; c < nc; ++c) {
    const int64_t row = g * a.dim + d0 + c;
    for (int64_t k = 0; k < W; ++k) StoreAny<Acc>(a.dweight, a.w_dtype, row * W + k, dw[k * kBlock + c]);
    if (a.dbias) StoreAny<Acc>(a.dbias, a.b_dtype, row, db[c]);
  }
}

template <typename T, typename Acc>
void ForwardT(const ConvArgs& a) {
  const int64_t nblk = (a.dim + kBlock - 1) / kBlock;
  ParallelFor(a.batch * nblk, a.len * kBlock * a.width, [&](int64_t i) {
    std::vector<Segment> segs;
    if (a.channels_last) ForwardBlock<false, T, Acc>(a, i / nblk, (i % nblk) * kBlock, segs);
    else ForwardBlock<true, T, Acc>(a, i / nblk, (i % nblk) * kBlock, segs);
  });
}

template <typename T, typename Acc>
void BackwardT(const ConvArgs& a) {
  const int64_t nblk = (a.dim + kBlock - 1) / kBlock;
  ParallelFor(a.groups * nblk, a.batch_per_group() * a.len * kBlock * a.width, [&](int64_t i) {
    std::vector<Segment> segs;
    if (a.channels_last) BackwardBlock<false, T, Acc>(a, i / nblk, (i % nblk) * kBlock, segs);
    else BackwardBlock<true, T, Acc>(a, i / nblk, (i % nblk) * kBlock, segs);
  });
}

template <typename T, typename Acc>
void UpdateT(const UpdateArgs& a) {
  const int64_t W = a.width, H = W - 1, S = a.seqlen, SL = a.state_len;
  const T* x = static_cast<const T*>(a.x);
  T* state = static_cast<T*>(a.conv_state);
  T* y = static_cast<T*>(a.y);
  const int64_t bpg = a.batch / a.groups;
  ParallelFor(a.batch, a.dim * (S + W), [&](int64_t b) {
    std::vector<Acc> xp(H + S);
    const int64_t slot = a.conv_state_indices ? a.conv_state_indices[b] : b;
    for (int64_t d = 0; d < a.dim; ++d) {
      const T* xr = x + (b * a.dim + d) * S;
      T* yr = y + (b * a.dim + d) * S;
      if (slot < 0 || slot >= a.num_slots) {  // padding row: zeros, no state touched
        for (int64_t s = 0; s < S; ++s) Store<Acc>(yr + s, Acc(0));
        continue;
      }
      T* st = state + (slot * a.dim + d) * SL;
      // xp = [H most recent state entries, the S new inputs]
      int64_t head = 0;  // circular buffer: index where the oldest of the H entries sits
      if (a.cache_seqlens) head = ((a.cache_seqlens[b] - H) % SL + SL) % SL;
      for (int64_t j = 0; j < H; ++j)
        xp[j] = Load<Acc>(st + (a.cache_seqlens ? (head + j) % SL : SL - H + j));
      for (int64_t s = 0; s < S; ++s) xp[H + s] = Load<Acc>(xr + s);
      const int64_t row = (b / bpg) * a.dim + d;
      const Acc bias = a.bias ? LoadAny<Acc>(a.bias, a.b_dtype, row) : Acc(0);
      for (int64_t s = 0; s < S; ++s) {
        Acc acc = bias;
        for (int64_t k = 0; k < W; ++k) acc += LoadAny<Acc>(a.weight, a.w_dtype, row * W + k) * xp[s + k];
        Store<Acc>(yr + s, Activate(acc, a.act));
      }
      if (a.cache_seqlens) {
        const int64_t c = a.cache_seqlens[b];
        for (int64_t s = std::max<int64_t>(0, S - SL); s < S; ++s) st[((c + s) % SL + SL) % SL] = xr[s];
      } else if (S >= SL) {
        std::copy(xr + S - SL, xr + S, st);
      } else {
        std::copy(st + S, st + SL, st);
        std::copy(xr, xr + S, st + SL - S);
      }
    }
  });
}

template <typename T>
void VarlenStatesT(const VarlenStatesArgs& a) {
  const T* x = static_cast<const T*>(a.x);
  T* out = static_cast<T*>(a.states);
  const int64_t SL = a.state_len;
  ParallelFor(a.num_seqs, a.dim * SL, [&](int64_t n) {
    const int64_t lo = std::clamp<int64_t>(a.cu_seqlens[n], 0, a.total);
    const int64_t hi = std::clamp<int64_t>(a.cu_seqlens[n + 1], lo, a.total);
    for (int64_t d = 0; d < a.dim; ++d)
      for (int64_t j = 0; j < SL; ++j) {
        const int64_t t = hi - SL + j;
        out[(n * a.dim + d) * SL + j] = t >= lo ? x[t * a.dim + d] : T{};
      }
  });
}

template <template <typename, typename> class Fn, typename Args>
void DispatchX(const Args& a) {
  switch (a.x_dtype) {
    case DType::kF32: Fn<float, float>::Run(a); break;
    case DType::kF16: Fn<Half, float>::Run(a); break;
    case DType::kBF16: Fn<BFloat16, float>::Run(a); break;
    case DType::kF64: Fn<double, double>::Run(a); break;
  }
}

template <typename T, typename Acc> struct ForwardFn { static void Run(const ConvArgs& a) { ForwardT<T, Acc>(a); } };
template <typename T, typename Acc> struct BackwardFn { static void Run(const ConvArgs& a) { BackwardT<T, Acc>(a); } };
template <typename T, typename Acc> struct UpdateFn { static void Run(const UpdateArgs& a) { UpdateT<T, Acc>(a); } };
template <typename T, typename Acc> struct VarlenStatesFn { static void Run(const VarlenStatesArgs& a) { VarlenStatesT<T>(a); } };

}  // namespace

void Forward(const ConvArgs& a) { DispatchX<ForwardFn>(a); }
void Backward(const ConvArgs& a) { DispatchX<BackwardFn>(a); }
void Update(const UpdateArgs& a) { DispatchX<UpdateFn>(a); }
void VarlenStates(const VarlenStatesArgs& a) { DispatchX<VarlenStatesFn>(a); }

}  // namespace jcc::cpu
