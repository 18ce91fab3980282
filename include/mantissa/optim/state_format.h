// How an optimizer keeps its state (momentum, exp_avg, exp_avg_sq) and its weights' rounding
// error: the memory-per-parameter choices of docs/memory.md.
//
// A state format says how each element of a moment is stored between steps. A step always
// computes in fp32 (f64 for f64 parameters): it decodes the chunk of state it needs, updates it
// with the gradient, updates the parameter from the fresh values, and encodes the state again
// (bitsandbytes' 8-bit optimizers work the same way). The formats:
//
//   fp32  the compute type itself (f64 for f64 parameters): PyTorch's AdamW and SGD, 4 bytes.
//   bf16  bf16, rounded to nearest even on store: 2 bytes.
//   fp8   fp8 E4M3 codes under a block scale: an fp32 absmax per block of `block` elements, each
//         value stored as e4m3(x * 448 / absmax) (RNE, saturating) and read as
//         e4m3 * (absmax / 448). The second moment v stores its square root r = sqrt(v) (the
//         update's own denominator): E4M3's 2^17 range then spans gradients 2^17 apart
//         instead of 2^8.5, so a block's small entries keep their value. 1 byte + 4/block.
//   8bit  bitsandbytes' blockwise dynamic quantization ("8-Bit Optimizers via Block-wise
//         Quantization", Dettmers et al.): an fp32 absmax per block, each value the index of
//         the nearest entry of a 256-value dynamic map to x / absmax (ties to the lower index,
//         as bitsandbytes' reference quantizer), read as map[code] * absmax. First moments use
//         the signed map, second moments the unsigned one (backend/state_math.h defines both).
//         1 byte + 4/block.
//
// The two block-scaled formats (fp8, 8bit) apply to parameters of at least `min_numel`
// elements (bitsandbytes' min_8bit_size, 4096); smaller ones (biases, norm weights: a few
// hundred bytes) keep fp32 state. Blocks are counted from the parameter's first element, so a
// sharded optimizer (ZeRO, set_owned_ranges) quantizes exactly as a whole one: its shards start
// on block boundaries (dist::DistributedDataParallel aligns them to kMaxStateBlock).
#pragma once

#include <cstdint>

#include "mantissa/core/dtype.h"
#include "mantissa/core/vocabulary.h"

namespace mantissa::optim {

// _(Enumerator, "name", "help", storage dtype (F32: the compute type), block-scaled)
// clang-format off
#define MT_FORALL_STATE_FORMATS(_)                                                              \
  _(F32, "fp32", "fp32 (f64 for f64 parameters), as PyTorch: 4 bytes an element",              \
    DType::F32, false)                                                                         \
  _(BF16, "bf16", "bf16, rounded to nearest even: 2 bytes", DType::BF16, false)                \
  _(FP8, "fp8", "fp8 E4M3 under an fp32 absmax per block (the second moment as its root): "     \
    "1 byte + 4 per block", DType::FP8_E4M3, true)                                             \
  _(Q8, "8bit", "bitsandbytes' blockwise dynamic 8-bit code, an fp32 absmax per block: 1 byte " \
    "+ 4 per block", DType::U8, true)
// clang-format on
MT_VOCABULARY(StateFormat, MT_FORALL_STATE_FORMATS)

struct StateFormatInfo {
  DType storage;      // what the state tensor holds (F32: the compute type's)
  bool block_scaled;  // an fp32 absmax per block beside it
};
inline constexpr StateFormatInfo kStateFormatTable[] = {
#define MT_STATE_FORMAT_INFO(e, name, help, storage, blocks) {storage, blocks},
    MT_FORALL_STATE_FORMATS(MT_STATE_FORMAT_INFO)
#undef MT_STATE_FORMAT_INFO
};
constexpr const StateFormatInfo& state_format_info(StateFormat f) {
  return kStateFormatTable[static_cast<size_t>(f)];
}

// The largest block a block-scaled state may use, and the alignment of shard boundaries that
// keeps every block on one rank.
inline constexpr int64_t kMaxStateBlock = 2048;

// How the block-scaled formats cut a state: blocks of `block` elements (a power of two from 32
// to kMaxStateBlock; bitsandbytes' optimizers use 256), for parameters of at least `min_numel`
// elements (smaller ones keep fp32 state).
struct BlockOptions {
  int64_t block = 256;
  int64_t min_numel = 4096;
  bool operator==(const BlockOptions&) const = default;
};

// What carries a narrow weight's rounding error from one update to the next when it has no fp32
// master ("Revisiting BFloat16 Training", Zamirai et al.).
//   kahan: a buffer c of the parameter's dtype per parameter; a step computes the updated
//          value x in fp32, adds c, stores p = round(x + c) (to nearest even) and
//          c = round(x + c - p): what the store lost is added back at the next update, so an
//          update far below half an ulp of p accumulates in c until it moves p.
// clang-format off
#define MT_FORALL_COMPENSATIONS(_)                                                           \
  _(None, "none", "none: each store's rounding error is lost (or unbiased, under stochastic " \
    "rounding)")                                                                             \
  _(Kahan, "kahan", "a buffer of the weight's dtype carries each store's rounding error into " \
    "the next update (Kahan summation)")
// clang-format on
MT_VOCABULARY(Compensation, MT_FORALL_COMPENSATIONS)

}  // namespace mantissa::optim
