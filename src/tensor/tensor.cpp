#include "mantissa/tensor/tensor.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>

#include "backend/backend.h"
#include "backend/device_hooks.h"
#include "mantissa/autograd/engine.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/error.h"
#include "mantissa/tensor/ops.h"
#include "tensor/layout.h"

namespace mantissa {

Storage::Storage(size_t bytes, Device dev) : Storage(bytes, dev, allocator_for(dev)) {}

Storage::Storage(size_t bytes, Device dev, Allocator& alloc)
    : nbytes(bytes), device(dev), allocator(&alloc) {
  data = alloc.allocate(bytes);
}

Storage::~Storage() {
  if (data != nullptr) allocator->deallocate(data, nbytes);
}

void Storage::release() {
  if (data == nullptr) return;
  allocator->deallocate(data, nbytes);
  data = nullptr;
}

void Storage::restore() {
  if (data == nullptr) data = allocator->allocate(nbytes);
}

namespace {

std::shared_ptr<TensorImpl> make_impl(std::shared_ptr<Storage> storage, const Shape& shape,
                                      const Shape& strides, int64_t offset, DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = shape;
  impl->strides = strides;
  impl->offset = offset;
  impl->dtype = dtype;
  return impl;
}

const TensorImpl& checked(const std::shared_ptr<TensorImpl>& impl) {
  MT_CHECK(impl != nullptr, "this Tensor is undefined (default-constructed or a missing gradient)");
  return *impl;
}

// A view of `self`; `backward` maps the view's gradient to self's shape (the inverse view op).
template <typename F>
Tensor make_view(const Tensor& self, const Shape& shape, const Shape& strides, int64_t offset,
                 F backward) {
  Tensor v(make_impl(self.storage(), shape, strides, offset, self.dtype()));
  if (autograd::needs_grad({&self})) autograd::record_view(self, v, std::move(backward));
  return v;
}

// The gradient of a view that selects part of a tensor: zeros with the view's part filled.
template <typename Select>
auto into_zeros(const Tensor& base, Select select) {
  const Shape shape = base.shape();
  const DType dtype = base.dtype();
  const Device device = base.device();
  return [=](const Tensor& g) {
    Tensor z = Tensor::zeros(shape, dtype, device);
    Tensor part = select(z);
    part.copy_(g);
    return z;
  };
}

auto reshape_back(const Tensor& base) {
  const Shape shape = base.shape();
  return [shape](const Tensor& g) { return g.reshape(shape); };
}

}  // namespace

// ---- factories ---------------------------------------------------------------------------------

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) {
    MT_CHECK(d >= 0, "negative dimension in shape ", shape.str());
  }
  auto storage = std::make_shared<Storage>(size_t(shape.numel()) * dtype_size(dtype), device);
  return Tensor(make_impl(std::move(storage), shape, contiguous_strides(shape), 0, dtype));
}

Tensor Tensor::empty_strided(const Shape& shape, const Shape& strides, DType dtype, Device device) {
  MT_CHECK(strides.size() == shape.size(), "empty_strided: ", strides.size(),
           " strides for the shape ", shape.str());
  for (int64_t d : shape) {
    MT_CHECK(d >= 0, "negative dimension in shape ", shape.str());
  }
  auto storage = std::make_shared<Storage>(size_t(shape.numel()) * dtype_size(dtype), device);
  Tensor t(make_impl(std::move(storage), shape, strides, 0, dtype));
  MT_CHECK(t.is_dense(), "empty_strided: the strides ", strides.str(), " of the shape ",
           shape.str(), " are not dense (they must be a permutation of row-major strides)");
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  backend::backend_for(device).fill(t, value);
  return t;
}

Tensor Tensor::scalar(double value, DType dtype, Device device) {
  return full(Shape{}, value, dtype, device);
}

Tensor Tensor::arange(int64_t n, DType dtype, Device device) {
  std::vector<double> v(size_t(std::max<int64_t>(n, 0)));
  std::iota(v.begin(), v.end(), 0.0);
  return from_vector(v, Shape{int64_t(v.size())}, dtype, device);
}

