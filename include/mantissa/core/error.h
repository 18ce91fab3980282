// Two tiers of errors (docs/design.md §7):
//   MT_CHECK(cond, msg...)  — a user's mistake: throws mantissa::Error whose message says what
//                             was wrong and what to do, with the file:line that caught it.
//   MT_ASSERT(cond, msg...) — an internal invariant: also throws (never aborts a training run
//                             silently), but the message marks it as a Mantissa bug.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace mantissa {

class Error : public std::runtime_error {
 public:
  Error(std::string what, std::string_view file, int line, bool internal = false);

  // The message without the "file:line: " prefix, for showing to a user.
  const std::string& message() const noexcept { return message_; }
  // True for a failed MT_ASSERT: Mantissa's fault, not the user's.
  bool internal() const noexcept { return internal_; }

 private:
  std::string message_;
  bool internal_;
};

// A value from a user's file, fit for a message: bytes outside printable ASCII (control bytes, a
// binary file's) as \xNN, cut to `max` characters with "...".
std::string printable(std::string_view value, size_t max = 40);

namespace detail {

template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

[[noreturn]] void throw_error(std::string_view file, int line, std::string msg);
[[noreturn]] void throw_internal(std::string_view file, int line, std::string_view cond,
                                 std::string msg);

}  // namespace detail
}  // namespace mantissa

#define MT_CHECK(cond, ...)                                                     \
  do {                                                                          \
    if (!(cond)) [[unlikely]]                                                   \
      ::mantissa::detail::throw_error(__FILE__, __LINE__,                       \
                                      ::mantissa::detail::concat(__VA_ARGS__)); \
  } while (0)

#define MT_ASSERT(cond, ...)                                                                     \
  do {                                                                                           \
    if (!(cond)) [[unlikely]]                                                                    \
      ::mantissa::detail::throw_internal(                                                        \
          __FILE__, __LINE__, #cond, ::mantissa::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)
