// DLPack (nanobind nb::ndarray) entry points shared by the CPU and CUDA
// modules: torch tensors (or any DLPack producer) become the plain
// descriptions of problem.h.
//
// Each array is presented to the checks of ffi_args.h as an XLA FFI buffer
// (the same rank/shape/dtype view XLA would hand the FFI handlers), so the
// DLPack path validates exactly like the XLA path. What XLA guarantees but
// DLPack does not (device, row-major contiguity, a supported dtype) is checked
// here first. The one exception to contiguity: x may be a strided view whose
// last axis has unit stride (ConvArgs / UpdateArgs / VarlenStatesArgs in
// problem.h), e.g. one half of Mamba's xz, or a (B, L, D) slice of a wider
// tensor. Compact shapes are accepted too (`compact_args`): weight (D, W)
// and bias (D,) for one weight group, and the update's x and y as (B, D)
// for one token; they are presented to the checks with the unit axis added. Errors are Python exceptions: TypeError for dtypes, ValueError
// for everything else, all naming the argument.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ffi_args.h"

namespace jcc::dlpack {

namespace nb = nanobind;
using Array = nb::ndarray<>;
using Opt = std::optional<Array>;

enum class Kind { kFloat, kInt32 };

inline const char* DeviceName(int32_t t) {
  switch (t) {
    case nb::device::cpu::value: return "cpu";
    case nb::device::cuda::value: return "cuda";
    case nb::device::cuda_host::value: return "cuda_host";
    case nb::device::cuda_managed::value: return "cuda_managed";
    case nb::device::rocm::value: return "rocm";
    case nb::device::metal::value: return "metal";
    default: return "unknown";
  }
}

inline std::string DTypeStr(nb::dlpack::dtype t) {
  const char* code = "?";
  switch (nb::dlpack::dtype_code(t.code)) {
    case nb::dlpack::dtype_code::Int: code = "int"; break;
    case nb::dlpack::dtype_code::UInt: code = "uint"; break;
    case nb::dlpack::dtype_code::Float: code = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: code = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: code = "complex"; break;
    case nb::dlpack::dtype_code::Bool: return "bool";
    default: break;
  }
  std::string s = std::string(code) + std::to_string(int(t.bits));
  if (t.lanes != 1) s += "x" + std::to_string(int(t.lanes));
  return s;
}

inline bool ToFfiType(nb::dlpack::dtype t, ffi::DataType* out) {
  if (t.lanes != 1) return false;
  using C = nb::dlpack::dtype_code;
  const C code = C(t.code);
  if (code == C::Float && t.bits == 32) *out = ffi::DataType::F32;
  else if (code == C::Float && t.bits == 16) *out = ffi::DataType::F16;
  else if (code == C::Float && t.bits == 64) *out = ffi::DataType::F64;
  else if (code == C::Bfloat && t.bits == 16) *out = ffi::DataType::BF16;
  else if (code == C::Int && t.bits == 32) *out = ffi::DataType::S32;
  else return false;
  return true;
}

[[noreturn]] inline void ThrowValue(const std::string& msg) {
  throw nb::value_error(("jax_causal_conv: " + msg).c_str());
}
[[noreturn]] inline void ThrowType(const std::string& msg) {
  throw nb::type_error(("jax_causal_conv: " + msg).c_str());
}

// Turns an ffi::Error from the shared checks into a ValueError.
inline void Raise(const ffi::Error& e) {
  if (e.failure()) throw nb::value_error(e.message().c_str());
}

// Where the arrays of one call must live: the device type and, after the
// first array, its id.
struct Placement {
  int32_t device_type;
  int32_t device_id = -1;
};

// One argument as an XLA FFI buffer. Absent optionals become the zero-size
// placeholder the FFI bindings use. Not copyable: AnyBuffer points into it.
class Buf {
 public:
  Buf() { Init(); }
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;

  Buf(const char* name, const Opt& a, Kind kind, Placement* place) {
    Init();
    if (!a.has_value()) return;
    Set(name, *a, kind, place);
  }
  Buf(const char* name, const Array& a, Kind kind, Placement* place, bool strided = false,
      int unit_at = -1) {
    Init();
    Set(name, a, kind, place, strided, unit_at);
  }
  Buf(const char* name, const Opt& a, Kind kind, Placement* place, bool strided, int unit_at) {
    Init();
    if (a.has_value()) Set(name, *a, kind, place, strided, unit_at);
  }

