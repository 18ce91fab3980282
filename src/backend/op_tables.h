// Internal: the elementwise and reduction ops the backends provide, one X-macro list per concept
// (docs/design.md §7, like MT_FORALL_DTYPES and the autocast table). Each row holds what the op
// layer and the dispatchers need to know about an op; its math is defined once, for both backends,
// in backend/op_math.h (Unary<op>, Binary<op>), and the dispatch switches are generated from these
// lists, so a new op is one row here plus its math (plus its public function in tensor/ops.h),
// and a row without math fails to compile, naming the op.
//
// The enum values follow the rows' order. Tests and callers rely on the comparisons coming last
// among the binary ops (op >= BinaryOp::Eq); a static_assert below keeps it so.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mantissa::backend {

// What an op does with integer tensors.
enum class OnIntegers : uint8_t {
  Keep,       // the backends have integer kernels and the public op keeps integer inputs integer
              // (a unary op given a fractional scalar computes in f32: clamp(x, 0.5, 2))
  KernelF32,  // the backends have integer kernels (Tensor::mul_ runs MulScalar on integer
              // tensors), but the public op computes integer inputs in f32 (add(int_tensor, 2.0)
              // is f32, div(a, b) is true division)
  F32,        // a real function: no integer kernel; the public op computes integer inputs in f32
};

// Which forward values a unary op's derivative reads: the op layer saves only those.
enum class UnaryNeeds : uint8_t { Nothing, Input, Output };

// _(Enum, name, scalars, integers, derivative needs)
//   name:    in error messages and autograd node names ("<name>Backward");
//   scalars: how many of Scalars{a, b} the op reads.
// clang-format off
#define MT_FORALL_UNARY_OPS(_)                                                \
  _(Neg,         "neg",        0, Keep,      Nothing)                         \
  _(Exp,         "exp",        0, F32,       Output)                          \
  _(Log,         "log",        0, F32,       Input)                           \
  _(Sqrt,        "sqrt",       0, F32,       Output)                          \
  _(Rsqrt,       "rsqrt",      0, F32,       Output)                          \
  _(Abs,         "abs",        0, Keep,      Input)                           \
  _(Sign,        "sign",       0, Keep,      Nothing)                         \
  _(Reciprocal,  "reciprocal", 0, F32,       Output)                          \
  _(Square,      "square",     0, Keep,      Input)                           \
  _(Relu,        "relu",       0, Keep,      Input)                           \
  _(Gelu,        "gelu",       0, F32,       Input)                           \
  _(GeluTanh,    "gelu(tanh)", 0, F32,       Input)                           \
  _(Silu,        "silu",       0, F32,       Input)                           \
  _(Sigmoid,     "sigmoid",    0, F32,       Output)                          \
  _(Tanh,        "tanh",       0, F32,       Output)                          \
  _(LeakyRelu,   "leaky_relu", 1, F32,       Input)   /* x > 0 ? x : a x */   \
  _(PowScalar,   "pow",        1, F32,       Input)   /* x ^ a */             \
  _(ClampScalar, "clamp",      2, Keep,      Input)   /* min(max(x, a), b) */ \
  _(AddScalar,   "add",        1, KernelF32, Nothing) /* x + a */             \
  _(MulScalar,   "mul",        1, KernelF32, Nothing) /* x * a */             \
  _(RsubScalar,  "rsub",       1, KernelF32, Nothing) /* a - x */
// clang-format on

// Arithmetic ops write the inputs' dtype; comparisons write Bool (and are the only binary ops
// defined on Bool inputs).
enum class BinaryKind : uint8_t { Arithmetic, Comparison };

// What a binary op's backward reads besides the incoming gradient.
enum class BinaryNeeds : uint8_t { Nothing, Inputs, InputsAndOutput };

// _(Enum, name, kind, integers, backward needs)
// clang-format off
#define MT_FORALL_BINARY_OPS(_)                                 \
  _(Add,     "add",     Arithmetic, Keep,      Nothing)         \
  _(Sub,     "sub",     Arithmetic, Keep,      Nothing)         \
  _(Mul,     "mul",     Arithmetic, Keep,      Inputs)          \
  _(Div,     "div",     Arithmetic, KernelF32, InputsAndOutput) \
  _(Pow,     "pow",     Arithmetic, F32,       InputsAndOutput) \
  _(Maximum, "maximum", Arithmetic, Keep,      Inputs)          \
  _(Minimum, "minimum", Arithmetic, Keep,      Inputs)          \
  _(Eq,      "eq",      Comparison, Keep,      Nothing)         \
  _(Ne,      "ne",      Comparison, Keep,      Nothing)         \
  _(Lt,      "lt",      Comparison, Keep,      Nothing)         \
  _(Le,      "le",      Comparison, Keep,      Nothing)         \
  _(Gt,      "gt",      Comparison, Keep,      Nothing)         \
  _(Ge,      "ge",      Comparison, Keep,      Nothing)
