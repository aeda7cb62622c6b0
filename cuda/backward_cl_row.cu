// Channels-last backward over whole aligned channel vectors (see
// cl_row.cuh): each thread owns kV channels and a slice of `steps` steps
// (the launcher's, written back into the plan), stages x and dy through
// shared memory with cp.async a group of steps ahead (double buffered), and
// walks forwards:
//   g[t] = dy[t] act'(pre[t]) (zero on padding),  dweight[k] += g[t] tap_k(t),
//   dx[p] = sum_k w[k] g[p + H - k]  (outputs of p's sequence),
// emitting dx H steps behind the g it computes. Whole groups of steps are
// unrolled (StepKind, cl_row.cuh); a group inside one sequence takes the
// plain taps for both its g and the dx H steps before, a group of padding
// writes dx = 0 (ClassifyGroup); elsewhere a step whose window is one
// sequence (a running count of equal ids, kAny) does. The block's partial
// sums go to the workspace (states.cu's ReduceKernel); StatesGradKernel adds
// the state terms.
#include "cl_row.cuh"
#include "launchers.h"

namespace jcc::cuda {
namespace {

// Steps per staged group: 8 x 2 tensors x kV * sizeof(T) bytes per thread,
// two groups in flight (double buffer).
template <typename T>
struct ClRowStage {
  static constexpr int kU = sizeof(T) >= 4 ? 4 : 8;
};

template <typename T, int kW, ClMask kMask>
__global__ void __launch_bounds__(kClX * kClY, ClBwdMinBlocks(kW, kMask == ClMask::kSeqIdx))
    BwdClRowKernel(const ConvArgs a, int64_t nchunk, int steps, float* ws) {
  constexpr bool kMasked = kMask != ClMask::kNone, kIds = kMask == ClMask::kSeqIdx;
  constexpr int H = kW - 1, kHs = H > 0 ? H : 1, kV = ClBwdVec(sizeof(T), kW), U = ClRowStage<T>::kU;
  constexpr int kThreadsPerBlock = kClX * kClY;
  using Raw = ChRaw<T, kV>;
  // stage[buffer][tensor: x, dy][step][thread]
  __shared__ Raw stage[2][2][U][kThreadsPerBlock];
  __shared__ float red[kClY][kClX][kV * (kW + 1)];
  __shared__ ClIdsOf<kClY * ClBwdMaxSteps(kW), kMasked> ids;
  const int tid = threadIdx.y * kClX + threadIdx.x;
  const int64_t D = a.dim, L = a.len;
  const ClBlock blk = LocateClBlock<kV>(D, nchunk);
  const int64_t b = blk.b, chunk = blk.chunk, c0 = blk.c0;
  const int64_t ts = (chunk * kClY + threadIdx.y) * steps;
  const int64_t te = Min64(L, ts + steps);
  const bool active = c0 < D && ts < te;
  const bool silu = a.act == Activation::kSilu;
  const int64_t grp = b / a.batch_per_group();

  float dw[kW + 1][kV] = {};
  const T* xb = static_cast<const T*>(a.x) + b * L * D + c0;
  const T* dyb = static_cast<const T*>(a.dy) + b * L * D + c0;
  const int64_t tend = te + H;  // g is needed up to te + H - 1
  const int64_t tload = Min64(tend, L);
  auto stage_group = [&](int64_t t, int buf) {
    if (t + U <= tload) {  // the whole group is inside the row
      const T *px = xb + t * D, *pd = dyb + t * D;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        CpAsync<sizeof(Raw)>(&stage[buf][0][u][tid], px + u * D, true);
        CpAsync<sizeof(Raw)>(&stage[buf][1][u][tid], pd + u * D, true);
      }
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const bool ok = t + u < tload;
        const int64_t off = ok ? (t + u) * D : 0;
        CpAsync<sizeof(Raw)>(&stage[buf][0][u][tid], xb + off, ok);
        CpAsync<sizeof(Raw)>(&stage[buf][1][u][tid], dyb + off, ok);
      }
    }
    CpAsyncCommit();
  };
  // x and dy in flight while the weights, the history and the ids load
  float w[kW][kV], bias[kV];
  float xw[kHs][kV], gw[kHs][kV] = {};  // input and g at steps t - H .. t - 1
  if (active) {
    stage_group(ts, 0);
    LoadClTaps<kW, kV>(a, grp * D + c0, w, bias);
    LoadClHistory<T, kV, H>(a, xb, b, c0, ts, xw);
  }
  if constexpr (kMasked) {
    ids.Stage(a, b, chunk * kClY * steps, kClY * steps);
    __syncthreads();
    StageGroupKinds<H, U>(ids, kClY * steps);
    __syncthreads();
  }
  if (active) {
    T* dxb = static_cast<T*>(a.dx) + b * L * D + c0;
    int run = SameIdRunBefore<H, kMasked && !kIds>(ids, ts);  // kAny
    ClIdWindow<H> idw;  // kIds: the ids of steps t - H .. t (started at each masked group)
    // One step tt of the walk (x and dy of tt staged in xr, dr): g at tt,
    // its dweight terms, dx at tt - H. kind: kChecked steps may lie past te
    // or tload, or have tt - H before ts, and read the activation at run
    // time; the others are inside the slice (no tests), kDense ones in a
    // window of one sequence (no masks). kAct: the activation known at
    // compile time (0: read `silu`, 1: none, 2: SiLU).
    auto step = [&](int64_t tt, const Raw xr, const Raw dr, auto kind, auto act) {
      constexpr bool kChecked = decltype(kind)::value == StepKind::kChecked;
      constexpr bool kM = kMasked && decltype(kind)::value != StepKind::kDense;
      constexpr bool kIdsM = kIds && kM;
      constexpr int kAct = decltype(act)::value;
      const bool in = !kChecked || tt < tload;
      bool live = in, clean = true;
      int32_t id = 0;
      if constexpr (kIdsM) {
        idw.Next(ids, tt);
        live = in && idw.id[H] >= 0;
      } else if constexpr (kM) {
        id = ids.Id(tt);
        if (tt != ts) run = id == ids.Id(tt - 1) ? min(run + 1, H) : 0;
        clean = run >= H && id >= 0;
        live = in && id >= 0;
      }
      const int live_bits = live ? -1 : 0;
      const bool sums = !kChecked || tt < te;
      float g[kV], xt[kV];
#pragma unroll
      for (int c = 0; c < kV; ++c) {
        xt[c] = xr[c];  // zero-filled past tload
        float tv[kHs];  // the taps this output reads (masked)
#pragma unroll
        for (int k = 0; k < H; ++k) {
          if constexpr (kIdsM) {
            tv[k] = idw.Same(k, H) ? xw[k][c] : 0.f;
          } else {
            tv[k] = clean || !kM || ids.Id(tt - H + k) == id
                        ? xw[k][c] : MaskedClHistory<T>(a, ids, b, tt, k, H, id, c0 + c);
          }
        }
        float pre = bias[c] + w[H][c] * xt[c];
#pragma unroll
        for (int k = 0; k < H; ++k) pre += w[k][c] * tv[k];
        const bool act_silu = kAct == 0 ? silu : kAct == 2;
        // g = 0 where not live, by a bit mask: a select here becomes a
        // branch around the activation in every step
        g[c] = __int_as_float(__float_as_int(ActGrad(pre, dr[c], act_silu)) & live_bits);
        if (sums) {  // (a padding step's inputs masked by bits: 0 * Inf would be NaN)
#pragma unroll
          for (int k = 0; k < H; ++k)
            dw[k][c] += g[c] * __int_as_float(__float_as_int(tv[k]) & live_bits);
          dw[H][c] += g[c] * __int_as_float(__float_as_int(xt[c]) & live_bits);
          dw[kW][c] += g[c];
        }
      }
      // dx at p = tt - H: tap k reads g at p + H - k = tt - k, counted when
      // that output shares p's id.
      const int64_t p = tt - H;
      if (!kChecked || p >= ts) {
        const int32_t idp = kM && !kIdsM ? ids.Id(p) : 0;
        float out[kV];
#pragma unroll
        for (int c = 0; c < kV; ++c) {
          float acc = 0.f;
#pragma unroll
          for (int k = 0; k < kW; ++k) {
            const float gv = k == 0 ? g[c] : gw[H - k][c];
            if constexpr (kIdsM) {
              acc += w[k][c] * (idw.Same(H - k, 0) ? gv : 0.f);
            } else if (clean || !kM || ids.Id(tt - k) == idp) {
              acc += w[k][c] * gv;
            }
          }
          out[c] = acc;
        }
        StoreVec<T, kV>(dxb + p * D, out);
      }
#pragma unroll
      for (int k = 0; k + 1 < H; ++k)
#pragma unroll
        for (int c = 0; c < kV; ++c) xw[k][c] = xw[k + 1][c], gw[k][c] = gw[k + 1][c];
      if (H > 0) {
#pragma unroll
        for (int c = 0; c < kV; ++c) xw[H - 1][c] = xt[c], gw[H - 1][c] = g[c];
      }
    };
    using Checked = std::integral_constant<StepKind, StepKind::kChecked>;
    using Masked = std::integral_constant<StepKind, StepKind::kMasked>;
    using Dense = std::integral_constant<StepKind, StepKind::kDense>;
    using RunTimeAct = std::integral_constant<int, 0>;
    // A whole group of U steps, unrolled (the window moves by renaming).
    auto full_group = [&](int64_t t, int buf, auto kind) {
      if (silu) {
#pragma unroll
        for (int u = 0; u < U; ++u)
          step(t + u, stage[buf][0][u][tid], stage[buf][1][u][tid], kind, std::integral_constant<int, 2>());
      } else {
#pragma unroll
        for (int u = 0; u < U; ++u)
          step(t + u, stage[buf][0][u][tid], stage[buf][1][u][tid], kind, std::integral_constant<int, 1>());
      }
    };
    // A group of padding (ids < 0, inside the slice): g = 0, and dx = 0 at
    // steps t - H .. t + U - H - 1 (every output they feed is padding).
    auto padding_group = [&](int64_t t, int buf) {
      const float zero[kV] = {};
#pragma unroll
      for (int u = 0; u < U; ++u) StoreVec<T, kV>(dxb + (t + u - H) * D, zero);
      ShiftWindow<H, U, kV>(xw, [&](int u, float(&v)[kV]) {
        const Raw r = stage[buf][0][u][tid];
#pragma unroll
        for (int c = 0; c < kV; ++c) v[c] = r[c];
      });
      ShiftWindow<H, U, kV>(gw, [](int, float(&v)[kV]) {
#pragma unroll
        for (int c = 0; c < kV; ++c) v[c] = 0.f;
      });
    };
    int buf = 0;
    for (int64_t t = ts; t < tend; t += U, buf ^= 1) {
      StageNextGroup<U>(t, tend, buf, stage_group);
      // (masked groups unrolled only up to W = 4: past it their registers
      // would cost the whole kernel a block an SM, or spills)
      WalkGroup<kMask, H, U, (kW <= 4)>(
          ids, t, ts, t >= ts + H && t + U <= te, idw, run, [&] { full_group(t, buf, Dense()); },
          [&] { padding_group(t, buf); }, [&] { full_group(t, buf, Masked()); },
          [&] {
            for (int u = 0; u < U; ++u) {
              if (t + u >= tend) break;
              step(t + u, stage[buf][0][u][tid], stage[buf][1][u][tid], Checked(), RunTimeAct());
            }
          });
    }
  }
  // The block's partial sums over its kClY slices, in slice order:
  // ws[grp][part][d][W + 1] (slot W the bias).
#pragma unroll
  for (int k = 0; k <= kW; ++k)
#pragma unroll
    for (int c = 0; c < kV; ++c) red[threadIdx.y][threadIdx.x][k * kV + c] = dw[k][c];
  __syncthreads();
  if (threadIdx.y == 0 && c0 < D) {
    const int64_t bpg = a.batch_per_group();
    const int64_t nparts = bpg * nchunk, part = (b % bpg) * nchunk + chunk;
    for (int c = 0; c < kV && c0 + c < D; ++c) {
      float* wsrow = ws + ((grp * nparts + part) * D + c0 + c) * (kW + 1);
      for (int k = 0; k <= kW; ++k) {
        float s = 0.f;
        for (int y = 0; y < kClY; ++y) s += red[y][threadIdx.x][k * kV + c];
        wsrow[k] = s;
      }
    }
  }
}

