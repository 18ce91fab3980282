#!/usr/bin/env python3
"""Checks the CUDA backend's device code for loads and stores through constant addresses.

Device code that reads a host constexpr table at run time (round.h's format table, say, through
encode(format, x) with the format a run-time argument) compiles without a word from nvcc: the
table has no device copy, so the address becomes 0 plus an offset, and the kernel dies with an
illegal memory access on a GPU (seen on an H200: every fp8 copy and the optimizers' stochastic
rounding). This check finds that mistake without a GPU: it extracts the PTX that the build
embeds in the library (cuobjdump -ptx) and reports every kernel or device function that loads
or stores through a register holding a literal address (`mov.u64 %rdN, 348;` then `ld [%rdN]`).

Usage: check_device_code.py [--cuobjdump PATH] LIBRARY_OR_PTX...
Exit status: 0 when no function does, 1 when any does, 2 when nothing could be read.
Run by CTest (test `device_code_addresses`) when the CUDA backend is built.
"""

import argparse
import re
import subprocess
import sys

FUNC = re.compile(r"^\s*(?:\.visible\s+|\.weak\s+)?\.(?:entry|func)\s+(?:\([^)]*\)\s*)?([\w$]+)")
MOV_CONST = re.compile(r"\bmov\.u64\s+(%rd\d+),\s*(\d+);")
# Any instruction that writes a 64-bit register (its first operand), other than a load.
WRITE = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z][\w.]*)\s+(%rd\d+),")
ACCESS = re.compile(r"^\s*(?:@!?%p\d+\s+)?(?:ld|st)(?:\.\w+)*\s+[^\[]*\[(%rd\d+)(?:\+-?\d+)?\]")


def scan(ptx_text):
    """The functions of a PTX text that access memory through a literal address, with a count."""
    bad = {}
    func, consts = None, set()
    for line in ptx_text.splitlines():
        m = FUNC.match(line)
        if m:
            func, consts = m.group(1), set()
            continue
        m = MOV_CONST.search(line)
        if m:
            consts.add(m.group(1))
            continue
        m = ACCESS.match(line)
        if m and m.group(1) in consts:
            bad[func] = bad.get(func, 0) + 1
            continue
        m = WRITE.match(line)
        if m and not m.group(1).startswith("ld"):
            consts.discard(m.group(2))
    return bad


def ptx_of(path, cuobjdump):
    if path.endswith(".ptx"):
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    out = subprocess.run([cuobjdump, "-ptx", path], capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{cuobjdump} -ptx {path} failed: {out.stderr.strip()}")
    return out.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cuobjdump", default="cuobjdump")
    ap.add_argument("inputs", nargs="+", help="a library or object with device code, or a .ptx")
    args = ap.parse_args()
    total, seen_code = 0, False
    # CMake passes $<TARGET_OBJECTS:...> as one ';'-separated argument.
    paths = [p for arg in args.inputs for p in arg.split(";") if p]
    for path in paths:
        try:
            text = ptx_of(path, args.cuobjdump)
        except (OSError, RuntimeError) as e:
            print(f"check_device_code: {e}", file=sys.stderr)
            return 2
        seen_code = seen_code or ".entry" in text
        for func, n in sorted(scan(text).items()):
            print(f"{path}: {func}: {n} load(s)/store(s) through a literal address "
                  "(a host table read from device code?)")
            total += 1
    if not seen_code:
        print("check_device_code: no device code found in " + ", ".join(paths),
              file=sys.stderr)
        return 2
    print(f"check_device_code: {total} function(s) with literal-address accesses")
    return min(total, 1) if total else 0


if __name__ == "__main__":
    sys.exit(main())
