// Internal: float exp, log, tanh and the normal CDF and density in a form the compiler
// vectorizes. glibc's expf, logf, tanhf and erff are calls that keep a loop scalar (and tanhf is 8x
// slower than expf): in the elementwise loops they were a third of a transformer's step. These use
// only + - * /, integer and bit operations, and selects written as bit masks (GCC does not
// if-convert a conditional on floats under the default -ftrapping-math, which would keep the loop
// scalar again). Their polynomials and exp's reduction use fused multiply-adds written out
// (vm::fma), and nothing else is fused (the library is built with -ffp-contract=off): fma is one
// instruction in the AVX2 and AVX-512 builds of the loops (their targets include FMA) and the C
// library's exact fmaf in the baseline build, so a scalar loop and a vectorized one, at any
// width, give the same values. Against the former unfused form they take a quarter less time
// (GELU at 6400 x 256 on AVX-512: forward 1.72 -> 1.24 ms, backward 1.81 -> 1.40 ms).
// Polynomials are written out step by step: GCC 12 leaves a loop scalar whose body holds an
// inner loop of fmaf calls (exp's coefficients as a loop over its table did that).
//
// Accuracy against float64 over every float (tests/backend/vec_math_test.cpp states the
// bounds): exp within 1 ulp, log within 1 ulp, tanh within 1.5 ulp (glibc's are within 1), the
// normal CDF within 7 ulp and its density within 2, each plus x^2 / 2 ulp (the rounding of x^2,
// which the exponential magnifies); NaN, infinities, signed zeros and subnormals as the C library
// gives them.
//
// HostMath, at the end, is the CPU's math policy for op_math.h (and softmax's exp): these in
// float, the C library's in double.
//
// Constants: Cephes' minimax polynomials (S. Moshier) for exp, log and tanh; for the normal CDF a
// fit made by tools/reference/fit_normal_cdf.py (relative error 4e-8 before rounding to float).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#define MT_VM_INLINE inline __attribute__((always_inline))

