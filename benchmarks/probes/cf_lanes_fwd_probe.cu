// Probe (standalone, not part of the package): a channels-first forward
// with lanes across channels. A warp owns 32 consecutive channels of one
// batch row and a chunk of time; lane l walks channel l's time 16 steps at
// a time (two 16-byte loads of bf16: a whole 32-byte sector a lane), so a
// lane's halo is its own previous step (no shuffles) and a step's seq_idx
// mask is the same for the whole warp: one warp-uniform branch a step,
// masked only where an id change or padding falls in the step's window.
// The question it answers: is this layout faster than the streaming
// kernels (lanes along time) for the dense and the seq_idx forward?
//
// Build and run on the GPU machine:
//   nvcc -std=c++17 -O3 -arch=sm_90 -o /tmp/cf_lanes benchmarks/probes/cf_lanes_fwd_probe.cu
//   /tmp/cf_lanes 8 4096 4096
// Prints, per W and mode, the median of 20 timed launches (cudaEvent, µs),
// the bandwidth of x + y over that time, and the largest error against a
// float64 loop on the CPU (every channel of rows 0 and B - 1).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

using bf16 = __nv_bfloat16;
constexpr int kStep = 16;  // steps a lane handles at once (32 bytes of bf16)

__device__ __forceinline__ float Silu(float v) {
  float e, r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(v * -1.4426950408889634f));
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(1.f + e));
  return v * r;
}

__device__ __forceinline__ void Unpack8(uint4 v, float* f) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(u[i] << 16);
    f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}

__device__ __forceinline__ uint32_t Pack2(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// One warp: channels [d0, d0 + 32) of row b, steps [t0, t0 + chunk).
// kSeq: ids (B, L) int32, -1 padding, history (t < 0) as zeros.
template <int kW, bool kSeq>
__global__ void __launch_bounds__(128) LanesFwd(const bf16* __restrict__ x, const float* __restrict__ wt,
                                                const float* __restrict__ bias, const int* __restrict__ ids,
                                                bf16* __restrict__ y, int B, int D, int L, int chunk) {
  constexpr int kH = kW - 1;
  const int lane = threadIdx.x & 31;
  const int64_t warp = int64_t(blockIdx.x) * 4 + (threadIdx.x >> 5);
  const int nchunks = L / chunk, groups = D / 32;
  if (warp >= int64_t(B) * groups * nchunks) return;
  const int c = int(warp % nchunks);
  const int64_t bg = warp / nchunks;
  const int g = int(bg % groups), b = int(bg / groups);
  const int d = g * 32 + lane;
  const int t0 = c * chunk;
  const bf16* xr = x + (int64_t(b) * D + d) * L;
  bf16* yr = y + (int64_t(b) * D + d) * L;
  const int* idr = kSeq ? ids + int64_t(b) * L : nullptr;
  float w[kW];
#pragma unroll
  for (int k = 0; k < kW; ++k) w[k] = wt[d * kW + k];
  const float bs = bias[d];

  // halo: the kH inputs before the chunk
  float win[kH + kStep];
  if (t0 > 0) {
    float prev[kStep];
    Unpack8(__ldg(reinterpret_cast<const uint4*>(xr + t0 - kStep)), prev);
    Unpack8(__ldg(reinterpret_cast<const uint4*>(xr + t0 - kStep + 8)), prev + 8);
#pragma unroll
    for (int i = 0; i < kH; ++i) win[i] = prev[kStep - kH + i];
  } else {
#pragma unroll
    for (int i = 0; i < kH; ++i) win[i] = 0.f;
  }
  // change bits: bit i of `word` (positions p = base + i): id[p] != id[p - 1]
  // or id[p] < 0 (positions < 0 count as the row's first id)
  auto change_word = [&](int base) -> uint32_t {
    const int p = base + lane;
    const int cur = p < L ? __ldg(idr + max(p, 0)) : -1;
    const int before = __ldg(idr + max(p - 1, 0));
    return __ballot_sync(0xffffffffu, cur != before || cur < 0);
  };
  uint32_t w_lo = 0;  // positions [t, t + 32) - 32, t the pair's first step
  if constexpr (kSeq) w_lo = change_word(t0 - 32);

  uint4 raw[4], nxt[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) raw[i] = __ldg(reinterpret_cast<const uint4*>(xr + t0) + i);
  for (int t = t0; t < t0 + chunk; t += 2 * kStep) {
    const bool more = t + 2 * kStep < t0 + chunk;
    if (more) {
#pragma unroll
      for (int i = 0; i < 4; ++i) nxt[i] = __ldg(reinterpret_cast<const uint4*>(xr + t + 2 * kStep) + i);
    }
    uint64_t bits = 0;
    if constexpr (kSeq) {
      const uint32_t w_hi = change_word(t);
      bits = uint64_t(w_lo) | uint64_t(w_hi) << 32;  // bit i: position t - 32 + i
      w_lo = w_hi;
    }
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      const int ts = t + s * kStep;
      Unpack8(raw[2 * s], win + kH);
      Unpack8(raw[2 * s + 1], win + kH + 8);
      float out[kStep];
      // window positions ts - kH + 1 .. ts + 15 hold no change or padding
      constexpr int lo = 32 - kH + 1;
      const uint64_t need = ((~0ull) >> (64 - (kStep + kH - 1))) << (lo + s * kStep);
      const bool plain = !kSeq || (bits & need) == 0;
      if (plain) {
#pragma unroll
        for (int n = 0; n < kStep; ++n) {
          float acc = bs;
#pragma unroll
          for (int k = 0; k < kW; ++k) acc = fmaf(w[k], win[n + k], acc);
          out[n] = Silu(acc);
        }
      } else {
        int id[kH + kStep];  // ids of the window's positions (history: the first id; zeros there)
#pragma unroll
        for (int i = 0; i < kH + kStep; ++i) id[i] = __ldg(idr + max(ts - kH + i, 0));
#pragma unroll
        for (int n = 0; n < kStep; ++n) {
          float acc = bs;
#pragma unroll
          for (int k = 0; k < kW; ++k) {
            const bool on = id[n + k] == id[n + kH] && ts - kH + n + k >= 0;
            acc = on ? fmaf(w[k], win[n + k], acc) : acc;
          }
          out[n] = id[n + kH] < 0 ? 0.f : Silu(acc);
        }
      }
      uint4 o0, o1;
      o0.x = Pack2(out[0], out[1]), o0.y = Pack2(out[2], out[3]), o0.z = Pack2(out[4], out[5]),
      o0.w = Pack2(out[6], out[7]);
      o1.x = Pack2(out[8], out[9]), o1.y = Pack2(out[10], out[11]), o1.z = Pack2(out[12], out[13]),
      o1.w = Pack2(out[14], out[15]);
      reinterpret_cast<uint4*>(yr + ts)[0] = o0;
      reinterpret_cast<uint4*>(yr + ts)[1] = o1;
#pragma unroll
      for (int i = 0; i < kH; ++i) win[i] = win[kStep + i];
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) raw[i] = nxt[i];
  }
}

