// Joining, splitting and indexing: cat, stack, split, chunk, index_select, gather, embedding.
#include <algorithm>
#include <numeric>

#include "backend/backend.h"
#include "mantissa/autocast/autocast.h"
#include "mantissa/autograd/engine.h"
#include "mantissa/core/error.h"
#include "mantissa/tensor/ops.h"

namespace mantissa {

Tensor cat(const std::vector<Tensor>& tensors_arg, int64_t dim_in) {
  MT_CHECK(!tensors_arg.empty(), "cat needs at least one tensor");
  std::vector<Tensor> cast_list;
  if (amp::autocast_active()) cast_list = amp::autocast_list(amp::OpId::Cat, tensors_arg);
  const std::vector<Tensor>& tensors = amp::autocast_active() ? cast_list : tensors_arg;
  const Tensor& first = tensors[0];
  const int dim = wrap_dim(dim_in, first.dim());
  DType dt = first.dtype();
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    MT_CHECK(t.dim() == first.dim(), "cat: tensor ", i, " is a ", t.describe(),
             " but tensor 0 is a ", first.describe(), " (all need the same number of dims)");
    MT_CHECK(t.device() == first.device(), "cat: tensor ", i, " is on ", t.device().str());
    for (int d = 0; d < t.dim(); ++d) {
      MT_CHECK(d == dim || t.size(d) == first.size(d), "cat along dim ", dim_in, ": tensor ", i,
               " is a ", t.describe(), " but tensor 0 is a ", first.describe(),
               " (sizes must match except in the cat dim)");
    }
    dt = promote_types(dt, t.dtype());
    total += t.size(dim);
  }
  Shape shape = first.shape();
  shape[dim] = total;
  Tensor out = Tensor::empty(shape, dt, first.device());
  {
    NoGrad ng;
    int64_t at = 0;
    for (const Tensor& t : tensors) {
      if (t.size(dim) == 0) continue;
      Tensor part = out.narrow(dim, at, t.size(dim));
      backend::backend_for(out.device()).copy(t, part);
      at += t.size(dim);
    }
  }
  std::vector<int64_t> sizes;
  for (const Tensor& t : tensors)
    sizes.push_back(t.size(dim));
  autograd::record("catBackward", tensors, {out}, [sizes, dim](const std::vector<Tensor>& g) {
    std::vector<Tensor> r;
    int64_t at = 0;
    for (int64_t s : sizes) {
      r.push_back(g[0].defined() ? g[0].narrow(dim, at, s).contiguous() : Tensor());
      at += s;
    }
    return r;
  });
  return out;
}

Tensor stack(const std::vector<Tensor>& tensors_arg, int64_t dim) {
  MT_CHECK(!tensors_arg.empty(), "stack needs at least one tensor");
  std::vector<Tensor> cast_list;
  if (amp::autocast_active()) cast_list = amp::autocast_list(amp::OpId::Stack, tensors_arg);
  const std::vector<Tensor>& tensors = amp::autocast_active() ? cast_list : tensors_arg;
  const int d = wrap_dim(dim, tensors[0].dim() + 1);
  std::vector<Tensor> expanded;
  for (size_t i = 0; i < tensors.size(); ++i) {
    MT_CHECK(tensors[i].shape() == tensors[0].shape(), "stack: tensor ", i, " is a ",
             tensors[i].describe(), " but tensor 0 is a ", tensors[0].describe(),
             " (all must have the same shape)");
    expanded.push_back(tensors[i].unsqueeze(d));
  }
  return cat(expanded, d);
}

// split and unbind make their parts as views of x with ONE node for all of them, whose backward
// joins the parts' gradients (zeros for a part that got none). A node per view (what narrow and
// select record) would hand x a gradient of x's full size from every part: a loop over the T
// time steps of a sequence would cost T full-size zero fills and additions in backward
// (the LSTM's backward spent 60% of its time there).
namespace {

template <typename Join>
void record_parts(const char* name, const Tensor& x, const std::vector<Tensor>& parts, Join join) {
  if (!autograd::needs_grad({&x})) return;
  std::vector<Shape> shapes;
  for (const Tensor& p : parts)
    shapes.push_back(p.shape());
  const DType dtype = x.dtype();
  const Device device = x.device();
  autograd::record(name, {x}, parts, [=](const std::vector<Tensor>& g) {
    std::vector<Tensor> grads;
    for (size_t i = 0; i < g.size(); ++i) {
      grads.push_back(g[i].defined() ? g[i] : Tensor::zeros(shapes[i], dtype, device));
    }
    return std::vector<Tensor>{join(grads)};
  });
}

// unbind's backward: the parts' gradients stacked along d into a tensor with x's strides when x
// is dense (a contiguous tensor permuted, transposed or reshaped), else stack(). unbind's input
// is typically such a view: attention's (3, B, heads, T, D) permuted from the qkv projection's
// (B, T, 3C). Laid out as x, its gradient is a view all the way back to the projection's; a
// contiguous stack would be copied once more at the reshape.
Tensor stack_like(const std::vector<Tensor>& g, int d, const Shape& shape, const Shape& strides) {
  const int n = shape.size();
  std::vector<int64_t> order(static_cast<size_t>(n));  // x's dims from the outermost in memory
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return strides[int(a)] > strides[int(b)]; });
  int64_t expected = 1;
  for (int k = n - 1; k >= 0; --k) {
    const int dim = int(order[size_t(k)]);
    if (shape[dim] != 1 && strides[dim] != expected) return stack(g, d);
    expected *= shape[dim];
  }
  DType dt = g[0].dtype();
  for (const Tensor& t : g)
    dt = promote_types(dt, t.dtype());
  Shape in_memory_order;
  std::vector<int64_t> back(static_cast<size_t>(n));
  for (int k = 0; k < n; ++k) {
    in_memory_order.push_back(shape[int(order[size_t(k)])]);
    back[size_t(order[size_t(k)])] = k;
  }
  const Tensor out = Tensor::empty(in_memory_order, dt, g[0].device()).permute(back);
  for (size_t i = 0; i < g.size(); ++i) {
    Tensor part = out.select(d, int64_t(i));
    backend::backend_for(out.device()).copy(g[i], part);
  }
  return out;
}

}  // namespace

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  MT_CHECK(split_size > 0, "split size must be positive, got ", split_size);
  const int d = wrap_dim(dim, x.dim());
  const Tensor base = x.detach();
  std::vector<Tensor> out;
  for (int64_t at = 0; at < x.size(d); at += split_size) {
    out.push_back(base.narrow(d, at, std::min(split_size, x.size(d) - at)));
  }
  record_parts("splitBackward", x, out, [d](const std::vector<Tensor>& g) { return cat(g, d); });
  return out;
}