// clang-format on

// Accumulate: a sum over the row (fp32, f64 for f64); Select: the winning element itself;
// Index: the I64 index of the winner (the first one; NaN wins, as in PyTorch).
enum class ReduceKind : uint8_t { Accumulate, Select, Index };

// _(Enum, name, kind, picks the maximum)
// clang-format off
#define MT_FORALL_REDUCE_OPS(_)          \
  _(Sum,    "sum",    Accumulate, false) \
  _(Mean,   "mean",   Accumulate, false) \
  _(Max,    "max",    Select,     true)  \
  _(Min,    "min",    Select,     false) \
  _(Var,    "var",    Accumulate, false) \
  _(ArgMax, "argmax", Index,      true)  \
  _(ArgMin, "argmin", Index,      false)
// clang-format on

// ---- the enums and tables made from the lists ------------------------------------------------

#define MT_OP_ENUM(e, ...) e,
enum class UnaryOp : uint8_t { MT_FORALL_UNARY_OPS(MT_OP_ENUM) };
enum class BinaryOp : uint8_t { MT_FORALL_BINARY_OPS(MT_OP_ENUM) };
enum class ReduceOp : uint8_t { MT_FORALL_REDUCE_OPS(MT_OP_ENUM) };
#undef MT_OP_ENUM

struct UnaryOpInfo {
  UnaryOp op;
  const char* name;
  int scalars;
  OnIntegers integers;
  UnaryNeeds needs;
};

struct BinaryOpInfo {
  BinaryOp op;
  const char* name;
  BinaryKind kind;
  OnIntegers integers;
  BinaryNeeds needs;
};

struct ReduceOpInfo {
  ReduceOp op;
  const char* name;
  ReduceKind kind;
  bool picks_max;  // Select/Index: the maximum (else the minimum)
};

inline constexpr UnaryOpInfo kUnaryOps[] = {
#define MT_UNARY_INFO(e, name, scalars, ints, needs) \
  {UnaryOp::e, name, scalars, OnIntegers::ints, UnaryNeeds::needs},
    MT_FORALL_UNARY_OPS(MT_UNARY_INFO)
#undef MT_UNARY_INFO
};

inline constexpr BinaryOpInfo kBinaryOps[] = {
#define MT_BINARY_INFO(e, name, kind, ints, needs) \
  {BinaryOp::e, name, BinaryKind::kind, OnIntegers::ints, BinaryNeeds::needs},
    MT_FORALL_BINARY_OPS(MT_BINARY_INFO)
#undef MT_BINARY_INFO
};

inline constexpr ReduceOpInfo kReduceOps[] = {
#define MT_REDUCE_INFO(e, name, kind, picks_max) {ReduceOp::e, name, ReduceKind::kind, picks_max},
    MT_FORALL_REDUCE_OPS(MT_REDUCE_INFO)
#undef MT_REDUCE_INFO
};

constexpr const UnaryOpInfo& unary_info(UnaryOp op) {
  return kUnaryOps[static_cast<size_t>(op)];
}
constexpr const BinaryOpInfo& binary_info(BinaryOp op) {
  return kBinaryOps[static_cast<size_t>(op)];
}
constexpr const ReduceOpInfo& reduce_info(ReduceOp op) {
  return kReduceOps[static_cast<size_t>(op)];
}

constexpr bool is_comparison(BinaryOp op) {
  return binary_info(op).kind == BinaryKind::Comparison;
}

constexpr bool comparisons_come_last() {
  bool seen = false;
  for (const BinaryOpInfo& info : kBinaryOps) {
    if (seen && info.kind != BinaryKind::Comparison) return false;
    seen = seen || info.kind == BinaryKind::Comparison;
  }
  return true;
}
static_assert(comparisons_come_last(),
              "MT_FORALL_BINARY_OPS: comparisons come after every arithmetic op (op >= Eq)");

}  // namespace mantissa::backend
