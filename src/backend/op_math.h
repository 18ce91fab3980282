// Internal: the math of every elementwise op, written once for both backends. The CPU's loops
// (cpu/elementwise.cpp) and the CUDA kernels (cuda/elementwise.cu) call these same expressions
// element by element, so the two devices cannot drift apart formula by formula.
//
// Each op of backend/op_tables.h has a specialisation here; the backends' dispatch switches are
// generated from the lists, so an op without one fails to compile, naming Unary<UnaryOp::X>.
//
// Inputs are passed by reference: the CPU's loops pass their array elements (x[i]), so each load
// happens where the expression first reads it, in the expression's order. GCC orders the operands
// of a commutative operation by when they were computed, and on x86 that order decides which
// NaN's sign a NaN * NaN or NaN + NaN carries: written this way, the loops compile to the same
// instructions as the hand-written per-op loops they replaced.
//
// The functions are templates on the compute type C (float, double, or the integer itself) and
// on a math policy M that supplies the library functions (exp, log, sqrt, tanh, erf, pow) and
// mul_rn, a product that is rounded on its own even where the compiler would otherwise fuse it
// into a following addition: the CPU's HostMath is std:: and a plain product (this build has no
// FMA), the CUDA backend's DeviceMath is the float/double device functions and __fmul_rn. Every
// other expression is compiled by each backend exactly as written: keep them as they are, since
// reordering or refactoring a formula changes results in the last bit (and on CUDA, where nvcc
// contracts a * b + c into an fma, which products get fused).
#pragma once

#include <type_traits>

#include "backend/host_device.h"
#include "backend/op_tables.h"

namespace mantissa::backend::op_math {

// Whether the backends have a kernel for an op in compute type C: every op on floats; on
// integers, those whose row does not say F32; on bool, the comparisons only.
template <UnaryOp op, typename C>
constexpr bool unary_runs_on() {
  if constexpr (std::is_same_v<C, bool>) return false;
  return std::is_floating_point_v<C> || unary_info(op).integers != OnIntegers::F32;
}
template <BinaryOp op, typename C>
constexpr bool binary_runs_on() {
  if constexpr (std::is_same_v<C, bool>) return is_comparison(op);
  return std::is_floating_point_v<C> || binary_info(op).integers != OnIntegers::F32;
}

// A unary op's scalar arguments, converted to the compute type once per call.
template <typename C>
struct UnaryArgs {
  C a, b;
  bool square;  // PowScalar with exponent exactly 2: x * x rather than pow
};

inline constexpr double kSqrt2OverPi = 0.79788456080286535588;  // sqrt(2/pi)
inline constexpr double kInvSqrt2Pi = 0.39894228040143267794;   // 1/sqrt(2 pi)

template <typename M, typename C>
MT_HOST_DEVICE C sigmoid(C x) {
  return C(1) / (C(1) + M::exp(-x));
}

// ---- unary: forward(x, args) = y; backward(g, x, y, args) = g * dy/dx ----------------------
// backward reads only what the op's row says it needs (x or y): the op layer passes something
// else in place of the other.

template <UnaryOp op>
struct Unary;

template <>
struct Unary<UnaryOp::Neg> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C forward(const C& x, const UnaryArgs<C>&) {
    return -x;
  }
  template <typename M, typename C>
  MT_HOST_DEVICE static C backward(const C& g, const C&, const C&, const UnaryArgs<C>&) {
    return -g;
  }
};

template <>
struct Unary<UnaryOp::Exp> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C forward(const C& x, const UnaryArgs<C>&) {
    return M::exp(x);
  }
  template <typename M, typename C>
  MT_HOST_DEVICE static C backward(const C& g, const C&, const C& y, const UnaryArgs<C>&) {
    return g * y;
  }
};

template <>
struct Unary<UnaryOp::Log> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C forward(const C& x, const UnaryArgs<C>&) {
    return M::log(x);
  }
  template <typename M, typename C>
  MT_HOST_DEVICE static C backward(const C& g, const C& x, const C&, const UnaryArgs<C>&) {
    return g / x;
  }
};

template <>
struct Unary<UnaryOp::Sqrt> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C forward(const C& x, const UnaryArgs<C>&) {
    return M::sqrt(x);
  }
  template <typename M, typename C>
  MT_HOST_DEVICE static C backward(const C& g, const C&, const C& y, const UnaryArgs<C>&) {
    return g / (C(2) * y);
  }
};

template <>
struct Unary<UnaryOp::Rsqrt> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C forward(const C& x, const UnaryArgs<C>&) {
    return C(1) / M::sqrt(x);
  }
  template <typename M, typename C>
  MT_HOST_DEVICE static C backward(const C& g, const C&, const C& y, const UnaryArgs<C>&) {
    return C(-0.5) * g * y * y * y;
  }
};

template <>
struct Unary<UnaryOp::Abs> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C forward(const C& x, const UnaryArgs<C>&) {
    if constexpr (std::is_unsigned_v<C>) {
      return x;
    } else {
      return x < C(0) ? C(-x) : x;
    }
  }
  template <typename M, typename C>
  MT_HOST_DEVICE static C backward(const C& g, const C& x, const C&, const UnaryArgs<C>&) {
    return g * C((C(0) < x) - (x < C(0)));
  }
};

