// Tensor-core primitives of the mma family (forward_mma.cu; sm_80+):
// ldmatrix from shared memory and the m16n8k16 MMA of 16-bit inputs into
// float accumulators. The products of 16-bit inputs are exact in float, so
// a convolution summed this way is as accurate as float FMAs.
#pragma once

#include "common.cuh"
#include "wide.cuh"  // kWideChunk

namespace jcc::cuda {

// A bool known at compile time, where a run-time bool may stand too
// (std::bool_constant's conversion is a host function to nvcc without
// --expt-relaxed-constexpr).
template <bool B>
struct Fixed {
  __device__ constexpr operator bool() const { return B; }
};

// Four 8x8 matrices of 16-bit elements: lane 8i + r gives the address of
// row r of matrix i (16 bytes, 16-byte aligned); r[i] receives this lane's
// pair of matrix i (row lane / 4, columns 2 (lane % 4) and + 1).
__device__ __forceinline__ void LdMatrixX4(const void* p, unsigned (&r)[4]) {
  const unsigned s = unsigned(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s)
               : "memory");
}

// LdMatrixX4 transposed: r[i] receives this lane's pair of matrix i's
// transpose (rows 2 (lane % 4) and + 1 of column lane / 4): a row-major
// matrix as the column fragments of B, or A^T from A's rows.
__device__ __forceinline__ void LdMatrixX4Trans(const void* p, unsigned (&r)[4]) {
  const unsigned s = unsigned(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s)
               : "memory");
}

// c += A (16 x 16, row-major fragments a) * B (16 x 8, column fragments b0, b1).
template <typename T>
__device__ __forceinline__ void Mma16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    static_assert(std::is_same_v<T, __half>, "16-bit inputs only");
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// The floats of a pair of T.
template <typename T>
__device__ __forceinline__ void UnpackPair(unsigned u, float& first, float& second) {
  float f[2];
  ElementsToF<T, 2>(reinterpret_cast<const T*>(&u), f);
  first = f[0], second = f[1];
}

// --- the convolution as tiles of MMAs (forward_mma.cu has the formulas) ---

constexpr int kMmaTile = 128;  // outputs per tile: 16 segments of 8 steps

__host__ __device__ __forceinline__ int MmaHalo(int W) { return RoundUp(W - 1, 8); }        // P
__host__ __device__ __forceinline__ int MmaKSteps(int W) { return (MmaHalo(W) + 8 + 15) / 16; }
// Staged steps of a chunk: c0 - P .. c0 + kWideChunk + 16 (ldmatrix reads
// up to 16 past the chunk, where B is zero; zero past the row's end).
__host__ __device__ __forceinline__ int MmaBufElems(int W) { return kWideChunk + MmaHalo(W) + 16; }
// Staging buffers of the raw inputs: two chunks in flight while one is summed.
constexpr int kMmaStages = 3;

// This lane's ldmatrix row of a tile (its offset in the staged steps): row
// (lane % 8) + 8 (matrix & 1) of A, columns from 8 (matrix >> 1).
__device__ __forceinline__ int MmaLaneRow(int lane) { return 8 * ((lane & 7) + 8 * ((lane >> 3) & 1)) + 8 * (lane >> 4); }
// The tile's outputs this lane receives: C rows lane / 4 (+ 8), columns
// 2 (lane % 4) (+1), i.e. steps t0 + first (+ 64) (+1).
__device__ __forceinline__ int MmaLaneFirst(int lane) { return 8 * (lane >> 2) + 2 * (lane & 3); }

// This lane's B fragment of one k-step, in two parts hi + lo of T (lo: what
// T loses of each entry, for weights not of x's dtype): the pairs of rows
// m0 + 2 (lane % 4) (+1) and + 8 (+9) of its column; tap(m) is row m's
// entry of that column.
template <typename T, typename F>
__device__ __forceinline__ void MmaTapFragment(int m0, F&& tap, unsigned (&hi)[2], unsigned (&lo)[2]) {
  const int lane = threadIdx.x & 31;
  auto rest = [](float w) { return w - ToF(FromF<T>(w)); };
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int m = m0 + 2 * (lane & 3) + 8 * h;
    const float w0 = tap(m), w1 = tap(m + 1);
    hi[h] = PackPair<T>(w0, w1);
    lo[h] = PackPair<T>(rest(w0), rest(w1));
  }
}

