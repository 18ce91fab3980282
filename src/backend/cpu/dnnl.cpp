// CPU GEMM and convolution. oneDNN 2.6 runs f32 everywhere and bf16 (bf16 inputs, fp32
// accumulation) from AVX-512 on; the dtypes it lacks are handled here:
//   - bf16 on a CPU below AVX-512 (AVX2: oneDNN 2.6 has no bf16 convolution there and only its
//     reference matmul) runs as f16 does below;
//   - f16 and fp8 are emulated exactly: the inputs are widened to f32 (exact), the f32 kernel
//     runs, and the fp32 result is rounded once (RNE) into the output's dtype — what a tensor
//     core computes;
//   - MatmulOptions::input_rounding (tf32) rounds copies of the inputs onto that grid first;
//   - f64, the test suite's reference path, runs on the plain loops at the end of this file.
//
// Primitives are built once per (shapes, strides, dtypes, bias) and kept in a bounded LRU cache
// beside one engine and one stream per thread. Scratchpads are in user mode, served from a
// per-thread grow-only buffer, so a warm call allocates nothing but its output (and the
// layout-converted copies a convolution may need).
#include <omp.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/dtype_map.h"
#include "mantissa/core/cpu.h"
#include "mantissa/core/error.h"
#include "mantissa/core/warning.h"