Tensor Tensor::from_vector(const std::vector<double>& values, const Shape& shape, DType dtype,
                           Device device) {
  MT_CHECK(int64_t(values.size()) == shape.numel(), "from_vector: ", values.size(),
           " values cannot fill shape ", shape.str(), " (", shape.numel(), " elements)");
  Tensor src = empty(shape, DType::F64, Device::cpu());
  if (!values.empty()) std::memcpy(src.data_ptr(), values.data(), values.size() * sizeof(double));
  return src.to(dtype).to(device);
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape, DType dtype,
                           Device device) {
  MT_CHECK(int64_t(values.size()) == shape.numel(), "from_vector: ", values.size(),
           " values cannot fill shape ", shape.str(), " (", shape.numel(), " elements)");
  Tensor src = empty(shape, DType::F32, Device::cpu());
  if (!values.empty()) std::memcpy(src.data_ptr(), values.data(), values.size() * sizeof(float));
  return src.to(dtype).to(device);
}

Tensor Tensor::from_vector(const std::vector<int64_t>& values, const Shape& shape, DType dtype,
                           Device device) {
  MT_CHECK(int64_t(values.size()) == shape.numel(), "from_vector: ", values.size(),
           " values cannot fill shape ", shape.str(), " (", shape.numel(), " elements)");
  Tensor src = empty(shape, DType::I64, Device::cpu());
  if (!values.empty()) std::memcpy(src.data_ptr(), values.data(), values.size() * sizeof(int64_t));
  return src.to(dtype).to(device);
}

Tensor Tensor::uniform(const Shape& shape, double low, double high, uint64_t seed, DType dtype,
                       Device device) {
  MT_CHECK(is_floating(dtype), "uniform() makes floating tensors, not ", dtype_name(dtype));
  Tensor t = empty(shape, dtype, device);
  backend::backend_for(device).uniform(t, low, high, seed, 0);
  return t;
}

Tensor Tensor::normal(const Shape& shape, double mean, double stddev, uint64_t seed, DType dtype,
                      Device device) {
  MT_CHECK(is_floating(dtype), "normal() makes floating tensors, not ", dtype_name(dtype));
  Tensor t = empty(shape, dtype, device);
  backend::backend_for(device).normal(t, mean, stddev, seed, 0);
  return t;
}

// ---- metadata ----------------------------------------------------------------------------------

const Shape& Tensor::shape() const {
  return checked(impl_).shape;
}
const Shape& Tensor::strides() const {
  return checked(impl_).strides;
}
int64_t Tensor::offset() const {
  return checked(impl_).offset;
}
DType Tensor::dtype() const {
  return checked(impl_).dtype;
}
Device Tensor::device() const {
  return checked(impl_).storage->device;
}
const std::shared_ptr<Storage>& Tensor::storage() const {
  return checked(impl_).storage;
}

int64_t Tensor::size(int64_t d) const {
  return shape()[wrap_dim(d, dim())];
}
int64_t Tensor::stride(int64_t d) const {
  return strides()[wrap_dim(d, dim())];
}

bool Tensor::is_contiguous() const {
  const Shape& sh = shape();
  const Shape& st = strides();
  // One pass: a mismatch decides only once no dim is empty (an empty tensor has no element to be
  // out of place, as in PyTorch).
  bool ok = true;
  int64_t expected = 1;
  for (int i = sh.size() - 1; i >= 0; --i) {
    if (sh[i] == 0) return true;
    if (sh[i] == 1) continue;
    ok = ok && st[i] == expected;
    expected *= sh[i];
  }
  return ok;
}

namespace {

// Dims in storage order, outermost first: by decreasing stride, ties in dim order.
std::vector<int64_t> dims_by_stride(const Tensor& t) {
  std::vector<int64_t> order(size_t(t.dim()));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return t.stride(a) > t.stride(b); });
  return order;
}

}  // namespace