template <int kW>
void Run(int B, int D, int L, bool seq, int chunk) {
  const int64_t n = int64_t(B) * D * L;
  std::mt19937 rng(kW);
  std::normal_distribution<float> nd;
  std::vector<bf16> hx(n);
  for (auto& v : hx) v = __float2bfloat16(nd(rng));
  std::vector<float> hw(D * kW), hb(D);
  for (auto& v : hw) v = __bfloat162float(__float2bfloat16(nd(rng) * 0.5f));
  for (auto& v : hb) v = __bfloat162float(__float2bfloat16(nd(rng)));
  std::vector<int> hid(int64_t(B) * L);
  const int valid = L - int(std::lround(L * 0.05));
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < L; ++t) hid[int64_t(b) * L + t] = t < valid ? std::min(t * 8 / valid, 7) : -1;
  bf16 *dx, *dy;
  float *dw, *db;
  int* did;
  CK(cudaMalloc(&dx, n * 2));
  CK(cudaMalloc(&dy, n * 2));
  CK(cudaMalloc(&dw, D * kW * 4));
  CK(cudaMalloc(&db, D * 4));
  CK(cudaMalloc(&did, int64_t(B) * L * 4));
  CK(cudaMemcpy(dx, hx.data(), n * 2, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dw, hw.data(), D * kW * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(db, hb.data(), D * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(did, hid.data(), int64_t(B) * L * 4, cudaMemcpyHostToDevice));
  const int64_t warps = int64_t(B) * (D / 32) * (L / chunk);
  const unsigned blocks = unsigned((warps + 3) / 4);
  auto launch = [&] {
    if (seq)
      LanesFwd<kW, true><<<blocks, 128>>>(dx, dw, db, did, dy, B, D, L, chunk);
    else
      LanesFwd<kW, false><<<blocks, 128>>>(dx, dw, db, did, dy, B, D, L, chunk);
  };
  for (int i = 0; i < 3; ++i) launch();
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> ts;
  for (int i = 0; i < 20; ++i) {
    CK(cudaEventRecord(e0));
    launch();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ts.push_back(ms * 1000.f);
  }
  std::sort(ts.begin(), ts.end());
  std::vector<bf16> hy(n);
  CK(cudaMemcpy(hy.data(), dy, n * 2, cudaMemcpyDeviceToHost));
  double err = 0;
  for (int b : {0, B - 1})
    for (int dd = 0; dd < D; ++dd) {
      const int64_t row = (int64_t(b) * D + dd) * L;
      for (int t = 0; t < L; ++t) {
        const int it = hid[int64_t(b) * L + t];
        double ref = 0;
        if (!seq || it >= 0) {
          double acc = hb[dd];
          for (int k = 0; k < kW; ++k) {
            const int p = t - (kW - 1) + k;
            if (p < 0 || (seq && hid[int64_t(b) * L + p] != it)) continue;
            acc += double(hw[dd * kW + k]) * double(__bfloat162float(hx[row + p]));
          }
          ref = acc / (1.0 + std::exp(-acc));
        }
        const double got = __bfloat162float(hy[row + t]);
        err = std::max(err, std::abs(got - ref) / (1.0 + std::abs(ref)));
      }
    }
  std::printf("| %d | %s | %d | %.1f | %.1f | %.0f | %.2e |\n", kW, seq ? "seq_idx" : "dense", chunk, ts[10], ts[0],
              2.0 * n * 2 / (ts[10] * 1e-6) / 1e9, err);
  CK(cudaFree(dx));
  CK(cudaFree(dy));
  CK(cudaFree(dw));
  CK(cudaFree(db));
  CK(cudaFree(did));
}

int main(int argc, char** argv) {
  const int B = argc > 1 ? std::atoi(argv[1]) : 8, D = argc > 2 ? std::atoi(argv[2]) : 4096,
            L = argc > 3 ? std::atoi(argv[3]) : 4096;
  std::printf("B D L = %d %d %d; median / min of 20 launches (µs), x + y GB/s at the median, max rel err\n", B, D, L);
  std::printf("| W | mode | chunk | median µs | min µs | GB/s | err |\n|---:|---|---:|---:|---:|---:|---:|\n");
  for (int chunk : {256, 512, 1024})
    for (bool seq : {false, true}) {
      Run<2>(B, D, L, seq, chunk);
      Run<4>(B, D, L, seq, chunk);
      Run<8>(B, D, L, seq, chunk);
    }
  return 0;
}
