// Internal: the one dtype switch that every backend's kernels dispatch through, on the host and
// on the device. The cases come from MT_FORALL_DTYPES: a new dtype is dispatched without a line
// here. A backend says which C++ type holds each dtype (Storage: the CPU's DTypeTraits, the CUDA
// backend's DeviceStorage with CUDA's own __half and __nv_bfloat16) and what a dtype outside the
// op's set does (an error naming the op on the host, nothing on the device, where the host's
// checks already ruled it out).
#pragma once

#include "backend/host_device.h"
#include "mantissa/core/dtype.h"

namespace mantissa::backend {

// The storage type S, passed as a value: f(Tag<S>{}), S = decltype(tag)::type.
template <typename S>
struct Tag {
  using type = S;
};

// Which dtypes an op accepts: all of them, or the rows of kind Float.
enum class DTypeSet { All, Float };

// f(Tag<Storage<D>::type>{}) for the dtype D that `dtype` is, if D is in `Set`; otherwise().
// Every call must return the same type (otherwise() too: an error path returns a value of it).
// The pragma lets nvcc instantiate it for host-only or device-only callables alike.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <DTypeSet Set, template <DType> class Storage, typename F, typename Otherwise>
MT_HOST_DEVICE decltype(auto) switch_dtype(DType dtype, F&& f, Otherwise&& otherwise) {
  switch (dtype) {
#define MT_SWITCH_DTYPE_CASE(e, name, T, C, kind, ...)                           \
  case DType::e:                                                                 \
    if constexpr (Set == DTypeSet::All || DTypeKind::kind == DTypeKind::Float) { \
      return f(Tag<typename Storage<DType::e>::type>{});                         \
    }                                                                            \
    break;
    MT_FORALL_DTYPES(MT_SWITCH_DTYPE_CASE)
#undef MT_SWITCH_DTYPE_CASE
  }
  return otherwise();
}

}  // namespace mantissa::backend
