#include "mantissa/io/safetensors.h"

#include <cstdint>
#include <set>

#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/safetensors_reader.h"
#include "mantissa/core/error.h"

namespace mantissa {

namespace {

using Json = nlohmann::ordered_json;  // keeps the order given: the order tensors come back in
constexpr const char* kMetadataKey = io::kSafetensorsMetadataKey;

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
  const io::SafetensorsReader reader(path);
  SafetensorsFile file;
  file.metadata = reader.metadata();
  file.tensors.reserve(reader.entries().size());
  for (const io::SafetensorsEntry& e : reader.entries()) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    reader.read(e, t.data_ptr());
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
