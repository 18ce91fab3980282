#include "mantissa/autograd/engine.h"

#include "mantissa/autograd/anomaly.h"

#include <atomic>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "mantissa/core/error.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::autograd {

namespace {
thread_local bool t_grad_enabled = true;
std::atomic<uint64_t> g_sequence{0};
}  // namespace

bool grad_enabled() {
  return t_grad_enabled;
}
void set_grad_enabled(bool enabled) {
  t_grad_enabled = enabled;
}

// ---- nodes -------------------------------------------------------------------------------------

Node::Node(std::string name) : sequence_nr(g_sequence.fetch_add(1)), name_(std::move(name)) {}

SavedTensor::SavedTensor(const Tensor& t) {
  if (t.defined()) {
    data_ = t.detach();
    version_ = t.version();
  }
}

Tensor SavedTensor::unpack() const {
  if (data_.defined()) {
    MT_CHECK(data_.version() == version_, "a ", data_.describe(),
             " needed for a gradient was modified by an in-place "
             "operation after it was saved (version ",
             version_, " -> ", data_.version(),
             "); use an out-of-place op, or clone() the tensor before modifying it");
  }
  return data_;
}

AccumulateGrad::AccumulateGrad(const Tensor& leaf)
    : Node("AccumulateGrad"), leaf_(leaf.impl_ptr()) {}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grad_outputs) {
  auto impl = leaf_.lock();
  if (!impl || grad_outputs.empty() || !grad_outputs[0].defined()) return {};
  Tensor leaf(impl);
  Tensor g = std::move(grad_outputs[0]);  // sole owner, usually: then it is kept without a copy
  for (auto& [id, hook] : impl->autograd_meta().hooks) {
    Tensor r = hook(g);
    if (r.defined()) g = r;
  }
  if (g.dtype() != leaf.dtype()) g = g.to(leaf.dtype());
  if (g.shape() != leaf.shape()) g = sum_to_shape(g, leaf.shape());
  AutogradMeta& meta = impl->autograd_meta();
  if (!meta.grad.defined()) {
    // Own the gradient: another node may hold the same tensor (add passes grad through).
    meta.grad = g.impl_ptr().use_count() <= 1 && g.storage().use_count() <= 1 && g.is_contiguous()
                    ? g.detach()
                    : g.clone().detach();
  } else {
    meta.grad.add_(g);
  }
  for (auto& [id, hook] : meta.post_accumulate_hooks)
    hook(leaf);
  return {};
}

// ---- recording ---------------------------------------------------------------------------------

bool needs_grad(std::initializer_list<const Tensor*> inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor* t : inputs) {
    if (t && t->defined() && t->requires_grad()) return true;
  }
  return false;
}

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  AutogradMeta& meta = t.impl()->autograd_meta();
  if (meta.grad_fn) return {meta.grad_fn, meta.output_nr};
  auto acc = meta.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t);
    meta.grad_accumulator = acc;
  }
  return {acc, 0};
}

namespace {

// Checks what a backward function returned and converts each gradient to its input's dtype:
// the graph carries gradients in the dtype each tensor had in forward.
struct InputMeta {
  Shape shape;
  DType dtype;
};

class CheckedFunctionNode final : public Node {
 public:
  CheckedFunctionNode(std::string name, BackwardFn fn, std::vector<InputMeta> in,
                      std::vector<InputMeta> out)
      : Node(std::move(name)), fn_(std::move(fn)), in_(std::move(in)), out_(std::move(out)) {}

  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    MT_CHECK(fn_ != nullptr, "backward through the graph of '", name(),
             "' a second time, but its saved tensors were freed after the first backward; pass "
             "retain_graph=true to the first backward() if you need to run it twice");
    for (size_t i = 0; i < grads.size() && i < out_.size(); ++i) {
      if (grads[i].defined() && grads[i].dtype() != out_[i].dtype) {
        grads[i] = grads[i].to(out_[i].dtype);
      }
    }
    std::vector<Tensor> r = fn_(grads);
    MT_ASSERT(r.size() == in_.size(), name(), " returned ", r.size(), " gradients for ", in_.size(),
              " inputs");
    for (size_t i = 0; i < r.size(); ++i) {
      if (!r[i].defined() || !next_edges[i].node) {
        r[i] = Tensor();
        continue;
      }
      MT_ASSERT(r[i].shape() == in_[i].shape, name(), " gave a gradient of shape ",
                r[i].shape().str(), " for input ", i, " of shape ", in_[i].shape.str());
      if (r[i].dtype() != in_[i].dtype) r[i] = r[i].to(in_[i].dtype);
    }
    return r;
  }
  void release() override { fn_ = nullptr; }

