#!/usr/bin/env python3
"""Writes fp8 quantizations made by numpy and ml_dtypes: the independent reference for
Mantissa's fp8_quantize (tests/autocast/fp8_golden_test.cpp), per tensor and per block, in every
scaling rule, including saturation, zeros, subnormals, inf/NaN and the E8M0 scale edge cases.

Run by CTest before the test (see tests/CMakeLists.txt); deterministic. The output is one
safetensors file: for each case C its input "C.x" (F32, R x C) and for each variant V
"C.V.codes" (U8: the fp8 bit patterns), "C.V.scale_inv" and "C.V.amax" (F32, one per block);
the metadata "variants" lists them as JSON: {"C.V": {"format", "block": [rows, cols], "rule",
"scale"}}.

The rules (as docs/fp8.md states them):
  given      one scale for the tensor
  amax       scale = fp8_max / amax in fp32 (1 where amax is 0 or not finite; the largest
             float where the quotient overflows)
  amax_pow2  scale = 2^-e, e the smallest integer with amax <= fp8_max * 2^e, clamped to
             [-127, 127] (1 where amax is 0, NaN where amax is not finite)
and then codes = fp8(x * scale) with round to nearest even, finite overflow saturated to
+-fp8_max, inf and NaN inputs to NaN; scale_inv = 1 / scale in fp32.
"""
import argparse
import json
import math
import os
import sys

try:
    import numpy as np
    import ml_dtypes
    from safetensors.numpy import save_file
except ImportError as e:  # the set-up script installs all three
    sys.exit(f"fp8_golden.py needs numpy, ml_dtypes and safetensors ({e}); run scripts/setup or "
             "'python3 -m pip install numpy ml_dtypes safetensors'")

F32 = np.float32
FORMATS = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def block_scale(amax, fmax, rule, given):
    if rule == "given":
        return F32(given)
    if rule == "amax":
        if not math.isfinite(amax) or amax == 0:
            return F32(1)
        with np.errstate(over="ignore"):
            s = F32(fmax) / F32(amax)
        return s if np.isfinite(s) else F32(np.finfo(F32).max)
    if not math.isfinite(amax):
        return F32("nan")
    if amax == 0:
        return F32(1)
    e = math.frexp(amax)[1] - math.frexp(fmax)[1]  # then exact comparisons in Python floats
    while amax > fmax * 2.0**e:
        e += 1
    while amax <= fmax * 2.0**(e - 1):
        e -= 1
    e = min(max(e, -127), 127)
    return F32(2.0**-e)


def quantize(x, fmt, br, bc, rule, given=1.0):
    R, C = x.shape
    br, bc = br or R, bc or C
    nbr, nbc = -(-R // br), -(-C // bc)
    fmax = float(ml_dtypes.finfo(FORMATS[fmt]).max)
    amax = np.zeros((nbr, nbc), F32)
    scale = np.zeros((nbr, nbc), F32)
    for i in range(nbr):
        for j in range(nbc):
            blk = np.abs(x[i * br:(i + 1) * br, j * bc:(j + 1) * bc])
            a = F32("nan") if np.isnan(blk).any() else blk.max()
            amax[i, j] = a
            scale[i, j] = block_scale(float(a), fmax, rule, given)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        scale_inv = (F32(1) / scale).astype(F32)
        s_full = np.repeat(np.repeat(scale, br, 0), bc, 1)[:R, :C]
        y = np.where(np.isfinite(x), x * s_full, F32("nan")).astype(F32)
        y = np.clip(y, -fmax, fmax)  # saturate; NaN stays NaN
    codes = y.astype(FORMATS[fmt]).view(np.uint8)
    return codes, scale_inv, amax


def cases(rng):
    out = {}
    # A wide-ranged matrix with the special values sprinkled in (160 x 200: ragged blocks of 32
    # and 128 in both directions).
    x = (rng.standard_normal((160, 200)) * np.exp2(rng.integers(-12, 8, (160, 200)))).astype(F32)
    flat = x.reshape(-1)
    specials = [0.0, -0.0, 1e-40, -1e-42, 448.0, 464.0, -480.0, 57344.0, 61440.0, 1e30, -3e38,
                2.0**-9, 2.0**-10, 3 * 2.0**-11, 2.0**-16, 2.0**-17]
    idx = rng.choice(flat.size, len(specials) * 6, replace=False)
    for k, i in enumerate(idx):
        flat[i] = specials[k % len(specials)]
    out["wide"] = x
    # Blocks that probe the E8M0 rounding: amax exactly fp8_max * 2^k (no round up), just above
    # it, tiny (clamped to 2^-127), huge, and a block of zeros. Rows of 32.
    e = np.zeros((6, 32), F32)
    e[0] = np.linspace(-1, 1, 32, dtype=F32) * F32(448 * 2.0**-3)
    e[1] = np.linspace(-1, 1, 32, dtype=F32) * F32(448 * 2.0**-3)
    e[1, 0] = np.nextafter(F32(448 * 2.0**-3), F32(1e30))
    e[2] = np.linspace(-1, 1, 32, dtype=F32) * F32(1e-38)
    e[3] = np.linspace(-1, 1, 32, dtype=F32) * F32(3e38)
    e[5] = np.linspace(-1, 1, 32, dtype=F32) * F32(57344 * 2.0**5)
    out["e8m0"] = e
    # Non-finite values: a block with inf, one with NaN, the rest finite.
    n = rng.standard_normal((4, 64)).astype(F32)
    n[1, 3] = np.inf
    n[2, 40] = -np.inf
    n[3, 7] = np.nan
    out["nonfinite"] = n
    return out


VARIANTS = [  # name, format, block rows, block cols, rule, given scale
    ("given_e4m3", "e4m3", 0, 0, "given", 37.5),
    ("given_e5m2", "e5m2", 0, 0, "given", 3.0e-3),
    ("tensor_e4m3", "e4m3", 0, 0, "amax", 1.0),
    ("tensor_e5m2", "e5m2", 0, 0, "amax", 1.0),
    ("mx_e4m3", "e4m3", 1, 32, "amax_pow2", 1.0),
    ("mx_e5m2", "e5m2", 1, 32, "amax_pow2", 1.0),
    ("tile_e4m3", "e4m3", 1, 128, "amax", 1.0),
    ("block_e4m3", "e4m3", 128, 128, "amax", 1.0),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=8)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    tensors, variants = {}, {}
    for cname, x in cases(rng).items():
        tensors[f"{cname}.x"] = x
        for vname, fmt, br, bc, rule, given in VARIANTS:
            codes, sinv, amax = quantize(x, fmt, br, bc, rule, given)
            key = f"{cname}.{vname}"
            tensors[f"{key}.codes"] = codes
            tensors[f"{key}.scale_inv"] = sinv
            tensors[f"{key}.amax"] = amax
            variants[key] = {"format": fmt, "block": [br, bc], "rule": rule, "scale": given}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save_file(tensors, args.out, metadata={"variants": json.dumps(variants)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
