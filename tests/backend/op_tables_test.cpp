// The op lists of backend/op_tables.h and what the backends derive from them, frozen here as
// explicit expectations: a change to a row that changes behaviour shows up as a failing line
// rather than a silent difference.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "backend/op_math.h"
#include "backend/op_tables.h"

namespace mantissa::backend {
namespace {

// The enum values follow the rows; callers compare op >= BinaryOp::Eq.
static_assert(int(UnaryOp::Neg) == 0 && int(UnaryOp::RsubScalar) == 20);
static_assert(int(BinaryOp::Add) == 0 && int(BinaryOp::Eq) == 7 && int(BinaryOp::Ge) == 12);
static_assert(int(ReduceOp::Sum) == 0 && int(ReduceOp::Max) == 2 && int(ReduceOp::Var) == 4 &&
              int(ReduceOp::ArgMin) == 6);

// Which ops the backends run on integer and bool compute types.
static_assert(op_math::unary_runs_on<UnaryOp::Relu, int64_t>());
static_assert(op_math::unary_runs_on<UnaryOp::MulScalar, uint8_t>());
static_assert(!op_math::unary_runs_on<UnaryOp::Exp, int32_t>());
static_assert(!op_math::unary_runs_on<UnaryOp::Neg, bool>());
static_assert(op_math::binary_runs_on<BinaryOp::Div, int64_t>());
static_assert(!op_math::binary_runs_on<BinaryOp::Pow, int64_t>());
static_assert(op_math::binary_runs_on<BinaryOp::Lt, bool>());
static_assert(!op_math::binary_runs_on<BinaryOp::Add, bool>());

TEST(OpTables, RowsAreInEnumOrderWithUniqueNames) {
  std::set<std::string> names;
  for (size_t i = 0; i < std::size(kUnaryOps); ++i) {
    EXPECT_EQ(size_t(kUnaryOps[i].op), i);
    EXPECT_TRUE(names.insert(kUnaryOps[i].name).second) << kUnaryOps[i].name;
  }
  names.clear();
  for (size_t i = 0; i < std::size(kBinaryOps); ++i) {
    EXPECT_EQ(size_t(kBinaryOps[i].op), i);
    EXPECT_TRUE(names.insert(kBinaryOps[i].name).second) << kBinaryOps[i].name;
  }
  for (size_t i = 0; i < std::size(kReduceOps); ++i)
    EXPECT_EQ(size_t(kReduceOps[i].op), i);
}

TEST(OpTables, WhatTheOpLayerReads) {
  // Integer inputs: kept by the ops with integer kernels, f32 for the real functions.
  for (UnaryOp op : {UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Sign, UnaryOp::Square, UnaryOp::Relu,
                     UnaryOp::ClampScalar})
    EXPECT_EQ(unary_info(op).integers, OnIntegers::Keep) << unary_info(op).name;
  for (UnaryOp op : {UnaryOp::AddScalar, UnaryOp::MulScalar, UnaryOp::RsubScalar})
    EXPECT_EQ(unary_info(op).integers, OnIntegers::KernelF32) << unary_info(op).name;
  EXPECT_EQ(unary_info(UnaryOp::Tanh).integers, OnIntegers::F32);
  // The derivative's inputs: y for exp/sqrt/rsqrt/reciprocal/sigmoid/tanh, nothing for the
  // affine ops and sign, x for the rest.
  for (const UnaryOpInfo& info : kUnaryOps) {
    const UnaryOp op = info.op;
    const bool output = op == UnaryOp::Exp || op == UnaryOp::Sqrt || op == UnaryOp::Rsqrt ||
                        op == UnaryOp::Reciprocal || op == UnaryOp::Sigmoid || op == UnaryOp::Tanh;
    const bool nothing = op == UnaryOp::Neg || op == UnaryOp::AddScalar ||
                         op == UnaryOp::MulScalar || op == UnaryOp::RsubScalar ||
                         op == UnaryOp::Sign;
    EXPECT_EQ(info.needs, output    ? UnaryNeeds::Output
                          : nothing ? UnaryNeeds::Nothing
                                    : UnaryNeeds::Input)
        << info.name;
  }
  EXPECT_STREQ(unary_info(UnaryOp::GeluTanh).name, "gelu(tanh)");
  EXPECT_EQ(binary_info(BinaryOp::Div).integers, OnIntegers::KernelF32);
  EXPECT_EQ(binary_info(BinaryOp::Pow).needs, BinaryNeeds::InputsAndOutput);
  EXPECT_EQ(binary_info(BinaryOp::Add).needs, BinaryNeeds::Nothing);
  EXPECT_TRUE(is_comparison(BinaryOp::Ne));
  EXPECT_FALSE(is_comparison(BinaryOp::Minimum));
  EXPECT_EQ(reduce_info(ReduceOp::ArgMax).kind, ReduceKind::Index);
  EXPECT_TRUE(reduce_info(ReduceOp::Max).picks_max);
  EXPECT_FALSE(reduce_info(ReduceOp::ArgMin).picks_max);
}

}  // namespace
}  // namespace mantissa::backend