namespace mantissa::backend::cpu {
namespace {

using dnnl::memory;
using mdt = memory::data_type;
using tag = memory::format_tag;

// ---- engine, stream, scratchpad -----------------------------------------------------------------

// oneDNN dispatches on the CPU it finds; MANTISSA_ISA (mantissa/core/cpu.h) caps it as it caps
// Mantissa's own kernels, so the fallbacks of a smaller CPU can be tested on a larger one. The
// cap must come before oneDNN's first primitive, hence here.
void cap_dnnl_isa() {
  const CpuFeatures& f = cpu_features();
  if (f.avx512_core()) return;
  // Refused (status) only once oneDNN has dispatched, which cannot have happened yet.
  dnnl_set_max_cpu_isa(f.avx2 ? dnnl_cpu_isa_avx2 : dnnl_cpu_isa_sse41);
}

dnnl::engine& engine() {
  static auto* e = [] {
    cap_dnnl_isa();
    return new dnnl::engine(dnnl::engine::kind::cpu, 0);  // outlives every primitive
  }();
  return *e;
}

// Whether oneDNN has bf16 kernels on this CPU (under the cap above): from AVX-512 on, native
// (avx512_bf16) or emulated in fp32 by oneDNN itself.
bool dnnl_has_bf16() {
  static const bool has = [] {
    engine();  // the cap first
    const auto isa = unsigned(dnnl::get_effective_cpu_isa());
    const auto core = unsigned(dnnl::cpu_isa::avx512_core);
    return (isa & core) == core;
  }();
  return has;
}

// oneDNN streams are not meant to be shared between threads; a CPU stream is cheap.
dnnl::stream& stream() {
  thread_local dnnl::stream s(engine());
  return s;
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// Grow-only per thread: primitives of one thread run one after another, so one buffer serves
// them all and a warm loop never allocates a scratchpad. It is oneDNN's working memory, outside
// the tensor allocator's statistics (like its JIT code).
void* scratch_buffer(size_t bytes) {
  thread_local std::unique_ptr<void, FreeDeleter> buffer;
  thread_local size_t capacity = 0;
  if (bytes > capacity) {
    const size_t rounded = (bytes + 4095) / 4096 * 4096;
    buffer.reset();
    capacity = 0;
    buffer.reset(std::aligned_alloc(4096, rounded));
    MT_CHECK(buffer != nullptr, "out of host memory: could not allocate a ", bytes,
             "-byte oneDNN scratchpad");
    capacity = rounded;
  }
  return buffer.get();
}

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// oneDNN's type of each dtype this backend hands it. oneDNN 2.6 computes f16 only on CPUs with
// AVX512-FP16, and fp8 not at all: those are emulated exactly on f32 copies (see the top), as
// f64 runs on the plain loops at the end of this file.
constexpr DTypeMapRow<mdt> kDnnlTypes[] = {
    {DType::F64, kUnsupported},  {DType::F32, mdt::f32},          {DType::F16, kUnsupported},
    {DType::BF16, mdt::bf16},    {DType::FP8_E4M3, kUnsupported}, {DType::FP8_E5M2, kUnsupported},
    {DType::I64, kUnsupported},  {DType::I32, kUnsupported},      {DType::U8, kUnsupported},
    {DType::Bool, kUnsupported},
};
static_assert(dtype_map_complete<kDnnlTypes>());

mdt dnnl_type(DType d) {
  const std::optional<mdt> t = dtype_map_lookup(kDnnlTypes, d);
  MT_ASSERT(t.has_value(), "no oneDNN type for ", dtype_name(d));
  return t.value_or(mdt::undef);
}

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

struct Entry {
  dnnl::primitive prim;
  memory::desc scratch_md;
  std::vector<ArgPlan> args;
  size_t scratch_bytes = 0;  // the largest scratchpad of the primitive and its reorders
  bool rejected = false;     // matmul: only the reference kernel takes these strides; copy first
};

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

class PrimitiveCache {
 public:
  static constexpr size_t kCapacity = 512;

  std::shared_ptr<const Entry> find(const std::string& key) {
    std::lock_guard lock(mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    items_.splice(items_.begin(), items_, it->second);
    return it->second->second;
  }

  void insert(const std::string& key, std::shared_ptr<const Entry> e) {
    std::lock_guard lock(mu_);
    if (index_.count(key)) return;
    items_.emplace_front(key, std::move(e));
    index_[key] = items_.begin();
    if (items_.size() > kCapacity) {
      index_.erase(items_.back().first);
      items_.pop_back();  // a caller still running it holds its own shared_ptr
    }
  }

 private:
  std::mutex mu_;
  std::list<std::pair<std::string, std::shared_ptr<const Entry>>> items_;
  std::unordered_map<std::string, decltype(items_)::iterator> index_;
};

PrimitiveCache& cache() {
  static auto* c = new PrimitiveCache();
  return *c;
}

// Built outside the lock: two threads may build the same entry once each; one is kept.
template <typename Make>
std::shared_ptr<const Entry> cached(const Key& key, Make make) {
  if (auto e = cache().find(key.str())) return e;
  auto e = std::make_shared<const Entry>(make());
  cache().insert(key.str(), e);
  return e;
}

ArgPlan plan_arg(int arg, bool output, const memory::desc& user, const memory::desc& prim) {
  ArgPlan p{arg, output, user, prim, std::nullopt, memory::desc()};
  if (!(user == prim)) {
    const dnnl::reorder::primitive_desc pd =
        output ? dnnl::reorder::primitive_desc(engine(), prim, engine(), user, user_scratchpad())
               : dnnl::reorder::primitive_desc(engine(), user, engine(), prim, user_scratchpad());
    p.reorder = dnnl::reorder(pd);
    p.reorder_scratch_md = pd.scratchpad_desc();
  }
  return p;
}

void finish_entry(Entry& e) {
  e.scratch_bytes = e.scratch_md.get_size();
  for (const ArgPlan& a : e.args) {
    e.scratch_bytes = std::max(e.scratch_bytes, a.reorder_scratch_md.get_size());
  }
}

// Runs a primitive through the C API on a stack array of arguments: the C++ API's
// unordered_map costs a heap node per argument, which showed in the per-op profile of small
// GEMMs (tools/bench/dispatch_compare.py).
constexpr int kMaxArgs = 6;

struct ArgList {
  std::array<dnnl_exec_arg_t, kMaxArgs> a{};
  int n = 0;
  void add(int arg, const memory& m) {
    MT_ASSERT(n < kMaxArgs, "too many primitive arguments");
    a[size_t(n++)] = {arg, m.get()};
  }
  void run(const dnnl::primitive& p, dnnl::stream& s) const {
    dnnl::error::wrap_c_api(dnnl_primitive_execute(p.get(), s.get(), n, a.data()),
                            "could not execute a primitive");
  }
};

// Runs an argument's reorder between the user's layout and the primitive's.
void run_reorder(const ArgPlan& a, const memory& from, const memory& to, void* scratch) {
  ArgList r;
  r.add(DNNL_ARG_FROM, from);
  r.add(DNNL_ARG_TO, to);
  memory rs;
  if (a.reorder_scratch_md.get_size()) {
    rs = memory(a.reorder_scratch_md, engine(), scratch);
    r.add(DNNL_ARG_SCRATCHPAD, rs);
  }
  r.run(*a.reorder, stream());
}

const ArgPlan* find_arg(const Entry& e, int arg) {
  for (const ArgPlan& a : e.args) {
    if (a.arg == arg) return &a;
  }
  return nullptr;
}

// An input the caller has already reordered into the primitive's layout (one copy serving two
// primitives that want the same layout): execute passes it as it is.
struct Staged {
  int arg = -1;
  const void* prim = nullptr;
};

// The input `arg` of e, reordered from the user's memory into the primitive's layout, in a
// tensor of its own; for an argument whose layouts differ (ArgPlan::reorder).
Tensor stage(const Entry& e, int arg, const void* user) {
  const ArgPlan* a = find_arg(e, arg);
  MT_ASSERT(a && a->reorder && !a->output, "stage: argument ", arg, " has no input reorder");
  Tensor t = Tensor::empty({int64_t(a->prim_md.get_size())}, DType::U8);
  const size_t scratch = a->reorder_scratch_md.get_size();
  run_reorder(*a, memory(a->user_md, engine(), const_cast<void*>(user)),
              memory(a->prim_md, engine(), t.data_ptr()),
              scratch ? scratch_buffer(scratch) : nullptr);
  return t;  // the stream runs in order: the primitives given t run after this reorder
}

// Runs an entry on user pointers given in the order of e.args.
void execute(const Entry& e, std::initializer_list<const void*> ptrs, Staged staged = {}) {
  MT_ASSERT(ptrs.size() == e.args.size() && ptrs.size() < size_t(kMaxArgs),
            "primitive argument count");
  dnnl::stream& s = stream();
  void* scratch = e.scratch_bytes ? scratch_buffer(e.scratch_bytes) : nullptr;
  // The memory objects must outlive the calls that name them.
  std::array<memory, kMaxArgs> users, prims;
  std::array<Tensor, kMaxArgs> staging;  // the primitive-layout copies, alive until the end
  memory scratch_arg;
  ArgList args;
  auto p = ptrs.begin();
  for (size_t i = 0; i < e.args.size(); ++i) {
    const ArgPlan& a = e.args[i];
    users[i] = memory(a.user_md, engine(), const_cast<void*>(*p++));
    if (!a.reorder) {
      args.add(a.arg, users[i]);
      continue;
    }
    if (a.arg == staged.arg && !a.output) {
      prims[i] = memory(a.prim_md, engine(), const_cast<void*>(staged.prim));
    } else {
      staging[i] = Tensor::empty({int64_t(a.prim_md.get_size())}, DType::U8);
      prims[i] = memory(a.prim_md, engine(), staging[i].data_ptr());
      if (!a.output) run_reorder(a, users[i], prims[i], scratch);
    }
    args.add(a.arg, prims[i]);
  }
  if (e.scratch_md.get_size()) {
    scratch_arg = memory(e.scratch_md, engine(), scratch);
    args.add(DNNL_ARG_SCRATCHPAD, scratch_arg);
  }
  args.run(e.prim, s);
  for (size_t i = 0; i < e.args.size(); ++i) {
    const ArgPlan& a = e.args[i];
    if (a.reorder && a.output) run_reorder(a, prims[i], users[i], scratch);
  }
  s.wait();
}

// ---- operands -----------------------------------------------------------------------------------

Tensor converted(CpuBackend& be, const Tensor& t, DType to) {
  Tensor c = Tensor::empty(t.shape(), to, t.device());
  be.copy(t, c);
  return c;
}

// t in dtype `to`: t itself (any strides) when it already is, else a contiguous converted copy.
// Rounding onto a narrower grid (tf32) applies to f32 operands and always copies.
Tensor prepare(CpuBackend& be, const Tensor& t, DType to, Format rounding) {
  const bool round = rounding != Format::FP32 && to == DType::F32;
  if (t.dtype() == to && !round) return t;
  Tensor c = converted(be, t, to);
  if (round) be.round_to_format(c, rounding);
  return c;
}

// The dtype the oneDNN kernel computes in: a dtype of kDnnlTypes natively (bf16: its values are
// already on the fp32, tf32 and bf16 grids), everything else (f16, fp8, bf16 under a narrower
// rounding, bf16 where oneDNN has no bf16 kernels) in f32.
DType kernel_dtype(DType d, Format rounding) {
  if (d == DType::BF16 && !dnnl_has_bf16()) {
    static const bool told = [] {  // once per process, not a message built per GEMM
      warn("bf16:emulated:cpu",
           "this CPU has no AVX-512, where oneDNN's bf16 kernels start: bf16 GEMMs and "
           "convolutions run in fp32 on the widened inputs, rounded once (the same results and "
           "bf16's memory saving, without its speed-up); --precision auto picks fp16 here");
      return true;
    }();
    (void)told;
    return DType::F32;
  }
  return dtype_map_lookup(kDnnlTypes, d) && takes_rounding(d, rounding) ? d : DType::F32;
}

// Whether oneDNN can write this output dtype directly for a kernel computing in `kd`.
bool native_output(DType out, DType kd) {
  return out == DType::F32 || out == kd;
}

// ---- matmul through oneDNN ----------------------------------------------------------------------

// The dims and strides of a (batch, rows, cols) operand for oneDNN's optimized matmul: each
// matrix row- or column-major (unit stride on one side, leading dimension at least the other
// side), batches not overlapping; a broadcast batch (size 1 or stride 0) becomes batch 1.
// Returns false when the layout needs a copy. Strides of size-1 dims are normalized so that a
// vector is always one of the two plain layouts.
bool plain_layout(const Tensor& t, memory::dims& dims, memory::dims& strides) {
  const int64_t rows = t.size(1), cols = t.size(2);
  const int64_t nb = t.size(0) == 1 || t.stride(0) == 0 ? 1 : t.size(0);
  int64_t sr = t.stride(1), sc = t.stride(2);
  if (rows == 1) sr = sc == 1 ? cols : 1;
  if (cols == 1) sc = sr == 1 ? rows : 1;
  const bool row_major = sc == 1 && sr >= cols, col_major = sr == 1 && sc >= rows;
  if (!row_major && !col_major) return false;
  const int64_t extent = row_major ? sr * rows : sc * cols;
  const int64_t sb = nb == 1 ? extent : t.stride(0);
  if (sb < extent) return false;
  dims = {nb, rows, cols};
  strides = {sb, sr, sc};
  return true;
}

// oneDNN's GEMM packs the operand that is strided along K (a transposed A, a row-major B) in
// panels that step K times over its leading dimension. When that step is a multiple of 4 KiB,
// the rows of a panel share one set of the L1 cache (4K aliasing) and the GEMM runs at about half
// speed. Measured with oneDNN 2.6 on AVX2, one thread: a weight gradient (1024 x 8192)^T @
// (8192 x 256) took 125 ms with a leading dimension of 1024 floats and 63 ms with 1040 (the
// copy: 6 ms); an LSTM step's (128 x 256) @ (256 x 1024), 1.55 ms and 0.73 ms. The cure is a
// copy whose leading dimension is 64 bytes longer: one pass over the operand.
constexpr int64_t kAliasingBytes = 4096, kPaddingBytes = 64;

bool aliased_along_k(int64_t k_stride, int64_t k, DType d) {
  return k > 16 && k_stride > 1 && (k_stride * int64_t(dtype_size(d))) % kAliasingBytes == 0;
}

// A copy of `lines` rows of `width` elements (row stride `ld`, batch stride `sb`, `nb` batches)
// of t's storage, as a contiguous (nb, lines, width + padding) tensor.
Tensor padded_lines(const Tensor& t, int64_t nb, int64_t sb, int64_t lines, int64_t ld,
                    int64_t width) {
  const int64_t es = int64_t(t.element_size());
  const int64_t padded = width + kPaddingBytes / es;
  Tensor out = Tensor::empty({nb, lines, padded}, t.dtype(), t.device());
  const auto* src = static_cast<const char*>(t.data_ptr());
  auto* dst = static_cast<char*>(out.data_ptr());
  const int64_t rows = nb * lines;
#pragma omp parallel for schedule(static) if (rows * width * es >= (int64_t(1) << 20))
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / lines, line = r % lines;
    std::memcpy(dst + r * padded * es, src + (b * sb + line * ld) * es, size_t(width * es));
  }
  return out;
}

bool is_reference_impl(const dnnl::primitive_desc& pd) {
  return std::string(pd.impl_info_str()).rfind("ref", 0) == 0;
}

// dst(B, M, N) = scale * (a @ b) [+ bias], all in oneDNN-native dtypes; dst contiguous; bias f32
// when scale is not 1. oneDNN 2.6 adds its bias argument before the output scale, so a scaled
// product takes its bias as a binary post-op, which runs after the scale (both in fp32 before the
// one rounding into dst; checked against a separate add by Fp8Gemm's tests).
void dnnl_matmul(CpuBackend& be, const Tensor& a, const Tensor& b, const Tensor* bias, Tensor& dst,
                 const float& scale) {
  memory::dims ad, as, bd, bs;
  const bool a_plain = plain_layout(a, ad, as), b_plain = plain_layout(b, bd, bs);
  if (!a_plain || !b_plain) {
    const Tensor ac = a_plain ? a : converted(be, a, a.dtype());
    const Tensor bc = b_plain ? b : converted(be, b, b.dtype());
    dnnl_matmul(be, ac, bc, bias, dst, scale);
    return;
  }
  const int64_t k = ad[2];
  if (aliased_along_k(as[2], k, a.dtype())) {  // a column-major (B, M, K): K lines of M
    const Tensor lines = padded_lines(a, ad[0], as[0], k, as[2], ad[1]);
    dnnl_matmul(be, lines.narrow(2, 0, ad[1]).transpose(1, 2), b, bias, dst, scale);
    return;
  }
  if (aliased_along_k(bs[1], k, b.dtype())) {  // b row-major (B, K, N): K lines of N
    const Tensor lines = padded_lines(b, bd[0], bs[0], k, bs[1], bd[2]);
    dnnl_matmul(be, a, lines.narrow(2, 0, bd[2]), bias, dst, scale);
    return;
  }
  const bool scaled = scale != 1.0f;
  MT_ASSERT(!scaled || !bias || bias->dtype() == DType::F32, "a scaled matmul takes an f32 bias");
  const memory::dims dd = {dst.size(0), dst.size(1), dst.size(2)};
  const int64_t n = dd[2];
  Key key;
  key.add('M').add(ad).add(as).add(bd).add(bs).add(dd);
  key.add(int64_t(a.dtype())).add(int64_t(b.dtype())).add(int64_t(dst.dtype()));
  key.add(bias ? int64_t(bias->dtype()) : -1).add(int64_t(scaled));
  const bool copies_help = !(a.is_contiguous() && b.is_contiguous());
  auto entry = cached(key, [&] {
    Entry e;
    const memory::desc a_md(ad, dnnl_type(a.dtype()), as), b_md(bd, dnnl_type(b.dtype()), bs);
    const memory::desc d_md(dd, dnnl_type(dst.dtype()), memory::dims{dd[1] * n, n, 1});
    const memory::desc bias_md =
        bias ? memory::desc({1, 1, n}, dnnl_type(bias->dtype()), memory::dims{n, n, 1})
             : memory::desc();
    const memory::desc scale_md({1}, mdt::f32, memory::dims{1});
    constexpr int kBiasPostOp = DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1;
    dnnl::primitive_attr attr = user_scratchpad();
    if (scaled) {
      attr.set_output_scales(0, {DNNL_RUNTIME_F32_VAL});
      if (bias) {
        dnnl::post_ops po;
        po.append_binary(dnnl::algorithm::binary_add, bias_md);
        attr.set_post_ops(po);
      }
    }
    const bool bias_arg = bias && !scaled;
    const dnnl::matmul::desc desc = bias_arg ? dnnl::matmul::desc(a_md, b_md, bias_md, d_md)
                                             : dnnl::matmul::desc(a_md, b_md, d_md);
    const dnnl::matmul::primitive_desc pd(desc, attr, engine(), true);
    if (!pd || (copies_help && is_reference_impl(pd))) {
      e.rejected = true;
      return e;
    }
    e.prim = dnnl::matmul(pd);
    e.scratch_md = pd.scratchpad_desc();
    e.args.push_back(plan_arg(DNNL_ARG_SRC, false, a_md, a_md));
    e.args.push_back(plan_arg(DNNL_ARG_WEIGHTS, false, b_md, b_md));
    if (bias) {
      const int arg = bias_arg ? DNNL_ARG_BIAS : kBiasPostOp;
      e.args.push_back(plan_arg(arg, false, bias_md, bias_md));
    }
    if (scaled) e.args.push_back(plan_arg(DNNL_ARG_ATTR_OUTPUT_SCALES, false, scale_md, scale_md));
    e.args.push_back(plan_arg(DNNL_ARG_DST, true, d_md, d_md));
    finish_entry(e);
    return e;
  });
  if (entry->rejected) {
    MT_ASSERT(copies_help, "oneDNN has no matmul for ", a.describe(), " @ ", b.describe());
    dnnl_matmul(be, converted(be, a, a.dtype()), converted(be, b, b.dtype()), bias, dst, scale);
    return;
  }
  const void* bias_ptr = bias ? bias->data_ptr() : nullptr;
  if (bias && scaled) {
    execute(*entry, {a.data_ptr(), b.data_ptr(), bias_ptr, &scale, dst.data_ptr()});
  } else if (bias) {
    execute(*entry, {a.data_ptr(), b.data_ptr(), bias_ptr, dst.data_ptr()});
  } else if (scaled) {
    execute(*entry, {a.data_ptr(), b.data_ptr(), &scale, dst.data_ptr()});
  } else {
    execute(*entry, {a.data_ptr(), b.data_ptr(), dst.data_ptr()});
  }
}

void matmul_f64(CpuBackend& be, const Tensor& a, const Tensor& b, const Tensor* bias, Tensor& out);

// A batch dim that only broadcasts (stride 0) becomes size 1: no copy ever repeats it.
Tensor unbroadcast_batch(const Tensor& t) {
  return t.size(0) > 1 && t.stride(0) == 0 ? t.detach().narrow(0, 0, 1) : t;
}

// ---- convolution through oneDNN -----------------------------------------------------------------

// Layouts: the convolution primitives are created with format_tag::any, so oneDNN picks its
// blocked layouts (nChw16c / OIhw16i16o on AVX-512) where its fastest kernels want them, and
// the user's NCHW tensors (any strides) are reordered in and out. Where oneDNN picks the user's
// own layout no reorder runs. The reorders are memory-bound: cheap next to the convolution on
// AVX-512, where plain nchw/oihw descriptors instead of `any` made a 32x64x32x32 3x3 layer 3x
// slower forward and 20x slower in the weight gradient (oneDNN falls back to its im2col GEMM
// there), and a 3-channel first layer 10x slower (2 threads). On AVX2 (nChw8c) they measured a
// fifth of a ResNet step: the backward reorders grad_out once for both primitives
// (dnnl_conv_backward), and few-channel weight gradients run channels-last
// (weight_grad_channels_last).
struct ConvGeometry {
  int64_t groups = 1;
  memory::dims src, wei, dst, bias, strides, dilates, pad_l, pad_r;
};

ConvGeometry conv_geometry(const Shape& x, const Shape& w, const Shape& y, const Conv2dParams& p) {
  ConvGeometry g;
  g.groups = p.groups;
  g.src = {x[0], x[1], x[2], x[3]};
  g.wei = p.groups > 1 ? memory::dims{p.groups, w[0] / p.groups, w[1], w[2], w[3]}
                       : memory::dims{w[0], w[1], w[2], w[3]};
  g.dst = {y[0], y[1], y[2], y[3]};
  g.bias = {w[0]};
  g.strides = {p.stride[0], p.stride[1]};
  g.dilates = {p.dilation[0] - 1, p.dilation[1] - 1};  // oneDNN counts the gaps
  g.pad_l = {p.padding[0], p.padding[1]};
  g.pad_r = g.pad_l;  // with floor division this reproduces (H + 2p - d(k-1) - 1) / s + 1
  return g;
}

// The user's memory: the tensor's own dims and strides (weights split into groups).
memory::desc user_md(const Tensor& t, int64_t groups = 1) {
  const Shape st = t.is_contiguous() ? contiguous_strides(t.shape()) : t.strides();
  memory::dims dims(t.shape().begin(), t.shape().end()), strides(st.begin(), st.end());
  if (groups > 1) {
    dims = {groups, t.size(0) / groups, t.size(1), t.size(2), t.size(3)};
    strides = {st[0] * (t.size(0) / groups), st[0], st[1], st[2], st[3]};
  }
  return memory::desc(dims, dnnl_type(t.dtype()), strides);
}

void add_conv_key(Key& key, const ConvGeometry& g) {
  key.add(g.groups).add(g.src).add(g.wei).add(g.dst).add(g.strides).add(g.dilates).add(g.pad_l);
}

void add_md_key(Key& key, const memory::desc& md) {
  key.add(md.dims()).add(int64_t(md.data_type()));
  key.add(memory::dims(md.data.format_desc.blocking.strides,
                       md.data.format_desc.blocking.strides + md.data.ndims));
}

memory::desc any_md(const memory::dims& dims, DType d) {
  return memory::desc(dims, dnnl_type(d), tag::any);
}

// An activation's descriptor for a primitive: channels-last (oneDNN's nhwc kernels, reading and
// writing a channels-last tensor's own memory), else format_tag::any.
memory::desc act_md(const memory::dims& dims, DType d, bool nhwc) {
  return nhwc ? memory::desc(dims, dnnl_type(d), tag::nhwc) : any_md(dims, d);
}

bool is_channels_last(const Tensor& t) {
  return t.is_contiguous(MemoryFormat::ChannelsLast);
}

// Whether oneDNN has only its reference loops for a primitive (its implementation name).
template <typename PD>
bool is_reference(const PD& pd) {
  return std::string_view(pd.impl_info_str()).starts_with("ref");
}

dnnl::convolution_forward::primitive_desc forward_pd(const ConvGeometry& g, DType kd,
                                                     DType out_dtype, const memory::desc& bias_md,
                                                     const dnnl::primitive_attr& attr,
                                                     bool nhwc = false) {
  const dnnl::convolution_forward::desc desc(
      dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
      act_md(g.src, kd, nhwc), any_md(g.wei, kd), bias_md, act_md(g.dst, out_dtype, nhwc),
      g.strides, g.dilates, g.pad_l, g.pad_r);
  return dnnl::convolution_forward::primitive_desc(desc, attr, engine());
}

// out = conv(x, w) + bias with x, w in the kernel dtype, out in a native output dtype.
void dnnl_conv_forward(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out,
                       const Conv2dParams& p) {
  const ConvGeometry g = conv_geometry(x.shape(), w.shape(), out.shape(), p);
  const memory::desc x_md = user_md(x), w_md = user_md(w, g.groups), y_md = user_md(out);
  const memory::desc b_md = bias ? user_md(*bias) : memory::desc();
  Key key;
  key.add('F');
  add_conv_key(key, g);
  for (const memory::desc* md : {&x_md, &w_md, &y_md})
    add_md_key(key, *md);
  key.add(bias ? int64_t(bias->dtype()) : -1);
  auto entry = cached(key, [&] {
    Entry e;
    const bool nhwc = is_channels_last(x) && is_channels_last(out);
    auto pd = forward_pd(g, x.dtype(), out.dtype(), b_md, user_scratchpad(), nhwc);
    // Where oneDNN has no channels-last kernel for a layer, its blocked one with reorders.
    if (nhwc && is_reference(pd))
      pd = forward_pd(g, x.dtype(), out.dtype(), b_md, user_scratchpad());
    e.prim = dnnl::convolution_forward(pd);
    e.scratch_md = pd.scratchpad_desc();
    e.args.push_back(plan_arg(DNNL_ARG_SRC, false, x_md, pd.src_desc()));
    e.args.push_back(plan_arg(DNNL_ARG_WEIGHTS, false, w_md, pd.weights_desc()));
    if (bias) e.args.push_back(plan_arg(DNNL_ARG_BIAS, false, b_md, pd.bias_desc()));
    e.args.push_back(plan_arg(DNNL_ARG_DST, true, y_md, pd.dst_desc()));
    finish_entry(e);
    return e;
  });
  if (bias) {
    execute(*entry, {x.data_ptr(), w.data_ptr(), bias->data_ptr(), out.data_ptr()});
  } else {
    execute(*entry, {x.data_ptr(), w.data_ptr(), out.data_ptr()});
  }
}

// The primitive of grad_x = conv_transpose(grad_out, w); grad_x contiguous in a native dtype.
std::shared_ptr<const Entry> conv_backward_data_entry(const Tensor& go, const Tensor& w,
                                                      const Tensor& gx, const Conv2dParams& p) {
  const ConvGeometry g = conv_geometry(gx.shape(), w.shape(), go.shape(), p);
  const memory::desc go_md = user_md(go), w_md = user_md(w, g.groups), gx_md = user_md(gx);
  Key key;
  key.add('D');
  add_conv_key(key, g);
  for (const memory::desc* md : {&go_md, &w_md, &gx_md})
    add_md_key(key, *md);
  return cached(key, [&] {
    Entry e;
    const DType kd = go.dtype();
    auto make_pd = [&](bool nhwc) {
      const auto hint = forward_pd(g, kd, kd, memory::desc(), dnnl::primitive_attr(), nhwc);
      const dnnl::convolution_backward_data::desc desc(
          dnnl::algorithm::convolution_direct, act_md(g.src, gx.dtype(), nhwc), any_md(g.wei, kd),
          act_md(g.dst, kd, nhwc), g.strides, g.dilates, g.pad_l, g.pad_r);
      return dnnl::convolution_backward_data::primitive_desc(desc, user_scratchpad(), engine(),
                                                             hint);
    };
    const bool nhwc = is_channels_last(gx);
    auto pd = make_pd(nhwc);
    if (nhwc && is_reference(pd)) pd = make_pd(false);
    e.prim = dnnl::convolution_backward_data(pd);
    e.scratch_md = pd.scratchpad_desc();
    e.args.push_back(plan_arg(DNNL_ARG_DIFF_DST, false, go_md, pd.diff_dst_desc()));
    e.args.push_back(plan_arg(DNNL_ARG_WEIGHTS, false, w_md, pd.weights_desc()));
    e.args.push_back(plan_arg(DNNL_ARG_DIFF_SRC, true, gx_md, pd.diff_src_desc()));
    finish_entry(e);
    return e;
  });
}

// Below one channel block of input channels, the weight gradient runs channels-last. oneDNN's
// blocked kernel pads the channels to the block (8 on AVX2) and measured up to 8x slower on this
// machine (AVX2, one thread, batch 128, 28x28): a 1->32 5x5 layer 20.6 ms blocked against
// 2.9 ms nhwc, 1->16 3x3 5.3 against 0.7 ms, 3->32 3x3 on 32x32 4.6 against 3.0 ms; at 8
// channels the two were equal. A single-channel image is its own nhwc layout, so the first
// layer of a grey-image network reorders only grad_out.
bool weight_grad_channels_last(const ConvGeometry& g) {
  return g.groups == 1 && g.src[1] < 8;
}

// The primitive of grad_w (and grad_bias when given) from x and grad_out; outputs contiguous.
std::shared_ptr<const Entry> conv_backward_weights_entry(const Tensor& go, const Tensor& x,
                                                         const Tensor& gw, const Tensor* gb,
                                                         const Conv2dParams& p) {
  const ConvGeometry g = conv_geometry(x.shape(), gw.shape(), go.shape(), p);
  const bool nhwc = weight_grad_channels_last(g) || is_channels_last(x);
  const memory::desc x_md =
      nhwc && x.size(1) == 1 && x.is_contiguous()
          ? memory::desc(g.src, dnnl_type(x.dtype()), tag::nhwc)  // same bytes
          : user_md(x);
  const memory::desc go_md = user_md(go), gw_md = user_md(gw, g.groups);
  const memory::desc gb_md = gb ? user_md(*gb) : memory::desc();
  Key key;
  key.add('W');
  add_conv_key(key, g);
  for (const memory::desc* md : {&go_md, &x_md, &gw_md})
    add_md_key(key, *md);
  key.add(gb ? int64_t(gb->dtype()) : -1);
  return cached(key, [&] {
    Entry e;
    const DType kd = x.dtype();
    auto make_pd = [&](bool channels_last) {
      const auto hint =
          forward_pd(g, kd, kd, memory::desc(), dnnl::primitive_attr(), channels_last);
      const dnnl::convolution_backward_weights::desc desc(
          dnnl::algorithm::convolution_direct, act_md(g.src, kd, channels_last),
          any_md(g.wei, gw.dtype()), gb_md, act_md(g.dst, kd, channels_last), g.strides, g.dilates,
          g.pad_l, g.pad_r);
      return dnnl::convolution_backward_weights::primitive_desc(desc, user_scratchpad(), engine(),
                                                                hint);
    };
    auto pd = make_pd(nhwc);
    // Where oneDNN has no channels-last kernel for it on this CPU (or this dtype) it would run
    // its reference loops: the blocked layouts instead.
    if (nhwc && is_reference(pd)) pd = make_pd(false);
    e.prim = dnnl::convolution_backward_weights(pd);
    e.scratch_md = pd.scratchpad_desc();
    e.args.push_back(plan_arg(DNNL_ARG_SRC, false, x_md, pd.src_desc()));
    e.args.push_back(plan_arg(DNNL_ARG_DIFF_DST, false, go_md, pd.diff_dst_desc()));
    e.args.push_back(plan_arg(DNNL_ARG_DIFF_WEIGHTS, true, gw_md, pd.diff_weights_desc()));
    if (gb) e.args.push_back(plan_arg(DNNL_ARG_DIFF_BIAS, true, gb_md, pd.diff_bias_desc()));
    finish_entry(e);
    return e;
  });
}

// Both gradients of a convolution (either may be absent). grad_out is reordered once when both
// primitives want it in the same layout: of a ResNet step's ~190 reorders (a fifth of its time
// on AVX2), one per convolution was this second copy.
void dnnl_conv_backward(const Tensor& go, const Tensor& x, const Tensor& w, Tensor* gx, Tensor* gw,
                        Tensor* gb, const Conv2dParams& p) {
  const auto data = gx ? conv_backward_data_entry(go, w, *gx, p) : nullptr;
  const auto weights = gw ? conv_backward_weights_entry(go, x, *gw, gb, p) : nullptr;
  Tensor shared_go;
  Staged staged;
  if (data && weights) {
    const ArgPlan* d = find_arg(*data, DNNL_ARG_DIFF_DST);
    const ArgPlan* wt = find_arg(*weights, DNNL_ARG_DIFF_DST);
    if (d->reorder && wt->reorder && d->prim_md == wt->prim_md) {
      shared_go = stage(*data, DNNL_ARG_DIFF_DST, go.data_ptr());
      staged = {DNNL_ARG_DIFF_DST, shared_go.data_ptr()};
    }
  }
  if (data) execute(*data, {go.data_ptr(), w.data_ptr(), gx->data_ptr()}, staged);
  if (weights && gb) {
    execute(*weights, {x.data_ptr(), go.data_ptr(), gw->data_ptr(), gb->data_ptr()}, staged);
  } else if (weights) {
    execute(*weights, {x.data_ptr(), go.data_ptr(), gw->data_ptr()}, staged);
  }
}

// oneDNN reports a configuration it cannot run with dnnl::error; ours to fix, so internal.
template <typename F>
void with_dnnl(const char* what, F f) {
  try {
    f();
  } catch (const dnnl::error& e) {
    MT_ASSERT(false, "oneDNN ", what, " failed: ", e.what(), " (status ", int(e.status), ")");
  }
}

// ---- float64 (and reductions oneDNN does not cover) ---------------------------------------------

bool worth_threads(int64_t work) {
  return work >= (int64_t(1) << 15) && !omp_in_parallel();
}

struct ConvDims {
  int64_t N, C, H, W, O, KH, KW, OH, OW, Cg, Og;
  int64_t sh, sw, ph, pw, dh, dw;
};

ConvDims conv_dims(const Shape& x, const Shape& w, const Shape& y, const Conv2dParams& p) {
  return {x[0],
          x[1],
          x[2],
          x[3],
          w[0],
          w[2],
          w[3],
          y[2],
          y[3],
          w[1],
          w[0] / p.groups,
          p.stride[0],
          p.stride[1],
          p.padding[0],
          p.padding[1],
          p.dilation[0],
          p.dilation[1]};
}

void conv_forward_f64(const double* x, const double* w, const double* bias, double* y,
                      const ConvDims& d) {
#pragma omp parallel for schedule( \
    static) if (worth_threads(d.N * d.O * d.OH * d.OW * d.Cg * d.KH * d.KW))
  for (int64_t no = 0; no < d.N * d.O; ++no) {
    const int64_t n = no / d.O, o = no % d.O, g = o / d.Og;
    const double* wo = w + o * d.Cg * d.KH * d.KW;
    double* yo = y + no * d.OH * d.OW;
    for (int64_t oh = 0; oh < d.OH; ++oh) {
      for (int64_t ow = 0; ow < d.OW; ++ow) {
        double acc = bias ? bias[o] : 0.0;
        for (int64_t c = 0; c < d.Cg; ++c) {
          const double* xc = x + (n * d.C + g * d.Cg + c) * d.H * d.W;
          const double* wc = wo + c * d.KH * d.KW;
          for (int64_t kh = 0; kh < d.KH; ++kh) {
            const int64_t ih = oh * d.sh - d.ph + kh * d.dh;
            if (ih < 0 || ih >= d.H) continue;
            for (int64_t kw = 0; kw < d.KW; ++kw) {
              const int64_t iw = ow * d.sw - d.pw + kw * d.dw;
              if (iw < 0 || iw >= d.W) continue;
              acc += xc[ih * d.W + iw] * wc[kh * d.KW + kw];
            }
          }
        }
        yo[oh * d.OW + ow] = acc;
      }
    }
  }
}

// Gathers every contribution to one input element: no two threads write the same place.
void conv_backward_data_f64(const double* go, const double* w, double* gx, const ConvDims& d) {
#pragma omp parallel for schedule( \
    static) if (worth_threads(d.N * d.O * d.OH * d.OW * d.Cg * d.KH * d.KW))
  for (int64_t nc = 0; nc < d.N * d.C; ++nc) {
    const int64_t n = nc / d.C, ci = nc % d.C, g = ci / d.Cg, c = ci % d.Cg;
    for (int64_t ih = 0; ih < d.H; ++ih) {
      for (int64_t iw = 0; iw < d.W; ++iw) {
        double acc = 0;
        for (int64_t o = g * d.Og; o < (g + 1) * d.Og; ++o) {
          const double* goo = go + (n * d.O + o) * d.OH * d.OW;
          const double* wc = w + (o * d.Cg + c) * d.KH * d.KW;
          for (int64_t kh = 0; kh < d.KH; ++kh) {
            const int64_t th = ih + d.ph - kh * d.dh;
            if (th < 0 || th % d.sh != 0 || th / d.sh >= d.OH) continue;
            for (int64_t kw = 0; kw < d.KW; ++kw) {
              const int64_t tw = iw + d.pw - kw * d.dw;
              if (tw < 0 || tw % d.sw != 0 || tw / d.sw >= d.OW) continue;
              acc += goo[(th / d.sh) * d.OW + tw / d.sw] * wc[kh * d.KW + kw];
            }
          }
        }
        gx[nc * d.H * d.W + ih * d.W + iw] = acc;
      }
    }
  }
}

void conv_backward_weights_f64(const double* go, const double* x, double* gw, const ConvDims& d) {
#pragma omp parallel for schedule( \
    static) if (worth_threads(d.N * d.O * d.OH * d.OW * d.Cg * d.KH * d.KW))
  for (int64_t oc = 0; oc < d.O * d.Cg; ++oc) {
    const int64_t o = oc / d.Cg, c = oc % d.Cg, g = o / d.Og;
    for (int64_t kh = 0; kh < d.KH; ++kh) {
      for (int64_t kw = 0; kw < d.KW; ++kw) {
        double acc = 0;
        for (int64_t n = 0; n < d.N; ++n) {
          const double* goo = go + (n * d.O + o) * d.OH * d.OW;
          const double* xc = x + (n * d.C + g * d.Cg + c) * d.H * d.W;
          for (int64_t oh = 0; oh < d.OH; ++oh) {
            const int64_t ih = oh * d.sh - d.ph + kh * d.dh;
            if (ih < 0 || ih >= d.H) continue;
            for (int64_t ow = 0; ow < d.OW; ++ow) {
              const int64_t iw = ow * d.sw - d.pw + kw * d.dw;
              if (iw < 0 || iw >= d.W) continue;
              acc += goo[oh * d.OW + ow] * xc[ih * d.W + iw];
            }
          }
        }
        gw[(oc * d.KH + kh) * d.KW + kw] = acc;
      }
    }
  }
}

