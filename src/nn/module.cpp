#include "mantissa/nn/module.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "mantissa/autograd/grad_mode.h"

namespace mantissa::nn {

namespace {

// "1,234,567": parameter counts are read by people.
std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

std::string join(const std::vector<std::string>& names, size_t limit = 12) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < limit; ++i)
    out += (i ? ", " : "") + names[i];
  if (names.size() > limit) out += ", ... (" + std::to_string(names.size() - limit) + " more)";
  return out;
}

std::string joined_path(const std::string& prefix, const std::string& name) {
  if (prefix.empty()) return name;
  return name.empty() ? prefix : prefix + "." + name;
}

}  // namespace

namespace {
thread_local OutputObserver* t_observer = nullptr;
}  // namespace

OutputObserver::OutputObserver(Fn fn) : fn_(std::move(fn)), previous_(t_observer) {
  t_observer = this;
}

OutputObserver::~OutputObserver() {
  t_observer = previous_;
}

void observe_output(const Module& module, const Tensor& output) {
  if (t_observer == nullptr || !module.named_children().empty()) return;
  t_observer->fn_(module, output);
}

Module::Module(std::string type_name) : type_name_(std::move(type_name)) {}

namespace {

// The module whose default forward / forward_list is running on this thread: if the other
// default is reached for the same module, it overrides neither.
thread_local const Module* t_defaulting = nullptr;

struct Defaulting {
  const Module* prev;
  explicit Defaulting(const Module* m) : prev(t_defaulting) { t_defaulting = m; }
  ~Defaulting() { t_defaulting = prev; }
};

}  // namespace

Tensor Module::forward(const Tensor& x) {
  MT_CHECK(t_defaulting != this, type_name_,
           " has no forward: it overrides neither forward(x) nor forward_list(inputs); use its "
           "own methods");
  Defaulting guard(this);
  TensorList out = forward_list(TensorList{x});
  MT_CHECK(out.size() == 1, type_name_, " returns ", out.size(),
           " tensors; call forward_list({x}) (or model({x})) to get them all");
  return std::move(out[0]);
}

TensorList Module::forward_list(const TensorList& inputs) {
  MT_CHECK(t_defaulting != this, type_name_,
           " has no forward: it overrides neither forward(x) nor forward_list(inputs); use its "
           "own methods");
  MT_CHECK(inputs.size() == 1, type_name_, " takes one input tensor, got ", inputs.size());
  Defaulting guard(this);
  return {forward(inputs[0])};
}

// ---- registration ------------------------------------------------------------------------------

void Module::check_new_name(const std::string& name) const {
  MT_CHECK(!name.empty(), type_name_, ": a parameter, buffer or module name must not be empty");
  MT_CHECK(name.find('.') == std::string::npos, type_name_, ": the name \"", name,
           "\" contains '.', which separates the levels of state_dict names");
  auto taken = [&](const std::vector<Slot>& slots) {
    return std::any_of(slots.begin(), slots.end(), [&](const Slot& s) { return s.name == name; });
  };
  const bool child_taken = std::any_of(children_.begin(), children_.end(),
                                       [&](const auto& c) { return c.first == name; });
  MT_CHECK(!taken(params_) && !taken(buffers_) && !child_taken, type_name_, ": the name \"", name,
           "\" is already registered");
}

Tensor& Module::register_parameter(const std::string& name, Tensor value) {
  check_new_name(name);
  MT_CHECK(value.defined(), type_name_, ": parameter \"", name, "\" is undefined");
  MT_CHECK(value.is_leaf(), type_name_, ": parameter \"", name,
           "\" must be a leaf tensor (not the result of an op); pass t.detach()");
  if (value.is_floating_point() && !value.requires_grad()) value.set_requires_grad(true);
  params_.push_back({name, std::make_unique<Tensor>(std::move(value))});
  return *params_.back().tensor;
}

Tensor& Module::register_buffer(const std::string& name, Tensor value) {
  check_new_name(name);
  MT_CHECK(value.defined(), type_name_, ": buffer \"", name, "\" is undefined");
  MT_CHECK(!value.requires_grad(), type_name_, ": buffer \"", name,
           "\" requires grad; a trained tensor is a parameter");
  buffers_.push_back({name, std::make_unique<Tensor>(std::move(value))});
  return *buffers_.back().tensor;
}

