#include "io/safetensors_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <system_error>

#include <nlohmann/json.hpp>

#include "mantissa/core/error.h"

namespace mantissa::io {

// The format stores little-endian bytes and so does memory here; a big-endian port would swap
// each element on the way in and out.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

namespace {

using Json = nlohmann::ordered_json;  // keeps the header's order: the order tensors come back in

constexpr const char* kMetadataKey = kSafetensorsMetadataKey;
// As the reference implementation: a larger header is a corrupted length, not a real file.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

std::string errno_text(int e) {
  return std::system_category().message(e);
}

std::optional<DType> dtype_from_tag(std::string_view tag) {
  for (const DTypeInfo& info : kDTypeTable) {
    if (info.safetensors == tag) return info.dtype;
  }
  return std::nullopt;
}

std::string known_tags() {
  std::string s;
  for (const DTypeInfo& info : kDTypeTable) {
    if (!s.empty()) s += ", ";
    s += info.safetensors;
  }
  return s;
}

void read_exact(int fd, uint64_t offset, void* dst, uint64_t n, const std::string& path) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    const size_t chunk = size_t(std::min<uint64_t>(n, uint64_t(1) << 30));
    const ssize_t r = ::pread(fd, p, chunk, off_t(offset));
    if (r < 0 && errno == EINTR) continue;
    const int e = errno;
    MT_CHECK(r >= 0, "safetensors file '", path, "': read failed at byte ", offset, ": ",
             errno_text(e));
    MT_CHECK(r > 0, "safetensors file '", path, "': unexpected end of file at byte ", offset,
             " (was it truncated while being read?)");
    p += r;
    n -= uint64_t(r);
    offset += uint64_t(r);
  }
}

uint64_t unsigned_field(const Json& v, const std::string& what, const std::string& where) {
  MT_CHECK(v.is_number_unsigned(), where, ": ", what, " must be a non-negative integer, not ",
           v.dump());
  return v.get<uint64_t>();
}

SafetensorsEntry parse_entry(const std::string& name, const Json& info, const std::string& where) {
  const std::string tensor = where + ": tensor '" + name + "'";
  MT_CHECK(info.is_object(), tensor, " is described by ", info.dump(),
           ", not an object with dtype, shape and data_offsets");
  SafetensorsEntry e;
  e.name = name;

  const auto dt = info.find("dtype");
  MT_CHECK(dt != info.end() && dt->is_string(), tensor, " has no \"dtype\" string");
  const std::string tag = dt->get<std::string>();
  const std::optional<DType> dtype = dtype_from_tag(tag);
  MT_CHECK(dtype.has_value(), tensor, " has unknown dtype '", tag, "'; Mantissa reads ",
           known_tags());
  e.dtype = *dtype;

  const auto sh = info.find("shape");
  MT_CHECK(sh != info.end() && sh->is_array(), tensor, " has no \"shape\" array");
  MT_CHECK(sh->size() <= size_t(kMaxDims), tensor, " has ", sh->size(),
           " dimensions; Mantissa tensors have at most ", kMaxDims);
  // The product of the nonzero dims must fit int64 (strides are computed from it).
  uint64_t numel = 1, nonzero = 1;
  constexpr uint64_t kLimit = uint64_t(std::numeric_limits<int64_t>::max());
  for (const Json& d : *sh) {
    const uint64_t n = unsigned_field(d, "each shape dimension", tensor);
    MT_CHECK(n == 0 || nonzero <= kLimit / n, tensor, " has an impossibly large shape ",
             sh->dump());
    if (n != 0) nonzero *= n;
    numel *= n;
    e.shape.push_back(int64_t(n));
  }
  MT_CHECK(numel <= kLimit / dtype_size(e.dtype), tensor, " has an impossibly large shape ",
           sh->dump());
  const uint64_t nbytes = numel * dtype_size(e.dtype);

  const auto off = info.find("data_offsets");
  MT_CHECK(off != info.end() && off->is_array() && off->size() == 2, tensor,
           " has no \"data_offsets\" pair [begin, end]");
  e.begin = unsigned_field((*off)[0], "data_offsets", tensor);
  e.end = unsigned_field((*off)[1], "data_offsets", tensor);
  MT_CHECK(e.begin <= e.end, tensor, " has reversed data_offsets [", e.begin, ", ", e.end, "]");
  MT_CHECK(e.end - e.begin == nbytes, tensor, ": shape ", e.shape.str(), " of ", tag, " needs ",
           nbytes, " bytes but data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin);
  return e;
}

}  // namespace

