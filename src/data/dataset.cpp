// The data interface's shared pieces: batch field access, the default collate and the single
// allocation a batch's fields live in.
#include "mantissa/data/dataset.h"

#include <cstring>
#include <string>

#include "data/batch_block.h"
#include "mantissa/core/error.h"

namespace mantissa::data {
namespace {

// "0: x f32 (4, 1, 28, 28) cpu, 1: y i64 (4) cpu" for messages about a batch's fields.
std::string describe_fields(const Batch& b) {
  std::string s;
  for (size_t i = 0; i < b.fields.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(i) + ": ";
    if (b.names && i < b.names->size()) s += (*b.names)[i] + " ";
    s += b.fields[i].defined() ? b.fields[i].describe() : std::string("undefined");
  }
  return s.empty() ? std::string("no fields") : s;
}

size_t field_position(const Batch& b, std::string_view name) {
  if (b.names) {
    for (size_t i = 0; i < b.names->size() && i < b.fields.size(); ++i) {
      if ((*b.names)[i] == name) return i;
    }
  }
  MT_CHECK(false, "this batch has no field named '", name, "' (its fields: ", describe_fields(b),
           "); name the fields in Dataset::field_names(), or index the batch by position");
  return 0;
}

// "field 1 ('y')" or "field 1".
std::string field_label(size_t f, const FieldNames& names) {
  std::string s = "field " + std::to_string(f);
  if (f < names.size()) s += " ('" + names[f] + "')";
  return s;
}

// "sample 3 of the batch (dataset index 517)".
std::string sample_label(size_t i, std::span<const int64_t> indices) {
  std::string s = "sample " + std::to_string(i) + " of the batch";
  if (i < indices.size()) s += " (dataset index " + std::to_string(indices[i]) + ")";
  return s;
}

}  // namespace

Tensor& Batch::operator[](size_t i) {
  MT_CHECK(i < fields.size(), "field ", i, " of a batch of ", fields.size(), " fields (",
           describe_fields(*this), ")");
  return fields[i];
}
const Tensor& Batch::operator[](size_t i) const {
  return const_cast<Batch&>(*this)[i];
}
Tensor& Batch::operator[](std::string_view name) {
  return fields[field_position(*this, name)];
}
const Tensor& Batch::operator[](std::string_view name) const {
  return fields[field_position(*this, name)];
}

int64_t Batch::batch_size() const {
  MT_CHECK(!fields.empty() && fields[0].defined() && fields[0].dim() >= 1,
           "this batch has no leading batch dimension (its fields: ", describe_fields(*this), ")");
  return fields[0].size(0);
}

std::vector<Tensor> allocate_batch(const std::vector<FieldSpec>& fields) {
  std::vector<size_t> at(fields.size());
  size_t bytes = 0;
  for (size_t f = 0; f < fields.size(); ++f) {
    for (const int64_t d : fields[f].shape)
      MT_CHECK(d >= 0, "allocate_batch: field ", f, " has a negative dimension in its shape ",
               fields[f].shape.str());
    bytes = (bytes + kAllocAlignment - 1) / kAllocAlignment * kAllocAlignment;
    at[f] = bytes;
    bytes += size_t(fields[f].shape.numel()) * dtype_size(fields[f].dtype);
  }
  // The place where every batch's bytes come from: one block, so that pinning a batch (for
  // asynchronous device copies) is one copy and moving it to a device is one transfer.
  auto block = std::make_shared<Storage>(bytes, Device::cpu());
  std::vector<Tensor> out;
  out.reserve(fields.size());
  for (size_t f = 0; f < fields.size(); ++f) {
    const size_t esize = dtype_size(fields[f].dtype);
    MT_ASSERT(at[f] % esize == 0, "a field offset must be a whole number of elements");
    out.push_back(tensor_on(block, fields[f].shape, int64_t(at[f] / esize), fields[f].dtype));
  }
  return out;
}

std::vector<Tensor> stack_samples(const std::vector<Sample>& samples, const FieldNames& names,
                                  std::span<const int64_t> indices) {
  MT_CHECK(!samples.empty(), "collate: a batch needs at least one sample");
  const Sample& first = samples[0];
  MT_CHECK(!first.empty(), "collate: ", sample_label(0, indices),
           " has no fields; Dataset::get must return at least one tensor");
  const auto b = int64_t(samples.size());
  std::vector<FieldSpec> specs;
  for (size_t f = 0; f < first.size(); ++f) {
    const Tensor& t = first[f];
    MT_CHECK(t.defined(), "collate: ", field_label(f, names), " of ", sample_label(0, indices),
             " is an undefined tensor");
    MT_CHECK(t.device().is_cpu(), "collate: ", field_label(f, names), " of ",
             sample_label(0, indices), " is on ", t.device().str(),
             "; a dataset's samples belong in host memory (batches reach the GPU through "
             "DevicePrefetcher)");
    Shape shape;
    shape.push_back(b);
    for (int d = 0; d < t.dim(); ++d)
      shape.push_back(t.size(d));
    specs.push_back({shape, t.dtype()});
  }
  for (size_t i = 1; i < samples.size(); ++i) {
    const Sample& s = samples[i];
    MT_CHECK(s.size() == first.size(), "collate: ", sample_label(i, indices), " has ", s.size(),
             " fields but ", sample_label(0, indices), " has ", first.size(),
             "; every sample of a dataset must have the same fields");
    for (size_t f = 0; f < s.size(); ++f) {
      const Tensor& t = s[f];
      const Tensor& t0 = first[f];
      MT_CHECK(
          t.defined() && t.shape() == t0.shape() && t.dtype() == t0.dtype() && t.device().is_cpu(),
          "collate: ", field_label(f, names), " of ", sample_label(i, indices), " is ",
          t.defined() ? t.describe() : std::string("undefined"), " but in ",
          sample_label(0, indices), " it is ", t0.describe(),
          "; the default collate stacks samples of equal shapes and dtypes: make the "
          "dataset's samples equal (resize, crop or pad them), or pass "
          "LoaderOptions::collate to batch them your way (e.g. padding to the longest)");
    }
  }
  std::vector<Tensor> out = allocate_batch(specs);
  for (size_t f = 0; f < out.size(); ++f) {
    auto* dst = static_cast<uint8_t*>(out[f].data_ptr());
    const size_t bytes = first[f].nbytes();
    for (size_t i = 0; i < samples.size(); ++i) {
      const Tensor src = samples[i][f].contiguous();
      std::memcpy(dst + i * bytes, src.data_ptr(), bytes);
    }
  }
  return out;
}

std::vector<Tensor> Dataset::get_batch(std::span<const int64_t> indices) const {
  std::vector<Sample> samples;
  samples.reserve(indices.size());
  for (const int64_t i : indices)
    samples.push_back(get(i));
  return stack_samples(samples, field_names(), indices);
}

std::optional<DeviceSplit> Dataset::split_for_device(Device) const {
  return std::nullopt;
}

}  // namespace mantissa::data
