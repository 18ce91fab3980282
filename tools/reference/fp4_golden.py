#!/usr/bin/env python3
"""FP4 block quantization by the reference algorithms, in numpy + ml_dtypes: the golden data of
tests/backend/fp4_quantize_test.cpp (tests/data/golden/fp4_golden.safetensors, committed).

    python3 tools/reference/fp4_golden.py --out tests/data/golden/fp4_golden.safetensors
    python3 tools/reference/fp4_golden.py --check tests/data/golden/fp4_golden.safetensors

Where the algorithms come from: NVIDIA Transformer Engine's reference quantizer,
transformer_engine/pytorch/custom_recipes/reference_nvfp4.py (NVFP4QuantizerRef; the one
tests/pytorch/nvfp4/test_nvfp4_quantize_exact.py and test_nvfp4_rht_quantize_exact.py hold TE's
CUDA kernels to, atol 0), read at commit d0067d0 (2026-08-22). Ported operation for operation in
fp32:

  NVFP4 (quant_tile_shape (1, 16) or (16, 16), pow_2_scales False, not 4over6):
    global_amax = max |x| over the tensor
    S_enc = min(448 * 6 / global_amax, FLT_MAX), 1 if that is 0;  S_dec = 1 / S_enc
    multiplier = S_enc * float32(1 / 6)
    per block: amax = max |x| over the 1x16 row chunk or the 16x16 tile
               scale = e4m3(clamp(min(amax * multiplier, FLT_MAX), -448, 448))   (RNE)
               encode = min(1 / (float(scale) * S_dec), FLT_MAX)
               code = fp4(clamp(x * encode, -6, 6))                               (RNE)
  MXFP4 (pow_2_scales True, (1, 32)): scale = 2^clamp(ceil(log2(amax / 6)), -127, 127),
    code = fp4(clamp(x / scale, -6, 6)) -- the "ceil" rule. The OCP MX v1.0 spec's own rule,
    scale = 2^(floor(log2(amax)) - 2), is the "floor" variant (not in TE's reference).
  RHT (with_rht, with_random_sign_mask): the 16-point Sylvester Hadamard matrix H, its rows
    signed by TE's fixed vector (get_wgrad_sign_vector), times 1/4: x16 @ (diag(s) H / 4),
    in the input's dtype (bf16 here: products and sums in fp32, one rounding to bf16), then
    NVFP4 1x16 with the amax taken after the transform (with_post_rht_amax). TE applies it to
    the columnwise (transposed) copy: the golden "rht" case gives x and its transform x_t.

Three deliberate differences, which Mantissa's definition (docs/fp4.md) states:
  - TE's cast_to_fp4x2 sends -0.0 to +0 (code 0); the hardware's cvt and ml_dtypes keep the
    sign (code 8). This port keeps the sign.
  - log2 for MX is computed exactly from the bits (torch.log2 in fp32 can round
    log2(2^k (1 + 2^-23)) to k for |k| >= 4; TE has no MXFP4 kernel to disagree with).
  - The RHT's 16 products are summed in index order (cuBLAS's order is unspecified; the sums
    are exact for these inputs either way).
Stochastic rounding has no bit-exact reference (the hardware's cvt.rs draws its own bits): the
"sr" cases use Mantissa's definition, written out here independently -- Philox4x32-10 (element i
of the stream (seed, offset) is word i % 4 of the block for counter (i / 4, offset) and key
seed), and round.h's rule: round away from zero when bits < (dropped fraction) * 2^32.

The operands of a native FP4 GEMM (cuBLASLt on compute capability 10.0+), as cuBLAS's docs
("1D block scaling factors layout") and torchao's to_blocked define them: "gemm_layout.scale_index"
(I32) is the swizzled layout of a 200 x 9 scale matrix whose entries are their row-major index,
-1 in the padding: padded to 128 x 4 tiles, viewed (row tiles, 128, col tiles, 4), permuted to
(row tiles, col tiles, 128, 4), each tile reshaped (4, 32, 4) and its first two axes swapped;
"gemm_layout.packed" (U8) is nvfp4_1d_ragged's codes two to a byte, the first in the low nibble.

Layout: for each case C, "C.x" (the input, F32; a bf16 input as its exact values), "C.codes" (U8,
R x C: one fp4 code per byte), "C.scales" (U8: E4M3 or E8M0 codes per block), "C.amax" and
"C.scale_inv" (F32, 1); the rht case also "C.x_t" (F32: the bf16 values of the transform of x^T).
The metadata "cases" lists them as JSON: {"C": {"rule", "block_rows", "stochastic", "seed",
"offset", "dtype", "rht"}}.
"""
import argparse
import json
import sys

try:
    import numpy as np
    import ml_dtypes
    from safetensors.numpy import load_file, save_file
