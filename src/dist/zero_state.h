// What ZeRO-1 checkpoints need from the communicator: named tensors gathered from every rank
// (src/dist/zero_state.cpp), and the order an unsharded optimizer writes its state in.
#pragma once

#include <string_view>
#include <utility>
#include <vector>

#include "mantissa/dist/communicator.h"

namespace mantissa::dist {

// Every rank's `mine` on `root`, in rank order (CPU copies; other ranks get an empty vector).
// Every rank calls it: one all-reduce of the sizes, one gather of the packed bytes, staged on
// `device` (where the communicator's collectives run: the CPU for MPI, the GPU for NCCL).
std::vector<NamedTensors> gather_named_tensors(const NamedTensors& mine, Communicator& comm,
                                               int root, Device device);

// Where an optimizer state key goes in Optimizer::state_dict()'s order: {0, 0} for "step", "lr"
// and "group.<g>.lr" (written first, in their order), {1, i} for "state.<i>.*", {2, i} for
// "master.<i>".
std::pair<int, size_t> state_key_place(std::string_view key);

}  // namespace mantissa::dist