// grad_bias[o] = sum of grad_out over (N, OH, OW), accumulated in double.
template <typename T>
void bias_grad(const T* go, double* gb, int64_t N, int64_t O, int64_t S) {
  for (int64_t o = 0; o < O; ++o)
    gb[o] = 0;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t o = 0; o < O; ++o) {
      const T* p = go + (n * O + o) * S;
      double acc = 0;
      for (int64_t s = 0; s < S; ++s)
        acc += double(p[s]);
      gb[o] += acc;
    }
  }
}

void conv_bias_grad(CpuBackend& be, const Tensor& go, Tensor& gb) {
  const DType wide = go.dtype() == DType::F64 ? DType::F64 : DType::F32;
  const Tensor g = go.is_contiguous() && go.dtype() == wide ? go : converted(be, go, wide);
  Tensor acc = Tensor::empty(gb.shape(), DType::F64, gb.device());
  const int64_t S = go.size(2) * go.size(3);
  if (wide == DType::F64) {
    bias_grad(g.data<double>(), acc.data<double>(), go.size(0), go.size(1), S);
  } else {
    bias_grad(g.data<float>(), acc.data<double>(), go.size(0), go.size(1), S);
  }
  be.copy(acc, gb);
}

// A contiguous f64 copy of t (t itself when it already is one).
Tensor as_f64(CpuBackend& be, const Tensor& t) {
  return t.dtype() == DType::F64 && t.is_contiguous() ? t : converted(be, t, DType::F64);
}