bool Tensor::is_dense() const {
  if (numel() == 0) return false;
  int64_t expected = 1;
  const std::vector<int64_t> order = dims_by_stride(*this);
  for (auto d = order.rbegin(); d != order.rend(); ++d) {
    if (size(*d) == 1) continue;
    if (stride(*d) != expected) return false;
    expected *= size(*d);
  }
  return true;
}

bool Tensor::is_contiguous(MemoryFormat format) const {
  if (format == MemoryFormat::Contiguous) return is_contiguous();
  if (dim() != 4 || stride(1) != 1) return false;
  const int64_t c = size(1), h = size(2), w = size(3);
  const std::pair<int64_t, int64_t> expected[] = {{3, c}, {2, w * c}, {0, h * w * c}};
  for (const auto& [d, st] : expected) {
    if (size(d) != 1 && stride(d) != st) return false;
  }
  return true;
}

Tensor Tensor::contiguous(MemoryFormat format) const {
  if (format == MemoryFormat::Contiguous) return contiguous();
  MT_CHECK(dim() == 4, "contiguous(ChannelsLast) needs a 4-D (N, C, H, W) tensor, got a ",
           describe());
  if (is_contiguous(format)) return *this;
  Tensor out = layout::empty_channels_last(shape(), dtype(), device());
  const std::vector<int64_t> nhwc{0, 2, 3, 1};
  Tensor dst = layout::ordered(out, nhwc);
  backend::backend_for(device()).copy(layout::ordered(*this, nhwc), dst);
  autograd::record("contiguousBackward", {*this}, {out},
                   [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  return out;
}

namespace layout {

Tensor empty_channels_last(const Shape& shape, DType dtype, Device device) {
  MT_ASSERT(shape.size() == 4, "empty_channels_last: a 4-D shape, got ", shape.str());
  const int64_t c = shape[1], h = shape[2], w = shape[3];
  return Tensor::empty_strided(shape, {h * w * c, 1, w * c, c}, dtype, device);
}

Tensor empty_like(const Tensor& t, DType dtype) {
  // Only channels-last is kept: other dense orders (a transposed matrix) give row-major results,
  // which the kernels downstream were tuned for. A channels-last tensor with one channel is also
  // row-major, and only its strides mark it: they are copied as they are.
  if (!t.is_contiguous(MemoryFormat::ChannelsLast)) {
    return Tensor::empty(t.shape(), dtype, t.device());
  }
  return Tensor::empty_strided(t.shape(), t.strides(), dtype, t.device());
}

std::vector<int64_t> storage_order(const Tensor& t) {
  if (t.is_contiguous() || !t.is_dense()) return {};
  return dims_by_stride(t);
}

Tensor ordered(const Tensor& t, const std::vector<int64_t>& order) {
  if (order.empty() || !t.defined()) return t;
  Tensor v = t.detach();
  while (v.dim() < int(order.size()))
    v = v.unsqueeze(0);
  return v.permute(order);
}

}  // namespace layout

bool Tensor::shares_storage(const Tensor& other) const {
  return defined() && other.defined() && storage() == other.storage();
}

void* Tensor::data_ptr() const {
  const TensorImpl& t = checked(impl_);
  MT_CHECK(t.storage->resident(), "the data of ", describe(),
           " was released by ZeRO-3 (it is gathered only while its module runs); read the model's "
           "parameters inside DistributedDataParallel::full_parameters()");
  return static_cast<char*>(t.storage->data) + t.offset * int64_t(dtype_size(t.dtype));
}

// ---- views -------------------------------------------------------------------------------------

namespace {

Shape infer_shape(const Shape& requested, int64_t numel, const Shape& from) {
  Shape s = requested;
  int infer = -1;
  int64_t known = 1;
  for (int i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      MT_CHECK(infer < 0, "only one dimension can be -1 in shape ", requested.str());
      infer = i;
    } else {
      MT_CHECK(s[i] >= 0, "invalid dimension ", s[i], " in shape ", requested.str());
      known *= s[i];
    }
  }
  if (infer >= 0) {
    MT_CHECK(known != 0 && numel % known == 0, "shape ", requested.str(),
             " is invalid for a tensor of shape ", from.str(), " (", numel, " elements)");
    s[infer] = numel / known;
  }
  MT_CHECK(s.numel() == numel, "shape ", requested.str(), " is invalid for a tensor of shape ",
           from.str(), " (", numel, " elements)");
  return s;
}

// Strides for viewing (shape, strides) as new_shape without a copy, if possible (the algorithm
// of numpy's _attempt_nocopy_reshape).
bool view_strides(const Shape& shape, const Shape& strides, const Shape& new_shape, Shape& out) {
  out = Shape::filled(new_shape.size(), 1);
  if (shape.numel() == 0) {
    out = contiguous_strides(new_shape);
    return true;
  }
  int oi = 0, oj = 1, ni = 0, nj = 1;
  const int on = shape.size(), nn = new_shape.size();
  // Drop size-1 dims from the old shape.
  Shape os, ost;
  for (int i = 0; i < on; ++i) {
    if (shape[i] != 1) {
      os.push_back(shape[i]);
      ost.push_back(strides[i]);
    }
  }
  const int oN = os.size();
  for (int k = 0; k < nn; ++k)
    out[k] = 1;
  while (ni < nn && oi < oN) {
    int64_t np = new_shape[ni], op = os[oi];
    while (np != op) {
      if (np < op) {
        np *= new_shape[nj++];
      } else {
        op *= os[oj++];
      }
    }
    for (int ok = oi; ok < oj - 1; ++ok) {
      if (ost[ok] != os[ok + 1] * ost[ok + 1]) return false;
    }
    out[nj - 1] = ost[oj - 1];
    for (int nk = nj - 1; nk > ni; --nk)
      out[nk - 1] = out[nk] * new_shape[nk];
    ni = nj++;
    oi = oj++;
  }
  // Trailing size-1 dims of the new shape.
  const int64_t last = ni > 0 ? out[ni - 1] : 1;
  for (int k = ni; k < nn; ++k)
    out[k] = last;
  (void)on;
  return true;
}

}  // namespace

Tensor Tensor::view(const Shape& shape_req) const {
  const Shape s = infer_shape(shape_req, numel(), shape());
  Shape st;
  MT_CHECK(view_strides(shape(), strides(), s, st), "view", s.str(), " is not possible for a ",
           describe(), " with strides ", strides().str(),
           " without a copy; use reshape(), or contiguous() first");
  return make_view(*this, s, st, offset(), reshape_back(*this));
}

Tensor Tensor::reshape(const Shape& shape_req) const {
  const Shape s = infer_shape(shape_req, numel(), shape());
  Shape st;
  if (view_strides(shape(), strides(), s, st)) {
    return make_view(*this, s, st, offset(), reshape_back(*this));
  }
  return contiguous().view(s);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape(Shape{1});
  const int s = wrap_dim(start_dim, dim()), e = wrap_dim(end_dim, dim());
  MT_CHECK(s <= e, "flatten: start_dim ", start_dim, " comes after end_dim ", end_dim);
  Shape ns;
  for (int i = 0; i < s; ++i)
    ns.push_back(size(i));
  int64_t prod = 1;
  for (int i = s; i <= e; ++i)
    prod *= size(i);
  ns.push_back(prod);
  for (int i = e + 1; i < dim(); ++i)
    ns.push_back(size(i));
  return reshape(ns);
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  const int a = wrap_dim(d0, dim()), b = wrap_dim(d1, dim());
  Shape sh = shape(), st = strides();
  std::swap(sh[a], sh[b]);
  std::swap(st[a], st[b]);
  return make_view(*this, sh, st, offset(), [a, b](const Tensor& g) { return g.transpose(a, b); });
}

Tensor Tensor::t() const {
  MT_CHECK(dim() <= 2, "t() expects a tensor with at most 2 dims, got ", describe(),
           "; use transpose(d0, d1)");
  return dim() < 2 ? *this : transpose(0, 1);
}

Tensor Tensor::permute(const std::vector<int64_t>& dims) const {
  MT_CHECK(int(dims.size()) == dim(), "permute: got ", dims.size(), " dims for a ", describe());
  Shape sh, st;
  std::vector<bool> seen(size_t(dim()), false);
  for (int64_t d : dims) {
    const int w = wrap_dim(d, dim());
    MT_CHECK(!seen[size_t(w)], "permute: dim ", d, " appears twice");
    seen[size_t(w)] = true;
    sh.push_back(size(w));
    st.push_back(stride(w));
  }
  std::vector<int64_t> inverse(dims.size());
  for (size_t i = 0; i < dims.size(); ++i)
    inverse[size_t(wrap_dim(dims[i], dim()))] = int64_t(i);
  return make_view(*this, sh, st, offset(),
                   [inverse](const Tensor& g) { return g.permute(inverse); });
}

Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  const int w = wrap_dim(d, dim());
  const int64_t n = size(w);
  if (start < 0) start += n;
  MT_CHECK(start >= 0 && length >= 0 && start + length <= n, "narrow(dim=", d, ", start=", start,
           ", length=", length, ") is out of range for dim of size ", n, " in a ", describe());
  Shape sh = shape();
  sh[w] = length;
  return make_view(*this, sh, strides(), offset() + start * stride(w),
                   into_zeros(*this, [=](const Tensor& z) { return z.narrow(w, start, length); }));
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  const int w = wrap_dim(d, dim());
  const int64_t n = size(w);
  MT_CHECK(step > 0, "slice step must be positive, got ", step);
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  Shape sh = shape(), st = strides();
  sh[w] = (end - start + step - 1) / step;
  st[w] *= step;
  return make_view(
      *this, sh, st, offset() + start * stride(w),
      into_zeros(*this, [=](const Tensor& z) { return z.slice(w, start, end, step); }));
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  const int w = wrap_dim(d, dim());
  const int64_t n = size(w);
  if (index < 0) index += n;
  MT_CHECK(index >= 0 && index < n, "select: index ", index, " is out of range for dim ", d,
           " of size ", n);
  Shape sh = shape(), st = strides();
  sh.erase(w);
  st.erase(w);
  return make_view(*this, sh, st, offset() + index * stride(w),
                   into_zeros(*this, [=](const Tensor& z) { return z.select(w, index); }));
}

