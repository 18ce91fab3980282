// Internal: the host-side shape bookkeeping every backend's kernels share.
#pragma once

#include <cstdint>

#include "mantissa/core/error.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::backend {

// (outer, n, inner) of a tensor around `dim`: the view softmax, the norms and the index ops
// iterate in (a 0-d tensor is one element).
struct DimSplit {
  int64_t outer = 1, n = 1, inner = 1;
};

inline DimSplit split_around(const Tensor& t, int dim) {
  DimSplit s;
  if (t.dim() == 0) return s;
  for (int d = 0; d < dim; ++d)
    s.outer *= t.size(d);
  s.n = t.size(dim);
  for (int d = dim + 1; d < t.dim(); ++d)
    s.inner *= t.size(d);
  return s;
}

// Which gradients a normalization backward computes (the defined outputs), after checking that
// the incoming gradient matches the input and grad_x (if wanted) can receive it.
struct WantedGrads {
  bool x, w, b;
};

inline WantedGrads wanted_grads(const char* op, const Tensor& g, const Tensor& x,
                                const Tensor* grad_x, const Tensor* grad_weight,
                                const Tensor* grad_bias) {
  MT_ASSERT(g.shape() == x.shape() && g.dtype() == x.dtype(), op, ": grad ", g.describe(),
            " for input ", x.describe());
  const WantedGrads w{grad_x && grad_x->defined(), grad_weight && grad_weight->defined(),
                      grad_bias && grad_bias->defined()};
  if (w.x) {
    MT_ASSERT(
        grad_x->is_contiguous() && grad_x->shape() == x.shape() && grad_x->dtype() == x.dtype(), op,
        " grad_x");
  }
  return w;
}

}  // namespace mantissa::backend