std::vector<Tensor> unbind(const Tensor& x, int64_t dim) {
  const int d = wrap_dim(dim, x.dim());
  const Tensor base = x.detach();
  std::vector<Tensor> out;
  for (int64_t i = 0; i < x.size(d); ++i)
    out.push_back(base.select(d, i));
  record_parts("unbindBackward", x, out,
               [d, shape = x.shape(), strides = x.strides()](const std::vector<Tensor>& g) {
                 return stack_like(g, d, shape, strides);
               });
  return out;
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  MT_CHECK(chunks > 0, "chunk count must be positive, got ", chunks);
  const int64_t n = x.size(wrap_dim(dim, x.dim()));
  return split(x, std::max<int64_t>(1, (n + chunks - 1) / chunks), dim);
}

namespace {

void check_index_tensor(const Tensor& index, const char* op) {
  MT_CHECK(index.dtype() == DType::I64 || index.dtype() == DType::I32, op,
           ": indices must be an integer tensor (i64), got a ", index.describe());
}

// The gradient of an index read: zeros with the selected rows' gradients added back
// (accumulated in fp32 for half dtypes, so repeated indices don't lose precision).
Tensor index_add_grad(const Shape& x_shape, DType dtype, Device device, int dim,
                      const Tensor& index, const Tensor& grad) {
  const DType acc = (dtype == DType::F64) ? DType::F64 : DType::F32;
  Tensor gx = Tensor::zeros(x_shape, acc, device);
  backend::backend_for(device).index_add(gx, dim, index, grad.to(acc).contiguous());
  return gx.to(dtype);
}

}  // namespace

Tensor index_select(const Tensor& x, int64_t dim_in, const Tensor& index_in) {
  check_index_tensor(index_in, "index_select");
  MT_CHECK(index_in.dim() <= 1, "index_select: the index must be 1-D, got a ", index_in.describe());
  const int dim = wrap_dim(dim_in, x.dim());
  const Tensor index = index_in.to(DType::I64).contiguous().reshape({index_in.numel()});
  Shape shape = x.shape();
  shape[dim] = index.numel();
  Tensor out = Tensor::empty(shape, x.dtype(), x.device());
  const Tensor xc = x.detach().contiguous();
  backend::backend_for(x.device()).index_select(xc, dim, index, out);
  if (autograd::needs_grad({&x})) {
    const Shape xs = x.shape();
    const DType dt = x.dtype();
    const Device dev = x.device();
    autograd::record("index_selectBackward", {x}, {out}, [=](const std::vector<Tensor>& g) {
      if (!g[0].defined()) return std::vector<Tensor>{Tensor()};
      return std::vector<Tensor>{index_add_grad(xs, dt, dev, dim, index, g[0])};
    });
  }
  return out;
}

Tensor embedding(const Tensor& weight, const Tensor& indices) {
  check_index_tensor(indices, "embedding");
  MT_CHECK(weight.dim() == 2, "embedding: the weight must be (num_embeddings, dim), got a ",
           weight.describe());
  Shape out_shape = indices.shape();
  out_shape.push_back(weight.size(1));
  return index_select(weight, 0, indices.reshape({indices.numel()})).reshape(out_shape);
}

Tensor gather(const Tensor& x, int64_t dim_in, const Tensor& index_in) {
  check_index_tensor(index_in, "gather");
  const int dim = wrap_dim(dim_in, x.dim());
  MT_CHECK(index_in.dim() == x.dim(), "gather: the index (", index_in.describe(),
           ") must have as many dims as the input (", x.describe(), ")");
  for (int d = 0; d < x.dim(); ++d) {
    MT_CHECK(d == dim || index_in.size(d) == x.size(d), "gather: index ", index_in.describe(),
             " and input ", x.describe(), " must match in every dim but ", dim);
  }
  const Tensor index = index_in.to(DType::I64).contiguous();
  Tensor out = Tensor::empty(index.shape(), x.dtype(), x.device());
  backend::backend_for(x.device()).gather(x.detach().contiguous(), dim, index, out);
  if (autograd::needs_grad({&x})) {
    const Shape xs = x.shape();
    const DType dt = x.dtype();
    const Device dev = x.device();
    autograd::record("gatherBackward", {x}, {out}, [=](const std::vector<Tensor>& g) {
      if (!g[0].defined()) return std::vector<Tensor>{Tensor()};
      const DType acc = dt == DType::F64 ? DType::F64 : DType::F32;
      Tensor gx = Tensor::zeros(xs, acc, dev);
      backend::backend_for(dev).scatter_add(gx, dim, index, g[0].to(acc).contiguous());
      return std::vector<Tensor>{gx.to(dt)};
    });
  }
  return out;
}

}  // namespace mantissa
