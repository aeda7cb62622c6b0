// A seq_idx problem's mask words, made once a row by a pre-pass for the
// channels-first streaming kernels that read them instead of making them
// (the forward's and backward's plans with seq_words, dispatch.cu): the
// dense streaming kernels then run as they do without seq_idx, a warp step
// whose words are not all set through the masked paths of stream_ids.cuh.
// The words lie in scratch the caller gave (the forward's workspace, the
// backward's after its partial sums; SeqWordsBytes, csrc/problem.h).
#pragma once

#include "common.cuh"
#include "sequences.cuh"
#include "stream.cuh"
#include "stream_ids.cuh"

namespace jcc::cuda {

// The words: per row b and vector v (steps v N ..), tap[b nvec + v] and
// (the backward's) dx[b nvec + v] of IdMask<N, kH>::Word; per warp step s
// (32 vectors), plain[b nsteps + s]: bit 0 when its tap words are all set,
// bit 1 its dx words.
//
// The backward's dense + fix plan (dispatch.cu's SeqFixBackward) also has,
// per warp step, fix[b nsteps + s] and zero[b nsteps + s] (bit = lane: the
// vector s 32 + lane): `zero`, every step of the vector is padding; `fix`,
// it is not, and an output of steps p0 .. p0 + N + kH - 1 (p0 its first)
// is padding or has an id change in its window (a step p of p0 - kH + 1 ..
// p0 + N + kH - 1, p >= 1, with seq_idx[p] != seq_idx[p - 1]). So a vector
// with neither bit has only outputs whose windows hold their own id and
// inputs whose outputs have their own id: the dense pass is right there.
// fixes[b] counts the row's fix bits; a row with more than heavy_min is
// left to the masked kernel.
struct SeqWords {
  void* tap = nullptr;
  void* dx = nullptr;
  uint8_t* plain = nullptr;
  uint32_t* fix = nullptr;
  uint32_t* zero = nullptr;
  int32_t* fixes = nullptr;
  int64_t nvec = 0, nsteps = 0, heavy_min = 0;
  // Whether row b is the masked kernel's (true without the fix plan)
  __device__ __forceinline__ bool Heavy(int64_t b) const { return fixes == nullptr || fixes[b] > heavy_min; }
  // v of lane `lane`'s vector 0 in chunk ci (V vectors a lane) of row b, as
  // b nvec + v: its vector j's is 32 j on
  __device__ __forceinline__ uint64_t ChunkVector(int64_t b, int64_t ci, int V, int lane) const {
    return uint64_t(b * nvec) + uint64_t(ci) * (V * 32) + lane;
  }
};

// The pre-pass: a warp per (row, chunk) makes the chunk's words as the
// shared-ids kernels do (LoadChunkMasks) and writes them to sw, vector by
// vector, with a byte per warp step. kDx: the dx words too (the backward).
template <typename T, int kW, bool kDx>
__global__ void __launch_bounds__(kStreamThreads) SeqWordsKernel(const ConvArgs a, SeqWords sw, int64_t nchunks) {
  using S = Stream<T>;
  constexpr int N = S::kN, V = S::kVecs, kH = kW - 1;
  using Word = typename IdMask<N, kH>::Word;
  const int64_t warp = int64_t(blockIdx.x) * kStreamWarps + (threadIdx.x >> 5);
  if (warp >= a.batch * nchunks) return;  // whole warps
  const int lane = threadIdx.x & 31;
  const int64_t b = warp / nchunks, ci = warp - b * nchunks;
  ChunkMasks<N, kH, V, kDx> m;
  // Positions t < 0 take the row's first id. With initial states that is
  // HistoryId's (the first sequence owns them); without, they hold zeros
  // (the vector before the row), whose taps add nothing to y, g or dweight
  // whether masked or not, where HistoryId's "none" would mask them: so a
  // row whose first sequence covers its first warp step takes that step
  // plain, as the dense rows do.
  LoadChunkMasks<true>(a, b, ci * S::kChunk, RowFirstId(a, b), lane, m);
  const uint64_t v0 = sw.ChunkVector(b, ci, V, lane);
#pragma unroll
  for (int j = 0; j < V; ++j) {
    static_cast<Word*>(sw.tap)[v0 + j * 32] = m.tap[j];
    if constexpr (kDx) static_cast<Word*>(sw.dx)[v0 + j * 32] = m.dx[j];
  }
  if (lane < V) sw.plain[b * sw.nsteps + ci * V + lane] = ((m.tap_plain >> lane) & 1) | ((m.dx_plain >> lane) & 1) << 1;
  if (sw.fix == nullptr) return;  // (not the fix plan: warp-uniform)
  // The fix and zero bits (SeqWords), from the ids around each vector
  // (cached: every lane's range overlaps its neighbours').
  const int64_t L = a.len;
  int count = 0;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int64_t p0 = ci * S::kChunk + int64_t(j * 32 + lane) * N;
    bool fix = false, zero = p0 < L;
    if (p0 < L) {
      const int32_t* ids = a.seq_idx + b * L;
      int32_t prev = kNoId;  // (read only for a step whose predecessor was read)
#pragma unroll
      for (int i = -kH; i < N + kH; ++i) {  // step p = p0 + i
        const int64_t p = p0 + i;
        if (p < 0) continue;
        if (p >= L) break;
        const int32_t v = ids[p];
        if (i >= 0 && i < N) zero &= v < 0;
        if (i >= 0 && v < 0) fix = true;                    // a padding output
        if (i >= 1 - kH && p >= 1 && v != prev) fix = true;  // an id change in some output's window
        prev = v;
      }
    }
    const uint32_t fixw = __ballot_sync(kFullMask, fix && !zero), zerow = __ballot_sync(kFullMask, zero);
    if (lane == 0) {
      sw.fix[b * sw.nsteps + ci * V + j] = fixw;
      sw.zero[b * sw.nsteps + ci * V + j] = zerow;
    }
    count += __popc(fixw);
  }
  if (lane == 0 && count > 0) atomicAdd(sw.fixes + b, count);
}

