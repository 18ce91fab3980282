// Recording ops into the graph and running backward.
#pragma once

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "mantissa/autograd/grad_mode.h"
#include "mantissa/autograd/node.h"

namespace mantissa::autograd {

// Whether an op with these inputs must record a node (grad mode on and some input requires
// grad). Undefined tensors are skipped.
bool needs_grad(std::initializer_list<const Tensor*> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);

// Makes `outputs` the results of a node whose backward is `fn`: fn receives one gradient per
// output (undefined when an output got none) and returns one per input (undefined = none).
// Does nothing unless needs_grad(inputs). Returns the node (null when nothing was recorded).
std::shared_ptr<Node> record(const std::string& name, const std::vector<Tensor>& inputs,
                             const std::vector<Tensor>& outputs, BackwardFn fn);

// A view's node: its gradient flows to `base` through `fn` (e.g. reshape back).
void record_view(const Tensor& base, const Tensor& view,
                 std::function<Tensor(const Tensor& grad)> fn);

// Refuses an in-place write to a leaf that requires grad while grad mode is on.
void check_inplace(const Tensor& t);

// The edge through which a gradient for `t` reaches the graph (its grad_fn, or its leaf's
// AccumulateGrad), or a null edge if t needs no gradient.
Edge gradient_edge(const Tensor& t);

// Runs backward from `roots` with `grads` (same length; undefined = ones for one-element roots).
void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
              bool retain_graph);

// The gradients of `outputs` w.r.t. `inputs` without touching .grad() (used by checkpointing).
std::vector<Tensor> grad(const std::vector<Tensor>& outputs,
                         const std::vector<Tensor>& grad_outputs, const std::vector<Tensor>& inputs,
                         bool retain_graph = false);

}  // namespace mantissa::autograd