// Cache-blocked: a tile of 64 rows of C stays in L2 while a 256 x 256 panel of B streams
// through; the innermost loop runs along contiguous rows of B and C and vectorizes.
void matmul_f64(CpuBackend& be, const Tensor& a_in, const Tensor& b_in, const Tensor* bias,
                Tensor& out) {
  auto unit_rows = [](const Tensor& t) {
    return t.dtype() == DType::F64 && (t.stride(2) == 1 || t.size(2) == 1);
  };
  const Tensor a = unit_rows(a_in) ? a_in : converted(be, a_in, DType::F64);
  const Tensor b = unit_rows(b_in) ? b_in : converted(be, b_in, DType::F64);
  Tensor c = out.dtype() == DType::F64 ? out : Tensor::empty(out.shape(), DType::F64, out.device());
  const int64_t nbatch = c.size(0), M = c.size(1), N = c.size(2), K = a.size(2);
  const double* A = a.data<double>();
  const double* B = b.data<double>();
  double* C = c.data<double>();
  const int64_t sab = a.size(0) == 1 ? 0 : a.stride(0), sam = a.stride(1);
  const int64_t sbb = b.size(0) == 1 ? 0 : b.stride(0), sbk = b.stride(1);
  if (bias) {
    const Tensor bv = as_f64(be, *bias);
    const double* bp = bv.data<double>();
    for (int64_t r = 0; r < nbatch * M; ++r)
      std::copy(bp, bp + N, C + r * N);
  } else {
    std::fill(C, C + nbatch * M * N, 0.0);
  }
  constexpr int64_t kMB = 64, kKB = 256, kNB = 256;
  const int64_t mblocks = (M + kMB - 1) / kMB, tiles = nbatch * mblocks;
#pragma omp parallel for schedule(dynamic) if (tiles > 1 && worth_threads(nbatch * M * N * K))
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t bi = t / mblocks, i0 = (t % mblocks) * kMB, i1 = std::min(M, i0 + kMB);
    const double* Ab = A + bi * sab;
    const double* Bb = B + bi * sbb;
    double* Cb = C + bi * M * N;
    for (int64_t k0 = 0; k0 < K; k0 += kKB) {
      const int64_t k1 = std::min(K, k0 + kKB);
      for (int64_t j0 = 0; j0 < N; j0 += kNB) {
        const int64_t j1 = std::min(N, j0 + kNB);
        for (int64_t i = i0; i < i1; ++i) {
          double* crow = Cb + i * N;
          const double* arow = Ab + i * sam;
          for (int64_t k = k0; k < k1; ++k) {
            const double aik = arow[k];
            const double* brow = Bb + k * sbk;
            for (int64_t j = j0; j < j1; ++j)
              crow[j] += aik * brow[j];
          }
        }
      }
    }
  }
  if (!c.is_same(out)) be.copy(c, out);
}

}  // namespace

