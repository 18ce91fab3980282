// Module: a tree of layers that owns parameters (leaf tensors that require grad) and buffers
// (state that is saved but not trained, e.g. BatchNorm's running statistics), named with dotted
// paths exactly as PyTorch's state_dict names them ("features.0.weight", "bn1.running_mean").
//
// Tensors are registered into slots the module owns; layers keep a reference to their slot.
// Everything that changes a model's numbers acts on those handles in place — load_state_dict
// copies into them, to(DType) swaps their data with Tensor::set_data — so an optimizer built
// from parameters() before either call keeps training the same tensors.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mantissa/autograd/anomaly.h"
#include "mantissa/core/error.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::nn {

// Several tensors in or out of a module (PyTorch's forward(*args) and tuple outputs).
using TensorList = std::vector<Tensor>;

class Module;
using ModulePtr = std::shared_ptr<Module>;

// How a block of layers (a TransformerBlock, each layer of an LSTM) keeps what its backward
// needs. PerBlock runs the block through autograd::checkpoint: its forward keeps only the block's
// input and backward runs it again (same random numbers, same autocast state), trading one more
// forward of the blocks for their activations' memory. The gradients are bit-identical.
enum class ActivationCheckpointing { Off, PerBlock };

// What a non-strict load_state_dict left out.
struct LoadResult {
  std::vector<std::string> missing_keys;     // in the model, not in the entries
  std::vector<std::string> unexpected_keys;  // in the entries, not in the model
};

class Module;

// Sees the output of every call of a layer (a module without children, called with one tensor)
// on this thread while it lives, e.g. to hook the gradients of every activation (the underflow
// measurement, train/underflow.cpp). Observers nest: the innermost one sees the calls.
class OutputObserver {
 public:
  using Fn = std::function<void(const Module& layer, const Tensor& output)>;
  explicit OutputObserver(Fn fn);
  ~OutputObserver();
  OutputObserver(const OutputObserver&) = delete;
  OutputObserver& operator=(const OutputObserver&) = delete;

 private:
  Fn fn_;
  OutputObserver* previous_;
  friend void observe_output(const Module& module, const Tensor& output);
};

// Hands `output` of `module` to this thread's observer, if any and if the module is a layer.
void observe_output(const Module& module, const Tensor& output);

class Module {
 public:
  explicit Module(std::string type_name = "Module");
  virtual ~Module() = default;
  // A module is identified by its tensors' handles: copying one would alias or split them.
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // The computation. A module overrides one of the two, or both:
  //   forward(x)              one tensor in, one out (most layers);
  //   forward_list(inputs)    any number in and out: a recommender's {dense, categorical}, an
  //                           LSTM's {x, h0, c0} -> {y, h_n, c_n}.
  // Each defaults to the other: forward(x) is forward_list({x}) with exactly one output, and
  // forward_list({x}) is {forward(x)}; a module that overrides neither, or is called with a
  // count it does not take, throws a mantissa::Error saying what it takes.
  virtual Tensor forward(const Tensor& x);
  virtual TensorList forward_list(const TensorList& inputs);
  // A call opens the module's scope for anomaly detection (autograd/anomaly.h): its ops are
  // reported as running in it.
  Tensor operator()(const Tensor& x) {
    autograd::ModuleScope scope(this, type_name_);
    if (!forward_hooks_.empty()) run_hooks_before();
    Tensor y = forward(x);
    observe_output(*this, y);
    if (!forward_hooks_.empty()) run_hooks_after({y});
    return y;
  }
  TensorList operator()(const TensorList& inputs) { return call_list(inputs); }
  // model({x}) and model({a, b}): the list forward (a braced list prefers this overload).
  TensorList operator()(std::initializer_list<Tensor> inputs) {
    return call_list(TensorList(inputs));
  }
  // model(a, b, ...) with two or more tensors: forward_list({a, b, ...}).
  template <typename... Rest>
  TensorList operator()(const Tensor& a, const Tensor& b, const Rest&... rest) {
    return call_list(TensorList{a, b, rest...});
  }

  // ---- forward hooks (PyTorch's register_forward_pre_hook and register_forward_hook) ---------
  // Run around every call of this module through operator() (not a direct forward(), nor
  // forward_cached's generation): `before` first, `after` with the outputs, e.g. ZeRO-3
  // gathering a block's parameters before it runs, releasing them after and hooking its
  // output's gradient. Either may be empty. Hooks run in the order they were added.
  struct ForwardHooks {
    std::function<void(Module&)> before;
    std::function<void(Module&, const TensorList& outputs)> after;
  };
  int add_forward_hooks(ForwardHooks hooks);  // a handle for remove_forward_hooks
  void remove_forward_hooks(int handle);