  bool present() const { return present_; }
  ffi::AnyBuffer any() const { return ffi::AnyBuffer(&raw_); }
  ffi::Result<ffi::AnyBuffer> result() const { return ffi::Result<ffi::AnyBuffer>(any()); }
  ffi::DataType type() const { return ffi::DataType(raw_.dtype); }
  void* data() const { return raw_.data; }

 private:
  void Init() {
    raw_.struct_size = XLA_FFI_Buffer_STRUCT_SIZE;
    raw_.extension_start = nullptr;
    raw_.dtype = XLA_FFI_DataType_F32;
    raw_.data = nullptr;
    raw_.rank = 1;
    dims_[0] = 0;
    raw_.dims = dims_;
  }

  // unit_at >= 0: present the array with a unit axis inserted there.
  void Set(const char* name, const Array& a, Kind kind, Placement* place, bool strided = false,
           int unit_at = -1) {
    const int32_t dev = a.device_type();
    if (dev != place->device_type)
      ThrowValue(std::string(name) + " is on device '" + DeviceName(dev) + "', expected '" +
                 DeviceName(place->device_type) + "'");
    if (place->device_id < 0) {
      place->device_id = a.device_id();
    } else if (a.device_id() != place->device_id) {
      ThrowValue(std::string(name) + " is on device " + DeviceName(dev) + ":" +
                 std::to_string(a.device_id()) + ", the other arguments on " + DeviceName(dev) +
                 ":" + std::to_string(place->device_id));
    }
    ffi::DataType t;
    const bool known = ToFfiType(a.dtype(), &t);
    if (kind == Kind::kFloat && (!known || t == ffi::DataType::S32))
      ThrowType(std::string(name) + " must be float32, float16, bfloat16 or float64, got " +
                DTypeStr(a.dtype()));
    if (kind == Kind::kInt32 && (!known || t != ffi::DataType::S32))
      ThrowType(std::string(name) + " must be int32, got " + DTypeStr(a.dtype()));
    const size_t rank = a.ndim();
    if (rank > kMaxRank)
      ThrowValue(std::string(name) + " has rank " + std::to_string(rank) + ", at most " +
                 std::to_string(kMaxRank) + " expected");
    // Row-major contiguity (strided: only a unit last axis and non-negative
    // strides); strides of size-1 axes do not matter, nor do any strides of
    // an empty array.
    int64_t count = 1;
    for (size_t i = 0; i < rank; ++i) count *= int64_t(a.shape(i));
    if (count > 0) {
      int64_t expect = 1;
      for (size_t i = rank; i-- > 0;) {
        const int64_t n = int64_t(a.shape(i));
        const bool ok = strided ? (i + 1 < rank ? a.stride(i) >= 0 : a.stride(i) == 1)
                                : a.stride(i) == expect;
        if (n != 1 && !ok) {
          std::string shape = "(", strides = "(";
          for (size_t j = 0; j < rank; ++j) {
            shape += (j ? ", " : "") + std::to_string(a.shape(j));
            strides += (j ? ", " : "") + std::to_string(a.stride(j));
          }
          ThrowValue(std::string(name) + (strided ? " must have a unit-stride last axis" : " must be contiguous") +
                     ": shape " + shape + ") has strides " + strides + ") (in elements)");
        }
        expect *= n;
      }
    }
    size_t n = 0;
    for (size_t i = 0; i < rank; ++i) {
      if (int(i) == unit_at) dims_[n++] = 1;
      dims_[n++] = int64_t(a.shape(i));
    }
    if (unit_at == int(rank)) dims_[n++] = 1;
    raw_.rank = int64_t(n);
    raw_.dtype = static_cast<XLA_FFI_DataType>(t);
    raw_.data = const_cast<void*>(a.data());
    present_ = true;
  }

