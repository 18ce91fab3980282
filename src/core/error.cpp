#include "mantissa/core/error.h"

namespace mantissa {
namespace {

std::string_view basename(std::string_view path) {
  auto slash = path.find_last_of('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

std::string with_location(const std::string& what, std::string_view file, int line) {
  return detail::concat(basename(file), ":", line, ": ", what);
}

}  // namespace

Error::Error(std::string what, std::string_view file, int line, bool internal)
    : std::runtime_error(with_location(what, file, line)),
      message_(std::move(what)),
      internal_(internal) {}

std::string printable(std::string_view value, size_t max) {
  std::string out;
  for (const char ch : value) {
    if (out.size() >= max) return out + "...";
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f) {
      out += ch;
    } else {
      constexpr char kHex[] = "0123456789abcdef";
      out += {'\\', 'x', kHex[c >> 4], kHex[c & 15]};
    }
  }
  return out;
}

namespace detail {

void throw_error(std::string_view file, int line, std::string msg) {
  throw Error(std::move(msg), file, line);
}

void throw_internal(std::string_view file, int line, std::string_view cond, std::string msg) {
  std::string what = concat("internal error (a Mantissa bug, please report it): ", cond, " failed");
  if (!msg.empty()) what += concat(": ", msg);
  throw Error(std::move(what), file, line, /*internal=*/true);
}

}  // namespace detail
}  // namespace mantissa