template <>
struct Unary<UnaryOp::Sign> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C forward(const C& x, const UnaryArgs<C>&) {
    if constexpr (std::is_unsigned_v<C>) {
      return C(x != C(0));
    } else {
      return C((C(0) < x) - (x < C(0)));
    }
  }
  template <typename M, typename C>
  MT_HOST_DEVICE static C backward(const C&, const C&, const C&, const UnaryArgs<C>&) {
    return C(0);
  }
};

template <>
struct Unary<UnaryOp::Reciprocal> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C forward(const C& x, const UnaryArgs<C>&) {
    return C(1) / x;
  }
  template <typename M, typename C>
  MT_HOST_DEVICE static C backward(const C& g, const C&, const C& y, const UnaryArgs<C>&) {
    return -g * y * y;
  }
};

template <>
struct Unary<UnaryOp::Square> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C forward(const C& x, const UnaryArgs<C>&) {
    return x * x;
  }
  template <typename M, typename C>
  MT_HOST_DEVICE static C backward(const C& g, const C& x, const C&, const UnaryArgs<C>&) {
    return C(2) * g * x;
  }
};

// g is loaded before the select: on the CPU a conditional load keeps the compiler from
// vectorizing, and a branch on the sign of x mispredicts half the time (measured 30x).
template <>
struct Unary<UnaryOp::Relu> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C forward(const C& x, const UnaryArgs<C>&) {
    return x > C(0) ? x : (x != x ? x : C(0));  // NaN stays NaN
  }
  template <typename M, typename C>
  MT_HOST_DEVICE static C backward(const C& g, const C& x, const C&, const UnaryArgs<C>&) {
    const C gv = g;
    return x > C(0) ? gv : C(0);
  }
};

// torch.nn.functional.leaky_relu: the slope a below zero (NaN stays NaN through a * x).
template <>
struct Unary<UnaryOp::LeakyRelu> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C forward(const C& x, const UnaryArgs<C>& args) {
    return x > C(0) ? x : x * args.a;
  }
  template <typename M, typename C>
  MT_HOST_DEVICE static C backward(const C& g, const C& x, const C&, const UnaryArgs<C>& args) {
    const C gv = g;
    return x > C(0) ? gv : gv * args.a;
  }
};

// x Phi(x), Phi the standard normal CDF (torch's 0.5 x (1 + erf(x / sqrt 2))); the derivative
// is Phi(x) + x phi(x). The policy's Phi is an erfc form, accurate in the lower tail where
// 1 + erf cancels (below x = -3 that form loses every digit of a result under 1e-3).
template <>
struct Unary<UnaryOp::Gelu> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C forward(const C& x, const UnaryArgs<C>&) {
    return x * M::normal_cdf(x);
  }
  template <typename M, typename C>
  MT_HOST_DEVICE static C backward(const C& g, const C& x, const C&, const UnaryArgs<C>&) {
    return g * (M::normal_cdf(x) + x * M::normal_pdf(x));
  }
};

// 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), computed as x sigmoid(2u): the
// same function, but exp instead of tanh (glibc's tanhf is 8x slower than its expf: the op took
// 18 ms for 2M floats on 2 threads, a quarter of a GPT-2 block's forward), and without the
// cancellation of 1 + tanh(u) for negative x. dy/dx = s + 2 x s (1 - s) du/dx with s = sigmoid(2u)
// (as 0.5 (1 + t) = s and 1 - t^2 = 4 s (1 - s)).
template <>
struct Unary<UnaryOp::GeluTanh> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C forward(const C& x, const UnaryArgs<C>&) {
    return x * sigmoid<M>(C(2 * kSqrt2OverPi) * (x + C(0.044715) * x * x * x));
  }
  template <typename M, typename C>
  MT_HOST_DEVICE static C backward(const C& g, const C& x, const C&, const UnaryArgs<C>&) {
    const C s = sigmoid<M>(C(2 * kSqrt2OverPi) * (x + C(0.044715) * x * x * x));
    const C dinner = C(kSqrt2OverPi) * (C(1) + C(3 * 0.044715) * x * x);
    return g * (s + C(2) * x * s * (C(1) - s) * dinner);
  }
};

template <>
struct Unary<UnaryOp::Silu> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C forward(const C& x, const UnaryArgs<C>&) {
    return x * sigmoid<M>(x);
  }
  template <typename M, typename C>
  MT_HOST_DEVICE static C backward(const C& g, const C& x, const C&, const UnaryArgs<C>&) {
    const C sg = sigmoid<M>(x);
    return g * sg * (C(1) + x * (C(1) - sg));
  }
};

template <>
struct Unary<UnaryOp::Sigmoid> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C forward(const C& x, const UnaryArgs<C>&) {
    return sigmoid<M>(x);
  }
  template <typename M, typename C>
  MT_HOST_DEVICE static C backward(const C& g, const C&, const C& y, const UnaryArgs<C>&) {
    return g * y * (C(1) - y);
  }
};

