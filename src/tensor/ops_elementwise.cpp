// Elementwise ops: dtype promotion, broadcasting checks, the kernel, the autograd node.
#include <cmath>
#include <optional>
#include <utility>

#include "backend/backend.h"
#include "mantissa/autocast/autocast.h"
#include "mantissa/autograd/engine.h"
#include "mantissa/core/error.h"
#include "mantissa/tensor/ops.h"
#include "tensor/layout.h"

namespace mantissa {

using backend::BinaryNeeds;
using backend::BinaryOp;
using backend::OnIntegers;
using backend::Scalars;
using backend::UnaryNeeds;
using backend::UnaryOp;

namespace {

// Among the integers, the wider wins and bool loses to all.
size_t integer_rank(DType d) {
  return dtype_kind(d) == DTypeKind::Bool ? 0 : dtype_size(d);
}

// The first float of the list `bytes` wide (f16 for 2, f32 for 4).
DType float_of_width(size_t bytes) {
  for (const DTypeInfo& info : kDTypeTable) {
    if (info.is_float && info.size == bytes) return info.dtype;
  }
  MT_ASSERT(false, "no float dtype is ", bytes, " bytes wide");
  return DType::F32;
}

backend::Backend& backend_of(const Tensor& t) {
  return backend::backend_for(t.device());
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  MT_CHECK(a.device() == b.device(), op, ": inputs are on different devices (", a.device().str(),
           " and ", b.device().str(), "); move one with to(device)");
}

}  // namespace

// From the dtype list: a float beats every integer and the wider float wins (the list's floats
// nest by width, see backend/rounded_copy.h).
DType promote_types(DType a, DType b) {
  if (a == b) return a;
  const bool fa = is_floating(a), fb = is_floating(b);
  if (fa && fb) {
    if (dtype_size(a) != dtype_size(b)) return dtype_size(a) > dtype_size(b) ? a : b;
    // Two different formats of one width (bf16 + f16, e4m3 + e5m2): the first float of twice
    // that width, which holds both (f32, f16).
    return float_of_width(2 * dtype_size(a));
  }
  if (fa) return a;
  if (fb) return b;
  return integer_rank(a) >= integer_rank(b) ? a : b;
}

// ---- casts
// ---------------------------------------------------------------------------------------

Tensor cast(const Tensor& x, DType dtype) {
  Tensor out = layout::empty_like(x, dtype);
  const std::vector<int64_t> order = layout::storage_order(out);
  Tensor dst = layout::ordered(out, order);
  backend_of(x).copy(layout::ordered(x, order), dst);
  if (is_floating(dtype) && x.is_floating_point()) {
    const DType from = x.dtype();
    autograd::record("CastBackward", {x}, {out}, [from](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].defined() ? g[0].to(from) : Tensor()};
    });
  }
  return out;
}

Tensor cast(const Tensor& x, DType dtype, const RoundingOptions& rounding) {
  Tensor out = layout::empty_like(x, dtype);
  const std::vector<int64_t> order = layout::storage_order(out);
  Tensor dst = layout::ordered(out, order);
  backend_of(x).copy_rounded(layout::ordered(x, order), dst, rounding);
  if (is_floating(dtype) && x.is_floating_point()) {
    const DType from = x.dtype();
    autograd::record("CastBackward", {x}, {out}, [from](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].defined() ? g[0].to(from) : Tensor()};
    });
  }
  return out;
}

// ---- unary
// ---------------------------------------------------------------------------------------

namespace {

Tensor unary_op(UnaryOp op, const Tensor& x_in, Scalars s = {}) {
  const backend::UnaryOpInfo& info = backend::unary_info(op);
  MT_CHECK(x_in.defined(), info.name, ": the input tensor is undefined");
  // Integer inputs compute in f32 where the op's row says so (exp of an integer tensor), and
  // where an integer kernel would have to truncate a fractional scalar (clamp(x, 0.5, 2)).
  const bool scalar_is_fraction =
      info.scalars > 0 && (s.a != std::floor(s.a) || s.b != std::floor(s.b));
  const bool int_to_f32 = info.integers != OnIntegers::Keep || scalar_is_fraction;
  const Tensor x = !x_in.is_floating_point() && int_to_f32 ? x_in.to(DType::F32) : x_in;
  Tensor out = layout::empty_like(x, x.dtype());
  {
    const std::vector<int64_t> order = layout::storage_order(out);
    Tensor dst = layout::ordered(out, order);
    backend_of(x).unary(op, layout::ordered(x, order), dst, s);
  }
  if (autograd::needs_grad({&x})) {
    autograd::SavedTensor sx(info.needs == UnaryNeeds::Input ? x : Tensor());
    autograd::SavedTensor sy(info.needs == UnaryNeeds::Output ? out : Tensor());
    autograd::record(std::string(info.name) + "Backward", {x}, {out},
                     [op, s, sx, sy](const std::vector<Tensor>& g) -> std::vector<Tensor> {
                       if (!g[0].defined()) return {Tensor()};
                       const Tensor xv = sx.unpack(), yv = sy.unpack();
                       const Tensor& ref = xv.defined() ? xv : (yv.defined() ? yv : g[0]);
                       Tensor gx = layout::empty_like(ref, ref.dtype());
                       const std::vector<int64_t> order = layout::storage_order(gx);
                       Tensor dst = layout::ordered(gx, order);
                       backend::backend_for(ref.device())
                           .unary_backward(op, layout::ordered(g[0], order),
                                           layout::ordered(xv.defined() ? xv : ref, order),
                                           layout::ordered(yv, order), dst, s);
                       return {gx};
                     });
  }
  return out;
}

}  // namespace