// ---- the backend entry points -------------------------------------------------------------------

void CpuBackend::matmul(const Tensor& a, const Tensor& b, const Tensor* bias, Tensor& out,
                        const MatmulOptions& options) {
  scaled_matmul(*this, a, b, bias, out, options, 1.0f);
}

void scaled_matmul(CpuBackend& be, const Tensor& a_in, const Tensor& b_in, const Tensor* bias,
                   Tensor& out, const MatmulOptions& options, float scale) {
  MT_ASSERT(a_in.dim() == 3 && b_in.dim() == 3 && out.dim() == 3 && out.is_contiguous(),
            "matmul wants (B, M, K) @ (B, K, N) -> contiguous (B, M, N), got ", a_in.describe(),
            " @ ", b_in.describe(), " -> ", out.describe());
  const int64_t nbatch = out.size(0), M = out.size(1), N = out.size(2), K = a_in.size(2);
  MT_ASSERT(a_in.size(1) == M && b_in.size(1) == K && b_in.size(2) == N &&
                (a_in.size(0) == nbatch || a_in.size(0) == 1) &&
                (b_in.size(0) == nbatch || b_in.size(0) == 1) &&
                (!bias || (bias->dim() == 1 && bias->size(0) == N)),
            "matmul shapes ", a_in.describe(), " @ ", b_in.describe(), " -> ", out.describe());
  if (out.numel() == 0) return;
  if (K == 0) {
    if (bias) {
      be.copy(*bias, out);
    } else {
      be.fill(out, 0.0);
    }
    return;
  }
  const Tensor a = unbroadcast_batch(a_in), b = unbroadcast_batch(b_in);
  if (nbatch > 1 && a.size(0) == 1 && b.size(0) == 1) {
    // Every batch is the same product: compute it once.
    Tensor one = Tensor::empty({1, M, N}, out.dtype(), out.device());
    scaled_matmul(be, a, b, bias, one, options, scale);
    be.copy(one, out);
    return;
  }
  const bool scaled = scale != 1.0f;
  if (a.dtype() == DType::F64 || b.dtype() == DType::F64) {
    MT_ASSERT(!scaled, "matmul: an output scale is for f32/bf16/f16 operands, got f64");
    matmul_f64(be, a, b, bias, out);
    return;
  }
  const DType kd = kernel_dtype(a.dtype(), options.input_rounding);
  const Tensor ak = prepare(be, a, kd, options.input_rounding);
  const Tensor bk = prepare(be, b, kd, options.input_rounding);
  Tensor bias_k;
  if (bias) {
    const bool ok =
        bias->is_contiguous() && (bias->dtype() == DType::F32 || (bias->dtype() == kd && !scaled));
    bias_k = ok ? *bias : converted(be, *bias, DType::F32);
  }
  Tensor dst = native_output(out.dtype(), kd) ? out : Tensor::empty(out.shape(), DType::F32);
  with_dnnl("matmul", [&] { dnnl_matmul(be, ak, bk, bias ? &bias_k : nullptr, dst, scale); });
  if (!dst.is_same(out)) be.copy(dst, out);  // the one rounding into f16 / fp8
}

void CpuBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor* bias, Tensor& out,
                        const Conv2dParams& p, const MatmulOptions& options) {
  MT_ASSERT(x.dim() == 4 && w.dim() == 4 && out.dim() == 4 &&
                (out.is_contiguous() || is_channels_last(out)),
            "conv2d wants NCHW tensors, got ", x.describe(), ", ", w.describe(), " -> ",
            out.describe());
  if (out.numel() == 0) return;
  if (x.dtype() == DType::F64) {
    const Tensor xd = as_f64(*this, x), wd = as_f64(*this, w);
    const Tensor bd = bias ? as_f64(*this, *bias) : Tensor();
    Tensor y = out.dtype() == DType::F64 ? out : Tensor::empty(out.shape(), DType::F64);
    conv_forward_f64(xd.data<double>(), wd.data<double>(), bias ? bd.data<double>() : nullptr,
                     y.data<double>(), conv_dims(x.shape(), w.shape(), out.shape(), p));
    if (!y.is_same(out)) copy(y, out);
    return;
  }
  const DType kd = kernel_dtype(x.dtype(), options.input_rounding);
  const Tensor xk = prepare(*this, x, kd, options.input_rounding);
  const Tensor wk = prepare(*this, w, kd, options.input_rounding);
  Tensor bias_k;
  if (bias) {
    const bool ok = bias->is_contiguous() && (bias->dtype() == DType::F32 || bias->dtype() == kd);
    bias_k = ok ? *bias : converted(*this, *bias, DType::F32);
  }
  Tensor dst = native_output(out.dtype(), kd) ? out : Tensor::empty(out.shape(), DType::F32);
  with_dnnl("convolution", [&] { dnnl_conv_forward(xk, wk, bias ? &bias_k : nullptr, dst, p); });
  if (!dst.is_same(out)) copy(dst, out);
}