void Module::add_child(const std::string& name, ModulePtr module) {
  check_new_name(name);
  MT_CHECK(module != nullptr, type_name_, ": submodule \"", name, "\" is null");
  MT_CHECK(module.get() != this, type_name_, ": a module cannot be its own child");
  children_.emplace_back(name, std::move(module));
}

void Module::set_child(const std::string& name, ModulePtr module) {
  MT_CHECK(module != nullptr, type_name_, ": submodule \"", name, "\" is null");
  for (auto& [n, m] : children_) {
    if (n == name) {
      m = std::move(module);
      return;
    }
  }
  MT_CHECK(false, type_name_, " has no submodule \"", name, "\" to replace");
}

Tensor& Module::parameter_slot(const std::string& name) {
  for (auto* slots : {&params_, &buffers_}) {
    for (Slot& s : *slots) {
      if (s.name == name) return *s.tensor;
    }
  }
  std::vector<std::string> names;
  for (const Slot& s : params_)
    names.push_back(s.name);
  for (const Slot& s : buffers_)
    names.push_back(s.name);
  MT_CHECK(false, type_name_, " has no parameter or buffer \"", name, "\" (it has: ", join(names),
           ")");
  return *params_.front().tensor;  // unreachable
}

ModulePtr Module::child(const std::string& name) const {
  std::vector<std::string> names;
  for (const auto& [n, m] : children_) {
    if (n == name) return m;
    names.push_back(n);
  }
  MT_CHECK(false, type_name_, " has no submodule \"", name, "\" (it has: ", join(names), ")");
  return nullptr;
}

// ---- traversal ---------------------------------------------------------------------------------

void Module::collect(const std::string& prefix, bool params, bool buffers, bool dedup,
                     NamedTensors& out, std::vector<const TensorImpl*>& seen) const {
  auto take = [&](const std::vector<Slot>& slots) {
    for (const Slot& s : slots) {
      const TensorImpl* impl = s.tensor->impl();
      if (dedup) {
        if (std::find(seen.begin(), seen.end(), impl) != seen.end()) continue;
        seen.push_back(impl);
      }
      out.emplace_back(joined_path(prefix, s.name), *s.tensor);
    }
  };
  if (params) take(params_);
  if (buffers) take(buffers_);
  for (const auto& [n, m] : children_)
    m->collect(joined_path(prefix, n), params, buffers, dedup, out, seen);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  std::vector<const TensorImpl*> seen;
  collect("", true, false, true, out, seen);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  std::vector<const TensorImpl*> seen;
  collect("", false, true, true, out, seen);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters())
    out.push_back(t);
  return out;
}

std::vector<Tensor> Module::buffers() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_buffers())
    out.push_back(t);
  return out;
}