Tensor neg(const Tensor& x) {
  return unary_op(UnaryOp::Neg, x);
}
Tensor exp(const Tensor& x) {
  const amp::AutocastInputs cast_in(amp::OpId::Exp, x);
  return unary_op(UnaryOp::Exp, cast_in[0]);
}
Tensor log(const Tensor& x) {
  const amp::AutocastInputs cast_in(amp::OpId::Log, x);
  return unary_op(UnaryOp::Log, cast_in[0]);
}
Tensor sqrt(const Tensor& x) {
  return unary_op(UnaryOp::Sqrt, x);
}
Tensor rsqrt(const Tensor& x) {
  const amp::AutocastInputs cast_in(amp::OpId::Rsqrt, x);
  return unary_op(UnaryOp::Rsqrt, cast_in[0]);
}
Tensor abs(const Tensor& x) {
  return unary_op(UnaryOp::Abs, x);
}
Tensor square(const Tensor& x) {
  return unary_op(UnaryOp::Square, x);
}
Tensor reciprocal(const Tensor& x) {
  const amp::AutocastInputs cast_in(amp::OpId::Reciprocal, x);
  return unary_op(UnaryOp::Reciprocal, cast_in[0]);
}
Tensor relu(const Tensor& x) {
  return unary_op(UnaryOp::Relu, x);
}
Tensor leaky_relu(const Tensor& x, double negative_slope) {
  MT_CHECK(std::isfinite(negative_slope), "leaky_relu: negative_slope must be finite, got ",
           negative_slope);
  return unary_op(UnaryOp::LeakyRelu, x, {negative_slope});
}
Tensor gelu(const Tensor& x, GeluApproximation approximate) {
  return unary_op(approximate == GeluApproximation::Tanh ? UnaryOp::GeluTanh : UnaryOp::Gelu, x);
}
Tensor silu(const Tensor& x) {
  return unary_op(UnaryOp::Silu, x);
}
Tensor sigmoid(const Tensor& x) {
  return unary_op(UnaryOp::Sigmoid, x);
}
Tensor tanh(const Tensor& x) {
  return unary_op(UnaryOp::Tanh, x);
}
Tensor pow(const Tensor& a, double exponent) {
  const amp::AutocastInputs cast_in(amp::OpId::Pow, a);
  return unary_op(UnaryOp::PowScalar, cast_in[0], {exponent});
}
Tensor add(const Tensor& a, double b) {
  return unary_op(UnaryOp::AddScalar, a, {b});
}
Tensor sub(const Tensor& a, double b) {
  return unary_op(UnaryOp::AddScalar, a, {-b});
}
Tensor rsub(const Tensor& a, double b) {
  return unary_op(UnaryOp::RsubScalar, a, {b});
}
Tensor mul(const Tensor& a, double b) {
  return unary_op(UnaryOp::MulScalar, a, {b});
}
Tensor div(const Tensor& a, double b) {
  return unary_op(UnaryOp::MulScalar, a, {1.0 / b});
}

Tensor clamp(const Tensor& x, std::optional<double> min, std::optional<double> max) {
  MT_CHECK(min || max, "clamp needs a min, a max or both");
  MT_CHECK(!min || !max || *min <= *max, "clamp: min ", *min, " is greater than max ", *max);
  return unary_op(UnaryOp::ClampScalar, x, {min.value_or(-INFINITY), max.value_or(INFINITY)});
}

// ---- binary
// --------------------------------------------------------------------------------------

