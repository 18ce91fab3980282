// Optimizer state in low precision (optim/state_format.h) and Kahan-compensated narrow weights:
// the dynamic maps, the block quantizers and five AdamW steps in every format bit for bit against
// tools/reference/optim_state_golden.py (committed: tests/data/golden/optim_state.safetensors);
// resume from a state dict, sharded optimizers and their blocks, the bytes each format keeps,
// the errors a user can meet; and the compensation's effect on updates below half an ulp.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "backend/state_math.h"
#include "mantissa/autograd/grad_mode.h"
#include "mantissa/core/error.h"
#include "mantissa/io/safetensors.h"
#include "mantissa/optim/optimizer.h"
#include "mantissa/tensor/ops.h"

namespace mantissa::optim {
namespace {

using backend::DynamicMap;

const SafetensorsFile& golden() {
  static const SafetensorsFile f =
      load_safetensors(std::string(MANTISSA_GOLDEN_DIR) + "/optim_state.safetensors");
  return f;
}

std::vector<uint32_t> bits_of(const Tensor& t) {
  std::vector<uint32_t> out;
  for (float v : t.to(Device::cpu()).to(DType::F32).to_vector<float>())
    out.push_back(std::bit_cast<uint32_t>(v));
  return out;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor c = t.to(Device::cpu()).contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return {p, p + c.nbytes()};
}

// The 2-norm of a - b, in double.
double distance(const Tensor& a, const Tensor& b) {
  const std::vector<float> x = a.to(DType::F32).to_vector<float>();
  const std::vector<float> y = b.to(DType::F32).to_vector<float>();
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i)
    s += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
  return std::sqrt(s);
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && bytes_of(a) == bytes_of(b);
}

TEST(StateFormat, DynamicMapsAreTheReferenceScripts) {
  for (const bool is_signed : {true, false}) {
    const DynamicMap& m = is_signed ? backend::kSignedDynamicMap : backend::kUnsignedDynamicMap;
    const std::vector<float> want =
        golden().at(is_signed ? "map.signed" : "map.unsigned").to_vector<float>();
    ASSERT_EQ(want.size(), 256u);
    for (size_t k = 0; k < 256; ++k)
      EXPECT_EQ(std::bit_cast<uint32_t>(m.value[k]), std::bit_cast<uint32_t>(want[k])) << k;
    EXPECT_EQ(m.value[is_signed ? 127 : 0], 0.0f);
    EXPECT_EQ(m.value[255], 1.0f);
    for (size_t k = 0; k < 255; ++k) {
      EXPECT_LT(m.value[k], m.value[k + 1]);
      EXPECT_TRUE(m.value[k] <= m.mid[k] && m.mid[k] <= m.value[k + 1]);
    }
    // The encoder's search (from its bin's start) is the count of decision points below q: at
    // every point, one float either side of it, every map value, and zeros of both signs.
    std::vector<float> qs{0.0f, -0.0f, 1.0f, -1.0f};
    for (size_t k = 0; k < 255; ++k) {
      for (const float d : {-1.0f, 1.0f})
        qs.push_back(std::nextafter(m.mid[k], d * 2.0f));
      qs.push_back(m.mid[k]);
      qs.push_back(m.value[k]);
    }
    int wrong = 0;
    for (const float q : qs) {
      if (is_signed ? std::abs(q) > 1.0f : (q < 0.0f || q > 1.0f)) continue;
      int below = 0;
      while (below < 255 && m.mid[below] < q)
        ++below;
      wrong += backend::state_q8_encode(q, 1.0f, m) != below;
    }
    EXPECT_EQ(wrong, 0);
  }
}

// The block quantizers on their own: 8-bit signed and unsigned (exact ties among the inputs go to
// the lower code), fp8, a block of zeros and a ragged last block.
TEST(StateFormat, QuantizersMatchTheReferenceBitForBit) {
  const std::vector<float> x = golden().at("quantize.x").to_vector<float>();
  const std::vector<float> absmax = golden().at("quantize.absmax").to_vector<float>();
  const std::vector<uint8_t> q8 = bytes_of(golden().at("quantize.q8_signed"));
  const std::vector<uint8_t> q8u = bytes_of(golden().at("quantize.q8_unsigned"));
  const std::vector<uint8_t> fp8 = bytes_of(golden().at("quantize.fp8"));
  constexpr int64_t kBlock = 256;
  const auto n = int64_t(x.size());
  int wrong = 0;
  for (int64_t b0 = 0, blk = 0; b0 < n; b0 += kBlock, ++blk) {
    const int64_t len = std::min(kBlock, n - b0);
    const float a = backend::block_absmax(x.data() + b0, len);
    EXPECT_EQ(std::bit_cast<uint32_t>(a), std::bit_cast<uint32_t>(absmax[size_t(blk)]));
    std::vector<float> ax(x.begin() + b0, x.begin() + b0 + len);
    for (float& v : ax)
      v = std::abs(v);
    const float aa = backend::block_absmax(ax.data(), len);
    for (int64_t i = b0; i < b0 + len; ++i) {
      const auto k = size_t(i);
      wrong += backend::state_q8_encode(x[k], a, backend::kSignedDynamicMap) != q8[k];
      wrong +=
          backend::state_q8_encode(ax[size_t(i - b0)], aa, backend::kUnsignedDynamicMap) != q8u[k];
      wrong += backend::state_fp8_encode(x[k], a) != fp8[k];
      // Decoding a code gives back a value within its block's grid step.
      const float back = backend::state_q8_decode(q8[k], a, backend::kSignedDynamicMap);
      EXPECT_LE(std::abs(back - x[k]), 0.04f * a) << i;
    }
  }
  EXPECT_EQ(wrong, 0);
}

struct FormatCase {
  const char* name;
  StateFormat m, v;
};

class StateFormats : public ::testing::TestWithParam<FormatCase> {};

// Five AdamW steps of a 5000-element parameter (block-scaled state, a ragged last block, a block
// whose gradient is zero) and a 300-element one (under min_numel: fp32 state), each format for
// the moments: weights and stored state equal the reference's bit for bit.
TEST_P(StateFormats, AdamWMatchesTheReferenceBitForBit) {
  const FormatCase c = GetParam();
  const SafetensorsFile& g = golden();
  std::vector<Tensor> params;
  for (const char* k : {"big", "small"}) {
    Tensor p = g.at(std::string("adamw.") + k + ".p0").clone();
    p.set_requires_grad(true);
    params.push_back(p);
  }
  AdamWOptions o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  o.exp_avg_format = c.m;
  o.exp_avg_sq_format = c.v;
  AdamW opt(params, o);
  for (int t = 0; t < 5; ++t) {
    for (size_t i = 0; i < 2; ++i) {
      const std::string k = i == 0 ? "big" : "small";
      params[i].set_grad(g.at("adamw." + k + ".grad." + std::to_string(t)).clone());
    }
    opt.step();
  }
  const NamedTensors state = opt.state_dict();
  std::map<std::string, Tensor> by_name(state.begin(), state.end());
  for (size_t i = 0; i < 2; ++i) {
    const std::string k = i == 0 ? "big" : "small";
    const std::string prefix = std::string("adamw.") + c.name + "." + k + ".";
    SCOPED_TRACE(prefix);
    EXPECT_EQ(bits_of(params[i]), bits_of(g.at(prefix + "p")));
    for (size_t s = 0; s < 2; ++s) {
      const std::string moment = s == 0 ? "exp_avg" : "exp_avg_sq";
      const std::string key = "state." + std::to_string(i) + "." + moment;
      ASSERT_TRUE(by_name.count(key)) << key;
      const Tensor& t = by_name.at(key);
      EXPECT_EQ(t.dtype(), opt.state_dtype(i, s));
      if (const Tensor* codes = g.find(prefix + moment + ".codes")) {
        EXPECT_EQ(bytes_of(t), bytes_of(*codes));
        ASSERT_TRUE(by_name.count(key + ".absmax"));
        EXPECT_EQ(bits_of(by_name.at(key + ".absmax")), bits_of(g.at(prefix + moment + ".absmax")));
      } else {
        EXPECT_EQ(bits_of(t), bits_of(g.at(prefix + moment + ".value")));
        EXPECT_FALSE(by_name.count(key + ".absmax"));
      }
    }
  }
  // The small parameter keeps fp32 state whatever the format (under min_numel).
  EXPECT_EQ(opt.state_format(1, 0),
            c.m == StateFormat::BF16 ? StateFormat::BF16 : StateFormat::F32);
}

INSTANTIATE_TEST_SUITE_P(Formats, StateFormats,
                         ::testing::Values(FormatCase{"fp32", StateFormat::F32, StateFormat::F32},
                                           FormatCase{"bf16", StateFormat::BF16, StateFormat::BF16},
                                           FormatCase{"fp8", StateFormat::FP8, StateFormat::FP8},
                                           FormatCase{"8bit", StateFormat::Q8, StateFormat::Q8},
                                           FormatCase{"8bit-bf16", StateFormat::Q8,
                                                      StateFormat::BF16}),
                         [](const auto& test) {
                           std::string s = test.param.name;
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return "s_" + s;
                         });

// ---- resume, sharding, bytes, errors -----------------------------------------------------------

Tensor grad_at(int t, int64_t n, DType dtype) {
  return Tensor::normal({n}, 0.0, 0.1 * (1 + t % 3), 500 + uint64_t(t), dtype);
}

std::vector<Tensor> make_params(DType dtype) {
  std::vector<Tensor> out;
  for (const int64_t n : {int64_t(6000), int64_t(4096), int64_t(100)}) {
    Tensor p = Tensor::normal({n}, 0.0, 1.0, uint64_t(n), DType::F32).to(dtype);
    p.set_requires_grad(true);
    out.push_back(p);
  }
  return out;
}

std::unique_ptr<Optimizer> make(const std::string& kind, std::vector<Tensor> params,
                                StateFormat f) {
  if (kind == "sgd") {
    SGDOptions o;
    o.lr = 0.05;
    o.momentum = 0.9;
    o.momentum_format = f;
    return std::make_unique<SGD>(std::move(params), o);
  }
  AdamWOptions o;
  o.lr = 3e-3;
  o.exp_avg_format = o.exp_avg_sq_format = f;
  return std::make_unique<AdamW>(std::move(params), o);
}

void steps(Optimizer& opt, std::vector<Tensor>& params, int from, int to) {
  for (int t = from; t < to; ++t) {
    for (Tensor& p : params)
      p.set_grad(grad_at(t, p.numel(), p.dtype()));
    opt.step();
  }
}

// Three steps, a state dict into a fresh optimizer, two more: the same bits as five in a row.
TEST(StateFormat, ResumeFromTheStateDictIsBitwise) {
  for (const std::string kind : {"sgd", "adamw"}) {
    for (const StateFormat f : all_words<StateFormat>()) {
      SCOPED_TRACE(kind + " " + std::string(name_of(f)));
      std::vector<Tensor> a = make_params(DType::F32), b = make_params(DType::F32);
      auto straight = make(kind, a, f);
      steps(*straight, a, 0, 5);
      auto first = make(kind, b, f);
      steps(*first, b, 0, 3);
      const NamedTensors saved = first->state_dict();
      auto second = make(kind, b, f);
      second->load_state_dict(saved);
      steps(*second, b, 3, 5);
      for (size_t i = 0; i < a.size(); ++i)
        EXPECT_TRUE(same_bits(a[i], b[i])) << i;
    }
  }
}

// Two optimizers owning halves of each parameter (cut on a block boundary, as ZeRO does) step as
// the whole one: weights, codes and block scales the same bits.
TEST(StateFormat, ShardsQuantizeAsTheWholeOptimizer) {
  for (const StateFormat f : {StateFormat::Q8, StateFormat::FP8}) {
    SCOPED_TRACE(name_of(f));
    std::vector<Tensor> whole = make_params(DType::F32);
    auto one = make("adamw", whole, f);
    steps(*one, whole, 0, 4);
    const NamedTensors all = one->state_dict();
    std::map<std::string, Tensor> want(all.begin(), all.end());
    for (int rank = 0; rank < 2; ++rank) {
      std::vector<Tensor> mine = make_params(DType::F32);
      auto opt = make("adamw", mine, f);
      std::vector<ElementRange> ranges;
      for (const Tensor& p : mine) {
        const int64_t cut = p.numel() > kMaxStateBlock ? kMaxStateBlock : p.numel();
        ranges.push_back(rank == 0 ? ElementRange{0, cut} : ElementRange{cut, p.numel()});
      }
      opt->set_owned_ranges(ranges);
      steps(*opt, mine, 0, 4);
      for (size_t i = 0; i < mine.size(); ++i) {
        const ElementRange r = ranges[i];
        if (r.size() == 0) continue;
        EXPECT_TRUE(
            same_bits(mine[i].narrow(0, r.begin, r.size()), whole[i].narrow(0, r.begin, r.size())))
            << "rank " << rank << " parameter " << i;
      }
      for (const auto& [key, t] : opt->state_dict()) {
        if (!key.starts_with("state.") || key.ends_with(".step")) continue;
        const size_t i = size_t(key[6] - '0');
        const ElementRange r = ranges[i];
        const int64_t b = opt->block_options().block;
        const Tensor& w = want.at(key);
        const Tensor slice = key.ends_with(".absmax")
                                 ? w.narrow(0, r.begin / b, (r.end + b - 1) / b - r.begin / b)
                                 : w.reshape({-1}).narrow(0, r.begin, r.size());
        EXPECT_TRUE(same_bits(t, slice.contiguous())) << key << " of rank " << rank;
      }
    }
  }
}

// What each format keeps for a parameter of n >= min_numel elements, AdamW's two moments.
TEST(StateFormat, StateBytesAreTheFormatsSize) {
  const int64_t n = 8192, blocks = n / 256;
  const std::map<StateFormat, int64_t> want{{StateFormat::F32, 2 * 4 * n},
                                            {StateFormat::BF16, 2 * 2 * n},
                                            {StateFormat::FP8, 2 * (n + 4 * blocks)},
                                            {StateFormat::Q8, 2 * (n + 4 * blocks)}};
  for (const auto& [f, bytes] : want) {
    Tensor p = Tensor::zeros({n}, DType::F32);
    p.set_requires_grad(true);
    AdamWOptions o;
    o.exp_avg_format = o.exp_avg_sq_format = f;
    AdamW opt({p}, o);
    p.set_grad(Tensor::ones({n}, DType::F32));
    opt.step();
    EXPECT_EQ(opt.state_nbytes(), bytes) << name_of(f);
  }
}

// bf16 and 8-bit moments stay close to fp32's over many steps (the reference script measures
// the same on its own data: about 1e-3 and 1e-2 of the distance travelled).
TEST(StateFormat, NarrowMomentsFollowTheFp32Trajectory) {
  std::vector<Tensor> ref = make_params(DType::F32);
  auto base = make("adamw", ref, StateFormat::F32);
  steps(*base, ref, 0, 30);
  const std::vector<Tensor> start = make_params(DType::F32);
  for (const auto& [f, bound] : std::map<StateFormat, double>{
           {StateFormat::BF16, 0.01}, {StateFormat::FP8, 0.06}, {StateFormat::Q8, 0.06}}) {
    std::vector<Tensor> p = make_params(DType::F32);
    auto opt = make("adamw", p, f);
    steps(*opt, p, 0, 30);
    const double travelled = distance(ref[0], start[0]);
    const double off = distance(p[0], ref[0]);
    EXPECT_LT(off / travelled, bound) << name_of(f);
    EXPECT_GT(off, 0.0) << name_of(f);  // it is another format
  }
}

TEST(StateFormat, UserMistakesAreClearErrors) {
  std::vector<Tensor> p = make_params(DType::F32);
  AdamWOptions o;
  o.blocks.block = 300;
  try {
    AdamW bad(p, o);
    FAIL() << "a block of 300 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("power of two"), std::string::npos) << e.what();
  }
  // A checkpoint of another format names the state, both formats and what to do.
  auto q8 = make("adamw", p, StateFormat::Q8);
  steps(*q8, p, 0, 1);
  auto f32 = make("adamw", make_params(DType::F32), StateFormat::F32);
  try {
    f32->load_state_dict(q8->state_dict());
    FAIL() << "8-bit state loaded into an fp32 optimizer";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("state.0.exp_avg"), std::string::npos) << m;
  }
  // A shard that starts inside a block.
  auto sharded = make("adamw", p, StateFormat::Q8);
  sharded->set_owned_ranges({{100, 6000}, {0, 4096}, {0, 100}});
  for (Tensor& t : p)
    t.set_grad(grad_at(0, t.numel(), DType::F32));
  try {
    sharded->step();
    FAIL() << "a shard inside a block was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("inside a block"), std::string::npos) << e.what();
  }
}