 private:
  BackwardFn fn_;
  std::vector<InputMeta> in_, out_;
};

}  // namespace

std::shared_ptr<Node> record(const std::string& name, const std::vector<Tensor>& inputs,
                             const std::vector<Tensor>& outputs, BackwardFn fn) {
  if (!needs_grad(inputs)) return nullptr;
  std::vector<InputMeta> in, out;
  for (const Tensor& t : inputs) {
    in.push_back(t.defined() ? InputMeta{t.shape(), t.dtype()} : InputMeta{Shape{}, DType::F32});
  }
  for (const Tensor& t : outputs)
    out.push_back({t.shape(), t.dtype()});
  auto node =
      std::make_shared<CheckedFunctionNode>(name, std::move(fn), std::move(in), std::move(out));
  for (const Tensor& t : inputs)
    node->next_edges.push_back(gradient_edge(t));
  node->num_outputs = uint32_t(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) {
    AutogradMeta& meta = outputs[i].impl()->autograd_meta();
    meta.requires_grad = true;
    meta.grad_fn = node;
    meta.output_nr = uint32_t(i);
  }
  if (anomaly_enabled()) check_forward(name, inputs, outputs, *node);
  return node;
}

void record_view(const Tensor& base, const Tensor& view,
                 std::function<Tensor(const Tensor& grad)> fn) {
  if (!needs_grad({&base})) return;
  record("ViewBackward", {base}, {view},
         [fn = std::move(fn)](const std::vector<Tensor>& g) -> std::vector<Tensor> {
           if (!g[0].defined()) return {Tensor()};
           return {fn(g[0])};
         });
}

void check_inplace(const Tensor& t) {
  if (!grad_enabled() || !t.defined() || !t.requires_grad()) return;
  MT_CHECK(!t.is_leaf(), "an in-place operation on a leaf ", t.describe(),
           " that requires grad would lose its gradient history; wrap the update in NoGrad "
           "(as optimizers do) or use an out-of-place op");
}

// ---- the engine --------------------------------------------------------------------------------

namespace {

struct ByLatest {
  bool operator()(const Node* a, const Node* b) const { return a->sequence_nr < b->sequence_nr; }
};

void run_engine(const std::vector<Edge>& roots, const std::vector<Tensor>& root_grads,
                bool retain_graph, std::unordered_map<Node*, Tensor>* capture) {
  // Count, for each node, how many edges lead to it from the part of the graph we run.
  std::unordered_map<Node*, int> deps;
  std::vector<std::shared_ptr<Node>> visited;  // keeps every node alive while running
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  for (const Edge& e : roots) {
    if (e.node && seen.insert(e.node.get()).second) {
      stack.push_back(e.node.get());
      visited.push_back(e.node);
    }
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges) {
      if (!e.node) continue;
      ++deps[e.node.get()];
      if (seen.insert(e.node.get()).second) {
        stack.push_back(e.node.get());
        visited.push_back(e.node);
      }
    }
  }

  std::unordered_map<Node*, std::vector<Tensor>> buffers;
  auto add_grad = [&](Node* n, uint32_t slot, Tensor g) {
    auto& buf = buffers[n];
    if (buf.size() < n->num_outputs) buf.resize(std::max<size_t>(n->num_outputs, slot + 1));
    buf[slot] = buf[slot].defined() ? add(buf[slot], g) : std::move(g);
  };
  std::priority_queue<Node*, std::vector<Node*>, ByLatest> ready;
  for (size_t i = 0; i < roots.size(); ++i) {
    if (!roots[i].node) continue;
    add_grad(roots[i].node.get(), roots[i].input_nr, root_grads[i]);
  }
  for (const Edge& e : roots) {
    if (e.node && deps[e.node.get()] == 0) {
      deps[e.node.get()] = -1;  // queued
      ready.push(e.node.get());
    }
  }