SafetensorsReader::SafetensorsReader(const std::string& path)
    : path_(path), where_("safetensors file '" + path + "'") {
  const std::string& where = where_;
  file_.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (file_.fd < 0) {
    const int e = errno;
    MT_CHECK(false, "cannot open ", where, ": ", errno_text(e));
  }
  struct stat st {};
  if (::fstat(file_.fd, &st) != 0) {
    const int e = errno;
    MT_CHECK(false, "cannot stat ", where, ": ", errno_text(e));
  }
  MT_CHECK(S_ISREG(st.st_mode), where, " is not a regular file");
  const uint64_t size = uint64_t(st.st_size);
  MT_CHECK(size >= 8, where, " is ", size,
           " bytes long, shorter than the 8-byte header length: truncated or not a safetensors "
           "file");

  unsigned char len[8];
  read_exact(file_.fd, 0, len, 8, path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= uint64_t(len[i]) << (8 * i);
  MT_CHECK(n <= size - 8, where, ": header length ", n, " runs past the end of the file (", size,
           " bytes): truncated or not a safetensors file");
  MT_CHECK(n <= kMaxHeaderBytes, where, ": header length ", n, " exceeds the ", kMaxHeaderBytes,
           "-byte limit: not a safetensors file");
  MT_CHECK(n >= 2, where, ": header length ", n, " is too short for a JSON object");

  std::string text(size_t(n), '\0');
  read_exact(file_.fd, 8, text.data(), n, path);
  MT_CHECK(text[0] == '{', where, ": the header does not start with '{': not a safetensors file");

  // Duplicate names would silently shadow each other in the parsed object: catch them here.
  std::set<std::string> keys;
  std::string duplicate;
  const Json::parser_callback_t on_key = [&](int depth, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::key && depth == 1 && parsed.is_string() &&
        !keys.insert(parsed.get<std::string>()).second && duplicate.empty()) {
      duplicate = parsed.get<std::string>();
    }
    return true;
  };
  Json header;
  try {
    header = Json::parse(text, on_key);
  } catch (const nlohmann::json::exception& e) {
    MT_CHECK(false, where, ": the header is not valid JSON: ", e.what());
  }
  MT_CHECK(header.is_object(), where, ": the header is not a JSON object");
  MT_CHECK(duplicate.empty(), where, ": the header names '", duplicate, "' twice");

  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      MT_CHECK(value.is_object(), where, ": \"", kMetadataKey, "\" must be an object of strings");
      for (const auto& [k, v] : value.items()) {
        MT_CHECK(v.is_string(), where, ": metadata '", k, "' is ", v.dump(), ", not a string");
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    entries_.push_back(parse_entry(key, value, where));
  }

  // The tensors must tile the data exactly: no byte outside the file, shared or unclaimed.
  data_start_ = 8 + n;
  const uint64_t data_size = size - data_start_;
  for (const SafetensorsEntry& e : entries_) {
    MT_CHECK(e.end <= data_size, where, ": tensor '", e.name, "' needs bytes [", e.begin, ", ",
             e.end, ") of the data, outside the ", data_size,
             " bytes after the header: the data is truncated or the offsets are wrong");
  }
  std::vector<const SafetensorsEntry*> order;
  for (const SafetensorsEntry& e : entries_)
    order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const SafetensorsEntry* a, const SafetensorsEntry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const SafetensorsEntry* prev = nullptr;
  for (const SafetensorsEntry* e : order) {
    MT_CHECK(e->begin >= covered, where, ": tensors '", prev ? prev->name : "", "' and '", e->name,
             "' overlap (data_offsets [", prev ? prev->begin : 0, ", ", covered, ") and [",
             e->begin, ", ", e->end, "))");
    MT_CHECK(e->begin == covered, where, ": bytes [", covered, ", ", e->begin,
             ") of the data belong to no tensor (before '", e->name, "')");
    covered = e->end;
    prev = e;
  }
  MT_CHECK(covered == data_size, where, ": ", data_size - covered,
           " bytes after the last tensor's data belong to no tensor");
}

SafetensorsReader::File::~File() {
  if (fd >= 0) ::close(fd);
}

void SafetensorsReader::read(const SafetensorsEntry& e, void* dst) const {
  read_exact(file_.fd, data_start_ + e.begin, dst, e.end - e.begin, path_);
  if (e.dtype == DType::Bool) {
    // Any other byte would be an invalid bool object in C++.
    const auto* b = static_cast<const unsigned char*>(dst);
    for (uint64_t i = 0; i < e.end - e.begin; ++i) {
      MT_CHECK(b[i] <= 1, where_, ": BOOL tensor '", e.name, "' holds ", int(b[i]), " at element ",
               i, "; booleans are 0 or 1");
    }
  }
}

}  // namespace mantissa::io
