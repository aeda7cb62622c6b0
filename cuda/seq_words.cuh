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
struct SeqWords {
  void* tap = nullptr;
  void* dx = nullptr;
  uint8_t* plain = nullptr;
  int64_t nvec = 0, nsteps = 0;
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
}

// Lays the words of a (W == kW) out in the scratch [scratch, scratch +
// scratch_bytes) (16-byte aligned) into *sw and launches the pre-pass;
// cudaErrorInvalidValue when they do not fit.
template <typename T, int kW, bool kDx>
cudaError_t MakeSeqWords(const ConvArgs& a, void* scratch, int64_t scratch_bytes, cudaStream_t stream,
                         SeqWords* sw) {
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
  SeqWordsKernel<T, kW, kDx><<<unsigned(CeilDiv(a.batch * nchunks, kStreamWarps)), kStreamThreads, 0, stream>>>(
      a, *sw, nchunks);
  return cudaGetLastError();
}

}  // namespace jcc::cuda
