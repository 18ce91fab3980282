// A user's mistake gets a mantissa::Error whose message says what was wrong.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "mantissa/tensor/ops.h"

namespace mantissa {
namespace {

// Runs f and returns the Error's message ("" if nothing was thrown).
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_FALSE(e.internal()) << "a user's mistake reported as an internal error: " << e.what();
    return e.message();
  }
  return "";
}

void expect_mentions(const std::string& msg, std::initializer_list<const char*> parts) {
  EXPECT_FALSE(msg.empty()) << "no error was raised";
  for (const char* p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "'" << p << "' not in: " << msg;
}

TEST(Errors, ShapeMismatchNamesBothShapes) {
  const Tensor a = Tensor::ones({2, 3}), b = Tensor::ones({4, 3});
  expect_mentions(error_of([&] { add(a, b); }), {"add", "(2, 3)", "(4, 3)", "broadcast"});
  expect_mentions(error_of([&] { a.view({4, 2}); }), {"(4, 2)", "(2, 3)"});
  expect_mentions(error_of([&] { a.narrow(1, 2, 5); }), {"narrow", "out of range"});
  expect_mentions(error_of([&] { a.expand({2, 5}); }), {"expand", "cannot become 5"});
  expect_mentions(error_of([&] { sum(a, {2}); }), {"dim 2", "out of range"});
  expect_mentions(error_of([&] { cat({a, Tensor::ones({2, 3, 1})}); }), {"cat", "dims"});
}

TEST(Errors, DtypesThatCannotWork) {
  const Tensor i = Tensor::arange(3);
  expect_mentions(error_of([&] { Tensor(i).set_requires_grad(true); }), {"floating", "i64"});
  expect_mentions(error_of([&] { where(i, i, i); }), {"where", "bool"});
  expect_mentions(error_of([&] { mean(i); }), {"mean", "floating"});
  expect_mentions(error_of([&] { index_select(Tensor::ones({3}), 0, Tensor::ones({2})); }),
                  {"index_select", "integer"});
  expect_mentions(error_of([&] { index_select(Tensor::ones({3}), 0, Tensor::arange(5)); }),
                  {"index 3", "out of range"});
  expect_mentions(error_of([&] { Tensor::ones({2}).data<double>(); }), {"f32"});
}

TEST(Errors, AutogradMisuse) {
  Tensor w = Tensor::ones({3}).set_requires_grad(true);
  Tensor loss = sum(mul(w, w));
  loss.backward();
  expect_mentions(error_of([&] { loss.backward(); }), {"second time", "retain_graph"});

  Tensor y = mul(w, w);
  expect_mentions(error_of([&] { y.backward(); }), {"one-element", "(3,)"});
  expect_mentions(error_of([&] { sum(Tensor::ones({2})).backward(); }), {"does not require grad"});
  expect_mentions(error_of([&] { w.add_(Tensor::ones({3})); }), {"in-place", "leaf", "NoGrad"});

  // Modifying a saved tensor in place after the forward pass.
  Tensor a = Tensor::ones({3}).set_requires_grad(true);
  Tensor b = mul(a, 2.0);
  Tensor c = exp(b);  // saves its output
  c.mul_(3.0);
  expect_mentions(error_of([&] { sum(c).backward(); }), {"modified by an in-place operation"});
}

TEST(Errors, BadArguments) {
  expect_mentions(error_of([] { Tensor::empty({2, -1}); }), {"negative"});
  expect_mentions(error_of([] { dropout(Tensor::ones({2}), 1.5); }), {"dropout", "1.5"});
  expect_mentions(error_of([] { clamp(Tensor::ones({2}), 3.0, 1.0); }), {"clamp", "greater"});
  expect_mentions(error_of([] {
                    Tensor::from_vector(std::vector<double>{1, 2, 3}, {2, 2});
                  }),
                  {"3 values", "(2, 2)"});
  expect_mentions(error_of([] { set_num_threads(0); }), {"threads"});
  expect_mentions(error_of([] { parse_device("tpu"); }), {"tpu", "cpu"});
  // All of the text is the index, and an int holds it.
  for (const std::string& bad :
       std::vector<std::string>{"cuda:", "cuda:x", "cuda: 1", "cuda:+1", "cuda:-1", "cuda:1x",
                                std::string("cuda:1\0", 7), "cuda:99999999999"}) {
    EXPECT_THROW(parse_device(bad), Error) << bad;
  }
  EXPECT_EQ(parse_device("cuda:3"), Device::cuda(3));
  EXPECT_EQ(parse_device("cuda"), Device::cuda(0));
}

}  // namespace
}  // namespace mantissa