namespace {

// The backward of each arithmetic op, as tensor ops on the incoming gradient g and the saved
// values (what its row's BinaryNeeds says). Saved tensors are unpacked only where a gradient is
// asked for, so an input modified in place after the op only fails the backward that reads it.
struct BinaryBackwardArgs {
  const Tensor& g;
  const autograd::SavedTensor& a;
  const autograd::SavedTensor& b;
  const autograd::SavedTensor& out;
  bool ga, gb;  // which inputs want a gradient
};

template <BinaryOp op>
struct BinaryGrad;  // grads(args) -> {da, db}; the ones not asked for may stay undefined

template <>
struct BinaryGrad<BinaryOp::Add> {
  static std::pair<Tensor, Tensor> grads(const BinaryBackwardArgs& c) { return {c.g, c.g}; }
};

template <>
struct BinaryGrad<BinaryOp::Sub> {
  static std::pair<Tensor, Tensor> grads(const BinaryBackwardArgs& c) {
    return {c.g, c.gb ? neg(c.g) : Tensor()};
  }
};

template <>
struct BinaryGrad<BinaryOp::Mul> {
  static std::pair<Tensor, Tensor> grads(const BinaryBackwardArgs& c) {
    Tensor da = c.ga ? mul(c.g, c.b.unpack()) : Tensor();
    Tensor db = c.gb ? mul(c.g, c.a.unpack()) : Tensor();
    return {da, db};
  }
};

template <>
struct BinaryGrad<BinaryOp::Div> {
  static std::pair<Tensor, Tensor> grads(const BinaryBackwardArgs& c) {
    const Tensor bv = c.b.unpack();
    Tensor da = c.ga ? div(c.g, bv) : Tensor();
    Tensor db = c.gb ? neg(div(mul(c.g, c.out.unpack()), bv)) : Tensor();
    return {da, db};
  }
};

template <>
struct BinaryGrad<BinaryOp::Pow> {
  static std::pair<Tensor, Tensor> grads(const BinaryBackwardArgs& c) {
    const Tensor av = c.a.unpack(), bv = c.b.unpack(), y = c.out.unpack();
    // d/da a^b = b a^(b-1); d/db a^b = a^b log a (0 where a == 0, as PyTorch).
    Tensor da = c.ga ? mul(c.g, mul(bv, pow(av, sub(bv, 1.0)))) : Tensor();
    Tensor db;
    if (c.gb) {
      const Tensor la = where(eq(av, Tensor::zeros({}, av.dtype(), av.device())),
                              Tensor::zeros({}, av.dtype(), av.device()), log(av));
      db = mul(c.g, mul(y, la));
    }
    return {da, db};
  }
};

// The gradient goes to the winner; ties split it evenly (PyTorch's rule).
template <BinaryOp op>
std::pair<Tensor, Tensor> extremum_grads(const BinaryBackwardArgs& c) {
  const Tensor av = c.a.unpack(), bv = c.b.unpack();
  const Tensor half_g = mul(c.g, 0.5);
  const Tensor wins_a = op == BinaryOp::Maximum ? gt(av, bv) : lt(av, bv);
  const Tensor tie = eq(av, bv);
  const Tensor zero = Tensor::zeros({}, c.g.dtype(), c.g.device());
  Tensor da, db;
  if (c.ga) da = where(wins_a, c.g, where(tie, half_g, zero));
  if (c.gb) db = where(wins_a, zero, where(tie, half_g, c.g));
  return {da, db};
}

template <>
struct BinaryGrad<BinaryOp::Maximum> {
  static std::pair<Tensor, Tensor> grads(const BinaryBackwardArgs& c) {
    return extremum_grads<BinaryOp::Maximum>(c);
  }
};

template <>
struct BinaryGrad<BinaryOp::Minimum> {
  static std::pair<Tensor, Tensor> grads(const BinaryBackwardArgs& c) {
    return extremum_grads<BinaryOp::Minimum>(c);
  }
};

// Comparisons have no backward (their output is Bool): no BinaryGrad for them.
template <BinaryOp op>
std::pair<Tensor, Tensor> grads_of(const BinaryBackwardArgs& c) {
  if constexpr (backend::is_comparison(op)) {
    MT_ASSERT(false, "comparisons have no backward");
    return {};
  } else {
    return BinaryGrad<op>::grads(c);
  }
}

// The runtime op to its BinaryGrad: one case per row of MT_FORALL_BINARY_OPS.
std::pair<Tensor, Tensor> binary_grads(BinaryOp op, const BinaryBackwardArgs& c) {
  switch (op) {
#define MT_BINARY_GRAD_CASE(e, ...) \
  case BinaryOp::e:                 \
    return grads_of<BinaryOp::e>(c);
    MT_FORALL_BINARY_OPS(MT_BINARY_GRAD_CASE)
#undef MT_BINARY_GRAD_CASE
  }
  MT_ASSERT(false, "unknown binary op ", int(op));
  return {};
}

Tensor binary_op(BinaryOp op, const Tensor& a_in, const Tensor& b_in) {
  const backend::BinaryOpInfo& info = backend::binary_info(op);
  const char* name = info.name;
  MT_CHECK(a_in.defined() && b_in.defined(), name, ": an input tensor is undefined");
  check_same_device(a_in, b_in, name);
  const Shape shape = [&] {
    try {
      return broadcast_shapes(a_in.shape(), b_in.shape());
    } catch (const Error& e) {
      MT_CHECK(false, name, ": ", e.message());
      return Shape{};
    }
  }();
  DType dt = promote_types(a_in.dtype(), b_in.dtype());
  if (info.integers != OnIntegers::Keep && !is_floating(dt)) dt = DType::F32;
  const Tensor a = a_in.to(dt), b = b_in.to(dt);
  const bool comparison = backend::is_comparison(op);
  // The layout of the first input that has the output's shape (row-major if neither has).
  const Tensor& like = a.shape() == shape ? a : b;
  const DType out_dt = comparison ? DType::Bool : dt;
  Tensor out = like.shape() == shape ? layout::empty_like(like, out_dt)
                                     : Tensor::empty(shape, out_dt, a.device());
  {
    const std::vector<int64_t> order = layout::storage_order(out);
    Tensor dst = layout::ordered(out, order);
    backend_of(a).binary(op, layout::ordered(a, order), layout::ordered(b, order), dst);
  }
  if (comparison || !autograd::needs_grad({&a, &b})) return out;

  const Shape sa = a.shape(), sb = b.shape();
  const bool inputs = info.needs != BinaryNeeds::Nothing;
  autograd::SavedTensor saved_a(inputs ? a : Tensor());
  autograd::SavedTensor saved_b(inputs ? b : Tensor());
  autograd::SavedTensor saved_out(info.needs == BinaryNeeds::InputsAndOutput ? out : Tensor());
  const bool ga = a.requires_grad(), gb = b.requires_grad();
  autograd::record(std::string(name) + "Backward", {a, b}, {out},
                   [=](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
                     const Tensor& g = grads[0];
                     if (!g.defined()) return {Tensor(), Tensor()};
                     auto [da, db] = binary_grads(op, {g, saved_a, saved_b, saved_out, ga, gb});
                     if (da.defined()) da = sum_to_shape(da, sa);
                     if (db.defined()) db = sum_to_shape(db, sb);
                     return {ga ? da : Tensor(), gb ? db : Tensor()};
                   });
  return out;
}

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) {
  const amp::AutocastInputs cast_in(amp::OpId::Add, a, b);
  return binary_op(BinaryOp::Add, cast_in[0], cast_in[1]);
}
Tensor sub(const Tensor& a, const Tensor& b) {
  const amp::AutocastInputs cast_in(amp::OpId::Sub, a, b);
  return binary_op(BinaryOp::Sub, cast_in[0], cast_in[1]);
}
Tensor mul(const Tensor& a, const Tensor& b) {
  const amp::AutocastInputs cast_in(amp::OpId::Mul, a, b);
  return binary_op(BinaryOp::Mul, cast_in[0], cast_in[1]);
}
Tensor div(const Tensor& a, const Tensor& b) {
  const amp::AutocastInputs cast_in(amp::OpId::Div, a, b);
  return binary_op(BinaryOp::Div, cast_in[0], cast_in[1]);
}
Tensor pow(const Tensor& a, const Tensor& b) {
  const amp::AutocastInputs cast_in(amp::OpId::Pow, a, b);
  return binary_op(BinaryOp::Pow, cast_in[0], cast_in[1]);
}
Tensor maximum(const Tensor& a, const Tensor& b) {
  const amp::AutocastInputs cast_in(amp::OpId::Maximum, a, b);
  return binary_op(BinaryOp::Maximum, cast_in[0], cast_in[1]);
}
Tensor minimum(const Tensor& a, const Tensor& b) {
  const amp::AutocastInputs cast_in(amp::OpId::Minimum, a, b);
  return binary_op(BinaryOp::Minimum, cast_in[0], cast_in[1]);
}
Tensor eq(const Tensor& a, const Tensor& b) {
  return binary_op(BinaryOp::Eq, a, b);
}
Tensor ne(const Tensor& a, const Tensor& b) {
  return binary_op(BinaryOp::Ne, a, b);
}
Tensor lt(const Tensor& a, const Tensor& b) {
  return binary_op(BinaryOp::Lt, a, b);
}
Tensor le(const Tensor& a, const Tensor& b) {
  return binary_op(BinaryOp::Le, a, b);
}
Tensor gt(const Tensor& a, const Tensor& b) {
  return binary_op(BinaryOp::Gt, a, b);
}
Tensor ge(const Tensor& a, const Tensor& b) {
  return binary_op(BinaryOp::Ge, a, b);
}