// This lane's B fragments of taps group (b, d) for k-steps kk < nk: the
// pairs of rows 16 kk + 2 (lane % 4) (+1) and + 8 (+9) of column lane / 4.
// Returns whether the lo parts are needed (weights not of x's dtype). (A tap
// not finite in 16 bits makes the tile sums non-finite: MmaAnyNonFinite.)
template <typename T, int kNK>
__device__ __forceinline__ bool MmaTaps(const ConvArgs& a, int64_t b, int64_t d, int nk, unsigned (&hi)[kNK][2],
                                        unsigned (&lo)[kNK][2]) {
  const int W = int(a.width), lane = threadIdx.x & 31, col = lane >> 2, shift = MmaHalo(W) - (W - 1);
  const int64_t wrow = WeightRow(a, b, d);
  auto tap = [&](int m) {
    const int k = m - col - shift;
    return k >= 0 && k < W ? LoadAnyF(a.weight, a.w_dtype, wrow * W + k) : 0.f;
  };
#pragma unroll
  for (int kk = 0; kk < kNK; ++kk)
    MmaTapFragment<T>(16 * kk, [&](int m) { return kk < nk ? tap(m) : 0.f; }, hi[kk], lo[kk]);
  return a.w_dtype != a.x_dtype;
}

// Whether this lane's four sums of a tile are finite. The MMA multiplies
// every staged input of a tile by a B entry, zero outside an output's window,
// and 0 * Inf is NaN: a non-finite input (or a tap not finite in 16 bits)
// makes sums of its tile non-finite, outside its windows too, while a finite
// sum is right. A lane with a non-finite sum sums its outputs again exactly
// (MmaTileExact), which keeps such an input inside its windows. (One sum of
// the four: a non-finite one makes it non-finite; an overflow of finite ones
// only costs the exact sums.)
__device__ __forceinline__ bool MmaSumsFinite(const float (&acc)[4]) {
  return fabsf((acc[0] + acc[1]) + (acc[2] + acc[3])) < INFINITY;
}

// seq_idx: the tiles u < kWideChunk / kMmaTile of a chunk whose window holds
// one live id, a bit a tile, in every lane: ids = the chunk's staged ids
// (steps from c0 - P: tile u's window is its steps 128 u .. 128 u + P + 127,
// checked whole, as MmaTileMasked's). Once a chunk, by words of 4 steps: for
// each 32 words (a tile's length) the ballot of the words whose ids change
// inside, or against the step before (the first of the 32 apart, whose change
// before belongs only to the windows of earlier tiles).
__device__ __forceinline__ unsigned MmaOneIdTiles(const int32_t* ids, int P) {
  constexpr int kTiles = kWideChunk / kMmaTile, kK = kTiles + 2;  // (a window: P <= 256 past its tile)
  const int lane = threadIdx.x & 31, words = (kWideChunk + P) / 4, r = P / 4;
  unsigned cut[kK];
  bool head[kK];  // word 32 k changes against the step before
#pragma unroll
  for (int k = 0; k < kK; ++k) {
    const int v = 32 * k + lane;
    bool in = false, before = false;
    if (v < words) {
      const int4 q = reinterpret_cast<const int4*>(ids)[v];
      in = q.x != q.y || q.y != q.z || q.z != q.w;
      before = v > 0 && ids[4 * v - 1] != q.x;
    }
    cut[k] = __ballot_sync(kFullMask, in || (lane > 0 && before));
    head[k] = __shfl_sync(kFullMask, before, 0);
  }
  unsigned one = 0;
#pragma unroll
  for (int u = 0; u < kTiles; ++u) {
    unsigned bad = cut[u];
#pragma unroll
    for (int j = 1; j <= 2; ++j) {  // the window's words in the next tiles
      const int n = min(max(r - 32 * (j - 1), 0), 32);
      bad |= (cut[u + j] | unsigned(head[u + j])) & (n == 32 ? ~0u : (1u << n) - 1);
    }
    if (!bad && ids[kMmaTile * u + P + kMmaTile - 1] >= 0) one |= 1u << u;
  }
  return one;
}

// This lane's four outputs of a tile (as MmaTile gives them: staged steps
// P + MmaLaneFirst (+1) (+64)) summed one float FMA per tap inside each
// output's window, as the FMA kernels do: a non-finite input or weight
// reaches only the outputs whose window holds it. tile: the tile's staged
// steps; kMasked: irow their ids, a tap counts when its id is the output's,
// live[i] = the output is not padding.
template <typename T, bool kMasked>
__device__ __forceinline__ void MmaTileExact(const ConvArgs& a, int64_t wrow, const T* tile, const int32_t* irow,
                                          bool (&live)[4], float (&acc)[4]) {
  const int W = int(a.width), e0 = MmaHalo(W) + MmaLaneFirst(threadIdx.x & 31);
  for (int i = 0; i < 4; ++i) {
    const int e = e0 + (i & 1) + 64 * (i >> 1);
    const int32_t id = kMasked ? irow[e] : 0;
    float s = 0.f;
    for (int k = 0; k < W; ++k) {
      const int src = e - (W - 1) + k;
      if (!kMasked || irow[src] == id) s += LoadAnyF(a.weight, a.w_dtype, wrow * W + k) * ToF(tile[src]);
    }
    acc[i] = s;
    live[i] = !kMasked || id >= 0;
  }
}