Tensor Tensor::expand(const Shape& target) const {
  MT_CHECK(target.size() >= dim(), "expand: cannot expand a ", describe(), " to fewer dims ",
           target.str());
  Shape sh = target, st = Shape::filled(target.size(), 0);
  const int lead = target.size() - dim();
  for (int i = target.size() - 1; i >= 0; --i) {
    const int src = i - lead;
    if (src < 0) {
      MT_CHECK(target[i] >= 0, "expand: -1 is not allowed for a new leading dim in ", target.str());
      continue;
    }
    const int64_t have = size(src);
    if (target[i] == -1 || target[i] == have) {
      sh[i] = have;
      st[i] = stride(src);
    } else {
      MT_CHECK(have == 1, "expand: dim ", src, " of a ", describe(), " has size ", have,
               " and cannot become ", target[i], " (only size-1 dims expand)");
      st[i] = 0;
    }
  }
  const Shape base = shape();
  return make_view(*this, sh, st, offset(),
                   [base](const Tensor& g) { return sum_to_shape(g, base); });
}

Tensor Tensor::squeeze() const {
  Shape sh, st;
  for (int i = 0; i < dim(); ++i) {
    if (size(i) != 1) {
      sh.push_back(size(i));
      st.push_back(stride(i));
    }
  }
  return make_view(*this, sh, st, offset(), reshape_back(*this));
}

