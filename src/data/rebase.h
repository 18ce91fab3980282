// Internal: a batch tensor moved onto another storage of the same layout (the loader's pinned
// copy of a batch, the prefetcher's device copy of it).
#pragma once

#include <memory>
#include <utility>

#include "mantissa/tensor/tensor.h"

namespace mantissa::data {

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

}  // namespace mantissa::data
