#include "mantissa/autograd/anomaly.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <utility>

#include "mantissa/autograd/grad_mode.h"
#include "mantissa/autograd/node.h"
#include "mantissa/core/error.h"

namespace mantissa::autograd {

namespace {

thread_local bool t_anomaly_enabled = false;

struct AnomalyState {
  AnomalyNames names;
  bool check_backward = true;
  std::vector<std::pair<const void*, std::string>> modules;  // the scopes, innermost last
};
thread_local AnomalyState* t_state = nullptr;

// What a tensor holds: its non-finite values and the range of its magnitudes.
struct Scan {
  int64_t n = 0, nan = 0, inf = 0;
  double min_abs = std::numeric_limits<double>::infinity(), max_abs = 0;
  bool finite() const { return nan == 0 && inf == 0; }
};

template <typename T>
void scan_values(const std::vector<T>& v, Scan& s) {
  for (const T x : v) {
    if (std::isnan(x)) {
      ++s.nan;
    } else if (std::isinf(x)) {
      ++s.inf;
    } else {
      const double a = std::fabs(double(x));
      s.min_abs = std::min(s.min_abs, a);
      s.max_abs = std::max(s.max_abs, a);
    }
  }
}

Scan scan(const Tensor& t) {
  Scan s;
  if (!t.defined() || !t.is_floating_point() || t.numel() == 0) return s;
  NoGrad no_grad;
  s.n = t.numel();
  // Read back once, in a type that holds every value of the tensor's own.
  if (t.dtype() == DType::F64) {
    scan_values(t.detach().contiguous().to_vector<double>(), s);
  } else {
    scan_values(t.detach().to(DType::F32).to_vector<float>(), s);
  }
  return s;
}

// Each tensor's scan, and whether any holds inf/NaN.
std::vector<Scan> scan_all(const std::vector<Tensor>& ts, bool* any_nonfinite = nullptr) {
  std::vector<Scan> out;
  for (const Tensor& t : ts) {
    out.push_back(scan(t));
    if (any_nonfinite != nullptr && !out.back().finite()) *any_nonfinite = true;
  }
  return out;
}

std::string describe(const Tensor& t) {
  return std::string(dtype_name(t.dtype())) + " " + t.shape().str();
}

std::string holds(const Scan& s) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "%lld inf and %lld NaN of %lld values", (long long)s.inf,
                (long long)s.nan, (long long)s.n);
  return buf;
}

std::string magnitudes(const Scan& s) {
  if (s.n == 0) return "empty";
  if (s.nan + s.inf == s.n) return holds(s);
  char buf[160];
  std::snprintf(buf, sizeof buf, "|x| from %.4g to %.4g", s.min_abs, s.max_abs);
  return s.finite() ? std::string(buf) : std::string(buf) + ", and " + holds(s);
}

// "module 'blocks.3.mlp.fc2' (Linear)", or the chain of module types when no name is known.
std::string where(const void* module, const std::string& type) {
  const AnomalyState& st = *t_state;
  if (module == nullptr) return "outside any module";
  const std::string path = st.names.module ? st.names.module(module) : "";
  if (!path.empty()) return "module '" + path + "' (" + type + ")";
  std::string chain;
  for (const auto& [m, t] : st.modules)
    chain += (chain.empty() ? "" : " > ") + t;
  return "module " + (chain.empty() ? type : chain);
}

// "anomaly: " or "anomaly at step 57: ".
std::string lead() {
  const std::string at = t_state->names.context ? t_state->names.context() : "";
  return at.empty() ? "anomaly: " : "anomaly at " + at + ": ";
}

std::string op_name(std::string_view node_name) {
  std::string op(node_name);
  constexpr std::string_view kSuffix = "Backward";
  if (op.size() > kSuffix.size() && op.ends_with(kSuffix)) op.resize(op.size() - kSuffix.size());
  return op;
}

