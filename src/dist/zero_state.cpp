// ZeRO-1 checkpoints: every rank's share of the optimizer state packed into bytes and gathered on
// one rank (src/dist/zero_state.h), where DistributedDataParallel::gather_optimizer_state
// assembles the unsharded optimizer's state dict.
#include <algorithm>
#include <charconv>
#include <cstring>
#include <string_view>

#include "dist/zero_state.h"
#include "mantissa/core/error.h"

namespace mantissa::dist {
namespace {

// Entry: u32 name length, the name, u8 dtype, u8 rank, i64 dims, the elements' bytes.
template <typename T>
void put(std::vector<char>& out, T v) {
  const auto* p = reinterpret_cast<const char*>(&v);
  out.insert(out.end(), p, p + sizeof v);
}

std::vector<char> pack(const NamedTensors& dict) {
  std::vector<char> out;
  for (const auto& [name, t] : dict) {
    const Tensor c = t.to(Device::cpu()).contiguous();
    put(out, uint32_t(name.size()));
    out.insert(out.end(), name.begin(), name.end());
    put(out, uint8_t(c.dtype()));
    put(out, uint8_t(c.dim()));
    for (int d = 0; d < c.dim(); ++d)
      put(out, c.size(d));
    const auto* data = static_cast<const char*>(c.data_ptr());
    out.insert(out.end(), data, data + c.nbytes());
  }
  return out;
}

class Reader {
 public:
  Reader(const char* p, size_t n) : p_(p), end_(p + n) {}
  bool done() const { return p_ == end_; }
  template <typename T>
  T get() {
    T v;
    std::memcpy(&v, take(sizeof v), sizeof v);
    return v;
  }
  const char* take(size_t n) {
    MT_ASSERT(size_t(end_ - p_) >= n, "gather_state_dict: a packed state ends early");
    const char* at = p_;
    p_ += n;
    return at;
  }

 private:
  const char* p_;
  const char* end_;
};

void unpack(const char* data, size_t n, NamedTensors& out) {
  Reader r(data, n);
  while (!r.done()) {
    const auto len = r.get<uint32_t>();
    std::string name(r.take(len), len);
    const auto dtype = DType(r.get<uint8_t>());
    const size_t ndim = r.get<uint8_t>();
    std::vector<int64_t> dims(ndim);
    for (int64_t& d : dims)
      d = r.get<int64_t>();
    Tensor t = Tensor::empty(Shape(dims), dtype);
    std::memcpy(t.data_ptr(), r.take(t.nbytes()), t.nbytes());
    out.emplace_back(std::move(name), std::move(t));
  }
}

}  // namespace

std::pair<int, size_t> state_key_place(std::string_view key) {
  auto index = [&](size_t begin) {
    size_t i = 0;
    const size_t end = std::min(key.find('.', begin), key.size());
    std::from_chars(key.data() + begin, key.data() + end, i);
    return i;
  };
  if (key.starts_with("state.")) return {1, index(6)};
  if (key.starts_with("master.")) return {2, index(7)};
  if (key.starts_with("compensation.")) return {3, index(13)};
  return {0, 0};
}

std::vector<NamedTensors> gather_named_tensors(const NamedTensors& mine, Communicator& comm,
                                               int root, Device device) {
  const int world = comm.world_size();
  const std::vector<char> bytes = pack(mine);
  // Every rank's size, then the bytes on root.
  std::vector<int64_t> mine_size(size_t(world), 0);
  mine_size[size_t(comm.rank())] = int64_t(bytes.size());
  Tensor sizes = Tensor::from_vector(mine_size, {world}).to(device);
  comm.all_reduce(sizes, ReduceOp::Sum);
  const std::vector<int64_t> counts = sizes.to(Device::cpu()).to_vector<int64_t>();
  Tensor packed = Tensor::empty({int64_t(bytes.size())}, DType::U8);
  std::memcpy(packed.data_ptr(), bytes.data(), bytes.size());
  packed = packed.to(device);
  Tensor all;
  int64_t total = 0;
  for (const int64_t c : counts)
    total += c;
  if (comm.rank() == root) all = Tensor::empty({total}, DType::U8, device);
  comm.gather(packed, all, counts, root);
  if (comm.rank() != root) return {};
  all = all.to(Device::cpu());
  std::vector<NamedTensors> parts{size_t(world)};
  const auto* base = static_cast<const char*>(all.data_ptr());
  for (int r = 0; r < world; ++r) {
    unpack(base, size_t(counts[size_t(r)]), parts[size_t(r)]);
    base += counts[size_t(r)];
  }
  return parts;
}

}  // namespace mantissa::dist
