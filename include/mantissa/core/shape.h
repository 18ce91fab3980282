// Shapes and strides: a fixed-capacity vector of up to 8 dims, so that creating a tensor or a
// view allocates nothing for its metadata.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <vector>

#include "mantissa/core/error.h"

namespace mantissa {

inline constexpr int kMaxDims = 8;

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) { assign(dims.begin(), dims.end()); }
  explicit Shape(std::span<const int64_t> dims) { assign(dims.begin(), dims.end()); }
  explicit Shape(const std::vector<int64_t>& dims) { assign(dims.begin(), dims.end()); }

  static Shape filled(int n, int64_t v) {
    Shape s;
    s.resize(n, v);
    return s;
  }

  int size() const { return n_; }
  bool empty() const { return n_ == 0; }
  int64_t operator[](int i) const { return d_[i]; }
  int64_t& operator[](int i) { return d_[i]; }
  const int64_t* begin() const { return d_.data(); }
  const int64_t* end() const { return d_.data() + n_; }
  int64_t* begin() { return d_.data(); }
  int64_t* end() { return d_.data() + n_; }
  int64_t back() const { return d_[n_ - 1]; }

  void push_back(int64_t v) {
    MT_CHECK(n_ < kMaxDims, "tensors have at most ", kMaxDims, " dimensions");
    d_[n_++] = v;
  }
  void insert(int pos, int64_t v) {
    MT_CHECK(n_ < kMaxDims, "tensors have at most ", kMaxDims, " dimensions");
    for (int i = n_; i > pos; --i)
      d_[i] = d_[i - 1];
    d_[pos] = v;
    ++n_;
  }
  void erase(int pos) {
    for (int i = pos; i + 1 < n_; ++i)
      d_[i] = d_[i + 1];
    --n_;
  }
  void resize(int n, int64_t v = 0) {
    MT_CHECK(n >= 0 && n <= kMaxDims, "tensors have at most ", kMaxDims, " dimensions, not ", n);
    for (int i = n_; i < n; ++i)
      d_[i] = v;
    n_ = n;
  }

  // Product of the dims (1 for a scalar).
  int64_t numel() const {
    int64_t p = 1;
    for (int i = 0; i < n_; ++i)
      p *= d_[i];
    return p;
  }
  std::vector<int64_t> vec() const { return {begin(), end()}; }
  std::string str() const;  // "(2, 3, 4)"

  friend bool operator==(const Shape& a, const Shape& b) {
    if (a.n_ != b.n_) return false;
    for (int i = 0; i < a.n_; ++i) {
      if (a.d_[i] != b.d_[i]) return false;
    }
    return true;
  }

 private:
  template <typename It>
  void assign(It b, It e) {
    n_ = 0;
    for (; b != e; ++b)
      push_back(*b);
  }
  std::array<int64_t, kMaxDims> d_{};
  int n_ = 0;
};

// Row-major strides of a contiguous tensor of this shape.
Shape contiguous_strides(const Shape& shape);

// The broadcast of two shapes (numpy rules); throws naming both shapes if they don't broadcast.
Shape broadcast_shapes(const Shape& a, const Shape& b);

// A dim index that may be negative (-1 = last), checked against ndim.
int wrap_dim(int64_t dim, int ndim);

}  // namespace mantissa
