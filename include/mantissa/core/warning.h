// Warnings: what a user should know that is not an error — an op a backend lacks that ran on the
// CPU instead, an autocast region that never met a tensor of its device. Each warning has a key
// (one per kind and place, e.g. "fallback:cuda:conv2d"); every occurrence is counted, and the
// first of each key is shown: printed to stderr as "mantissa: warning: <message>", or handed to a
// handler the program installs. The counts stay readable, so a run can report how often a slow
// path was taken instead of printing it every step. Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mantissa {

// Counts `key` and shows `message` if this is the key's first occurrence (since the last
// reset_warnings()).
void warn(std::string_view key, const std::string& message);

// How many times `key` was warned about (0: never).
int64_t warning_count(std::string_view key);
// Every key warned about with its count, sorted by key.
std::vector<std::pair<std::string, int64_t>> warning_counts();
// Forgets the counts: the next occurrence of each key is shown again.
void reset_warnings();

// Receives the first occurrence of each key instead of stderr. Returns the previous handler
// (null: stderr); pass nullptr to go back to stderr. Called with no lock held.
using WarningHandler = std::function<void(std::string_view key, const std::string& message)>;
WarningHandler set_warning_handler(WarningHandler handler);

}  // namespace mantissa
