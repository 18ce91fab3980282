// fp8_quantize against numpy + ml_dtypes (tools/reference/fp8_golden.py, run by CTest before
// this test): per tensor and per block, every scaling rule, bit for bit — codes, scale_inv and
// amax — including saturation, zeros, subnormals, inf/NaN and the E8M0 scale edge cases.
#include <gtest/gtest.h>

#include <bit>
#include <cstdlib>
#include <cstring>
#include <string>

#include <nlohmann/json.hpp>

#include "mantissa/autocast/fp8.h"
#include "mantissa/io/safetensors.h"

namespace mantissa::amp {
namespace {

std::string golden_path() {
  const char* dir = std::getenv("MANTISSA_TEST_DATA");
  return std::string(dir ? dir : ".") + "/fp8_golden.safetensors";
}

// Bits of F32 values, so that NaN compares by its pattern.
std::vector<uint32_t> bits_of(const Tensor& t) {
  std::vector<uint32_t> out;
  for (float v : t.to_vector<float>())
    out.push_back(std::bit_cast<uint32_t>(v));
  return out;
}

std::vector<uint8_t> codes_of(const Tensor& t) {
  std::vector<uint8_t> out(size_t(t.numel()));
  std::memcpy(out.data(), t.contiguous().data_ptr(), out.size());
  return out;
}

TEST(Fp8Golden, QuantizeMatchesMlDtypesBitForBit) {
  SafetensorsFile f;
  try {
    f = load_safetensors(golden_path());
  } catch (const Error& e) {
    GTEST_SKIP() << "no golden file (" << e.message() << "); it is written by "
                 << "tools/reference/fp8_golden.py (run the tests through ctest)";
  }
  const nlohmann::json variants = nlohmann::json::parse(f.metadata.at("variants"));
  ASSERT_GE(variants.size(), 24u);
  for (const auto& [key, v] : variants.items()) {
    const std::string cname = key.substr(0, key.find('.'));
    const Tensor& x = f.at(cname + ".x");
    Fp8Scaling s;
    s.block_rows = v["block"][0];
    s.block_cols = v["block"][1];
    const std::string rule = v["rule"];
    s.rule = rule == "given"  ? Fp8ScaleRule::Given
             : rule == "amax" ? Fp8ScaleRule::Amax
                              : Fp8ScaleRule::AmaxPow2;
    s.scale = float(v["scale"].get<double>());
    const DType dt = v["format"] == "e4m3" ? DType::FP8_E4M3 : DType::FP8_E5M2;
    for (DType input : {DType::F32, DType::BF16}) {
      // bf16 input: the values rounded to bf16 first, on both sides (the reference's input is
      // the f32 file; for bf16 the comparison is against quantizing the rounded values as f32).
      const Tensor xin = x.to(input);
      const Fp8Tensor q = fp8_quantize(xin, dt, s);
      Fp8Tensor want;
      if (input == DType::F32) {
        want.codes = f.at(key + ".codes");
        want.scale_inv = f.at(key + ".scale_inv");
        want.amax = f.at(key + ".amax");
      } else {
        want = fp8_quantize(xin.to(DType::F32), dt, s);
      }
      EXPECT_EQ(codes_of(q.codes), codes_of(want.codes)) << key << " from " << dtype_name(input);
      EXPECT_EQ(bits_of(q.scale_inv), bits_of(want.scale_inv)) << key;
      EXPECT_EQ(bits_of(q.amax), bits_of(want.amax)) << key;
    }
  }
}

}  // namespace
}  // namespace mantissa::amp