  // ---- registration (names: non-empty, no '.', unique among this module's tensors/children) --
  // `value` must be a leaf; a floating one is marked requires_grad. Returns the module's slot.
  Tensor& register_parameter(const std::string& name, Tensor value);
  // Buffers never require grad (num_batches_tracked is an I64 buffer).
  Tensor& register_buffer(const std::string& name, Tensor value);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    static_assert(std::is_base_of_v<Module, M>, "register_module takes a Module subclass");
    add_child(name, module);
    return module;
  }
  // Swaps an existing child (e.g. a new classification head); returns the new one.
  template <typename M>
  std::shared_ptr<M> replace_module(const std::string& name, std::shared_ptr<M> module) {
    static_assert(std::is_base_of_v<Module, M>, "replace_module takes a Module subclass");
    set_child(name, module);
    return module;
  }

  // ---- traversal (PyTorch order: a module's own parameters, its buffers, then its children
  //      depth-first, in registration order) ---------------------------------------------------
  // Each tensor once: a tensor registered twice (tied weights) keeps its first name.
  NamedTensors named_parameters() const;
  NamedTensors named_buffers() const;
  std::vector<Tensor> parameters() const;
  std::vector<Tensor> buffers() const;
  // Every parameter and buffer under every name, tied ones included (like torch's state_dict).
  NamedTensors state_dict() const;
  // This module ("") and all below it, with their dotted paths.
  std::vector<std::pair<std::string, Module*>> named_modules();
  const std::vector<std::pair<std::string, ModulePtr>>& named_children() const { return children_; }
  // The child called `name` (throws listing the children there are).
  ModulePtr child(const std::string& name) const;
  // Calls fn on every submodule, children before parents, this module last (torch's apply).
  void apply(const std::function<void(Module&)>& fn);

  // Copies `entries` into this module's tensors in place (no graph, dtype converted), after
  // checking them all: a shape mismatch always throws (naming the key and both shapes); missing
  // or unexpected keys throw when strict, and are returned otherwise.
  LoadResult load_state_dict(const NamedTensors& entries, bool strict = true);

  // ---- modes and conversions -----------------------------------------------------------------
  Module& train(bool on = true);  // recursive
  Module& eval() { return train(false); }
  bool is_training() const { return training_; }
  // Converts floating parameters and buffers to `dtype` in place (Tensor::set_data): the
  // handles stay the same leaves with requires_grad, so optimizers holding them see the change.
  // A gradient of the old dtype is dropped. Integer buffers are left alone.
  Module& to(DType dtype);
  // The same, only for the tensors owned directly by modules where `include(module)` is true
  // (e.g. everything but batch norms: Apex O2's keep_batchnorm_fp32).
  Module& to(DType dtype, const std::function<bool(const Module&)>& include);
  Module& to(Device device);
  // Drops (set_to_none) or zeroes every parameter's gradient.
  void zero_grad(bool set_to_none = true);

  // ---- description ---------------------------------------------------------------------------
  const std::string& name() const { return type_name_; }  // "Linear", "ResNet", ...
  // Number of elements of the distinct parameters (tied weights counted once).
  int64_t num_parameters(bool trainable_only = false) const;
  // The layer tree, one module per line, with its configuration, tensor shapes and parameter
  // counts, like PyTorch's print(model) plus sizes.
  std::string describe() const;
  // The configuration shown in describe(), e.g. "in=784, out=256".
  virtual std::string extra_repr() const { return ""; }

 protected:
  // The slot of a registered parameter or buffer (throws naming the ones there are).
  Tensor& parameter_slot(const std::string& name);

 private:
  struct Slot {
    std::string name;
    std::unique_ptr<Tensor> tensor;  // stable address: layers keep a reference
  };
  friend struct SlotAccess;  // functional_call's swaps (module.cpp)
  void check_new_name(const std::string& name) const;
  void add_child(const std::string& name, ModulePtr module);
  void set_child(const std::string& name, ModulePtr module);
  void collect(const std::string& prefix, bool params, bool buffers, bool dedup, NamedTensors& out,
               std::vector<const TensorImpl*>& seen) const;
  void convert(const std::function<Tensor(const Tensor&)>& fn,
               const std::function<bool(const Module&)>& include);
  void describe_into(std::string& out, const std::string& label, int depth) const;
  TensorList call_list(const TensorList& inputs);
  void run_hooks_before();
  void run_hooks_after(const TensorList& outputs);

  std::string type_name_;
  std::vector<std::pair<int, ForwardHooks>> forward_hooks_;
  int next_hook_ = 0;
  bool training_ = true;
  std::vector<Slot> params_;
  std::vector<Slot> buffers_;
  std::vector<std::pair<std::string, ModulePtr>> children_;
};

// Chains modules: children "0", "1", ... in order; forward feeds each output to the next.
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  Sequential(std::initializer_list<ModulePtr> modules);
  explicit Sequential(std::vector<ModulePtr> modules);

  template <typename M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> module) {
    return register_module(std::to_string(size()), std::move(module));
  }
  size_t size() const { return named_children().size(); }
  const ModulePtr& operator[](size_t i) const;
  // Each module's output feeds the next: forward chains forward(x), forward_list chains
  // forward_list (a module may take or return several tensors).
  Tensor forward(const Tensor& x) override;
  TensorList forward_list(const TensorList& inputs) override;

 protected:
  explicit Sequential(std::string type_name) : Module(std::move(type_name)) {}
};

// Runs module.forward(x) (or forward_list(inputs)) with some of its parameters or buffers
// temporarily replaced by other tensors (torch.func.functional_call): gradients flow to the
// replacements. The originals are put back afterwards, also when forward throws. Names are
// state_dict names.
Tensor functional_call(Module& module, const NamedTensors& replacements, const Tensor& x);
TensorList functional_call(Module& module, const NamedTensors& replacements,
                           const TensorList& inputs);

}  // namespace mantissa::nn