  NoGrad no_grad;
  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    std::vector<Tensor> grads = std::move(buffers[n]);
    buffers.erase(n);
    grads.resize(std::max<size_t>(grads.size(), n->num_outputs));
    for (auto& [slot, hook] : n->pre_hooks) {
      if (slot < grads.size() && grads[slot].defined()) {
        Tensor r = hook.second(grads[slot]);
        if (r.defined()) grads[slot] = r;
      }
    }
    if (capture) {
      auto it = capture->find(n);
      if (it != capture->end()) {
        it->second = grads.empty() ? Tensor() : grads[0];
        continue;
      }
    }
    const std::vector<Tensor> grad_outputs =
        n->post_hooks.empty() && !anomaly_enabled() ? std::vector<Tensor>() : grads;
    std::vector<Tensor> outs = n->apply(std::move(grads));
    if (anomaly_enabled()) check_backward(*n, grad_outputs, outs);
    for (auto& hook : n->post_hooks)
      hook(outs, grad_outputs);
    // Each node runs once per backward: free what it saved now rather than when the whole
    // backward ends (as PyTorch does), so the backward's memory falls as it goes. With activation
    // checkpointing this is most of the saving: the loss's saved log-probabilities (B*T*vocab
    // floats) are gone before the first block is recomputed.
    if (!retain_graph) n->release();
    for (size_t i = 0; i < n->next_edges.size(); ++i) {
      const Edge& e = n->next_edges[i];
      if (!e.node) continue;
      if (i < outs.size() && outs[i].defined()) {
        add_grad(e.node.get(), e.input_nr, std::move(outs[i]));
      }
      if (--deps[e.node.get()] == 0) ready.push(e.node.get());
    }
  }
  if (!retain_graph) {
    for (auto& n : visited)
      n->release();  // those that did not run (captured by grad())
  }
}

std::vector<Tensor> root_gradients(const std::vector<Tensor>& roots,
                                   const std::vector<Tensor>& grads) {
  MT_CHECK(grads.empty() || grads.size() == roots.size(), "backward: ", grads.size(),
           " gradients for ", roots.size(), " outputs");
  std::vector<Tensor> out;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    MT_CHECK(r.defined(), "backward() of an undefined tensor");
    MT_CHECK(r.requires_grad(), "backward() of a ", r.describe(),
             " that does not require grad and has no grad_fn: no input of the computation "
             "requires grad (set_requires_grad(true) on the parameters, outside NoGrad)");
    Tensor g = i < grads.size() ? grads[i] : Tensor();
    if (!g.defined()) {
      MT_CHECK(r.numel() == 1,
               "backward() without a gradient needs a one-element output, got "
               "a ",
               r.describe(), "; pass the gradient of the loss w.r.t. it");
      g = Tensor::ones(r.shape(), r.dtype(), r.device());
    } else {
      MT_CHECK(g.shape() == r.shape(), "backward(): gradient of shape ", g.shape().str(),
               " for an output of shape ", r.shape().str());
    }
    out.push_back(g);
  }
  return out;
}

}  // namespace

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
              bool retain_graph) {
  const std::vector<Tensor> g = root_gradients(roots, grads);
  std::vector<Edge> edges;
  for (const Tensor& r : roots)
    edges.push_back(gradient_edge(r));
  run_engine(edges, g, retain_graph, nullptr);
}

std::vector<Tensor> grad(const std::vector<Tensor>& outputs,
                         const std::vector<Tensor>& grad_outputs, const std::vector<Tensor>& inputs,
                         bool retain_graph) {
  const std::vector<Tensor> g = root_gradients(outputs, grad_outputs);
  std::vector<Edge> edges;
  for (const Tensor& r : outputs)
    edges.push_back(gradient_edge(r));
  std::unordered_map<Node*, Tensor> capture;
  std::vector<Node*> keys;
  for (const Tensor& in : inputs) {
    Edge e = gradient_edge(in);
    MT_CHECK(e.node != nullptr, "grad(): an input (", in.describe(), ") does not require grad");
    MT_CHECK(in.is_leaf(), "grad(): inputs must be leaves here");
    capture[e.node.get()] = Tensor();
    keys.push_back(e.node.get());
  }
  run_engine(edges, g, retain_graph, &capture);
  std::vector<Tensor> out;
  for (Node* k : keys)
    out.push_back(capture[k]);
  return out;
}

}  // namespace mantissa::autograd

