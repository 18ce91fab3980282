// The oneDNN plumbing that the CPU's GEMM (dnnl_matmul.cpp) and convolution (dnnl_conv.cpp)
// share: one engine and one stream per thread, user-mode scratchpads from a per-thread grow-only
// buffer (a warm call allocates nothing but its output), a bounded LRU cache of primitives built
// once per (shapes, strides, dtypes, bias), and the operands' dtypes (what oneDNN computes
// natively, what is emulated on f32 copies).
#include "backend/cpu/dnnl_support.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <list>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "backend/dtype_map.h"
#include "mantissa/core/cpu.h"
#include "mantissa/core/warning.h"

namespace mantissa::backend::cpu::onednn {

// ---- engine, stream, scratchpad -----------------------------------------------------------------

namespace {

// oneDNN dispatches on the CPU it finds; MANTISSA_ISA (mantissa/core/cpu.h) caps it as it caps
// Mantissa's own kernels, so the fallbacks of a smaller CPU can be tested on a larger one. The
// cap must come before oneDNN's first primitive, hence here.
void cap_dnnl_isa() {
  const CpuFeatures& f = cpu_features();
  if (f.avx512_core()) return;
  // Refused (status) only once oneDNN has dispatched, which cannot have happened yet.
  dnnl_set_max_cpu_isa(f.avx2 ? dnnl_cpu_isa_avx2 : dnnl_cpu_isa_sse41);
}

}  // namespace

dnnl::engine& engine() {
  static auto* e = [] {
    cap_dnnl_isa();
    return new dnnl::engine(dnnl::engine::kind::cpu, 0);  // outlives every primitive
  }();
  return *e;
}

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

namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

}  // namespace

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

namespace {

// oneDNN's type of each dtype this backend hands it. oneDNN 2.6 computes f16 only on CPUs with
// AVX512-FP16, and fp8 not at all: those are emulated exactly on f32 copies (see the top), as
// f64 runs on plain loops (dnnl_matmul.cpp, dnnl_conv.cpp).
constexpr DTypeMapRow<mdt> kDnnlTypes[] = {
    {DType::F64, kUnsupported},  {DType::F32, mdt::f32},          {DType::F16, kUnsupported},
    {DType::BF16, mdt::bf16},    {DType::FP8_E4M3, kUnsupported}, {DType::FP8_E5M2, kUnsupported},
    {DType::I64, kUnsupported},  {DType::I32, kUnsupported},      {DType::U8, kUnsupported},
    {DType::Bool, kUnsupported},
};
static_assert(dtype_map_complete<kDnnlTypes>());

}  // namespace

bool is_reference(const dnnl::primitive_desc& pd) {
  return std::string_view(pd.impl_info_str()).starts_with("ref");
}

mdt dnnl_type(DType d) {
  const std::optional<mdt> t = dtype_map_lookup(kDnnlTypes, d);
  MT_ASSERT(t.has_value(), "no oneDNN type for ", dtype_name(d));
  return t.value_or(mdt::undef);
}

// ---- primitive cache ----------------------------------------------------------------------------

namespace {

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

}  // namespace

std::shared_ptr<const Entry> find_entry(const Key& key) {
  return cache().find(key.str());
}

void keep_entry(const Key& key, std::shared_ptr<const Entry> e) {
  cache().insert(key.str(), std::move(e));
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

namespace {

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

}  // namespace

const ArgPlan* find_arg(const Entry& e, int arg) {
  for (const ArgPlan& a : e.args) {
    if (a.arg == arg) return &a;
  }
  return nullptr;
}

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

void execute(const Entry& e, std::initializer_list<const void*> ptrs, Staged staged) {
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

bool native_output(DType out, DType kd) {
  return out == DType::F32 || out == kd;
}

bool worth_threads(int64_t work) {
  return work >= (int64_t(1) << 15) && !omp_in_parallel();
}

Tensor as_f64(CpuBackend& be, const Tensor& t) {
  return t.dtype() == DType::F64 && t.is_contiguous() ? t : converted(be, t, DType::F64);
}

}  // namespace mantissa::backend::cpu::onednn
