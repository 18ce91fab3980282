// FP4 training: the GEMMs of Linear layers on FP4 inputs with fp32 accumulation, by NVIDIA's
// NVFP4 recipe or the OCP spec's MXFP4, emulated exactly on any device (docs/fp4.md).
//
//   amp::Fp8Options o;
//   o.fp4 = amp::Fp4Options{.recipe = amp::Fp4Recipe::NVFP4};   // the paper's defaults
//   amp::Fp8Context ctx(o);                    // the Linear layers' state, as for fp8
//   amp::prepare_fp8(*model, ctx);             // amp.h: which layers (and which stay bf16)
//   { amp::Fp8Autocast f(ctx); loss = ...; }   // those layers run fp4_linear
//   loss.backward();
//
// A Linear layer y = x W^T computes its three GEMMs — fprop y = x W^T, dgrad dx = dy W, wgrad
// dW = dy^T x — on operands quantized to fp4_e2m1 with block scales along each GEMM's reduction
// dimension, products exact and sums in fp32 (the Blackwell contract), the output rounded once.
// The recipe (NVFP4, arXiv 2509.25149; Transformer Engine's NVFP4BlockScaling):
//   - blocks of 16 values with an E4M3 scale, under an fp32 scale per tensor from its amax;
//   - weights in 16 x 16 blocks (two_d), so fprop and dgrad multiply the same quantized weight;
//   - the wgrad GEMM's two inputs transformed along its reduction dimension (the batch) by the
//     16-point Random Hadamard Transform with a seeded sign vector (rht), which spreads outliers
//     over their block and leaves the product unchanged (the transform is orthogonal);
//   - the gradients' fp4 values stochastically rounded (sr, Philox: seeded, resumable), the
//     weights' and activations' rounded to nearest even.
// MXFP4: blocks of 32 with an E8M0 (power-of-two) scale, by the OCP rule (floor) or rounded up
// (ceil, never saturating); rht, two_d and sr apply as for NVFP4 except that 2-D blocks are
// NVFP4's (an MXFP4 weight is quantized along each GEMM's reduction dimension).
//
// The quantized values (fp4 value times block scale) are exact in bf16, so the emulation is a
// bf16 GEMM with fp32 accumulation (the backend's block_scaled_gemm) times the two per-tensor
// scales: what an FP4 tensor core computes, on any CPU or GPU.
#pragma once

#include <cstdint>
#include <optional>

#include "mantissa/core/vocabulary.h"
#include "mantissa/tensor/tensor.h"

namespace mantissa::amp {

#define MT_FORALL_FP4_RECIPES(_)                                                              \
  _(NVFP4, "nvfp4", "blocks of 16, E4M3 scales under an fp32 tensor scale (NVIDIA's recipe)") \
  _(MXFP4, "mxfp4", "blocks of 32, E8M0 power-of-two scales (OCP MX)")
MT_VOCABULARY(Fp4Recipe, MT_FORALL_FP4_RECIPES)

#define MT_FORALL_MX_SCALES(_)                                                                \
  _(Floor, "floor", "2^(floor(log2(amax)) - 2), the OCP spec's (the block max may saturate)") \
  _(Ceil, "ceil", "2^ceil(log2(amax / 6)), rounded up: nothing saturates (TE, torchao)")
MT_VOCABULARY(MxScale, MT_FORALL_MX_SCALES)

struct Fp4Options {
  Fp4Recipe recipe = Fp4Recipe::NVFP4;
  bool rht = true;    // the Random Hadamard Transform on the wgrad GEMM's inputs
  bool two_d = true;  // NVFP4 weights in 16 x 16 blocks
  bool sr = true;     // stochastic rounding of the gradients
  MxScale mx_scale = MxScale::Floor;
  uint64_t seed = 0;  // of the RHT's signs and the layers' stochastic rounding
};

// One quantization's choices.
struct Fp4Quantization {
  Fp4Recipe recipe = Fp4Recipe::NVFP4;
  MxScale mx_scale = MxScale::Floor;
  bool two_d = false;       // NVFP4 16 x 16 blocks (else 1 x 16, or MX's 1 x 32)
  bool stochastic = false;  // Philox stream (seed, offset), element i the row-major index
  uint64_t seed = 0, offset = 0;
  // Quantize x^T (R, C) -> (C, Rp) without transposing x: x's rows zero-padded to Rp, a whole
  // number of blocks; the result's members are transposed views (the wgrad GEMM's operands,
  // reduced along x's rows). 1-D blocks only.
  bool transposed = false;
  // With transposed: the Random Hadamard Transform along the quantized rows first, with these
  // signs (hadamard16's definition and rounding), fused into the quantization.
  bool rht = false;
  uint32_t rht_signs = 0;
  // false: the values only (codes undefined); what the emulated GEMM reads.
  bool codes = true;
};

// A matrix in FP4: codes (R, C) U8, one fp4_e2m1 code per byte (undefined when quantized without
// them); block_scales (U8, E4M3 or E8M0 codes per block); values (BF16, R x C): code value times
// block scale, exact; scale_inv (F32, 1) the tensor's decode scale (NVFP4; 1 for MX); amax (F32,
// 1) the tensor's max |x|. The element (r, c) stands for values[r, c] * scale_inv. A transposed
// view transposes codes, block_scales and values alike (16 x 16 blocks stay blocks).
struct Fp4Tensor {
  Tensor codes, block_scales, values, scale_inv, amax;
  Fp4Recipe recipe = Fp4Recipe::NVFP4;
  MxScale mx_scale = MxScale::Floor;
  int64_t block_rows = 1;  // 16: NVFP4's 16 x 16 blocks
};

// x (R, C), f32, bf16 or f16.
Fp4Tensor fp4_quantize(const Tensor& x, const Fp4Quantization& q);

// The 16-point Random Hadamard Transform of each row in groups of 16 (x (R, C), C a multiple
// of 16), in x's dtype: out_j = sum_i x_i s_i H_ij / 4 in fp32, rounded once. `signs`: bit i
// set where s_i = -1.
Tensor hadamard16(const Tensor& x, uint32_t signs);
// The RHT sign mask the recipe draws from a seed.
uint32_t fp4_rht_signs(uint64_t seed);

// a (M, K) @ b (N, K)^T [+ bias] -> (M, N) in out_dtype: the values' products in fp32 sums,
// times both scale_inv, the bias added in fp32, rounded once. a and b may be transposed views.
// On a GPU with FP4 tensor cores (compute capability 10.0+) the codes run cuBLASLt's FP4 GEMM
// (the same products, fp32 sums in its order, scaled by the scale_invs' product; a non-finite
// amax makes the whole output NaN, where the emulation's NaN stays in the rows and columns it
// touches); elsewhere the emulation.
Tensor fp4_gemm(const Fp4Tensor& a, const Fp4Tensor& b, const Tensor& bias, DType out_dtype);

struct Fp8LinearState;
// The op: linear(x, weight, bias) with its three GEMMs under the FP4 recipe `o`, the layer's
// statistics and stochastic-rounding draws in `state`. The output has linear()'s dtype under the
// current autocast state; gradients flow to x, weight and bias in their dtypes.
Tensor fp4_linear(const Tensor& x, const Tensor& weight, const Tensor& bias, Fp8LinearState& state,
                  const Fp4Options& o);

}  // namespace mantissa::amp
