// Multi-tensor work plans (docs/design.md §5): one kernel call over many tensors is cut into
// (tensor, chunk) items of kChunk elements, numbered across the tensors, and the items are spread
// over one OpenMP parallel region. Used by the fused optimizer steps, the gradient norm and the
// loss scaler's unscale-and-check.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "backend/cpu/loops.h"

namespace mantissa::backend::cpu {

// The items of one call: chunk c of the concatenation of all tensors is chunk
// c - first_chunk[t] of tensor t.
class ChunkPlan {
 public:
  template <typename Tensors>
  explicit ChunkPlan(const Tensors& tensors) {
    first_chunk_.reserve(tensors.size() + 1);
    numel_.reserve(tensors.size());
    int64_t chunks = 0;
    for (const Tensor& t : tensors) {
      first_chunk_.push_back(chunks);
      numel_.push_back(t.numel());
      chunks += (t.numel() + kChunk - 1) / kChunk;
      total_ += t.numel();
    }
    first_chunk_.push_back(chunks);
  }

  int64_t chunks() const { return first_chunk_.back(); }
  int64_t total() const { return total_; }

  // Tensor index and element range [start, start + n) of item c.
  void locate(int64_t c, size_t& t, int64_t& start, int64_t& n) const {
    // The last tensor whose first chunk is <= c (empty tensors own no chunk and are skipped).
    t = size_t(std::upper_bound(first_chunk_.begin(), first_chunk_.end() - 1, c) -
               first_chunk_.begin()) -
        1;
    start = (c - first_chunk_[t]) * kChunk;
    n = std::min(kChunk, numel_[t] - start);
  }

 private:
  std::vector<int64_t> first_chunk_;  // (T + 1)
  std::vector<int64_t> numel_;        // (T)
  int64_t total_ = 0;
};

// Runs f(item, tensor, start, n) over every item, in one parallel region when the call is large.
template <typename F>
void for_each_item(const ChunkPlan& plan, F f) {
  const int64_t chunks = plan.chunks();
  auto body = [&](int64_t c) {
    size_t t = 0;
    int64_t start = 0, n = 0;
    plan.locate(c, t, start, n);
    f(c, t, start, n);
  };
  if (plan.total() < kParallelGrain || omp_get_max_threads() == 1 || omp_in_parallel()) {
    for (int64_t c = 0; c < chunks; ++c)
      body(c);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c)
    body(c);
}

}  // namespace mantissa::backend::cpu
