// Shared by the CUDA tests of this folder: they run on a machine with an NVIDIA GPU and skip
// themselves, saying why, everywhere else (CI compiles the backend but has no GPU).
#pragma once

#include <gtest/gtest.h>

#include "mantissa/core/cuda.h"
#include "mantissa/core/device_info.h"

#define MT_REQUIRE_CUDA()                                                            \
  do {                                                                               \
    if (!::mantissa::cuda::is_available())                                           \
      GTEST_SKIP() << "no CUDA GPU here (" << ::mantissa::cuda_info().status << ")"; \
  } while (0)