// ---- Kahan compensation ------------------------------------------------------------------------

// A bf16 weight of 1 taking SGD updates of 1e-4, far below half its ulp (2^-9 above 1, 2^-9
// below): rounded to nearest it never moves; with Kahan it follows the fp32 weight to within one
// ulp and its compensation holds the rest.
TEST(Compensation, KahanKeepsUpdatesBelowHalfAnUlp) {
  const int64_t n = 64;
  const int kSteps = 200;
  double want = 1.0;
  for (int t = 0; t < kSteps; ++t)
    want = double(float(want - float(1e-4)));
  for (const Compensation c : {Compensation::None, Compensation::Kahan}) {
    Tensor p = Tensor::ones({n}, DType::BF16);
    p.set_requires_grad(true);
    SGD opt({p}, {.lr = 1e-4});
    opt.set_compensation(c);
    for (int t = 0; t < kSteps; ++t) {
      p.set_grad(Tensor::ones({n}, DType::BF16));
      opt.step();
    }
    const std::vector<float> v = p.to(DType::F32).to_vector<float>();
    if (c == Compensation::None) {
      EXPECT_EQ(v[0], 1.0f);
      EXPECT_FALSE(opt.compensation_buffer(0).defined());
    } else {
      EXPECT_NEAR(v[0], want, 1.0 / 128);
      // p + c is the fp32 weight but for what c's own bf16 rounding loses each step (at most
      // 2^-9 of |c| <= 2^-8): here 1.2e-4 after 200 steps, against nearest's 2e-2.
      const float total = v[0] + opt.compensation_buffer(0).to(DType::F32).to_vector<float>()[0];
      EXPECT_NEAR(total, want, 0.01 * kSteps * 1e-4);
    }
  }
}

