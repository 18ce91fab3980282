// Reductions. Half inputs accumulate in fp32 and return their own dtype (as PyTorch does).
#include <algorithm>

#include "backend/backend.h"
#include "mantissa/autocast/autocast.h"
#include "mantissa/autograd/engine.h"
#include "mantissa/core/error.h"
#include "mantissa/tensor/ops.h"

namespace mantissa {

using backend::ReduceOp;

namespace {

// Sorted unique dims; empty list = all dims.
std::vector<int> normalize_dims(const Tensor& x, const std::vector<int64_t>& dims) {
  std::vector<int> out;
  if (dims.empty()) {
    for (int d = 0; d < x.dim(); ++d)
      out.push_back(d);
    return out;
  }
  for (int64_t d : dims)
    out.push_back(wrap_dim(d, x.dim()));
  std::sort(out.begin(), out.end());
  MT_CHECK(std::adjacent_find(out.begin(), out.end()) == out.end(),
           "a dim appears twice in the reduction dims");
  return out;
}

Shape keepdim_shape(const Tensor& x, const std::vector<int>& dims) {
  Shape s = x.shape();
  for (int d : dims)
    s[d] = 1;
  return s;
}

Shape squeezed_shape(const Tensor& x, const std::vector<int>& dims) {
  Shape s;
  for (int d = 0; d < x.dim(); ++d) {
    if (std::find(dims.begin(), dims.end(), d) == dims.end()) s.push_back(x.size(d));
  }
  return s;
}

// Runs a value reduction; returns the keepdim-shaped result.
Tensor run_reduce(ReduceOp op, const Tensor& x, const std::vector<int>& dims, DType out_dtype,
                  Tensor* indices = nullptr, int64_t correction = 0) {
  Tensor out = Tensor::empty(keepdim_shape(x, dims), out_dtype, x.device());
  backend::backend_for(x.device()).reduce(op, x, dims, out, indices, correction);
  return out;
}

// Gradient of a keepdim-shaped result broadcast back to x's shape.
Tensor expand_back(const Tensor& g, const Shape& keep_shape, const Shape& x_shape) {
  return g.reshape(keep_shape).expand(x_shape);
}

Tensor finish(const Tensor& out_keep, const Tensor& x, const std::vector<int>& dims, bool keepdim) {
  return keepdim ? out_keep : out_keep.reshape(squeezed_shape(x, dims));
}

DType sum_dtype(const Tensor& x) {
  // Integer sums stay exact in i64; bool counts.
  return x.is_floating_point() ? x.dtype() : DType::I64;
}

}  // namespace

Tensor sum(const Tensor& x_arg, const std::vector<int64_t>& dims_in, bool keepdim) {
  const amp::AutocastInputs cast_in(amp::OpId::Sum, x_arg);
  const Tensor& x = cast_in[0];
  const std::vector<int> dims = normalize_dims(x, dims_in);
  const Tensor src = x.dtype() == DType::Bool ? x.to(DType::I64) : x;
  Tensor out;
  {
    NoGrad ng;
    out = finish(run_reduce(ReduceOp::Sum, src, dims, sum_dtype(src)), src, dims, keepdim);
  }
  if (autograd::needs_grad({&x})) {
    const Shape keep = keepdim_shape(x, dims), xs = x.shape();
    autograd::record("sumBackward", {x}, {out}, [=](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].defined() ? expand_back(g[0], keep, xs) : Tensor()};
    });
  }
  return out;
}

Tensor sum(const Tensor& x) {
  return sum(x, {}, false);
}

Tensor mean(const Tensor& x_arg, const std::vector<int64_t>& dims_in, bool keepdim) {
  const amp::AutocastInputs cast_in(amp::OpId::Mean, x_arg);
  const Tensor& x = cast_in[0];
  MT_CHECK(x.is_floating_point(), "mean needs a floating tensor, got a ", x.describe(),
           "; cast with to(DType::F32)");
  const std::vector<int> dims = normalize_dims(x, dims_in);
  Tensor out;
  {
    NoGrad ng;
    out = finish(run_reduce(ReduceOp::Mean, x, dims, x.dtype()), x, dims, keepdim);
  }
  if (autograd::needs_grad({&x})) {
    const Shape keep = keepdim_shape(x, dims), xs = x.shape();
    int64_t n = 1;
    for (int d : dims)
      n *= x.size(d);
    autograd::record("meanBackward", {x}, {out}, [=](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].defined() ? mul(expand_back(g[0], keep, xs), 1.0 / double(n))
                                                : Tensor()};
    });
  }
  return out;
}

