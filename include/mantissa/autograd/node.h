// The backward graph: a Node per differentiable op, edges to the nodes of its inputs.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mantissa/tensor/tensor.h"

namespace mantissa::autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> node;  // null: the input needs no gradient
  uint32_t input_nr = 0;       // which of node's outputs-gradients this feeds
};

// A tensor kept for backward. It holds the data without the autograd state (so an output saved
// by its own node makes no reference cycle) and the storage version at save time: backward
// refuses a tensor that was modified in place after it was saved.
class SavedTensor {
 public:
  SavedTensor() = default;
  explicit SavedTensor(const Tensor& t);
  Tensor unpack() const;  // throws if modified in place since saved
  bool defined() const { return data_.defined(); }

 private:
  Tensor data_;
  uint32_t version_ = 0;
};

using PostHook = std::function<void(const std::vector<Tensor>& grad_inputs,
                                    const std::vector<Tensor>& grad_outputs)>;

class Node : public std::enable_shared_from_this<Node> {
 public:
  explicit Node(std::string name);
  virtual ~Node() = default;

  const std::string& name() const { return name_; }
  // Gradients w.r.t. the op's inputs (one per next edge; undefined = none) from gradients
  // w.r.t. its outputs (undefined where an output got none: treat as zero).
  virtual std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) = 0;
  // Frees what backward needed; a later apply() must then fail with a clear message.
  virtual void release() {}

  std::vector<Edge> next_edges;
  uint64_t sequence_nr;      // creation order: later nodes run first
  uint32_t num_outputs = 1;  // forward outputs, i.e. gradients this node receives
  // Hooks on the gradient of forward output i (a tensor's register_hook on a non-leaf).
  std::vector<std::pair<uint32_t, std::pair<int, TensorHook>>> pre_hooks;
  std::vector<PostHook> post_hooks;
  void register_post_hook(PostHook h) { post_hooks.push_back(std::move(h)); }
  // With anomaly detection on (autograd/anomaly.h): the module the op ran in, for the report of
  // an anomaly in its backward. Compared, never dereferenced.
  const void* module = nullptr;
  std::string module_type;

 private:
  std::string name_;
};

// Gradients of a function recorded as a closure: the common case for ops (see engine.h record).
using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs)>;

// The sink of a leaf tensor: adds the incoming gradient into leaf.grad().
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(const Tensor& leaf);
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override;
  std::shared_ptr<TensorImpl> leaf() const { return leaf_.lock(); }

 private:
  std::weak_ptr<TensorImpl> leaf_;
};

}  // namespace mantissa::autograd
