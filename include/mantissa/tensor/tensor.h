// Tensor: a view (shape, strides, offset, dtype) of shared storage on a device, with the
// autograd state of reverse-mode differentiation. Copying a Tensor copies a handle, not data.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "mantissa/core/allocator.h"
#include "mantissa/core/device.h"
#include "mantissa/core/dtype.h"
#include "mantissa/core/shape.h"

namespace mantissa {

class Tensor;
namespace autograd {
class Node;
}

// Bytes on a device. Views share one Storage; its version counts in-place writes so that
// autograd can refuse to use a saved tensor that was modified after it was saved.
struct Storage {
  // From the device's allocator (allocator_for(device)).
  Storage(size_t bytes, Device device);
  // From another allocator of memory that `device` addresses (pinned host memory is on the cpu).
  Storage(size_t bytes, Device device, Allocator& allocator);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // ZeRO-3 (dist/ddp.h) frees a parameter's bytes between its uses and keeps this object, so
  // that every handle, view and saved copy of the parameter refers to the same storage when it
  // is refilled: release() gives the bytes back to the allocator (reading them throws until
  // restore()), restore() takes nbytes uninitialized bytes again. Neither changes the version.
  void release();
  void restore();
  bool resident() const { return data != nullptr || nbytes == 0; }

  void* data = nullptr;
  size_t nbytes = 0;
  Device device;
  Allocator* allocator = nullptr;  // frees `data`
  std::atomic<uint32_t> version{0};
};

using TensorHook = std::function<Tensor(const Tensor& grad)>;
using PostAccumulateGradHook = std::function<void(const Tensor& leaf)>;

struct AutogradMeta;
struct TensorImpl;

// What a Tensor is filled with by the random factories.
struct RandomOptions {
  uint64_t seed = 0;
};

// How a 4-D (N, C, H, W) tensor lies in memory (PyTorch's torch.memory_format): row-major, or
// channels-last (NHWC: the C values of one pixel adjacent, strides (H*W*C, 1, W*C, C)), the
// layout oneDNN's convolutions read and write without reordering.
enum class MemoryFormat { Contiguous, ChannelsLast };

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- factories -------------------------------------------------------------------------------
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  // Uninitialized, with the given strides; they must be dense (a permutation of some order's
  // row-major strides: the elements fill numel() consecutive slots).
  static Tensor empty_strided(const Shape& shape, const Shape& strides, DType dtype = DType::F32,
                              Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::F32,
                     Device device = Device::cpu());
  static Tensor scalar(double value, DType dtype = DType::F32, Device device = Device::cpu());
  // 0, 1, ..., n-1 (or start, start+step, ... < end)
  static Tensor arange(int64_t n, DType dtype = DType::I64, Device device = Device::cpu());
  // Values rounded (RNE) into dtype; shape must hold values.size() elements.
  static Tensor from_vector(const std::vector<double>& values, const Shape& shape,
                            DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape,
                            DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape,
                            DType dtype = DType::I64, Device device = Device::cpu());
  // Seeded: the same seed gives the same values on every machine and thread count.
  static Tensor uniform(const Shape& shape, double low, double high, uint64_t seed,
                        DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor normal(const Shape& shape, double mean, double stddev, uint64_t seed,
                       DType dtype = DType::F32, Device device = Device::cpu());

  // ---- metadata --------------------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  const Shape& strides() const;
  int64_t offset() const;
  int dim() const { return shape().size(); }
  int64_t size(int64_t d) const;
  int64_t stride(int64_t d) const;
  int64_t numel() const { return shape().numel(); }
  DType dtype() const;
  Device device() const;
  size_t element_size() const { return dtype_size(dtype()); }
  size_t nbytes() const { return size_t(numel()) * element_size(); }
  bool is_contiguous() const;  // row-major strides (size-1 dims aside); true when empty
  // Contiguous: is_contiguous(). ChannelsLast: 4-D with exactly NHWC's strides, stride(1) == 1
  // included, so that a channels-last tensor with one channel is told apart from a row-major
  // one (other dims of size 1 may have any stride).
  bool is_contiguous(MemoryFormat format) const;
  // Whether the elements fill numel() consecutive slots of storage, in any dim order.
  bool is_dense() const;
  bool is_floating_point() const { return is_floating(dtype()); }
  // Whether two tensors are handles of the same TensorImpl.
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  bool shares_storage(const Tensor& other) const;

  // Pointer to element 0 of this view.
  void* data_ptr() const;
  // Typed pointer; throws if T is not this tensor's storage type.
  template <typename T>
  T* data() const;
  const std::shared_ptr<Storage>& storage() const;

  // ---- views (share storage) -------------------------------------------------------------------
  Tensor view(const Shape& shape) const;     // requires compatible strides; -1 infers one dim
  Tensor reshape(const Shape& shape) const;  // a view when possible, else a copy
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const;  // 2-D transpose
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;  // removes dim
  Tensor expand(const Shape& shape) const;          // -1 keeps a dim
  Tensor squeeze() const;
  Tensor squeeze(int64_t dim) const;
  Tensor unsqueeze(int64_t dim) const;

  // ---- copies and conversions ------------------------------------------------------------------
  Tensor contiguous() const;  // this tensor if already contiguous
  // A copy in `format` (this tensor if already in it), differentiable. Ops on a channels-last
  // tensor keep the layout: elementwise ops, casts, batch norm and (on the CPU) conv2d return
  // channels-last results, so a network converted once at its input runs channels-last
  // throughout.
  Tensor contiguous(MemoryFormat format) const;
  Tensor clone() const;
  Tensor to(DType dtype) const;  // RNE for narrowing float casts; this tensor if already dtype
  // Differentiable (the gradient goes back to this tensor's device). non_blocking returns before
  // the copy is done; from pinned host memory the copy then overlaps the host's work.
  Tensor to(Device device, bool non_blocking = false) const;
  // A contiguous copy of this CPU tensor in page-locked memory (this tensor if already pinned),
  // which the GPU copies from asynchronously; a mantissa::Error without the CUDA backend/driver.
  Tensor pin_memory() const;
  bool is_pinned() const;
  Tensor detach() const;  // shares storage, no autograd
  double item() const;    // the value of a one-element tensor
  template <typename T>
  T item() const {
    return static_cast<T>(item());
  }
  // All elements in row-major order, converted to T (exactly, for float from any float dtype).
  template <typename T>
  std::vector<T> to_vector() const;
  void copy_from_host(const void* src, size_t bytes);  // into a contiguous tensor
  void copy_to_host(void* dst, size_t bytes) const;

  // ---- in place (bump the version) -------------------------------------------------------------
  Tensor& zero_();
  Tensor& fill_(double value);
  Tensor& copy_(const Tensor& src);                       // broadcasting, with dtype conversion
  Tensor& add_(const Tensor& other, double alpha = 1.0);  // this += alpha * other
  Tensor& mul_(double factor);
  // Makes this handle (and every other handle of the same tensor) refer to other's data, shape
  // and dtype, keeping its autograd leaf state: how Module::to(dtype) converts parameters that
  // optimizers already hold.
  void set_data(const Tensor& other) const;
  void bump_version() const;
  uint32_t version() const;

  // ---- autograd --------------------------------------------------------------------------------
  bool requires_grad() const;
  Tensor& set_requires_grad(bool on = true);  // leaves only
  bool is_leaf() const;
  // The accumulated gradient (undefined until a backward reaches this tensor).
  Tensor grad() const;
  void set_grad(const Tensor& g) const;
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  uint32_t output_nr() const;
  // d(this)/d(leaves) given d(loss)/d(this) = gradient (ones for a one-element tensor).
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  // Called with this tensor's gradient during backward; may return a replacement (or an
  // undefined Tensor to keep it). Returns a handle for remove_hook.
  int register_hook(TensorHook hook) const;
  // Leaves: called with this tensor after a backward has accumulated its gradient into .grad()
  // (PyTorch's register_post_accumulate_grad_hook): the gradient of this backward is final.
  // Returns a handle for remove_hook.
  int register_post_accumulate_grad_hook(PostAccumulateGradHook hook) const;
  void remove_hook(int handle) const;
  void retain_grad() const;  // keep .grad() for a non-leaf

  std::string str() const;       // PyTorch-like printing
  std::string describe() const;  // "f32 (2, 3) cpu" for error messages

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

struct AutogradMeta {
  bool requires_grad = false;
  bool retains_grad = false;
  Tensor grad;
  std::shared_ptr<autograd::Node> grad_fn;
  uint32_t output_nr = 0;
  std::weak_ptr<autograd::Node> grad_accumulator;  // leaves: the AccumulateGrad node
  std::vector<std::pair<int, TensorHook>> hooks;
  std::vector<std::pair<int, PostAccumulateGradHook>> post_accumulate_hooks;
  int next_hook = 0;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;
  int64_t offset = 0;  // in elements
  DType dtype = DType::F32;
  std::unique_ptr<AutogradMeta> autograd;

  AutogradMeta& autograd_meta() {
    if (!autograd) autograd = std::make_unique<AutogradMeta>();
    return *autograd;
  }
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// Ordered (name, tensor) pairs: a model's state_dict, an optimizer's or a scaler's state, the
// tensors of a safetensors file. The one spelling of a named tensor list.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

template <typename T>
T* Tensor::data() const {
  using Bare = std::remove_const_t<T>;
  bool ok = false;
#define MT_DTYPE_MATCH(e, name, U, ...) ok = ok || (dtype() == DType::e && std::is_same_v<Bare, U>);
  MT_FORALL_DTYPES(MT_DTYPE_MATCH)
#undef MT_DTYPE_MATCH
  MT_CHECK(ok, "data<T>() asked for the wrong element type of a ", dtype_name(dtype()), " tensor");
  return static_cast<T*>(data_ptr());
}

}  // namespace mantissa
