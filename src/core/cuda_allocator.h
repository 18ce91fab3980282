// Internal: the allocator of CUDA device `device`, which allocator_for(Device) hands out. Declared
// in core and defined by the CUDA backend (src/backend/cuda/allocator.cpp), or by
// src/backend/no_cuda.cpp in a build without it (an error that says so): the core layer needs
// nothing from the layers above it, and the link supplies the definition.
#pragma once

#include "mantissa/core/allocator.h"

namespace mantissa::detail {

Allocator& cuda_allocator(int device);

}  // namespace mantissa::detail
