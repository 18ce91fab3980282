#!/usr/bin/env python3
"""Writes random fp32 bit patterns and their conversions by numpy (float16) and ml_dtypes
(bfloat16, float8_e4m3fn, float8_e5m2, float6_e2m3fn, float6_e3m2fn, float4_e2m1fn,
float8_e8m0fnu): the independent reference for Mantissa's rounding.

Run by CTest before the numerics golden test (see tests/CMakeLists.txt); deterministic for a
seed. Layout (little endian): b"MTGOLD02", uint64 count, then uint32 inputs[count],
uint16 fp16[count], uint16 bf16[count], then uint8 arrays e4m3, e5m2, e2m3, e3m2, e2m1, e8m0.
"""
import argparse
import os
import sys

try:
    import numpy as np
    import ml_dtypes
except ImportError as e:  # the set-up script installs both
    sys.exit(f"numerics_golden.py needs numpy and ml_dtypes ({e}); run scripts/setup or "
             "'python3 -m pip install numpy ml_dtypes'")


def patterns(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, size=count, dtype=np.uint64).astype(np.uint32)
    kind = rng.integers(0, 10, size=count)
    sign = bits & np.uint32(0x80000000)
    mant = bits & np.uint32(0x007FFFFF)
    # In the formats' ranges: exponents 2^-30 .. 2^18 (fp16/fp8 normals, subnormals, overflow).
    exp = rng.integers(127 - 30, 127 + 19, size=count, dtype=np.uint32) << np.uint32(23)
    in_range = sign | exp | mant
    out = bits.copy()
    out[kind <= 3] = in_range[kind <= 3]
    # Exact ties for bf16 (low 16 bits 0x8000) and fp16 normals (low 13 bits 0x1000).
    out[kind == 4] = (in_range[kind == 4] & np.uint32(0xFFFF0000)) | np.uint32(0x8000)
    out[kind == 5] = (in_range[kind == 5] & np.uint32(0xFFFFE000)) | np.uint32(0x1000)
    # fp32 subnormals and zeros; inf and NaN with random payloads.
    out[kind == 6] = bits[kind == 6] & np.uint32(0x807FFFFF)
    sel = (kind == 7) & (rng.integers(0, 4, size=count) == 0)
    out[sel] = bits[sel] | np.uint32(0x7F800000)
    # The fp6/fp4 range (2^-8 .. 2^6), and its ties: 1 to 3 mantissa bits kept, then the half bit.
    small = sign | (rng.integers(127 - 8, 127 + 7, size=count, dtype=np.uint32) << np.uint32(23))
    out[kind == 8] = (small | mant)[kind == 8]
    keep = rng.integers(1, 4, size=count, dtype=np.uint32)
    tie = (small | (mant & ~((np.uint32(1) << (np.uint32(23) - keep)) - np.uint32(1))) |
           (np.uint32(1) << (np.uint32(22) - keep)))
    out[kind == 9] = tie[kind == 9]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--count", type=int, default=10_000_000)
    ap.add_argument("--seed", type=int, default=20261121)
    args = ap.parse_args()

    x_bits = patterns(args.count, args.seed)
    x = x_bits.view(np.float32)
    with np.errstate(all="ignore"):
        f16 = x.astype(np.float16).view(np.uint16)
        bf16 = x.astype(ml_dtypes.bfloat16).view(np.uint16)
        e4m3 = x.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
        e5m2 = x.astype(ml_dtypes.float8_e5m2).view(np.uint8)
        mx = [x.astype(t).view(np.uint8) for t in (ml_dtypes.float6_e2m3fn, ml_dtypes.float6_e3m2fn,
                                                    ml_dtypes.float4_e2m1fn, ml_dtypes.float8_e8m0fnu)]

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        f.write(b"MTGOLD02")
        f.write(np.uint64(args.count).tobytes())
        for a in (x_bits, f16, bf16, e4m3, e5m2, *mx):
            f.write(np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes())
    os.replace(tmp, args.out)
    print(f"wrote {args.count} patterns to {args.out} "
          f"(numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__})")


if __name__ == "__main__":
    main()