// A tile's sums: acc[2h + e] = the output at step t0 + first + 64 h + e,
// from arow = the staged steps of the tile + MmaLaneRow.
template <typename T, int kNK>
__device__ __forceinline__ void MmaTile(const T* arow, int nk, const unsigned (&hi)[kNK][2],
                                        const unsigned (&lo)[kNK][2], bool split, float (&acc)[4]) {
  acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
#pragma unroll
  for (int kk = 0; kk < kNK; ++kk) {
    if (kk >= nk) break;
    unsigned frag[4];
    LdMatrixX4(arow + 16 * kk, frag);
    Mma16816<T>(acc, frag, hi[kk][0], hi[kk][1]);
    if (split) Mma16816<T>(acc, frag, lo[kk][0], lo[kk][1]);
  }
}

// seq_idx: the tile's sums over only the inputs whose id is s (the other
// elements of A zeroed): ids[e] is the id of staged step e, as arow's.
template <typename T, int kNK>
__device__ __forceinline__ void MmaTileOf(const T* arow, const int32_t* irow, int32_t s, int nk,
                                          const unsigned (&hi)[kNK][2], const unsigned (&lo)[kNK][2], bool split,
                                          float (&acc)[4]) {
  acc[0] = acc[1] = acc[2] = acc[3] = 0.f;
  const int lane = threadIdx.x & 31;
  // this lane's elements of fragment r: rows lane / 4 (+ 8 for r odd),
  // columns 2 (lane % 4) (+ 8 for r >= 2) and + 1
  const int e0 = 8 * (lane >> 2) + 2 * (lane & 3);
#pragma unroll
  for (int kk = 0; kk < kNK; ++kk) {
    if (kk >= nk) break;
    unsigned frag[4];
    LdMatrixX4(arow + 16 * kk, frag);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int2 id = *reinterpret_cast<const int2*>(irow + e0 + 64 * (r & 1) + 8 * (r >> 1) + 16 * kk);
      frag[r] &= (id.x == s ? 0x0000ffffu : 0u) | (id.y == s ? 0xffff0000u : 0u);
    }
    Mma16816<T>(acc, frag, hi[kk][0], hi[kk][1]);
    if (split) Mma16816<T>(acc, frag, lo[kk][0], lo[kk][1]);
  }
}

// seq_idx: a tile's sums, each output over the inputs of its own id, for a
// window that holds more than one id or padding (MmaOneIdTiles; else
// MmaTile): once per distinct id among the outputs (the lowest pending
// lane's first one) with A masked to that id's inputs. live[i] (true on
// entry) = the output is not padding (its sum is then 0). arow as MmaTile's,
// irow the ids of the tile's staged steps.
template <typename T, int kNK>
__device__ __forceinline__ void MmaTileMasked(const T* arow, const int32_t* irow, int P, int nk,
                                              const unsigned (&hi)[kNK][2], const unsigned (&lo)[kNK][2],
                                              bool split, float (&acc)[4], bool (&live)[4]) {
  const int e = P + MmaLaneFirst(threadIdx.x & 31);  // this lane's outputs: irow[e (+1) (+64)]
  const int32_t oid[4] = {irow[e], irow[e + 1], irow[e + 64], irow[e + 65]};
  bool done[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) live[i] = oid[i] >= 0, done[i] = !live[i], acc[i] = 0.f;
  for (;;) {
    const unsigned pending = __ballot_sync(0xffffffffu, !(done[0] && done[1] && done[2] && done[3]));
    if (!pending) break;
    const int32_t mine = !done[0] ? oid[0] : !done[1] ? oid[1] : !done[2] ? oid[2] : oid[3];
    const int32_t s = __shfl_sync(0xffffffffu, mine, __ffs(pending) - 1);
    float part[4];
    MmaTileOf<T, kNK>(arow, irow, s, nk, hi, lo, split, part);
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (!done[i] && oid[i] == s) acc[i] = part[i], done[i] = true;
  }
}

// f(std::integral_constant<int, kNK>()) for the k-step bucket of width W
// (kNK >= MmaKSteps(W): W <= 40, 72, 136, 256).
template <typename F>
__host__ __forceinline__ auto WithKSteps(int W, F&& f) {
  const int nk = MmaKSteps(W);
  if (nk <= 3) return f(std::integral_constant<int, 3>());
  if (nk <= 5) return f(std::integral_constant<int, 5>());
  if (nk <= 9) return f(std::integral_constant<int, 9>());
  return f(std::integral_constant<int, 17>());
}

}  // namespace jcc::cuda