// Lays the words of a (W == kW) out in the scratch [scratch, scratch +
// scratch_bytes) (16-byte aligned) into *sw and launches the pre-pass;
// cudaErrorInvalidValue when they do not fit. `fix` (the backward's dense +
// fix plan): the fix and zero words and the rows' counts too, rows of more
// than `heavy_min` fix bits counted heavy; *fitted says whether they fit
// (else they are not made, and every row is heavy).
template <typename T, int kW, bool kDx>
cudaError_t MakeSeqWords(const ConvArgs& a, void* scratch, int64_t scratch_bytes, cudaStream_t stream,
                         SeqWords* sw, bool fix = false, int64_t heavy_min = 0) {
  using S = Stream<T>;
  using Word = typename IdMask<S::kN, kW - 1>::Word;
  const int64_t nchunks = CeilDiv(a.len, int64_t(S::kChunk));
  sw->nsteps = nchunks * S::kVecs;
  sw->nvec = sw->nsteps * 32;
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(scratch) + 15) & ~uintptr_t(15));
  const int64_t words = a.batch * sw->nvec * int64_t(sizeof(Word)), kinds = kDx ? 2 : 1;
  const int64_t used = (base - static_cast<char*>(scratch)) + kinds * words + a.batch * sw->nsteps;
  if (scratch == nullptr || used > scratch_bytes) return cudaErrorInvalidValue;
  sw->tap = base;
  sw->dx = kDx ? base + words : nullptr;
  sw->plain = reinterpret_cast<uint8_t*>(base + kinds * words);
  // the fix plan's words after the plain bytes, 4-byte aligned
  const int64_t fix_at = (used + 3) & ~int64_t(3), fix_bytes = 4 * (2 * a.batch * sw->nsteps + a.batch);
  if (fix && fix_at + fix_bytes <= scratch_bytes) {
    sw->fix = reinterpret_cast<uint32_t*>(static_cast<char*>(scratch) + fix_at);
    sw->zero = sw->fix + a.batch * sw->nsteps;
    sw->fixes = reinterpret_cast<int32_t*>(sw->zero + a.batch * sw->nsteps);
    sw->heavy_min = heavy_min;
    const cudaError_t err = cudaMemsetAsync(sw->fixes, 0, 4 * a.batch, stream);
    if (err != cudaSuccess) return err;
  }
  SeqWordsKernel<T, kW, kDx><<<unsigned(CeilDiv(a.batch * nchunks, kStreamWarps)), kStreamThreads, 0, stream>>>(
      a, *sw, nchunks);
  return cudaGetLastError();
}

}  // namespace jcc::cuda
