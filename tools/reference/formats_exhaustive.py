#!/usr/bin/env python3
"""Every fp32 input (all 2^32 bit patterns) converted by Mantissa and by ml_dtypes, bit for bit.

    python3 tools/reference/formats_exhaustive.py [--formats fp4_e2m1,...] [--chunk-log2 24]
                                                   [--jobs N] [--stride K]

Needs the installed Python package (scripts/python-check builds it into build-python/venv:
run this with build-python/venv/bin/python) and ml_dtypes. For each format it compares
`mt.convert(x, fmt)` (round to nearest even, default overflow) and `mt.convert(x, fmt,
saturate=True)` with `x.astype(ml_dtype)`. For fp6 and fp4, which have no inf or NaN, both
overflow modes saturate, so both must equal ml_dtypes everywhere. For fp8_e4m3, fp8_e5m2 and
e8m0, saturate differs where ml_dtypes gives inf or NaN from a non-NaN input: there the expected
bits are the format's largest finite value of the input's sign. fp8_e5m2 has many NaNs: Mantissa
keeps a NaN's top payload bits (as F16C and AVX512-BF16 do, docs/numerics.md), ml_dtypes gives
its one quiet NaN, so a NaN for a NaN counts as agreement there. The CTest suite checks every
1021st pattern (tests/numerics/exhaustive_test.cpp); this script checks all of them (--stride 1,
the default) in about ten minutes on two cores. It prints one line per format and exits 1 on any
mismatch, printing the first few.
"""
import argparse
import multiprocessing
import sys
import time

import numpy as np

try:
    import ml_dtypes
    import mantissa as mt
except ImportError as e:
    sys.exit(f"formats_exhaustive.py needs ml_dtypes and the mantissa package ({e}); run "
             "scripts/python-check, then build-python/venv/bin/python " + sys.argv[0])

# format -> (ml_dtypes type, bits of +max finite, whether the format has inf or NaN)
FORMATS = {
    "fp4_e2m1": (ml_dtypes.float4_e2m1fn, 0x07, False),
    "fp6_e2m3": (ml_dtypes.float6_e2m3fn, 0x1F, False),
    "fp6_e3m2": (ml_dtypes.float6_e3m2fn, 0x1F, False),
    "e8m0": (ml_dtypes.float8_e8m0fnu, 0xFE, True),
    "fp8_e4m3": (ml_dtypes.float8_e4m3fn, 0x7E, True),
    "fp8_e5m2": (ml_dtypes.float8_e5m2, 0x7B, True),
}


def expected_saturated(x: np.ndarray, ref: np.ndarray, fmt: str) -> np.ndarray:
    """ml_dtypes' bits with inf/NaN from a non-NaN input replaced by the signed max finite."""
    dtype, max_bits, specials = FORMATS[fmt]
    if not specials:
        return ref
    out = ref.copy()
    wide = ref.view(dtype).astype(np.float32)
    from_number = ~np.isnan(x) & (np.isinf(wide) | np.isnan(wide))
    if fmt == "e8m0":  # unsigned: only +inf and positive overflow saturate; 0 and negatives stay NaN
        from_number &= x > 0
        out[from_number] = max_bits
    else:
        sign = np.where(np.signbit(x), 0x80, 0).astype(np.uint8)
        out[from_number] = (sign | max_bits)[from_number]
    return out


def check_chunk(args):
    """Mismatches of one chunk of patterns: (format, mode) -> (count, first few inputs)."""
    start, count, stride, formats = args
    x_bits = (np.arange(count, dtype=np.uint64) * stride + start).astype(np.uint32)
    x = x_bits.view(np.float32)
    found = {}
    for fmt in formats:
        dtype = FORMATS[fmt][0]
        with np.errstate(all="ignore"):
            ref = x.astype(dtype).view(np.uint8)
        for mode, saturate in (("nearest", False), ("saturate", True)):
            want = expected_saturated(x, ref, fmt) if saturate else ref
            got = mt.convert(x, fmt, saturate=saturate).view(np.uint8)
            differ = got != want
            if fmt == "fp8_e5m2":  # NaN to NaN: Mantissa keeps payload bits, ml_dtypes does not
                differ &= ~(np.isnan(got.view(dtype).astype(np.float32)) &
                            np.isnan(want.view(dtype).astype(np.float32)))
            bad = np.flatnonzero(differ)
            if bad.size:
                found[(fmt, mode)] = (int(bad.size), [(int(x_bits[i]), int(got[i]), int(want[i]))
                                                      for i in bad[:4]])
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--formats", default="fp4_e2m1,fp6_e2m3,fp6_e3m2,e8m0",
                    help="comma-separated, from " + ", ".join(FORMATS))
    ap.add_argument("--chunk-log2", type=int, default=24, help="patterns per chunk, as a power of 2")
    ap.add_argument("--jobs", type=int, default=multiprocessing.cpu_count())
    ap.add_argument("--stride", type=int, default=1, help="check every K-th pattern (1: all 2^32)")
    args = ap.parse_args()
    formats = args.formats.split(",")
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        sys.exit(f"unknown format(s) {', '.join(unknown)}; choose from {', '.join(FORMATS)}")
    if args.stride < 1 or not 10 <= args.chunk_log2 <= 28:
        sys.exit("--stride must be >= 1 and --chunk-log2 in 10..28")

    total = (2**32 + args.stride - 1) // args.stride
    chunk = 2**args.chunk_log2
    work = [(i * chunk * args.stride, min(chunk, total - i * chunk), args.stride, formats)
            for i in range((total + chunk - 1) // chunk)]
    t0 = time.time()
    mismatches = {(f, m): [0, []] for f in formats for m in ("nearest", "saturate")}
    with multiprocessing.Pool(args.jobs) as pool:
        for found in pool.imap_unordered(check_chunk, work):
            for key, (n, first) in found.items():
                mismatches[key][0] += n
                mismatches[key][1] = (mismatches[key][1] + first)[:4]
    seconds = time.time() - t0
    print(f"{total} fp32 patterns (stride {args.stride}) per format and mode, {args.jobs} jobs, "
          f"{seconds:.0f} s; ml_dtypes {ml_dtypes.__version__}, mantissa {mt.__version__}")
    failed = False
    for (fmt, mode), (n, first) in mismatches.items():
        print(f"  {fmt:9s} {mode:9s} mismatches {n}")
        for x_bits, got, want in first:
            print(f"      input 0x{x_bits:08x}: mantissa 0x{got:02x}, expected 0x{want:02x}")
        failed |= n > 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
