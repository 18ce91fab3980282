// What a test asserts about a user's mistake: the message of the mantissa::Error it throws, and
// that the message names something.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "mantissa/core/error.h"

namespace mantissa::testing {

// The message of the mantissa::Error that `fn` throws ("" and a test failure if none).
template <typename F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.message();
  }
  ADD_FAILURE() << "expected a mantissa::Error";
  return "";
}

}  // namespace mantissa::testing

// The text contains part (both anything a std::string is made from).
#define EXPECT_HAS(text, part)                               \
  EXPECT_NE(std::string(text).find(part), std::string::npos) \
      << "'" << (text) << "' lacks " << (part)
