// Whole-file reads shared by the data module's readers (internal).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mantissa::data {

// The file's bytes; a missing, unreadable or directory path raises mantissa::Error naming it.
std::vector<uint8_t> read_file(const std::string& path);

}  // namespace mantissa::data
