// Elementwise ops: dtype promotion, broadcasting checks, the kernel, the autograd node.
#include <cmath>
#include <optional>

#include "backend/backend.h"
#include "mantissa/amp/autocast.h"
#include "mantissa/autograd/engine.h"
#include "mantissa/core/error.h"
#include "mantissa/tensor/ops.h"

namespace mantissa {

using backend::BinaryOp;
using backend::Scalars;
using backend::UnaryOp;

namespace {

int float_rank(DType d) {
  switch (d) {
    case DType::F64:
      return 4;
    case DType::F32:
      return 3;
    case DType::F16:
    case DType::BF16:
      return 2;
    case DType::FP8_E4M3:
    case DType::FP8_E5M2:
      return 1;
    default:
      return 0;
  }
}

int int_rank(DType d) {
  switch (d) {
    case DType::I64:
      return 4;
    case DType::I32:
      return 3;
    case DType::U8:
      return 2;
    case DType::Bool:
      return 1;
    default:
      return 0;
  }
}

backend::Backend& backend_of(const Tensor& t) {
  return backend::backend_for(t.device());
}

void check_same_device(const Tensor& a, const Tensor& b, const char* op) {
  MT_CHECK(a.device() == b.device(), op, ": inputs are on different devices (", a.device().str(),
           " and ", b.device().str(), "); move one with to(device)");
}

}  // namespace

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  const int fa = float_rank(a), fb = float_rank(b);
  if (fa && fb) {
    if (fa != fb) return fa > fb ? a : b;
    // Two different formats of one width (bf16 + f16, e4m3 + e5m2): the next wider one.
    return fa == 2 ? DType::F32 : DType::F16;
  }
  if (fa) return a;
  if (fb) return b;
  return int_rank(a) >= int_rank(b) ? a : b;
}

// ---- casts
// ---------------------------------------------------------------------------------------

Tensor cast(const Tensor& x, DType dtype) {
  Tensor out = Tensor::empty(x.shape(), dtype, x.device());
  backend_of(x).copy(x, out);
  if (is_floating(dtype) && x.is_floating_point()) {
    const DType from = x.dtype();
    autograd::record("CastBackward", {x}, {out}, [from](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].defined() ? g[0].to(from) : Tensor()};
    });
  }
  return out;
}

Tensor cast(const Tensor& x, DType dtype, const RoundingOptions& rounding) {
  Tensor out = Tensor::empty(x.shape(), dtype, x.device());
  backend_of(x).copy_rounded(x, out, rounding);
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

// Which forward values the derivative needs.
bool derivative_uses_output(UnaryOp op) {
  switch (op) {
    case UnaryOp::Exp:
    case UnaryOp::Sqrt:
    case UnaryOp::Rsqrt:
    case UnaryOp::Reciprocal:
    case UnaryOp::Sigmoid:
    case UnaryOp::Tanh:
      return true;
    default:
      return false;
  }
}

bool derivative_uses_input(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg:
    case UnaryOp::AddScalar:
    case UnaryOp::MulScalar:
    case UnaryOp::RsubScalar:
    case UnaryOp::Sign:
      return false;
    default:
      return !derivative_uses_output(op);
  }
}

const char* unary_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg:
      return "neg";
    case UnaryOp::Exp:
      return "exp";
    case UnaryOp::Log:
      return "log";
    case UnaryOp::Sqrt:
      return "sqrt";
    case UnaryOp::Rsqrt:
      return "rsqrt";
    case UnaryOp::Abs:
      return "abs";
    case UnaryOp::Sign:
      return "sign";
    case UnaryOp::Reciprocal:
      return "reciprocal";
    case UnaryOp::Square:
      return "square";
    case UnaryOp::Relu:
      return "relu";
    case UnaryOp::Gelu:
      return "gelu";
    case UnaryOp::GeluTanh:
      return "gelu(tanh)";
    case UnaryOp::Silu:
      return "silu";
    case UnaryOp::Sigmoid:
      return "sigmoid";
    case UnaryOp::Tanh:
      return "tanh";
    case UnaryOp::PowScalar:
      return "pow";
    case UnaryOp::ClampScalar:
      return "clamp";
    case UnaryOp::AddScalar:
      return "add";
    case UnaryOp::MulScalar:
      return "mul";
    case UnaryOp::RsubScalar:
      return "rsub";
  }
  return "unary";
}

bool needs_float(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg:
    case UnaryOp::Abs:
    case UnaryOp::Sign:
    case UnaryOp::Square:
    case UnaryOp::Relu:
    case UnaryOp::ClampScalar:
      return false;
    default:
      return true;
  }
}