Tensor Tensor::squeeze(int64_t d) const {
  const int w = wrap_dim(d, dim());
  Shape sh = shape(), st = strides();
  if (dim() > 0 && size(w) == 1) {
    sh.erase(w);
    st.erase(w);
  }
  return make_view(*this, sh, st, offset(), reshape_back(*this));
}

Tensor Tensor::unsqueeze(int64_t d) const {
  const int w = wrap_dim(d, dim() + 1);
  Shape sh = shape(), st = strides();
  const int64_t s = w < dim() ? stride(w) * size(w) : 1;
  sh.insert(w, 1);
  st.insert(w, s);
  return make_view(*this, sh, st, offset(), reshape_back(*this));
}

// ---- copies ------------------------------------------------------------------------------------

Tensor Tensor::contiguous() const {
  if (is_contiguous()) return *this;
  return clone();
}

Tensor Tensor::to(DType dt) const {
  if (dt == dtype()) return *this;
  return cast(*this, dt);
}

Tensor Tensor::to(Device dev, bool non_blocking) const {
  if (dev == device()) return *this;
  const Tensor src = contiguous();
  Tensor out = empty(shape(), dtype(), dev);
  backend::copy_across_devices(src, out, non_blocking);
  if (is_floating_point()) {
    const Device from = device();
    autograd::record("ToDeviceBackward", {*this}, {out}, [from](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].defined() ? g[0].to(from) : Tensor()};
    });
  }
  return out;
}

