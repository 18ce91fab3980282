#!/usr/bin/env python3
"""The reference side of Mantissa's safetensors tests (tests/io/safetensors_test.cpp): the
HuggingFace `safetensors` package reads what Mantissa wrote, and writes what Mantissa must read.
Needs numpy, ml_dtypes and safetensors (scripts/setup installs them); no torch.

  safetensors_check.py read FILE    parses FILE with safetensors' own (Rust) parser and prints
      {"metadata": {...}, "tensors": [{"name", "dtype", "shape", "sum", "fnv1a64"}, ...]}
      as JSON on stdout, tensors in data order. "sum" is the exact (math.fsum) sum of the
      values as float64 (a string when not finite); "fnv1a64" is the 64-bit FNV-1a hash of the
      tensor's raw bytes, as 16 hex digits.
  safetensors_check.py write FILE   writes FILE with safetensors.numpy.save_file: for each tag T
      of F64 F32 F16 BF16 F8_E4M3 F8_E5M2 I64 I32 U8 BOOL a (2, 3) tensor "T" whose element i
      (row-major) is (i - 3) / 2 for float tags, 3 * i - 5 for I64/I32, 40 * i for U8 and
      i % 3 == 0 for BOOL; "scalar" F32 () = 2.5; "empty" F32 (0, 4); metadata
      {"writer": "safetensors.numpy", "note": "\u00e9t\u00e9"}.
"""
import json
import math
import sys

try:
    import ml_dtypes
    import numpy as np
    import safetensors
    from safetensors.numpy import save_file
except ImportError as e:
    sys.exit(f"safetensors_check.py needs numpy, ml_dtypes and safetensors ({e}); run "
             "scripts/setup or 'python3 -m pip install numpy ml_dtypes safetensors'")

NUMPY_TYPES = {
    "F64": np.float64,
    "F32": np.float32,
    "F16": np.float16,
    "BF16": ml_dtypes.bfloat16,
    "F8_E4M3": ml_dtypes.float8_e4m3fn,
    "F8_E5M2": ml_dtypes.float8_e5m2,
    "I64": np.int64,
    "I32": np.int32,
    "U8": np.uint8,
    "BOOL": np.bool_,
}


def fnv1a64(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def read(path: str) -> None:
    with open(path, "rb") as f:
        raw = f.read()
    header_len = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + header_len])
    tensors = []
    # deserialize() is the package's Rust parser: it validates the file as the ecosystem does.
    for name, view in safetensors.deserialize(raw):
        dtype = NUMPY_TYPES[view["dtype"]]
        data = bytes(view["data"])
        values = np.frombuffer(data, dtype=dtype).astype(np.float64)
        total = math.fsum(values.tolist())
        tensors.append({
            "name": name,
            "dtype": view["dtype"],
            "shape": list(view["shape"]),
            "sum": total if math.isfinite(total) else str(total),
            "fnv1a64": fnv1a64(data),
            # The header's order (json keeps it) is the order the writer chose.
            "order": list(header).index(name),
        })
    tensors.sort(key=lambda t: t.pop("order"))
    json.dump({"metadata": header.get("__metadata__", {}), "tensors": tensors}, sys.stdout)
    sys.stdout.write("\n")


def write(path: str) -> None:
    i = np.arange(6)
    tensors = {}
    for tag, dtype in NUMPY_TYPES.items():
        if tag in ("I64", "I32"):
            values = 3 * i - 5
        elif tag == "U8":
            values = 40 * i
        elif tag == "BOOL":
            values = i % 3 == 0
        else:
            values = (i - 3) / 2
        tensors[tag] = np.asarray(values).astype(dtype).reshape(2, 3)
    tensors["scalar"] = np.array(2.5, dtype=np.float32)
    tensors["empty"] = np.zeros((0, 4), dtype=np.float32)
    save_file(tensors, path, metadata={"writer": "safetensors.numpy", "note": "\u00e9t\u00e9"})


def main() -> None:
    if len(sys.argv) != 3 or sys.argv[1] not in ("read", "write"):
        sys.exit(__doc__)
    (read if sys.argv[1] == "read" else write)(sys.argv[2])


if __name__ == "__main__":
    main()
