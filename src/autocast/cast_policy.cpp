// The autocast table (docs/design.md §7: a table, not scattered ifs): every op autocast knows and
// what it does with the op's inputs. Follows PyTorch's autocast_mode.cpp:
//   lower precision: the GEMM/convolution ops that tensor cores (and oneDNN bf16) speed up and
//                    whose fp32 accumulation keeps them accurate;
//   fp32:            ops whose range (exp, log, pow, 1/x), accumulation over many elements
//                    (reductions, norms, softmax) or loss value needs fp32;
//   promote:         ops combining several tensors, which run in the widest input dtype;
//   none:            batch norm, which PyTorch lists nowhere (CPU and CUDA): it runs in its
//                    input's dtype (a conv's bf16 output stays bf16), its statistics in fp32 and
//                    its fp32 weight, bias and running stats untouched;
//   fp16-banned:     binary_cross_entropy, whose gradient p(1-p) underflows in fp16; its
//                    logits form is safe.
#include "mantissa/autocast/autocast.h"
#include "mantissa/core/error.h"

namespace mantissa::amp {

namespace {

using enum CastPolicy;

// One row per op, in MT_FORALL_AUTOCAST_OPS order (checked at compile time below).
constexpr PolicyEntry kTable[] = {
    {OpId::Matmul, LowerPrecision},
    {OpId::Linear, LowerPrecision},
    {OpId::Conv2d, LowerPrecision},
    {OpId::ConvTranspose2d, LowerPrecision},
    {OpId::ScaledDotProductAttention, LowerPrecision},
    {OpId::LstmSequence, LowerPrecision},
    {OpId::Softmax, Fp32},
    {OpId::LogSoftmax, Fp32},
    {OpId::LayerNorm, Fp32},
    {OpId::BatchNorm, None},
    {OpId::CrossEntropy, Fp32},
    {OpId::BinaryCrossEntropy, Fp32, Fp16Rule::Banned,
     "use binary_cross_entropy_with_logits, which is safe (it fuses the sigmoid into the loss), "
     "and drop the sigmoid before it"},
    {OpId::BinaryCrossEntropyWithLogits, Fp32},
    {OpId::Exp, Fp32},
    {OpId::Log, Fp32},
    {OpId::Pow, Fp32},
    {OpId::Rsqrt, Fp32},
    {OpId::Reciprocal, Fp32},
    {OpId::Sum, Fp32},
    {OpId::Mean, Fp32},
    {OpId::Var, Fp32},
    {OpId::Add, Promote},
    {OpId::Sub, Promote},
    {OpId::Mul, Promote},
    {OpId::Div, Promote},
    {OpId::Maximum, Promote},
    {OpId::Minimum, Promote},
    {OpId::Where, Promote},
    {OpId::Cat, Promote},
    {OpId::Stack, Promote},
};

constexpr bool table_complete() {
  if (std::size(kTable) != size_t(kNumAutocastOps)) return false;
  for (size_t i = 0; i < std::size(kTable); ++i) {
    if (size_t(kTable[i].op) != i) return false;
  }
  return true;
}
static_assert(table_complete(), "kTable needs one row per MT_FORALL_AUTOCAST_OPS entry, in order");

constexpr std::string_view kNames[] = {
#define MT_AUTOCAST_OP_NAME(e, name) name,
    MT_FORALL_AUTOCAST_OPS(MT_AUTOCAST_OP_NAME)
#undef MT_AUTOCAST_OP_NAME
};

}  // namespace

const PolicyEntry& policy_entry(OpId op) {
  MT_ASSERT(size_t(op) < std::size(kTable), "unknown autocast op ", int(op));
  return kTable[size_t(op)];
}

std::string_view op_name(OpId op) {
  MT_ASSERT(size_t(op) < std::size(kNames), "unknown autocast op ", int(op));
  return kNames[size_t(op)];
}

std::string_view policy_name(CastPolicy p) {
  switch (p) {
    case LowerPrecision:
      return "lower_precision";
    case Fp32:
      return "fp32";
    case Promote:
      return "promote";
    case None:
      return "none";
  }
  return "unknown";
}

}  // namespace mantissa::amp
