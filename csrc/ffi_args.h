// Typed XLA FFI bindings shared by the CPU and CUDA handlers: the argument
// lists, and their translation into the plain descriptions of problem.h with
// every dimension checked. A mismatch becomes ffi::Error::InvalidArgument,
// never an out-of-bounds access.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "problem.h"
#include "xla/ffi/api/ffi.h"

namespace jcc {

namespace ffi = xla::ffi;

// --- bindings -------------------------------------------------------------
// Absent optional inputs are passed as zero-size placeholders and flagged by
// the has_* attributes.

#define JCC_FORWARD_BINDING(BIND)                                             \
  BIND.Arg<ffi::AnyBuffer>()     /* x (B,D,L) | (B,L,D) */                    \
      .Arg<ffi::AnyBuffer>()     /* weight (G,D,W) */                         \
      .Arg<ffi::AnyBuffer>()     /* bias (G,D) */                             \
      .Arg<ffi::AnyBuffer>()     /* residual, like x */                       \
      .Arg<ffi::AnyBuffer>()     /* seq_idx (B,L) int32, mode 1 */            \
      .Arg<ffi::AnyBuffer>()     /* cu_seqlens (B,N+1) int32, mode 2 */       \
      .Arg<ffi::AnyBuffer>()     /* initial_states */                         \
      .Ret<ffi::AnyBuffer>()     /* y */                                      \
      .Ret<ffi::AnyBuffer>()     /* final_states */                           \
      .Attr<int64_t>("activation")                                            \
      .Attr<int64_t>("mode")                                                  \
      .Attr<bool>("channels_last")                                            \
      .Attr<bool>("states_channels_last")                                     \
      .Attr<bool>("has_bias")                                                 \
      .Attr<bool>("has_residual")                                             \
      .Attr<bool>("has_initial_states")                                       \
      .Attr<bool>("has_final_states")

#define JCC_FORWARD_PARAMS                                                            \
  ffi::AnyBuffer x, ffi::AnyBuffer weight, ffi::AnyBuffer bias, ffi::AnyBuffer residual, \
      ffi::AnyBuffer seq_idx, ffi::AnyBuffer cu_seqlens, ffi::AnyBuffer initial_states,  \
      ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> final_states,           \
      int64_t activation, int64_t mode, bool channels_last, bool states_channels_last,   \
      bool has_bias, bool has_residual, bool has_initial_states, bool has_final_states
#define JCC_FORWARD_NAMES                                                              \
  x, weight, bias, residual, seq_idx, cu_seqlens, initial_states, y, final_states,      \
      activation, mode, channels_last, states_channels_last, has_bias, has_residual,    \
      has_initial_states, has_final_states

#define JCC_BACKWARD_BINDING(BIND)                                            \
  BIND.Arg<ffi::AnyBuffer>()     /* x */                                      \
      .Arg<ffi::AnyBuffer>()     /* weight */                                 \
      .Arg<ffi::AnyBuffer>()     /* bias */                                   \
      .Arg<ffi::AnyBuffer>()     /* seq_idx */                                \
      .Arg<ffi::AnyBuffer>()     /* cu_seqlens */                             \
      .Arg<ffi::AnyBuffer>()     /* initial_states */                         \
      .Arg<ffi::AnyBuffer>()     /* dy */                                     \
      .Arg<ffi::AnyBuffer>()     /* dfinal_states */                          \
      .Ret<ffi::AnyBuffer>()     /* dx */                                     \
      .Ret<ffi::AnyBuffer>()     /* dweight */                                \
      .Ret<ffi::AnyBuffer>()     /* dbias */                                  \
      .Ret<ffi::AnyBuffer>()     /* dinitial_states */                        \
      .Attr<int64_t>("activation")                                            \
      .Attr<int64_t>("mode")                                                  \
      .Attr<bool>("channels_last")                                            \
      .Attr<bool>("states_channels_last")                                     \
      .Attr<bool>("has_bias")                                                 \
      .Attr<bool>("has_initial_states")                                       \
      .Attr<bool>("has_dfinal_states")

#define JCC_BACKWARD_PARAMS                                                               \
  ffi::AnyBuffer x, ffi::AnyBuffer weight, ffi::AnyBuffer bias, ffi::AnyBuffer seq_idx,    \
      ffi::AnyBuffer cu_seqlens, ffi::AnyBuffer initial_states, ffi::AnyBuffer dy,          \
      ffi::AnyBuffer dfinal_states, ffi::Result<ffi::AnyBuffer> dx,                         \
      ffi::Result<ffi::AnyBuffer> dweight, ffi::Result<ffi::AnyBuffer> dbias,               \
      ffi::Result<ffi::AnyBuffer> dinitial_states, int64_t activation, int64_t mode,        \
      bool channels_last, bool states_channels_last, bool has_bias, bool has_initial_states, \
      bool has_dfinal_states
#define JCC_BACKWARD_NAMES                                                                  \
  x, weight, bias, seq_idx, cu_seqlens, initial_states, dy, dfinal_states, dx, dweight,     \
      dbias, dinitial_states, activation, mode, channels_last, states_channels_last,        \
      has_bias, has_initial_states, has_dfinal_states

// The update target: v1 (channels-first only, kept for exported programs)
// and v2 (+ channels_last: x (B,S,D), conv_state (N,state_len,D)).
#define JCC_UPDATE_BINDING_V1(BIND)                                           \
  BIND.Arg<ffi::AnyBuffer>()     /* x (B,D,S) | (B,S,D) */                    \
      .Arg<ffi::AnyBuffer>()     /* conv_state (N,D,state_len) | (N,state_len,D) */ \
      .Arg<ffi::AnyBuffer>()     /* weight (G,D,W) */                         \
      .Arg<ffi::AnyBuffer>()     /* bias (G,D) */                             \
      .Arg<ffi::AnyBuffer>()     /* cache_seqlens (B) int32 */                \
      .Arg<ffi::AnyBuffer>()     /* conv_state_indices (B) int32 */           \
      .Ret<ffi::AnyBuffer>()     /* y, like x */                              \
      .Ret<ffi::AnyBuffer>()     /* new conv_state, aliased with the input */ \
      .Attr<int64_t>("activation")                                            \
      .Attr<bool>("has_bias")                                                 \
      .Attr<bool>("has_cache_seqlens")                                        \
      .Attr<bool>("has_state_indices")
#define JCC_UPDATE_BINDING(BIND) JCC_UPDATE_BINDING_V1(BIND).Attr<bool>("channels_last")

#define JCC_UPDATE_PARAMS_V1                                                             \
  ffi::AnyBuffer x, ffi::AnyBuffer conv_state, ffi::AnyBuffer weight, ffi::AnyBuffer bias, \
      ffi::AnyBuffer cache_seqlens, ffi::AnyBuffer conv_state_indices,                     \
      ffi::Result<ffi::AnyBuffer> y, ffi::Result<ffi::AnyBuffer> new_state,                \
      int64_t activation, bool has_bias, bool has_cache_seqlens, bool has_state_indices
#define JCC_UPDATE_PARAMS JCC_UPDATE_PARAMS_V1, bool channels_last
#define JCC_UPDATE_NAMES_V1                                                              \
  x, conv_state, weight, bias, cache_seqlens, conv_state_indices, y, new_state, activation, \
      has_bias, has_cache_seqlens, has_state_indices
#define JCC_UPDATE_NAMES JCC_UPDATE_NAMES_V1, channels_last

// varlen_states: v1 (states (N,D,state_len)) and v2 (+ channels_last:
// states (N,state_len,D)).
#define JCC_VARLEN_STATES_BINDING_V1(BIND)                                    \
  BIND.Arg<ffi::AnyBuffer>()     /* x (T,D) */                                \
      .Arg<ffi::AnyBuffer>()     /* cu_seqlens (N+1) int32 */                 \
      .Ret<ffi::AnyBuffer>()     /* states */
#define JCC_VARLEN_STATES_BINDING(BIND) \
  JCC_VARLEN_STATES_BINDING_V1(BIND).Attr<bool>("channels_last")

#define JCC_VARLEN_STATES_PARAMS_V1 \
  ffi::AnyBuffer x, ffi::AnyBuffer cu_seqlens, ffi::Result<ffi::AnyBuffer> states
#define JCC_VARLEN_STATES_PARAMS JCC_VARLEN_STATES_PARAMS_V1, bool channels_last
#define JCC_VARLEN_STATES_NAMES_V1 x, cu_seqlens, states
#define JCC_VARLEN_STATES_NAMES JCC_VARLEN_STATES_NAMES_V1, channels_last

// --- checks ---------------------------------------------------------------

inline std::string ShapeStr(ffi::AnyBuffer::Dimensions d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + (d.size() == 1 ? ",)" : ")");
}

inline std::string ShapeStr(const std::vector<int64_t>& d) {
  std::string s = "(";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + (d.size() == 1 ? ",)" : ")");
}

inline ffi::Error Invalid(const std::string& msg) {
  return ffi::Error::InvalidArgument("jax_causal_conv: " + msg);
}

inline bool SameShape(ffi::AnyBuffer::Dimensions d, const std::vector<int64_t>& want) {
  if (d.size() != want.size()) return false;
  for (size_t i = 0; i < want.size(); ++i)
    if (d[i] != want[i]) return false;
  return true;
}

inline ffi::Error CheckShape(const char* name, ffi::AnyBuffer::Dimensions d,
                             const std::vector<int64_t>& want) {
  if (SameShape(d, want)) return ffi::Error::Success();
  return Invalid(std::string(name) + " has shape " + ShapeStr(d) + ", expected " + ShapeStr(want));
}

inline bool ToDType(ffi::DataType t, DType* out) {
  switch (t) {
    case ffi::DataType::F32: *out = DType::kF32; return true;
    case ffi::DataType::F16: *out = DType::kF16; return true;
    case ffi::DataType::BF16: *out = DType::kBF16; return true;
    case ffi::DataType::F64: *out = DType::kF64; return true;
    default: return false;
  }
}

inline ffi::Error CheckFloat(const char* name, ffi::AnyBuffer b, DType* out) {
  if (ToDType(b.element_type(), out)) return ffi::Error::Success();
  return Invalid(std::string(name) + " must be float32, float16, bfloat16 or float64");
}

inline ffi::Error CheckSameDType(const char* name, ffi::AnyBuffer b, ffi::DataType want) {
  if (b.element_type() == want) return ffi::Error::Success();
  return Invalid(std::string(name) + " must have the dtype of x");
}

inline ffi::Error CheckInt32(const char* name, ffi::AnyBuffer b) {
  if (b.element_type() == ffi::DataType::S32) return ffi::Error::Success();
  return Invalid(std::string(name) + " must be int32");
}

#define JCC_RETURN_IF_ERROR(expr)         \
  do {                                    \
    ffi::Error _err = (expr);             \
    if (_err.failure()) return _err;      \
  } while (0)

// Weight (G, D, W) and bias (G, D) against D and the batch they serve.
inline ffi::Error CheckWeights(ConvArgs* a, int64_t batch, ffi::AnyBuffer weight,
                               ffi::AnyBuffer bias, bool has_bias) {
  auto wd = weight.dimensions();
  if (wd.size() != 3) return Invalid("weight must have rank 3 (groups, dim, width), got " + ShapeStr(wd));
  a->groups = wd[0];
  a->width = wd[2];
  if (a->groups < 1 || (batch > 0 && batch % a->groups != 0))
    return Invalid("weight groups " + std::to_string(a->groups) + " must divide the batch " +
                   std::to_string(batch));
  if (a->width < 1 || a->width > kMaxWidth)
    return Invalid("width must be in [1, " + std::to_string(kMaxWidth) + "], got " +
                   std::to_string(a->width));
  JCC_RETURN_IF_ERROR(CheckShape("weight", wd, {a->groups, a->dim, a->width}));
  JCC_RETURN_IF_ERROR(CheckFloat("weight", weight, &a->w_dtype));
  if (has_bias) {
    JCC_RETURN_IF_ERROR(CheckShape("bias", bias.dimensions(), {a->groups, a->dim}));
    JCC_RETURN_IF_ERROR(CheckFloat("bias", bias, &a->b_dtype));
    a->bias = bias.untyped_data();
  }
  a->weight = weight.untyped_data();
  return ffi::Error::Success();
}

// The parts of forward and backward that describe the problem itself.
inline ffi::Error MakeConvProblem(ConvArgs* a, ffi::AnyBuffer x, ffi::AnyBuffer weight,
                                  ffi::AnyBuffer bias, ffi::AnyBuffer seq_idx,
                                  ffi::AnyBuffer cu_seqlens, ffi::AnyBuffer initial_states,
                                  int64_t activation, int64_t mode, bool channels_last,
                                  bool states_channels_last, bool has_bias,
                                  bool has_initial_states) {
  auto xd = x.dimensions();
  if (xd.size() != 3) return Invalid("x must have rank 3, got shape " + ShapeStr(xd));
  JCC_RETURN_IF_ERROR(CheckFloat("x", x, &a->x_dtype));
  a->batch = xd[0];
  a->dim = channels_last ? xd[2] : xd[1];
  a->len = channels_last ? xd[1] : xd[2];
  a->channels_last = channels_last;
  a->states_channels_last = states_channels_last;
  if (activation != 0 && activation != 1) return Invalid("activation must be 0 (none) or 1 (silu)");
  a->act = Activation(activation);
  if (mode < 0 || mode > 2) return Invalid("mode must be 0 (rows), 1 (seq_idx) or 2 (varlen)");
  a->mode = SegmentMode(mode);
  a->x = x.untyped_data();
  JCC_RETURN_IF_ERROR(CheckWeights(a, a->batch, weight, bias, has_bias));
  a->num_states = a->batch;
  if (a->mode == SegmentMode::kSeqIdx) {
    JCC_RETURN_IF_ERROR(CheckInt32("seq_idx", seq_idx));
    JCC_RETURN_IF_ERROR(CheckShape("seq_idx", seq_idx.dimensions(), {a->batch, a->len}));
    a->seq_idx = static_cast<const int32_t*>(seq_idx.untyped_data());
  } else if (a->mode == SegmentMode::kVarlen) {
    JCC_RETURN_IF_ERROR(CheckInt32("cu_seqlens", cu_seqlens));
    auto cd = cu_seqlens.dimensions();
    if (cd.size() != 2 || cd[0] != a->batch || cd[1] < 1)
      return Invalid("cu_seqlens must have shape (" + std::to_string(a->batch) + ", N+1), got " +
                     ShapeStr(cd));
    a->num_seqs = cd[1] - 1;
    a->num_states = a->batch * a->num_seqs;
    a->cu_seqlens = static_cast<const int32_t*>(cu_seqlens.untyped_data());
  }
  if (has_initial_states) {
    const int64_t H = a->width - 1, n = a->num_states, D = a->dim;
    JCC_RETURN_IF_ERROR(CheckShape("initial_states", initial_states.dimensions(),
                                   states_channels_last ? std::vector<int64_t>{n, H, D}
                                                        : std::vector<int64_t>{n, D, H}));
    JCC_RETURN_IF_ERROR(CheckSameDType("initial_states", initial_states, x.element_type()));
    a->initial_states = initial_states.untyped_data();
  }
  return ffi::Error::Success();
}

inline std::vector<int64_t> StateShape(const ConvArgs& a) {
  const int64_t H = a.width - 1;
  return a.states_channels_last ? std::vector<int64_t>{a.num_states, H, a.dim}
                                : std::vector<int64_t>{a.num_states, a.dim, H};
}

inline std::vector<int64_t> Dims(ffi::AnyBuffer::Dimensions d) {
  return std::vector<int64_t>(d.begin(), d.end());
}

inline ffi::Error MakeForwardArgs(ConvArgs* a, JCC_FORWARD_PARAMS) {
  JCC_RETURN_IF_ERROR(MakeConvProblem(a, x, weight, bias, seq_idx, cu_seqlens, initial_states,
                                      activation, mode, channels_last, states_channels_last,
                                      has_bias, has_initial_states));
  if (has_residual) {
    JCC_RETURN_IF_ERROR(CheckShape("residual", residual.dimensions(), Dims(x.dimensions())));
    JCC_RETURN_IF_ERROR(CheckSameDType("residual", residual, x.element_type()));
    a->residual = residual.untyped_data();
  }
  JCC_RETURN_IF_ERROR(CheckShape("y", y->dimensions(), Dims(x.dimensions())));
  JCC_RETURN_IF_ERROR(CheckSameDType("y", *y, x.element_type()));
  a->y = y->untyped_data();
  if (has_final_states) {
    JCC_RETURN_IF_ERROR(CheckShape("final_states", final_states->dimensions(), StateShape(*a)));
    JCC_RETURN_IF_ERROR(CheckSameDType("final_states", *final_states, x.element_type()));
    a->final_states = final_states->untyped_data();
  }
  return ffi::Error::Success();
}

inline ffi::Error MakeBackwardArgs(ConvArgs* a, JCC_BACKWARD_PARAMS) {
  JCC_RETURN_IF_ERROR(MakeConvProblem(a, x, weight, bias, seq_idx, cu_seqlens, initial_states,
                                      activation, mode, channels_last, states_channels_last,
                                      has_bias, has_initial_states));
  const auto xdims = Dims(x.dimensions());
  JCC_RETURN_IF_ERROR(CheckShape("dy", dy.dimensions(), xdims));
  JCC_RETURN_IF_ERROR(CheckSameDType("dy", dy, x.element_type()));
  a->dy = dy.untyped_data();
  if (has_dfinal_states) {
    JCC_RETURN_IF_ERROR(CheckShape("dfinal_states", dfinal_states.dimensions(), StateShape(*a)));
    JCC_RETURN_IF_ERROR(CheckSameDType("dfinal_states", dfinal_states, x.element_type()));
    a->dfinal_states = dfinal_states.untyped_data();
  }
  JCC_RETURN_IF_ERROR(CheckShape("dx", dx->dimensions(), xdims));
  JCC_RETURN_IF_ERROR(CheckSameDType("dx", *dx, x.element_type()));
  a->dx = dx->untyped_data();
  JCC_RETURN_IF_ERROR(CheckShape("dweight", dweight->dimensions(), Dims(weight.dimensions())));
  JCC_RETURN_IF_ERROR(CheckSameDType("dweight", *dweight, weight.element_type()));
  a->dweight = dweight->untyped_data();
  if (has_bias) {
    JCC_RETURN_IF_ERROR(CheckShape("dbias", dbias->dimensions(), Dims(bias.dimensions())));
    JCC_RETURN_IF_ERROR(CheckSameDType("dbias", *dbias, bias.element_type()));
    a->dbias = dbias->untyped_data();
  }
  if (has_initial_states) {
    JCC_RETURN_IF_ERROR(CheckShape("dinitial_states", dinitial_states->dimensions(), StateShape(*a)));
    JCC_RETURN_IF_ERROR(CheckSameDType("dinitial_states", *dinitial_states, x.element_type()));
    a->dinitial_states = dinitial_states->untyped_data();
  }
  return ffi::Error::Success();
}

// The workspace results, bound after the attributes: uint8 scratch the CUDA
// kernels use (the CPU kernels ignore it, but check it the same way). The
// backward's holds BackwardWorkspaceBytes (its partial sums), the forward's
// ForwardWorkspaceBytes (csrc/problem.h).
inline ffi::Error CheckWorkspace(int64_t need, ffi::Result<ffi::AnyBuffer> workspace) {
  const auto wd = workspace->dimensions();
  if (workspace->element_type() != ffi::DataType::U8 || wd.size() != 1 || wd[0] < need)
    return Invalid("workspace must be a uint8 vector of at least " + std::to_string(need) +
                   " bytes, got " + ShapeStr(wd));
  return ffi::Error::Success();
}
inline int64_t BackwardWorkspaceBytes(const ConvArgs& a) {
  return BackwardWorkspaceBytes(a.batch, a.dim, a.len, a.width);
}
inline int64_t ForwardWorkspaceBytes(const ConvArgs& a) {
  return ForwardWorkspaceBytes(a.batch, a.len, a.width, int64_t(a.mode), a.channels_last);
}

inline ffi::Error MakeUpdateArgs(UpdateArgs* u, JCC_UPDATE_PARAMS) {
  auto xd = x.dimensions();
  const char* xs = channels_last ? "(batch, seqlen, dim)" : "(batch, dim, seqlen)";
  if (xd.size() != 3) return Invalid(std::string("x must have rank 3 ") + xs + ", got " + ShapeStr(xd));
  JCC_RETURN_IF_ERROR(CheckFloat("x", x, &u->x_dtype));
  u->channels_last = channels_last;
  u->batch = xd[0];
  u->dim = channels_last ? xd[2] : xd[1];
  u->seqlen = channels_last ? xd[1] : xd[2];
  auto sd = conv_state.dimensions();
  const int64_t sdim = sd.size() == 3 ? (channels_last ? sd[2] : sd[1]) : -1;
  if (sd.size() != 3 || sdim != u->dim)
    return Invalid("conv_state must have shape " +
                   std::string(channels_last ? "(num_slots, state_len, " + std::to_string(u->dim) + ")"
                                             : "(num_slots, " + std::to_string(u->dim) + ", state_len)") +
                   ", got " + ShapeStr(sd));
  JCC_RETURN_IF_ERROR(CheckSameDType("conv_state", conv_state, x.element_type()));
  u->num_slots = sd[0], u->state_len = channels_last ? sd[1] : sd[2];
  ConvArgs w;  // reuse the weight/bias checks
  w.dim = u->dim;
  JCC_RETURN_IF_ERROR(CheckWeights(&w, u->batch, weight, bias, has_bias));
  u->groups = w.groups, u->width = w.width, u->w_dtype = w.w_dtype, u->b_dtype = w.b_dtype;
  u->weight = w.weight, u->bias = w.bias;
  if (u->state_len < u->width - 1)
    return Invalid("state_len " + std::to_string(u->state_len) + " must be >= width - 1 = " +
                   std::to_string(u->width - 1));
  if (!has_state_indices && u->num_slots < u->batch)
    return Invalid("conv_state has " + std::to_string(u->num_slots) + " slots for batch " +
                   std::to_string(u->batch));
  if (activation != 0 && activation != 1) return Invalid("activation must be 0 (none) or 1 (silu)");
  u->act = Activation(activation);
  if (has_cache_seqlens) {
    JCC_RETURN_IF_ERROR(CheckInt32("cache_seqlens", cache_seqlens));
    JCC_RETURN_IF_ERROR(CheckShape("cache_seqlens", cache_seqlens.dimensions(), {u->batch}));
    u->cache_seqlens = static_cast<const int32_t*>(cache_seqlens.untyped_data());
  }
  if (has_state_indices) {
    JCC_RETURN_IF_ERROR(CheckInt32("conv_state_indices", conv_state_indices));
    JCC_RETURN_IF_ERROR(CheckShape("conv_state_indices", conv_state_indices.dimensions(), {u->batch}));
    u->conv_state_indices = static_cast<const int32_t*>(conv_state_indices.untyped_data());
  }
  JCC_RETURN_IF_ERROR(CheckShape("y", y->dimensions(), Dims(xd)));
  JCC_RETURN_IF_ERROR(CheckSameDType("y", *y, x.element_type()));
  JCC_RETURN_IF_ERROR(CheckShape("new_state", new_state->dimensions(), Dims(sd)));
  JCC_RETURN_IF_ERROR(CheckSameDType("new_state", *new_state, x.element_type()));
  u->x = x.untyped_data();
  u->y = y->untyped_data();
  u->conv_state = new_state->untyped_data();  // the caller copies if not aliased
  return ffi::Error::Success();
}

inline ffi::Error MakeVarlenStatesArgs(VarlenStatesArgs* v, JCC_VARLEN_STATES_PARAMS) {
  auto xd = x.dimensions();
  if (xd.size() != 2) return Invalid("x must have rank 2 (total, dim), got " + ShapeStr(xd));
  JCC_RETURN_IF_ERROR(CheckFloat("x", x, &v->x_dtype));
  JCC_RETURN_IF_ERROR(CheckInt32("cu_seqlens", cu_seqlens));
  auto cd = cu_seqlens.dimensions();
  if (cd.size() != 1 || cd[0] < 1) return Invalid("cu_seqlens must have shape (N+1,), got " + ShapeStr(cd));
  v->total = xd[0], v->dim = xd[1], v->num_seqs = cd[0] - 1;
  v->channels_last = channels_last;
  auto sd = states->dimensions();
  const int64_t sdim = sd.size() == 3 ? (channels_last ? sd[2] : sd[1]) : -1;
  if (sd.size() != 3 || sd[0] != v->num_seqs || sdim != v->dim)
    return Invalid("states has shape " + ShapeStr(sd) + ", expected (" + std::to_string(v->num_seqs) +
                   (channels_last ? ", state_len, " + std::to_string(v->dim)
                                  : ", " + std::to_string(v->dim) + ", state_len") + ")");
  JCC_RETURN_IF_ERROR(CheckSameDType("states", *states, x.element_type()));
  v->state_len = channels_last ? sd[1] : sd[2];
  v->x = x.untyped_data();
  v->cu_seqlens = static_cast<const int32_t*>(cu_seqlens.untyped_data());
  v->states = states->untyped_data();
  return ffi::Error::Success();
}

// Host-readable offsets (CPU only): each of `rows` rows of cu_seqlens starts
// at 0, never decreases and ends at total.
inline ffi::Error CheckOffsetsOnHost(const int32_t* cu, int64_t rows, int64_t n_plus_1,
                                     int64_t total) {
  for (int64_t r = 0; r < rows; ++r, cu += n_plus_1) {
    if (cu[0] != 0) return Invalid("cu_seqlens must start at 0, got " + std::to_string(cu[0]));
    for (int64_t i = 1; i < n_plus_1; ++i)
      if (cu[i] < cu[i - 1]) return Invalid("cu_seqlens must be non-decreasing");
    if (cu[n_plus_1 - 1] != total)
      return Invalid("cu_seqlens must end at the total length " + std::to_string(total) +
                     ", got " + std::to_string(cu[n_plus_1 - 1]));
  }
  return ffi::Error::Success();
}

}  // namespace jcc