Tensor operator+(const Tensor& a, const Tensor& b) {
  return add(a, b);
}
Tensor operator-(const Tensor& a, const Tensor& b) {
  return sub(a, b);
}
Tensor operator*(const Tensor& a, const Tensor& b) {
  return mul(a, b);
}
Tensor operator/(const Tensor& a, const Tensor& b) {
  return div(a, b);
}
Tensor operator+(const Tensor& a, double b) {
  return add(a, b);
}
Tensor operator-(const Tensor& a, double b) {
  return sub(a, b);
}
Tensor operator*(const Tensor& a, double b) {
  return mul(a, b);
}
Tensor operator/(const Tensor& a, double b) {
  return div(a, b);
}
Tensor operator*(double a, const Tensor& b) {
  return mul(b, a);
}
Tensor operator-(const Tensor& x) {
  return neg(x);
}

Tensor where(const Tensor& cond, const Tensor& a_arg, const Tensor& b_arg) {
  const amp::AutocastInputs cast_in(amp::OpId::Where, a_arg, b_arg);
  const Tensor &a_in = cast_in[0], &b_in = cast_in[1];
  MT_CHECK(cond.dtype() == DType::Bool, "where: the condition must be a bool tensor, got a ",
           cond.describe(), "; compare first (e.g. gt(x, y))");
  check_same_device(a_in, b_in, "where");
  check_same_device(cond, a_in, "where");
  const DType dt = promote_types(a_in.dtype(), b_in.dtype());
  const Tensor a = a_in.to(dt), b = b_in.to(dt);
  const Shape shape = broadcast_shapes(cond.shape(), broadcast_shapes(a.shape(), b.shape()));
  Tensor out = Tensor::empty(shape, dt, a.device());
  backend_of(a).where(cond, a, b, out);
  if (autograd::needs_grad({&a, &b})) {
    const Shape sa = a.shape(), sb = b.shape();
    const Tensor c = cond.detach();
    const bool ga = a.requires_grad(), gb = b.requires_grad();
    autograd::record("whereBackward", {a, b}, {out},
                     [=](const std::vector<Tensor>& g) -> std::vector<Tensor> {
                       if (!g[0].defined()) return {Tensor(), Tensor()};
                       const Tensor zero = Tensor::zeros({}, g[0].dtype(), g[0].device());
                       Tensor da = ga ? sum_to_shape(where(c, g[0], zero), sa) : Tensor();
                       Tensor db = gb ? sum_to_shape(where(c, zero, g[0]), sb) : Tensor();
                       return {da, db};
                     });
  }
  return out;
}