// ---- Tensor's autograd interface
// -----------------------------------------------------------------

namespace mantissa {

bool Tensor::requires_grad() const {
  const TensorImpl* t = impl();
  return t && t->autograd && (t->autograd->requires_grad || t->autograd->grad_fn);
}

Tensor& Tensor::set_requires_grad(bool on) {
  MT_CHECK(is_leaf(), "set_requires_grad() on a non-leaf ", describe(),
           " (the result of an op); use detach() to make a new leaf");
  MT_CHECK(!on || is_floating_point(), "only floating tensors can require grad, not a ",
           describe());
  impl()->autograd_meta().requires_grad = on;
  return *this;
}

bool Tensor::is_leaf() const {
  return !impl() || !impl()->autograd || !impl()->autograd->grad_fn;
}

Tensor Tensor::grad() const {
  const TensorImpl* t = impl();
  return t && t->autograd ? t->autograd->grad : Tensor();
}

void Tensor::set_grad(const Tensor& g) const {
  MT_CHECK(!g.defined() || g.shape() == shape(), "set_grad: a ", g.describe(),
           " cannot be the gradient of a ", describe());
  impl()->autograd_meta().grad = g.defined() ? g.detach() : Tensor();
}

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<autograd::Node> none;
  const TensorImpl* t = impl();
  return t && t->autograd ? t->autograd->grad_fn : none;
}

uint32_t Tensor::output_nr() const {
  const TensorImpl* t = impl();
  return t && t->autograd ? t->autograd->output_nr : 0;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd::backward({*this}, {gradient}, retain_graph);
}

int Tensor::register_hook(TensorHook hook) const {
  MT_CHECK(requires_grad(), "register_hook() on a ", describe(), " that does not require grad");
  AutogradMeta& meta = impl()->autograd_meta();
  const int id = meta.next_hook++;
  if (meta.grad_fn) {
    meta.grad_fn->pre_hooks.push_back({meta.output_nr, {id, std::move(hook)}});
  } else {
    meta.hooks.emplace_back(id, std::move(hook));
  }
  return id;
}

int Tensor::register_post_accumulate_grad_hook(PostAccumulateGradHook hook) const {
  MT_CHECK(requires_grad() && is_leaf(), "register_post_accumulate_grad_hook() on a ", describe(),
           ": only a leaf that requires grad accumulates a gradient");
  AutogradMeta& meta = impl()->autograd_meta();
  const int id = meta.next_hook++;
  meta.post_accumulate_hooks.emplace_back(id, std::move(hook));
  return id;
}

void Tensor::remove_hook(int handle) const {
  AutogradMeta& meta = impl()->autograd_meta();
  std::erase_if(meta.hooks, [&](const auto& h) { return h.first == handle; });
  std::erase_if(meta.post_accumulate_hooks, [&](const auto& h) { return h.first == handle; });
  if (meta.grad_fn) {
    std::erase_if(meta.grad_fn->pre_hooks, [&](const auto& h) { return h.second.first == handle; });
  }
}

void Tensor::retain_grad() const {
  if (is_leaf()) return;  // leaves keep their gradient anyway
  AutogradMeta& meta = impl()->autograd_meta();
  if (meta.retains_grad) return;
  meta.retains_grad = true;
  std::weak_ptr<TensorImpl> weak = impl_ptr();
  meta.grad_fn->pre_hooks.push_back({meta.output_nr, {-1, [weak](const Tensor& g) {
                                                        if (auto t = weak.lock()) {
                                                          AutogradMeta& m = t->autograd_meta();
                                                          m.grad = m.grad.defined()
                                                                       ? add(m.grad, g).detach()
                                                                       : g.clone().detach();
                                                        }
                                                        return Tensor();
                                                      }}});
}

}  // namespace mantissa
