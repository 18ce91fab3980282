// Whether operations record the autograd graph, per thread.
#pragma once

namespace mantissa::autograd {

bool grad_enabled();
void set_grad_enabled(bool enabled);

// RAII: no graph is recorded inside (inference, optimizer updates, gradient bookkeeping).
class NoGrad {
 public:
  NoGrad() : prev_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGrad() { set_grad_enabled(prev_); }
  NoGrad(const NoGrad&) = delete;
  NoGrad& operator=(const NoGrad&) = delete;

 private:
  bool prev_;
};

// RAII: graph recording on again (inside a NoGrad region, e.g. checkpoint recomputation).
class EnableGrad {
 public:
  EnableGrad() : prev_(grad_enabled()) { set_grad_enabled(true); }
  ~EnableGrad() { set_grad_enabled(prev_); }
  EnableGrad(const EnableGrad&) = delete;
  EnableGrad& operator=(const EnableGrad&) = delete;

 private:
  bool prev_;
};

}  // namespace mantissa::autograd

namespace mantissa {
using autograd::NoGrad;
}