Tensor Tensor::pin_memory() const {
  MT_CHECK(device().is_cpu(), "pin_memory: this tensor is on ", device().str(),
           "; only cpu tensors can be pinned (page-locked for fast copies to the GPU)");
  if (is_pinned()) return *this;
  Allocator& pinned = backend::pinned_allocator();  // says so when there is no GPU
  const Tensor src = contiguous();
  const size_t bytes = size_t(numel()) * dtype_size(dtype());
  auto storage = std::make_shared<Storage>(bytes, Device::cpu(), pinned);
  Tensor out(make_impl(std::move(storage), shape(), contiguous_strides(shape()), 0, dtype()));
  if (bytes != 0) std::memcpy(out.data_ptr(), src.data_ptr(), bytes);
  return out;
}

bool Tensor::is_pinned() const {
  const std::shared_ptr<Storage>& s = storage();
  // The cpu allocator's memory is pageable; every other allocator of cpu storage pins it.
  return s->device.is_cpu() && s->allocator != &allocator_for(Device::cpu());
}

Tensor Tensor::detach() const {
  const TensorImpl& t = checked(impl_);
  return Tensor(make_impl(t.storage, t.shape, t.strides, t.offset, t.dtype));
}

double Tensor::item() const {
  MT_CHECK(numel() == 1, "item() needs a one-element tensor, got a ", describe());
  return to_vector<double>()[0];
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor c = detach().to(Device::cpu()).to(dtype_of_v<T>).contiguous();
  const T* p = static_cast<const T*>(c.data_ptr());
  return std::vector<T>(p, p + c.numel());
}
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<int64_t> Tensor::to_vector<int64_t>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<uint8_t> Tensor::to_vector<uint8_t>() const;
template std::vector<bool> Tensor::to_vector<bool>() const;

void Tensor::copy_from_host(const void* src, size_t bytes) {
  MT_CHECK(is_contiguous() && bytes == nbytes(), "copy_from_host: ", bytes,
           " bytes do not fill a contiguous ", describe(), " (", nbytes(), " bytes)");
  if (device().is_cuda()) {
    Tensor staged = empty(shape(), dtype(), Device::cpu());
    if (bytes) std::memcpy(staged.data_ptr(), src, bytes);
    backend::copy_across_devices(staged, *this, /*non_blocking=*/false);
  } else if (bytes) {
    std::memcpy(data_ptr(), src, bytes);
  }
  bump_version();
}

