// Channels-last forward over whole aligned channel vectors (see cl_row.cuh):
// each thread owns kV channels and a slice of `steps` steps (the
// launcher's: ClFwdSteps or twice it), and stages
// x (and the residual) through shared memory with cp.async one group of
// steps ahead, so loads stay in flight while it computes; the last W - 1
// inputs stay in registers. final_states are written by states.cu.
#include <climits>

#include "cl_row.cuh"
#include "launchers.h"

namespace jcc::cuda {
namespace {

constexpr int kStage = 8;        // steps per staged group
static_assert(kStage == 8, "ClStepsValid (cl_row.cuh) takes slices of whole groups of 8 steps");

// Compiled at every W <= 16 (W == kW: no absent taps to test; the tests
// of the former buckets 12 and 16 were a fifth of the W 16 kernel's
// instructions).
template <typename T, int kW, ClMask kMask>
__global__ void __launch_bounds__(kClX * kClY, ClFwdMinBlocks(kW))
    FwdClRowKernel(const ConvArgs a, int64_t nchunk, int steps) {
  static_assert(kW >= 1 && kW <= 16, "launched at W == kW (WithExactWidth16)");
  constexpr bool kMasked = kMask != ClMask::kNone, kIds = kMask == ClMask::kSeqIdx;
  constexpr int H = kW - 1, kHs = H > 0 ? H : 1, kV = ClFwdVec(sizeof(T), kW), U = kStage;
  constexpr int kThreadsPerBlock = kClX * kClY;
  using Raw = ChRaw<T, kV>;
  // stage[buffer][tensor: x, residual][step][thread], dynamic: the residual
  // half only when there is a residual
  extern __shared__ uint4 smem_raw[];
  __shared__ ClIdsOf<kClY * ClFwdMaxSteps(kW), kMasked> ids;
  const bool has_res = a.residual != nullptr;
  auto slot = [&](int buf, int tensor, int u) -> Raw& {
    Raw* base = reinterpret_cast<Raw*>(smem_raw);
    const int tensors = has_res ? 2 : 1;
    return base[((buf * tensors + tensor) * U + u) * kThreadsPerBlock + threadIdx.y * kClX +
                threadIdx.x];
  };
  const int64_t D = a.dim, L = a.len;
  const ClBlock blk = LocateClBlock<kV>(a.dim, nchunk);
  const int64_t b = blk.b, chunk = blk.chunk, c0 = blk.c0;
  const int64_t ts = (chunk * kClY + threadIdx.y) * steps;
  const int64_t te = Min64(L, ts + steps);
  const bool mine = c0 < D && ts < te;
  const T* xb = static_cast<const T*>(a.x) + b * L * D + c0;
  const T* rb = has_res ? static_cast<const T*>(a.residual) + b * L * D + c0 : nullptr;
  T* yb = static_cast<T*>(a.y) + b * L * D + c0;
  auto stage_group = [&](int64_t t, int buf) {
    if (t + U <= te) {  // the whole group is inside the slice
      const T* px = xb + t * D;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        CpAsync<sizeof(Raw)>(&slot(buf, 0, u), px + u * D, true);
        if (has_res) CpAsync<sizeof(Raw)>(&slot(buf, 1, u), rb + (t + u) * D, true);
      }
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const bool ok = t + u < te;
        const int64_t off = ok ? (t + u) * D : 0;
        CpAsync<sizeof(Raw)>(&slot(buf, 0, u), xb + off, ok);
        if (has_res) CpAsync<sizeof(Raw)>(&slot(buf, 1, u), rb + off, ok);
      }
    }
    CpAsyncCommit();
  };
  // x in flight while the weights, the history and the ids load
  float w[kW][kV], bias[kV];
  float win[kHs][kV];  // input at steps t - H .. t - 1
  if (mine) {
    stage_group(ts, 0);
    LoadClTaps<kW, kV>(a, (b / a.batch_per_group()) * D + c0, w, bias);
    LoadClHistory<T, kV, H>(a, xb, b, c0, ts, win);
  }
  if constexpr (kMasked) {
    ids.Stage(a, b, chunk * kClY * steps, kClY * steps);
    __syncthreads();
    StageGroupKinds<H, U>(ids, kClY * steps);
    __syncthreads();
  }
  if (!mine) return;  // (after the block's barrier)
  const bool silu = a.act == Activation::kSilu;
  int run = SameIdRunBefore<H, kMasked && !kIds>(ids, ts);  // kAny
  ClIdWindow<H> idw;  // kIds: the ids of steps t - H .. t (started at each masked group)
  // One step tt (its x staged in xr). kind: kChecked steps (a slice's last,
  // partial group; every group at W <= 4; kAny's mixed groups) read the
  // activation at run time; kMasked ones mask taps by the id window; kDense
  // ones lie in a window of one sequence (no masks). kAct: the activation
  // known at compile time (0: read `silu`, 1: none, 2: SiLU).
  auto step = [&](int64_t tt, const Raw xr, int buf, int u, auto kind, auto act, auto res) {
    constexpr bool kM = kMasked && decltype(kind)::value != StepKind::kDense;
    constexpr bool kIdsM = kIds && kM;
    constexpr int kAct = decltype(act)::value;
    const bool act_silu = kAct == 0 ? silu : kAct == 2;
    float xt[kV], out[kV];
#pragma unroll
    for (int c = 0; c < kV; ++c) xt[c] = xr[c];
    bool live = true, clean = true;
    int32_t id = 0;
    if constexpr (kIdsM) {
      idw.Next(ids, tt);
      live = idw.id[H] >= 0;
    } else if constexpr (kM) {
      id = ids.Id(tt);
      if (tt != ts) run = id == ids.Id(tt - 1) ? min(run + 1, H) : 0;
      clean = run >= H && id >= 0;
      live = id >= 0;
    }
#pragma unroll
    for (int c = 0; c < kV; ++c) {
      float acc = bias[c] + w[H][c] * xt[c];
      if constexpr (kIdsM) {  // (a select: an input of another sequence is never multiplied)
#pragma unroll
        for (int k = 0; k < H; ++k)
          acc += w[k][c] * (idw.Same(k, H) ? win[k][c] : 0.f);
      } else if (clean) {
#pragma unroll
        for (int k = 0; k < H; ++k)
          acc += w[k][c] * win[k][c];
      } else if (live) {
#pragma unroll
        for (int k = 0; k < H; ++k) {
          const float v = kM && ids.Id(tt - H + k) != id
                              ? MaskedClHistory<T>(a, ids, b, tt, k, H, id, c0 + c) : win[k][c];
          acc += w[k][c] * v;
        }
      }
      out[c] = live ? Activate(acc, act_silu) : 0.f;
#pragma unroll
      for (int k = 0; k + 1 < H; ++k) win[k][c] = win[k + 1][c];
      if (H > 0) win[H - 1][c] = xt[c];
    }
    // res: whether there is a residual, known at compile time in whole
    // groups (a test per step would split the unrolled group)
    if (decltype(res)::value ? decltype(res)::value == 2 : has_res) {
      const Raw rr = slot(buf, 1, u);
#pragma unroll
      for (int c = 0; c < kV; ++c) out[c] += rr[c];
    }
    StoreVec<T, kV>(yb + tt * D, out);
  };
  using Checked = std::integral_constant<StepKind, StepKind::kChecked>;
  using Masked = std::integral_constant<StepKind, StepKind::kMasked>;
  using Dense = std::integral_constant<StepKind, StepKind::kDense>;
  // A whole group of U steps, unrolled (the window moves by renaming).
  // The activation and the residual chosen once a group (1: none, 2: SiLU
  // / a residual).
  auto full_group = [&](int64_t t, int buf, auto kind) {
    auto walk = [&](auto act, auto res) {
#pragma unroll
      for (int u = 0; u < U; ++u) step(t + u, slot(buf, 0, u), buf, u, kind, act, res);
    };
    using One = std::integral_constant<int, 1>;
    using Two = std::integral_constant<int, 2>;
    if (silu) {
      if (has_res) walk(Two(), Two()); else walk(Two(), One());
    } else {
      if (has_res) walk(One(), Two()); else walk(One(), One());
    }
  };
  // A group of padding (ids < 0, inside the slice): y = 0 (plus the
  // residual) at every step.
  auto padding_group = [&](int64_t t, int buf) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float out[kV] = {};
      if (has_res) {
        const Raw rr = slot(buf, 1, u);
#pragma unroll
        for (int c = 0; c < kV; ++c) out[c] = rr[c];
      }
      StoreVec<T, kV>(yb + (t + u) * D, out);
    }
    ShiftWindow<H, U, kV>(win, [&](int u, float(&v)[kV]) {
      const Raw r = slot(buf, 0, u);
#pragma unroll
      for (int c = 0; c < kV; ++c) v[c] = r[c];
    });
  };
  int buf = 0;
  for (int64_t t = ts; t < te; t += U, buf ^= 1) {
    StageNextGroup<U>(t, te, buf, stage_group);
    WalkGroup<kMask, H, U, true>(
        ids, t, ts, t + U <= te, idw, run, [&] { full_group(t, buf, Dense()); },
        [&] { padding_group(t, buf); }, [&] { full_group(t, buf, Masked()); },
        [&] {
          for (int u = 0; u < U && t + u < te; ++u)
            step(t + u, slot(buf, 0, u), buf, u, Checked(), std::integral_constant<int, 0>(),
                 std::integral_constant<int, 0>());
        });
  }
}

