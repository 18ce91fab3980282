#include "mantissa/core/shape.h"

namespace mantissa {

std::string Shape::str() const {
  std::string s = "(";
  for (int i = 0; i < n_; ++i) {
    if (i) s += ", ";
    s += std::to_string(d_[i]);
  }
  if (n_ == 1) s += ",";
  return s + ")";
}

Shape contiguous_strides(const Shape& shape) {
  Shape s = Shape::filled(shape.size(), 1);
  int64_t acc = 1;
  for (int i = shape.size() - 1; i >= 0; --i) {
    s[i] = acc;
    acc *= std::max<int64_t>(shape[i], 1);
  }
  return s;
}

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const int n = std::max(a.size(), b.size());
  Shape out = Shape::filled(n, 1);
  for (int i = 0; i < n; ++i) {
    const int ia = a.size() - n + i, ib = b.size() - n + i;
    const int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    MT_CHECK(da == db || da == 1 || db == 1, "shapes ", a.str(), " and ", b.str(),
             " do not broadcast: dim ", i - n, " is ", da, " vs ", db,
             " (each dim must match or be 1)");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

int wrap_dim(int64_t dim, int ndim) {
  const int64_t n = std::max(ndim, 1);
  MT_CHECK(dim >= -n && dim < n, "dim ", dim, " is out of range for a tensor with ", ndim,
           " dimension", ndim == 1 ? "" : "s", " (use -", n, " .. ", n - 1, ")");
  return int(dim < 0 ? dim + n : dim);
}

}  // namespace mantissa
