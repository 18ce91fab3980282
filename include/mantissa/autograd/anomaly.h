// Anomaly detection: the first inf or NaN of a training step, named where it was made.
//
//   autograd::DetectAnomaly on(names);  // this thread, while `on` lives
//   loss = model(x); loss.backward();   // throws a mantissa::Error at the first anomaly
//
// Every op that records a backward node has its outputs checked; an output that holds inf or NaN
// where none of its inputs did is where the anomaly was made, and the error names the op, the
// module it ran in (its path, e.g. "blocks.3.mlp.fc2", through `names`), forward or backward,
// the output's dtype and shape and how many values are inf or NaN, and the dtype, shape and
// smallest and largest magnitude of each input -- what Hugging Face's --debug
// underflow_overflow and torch.autograd.detect_anomaly give. A NaN that comes from outside the
// graph (a parameter, a buffer, the batch) is named as such where an op first reads it; an inf
// from outside is not an anomaly (masks hold -inf). Backward: each node's input gradients
// against its incoming ones, the same way (check_backward = false leaves gradients to a dynamic
// loss scaler, whose overflows are expected and skipped).
//
// Costly when on (each checked tensor is read back once); when off, a thread-local flag read per
// op and per module call.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "mantissa/tensor/tensor.h"

namespace mantissa::autograd {

class Node;

struct AnomalyNames {
  // The path of a module (what nn::ModuleScope was given), or "" when unknown.
  std::function<std::string(const void* module)> module;
  // The name of a tensor from outside the graph (a parameter's "fc1.weight"), or "".
  std::function<std::string(const Tensor& t)> tensor;
  // Where the run is, put before the report (the Trainer's "step 57"), or "".
  std::function<std::string()> context;
};

class DetectAnomaly {
 public:
  explicit DetectAnomaly(AnomalyNames names = {}, bool check_backward = true);
  ~DetectAnomaly();
  DetectAnomaly(const DetectAnomaly&) = delete;
  DetectAnomaly& operator=(const DetectAnomaly&) = delete;

 private:
  bool was_enabled_;
};

// Whether this thread checks for anomalies now. Out of line, like grad_enabled(): an extern
// thread_local read inline from other files is one that UBSan's build of g++ 12 reports as a
// null load.
bool anomaly_enabled();

// The module an op runs in: nn::Module's call operator opens one for the call (a no-op when
// anomaly detection is off).
class ModuleScope {
 public:
  ModuleScope(const void* module, std::string_view type) {
    if (anomaly_enabled()) push(module, type);
  }
  ~ModuleScope() {
    if (pushed_) pop();
  }
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;

 private:
  void push(const void* module, std::string_view type);
  void pop();
  bool pushed_ = false;
};

// Called by record() with a new node's op, inputs and outputs (and by the engine after a node's
// backward): throw the anomaly report, if there is one.
void check_forward(std::string_view op, const std::vector<Tensor>& inputs,
                   const std::vector<Tensor>& outputs, Node& node);
void check_backward(const Node& node, const std::vector<Tensor>& grad_outputs,
                    const std::vector<Tensor>& grad_inputs);

}  // namespace mantissa::autograd