// y * y rounded on its own before the subtraction: a fused 1 - y * y differs most where it
// matters (|y| near 1, heavy cancellation), and nvcc would fuse it.
template <>
struct Unary<UnaryOp::Tanh> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C forward(const C& x, const UnaryArgs<C>&) {
    return M::tanh(x);
  }
  template <typename M, typename C>
  MT_HOST_DEVICE static C backward(const C& g, const C&, const C& y, const UnaryArgs<C>&) {
    return g * (C(1) - M::mul_rn(y, y));
  }
};

template <>
struct Unary<UnaryOp::PowScalar> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C forward(const C& x, const UnaryArgs<C>& args) {
    return args.square ? x * x : M::pow(x, args.a);
  }
  template <typename M, typename C>
  MT_HOST_DEVICE static C backward(const C& g, const C& x, const C&, const UnaryArgs<C>& args) {
    return args.a == C(0) ? C(0) : g * args.a * M::pow(x, args.a - C(1));
  }
};

template <>
struct Unary<UnaryOp::ClampScalar> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C forward(const C& x, const UnaryArgs<C>& args) {
    return x != x ? x : (x < args.a ? args.a : (x > args.b ? args.b : x));  // NaN stays NaN
  }
  template <typename M, typename C>
  MT_HOST_DEVICE static C backward(const C& g, const C& x, const C&, const UnaryArgs<C>& args) {
    const C gv = g, xv = x;
    return (xv >= args.a) & (xv <= args.b) ? gv : C(0);
  }
};

template <>
struct Unary<UnaryOp::AddScalar> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C forward(const C& x, const UnaryArgs<C>& args) {
    return x + args.a;
  }
  template <typename M, typename C>
  MT_HOST_DEVICE static C backward(const C& g, const C&, const C&, const UnaryArgs<C>&) {
    return g;
  }
};

template <>
struct Unary<UnaryOp::MulScalar> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C forward(const C& x, const UnaryArgs<C>& args) {
    return x * args.a;
  }
  template <typename M, typename C>
  MT_HOST_DEVICE static C backward(const C& g, const C&, const C&, const UnaryArgs<C>& args) {
    return g * args.a;
  }
};

template <>
struct Unary<UnaryOp::RsubScalar> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C forward(const C& x, const UnaryArgs<C>& args) {
    return args.a - x;
  }
  template <typename M, typename C>
  MT_HOST_DEVICE static C backward(const C& g, const C&, const C&, const UnaryArgs<C>&) {
    return -g;
  }
};

// ---- binary: apply(x, y), in C for arithmetic, bool for comparisons ------------------------

template <BinaryOp op>
struct Binary;

template <>
struct Binary<BinaryOp::Add> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C apply(const C& x, const C& y) {
    return x + y;
  }
};

template <>
struct Binary<BinaryOp::Sub> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C apply(const C& x, const C& y) {
    return x - y;
  }
};

template <>
struct Binary<BinaryOp::Mul> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C apply(const C& x, const C& y) {
    return x * y;
  }
};

template <>
struct Binary<BinaryOp::Div> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C apply(const C& x, const C& y) {
    return x / y;
  }
};

template <>
struct Binary<BinaryOp::Pow> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C apply(const C& x, const C& y) {
    return M::pow(x, y);
  }
};

// NaN propagates (from either side: x > NaN is false, so y wins).
template <>
struct Binary<BinaryOp::Maximum> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C apply(const C& x, const C& y) {
    return (x != x) | (x > y) ? x : y;
  }
};

template <>
struct Binary<BinaryOp::Minimum> {
  template <typename M, typename C>
  MT_HOST_DEVICE static C apply(const C& x, const C& y) {
    return (x != x) | (x < y) ? x : y;
  }
};

template <>
struct Binary<BinaryOp::Eq> {
  template <typename M, typename C>
  MT_HOST_DEVICE static bool apply(const C& x, const C& y) {
    return x == y;
  }
};

template <>
struct Binary<BinaryOp::Ne> {
  template <typename M, typename C>
  MT_HOST_DEVICE static bool apply(const C& x, const C& y) {
    return x != y;
  }
};

template <>
struct Binary<BinaryOp::Lt> {
  template <typename M, typename C>
  MT_HOST_DEVICE static bool apply(const C& x, const C& y) {
    return x < y;
  }
};

template <>
struct Binary<BinaryOp::Le> {
  template <typename M, typename C>
  MT_HOST_DEVICE static bool apply(const C& x, const C& y) {
    return x <= y;
  }
};

template <>
struct Binary<BinaryOp::Gt> {
  template <typename M, typename C>
  MT_HOST_DEVICE static bool apply(const C& x, const C& y) {
    return x > y;
  }
};

template <>
struct Binary<BinaryOp::Ge> {
  template <typename M, typename C>
  MT_HOST_DEVICE static bool apply(const C& x, const C& y) {
    return x >= y;
  }
};

}  // namespace mantissa::backend::op_math
