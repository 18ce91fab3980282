// Shared by the CUDA tests: they run on a machine with an NVIDIA GPU and skip themselves, saying
// why, everywhere else (CI compiles the backend but has no GPU). Every test program counts these
// skips and ends with one line, "N GPU tests skipped: no CUDA device" (support/gpu_skips.cpp);
// scripts/test adds up those lines over a ctest run.
#pragma once

#include <gtest/gtest.h>

#include "mantissa/core/cuda.h"
#include "mantissa/core/device_info.h"

// How a skip message for want of a GPU starts; support/gpu_skips.cpp counts the skips by it.
#define MT_NO_CUDA_DEVICE "no CUDA device"

#define MT_REQUIRE_CUDA()                                                              \
  do {                                                                                 \
    if (!::mantissa::cuda::is_available())                                             \
      GTEST_SKIP() << MT_NO_CUDA_DEVICE " (" << ::mantissa::cuda_info().status << ")"; \
  } while (0)