// Compensated bf16 weights under AdamW stay nearer the fp32 run than nearest rounding, a resume
// through the state dict is bitwise, and stochastic stores are refused with it.
TEST(Compensation, KahanAdamWResumesBitwiseAndBeatsNearest) {
  std::vector<Tensor> ref = make_params(DType::F32);
  auto base = make("adamw", ref, StateFormat::F32);
  steps(*base, ref, 0, 40);
  double off[2] = {0, 0};
  for (const Compensation c : {Compensation::None, Compensation::Kahan}) {
    std::vector<Tensor> p = make_params(DType::BF16);
    auto opt = make("adamw", p, StateFormat::F32);
    opt->set_compensation(c);
    steps(*opt, p, 0, 40);
    off[int(c)] = distance(p[0], ref[0]);
  }
  EXPECT_LT(off[1], 0.5 * off[0]);

  std::vector<Tensor> a = make_params(DType::BF16), b = make_params(DType::BF16);
  auto straight = make("adamw", a, StateFormat::Q8);
  straight->set_compensation(Compensation::Kahan);
  steps(*straight, a, 0, 6);
  auto first = make("adamw", b, StateFormat::Q8);
  first->set_compensation(Compensation::Kahan);
  steps(*first, b, 0, 3);
  const NamedTensors saved = first->state_dict();
  bool has = false;
  for (const auto& [k, t] : saved)
    has = has || k == "compensation.0";
  EXPECT_TRUE(has);
  auto second = make("adamw", b, StateFormat::Q8);
  second->set_compensation(Compensation::Kahan);
  second->load_state_dict(saved);
  steps(*second, b, 3, 6);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(same_bits(a[i], b[i])) << i;

  straight->set_store_rounding(RoundingMode::Stochastic, 1);
  EXPECT_THROW(steps(*straight, a, 6, 7), Error);
}

}  // namespace
}  // namespace mantissa::optim