// ---- in place (Tensor methods)
// -------------------------------------------------------------------

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  autograd::check_inplace(*this);
  MT_CHECK(broadcast_shapes(other.shape(), shape()) == shape(), "add_: a ", other.describe(),
           " does not broadcast to ", describe());
  const Tensor o = other.dtype() == dtype() ? other.detach() : other.detach().to(dtype());
  Tensor dst = is_contiguous() ? *this : Tensor::empty(shape(), dtype(), device());
  if (alpha == 1.0 || !is_floating_point()) {
    MT_CHECK(alpha == 1.0, "add_ with alpha needs a floating tensor, got a ", describe());
    backend_of(*this).binary(BinaryOp::Add, *this, o, dst);
  } else {
    backend_of(*this).add_scaled(*this, o, alpha, dst);
  }
  if (!dst.is_same(*this)) backend_of(*this).copy(dst, *this);
  bump_version();
  return *this;
}

Tensor& Tensor::mul_(double factor) {
  autograd::check_inplace(*this);
  if (is_contiguous()) {
    backend_of(*this).unary(UnaryOp::MulScalar, *this, *this, {factor});
  } else {
    Tensor tmp = Tensor::empty(shape(), dtype(), device());
    backend_of(*this).unary(UnaryOp::MulScalar, *this, tmp, {factor});
    backend_of(*this).copy(tmp, *this);
  }
  bump_version();
  return *this;
}

}  // namespace mantissa
