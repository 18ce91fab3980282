#include "mantissa/train/checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include <nlohmann/json.hpp>

#include "mantissa/core/error.h"
#include "mantissa/core/warning.h"
#include "mantissa/io/safetensors.h"

namespace mantissa::train {
namespace {

constexpr const char* kFormatKey = "mantissa.checkpoint";
constexpr const char* kFormatVersion = "1";
// A CRC-32 (zlib's, IEEE 802.3) of every tensor's bytes as written, by name: what load checks, so
// that bytes changed inside the tensor data after the file was written (a flipped bit, a bad
// copy) are an error naming the tensor instead of a silently different model.
constexpr const char* kChecksumKey = "mantissa.crc32";

std::string crc32_hex(const void* data, size_t n, uLong crc = crc32(0L, Z_NULL, 0)) {
  const auto* p = static_cast<const Bytef*>(data);
  // zlib takes a uInt length: large buffers in pieces.
  for (size_t done = 0; done < n;) {
    const auto len = uInt(std::min<size_t>(n - done, size_t(1) << 30));
    crc = crc32(crc, p + done, len);
    done += len;
  }
  char text[9];
  std::snprintf(text, sizeof text, "%08lx", crc);
  return text;
}

std::string crc32_of(const Tensor& t) {
  const Tensor c = t.device().is_cpu() && t.is_contiguous() ? t : t.to(Device::cpu()).contiguous();
  return crc32_hex(c.data_ptr(), c.nbytes());
}

// A CRC-32 of the metadata Mantissa wrote (the format, the configuration, the training state with
// the generator's, the tensors' checksums): each "mantissa." key and its value, in key order, so
// that an edited learning rate or step is an error instead of a silently different run.
constexpr const char* kMetaChecksumKey = "mantissa.meta_crc32";

std::string meta_checksum(const std::map<std::string, std::string>& metadata) {
  std::string text;
  for (const auto& [key, value] : metadata) {
    if (!key.starts_with("mantissa.") || key == kMetaChecksumKey) continue;
    text += key;
    text += '\0';
    text += value;
    text += '\0';
  }
  return crc32_hex(text.data(), text.size());
}

void verify_meta_checksum(const std::map<std::string, std::string>& metadata,
                          const std::string& path) {
  const auto it = metadata.find(kMetaChecksumKey);
  if (it == metadata.end()) {
    warn("checkpoint:no-meta-checksum",
         "checkpoint '" + path +
             "' has no checksum of its configuration and training state (written before "
             "Mantissa stored one): they are loaded unverified");
    return;
  }
  MT_CHECK(it->second == meta_checksum(metadata), "checkpoint '", path,
           "': its configuration or training state was changed after it was written (they do "
           "not match the checksum written with them); use another copy or an earlier "
           "checkpoint, and change settings with the options of `mantissa train --resume`");
}

std::string checksums_json(const NamedTensors& tensors) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [name, t] : tensors)
    j[name] = crc32_of(t);
  return j.dump();
}

void verify_checksums(const SafetensorsFile& file, const std::string& path) {
  const auto it = file.metadata.find(kChecksumKey);
  if (it == file.metadata.end()) {
    warn("checkpoint:no-checksums",
         "checkpoint '" + path +
             "' has no checksums (written before Mantissa stored them): its tensors are loaded "
             "unverified");
    return;
  }
  nlohmann::json sums;
  try {
    sums = nlohmann::json::parse(it->second);
  } catch (const std::exception& e) {
    MT_CHECK(false, "checkpoint '", path, "': its checksums are damaged (", e.what(), ")");
  }
  MT_CHECK(sums.is_object() && sums.size() == file.tensors.size(), "checkpoint '", path,
           "': its checksums list ", sums.is_object() ? sums.size() : 0,
           " tensors but the file has ", file.tensors.size(),
           "; the file was changed after it was written");
  for (const auto& [name, t] : file.tensors) {
    const auto want = sums.find(name);
    MT_CHECK(want != sums.end() && want->is_string(), "checkpoint '", path, "': tensor '", name,
             "' has no checksum; the file was changed after it was written");
    MT_CHECK(want->get<std::string>() == crc32_of(t), "checkpoint '", path, "': tensor '", name,
             "' is damaged: its bytes do not match the checksum written with it (the file was "
             "changed after it was written); use another copy or an earlier checkpoint");
  }
}