Tensor unary_op(UnaryOp op, const Tensor& x_in, Scalars s = {}) {
  MT_CHECK(x_in.defined(), unary_name(op), ": the input tensor is undefined");
  // Integer inputs of real-valued functions compute in f32 (exp of an integer tensor).
  const bool scalar_is_fraction = (op == UnaryOp::AddScalar || op == UnaryOp::MulScalar ||
                                   op == UnaryOp::RsubScalar || op == UnaryOp::ClampScalar) &&
                                  (s.a != std::floor(s.a) || s.b != std::floor(s.b));
  const Tensor x = !x_in.is_floating_point() && (needs_float(op) || scalar_is_fraction)
                       ? x_in.to(DType::F32)
                       : x_in;
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  backend_of(x).unary(op, x, out, s);
  if (autograd::needs_grad({&x})) {
    autograd::SavedTensor sx(derivative_uses_input(op) ? x : Tensor());
    autograd::SavedTensor sy(derivative_uses_output(op) ? out : Tensor());
    autograd::record(std::string(unary_name(op)) + "Backward", {x}, {out},
                     [op, s, sx, sy](const std::vector<Tensor>& g) -> std::vector<Tensor> {
                       if (!g[0].defined()) return {Tensor()};
                       const Tensor xv = sx.unpack(), yv = sy.unpack();
                       const Tensor& ref = xv.defined() ? xv : (yv.defined() ? yv : g[0]);
                       Tensor gx = Tensor::empty(ref.shape(), ref.dtype(), ref.device());
                       backend::backend_for(ref.device())
                           .unary_backward(op, g[0], xv.defined() ? xv : ref, yv, gx, s);
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

const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add:
      return "add";
    case BinaryOp::Sub:
      return "sub";
    case BinaryOp::Mul:
      return "mul";
    case BinaryOp::Div:
      return "div";
    case BinaryOp::Pow:
      return "pow";
    case BinaryOp::Maximum:
      return "maximum";
    case BinaryOp::Minimum:
      return "minimum";
    case BinaryOp::Eq:
      return "eq";
    case BinaryOp::Ne:
      return "ne";
    case BinaryOp::Lt:
      return "lt";
    case BinaryOp::Le:
      return "le";
    case BinaryOp::Gt:
      return "gt";
    case BinaryOp::Ge:
      return "ge";
  }
  return "binary";
}

Tensor binary_op(BinaryOp op, const Tensor& a_in, const Tensor& b_in) {
  const char* name = binary_name(op);
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
  if ((op == BinaryOp::Div || op == BinaryOp::Pow) && !is_floating(dt)) dt = DType::F32;
  const Tensor a = a_in.to(dt), b = b_in.to(dt);
  const bool comparison = op >= BinaryOp::Eq;
  Tensor out = Tensor::empty(shape, comparison ? DType::Bool : dt, a.device());
  backend_of(a).binary(op, a, b, out);
  if (comparison || !autograd::needs_grad({&a, &b})) return out;

  const Shape sa = a.shape(), sb = b.shape();
  autograd::SavedTensor saved_a(op == BinaryOp::Add || op == BinaryOp::Sub ? Tensor() : a);
  autograd::SavedTensor saved_b(op == BinaryOp::Add || op == BinaryOp::Sub ? Tensor() : b);
  autograd::SavedTensor saved_out(op == BinaryOp::Pow || op == BinaryOp::Div ? out : Tensor());
  const bool ga = a.requires_grad(), gb = b.requires_grad();
  autograd::record(
      std::string(name) + "Backward", {a, b}, {out},
      [=](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
        const Tensor& g = grads[0];
        if (!g.defined()) return {Tensor(), Tensor()};
        Tensor da, db;
        switch (op) {
          case BinaryOp::Add:
            da = g;
            db = g;
            break;
          case BinaryOp::Sub:
            da = g;
            db = gb ? neg(g) : Tensor();
            break;
          case BinaryOp::Mul:
            da = ga ? mul(g, saved_b.unpack()) : Tensor();
            db = gb ? mul(g, saved_a.unpack()) : Tensor();
            break;
          case BinaryOp::Div: {
            const Tensor bv = saved_b.unpack();
            da = ga ? div(g, bv) : Tensor();
            db = gb ? neg(div(mul(g, saved_out.unpack()), bv)) : Tensor();
            break;
          }
          case BinaryOp::Pow: {
            const Tensor av = saved_a.unpack(), bv = saved_b.unpack(), y = saved_out.unpack();
            // d/da a^b = b a^(b-1); d/db a^b = a^b log a (0 where a == 0, as PyTorch).
            da = ga ? mul(g, mul(bv, pow(av, sub(bv, 1.0)))) : Tensor();
            if (gb) {
              const Tensor la = where(eq(av, Tensor::zeros({}, av.dtype(), av.device())),
                                      Tensor::zeros({}, av.dtype(), av.device()), log(av));
              db = mul(g, mul(y, la));
            }
            break;
          }
          case BinaryOp::Maximum:
          case BinaryOp::Minimum: {
            // The gradient goes to the winner; ties split it evenly (PyTorch's rule).
            const Tensor av = saved_a.unpack(), bv = saved_b.unpack();
            const Tensor half_g = mul(g, 0.5);
            const Tensor wins_a = op == BinaryOp::Maximum ? gt(av, bv) : lt(av, bv);
            const Tensor tie = eq(av, bv);
            const Tensor zero = Tensor::zeros({}, g.dtype(), g.device());
            if (ga) da = where(wins_a, g, where(tie, half_g, zero));
            if (gb) db = where(wins_a, zero, where(tie, half_g, g));
            break;
          }
          default:
            break;
        }
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