NamedTensors Module::state_dict() const {
  NamedTensors out;
  std::vector<const TensorImpl*> seen;
  collect("", true, true, false, out, seen);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules() {
  std::vector<std::pair<std::string, Module*>> out{{"", this}};
  for (const auto& [n, m] : children_) {
    for (auto& [path, sub] : m->named_modules())
      out.emplace_back(joined_path(n, path), sub);
  }
  return out;
}

void Module::apply(const std::function<void(Module&)>& fn) {
  for (const auto& [n, m] : children_)
    m->apply(fn);
  fn(*this);
}

// ---- loading -----------------------------------------------------------------------------------

LoadResult Module::load_state_dict(const NamedTensors& entries, bool strict) {
  std::map<std::string, const Tensor*> given;
  for (const auto& [name, t] : entries) {
    MT_CHECK(given.emplace(name, &t).second, "load_state_dict: the key \"", name,
             "\" appears twice in the entries");
    MT_CHECK(t.defined(), "load_state_dict: the entry \"", name, "\" is undefined");
  }
  const NamedTensors own = state_dict();
  LoadResult result;
  std::vector<std::pair<Tensor, const Tensor*>> copies;
  std::map<std::string, bool> known;
  for (const auto& [name, t] : own) {
    known[name] = true;
    auto it = given.find(name);
    if (it == given.end()) {
      result.missing_keys.push_back(name);
      continue;
    }
    const Tensor& src = *it->second;
    MT_CHECK(src.shape() == t.shape(), "load_state_dict: shape mismatch for \"", name,
             "\": the entry is ", src.shape().str(), " but the model's tensor is ",
             t.shape().str());
    MT_CHECK(src.is_floating_point() == t.is_floating_point(), "load_state_dict: \"", name,
             "\" is a ", src.describe(), " but the model's tensor is a ", t.describe(),
             "; floating and integer tensors do not convert into each other");
    copies.emplace_back(t, &src);
  }
  for (const auto& [name, t] : entries) {
    if (!known.count(name)) result.unexpected_keys.push_back(name);
  }
  if (strict && (!result.missing_keys.empty() || !result.unexpected_keys.empty())) {
    std::string msg = "load_state_dict (strict) into " + type_name_ + ":";
    if (!result.missing_keys.empty()) msg += " missing keys: " + join(result.missing_keys) + ".";
    if (!result.unexpected_keys.empty())
      msg += " unexpected keys: " + join(result.unexpected_keys) + ".";
    msg += " Pass strict = false to load the keys that match.";
    MT_CHECK(false, msg);
  }
  NoGrad ng;
  for (auto& [dst, src] : copies) {
    Tensor target = dst;
    target.copy_(src->to(target.device()));
  }
  return result;
}

// ---- modes and conversions ---------------------------------------------------------------------

Module& Module::train(bool on) {
  training_ = on;
  for (const auto& [n, m] : children_)
    m->train(on);
  return *this;
}

void Module::convert(const std::function<Tensor(const Tensor&)>& fn,
                     const std::function<bool(const Module&)>& include) {
  for (const auto& [n, m] : children_)
    m->convert(fn, include);
  if (include && !include(*this)) return;
  NoGrad ng;
  for (auto* slots : {&params_, &buffers_}) {
    for (Slot& s : *slots) {
      const Tensor converted = fn(s.tensor->detach());
      if (converted.dtype() != s.tensor->dtype() || converted.device() != s.tensor->device()) {
        s.tensor->set_data(converted);
      }
    }
  }
}

Module& Module::to(DType dtype) {
  return to(dtype, nullptr);
}

Module& Module::to(DType dtype, const std::function<bool(const Module&)>& include) {
  MT_CHECK(is_floating(dtype), "Module::to: ", dtype_name(dtype),
           " is not a floating dtype; parameters stay floating");
  convert([dtype](const Tensor& t) { return t.is_floating_point() ? t.to(dtype) : t; }, include);
  return *this;
}

Module& Module::to(Device device) {
  convert([device](const Tensor& t) { return t.to(device); }, nullptr);
  return *this;
}

void Module::zero_grad(bool set_to_none) {
  for (const Tensor& p : parameters()) {
    if (!p.grad().defined()) continue;
    if (set_to_none) {
      p.set_grad(Tensor());
    } else {
      NoGrad ng;
      Tensor g = p.grad();
      g.zero_();
    }
  }
}

// ---- description -------------------------------------------------------------------------------

int64_t Module::num_parameters(bool trainable_only) const {
  int64_t n = 0;
  for (const auto& [name, t] : named_parameters()) {
    if (!trainable_only || t.requires_grad()) n += t.numel();
  }
  return n;
}

void Module::describe_into(std::string& out, const std::string& label, int depth) const {
  std::ostringstream line;
  line << std::string(size_t(depth) * 2, ' ');
  if (!label.empty()) line << "(" << label << ") ";
  line << type_name_;
  const std::string extra = extra_repr();
  if (!extra.empty()) line << "(" << extra << ")";
  std::vector<std::string> own;
  for (auto* slots : {&params_, &buffers_}) {
    for (const Slot& s : *slots) {
      std::ostringstream entry;
      entry << s.name << ' ' << s.tensor->shape().str();
      if (s.tensor->dtype() != DType::F32) entry << ' ' << dtype_name(s.tensor->dtype());
      own.push_back(entry.str());
    }
  }
  if (!own.empty()) line << ": " << join(own, 64);
  const int64_t n = num_parameters();
  if (n > 0) line << "  [" << with_commas(n) << (depth == 0 ? " parameters]" : "]");
  line << '\n';
  out += line.str();
  for (const auto& [name, m] : children_)
    m->describe_into(out, name, depth + 1);
}

std::string Module::describe() const {
  std::string out;
  describe_into(out, "", 0);
  return out;
}

// ---- Sequential --------------------------------------------------------------------------------

Sequential::Sequential(std::initializer_list<ModulePtr> modules) : Module("Sequential") {
  for (const ModulePtr& m : modules)
    push_back(m);
}

Sequential::Sequential(std::vector<ModulePtr> modules) : Module("Sequential") {
  for (ModulePtr& m : modules)
    push_back(std::move(m));
}

const ModulePtr& Sequential::operator[](size_t i) const {
  MT_CHECK(i < size(), "Sequential: index ", i, " is out of range for ", size(), " modules");
  return named_children()[i].second;
}

TensorList Module::call_list(const TensorList& inputs) {
  autograd::ModuleScope scope(this, type_name_);
  if (!forward_hooks_.empty()) run_hooks_before();
  TensorList out = forward_list(inputs);
  if (!forward_hooks_.empty()) run_hooks_after(out);
  return out;
}

int Module::add_forward_hooks(ForwardHooks hooks) {
  forward_hooks_.emplace_back(next_hook_, std::move(hooks));
  return next_hook_++;
}

void Module::remove_forward_hooks(int handle) {
  std::erase_if(forward_hooks_, [handle](const auto& h) { return h.first == handle; });
}

void Module::run_hooks_before() {
  for (auto& [handle, h] : forward_hooks_)
    if (h.before) h.before(*this);
}

void Module::run_hooks_after(const TensorList& outputs) {
  for (auto& [handle, h] : forward_hooks_)
    if (h.after) h.after(*this, outputs);
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (const auto& [n, m] : named_children())
    h = (*m)(h);  // the call operator: each child's scope (anomaly reports name it)
  return h;
}

TensorList Sequential::forward_list(const TensorList& inputs) {
  TensorList h = inputs;
  for (const auto& [n, m] : named_children())
    h = (*m)(h);
  return h;
}

// ---- functional_call ---------------------------------------------------------------------------

struct SlotAccess {
  static Tensor& slot(Module& m, const std::string& name) { return m.parameter_slot(name); }
};

namespace {

// Runs f() with `replacements` swapped into `module`'s slots, restoring them afterwards.
template <typename F>
auto with_replacements(Module& module, const NamedTensors& replacements, F f) {
  // Resolve every name first: nothing is swapped unless all of them exist.
  std::vector<std::pair<Tensor*, Tensor>> swaps;
  for (const auto& [name, t] : replacements) {
    const size_t dot = name.rfind('.');
    Module* owner = &module;
    if (dot != std::string::npos) {
      owner = nullptr;
      const std::string path = name.substr(0, dot);
      for (auto& [p, m] : module.named_modules()) {
        if (p == path) owner = m;
      }
      MT_CHECK(owner != nullptr, "functional_call: ", module.name(), " has no submodule \"", path,
               "\" (from the name \"", name, "\")");
    }
    Tensor& slot = SlotAccess::slot(*owner, dot == std::string::npos ? name : name.substr(dot + 1));
    MT_CHECK(t.defined(), "functional_call: the replacement for \"", name, "\" is undefined");
    swaps.emplace_back(&slot, t);
  }
  struct Restore {
    std::vector<std::pair<Tensor*, Tensor>>& s;
    ~Restore() {
      for (auto it = s.rbegin(); it != s.rend(); ++it)
        std::swap(*it->first, it->second);
    }
  };
  for (auto& [slot, t] : swaps)
    std::swap(*slot, t);
  Restore restore{swaps};
  return f();
}

}  // namespace

Tensor functional_call(Module& module, const NamedTensors& replacements, const Tensor& x) {
  return with_replacements(module, replacements, [&] { return module.forward(x); });
}

TensorList functional_call(Module& module, const NamedTensors& replacements,
                           const TensorList& inputs) {
  return with_replacements(module, replacements, [&] { return module.forward_list(inputs); });
}

}  // namespace mantissa::nn