// The slice (cl_row_plan.cu) from the blocks an SM holds of the kernel
// launched, into the plan (its chunks and parts: the weight sums' reduction
// reads them), then the launch. The plan's base slice had the most chunks,
// so the parts fit the workspace checked against it.
template <typename T, int kW>
cudaError_t Launch(const ConvArgs& a, BackwardPlan& p, float* ws, cudaStream_t stream) {
  return WithClMask<kW>(a, [&](auto mask) {
    constexpr auto kKernel = BwdClRowKernel<T, kW, decltype(mask)::value>;
    const int64_t nchunk = ClRowChunks(a, true, BlocksPerSm<kKernel, kClX * kClY>(), &p.steps);
    if (nchunk <= 0 || nchunk > p.nchunk || !ClStepsValid(true, kW, p.steps)) return cudaErrorInvalidValue;
    p.nparts = a.batch_per_group() * nchunk;  // (as PlanBackward counts them)
    p.nchunk = nchunk;
    kKernel<<<unsigned(ClBlocks(a.batch, nchunk, a.dim, ClBwdVec(sizeof(T), kW))), dim3(kClX, kClY), 0, stream>>>(
        a, nchunk, p.steps, ws);
    return cudaGetLastError();
  });
}

}  // namespace

cudaError_t BackwardClRow(const ConvArgs& a, BackwardPlan& p, float* ws, cudaStream_t stream) {
  return WithFloatType(a.x_dtype, cudaErrorNotSupported, [&](auto t) {
    return WithExactWidth16(int(a.width), [&](auto w) { return Launch<decltype(t), decltype(w)::value>(a, p, ws, stream); });
  });
}

}  // namespace jcc::cuda