void CpuBackend::conv2d_backward(const Tensor& grad_out, const Tensor& x, const Tensor& w,
                                 Tensor* grad_x, Tensor* grad_w, Tensor* grad_bias,
                                 const Conv2dParams& p, const MatmulOptions& options) {
  MT_ASSERT(grad_out.dim() == 4 && x.dim() == 4 && w.dim() == 4, "conv2d_backward shapes");
  for (Tensor* g : {grad_x, grad_w, grad_bias}) {
    MT_ASSERT(!g || g->is_contiguous() || is_channels_last(*g),
              "conv2d_backward writes row-major or channels-last gradients");
  }
  if (grad_out.numel() == 0) {
    for (Tensor* g : {grad_x, grad_w, grad_bias}) {
      if (g) fill(*g, 0.0);
    }
    return;
  }
  if (grad_bias && !grad_w) conv_bias_grad(*this, grad_out, *grad_bias);
  // The fused bias gradient comes with the weight gradient; alone it is the reduction above.
  Tensor* fused_bias = grad_w ? grad_bias : nullptr;
  if (x.dtype() == DType::F64) {
    const ConvDims d = conv_dims(x.shape(), w.shape(), grad_out.shape(), p);
    const Tensor go = as_f64(*this, grad_out);
    auto into = [&](Tensor& g, auto kernel) {
      Tensor r = g.dtype() == DType::F64 ? g : Tensor::empty(g.shape(), DType::F64);
      kernel(r.data<double>());
      if (!r.is_same(g)) copy(r, g);
    };
    if (grad_x) {
      const Tensor wd = as_f64(*this, w);
      into(*grad_x, [&](double* p_gx) {
        conv_backward_data_f64(go.data<double>(), wd.data<double>(), p_gx, d);
      });
    }
    if (grad_w) {
      const Tensor xd = as_f64(*this, x);
      into(*grad_w, [&](double* p_gw) {
        conv_backward_weights_f64(go.data<double>(), xd.data<double>(), p_gw, d);
      });
    }
    if (fused_bias) conv_bias_grad(*this, go, *fused_bias);
    return;
  }
  const DType kd = kernel_dtype(x.dtype(), options.input_rounding);
  // grad_out is rounded too: its products with w (or x) are the GEMMs the tensor core would run.
  const Tensor gok = prepare(*this, grad_out, kd, options.input_rounding);
  auto native = [&](Tensor* g) {
    if (!g) return Tensor();
    return native_output(g->dtype(), kd) ? *g : Tensor::empty(g->shape(), DType::F32);
  };
  Tensor gx = native(grad_x), gw = native(grad_w), gb = native(fused_bias);
  const Tensor wk = grad_x ? prepare(*this, w, kd, options.input_rounding) : Tensor();
  const Tensor xk = grad_w ? prepare(*this, x, kd, options.input_rounding) : Tensor();
  with_dnnl("convolution backward", [&] {
    dnnl_conv_backward(gok, xk, wk, grad_x ? &gx : nullptr, grad_w ? &gw : nullptr,
                       fused_bias ? &gb : nullptr, p);
  });
  for (auto [native_g, g] : {std::pair{&gx, grad_x}, {&gw, grad_w}, {&gb, fused_bias}}) {
    if (g && !native_g->is_same(*g)) copy(*native_g, *g);
  }
}

}  // namespace mantissa::backend::cpu