// The staging buffers' bytes (dynamic shared memory).
template <typename T, int kW>
constexpr size_t StageBytes(bool residual) {
  return size_t(2) * (residual ? 2 : 1) * kStage * kClX * kClY * ClFwdVec(sizeof(T), kW) * sizeof(T);
}

// Calls f with the call's kernel (a std::integral_constant of it): its mask.
template <typename T, int kW, typename F>
cudaError_t WithFwdKernel(const ConvArgs& a, F&& f) {
  return WithClMask<kW>(a, [&](auto mask) {
    return f(KernelTag<FwdClRowKernel<T, kW, decltype(mask)::value>>());
  });
}

// The slice (cl_row_plan.cu) from the blocks an SM holds of the kernel
// launched, then the launch.
template <typename T, int kW>
cudaError_t Launch(const ConvArgs& a, cudaStream_t stream) {
  constexpr int kV = ClFwdVec(sizeof(T), kW);
  const bool res = a.residual != nullptr;
  return WithFwdKernel<T, kW>(a, [&](auto kernel) {
    constexpr auto kKernel = decltype(kernel)::value;
    const int per_sm = res ? BlocksPerSm<kKernel, kClX * kClY, StageBytes<T, kW>(true)>()
                           : BlocksPerSm<kKernel, kClX * kClY, StageBytes<T, kW>(false)>();
    int steps = 0;
    const int64_t nchunk = ClRowChunks(a, false, per_sm, &steps);
    if (nchunk <= 0 || !ClStepsValid(false, kW, steps)) return cudaErrorInvalidValue;
    return LaunchWithSmem(kKernel, ClBlocks(a.batch, nchunk, a.dim, kV), dim3(kClX, kClY),
                          StageBytes<T, kW>(res), 0, stream, a, nchunk, steps);
  });
}

}  // namespace

cudaError_t ForwardClRow(const ConvArgs& a, const ForwardPlan&, cudaStream_t stream) {
  return WithFloatType(a.x_dtype, cudaErrorNotSupported, [&](auto t) {
    return WithExactWidth16(int(a.width), [&](auto w) { return Launch<decltype(t), decltype(w)::value>(a, stream); });
  });
}

}  // namespace jcc::cuda
