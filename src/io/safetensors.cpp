#include "mantissa/io/safetensors.h"

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

#include "io/atomic_file.h"
#include "mantissa/core/error.h"

namespace mantissa {

// The format stores little-endian bytes and so does memory here; a big-endian port would swap
// each element on the way in and out.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

namespace {

using Json = nlohmann::ordered_json;  // keeps the header's order: the order tensors come back in

constexpr char kMetadataKey[] = "__metadata__";
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

// A file descriptor closed on every path out.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

// ---- reading -----------------------------------------------------------------------------------

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

struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin;
  uint64_t end;
};

uint64_t unsigned_field(const Json& v, const std::string& what, const std::string& where) {
  MT_CHECK(v.is_number_unsigned(), where, ": ", what, " must be a non-negative integer, not ",
           v.dump());
  return v.get<uint64_t>();
}

Entry parse_entry(const std::string& name, const Json& info, const std::string& where) {
  const std::string tensor = where + ": tensor '" + name + "'";
  MT_CHECK(info.is_object(), tensor, " is described by ", info.dump(),
           ", not an object with dtype, shape and data_offsets");
  Entry e;
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

void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [k, v] : metadata) {
      meta[k] = v;
    }
    header[kMetadataKey] = std::move(meta);
  }

  std::set<std::string_view> names;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    MT_CHECK(name != kMetadataKey, "saving safetensors file '", path, "': \"", kMetadataKey,
             "\" is reserved for the metadata and cannot name a tensor");
    MT_CHECK(names.insert(name).second, "saving safetensors file '", path,
             "': two tensors are named '", name, "'");
    MT_CHECK(t.defined(), "saving safetensors file '", path, "': tensor '", name, "' is undefined");
    const uint64_t nbytes = t.nbytes();
    header[name] = {{"dtype", std::string(dtype_info(t.dtype()).safetensors)},
                    {"shape", t.shape().vec()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }

  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    MT_CHECK(false, "saving safetensors file '", path,
             "': tensor names and metadata must be valid UTF-8 (", e.what(), ")");
  }
  // The data starts 8-byte aligned, as the reference implementation writes it.
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) {
    len[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));
  }

  // Written whole or not at all (io/atomic_file.h): a failure leaves an earlier file intact.
  io::AtomicFile out(path, "saving safetensors file '" + path + "'");
  out.write(len, sizeof(len));
  out.write(text.data(), text.size());
  for (const auto& [name, t] : tensors) {
    // One contiguous host copy at a time (none for a contiguous CPU tensor), not all at once.
    const Tensor c = t.detach().to(Device::cpu()).contiguous();
    out.write(c.data_ptr(), c.nbytes());
  }
  out.commit();
}

SafetensorsFile load_safetensors(const std::string& path) {
  const std::string where = "safetensors file '" + path + "'";
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) {
    const int e = errno;
    MT_CHECK(false, "cannot open ", where, ": ", errno_text(e));
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    const int e = errno;
    MT_CHECK(false, "cannot stat ", where, ": ", errno_text(e));
  }
  MT_CHECK(S_ISREG(st.st_mode), where, " is not a regular file");
  const uint64_t size = uint64_t(st.st_size);
  MT_CHECK(size >= 8, where, " is ", size,
           " bytes long, shorter than the 8-byte header length: truncated or not a safetensors "
           "file");

  unsigned char len[8];
  read_exact(fd.get(), 0, len, 8, path);
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i)
    n |= uint64_t(len[i]) << (8 * i);
  MT_CHECK(n <= size - 8, where, ": header length ", n, " runs past the end of the file (", size,
           " bytes): truncated or not a safetensors file");
  MT_CHECK(n <= kMaxHeaderBytes, where, ": header length ", n, " exceeds the ", kMaxHeaderBytes,
           "-byte limit: not a safetensors file");
  MT_CHECK(n >= 2, where, ": header length ", n, " is too short for a JSON object");

  std::string text(size_t(n), '\0');
  read_exact(fd.get(), 8, text.data(), n, path);
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

  SafetensorsFile file;
  std::vector<Entry> entries;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      MT_CHECK(value.is_object(), where, ": \"", kMetadataKey, "\" must be an object of strings");
      for (const auto& [k, v] : value.items()) {
        MT_CHECK(v.is_string(), where, ": metadata '", k, "' is ", v.dump(), ", not a string");
        file.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(key, value, where));
  }

  // The tensors must tile the data exactly: no byte outside the file, shared or unclaimed.
  const uint64_t data_start = 8 + n;
  const uint64_t data_size = size - data_start;
  for (const Entry& e : entries) {
    MT_CHECK(e.end <= data_size, where, ": tensor '", e.name, "' needs bytes [", e.begin, ", ",
             e.end, ") of the data, outside the ", data_size,
             " bytes after the header: the data is truncated or the offsets are wrong");
  }
  std::vector<const Entry*> order;
  for (const Entry& e : entries)
    order.push_back(&e);
  std::sort(order.begin(), order.end(), [](const Entry* a, const Entry* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t covered = 0;
  const Entry* prev = nullptr;
  for (const Entry* e : order) {
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

  file.tensors.reserve(entries.size());
  for (const Entry& e : entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    read_exact(fd.get(), data_start + e.begin, t.data_ptr(), e.end - e.begin, path);
    if (e.dtype == DType::Bool) {
      // Any other byte would be an invalid bool object in C++.
      const auto* b = static_cast<const unsigned char*>(t.data_ptr());
      for (uint64_t i = 0; i < e.end - e.begin; ++i) {
        MT_CHECK(b[i] <= 1, where, ": BOOL tensor '", e.name, "' holds ", int(b[i]), " at element ",
                 i, "; booleans are 0 or 1");
      }
    }
    file.tensors.emplace_back(e.name, std::move(t));
  }
  return file;
}

const Tensor* SafetensorsFile::find(std::string_view name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return &t;
  }
  return nullptr;
}

const Tensor& SafetensorsFile::at(std::string_view name) const {
  const Tensor* t = find(name);
  if (t == nullptr) {
    std::string names;
    for (const auto& [n, unused] : tensors)
      names += (names.empty() ? "'" : ", '") + n + "'";
    MT_CHECK(false, "no tensor named '", name, "' in this safetensors file; it has ",
             names.empty() ? "none" : names);
  }
  return *t;
}

}  // namespace mantissa