void Tensor::copy_to_host(void* dst, size_t bytes) const {
  MT_CHECK(bytes == nbytes(), "copy_to_host: buffer of ", bytes, " bytes for a ", describe(), " (",
           nbytes(), " bytes)");
  Tensor c = detach().to(Device::cpu()).contiguous();
  if (bytes) std::memcpy(dst, c.data_ptr(), bytes);
}

Tensor& Tensor::zero_() {
  return fill_(0.0);
}

Tensor& Tensor::fill_(double value) {
  autograd::check_inplace(*this);
  backend::backend_for(device()).fill(*this, value);
  bump_version();
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src) {
  autograd::check_inplace(*this);
  MT_CHECK(src.device() == device(), "copy_: source on ", src.device().str(), ", destination on ",
           device().str(), "; move it with to(device) first");
  const Shape b = broadcast_shapes(src.shape(), shape());
  MT_CHECK(b == shape(), "copy_: a ", src.describe(), " does not broadcast to ", describe());
  Tensor s =
      src.dim() == dim() && src.shape() == shape() ? src.detach() : src.detach().expand(shape());
  backend::backend_for(device()).copy(s, *this);
  bump_version();
  return *this;
}

void Tensor::set_data(const Tensor& other) const {
  MT_CHECK(other.defined(), "set_data: the new data is undefined");
  MT_CHECK(is_leaf(), "set_data on a non-leaf ", describe(),
           "; only leaves (parameters) can swap data");
  TensorImpl& t = *impl();
  const TensorImpl& o = *other.impl();
  t.storage = o.storage;
  t.shape = o.shape;
  t.strides = o.strides;
  t.offset = o.offset;
  t.dtype = o.dtype;
  if (t.autograd && t.autograd->grad.defined() && t.autograd->grad.dtype() != o.dtype) {
    t.autograd->grad = Tensor();  // a gradient of the old dtype no longer fits
  }
}

void Tensor::bump_version() const {
  storage()->version.fetch_add(1, std::memory_order_relaxed);
}
uint32_t Tensor::version() const {
  return storage()->version.load(std::memory_order_relaxed);
}

// ---- printing ----------------------------------------------------------------------------------

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  std::string s(dtype_name(dtype()));
  s += " tensor of shape " + shape().str();
  if (!device().is_cpu()) s += " on " + device().str();
  return s;
}

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  std::ostringstream os;
  const Tensor c = detach().to(Device::cpu()).to(DType::F64).contiguous();
  const double* p = static_cast<const double*>(c.data_ptr());
  const bool integral = !is_floating_point();
  std::function<void(int, int64_t)> rec = [&](int d, int64_t base) {
    if (d == dim()) {
      const double v = p[base];
      if (integral) {
        os << int64_t(v);
      } else {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.4f", v);
        os << buf;
      }
      return;
    }
    os << "[";
    const int64_t n = size(d);
    const int64_t stride_d = c.stride(d);
    const bool summarize = n > 8;
    for (int64_t i = 0; i < n; ++i) {
      if (summarize && i == 3) {
        os << "...";
        i = n - 3;
        os << (d + 1 == dim() ? ", " : ",\n" + std::string(size_t(d + 8), ' '));
      }
      rec(d + 1, base + i * stride_d);
      if (i + 1 < n) os << (d + 1 == dim() ? ", " : ",\n" + std::string(size_t(d + 8), ' '));
    }
    os << "]";
  };
  os << "tensor(";
  rec(0, 0);
  os << ", dtype=" << dtype_name(dtype());
  if (!device().is_cpu()) os << ", device=" << device().str();
  if (requires_grad()) os << (grad_fn() ? ", grad_fn" : ", requires_grad");
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  return os << t.str();
}

}  // namespace mantissa

namespace mantissa {

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), dtype(), device());
  backend::backend_for(device()).copy(*this, out);
  autograd::record("cloneBackward", {*this}, {out},
                   [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  return out;
}

}  // namespace mantissa