except ImportError as e:  # the set-up script installs all three
    sys.exit(f"fp4_golden.py needs numpy, ml_dtypes and safetensors ({e}); run scripts/setup or "
             "'python3 -m pip install numpy ml_dtypes safetensors'")

F32 = np.float32
FLT_MAX = F32(np.finfo(np.float32).max)
TE_SIGNS = [1, 1, 1, -1, 1, -1, -1, -1, -1, -1, -1, 1, -1, 1, -1, -1]  # get_wgrad_sign_vector


# ---- Philox4x32-10 and round.h's stochastic rule ------------------------------------------------

def philox_bits(seed: int, offset: int, n: int) -> np.ndarray:
    """The 32 random bits of elements 0..n-1 of the stream (seed, offset)."""
    blocks = (n + 3) // 4
    u64 = np.uint64
    c0 = np.arange(blocks, dtype=u64) & u64(0xFFFFFFFF)
    c1 = (np.arange(blocks, dtype=u64) >> u64(32)) & u64(0xFFFFFFFF)
    c2 = np.full(blocks, offset & 0xFFFFFFFF, dtype=u64)
    c3 = np.full(blocks, (offset >> 32) & 0xFFFFFFFF, dtype=u64)
    k0, k1 = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    mask = u64(0xFFFFFFFF)
    for _ in range(10):
        p0 = u64(0xD2511F53) * c0
        p1 = u64(0xCD9E8D57) * c2
        c0, c1, c2, c3 = ((p1 >> u64(32)) ^ c1 ^ u64(k0)) & mask, p1 & mask, \
                         ((p0 >> u64(32)) ^ c3 ^ u64(k1)) & mask, p0 & mask
        k0 = (k0 + 0x9E3779B9) & 0xFFFFFFFF
        k1 = (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return np.stack([c0, c1, c2, c3], axis=1).reshape(-1)[:n].astype(np.uint32)


def fp4_stochastic(v: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """fp4_e2m1 codes of fp32 values in [-6, 6], rounded stochastically by round.h's rule."""
    b = v.astype(F32).view(np.uint32).astype(np.uint64)
    sign = ((b >> np.uint64(31)) << np.uint64(3)).astype(np.uint8)
    a = b & np.uint64(0x7FFFFFFF)
    e_field = (a >> np.uint64(23)).astype(np.int64)
    sig = a & np.uint64(0x7FFFFF)
    sig = np.where(e_field != 0, sig | np.uint64(1 << 23), sig)
    e = np.where(e_field != 0, e_field - 127, -126)
    scale_e = np.maximum(e, 0)  # fp4_e2m1: emin 0, one mantissa bit
    shift = (22 + (scale_e - e)).astype(np.int64)  # 23 - 1 + (scale_e - e), always >= 22
    big = shift >= 64
    sh = np.minimum(shift, 63).astype(np.uint64)
    keep = np.where(big, np.uint64(0), sig >> sh)
    rem = np.where(big, sig, sig & ((np.uint64(1) << sh) - np.uint64(1)))
    down = np.maximum(shift - 32, 0).astype(np.uint64)
    up_sh = np.maximum(32 - shift, 0).astype(np.uint64)
    threshold = np.where(shift <= 32, rem << up_sh, np.where(shift - 32 >= 64, np.uint64(0),
                                                             rem >> np.minimum(down, np.uint64(63))))
    keep = keep + (bits.astype(np.uint64) < threshold).astype(np.uint64)
    result = (scale_e.astype(np.uint64) << np.uint64(1)) + keep  # (scale_e + bias - 1) << m
    result = np.minimum(result, np.uint64(7))
    result = np.where(a == 0, np.uint64(0), result)
    return sign | result.astype(np.uint8)


# ---- the reference quantizers ---------------------------------------------------------------------

def fp4_nearest(v: np.ndarray) -> np.ndarray:
    """TE's cast_to_fp4x2 buckets (RNE, values already clamped to [-6, 6]), keeping -0's sign."""
    mag = np.abs(v)
    code = np.zeros(v.shape, dtype=np.uint8)
    code[(mag > 0.25) & (mag < 0.75)] = 1
    code[(mag >= 0.75) & (mag <= 1.25)] = 2
    code[(mag > 1.25) & (mag < 1.75)] = 3
    code[(mag >= 1.75) & (mag <= 2.5)] = 4
    code[(mag > 2.5) & (mag < 3.5)] = 5
    code[(mag >= 3.5) & (mag <= 5.0)] = 6
    code[mag > 5.0] = 7
    return code | (np.signbit(v).astype(np.uint8) << 3)


def block_amax(ax: np.ndarray, br: int, bc: int) -> np.ndarray:
    """max |x| per br x bc block (the last ones short), as (nbr, nbc)."""
    R, C = ax.shape
    nbr, nbc = -(-R // br), -(-C // bc)
    padded = np.zeros((nbr * br, nbc * bc), dtype=F32)  # TE pads with zeros
    padded[:R, :C] = ax
    return padded.reshape(nbr, br, nbc, bc).max(axis=(1, 3))


def expand(s: np.ndarray, br: int, bc: int, R: int, C: int) -> np.ndarray:
    return np.repeat(np.repeat(s, br, axis=0), bc, axis=1)[:R, :C]


def nvfp4(x: np.ndarray, br: int, stochastic: bool, seed: int, offset: int):
    x = x.astype(F32)
    R, C = x.shape
    with np.errstate(divide="ignore", over="ignore"):
        amax = F32(np.max(np.abs(x)))
        s_enc = np.minimum(F32(448.0 * 6.0) / amax, FLT_MAX)
        s_enc = F32(1.0) if s_enc == 0 else F32(s_enc)
        s_dec = F32(F32(1.0) / s_enc)
        multiplier = F32(s_enc * F32(F32(1.0) / F32(6.0)))
        vec_max = block_amax(np.abs(x), br, 16)
        ds = np.minimum(vec_max * multiplier, FLT_MAX).astype(F32)
        ds = np.clip(ds, F32(-448.0), F32(448.0)).astype(ml_dtypes.float8_e4m3fn)
        enc = np.minimum(F32(1.0) / (ds.astype(F32) * s_dec), FLT_MAX).astype(F32)
    scaled = np.clip(x * expand(enc, br, 16, R, C), F32(-6.0), F32(6.0)).astype(F32)
    if stochastic:
        codes = fp4_stochastic(scaled.reshape(-1), philox_bits(seed, offset, R * C)).reshape(R, C)
    else:
        codes = fp4_nearest(scaled)
    return codes, ds.view(np.uint8), amax, s_dec


def ceil_log2(v: np.ndarray) -> np.ndarray:
    m, e = np.frexp(v.astype(np.float64))  # v = m * 2^e, m in [0.5, 1): exact
    return np.where(m == 0.5, e - 1, e)


def mxfp4(x: np.ndarray, rule: str):
    x = x.astype(F32)
    R, C = x.shape
    amax = block_amax(np.abs(x), 1, 32)
    with np.errstate(divide="ignore"):
        if rule == "mx_ceil":  # TE: decode = 2^clamp(ceil(log2(amax / 6)), -127, 127)
            q = (amax / F32(6.0)).astype(F32)
            e = np.where(q > 0, ceil_log2(np.where(q > 0, q, 1)), -127)
        else:  # OCP: floor(log2(amax)) - emax(e2m1) = floor(log2(amax)) - 2
            _, fe = np.frexp(np.where(amax > 0, amax, 1).astype(np.float64))
            e = np.where(amax > 0, fe - 1 - 2, -127)
    e = np.clip(e, -127, 127).astype(np.int64)
    encode = np.ldexp(np.float64(1), -e).astype(F32)  # exact powers of two
    scaled = np.clip(x * expand(encode, 1, 32, R, C), F32(-6.0), F32(6.0)).astype(F32)
    scales = (e + 127).astype(np.uint8)
    return fp4_nearest(scaled), scales, F32(np.max(np.abs(x))), F32(1.0)


def hadamard16(x_bf16: np.ndarray, signs) -> np.ndarray:
    """x (R, C) bf16 -> x16 @ (diag(s) H / 4) per group of 16 columns, fp32 sums in index order,
    rounded once to bf16."""
    H = np.ones((1, 1), dtype=F32)
    while H.shape[0] < 16:
        H = np.block([[H, H], [H, -H]])
    T = (np.array(signs, dtype=F32)[:, None] * H * F32(0.25)).astype(F32)
    x = x_bf16.astype(F32)
    R, C = x.shape
    g = x.reshape(R, C // 16, 16)
    acc = g[:, :, 0:1] * T[0]
    for i in range(1, 16):
        acc = (acc + g[:, :, i:i + 1] * T[i]).astype(F32)
    return acc.reshape(R, C).astype(ml_dtypes.bfloat16)


# ---- the cases ----------------------------------------------------------------------------------

def inputs(R: int, C: int, seed: int, dtype: str) -> np.ndarray:
    """Gaussian values with per-row magnitudes over 2^-4 .. 2^4, one row far smaller, outliers,
    signed zeros and fp4's ties (0.25, 0.75, ..., 5 in a block whose max is 6)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((R, C)) * np.exp2(rng.integers(-4, 5, size=(R, 1)))
    x[7, :] *= 2.0**-20  # below what NVFP4's E4M3 block scales reach: scale 0
    x[rng.random((R, C)) < 0.01] *= 64.0
    x[rng.random((R, C)) < 0.02] = 0.0
    x[rng.random((R, C)) < 0.01] = -0.0
    x[3, :] = 0.0  # an all-zero row: zero blocks
    # fp4's ties where an MX block's scale is 1 (its max is 6); NVFP4 scales them off the ties.
    tie = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0])
    x[5, :32] = np.resize(np.concatenate([tie, -tie]), 32)
    x = x.astype(F32)
    return x.astype(ml_dtypes.bfloat16).astype(F32) if dtype == "bf16" else x


CASES = {
    # name: (R, C, seed, dtype, rule, block_rows, stochastic, rht)
    "nvfp4_1d_f32": (64, 96, 1, "f32", "nvfp4", 1, False, False),
    "nvfp4_1d_bf16": (64, 96, 2, "bf16", "nvfp4", 1, False, False),
    "nvfp4_1d_ragged": (40, 72, 3, "bf16", "nvfp4", 1, False, False),
    "nvfp4_2d_bf16": (64, 96, 4, "bf16", "nvfp4", 16, False, False),
    "nvfp4_2d_ragged": (40, 72, 5, "f32", "nvfp4", 16, False, False),
    "nvfp4_rht": (64, 96, 6, "bf16", "nvfp4", 1, False, True),
    "nvfp4_sr": (48, 80, 7, "bf16", "nvfp4", 1, True, False),
    "mxfp4_ceil": (64, 96, 8, "bf16", "mx_ceil", 1, False, False),
    "mxfp4_floor": (64, 96, 9, "bf16", "mx_floor", 1, False, False),
    "mxfp4_ragged": (40, 72, 10, "f32", "mx_floor", 1, False, False),
}
SR_SEED, SR_OFFSET = 20261207, 3


def build():
    tensors, meta = {}, {}
    for name, (R, C, seed, dtype, rule, br, sr, rht) in CASES.items():
        x = inputs(R, C, seed, dtype)
        tensors[f"{name}.x"] = x  # bf16 inputs as their (exact) f32 values
        q = x
        if rht:  # TE's columnwise path: the transform of x^T, along x's rows
            xt = hadamard16(np.ascontiguousarray(x.T).astype(ml_dtypes.bfloat16), TE_SIGNS)
            tensors[f"{name}.x_t"] = xt.astype(F32)
            q = xt.astype(F32)
        if rule == "nvfp4":
            codes, scales, amax, scale_inv = nvfp4(q, br, sr, SR_SEED, SR_OFFSET)
        else:
            codes, scales, amax, scale_inv = mxfp4(q, rule)
        tensors[f"{name}.codes"] = np.ascontiguousarray(codes)
        tensors[f"{name}.scales"] = np.ascontiguousarray(scales)
        tensors[f"{name}.amax"] = np.array([amax], dtype=F32)
        tensors[f"{name}.scale_inv"] = np.array([scale_inv], dtype=F32)
        meta[name] = {"rule": rule, "block_rows": br, "stochastic": sr, "seed": SR_SEED,
                      "offset": SR_OFFSET, "dtype": dtype, "rht": rht}
    tensors["gemm_layout.scale_index"] = to_blocked(
        np.arange(200 * 9, dtype=np.int32).reshape(200, 9))
    codes = tensors["nvfp4_1d_ragged.codes"]
    tensors["gemm_layout.packed"] = np.ascontiguousarray(codes[:, 0::2] | (codes[:, 1::2] << 4))
    return tensors, {"cases": json.dumps(meta, sort_keys=True)}


def to_blocked(s: np.ndarray) -> np.ndarray:
    rows, cols = s.shape
    rt, ct = -(-rows // 128), -(-cols // 4)
    padded = np.full((rt * 128, ct * 4), -1, dtype=s.dtype)
    padded[:rows, :cols] = s
    tiles = padded.reshape(rt, 128, ct, 4).transpose(0, 2, 1, 3)
    return np.ascontiguousarray(tiles.reshape(-1, 4, 32, 4).transpose(0, 2, 1, 3)).reshape(-1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    group = ap.add_mutually_exclusive_group(required=True)
    group.add_argument("--out", help="write the golden file")
    group.add_argument("--check", help="exit 1 unless this file holds what the script computes")
    args = ap.parse_args()
    tensors, meta = build()
    if args.out:
        save_file(tensors, args.out, metadata=meta)
        return
    have = load_file(args.check)
    bad = [k for k in tensors if k not in have or have[k].dtype != tensors[k].dtype or
           have[k].tobytes() != tensors[k].tobytes()]
    bad += [k for k in have if k not in tensors]
    if bad:
        sys.exit(f"{args.check} differs from tools/reference/fp4_golden.py in {', '.join(bad)}: "
                 "regenerate it with --out")
    print(f"{args.check}: the {len(tensors)} tensors match the reference")


if __name__ == "__main__":
    main()