  static constexpr size_t kMaxRank = 4;
  int64_t dims_[kMaxRank + 1];
  XLA_FFI_Buffer raw_;
  bool present_ = false;
};

// Where a compact argument gets its unit axis: weight (D, W) and bias (D,)
// become (1, D, W) and (1, D); other ranks pass as they are.
inline int GroupAxis(const Array& a, size_t full_rank) { return a.ndim() + 1 == full_rank ? 0 : -1; }
inline int GroupAxis(const Opt& a, size_t full_rank) {
  return a.has_value() ? GroupAxis(*a, full_rank) : -1;
}

// Records x's strides in a when x is not dense (rank 3, last axis unit stride).
inline void SetXStrides(ConvArgs* a, const Array& x) {
  if (x.ndim() != 3) return;
  const int64_t n1 = int64_t(x.shape(1)), n2 = int64_t(x.shape(2));
  if (x.shape(0) > 1 && x.stride(0) != n1 * n2) a->x_batch_stride = x.stride(0);
  if (n1 > 1 && x.stride(1) != n2) a->x_row_stride = x.stride(1);
}

inline void SameType(const char* name, const Buf& b, const Buf& x) {
  if (b.present() && b.type() != x.type())
    ThrowType(std::string(name) + " must have the dtype of x");
}

// --- argument lists, as the FFI bindings of ffi_args.h have them -------------

#define JCC_DLPACK_FWD_PARAMS                                                               \
  const Array &x, const Array &weight, const Opt &bias, const Opt &residual,              \
      const Opt &seq_idx, const Opt &cu_seqlens, const Opt &initial_states, const Array &y, \
      const Opt &final_states, int64_t activation, int64_t mode, bool channels_last,        \
      bool states_channels_last
#define JCC_DLPACK_FWD_NAMES                                                                \
  x, weight, bias, residual, seq_idx, cu_seqlens, initial_states, y, final_states,          \
      activation, mode, channels_last, states_channels_last
#define JCC_DLPACK_FWD_ARGS                                                                 \
  nb::arg("x"), nb::arg("weight"), nb::arg("bias").none(), nb::arg("residual").none(),      \
      nb::arg("seq_idx").none(), nb::arg("cu_seqlens").none(),                              \
      nb::arg("initial_states").none(), nb::arg("y"), nb::arg("final_states").none(),       \
      nb::arg("activation"), nb::arg("mode"), nb::arg("channels_last"),                     \
      nb::arg("states_channels_last")

#define JCC_DLPACK_BWD_PARAMS                                                               \
  const Array &x, const Array &weight, const Opt &bias, const Opt &seq_idx,                \
      const Opt &cu_seqlens, const Opt &initial_states, const Array &dy,                    \
      const Opt &dfinal_states, const Array &dx, const Array &dweight, const Opt &dbias,    \
      const Opt &dinitial_states, int64_t activation, int64_t mode, bool channels_last,     \
      bool states_channels_last
#define JCC_DLPACK_BWD_NAMES                                                                \
  x, weight, bias, seq_idx, cu_seqlens, initial_states, dy, dfinal_states, dx, dweight,     \
      dbias, dinitial_states, activation, mode, channels_last, states_channels_last
#define JCC_DLPACK_BWD_ARGS                                                                 \
  nb::arg("x"), nb::arg("weight"), nb::arg("bias").none(), nb::arg("seq_idx").none(),       \
      nb::arg("cu_seqlens").none(), nb::arg("initial_states").none(), nb::arg("dy"),        \
      nb::arg("dfinal_states").none(), nb::arg("dx"), nb::arg("dweight"),                   \
      nb::arg("dbias").none(), nb::arg("dinitial_states").none(), nb::arg("activation"),    \
      nb::arg("mode"), nb::arg("channels_last"), nb::arg("states_channels_last")

#define JCC_DLPACK_UPDATE_PARAMS                                                            \
  const Array &x, const Array &conv_state, const Array &weight, const Opt &bias,           \
      const Opt &cache_seqlens, const Opt &conv_state_indices, const Array &y,              \
      int64_t activation, bool channels_last
#define JCC_DLPACK_UPDATE_NAMES \
  x, conv_state, weight, bias, cache_seqlens, conv_state_indices, y, activation, channels_last
#define JCC_DLPACK_UPDATE_ARGS                                                              \
  nb::arg("x"), nb::arg("conv_state"), nb::arg("weight"), nb::arg("bias").none(),           \
      nb::arg("cache_seqlens").none(), nb::arg("conv_state_indices").none(), nb::arg("y"),  \
      nb::arg("activation"), nb::arg("channels_last") = false

#define JCC_DLPACK_VARLEN_STATES_PARAMS \
  const Array &x, const Array &cu_seqlens, const Array &states, bool channels_last
#define JCC_DLPACK_VARLEN_STATES_NAMES x, cu_seqlens, states, channels_last
#define JCC_DLPACK_VARLEN_STATES_ARGS \
  nb::arg("x"), nb::arg("cu_seqlens"), nb::arg("states"), nb::arg("channels_last") = false

// --- translation ---------------------------------------------------------------

// The problem of forward and backward without outputs (for workspace sizing).
inline ConvArgs ProblemArgs(int32_t device_type, const Array& x, const Array& weight,
                            const Opt& bias, const Opt& seq_idx, const Opt& cu_seqlens,
                            const Opt& initial_states, int64_t activation, int64_t mode,
                            bool channels_last, bool states_channels_last) {
  Placement p{device_type};
  Buf bx("x", x, Kind::kFloat, &p, /*strided=*/true),
      bw("weight", weight, Kind::kFloat, &p, false, GroupAxis(weight, 3)),
      bb("bias", bias, Kind::kFloat, &p, false, GroupAxis(bias, 2)),
      bs("seq_idx", seq_idx, Kind::kInt32, &p), bc("cu_seqlens", cu_seqlens, Kind::kInt32, &p),
      bi("initial_states", initial_states, Kind::kFloat, &p);
  SameType("initial_states", bi, bx);
  ConvArgs a;
  Raise(MakeConvProblem(&a, bx.any(), bw.any(), bb.any(), bs.any(), bc.any(), bi.any(),
                        activation, mode, channels_last, states_channels_last, bb.present(),
                        bi.present()));
  return a;
}

inline ConvArgs ForwardArgs(int32_t device_type, JCC_DLPACK_FWD_PARAMS) {
  Placement p{device_type};
  Buf bx("x", x, Kind::kFloat, &p, /*strided=*/true),
      bw("weight", weight, Kind::kFloat, &p, false, GroupAxis(weight, 3)),
      bb("bias", bias, Kind::kFloat, &p, false, GroupAxis(bias, 2)),
      br("residual", residual, Kind::kFloat, &p),
      bs("seq_idx", seq_idx, Kind::kInt32, &p), bc("cu_seqlens", cu_seqlens, Kind::kInt32, &p),
      bi("initial_states", initial_states, Kind::kFloat, &p), by("y", y, Kind::kFloat, &p),
      bf("final_states", final_states, Kind::kFloat, &p);
  SameType("residual", br, bx);
  SameType("initial_states", bi, bx);
  SameType("y", by, bx);
  SameType("final_states", bf, bx);
  ConvArgs a;
  Raise(MakeForwardArgs(&a, bx.any(), bw.any(), bb.any(), br.any(), bs.any(), bc.any(), bi.any(),
                        by.result(), bf.result(), activation, mode, channels_last,
                        states_channels_last, bb.present(), br.present(), bi.present(),
                        bf.present()));
  SetXStrides(&a, x);
  return a;
}

inline ConvArgs BackwardArgs(int32_t device_type, JCC_DLPACK_BWD_PARAMS) {
  Placement p{device_type};
  Buf bx("x", x, Kind::kFloat, &p, /*strided=*/true),
      bw("weight", weight, Kind::kFloat, &p, false, GroupAxis(weight, 3)),
      bb("bias", bias, Kind::kFloat, &p, false, GroupAxis(bias, 2)),
      bs("seq_idx", seq_idx, Kind::kInt32, &p), bc("cu_seqlens", cu_seqlens, Kind::kInt32, &p),
      bi("initial_states", initial_states, Kind::kFloat, &p), bdy("dy", dy, Kind::kFloat, &p),
      bdf("dfinal_states", dfinal_states, Kind::kFloat, &p), bdx("dx", dx, Kind::kFloat, &p),
      bdw("dweight", dweight, Kind::kFloat, &p, false, GroupAxis(dweight, 3)),
      bdb("dbias", dbias, Kind::kFloat, &p, false, GroupAxis(dbias, 2)),
      bdi("dinitial_states", dinitial_states, Kind::kFloat, &p);
  SameType("initial_states", bi, bx);
  SameType("dy", bdy, bx);
  SameType("dfinal_states", bdf, bx);
  SameType("dx", bdx, bx);
  SameType("dinitial_states", bdi, bx);
  if (bdw.type() != bw.type()) ThrowType("dweight must have the dtype of weight");
  if (bb.present() && !bdb.present()) ThrowValue("dbias is required when bias is given");
  if (bb.present() && bdb.type() != bb.type()) ThrowType("dbias must have the dtype of bias");
  if (bi.present() && !bdi.present())
    ThrowValue("dinitial_states is required when initial_states is given");
  ConvArgs a;
  Raise(MakeBackwardArgs(&a, bx.any(), bw.any(), bb.any(), bs.any(), bc.any(), bi.any(),
                         bdy.any(), bdf.any(), bdx.result(), bdw.result(), bdb.result(),
                         bdi.result(), activation, mode, channels_last, states_channels_last,
                         bb.present(), bi.present(), bdf.present()));
  SetXStrides(&a, x);
  return a;
}

// In place: conv_state is both the input and the output state. x and y may
// be (B, D) for one token; x may be strided.
inline UpdateArgs UpdateArgsOf(int32_t device_type, JCC_DLPACK_UPDATE_PARAMS) {
  Placement p{device_type};
  const int token_axis = x.ndim() == 2 ? (channels_last ? 1 : 2) : -1;
  Buf bx("x", x, Kind::kFloat, &p, /*strided=*/true, token_axis),
      bs("conv_state", conv_state, Kind::kFloat, &p),
      bw("weight", weight, Kind::kFloat, &p, false, GroupAxis(weight, 3)),
      bb("bias", bias, Kind::kFloat, &p, false, GroupAxis(bias, 2)),
      bc("cache_seqlens", cache_seqlens, Kind::kInt32, &p),
      bi("conv_state_indices", conv_state_indices, Kind::kInt32, &p),
      by("y", y, Kind::kFloat, &p, false, y.ndim() == 2 ? (channels_last ? 1 : 2) : -1);
  SameType("conv_state", bs, bx);
  SameType("y", by, bx);
  UpdateArgs u;
  Raise(MakeUpdateArgs(&u, bx.any(), bs.any(), bw.any(), bb.any(), bc.any(), bi.any(), by.result(),
                       bs.result(), activation, bb.present(), bc.present(), bi.present(),
                       channels_last));
  // x's strides, in the (B, D, S) / (B, S, D) view the kernels index
  if (x.ndim() == 2) {
    if (x.shape(0) > 1 && x.stride(0) != u.dim) u.x_batch_stride = x.stride(0);
  } else if (x.ndim() == 3) {
    const int64_t n1 = int64_t(x.shape(1)), n2 = int64_t(x.shape(2));
    if (x.shape(0) > 1 && x.stride(0) != n1 * n2) u.x_batch_stride = x.stride(0);
    if (n1 > 1 && x.stride(1) != n2) u.x_row_stride = x.stride(1);
  }
  return u;
}

inline VarlenStatesArgs VarlenStatesArgsOf(int32_t device_type, JCC_DLPACK_VARLEN_STATES_PARAMS) {
  Placement p{device_type};
  Buf bx("x", x, Kind::kFloat, &p, /*strided=*/true), bc("cu_seqlens", cu_seqlens, Kind::kInt32, &p),
      bs("states", states, Kind::kFloat, &p);
  SameType("states", bs, bx);
  VarlenStatesArgs v;
  Raise(MakeVarlenStatesArgs(&v, bx.any(), bc.any(), bs.result(), channels_last));
  if (x.ndim() == 2 && x.shape(0) > 1 && x.stride(0) != int64_t(x.shape(1))) v.x_row_stride = x.stride(0);
  return v;
}

}  // namespace jcc::dlpack