Tensor mean(const Tensor& x) {
  return mean(x, {}, false);
}

Tensor var(const Tensor& x_arg, const std::vector<int64_t>& dims_in, int64_t correction,
           bool keepdim) {
  const amp::AutocastInputs cast_in(amp::OpId::Var, x_arg);
  const Tensor& x = cast_in[0];
  MT_CHECK(x.is_floating_point(), "var needs a floating tensor, got a ", x.describe());
  const std::vector<int> dims = normalize_dims(x, dims_in);
  Tensor out;
  {
    NoGrad ng;
    out = finish(run_reduce(ReduceOp::Var, x, dims, x.dtype(), nullptr, correction), x, dims,
                 keepdim);
  }
  if (autograd::needs_grad({&x})) {
    const Shape keep = keepdim_shape(x, dims), xs = x.shape();
    int64_t n = 1;
    for (int d : dims)
      n *= x.size(d);
    autograd::SavedTensor sx(x);
    std::vector<int64_t> dims64(dims.begin(), dims.end());
    autograd::record("varBackward", {x}, {out}, [=](const std::vector<Tensor>& g) {
      if (!g[0].defined()) return std::vector<Tensor>{Tensor()};
      // d var / dx = 2 (x - mean) / (n - correction)
      const Tensor xv = sx.unpack();
      const Tensor centered = sub(xv, mean(xv, dims64, true));
      const Tensor scale = mul(expand_back(g[0], keep, xs), 2.0 / double(n - correction));
      return std::vector<Tensor>{mul(centered, scale)};
    });
  }
  return out;
}

namespace {

ValuesIndices max_min(ReduceOp op, const Tensor& x, int64_t dim_in, bool keepdim) {
  const char* name = backend::reduce_info(op).name;
  MT_CHECK(x.numel() > 0, name, " of an empty ", x.describe());
  const std::vector<int> dims = {wrap_dim(dim_in, x.dim())};
  Tensor idx = Tensor::empty(keepdim_shape(x, dims), DType::I64, x.device());
  Tensor values;
  {
    NoGrad ng;
    values = run_reduce(op, x, dims, x.dtype(), &idx);
  }
  ValuesIndices r{finish(values, x, dims, keepdim), finish(idx, x, dims, keepdim)};
  if (autograd::needs_grad({&x})) {
    const Tensor saved_idx = idx;  // keepdim-shaped I64, never modified
    const Shape keep = keepdim_shape(x, dims), xs = x.shape();
    const int d = dims[0];
    const DType dt = x.dtype();
    const Device dev = x.device();
    autograd::record(
        std::string(name) + "Backward", {x}, {r.values}, [=](const std::vector<Tensor>& g) {
          if (!g[0].defined()) return std::vector<Tensor>{Tensor()};
          Tensor gx = Tensor::zeros(xs, dt, dev);
          backend::backend_for(dev).scatter_add(gx, d, saved_idx, g[0].reshape(keep).contiguous());
          return std::vector<Tensor>{gx};
        });
  }
  return r;
}

}  // namespace

ValuesIndices max(const Tensor& x, int64_t dim, bool keepdim) {
  return max_min(ReduceOp::Max, x, dim, keepdim);
}

ValuesIndices min(const Tensor& x, int64_t dim, bool keepdim) {
  return max_min(ReduceOp::Min, x, dim, keepdim);
}

Tensor max(const Tensor& x) {
  return max(x.reshape({x.numel()}), 0, false).values;
}

Tensor argmax(const Tensor& x, int64_t dim, bool keepdim) {
  MT_CHECK(x.numel() > 0, "argmax of an empty ", x.describe());
  const std::vector<int> dims = {wrap_dim(dim, x.dim())};
  Tensor out = run_reduce(ReduceOp::ArgMax, x, dims, DType::I64);
  return finish(out, x, dims, keepdim);
}

Tensor sum_to_shape(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const int lead = x.dim() - shape.size();
  MT_CHECK(lead >= 0, "sum_to_shape: cannot reduce a ", x.describe(), " to ", shape.str());
  std::vector<int64_t> dims;
  for (int i = 0; i < x.dim(); ++i) {
    if (i < lead) {
      dims.push_back(i);
    } else if (shape[i - lead] == 1 && x.size(i) != 1) {
      dims.push_back(i);
    } else {
      MT_CHECK(shape[i - lead] == x.size(i), "sum_to_shape: cannot reduce a ", x.describe(), " to ",
               shape.str());
    }
  }
  if (dims.empty()) return x.reshape(shape);
  return sum(x, dims, true).reshape(shape);
}

}  // namespace mantissa