namespace mantissa::backend::cpu::vm {

// All ones where c holds.
MT_VM_INLINE uint32_t mask(bool c) {
  return 0u - uint32_t(c);
}
// m ? a : b, bit by bit.
MT_VM_INLINE float blend(uint32_t m, float a, float b) {
  return std::bit_cast<float>((std::bit_cast<uint32_t>(a) & m) | (std::bit_cast<uint32_t>(b) & ~m));
}
MT_VM_INLINE float abs(float x) {
  return std::bit_cast<float>(std::bit_cast<uint32_t>(x) & 0x7fffffffu);
}
// |magnitude| with the sign of s.
MT_VM_INLINE float with_sign_of(float magnitude, float s) {
  return std::bit_cast<float>(std::bit_cast<uint32_t>(magnitude) |
                              (std::bit_cast<uint32_t>(s) & 0x80000000u));
}
// a * b + c rounded once (see the top of the file).
MT_VM_INLINE float fma(float a, float b, float c) {
  return __builtin_fmaf(a, b, c);
}
// 2^k for k in [-126, 127], from the exponent bits.
MT_VM_INLINE float pow2i(int32_t k) {
  return std::bit_cast<float>(uint32_t(k + 127) << 23);
}
inline constexpr uint32_t kInfBits = 0x7f800000u;

// e^x's constants, shared with the attention kernels' 8-lane form (attention_x86.cpp). Below kLow
// the result is 0 and above kHigh (ln FLT_MAX) inf: those lanes compute e^0 and are replaced at the
// end. Computing them would end in a subnormal product, and x86 takes a microcode assist of ~100
// cycles for each (a causal attention softmax, half of whose scores are -inf, took twice as
// long). kRound (1.5 * 2^23) rounds to an integer when added; ln2 is in two parts, kLn2Hi with
// 9 bits, so that k * kLn2Hi is exact (k has 8 bits). kPoly: Cephes' degree-6 polynomial, the
// highest power first.
struct ExpConstants {
  static constexpr float kLow = -104.0f, kHigh = 88.72283172607422f;
  static constexpr float kRound = 12582912.0f, kLog2e = 1.44269504088896341f;
  static constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
  static constexpr float kPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                     4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
};

// e^x. Cody-Waite reduction x = k ln2 + r, |r| <= ln2 / 2 (fused: the attention kernels' exp8
// does the same operations, so the fused and composed softmax share their exponentials), and
// Cephes' degree-6 polynomial; 2^k
// is applied as two power-of-two factors, so that subnormal results round once and results up
// to 2^128 are reached. NaN compares false against both limits and propagates.
MT_VM_INLINE float exp(float x) {
  using E = ExpConstants;
  const uint32_t lo = mask(x < E::kLow), hi = mask(x > E::kHigh);
  x = blend(lo | hi, 0.0f, x);
  const float t = fma(x, E::kLog2e, E::kRound);
  const float k = t - E::kRound;  // round(x / ln2)
  const float r = fma(-k, E::kLn2Lo, fma(-k, E::kLn2Hi, x));
  float p = E::kPoly[0];
  p = fma(p, r, E::kPoly[1]);
  p = fma(p, r, E::kPoly[2]);
  p = fma(p, r, E::kPoly[3]);
  p = fma(p, r, E::kPoly[4]);
  p = fma(p, r, E::kPoly[5]);
  p = fma(p, r * r, r) + 1.0f;
  // k as an integer from t's low mantissa bits (no float-to-int conversion: NaN-safe).
  const int32_t ki = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(E::kRound);
  const int32_t k1 = ki >> 1, k2 = ki - k1;  // each in [-75, 64]: 2^k1 and 2^k2 are normal
  const float y = p * pow2i(k1) * pow2i(k2);
  return blend(hi, std::bit_cast<float>(kInfBits), blend(lo, 0.0f, y));
}

// The natural logarithm. x = m 2^e with m in [sqrt(1/2), sqrt(2)); Cephes' degree-9 polynomial
// in m - 1 and ln2 in two parts.
MT_VM_INLINE float log(float x) {
  const uint32_t sub = mask(x < 1.17549435e-38f);  // subnormal (or <= 0): scaled by 2^23 first
  const float xs = blend(sub, x * 8388608.0f, x);
  const uint32_t bits = std::bit_cast<uint32_t>(xs);
  const float m0 = std::bit_cast<float>((bits & 0x007fffffu) | 0x3f000000u);  // [0.5, 1)
  const uint32_t low = mask(m0 < 0.707106781186547524f);
  const int32_t e = int32_t((bits >> 23) & 0xffu) - 126 + int32_t(low) - int32_t(sub & 23u);
  const float m = blend(low, m0 + m0 - 1.0f, m0 - 1.0f);
  const float ef = float(e);
  const float z = m * m;
  float p = 7.0376836292e-2f;
  p = fma(p, m, -1.1514610310e-1f);
  p = fma(p, m, 1.1676998740e-1f);
  p = fma(p, m, -1.2420140846e-1f);
  p = fma(p, m, 1.4249322787e-1f);
  p = fma(p, m, -1.6668057665e-1f);
  p = fma(p, m, 2.0000714765e-1f);
  p = fma(p, m, -2.4999993993e-1f);
  p = fma(p, m, 3.3333331174e-1f);
  float y = p * m * z;
  y = y + ef * -2.12194440e-4f;
  y = y - 0.5f * z;
  y = m + y;
  y = y + ef * 0.693359375f;
  // log(+inf) = +inf, log(+-0) = -inf, log(x < 0) = NaN; a NaN stays itself.
  const float inf = std::bit_cast<float>(kInfBits);
  y = blend(mask(x == inf), inf, y);
  y = blend(mask(x == 0.0f), -inf, y);
  y = blend(mask(x < 0.0f), std::bit_cast<float>(0x7fc00000u), y);
  return blend(mask(x != x), x, y);
}

// tanh: an odd polynomial below 0.625 (where 1 - 2 / (e^2|x| + 1) would cancel), that form
// above (1 once e^2|x| overflows).
MT_VM_INLINE float tanh(float x) {
  const float a = abs(x);
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = fma(p, z, 2.06390887954e-2f);
  p = fma(p, z, -5.37397155531e-2f);
  p = fma(p, z, 1.33314422036e-1f);
  p = fma(p, z, -3.33332819422e-1f);
  const float small = blend(mask(a == 0.0f), x, p * z * x + x);  // tanh(-0) = -0
  const float large = with_sign_of(1.0f - 2.0f / (exp(a + a) + 1.0f), x);
  return blend(mask(x != x), x, blend(mask(a < 0.625f), small, large));
}

// e^(-x^2 / 2): the standard normal density's shape. x^2 is rounded once, so the relative
// error grows as x^2 2^-25 (e.g. 20 ulp at |x| = 9, where the value is 2.6e-18). 0 for infinite
// x; NaN stays NaN.
MT_VM_INLINE float exp_neg_half_square(float x) {
  return exp(-0.5f * (x * x));
}

// The standard normal density phi(x) = e^(-x^2 / 2) / sqrt(2 pi).
MT_VM_INLINE float normal_pdf(float x) {
  return exp_neg_half_square(x) * 0.398942280f;
}

// The standard normal CDF Phi(x) = erfc(-x / sqrt 2) / 2, for GELU. The tail h = Phi(-|x|) is
// t R(t) e^(-x^2 / 2) / 2 with t = 1 / (1 + |x| / (2 sqrt 2)) and R a degree-8 polynomial fit of
// erfcx(|x| / sqrt 2) / t (tools/reference/fit_normal_cdf.py); Phi(x) is h below 0 and 1 - h
// above. The lower tail keeps its relative accuracy (1 + erf(x / sqrt 2) would cancel to nothing
// below x = -3), and with normal_pdf on the same x the exponential is computed once (the loops
// inline both; the compiler merges the identical expressions). 0 at -inf, 1 at +inf.
MT_VM_INLINE float normal_cdf(float x) {
  const float t = 1.0f / (1.0f + abs(x) * 0.353553391f);
  float r = -0.0591935664f;
  r = fma(r, t, 0.285183936f);
  r = fma(r, t, -0.488463074f);
  r = fma(r, t, 0.279514968f);
  r = fma(r, t, -0.0276249722f);
  r = fma(r, t, 0.203110531f);
  r = fma(r, t, 0.242996469f);
  r = fma(r, t, 0.282390088f);
  r = fma(r, t, 0.282085568f);
  const float h = 0.5f * t * r * exp_neg_half_square(x);
  return blend(mask(x < 0.0f), h, 1.0f - h);
}

}  // namespace mantissa::backend::cpu::vm

