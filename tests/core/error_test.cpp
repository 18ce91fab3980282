#include <gtest/gtest.h>

#include "mantissa/core/error.h"

namespace mantissa {
namespace {

TEST(Error, CheckThrowsWithMessageAndLocation) {
  try {
    const int rows = 3;
    MT_CHECK(rows == 4, "expected 4 rows, got ", rows, "; reshape the input");
    FAIL() << "MT_CHECK did not throw";
  } catch (const Error& e) {
    EXPECT_EQ(e.message(), "expected 4 rows, got 3; reshape the input");
    EXPECT_NE(std::string(e.what()).find("error_test.cpp:"), std::string::npos) << e.what();
    EXPECT_FALSE(e.internal());
  }
}

TEST(Error, AssertIsMarkedInternal) {
  try {
    MT_ASSERT(1 + 1 == 3, "arithmetic");
    FAIL();
  } catch (const Error& e) {
    EXPECT_TRUE(e.internal());
    EXPECT_NE(e.message().find("1 + 1 == 3"), std::string::npos);
    EXPECT_NE(e.message().find("arithmetic"), std::string::npos);
  }
  EXPECT_NO_THROW(MT_ASSERT(true));
  EXPECT_NO_THROW(MT_CHECK(true, "never"));
}

}  // namespace
}  // namespace mantissa
