// Internal: a batch's fields as views of one allocation (allocate_batch), and the same views
// moved onto another storage of the same layout (the loader's pinned copy of a batch, the
// prefetcher's device copy of it).
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "mantissa/core/allocator.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::data {

// A contiguous tensor over part of a storage (offset in elements of dtype).
inline Tensor tensor_on(std::shared_ptr<Storage> storage, const Shape& shape, int64_t offset,
                        DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->offset = offset;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

// The same view (shape, strides, offset, dtype) over another storage of the same layout.
inline Tensor rebase(const Tensor& t, std::shared_ptr<Storage> storage) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = t.shape();
  impl->strides = t.strides();
  impl->offset = t.offset();
  impl->dtype = t.dtype();
  return Tensor(std::move(impl));
}

// One past the last byte of t's view in its storage.
inline size_t end_byte(const Tensor& t) {
  int64_t last = t.offset();
  if (t.numel() > 0) {
    for (int d = 0; d < t.dim(); ++d)
      last += (t.size(d) - 1) * t.stride(d);
    ++last;
  }
  return size_t(last) * t.element_size();
}

// The storage that every field is a view of, when there is one and it holds nothing but them
// (an allocate_batch block: at most the fields' bytes and their alignment padding), so that
// copying the whole block moves the batch and nothing else; null otherwise (fields of separate
// allocations, or views into a larger tensor such as the dataset's own).
inline std::shared_ptr<Storage> own_block(const std::vector<Tensor>& fields) {
  if (fields.empty() || !fields[0].defined()) return nullptr;
  const std::shared_ptr<Storage>& block = fields[0].storage();
  size_t budget = 0;
  for (const Tensor& f : fields) {
    if (!f.defined() || f.storage() != block) return nullptr;
    budget += (f.nbytes() + kAllocAlignment - 1) / kAllocAlignment * kAllocAlignment;
  }
  return block->nbytes <= budget ? block : nullptr;
}

}  // namespace mantissa::data