namespace mantissa::backend::cpu {

// The host side of op_math.h's math policy: in float the vectorizable exp, log, tanh, normal CDF
// and density of vec_math.h, in double the std:: functions (the CDF through std::erfc); sqrt and
// pow from std:: (sqrt is an instruction); plain products, not fused (the library is built without
// contraction into FMA). Always inlined: HostMath is not compiled per instruction set, so an
// out-of-line copy is a baseline (SSE) function, and a vectorized loop calling it runs lane by
// lane. GCC left exp<float> out of line once elementwise.cpp had a few more loops using it
// (gpt2_tiny's fp32 step went from 580 to 1040 ms: its GELU ran scalar).
struct HostMath {
  template <typename C>
  MT_VM_INLINE static C exp(C x) {
    if constexpr (std::is_same_v<C, float>) return vm::exp(x);
    return std::exp(x);
  }
  template <typename C>
  MT_VM_INLINE static C log(C x) {
    if constexpr (std::is_same_v<C, float>) return vm::log(x);
    return std::log(x);
  }
  template <typename C>
  MT_VM_INLINE static C sqrt(C x) {
    return std::sqrt(x);
  }
  template <typename C>
  MT_VM_INLINE static C tanh(C x) {
    if constexpr (std::is_same_v<C, float>) return vm::tanh(x);
    return std::tanh(x);
  }
  template <typename C>
  MT_VM_INLINE static C normal_cdf(C x) {
    if constexpr (std::is_same_v<C, float>) return vm::normal_cdf(x);
    return C(0.5) * std::erfc(x * C(-0.70710678118654752440));
  }
  template <typename C>
  MT_VM_INLINE static C normal_pdf(C x) {
    if constexpr (std::is_same_v<C, float>) return vm::normal_pdf(x);
    return std::exp(C(-0.5) * (x * x)) * C(0.39894228040143267794);
  }
  template <typename C>
  MT_VM_INLINE static C pow(C x, C y) {
    return std::pow(x, y);
  }
  template <typename C>
  MT_VM_INLINE static C mul_rn(C a, C b) {
    return a * b;
  }
};

}  // namespace mantissa::backend::cpu

#undef MT_VM_INLINE
