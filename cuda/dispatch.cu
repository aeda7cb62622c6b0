// The one dispatch of the convolution kernels: which family runs a call
// (launchers.h lists them) is decided here, from the problem, once (with
// the family's launch geometry); the family's launcher then picks its typed
// kernel for the dtype and width (the channels-last rows' launcher also
// their slice, from that kernel's occupancy and the device's SMs).
#include <atomic>
#include <climits>
#include <cstdlib>

#include "common.cuh"
#include "launchers.h"

namespace jcc::cuda {
namespace {

bool Aligned(const void* p, size_t bytes) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Channels-first rows of whole aligned 16-byte vectors, x strided by whole
// vectors; one sequence per row or seq_idx (its rows then whole 16-byte
// words of ids too): the streaming family (W <= 16) and the wide one.
bool VectorRowsFit(const ConvArgs& a, const void* in2, const void* out) {
  const int64_t n = 16 / DTypeBytes(a.x_dtype);
  const bool ids_fit = a.mode == SegmentMode::kRow || (a.mode == SegmentMode::kSeqIdx && Aligned(a.seq_idx, 16));
  return !a.channels_last && ids_fit && a.len % n == 0 && a.x_batch_stride % n == 0 &&
         a.x_row_stride % n == 0 && Aligned(a.x, 16) && Aligned(in2, 16) && Aligned(out, 16);
}

// Channels-last rows of whole aligned channel vectors (ClRowVec channels a
// thread), dense x; every sequence mode; W <= 16.
bool ClRowFits(const ConvArgs& a, bool backward, const void* in2, const void* out) {
  if (!a.channels_last || a.width > 16 || a.x_batch_stride != 0 || a.x_row_stride != 0) return false;
  const int64_t vec = ClRowVec(a, backward);
  const size_t bytes = size_t(vec) * DTypeBytes(a.x_dtype);
  return a.dim % vec == 0 && Aligned(a.x, bytes) && Aligned(in2, bytes) && Aligned(out, bytes);
}

// ... and their grid at the plan's slice (the base, or JCC_CL_*_STEPS: at
// least as many chunks as the launch's) fits a launch. (The forward's
// launcher picks its slice; the backward's plan keeps the chunks for its
// workspace check, completed by the launcher.)
bool ClRowGridFits(const ConvArgs& a, bool backward) {
  int steps = 0;
  return ClRowChunks(a, backward, 0, &steps) > 0;
}

// Channels-last, dense x of whole aligned groups of kWideClCh channels
// (16- or 32-byte pieces of rows), one sequence per row or seq_idx: the
// channels-last wide family and tensor-core forward (W > 16).
bool WideClFits(const ConvArgs& a, const void* in2, const void* out) {
  const bool mode = a.mode == SegmentMode::kRow || a.mode == SegmentMode::kSeqIdx;
  return a.channels_last && mode && a.x_batch_stride == 0 && a.x_row_stride == 0 &&
         a.dim % kWideClCh == 0 && Aligned(a.x, 16) && Aligned(in2, 16) && Aligned(out, 16);
}

// bfloat16 x with weights of any float dtype, float16 x with float16
// weights: the tensor-core forwards (on top of VectorRowsFit or WideClFits:
// one sequence per row or seq_idx, the channels-last kernel's ids read as
// whole aligned 16-byte words of rows of whole words). Wider weights are
// split into two parts of x's dtype, which keeps ~16 bits for bfloat16's
// range but not for float16's (tiny weights turn subnormal, large ones
// overflow), so float16 x with other weights keeps the FMA kernels.
bool MmaFits(const ConvArgs& a) {
  const bool ids_fit = !a.channels_last || (Aligned(a.seq_idx, 16) && a.len % 4 == 0);
  const bool mode = a.mode == SegmentMode::kRow || (a.mode == SegmentMode::kSeqIdx && ids_fit);
  const bool types = a.x_dtype == DType::kBF16 || (a.x_dtype == DType::kF16 && a.w_dtype == DType::kF16);
  return types && mode;
}

// Channels-first seq_idx at W <= 16 takes the streaming kernels that share
// each chunk's masks among kIdChannels channels (stream_ids.cuh); they walk
// one chunk a span.
bool SharedIds(const ConvArgs& a) { return a.mode == SegmentMode::kSeqIdx && a.width <= 16; }

// Where the channels-first seq_idx streaming kernels read mask words made
// once a row by a pre-pass (seq_words.cuh), instead of the shared-ids ones:
// rows of at least 4096 steps in calls of at least 2^26 elements, W >= 2
// (the pre-pass is a serial launch, and rows whose every warp step holds an
// id change are faster staged in shared memory), every dtype. The backward:
// docs/performance-log.md, thirty-sixth (W 2..8), thirty-eighth (16-bit W
// 9..16) and thirty-ninth (float32) sessions.
bool SeqWordsRows(const ConvArgs& a) {
  return a.width >= 2 && a.len >= 4096 && a.batch * a.dim * a.len >= (int64_t(1) << 26);
}

// JCC_SEQ_WORDS=0 / 1 forces the backward's choice off / on at every W <=
// 16 (tests, A/B), read at each call as JCC_FWD_SPAN is.
bool SeqWordsBackward(const ConvArgs& a) {
  if (!SharedIds(a)) return false;
  if (const int forced = EnvDigit("JCC_SEQ_WORDS", "01"); forced >= 0) return forced == 1;
  return SeqWordsRows(a);
}

// The forward's, where the caller gave the workspace for the words
// (ForwardWorkspaceBytes; the DLPack entry point and the v1 FFI target give
// none): the same rows, 16-bit x at W >= 6, where it measured 2-15% faster
// (W 6..16); level at W 3..5, 1.5% faster at W 2, and 1-7% slower for
// float32 at W 8..16 (docs/performance-log.md, fortieth session).
// JCC_SEQ_WORDS_FWD=0 / 1 forces it as JCC_SEQ_WORDS does.
bool SeqWordsForward(const ConvArgs& a, int64_t workspace_bytes) {
  if (!SharedIds(a) || workspace_bytes < SeqWordsBytes(a.batch, a.len)) return false;
  if (const int forced = EnvDigit("JCC_SEQ_WORDS_FWD", "01"); forced >= 0) return forced == 1;
  return DTypeBytes(a.x_dtype) == 2 && a.width >= 6 && SeqWordsRows(a);
}

// The most chunks a warp of the streaming families walks (a span; the
// shared-ids backward's span is one chunk).
constexpr int64_t kMaxSpanChunks = 4;

// The streaming forward lets a warp walk a span of chunks, so that its
// setup (its place, taps, the vector before its first chunk) is paid once a
// span: up to 4 chunks, 2 at W = 2, none at W = 1 (where the walk measured
// no faster; docs/performance-log.md, 2026-11-26). JCC_FWD_SPAN = 1, 2 or 4
// overrides the most (tests and diagnosis); read at each call where a warp
// could walk at all, so that one process can compare settings (a call
// captured in a CUDA graph keeps what was read at capture). seq_idx walks
// only reading the words.
int64_t ForwardSpanChunks(const ConvArgs& a, bool seq_words) {
  int64_t k = 1;
  if ((SharedIds(a) && !seq_words) || StreamSpans(a, kMaxSpanChunks, &k) <= 0 || k == 1) return 1;
  if (const int forced = EnvDigit("JCC_FWD_SPAN", "124"); forced > 0) return forced;
  return a.width == 1 ? 1 : a.width == 2 ? 2 : kMaxSpanChunks;
}

}  // namespace

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

namespace {

// The family that runs a forward, with its launch geometry.
ForwardPlan PlanForwardFamily(const ConvArgs& a, int64_t workspace_bytes) {
  ForwardPlan p;
  if (a.batch == 0 || a.dim == 0 || a.len == 0) return p;
  const bool rows = VectorRowsFit(a, a.residual, a.y), words = SeqWordsForward(a, workspace_bytes);
  // (The streaming kernels at their own width measured faster than the
  // tensor-core forward at W 13..16: docs/performance-log.md, eighteenth
  // session.)
  if (rows && a.width > 16 && MmaFits(a) && (p.spans_per_row = WideSpans(a)) > 0) {
    p.family = ForwardPlan::kMma;
  } else if (rows && a.width <= 16 &&
             (p.spans_per_row = StreamSpans(a, ForwardSpanChunks(a, words), &p.chunks_per_span)) > 0) {
    p.family = ForwardPlan::kStream;
    p.seq_words = words;
  } else if (rows && a.width > 16 && (p.spans_per_row = WideSpans(a)) > 0) {
    p.family = ForwardPlan::kWide;
  } else if (WideClFits(a, a.residual, a.y) && a.width > 16 && MmaFits(a) && (p.spans_per_row = WideSpans(a)) > 0) {
    // (W 13..16 take the channels-last rows, measured faster there since
    // their forward's threads take 128 steps; docs/performance-log.md,
    // 2026-11-27)
    p.family = ForwardPlan::kMmaCl;
  } else if (WideClFits(a, a.residual, a.y) && a.width > 16 && (p.spans_per_row = WideSpans(a)) > 0) {
    p.family = ForwardPlan::kWideCl;
  } else if (ClRowFits(a, false, a.residual, a.y) && ClRowGridFits(a, false)) {
    p.family = ForwardPlan::kClRow;
  } else {
    p.family = ForwardPlan::kTile;
  }
  return p;
}

// The families whose seq_idx forward runs as their dense one, then
// FixSeqIdxForward over the outputs near an id change and the padding ones:
// packed rows of a few segments leave a few percent of the outputs to redo,
// where the tensor-core forwards' masked tile loops cost about twice their
// dense ones (docs/performance-log.md, twenty-eighth session; the first
// fix kernel, slower than the masked loops everywhere, twenty-ninth).
// (The streaming forward so measured slower: its fix cost more than the
// masked path adds; docs/performance-log.md, thirty-fifth session.)
bool SeqFixFamily(ForwardPlan::Family f) { return f == ForwardPlan::kMma || f == ForwardPlan::kMmaCl; }

// The same problem as rows of one sequence: a seq_fix plan's dense forward.
ConvArgs AsRows(const ConvArgs& a) {
  ConvArgs rows = a;
  rows.mode = SegmentMode::kRow;
  return rows;
}

// The widest W that takes the fix (its work grows as W squared a change of
// id, the masked tile loops' as W; measured faster to W 32, slower from
// W 48, both layouts: performance log, thirtieth session; 40 ends the
// narrowest tensor-core bucket): JCC_SEQ_FIX_MAX_W overrides it (0:
// never; tests and diagnosis, read at each call as JCC_FWD_SPAN is: a call
// captured in a CUDA graph keeps what was read at capture).
int64_t SeqFixMaxWidth() {
  const char* e = std::getenv("JCC_SEQ_FIX_MAX_W");
  if (e != nullptr && e[0] != 0) {
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    if (*end == 0 && v >= 0) return v;
  }
  return 40;
}

}  // namespace

ForwardPlan PlanForward(const ConvArgs& a, int64_t workspace_bytes) {
  if (a.mode == SegmentMode::kSeqIdx && a.width <= Min64(257, SeqFixMaxWidth())) {  // (257: FixSeqIdxForward's bound)
    ForwardPlan p = PlanForwardFamily(AsRows(a), 0);
    if (SeqFixFamily(p.family)) {
      p.seq_fix = true;
      return p;
    }
  }
  return PlanForwardFamily(a, workspace_bytes);
}

BackwardPlan PlanBackward(const ConvArgs& a) {
  BackwardPlan p;
  if (a.batch == 0 || a.dim == 0 || a.len == 0) return p;
  const bool rows = VectorRowsFit(a, a.dy, a.dx), words = SeqWordsBackward(a);
  if (rows && MmaBackwardFits(a) && (p.nchunk = MmaBackwardSpans(a, &p.chunks_per_span)) > 0) {
    p.family = BackwardPlan::kMma;
  } else if (rows && a.width <= 16 &&
             (p.nchunk = StreamSpans(a, SharedIds(a) && !words ? 1 : kMaxSpanChunks, &p.chunks_per_span)) > 0) {
    p.family = BackwardPlan::kStream;
    p.seq_words = words;
  } else if (rows && a.width > 16 && (p.nchunk = WideSpans(a)) > 0) {
    p.family = BackwardPlan::kWide;
  } else if (WideClFits(a, a.dy, a.dx) && a.width > 16 && (p.nchunk = WideSpans(a)) > 0) {
    p.family = BackwardPlan::kWideCl;
  } else if (ClRowFits(a, true, a.dy, a.dx) && (p.nchunk = ClRowChunks(a, true, 0, &p.steps)) > 0) {
    p.family = BackwardPlan::kClRow;
  } else {
    p = TileBackwardPlan(a);
  }
  p.nparts = a.batch_per_group() * p.nchunk;
  return p;
}

cudaError_t Forward(const ConvArgs& a, void* workspace, int64_t workspace_bytes, cudaStream_t stream) {
  if (a.x_dtype == DType::kF64) return cudaErrorNotSupported;  // (float64 is CPU-only)
  if (workspace == nullptr) workspace_bytes = 0;
  const ForwardPlan p = PlanForward(a, workspace_bytes);
  const ConvArgs f = p.seq_fix ? AsRows(a) : a;  // (seq_fix: the family's dense forward first)
  cudaError_t err = cudaSuccess;
  switch (p.family) {
    case ForwardPlan::kStream: err = ForwardStream(f, p, workspace, workspace_bytes, stream); break;
    case ForwardPlan::kMma: err = ForwardMma(f, p, stream); break;
    case ForwardPlan::kWide: err = ForwardWide(f, p, stream); break;
    case ForwardPlan::kMmaCl: err = ForwardMmaCl(f, p, stream); break;
    case ForwardPlan::kWideCl: err = ForwardWideCl(f, p, stream); break;
    case ForwardPlan::kClRow: err = ForwardClRow(f, p, stream); break;
    case ForwardPlan::kTile: err = ForwardTile(f, stream); break;
    case ForwardPlan::kNone: break;
  }
  if (err == cudaSuccess && p.seq_fix) err = FixSeqIdxForward(a, stream);
  if (err != cudaSuccess) return err;
  return FinalStates(a, stream);
}

cudaError_t Backward(const ConvArgs& a, void* workspace, cudaStream_t stream) {
  if (a.x_dtype == DType::kF64) return cudaErrorNotSupported;
  float* ws = static_cast<float*>(workspace);
  BackwardPlan p = PlanBackward(a);  // (kClRow's launcher completes it)
  // Every plan's partial sums fit BackwardWorkspaceBytes (csrc/problem.h).
  if (BackwardPartialFloats(a, p) * 4 > BackwardWorkspaceBytes(a.batch, a.dim, a.len, a.width))
    return cudaErrorInvalidValue;
  cudaError_t err = cudaSuccess;
  switch (p.family) {
    case BackwardPlan::kStream: err = BackwardStream(a, p, ws, stream); break;
    case BackwardPlan::kMma: err = BackwardMma(a, p, ws, stream); break;
    case BackwardPlan::kWide: err = BackwardWide(a, p, ws, stream); break;
    case BackwardPlan::kWideCl: err = BackwardWideCl(a, p, ws, stream); break;
    case BackwardPlan::kClRow: err = BackwardClRow(a, p, ws, stream); break;
    case BackwardPlan::kTile: err = BackwardTile(a, p, ws, stream); break;
    case BackwardPlan::kNone: break;
  }
  if (err != cudaSuccess) return err;
  if ((err = ReduceWeightGrads(a, ws, p.nparts, stream)) != cudaSuccess) return err;
  return StatesGrad(a, stream);
}

}  // namespace jcc::cuda
