// Internal: the oneDNN plumbing of the CPU's GEMM (dnnl_matmul.cpp) and convolution
// (dnnl_conv.cpp), in dnnl_support.cpp. oneDNN 2.6 runs f32 everywhere and bf16 (bf16 inputs,
// fp32 accumulation) from AVX-512 on; the dtypes it lacks are handled by the callers:
//   - bf16 on a CPU below AVX-512 (AVX2: oneDNN 2.6 has no bf16 convolution there and only its
//     reference matmul) runs as f16 does below;
//   - f16 and fp8 are emulated exactly: the inputs are widened to f32 (exact), the f32 kernel
//     runs, and the fp32 result is rounded once (RNE) into the output's dtype — what a tensor
//     core computes;
//   - MatmulOptions::input_rounding (tf32) rounds copies of the inputs onto that grid first;
//   - f64, the test suite's reference path, runs on plain loops beside each primitive.
//
// Primitives are built once per (shapes, strides, dtypes, bias) and kept in a bounded LRU cache
// beside one engine and one stream per thread. Scratchpads are in user mode, served from a
// per-thread grow-only buffer, so a warm call allocates nothing but its output (and the
// layout-converted copies a convolution may need).
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "mantissa/core/error.h"

namespace mantissa::backend::cpu::onednn {

using dnnl::memory;
using mdt = memory::data_type;
using tag = memory::format_tag;

// ---- engine, stream, scratchpad -----------------------------------------------------------------

// The one CPU engine (oneDNN's dispatch capped by MANTISSA_ISA first, as Mantissa's kernels are).
dnnl::engine& engine();
// Whether oneDNN has bf16 kernels on this CPU (under the cap): from AVX-512 on, native
// (avx512_bf16) or emulated in fp32 by oneDNN itself.
bool dnnl_has_bf16();
// This thread's stream (oneDNN streams are not meant to be shared between threads).
dnnl::stream& stream();
// This thread's grow-only scratchpad, at least `bytes` long.
void* scratch_buffer(size_t bytes);
// Attributes with user-mode scratchpads: every primitive is built with them.
dnnl::primitive_attr user_scratchpad();
// Whether oneDNN has only its reference loops for a primitive (its implementation's name).
bool is_reference(const dnnl::primitive_desc& pd);
// oneDNN's type of a dtype it computes natively (f32, bf16); an internal error for the others.
mdt dnnl_type(DType d);

// ---- primitive cache ----------------------------------------------------------------------------

// One argument of a primitive: the user's memory and, when the primitive wants another layout,
// the reorder between the two (user -> primitive for inputs, back for outputs).
struct ArgPlan {
  int arg = 0;
  bool output = false;
  memory::desc user_md;
  memory::desc prim_md;
  std::optional<dnnl::reorder> reorder;
  memory::desc reorder_scratch_md;
};

// A built primitive, the plans of its arguments (in the order execute() takes their pointers)
// and its scratchpad.
struct Entry {
  dnnl::primitive prim;
  memory::desc scratch_md;
  std::vector<ArgPlan> args;
  size_t scratch_bytes = 0;  // the largest scratchpad of the primitive and its reorders
  bool rejected = false;     // matmul: only the reference kernel takes these strides; copy first
};

// A cache key: the bytes of the values that define a primitive.
class Key {
 public:
  Key() { s_.reserve(256); }  // a matmul's key is ~170 bytes: one allocation, not five
  Key& add(int64_t v) {
    s_.append(reinterpret_cast<const char*>(&v), sizeof v);
    return *this;
  }
  Key& add(const memory::dims& d) {
    add(int64_t(d.size()));
    for (int64_t v : d)
      add(v);
    return *this;
  }
  const std::string& str() const { return s_; }

 private:
  std::string s_;
};

// The entry under `key`, built by make() if the cache has none. Built outside the cache's lock:
// two threads may build the same entry once each; one is kept.
std::shared_ptr<const Entry> find_entry(const Key& key);
void keep_entry(const Key& key, std::shared_ptr<const Entry> e);
template <typename Make>
std::shared_ptr<const Entry> cached(const Key& key, Make make) {
  if (auto e = find_entry(key)) return e;
  auto e = std::make_shared<const Entry>(make());
  keep_entry(key, e);
  return e;
}

// The plan of argument `arg`, with a reorder where the user's layout is not the primitive's.
ArgPlan plan_arg(int arg, bool output, const memory::desc& user, const memory::desc& prim);
// The plan of e's argument `arg`, or null.
const ArgPlan* find_arg(const Entry& e, int arg);
// Sets e.scratch_bytes once its primitive and arguments are planned.
void finish_entry(Entry& e);

// An input the caller has already reordered into the primitive's layout (one copy serving two
// primitives that want the same layout): execute passes it as it is.
struct Staged {
  int arg = -1;
  const void* prim = nullptr;
};

// The input `arg` of e, reordered from the user's memory into the primitive's layout, in a
// tensor of its own; for an argument whose layouts differ (ArgPlan::reorder).
Tensor stage(const Entry& e, int arg, const void* user);
// Runs an entry on user pointers given in the order of e.args (through the C API on a stack
// array of arguments: the C++ API's unordered_map costs a heap node per argument).
void execute(const Entry& e, std::initializer_list<const void*> ptrs, Staged staged = {});

// oneDNN reports a configuration it cannot run with dnnl::error; ours to fix, so internal.
template <typename F>
void with_dnnl(const char* what, F f) {
  try {
    f();
  } catch (const dnnl::error& e) {
    MT_ASSERT(false, "oneDNN ", what, " failed: ", e.what(), " (status ", int(e.status), ")");
  }
}

// ---- operands -----------------------------------------------------------------------------------

// A contiguous copy of t in dtype `to`.
Tensor converted(CpuBackend& be, const Tensor& t, DType to);
// t in dtype `to`: t itself (any strides) when it already is, else a contiguous converted copy.
// Rounding onto a narrower grid (tf32) applies to f32 operands and always copies.
Tensor prepare(CpuBackend& be, const Tensor& t, DType to, Format rounding);
// The dtype the oneDNN kernel computes in: bf16 natively where oneDNN has bf16 kernels and no
// narrower rounding is asked for, f32 otherwise (f32 itself, f16, fp8).
DType kernel_dtype(DType d, Format rounding);
// Whether oneDNN can write this output dtype directly for a kernel computing in `kd`.
bool native_output(DType out, DType kd);
// Whether the plain f64 loops have work enough for the OpenMP threads (and are not inside them).
bool worth_threads(int64_t work);
// t as a contiguous f64 tensor (itself when it is one).
Tensor as_f64(CpuBackend& be, const Tensor& t);

}  // namespace mantissa::backend::cpu::onednn