// Whether `made` holds what none of `from` did: a NaN where no source had one, or an inf where
// all sources were finite (an inf that came from a mask's -inf is no anomaly).
bool is_new(const Scan& made, const std::vector<Scan>& from) {
  if (made.finite()) return false;
  bool nan_in = false, nonfinite_in = false;
  for (const Scan& s : from) {
    nan_in = nan_in || s.nan > 0;
    nonfinite_in = nonfinite_in || !s.finite();
  }
  return (made.nan > 0 && !nan_in) || (made.inf > 0 && !nonfinite_in);
}

std::string inputs_text(const char* what, const std::vector<Tensor>& ts,
                        const std::vector<Scan>& scans) {
  std::string text;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (!ts[i].defined() || !ts[i].is_floating_point()) continue;
    text += (text.empty() ? "" : "; ") + std::string(what) + " " + std::to_string(i) + " " +
            describe(ts[i]) + " " + magnitudes(scans[i]);
  }
  return text.empty() ? "none of floating point" : text;
}

}  // namespace

bool anomaly_enabled() {
  return t_anomaly_enabled;
}

DetectAnomaly::DetectAnomaly(AnomalyNames names, bool check_backward)
    : was_enabled_(t_anomaly_enabled) {
  MT_CHECK(!was_enabled_, "anomaly detection is already on in this thread");
  t_state = new AnomalyState{std::move(names), check_backward, {}};
  t_anomaly_enabled = true;
}

DetectAnomaly::~DetectAnomaly() {
  t_anomaly_enabled = false;
  delete t_state;
  t_state = nullptr;
}

void ModuleScope::push(const void* module, std::string_view type) {
  t_state->modules.emplace_back(module, std::string(type));
  pushed_ = true;
}

void ModuleScope::pop() {
  // The state is gone when anomaly detection ended inside the module's call.
  if (t_state != nullptr && !t_state->modules.empty()) t_state->modules.pop_back();
}

void check_forward(std::string_view op_node, const std::vector<Tensor>& inputs,
                   const std::vector<Tensor>& outputs, Node& node) {
  AnomalyState& st = *t_state;
  if (!st.modules.empty()) {
    node.module = st.modules.back().first;
    node.module_type = st.modules.back().second;
  }
  bool any = false;
  const std::vector<Scan> out = scan_all(outputs, &any);
  if (!any) return;
  const std::vector<Scan> in = scan_all(inputs);
  const std::string op = op_name(op_node);
  const std::string at = where(node.module, node.module_type);
  // A NaN from outside the graph (a parameter, a buffer, the batch): named where it is first read.
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (in[i].nan == 0 || inputs[i].grad_fn()) continue;
    const std::string name = st.names.tensor ? st.names.tensor(inputs[i]) : "";
    MT_CHECK(false, lead(), name.empty() ? "a tensor from outside the graph" : "'" + name + "'",
             " (", describe(inputs[i]), ") holds ", holds(in[i]), ", read by ", op,
             " (forward) in ", at,
             name.empty() ? " (the batch, a buffer, or an op that records no gradient)" : "");
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!is_new(out[i], in)) continue;
    MT_CHECK(false, lead(), op, " (forward) in ", at, " made ", out[i].nan > 0 ? "NaN" : "inf",
             ": its output ", outputs.size() > 1 ? std::to_string(i) + " " : "",
             describe(outputs[i]), " holds ", holds(out[i]), ", from ",
             inputs_text("input", inputs, in));
  }
}

void check_backward(const Node& node, const std::vector<Tensor>& grad_outputs,
                    const std::vector<Tensor>& grad_inputs) {
  if (!t_state->check_backward) return;
  bool any = false;
  const std::vector<Scan> made = scan_all(grad_inputs, &any);
  if (!any) return;
  const std::vector<Scan> incoming = scan_all(grad_outputs);
  for (size_t i = 0; i < grad_inputs.size(); ++i) {
    if (!is_new(made[i], incoming)) continue;
    MT_CHECK(false, lead(), "the backward of ", op_name(node.name()), " in ",
             where(node.module, node.module_type), " made ", made[i].nan > 0 ? "NaN" : "inf",
             ": the gradient of its input ", i, " (", describe(grad_inputs[i]), ") holds ",
             holds(made[i]), ", from ", inputs_text("incoming gradient", grad_outputs, incoming));
  }
}

}  // namespace mantissa::autograd