std::string state_json(const TrainState& s) {
  nlohmann::ordered_json j;
  j["step"] = s.step;
  j["epoch"] = s.epoch;
  j["batch"] = s.batch;
  // 64-bit values as strings: JSON readers in other languages keep only 53 bits of a number.
  j["generator_seed"] = std::to_string(s.generator.seed);
  j["generator_offset"] = std::to_string(s.generator.offset);
  j["train_seconds"] = s.train_seconds;
  j["lr_scale"] = s.lr_scale;
  j["tokenizer_fingerprint"] = std::to_string(s.tokenizer_fingerprint);
  return j.dump();
}

TrainState parse_state(const std::string& text, const std::string& path) {
  try {
    const auto j = nlohmann::json::parse(text);
    TrainState s;
    s.step = j.at("step").get<int64_t>();
    s.epoch = j.at("epoch").get<int64_t>();
    s.batch = j.at("batch").get<int64_t>();
    s.generator.seed = std::stoull(j.at("generator_seed").get<std::string>());
    s.generator.offset = std::stoull(j.at("generator_offset").get<std::string>());
    s.train_seconds = j.value("train_seconds", 0.0);
    s.lr_scale = j.value("lr_scale", 1.0);  // checkpoints before rollbacks existed: 1
    s.tokenizer_fingerprint = std::stoull(j.value("tokenizer_fingerprint", std::string("0")));
    MT_CHECK(std::isfinite(s.lr_scale) && s.lr_scale > 0, "lr_scale ", s.lr_scale,
             " is not a positive factor");
    return s;
  } catch (const std::exception& e) {
    MT_CHECK(false, "checkpoint '", path, "': the training state in its metadata is damaged (",
             e.what(), ")");
  }
  return {};
}

}  // namespace

void save_checkpoint(const std::string& path, const TrainConfig& config, const TrainState& state,
                     const NamedTensors& model, const NamedTensors& optimizer,
                     const NamedTensors& scaler) {
  NamedTensors all = model;
  for (const auto& [name, t] : optimizer)
    all.emplace_back(kOptimizerPrefix + name, t);
  for (const auto& [name, t] : scaler)
    all.emplace_back(kScalerPrefix + name, t);
  std::map<std::string, std::string> metadata = {
      {"format", "pt"},  // what safetensors.torch expects of a PyTorch-loadable file
      {kFormatKey, kFormatVersion},
      {"mantissa.config", config.to_json()},
      {"mantissa.state", state_json(state)},
      {kChecksumKey, checksums_json(all)},
  };
  metadata[kMetaChecksumKey] = meta_checksum(metadata);
  save_safetensors(path, all, metadata);
}

Checkpoint load_checkpoint(const std::string& path) {
  SafetensorsFile file = load_safetensors(path);
  const auto format = file.metadata.find(kFormatKey);
  MT_CHECK(format != file.metadata.end(), "'", path,
           "' is a safetensors file but not a Mantissa checkpoint (it has no training state); "
           "give a file written by 'mantissa train --checkpoint'");
  MT_CHECK(format->second == kFormatVersion, "checkpoint '", path, "' has format version ",
           format->second, "; this Mantissa reads version ", kFormatVersion);
  Checkpoint c;
  c.metadata = file.metadata;
  const auto config = file.metadata.find("mantissa.config");
  const auto state = file.metadata.find("mantissa.state");
  MT_CHECK(config != file.metadata.end() && state != file.metadata.end(), "checkpoint '", path,
           "' lacks its configuration or training state");
  verify_meta_checksum(file.metadata, path);
  try {
    c.config = TrainConfig::from_json(config->second);
  } catch (const Error& e) {
    MT_CHECK(false, "checkpoint '", path, "': ", e.message());
  }
  c.state = parse_state(state->second, path);
  verify_checksums(file, path);
  const std::string prefix = kOptimizerPrefix, scaler_prefix = kScalerPrefix;
  for (auto& [name, t] : file.tensors) {
    if (name.rfind(prefix, 0) == 0) {
      c.optimizer.emplace_back(name.substr(prefix.size()), t);
    } else if (name.rfind(scaler_prefix, 0) == 0) {
      c.scaler.emplace_back(name.substr(scaler_prefix.size()), t);
    } else {
      c.model.emplace_back(name, t);
    }
  }
  return c;
}

}  // namespace mantissa::train
