#!/usr/bin/env python3
"""On a machine without a GPU: the GPU tests skip with readable names and parameters, and the
skips end in one line, "N GPU tests skipped: no CUDA device" — from a test program and from
scripts/test's filter of ctest's output (tools/ctest_summary.py).

    gpu_skip_output_test.py TEST_BACKEND SOURCE_DIR       (exit 77, skipped, with a GPU)
"""
import os
import re
import subprocess
import sys
import tempfile

PROGRAM, SOURCE = sys.argv[1:3]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


listing = subprocess.run([PROGRAM, "--gtest_list_tests"], capture_output=True, text=True).stdout
check("byte object" not in listing,
      "--gtest_list_tests prints no parameter as bytes: " +
      next((l for l in listing.splitlines() if "byte object" in l), ""))

p = subprocess.run([PROGRAM, "--gtest_filter=EveryOp/CudaOps.*:CudaAllocator*"],
                   capture_output=True, text=True)
out = p.stdout
if "[  SKIPPED ]" not in out and p.returncode == 0:
    print("the CUDA tests ran: this machine has a GPU")
    sys.exit(77)
check(p.returncode == 0, f"skipped tests pass (exit {p.returncode})")
check("byte object" not in out, "skipped tests print readable parameters, not bytes")
skipped = len(re.findall(r"^\[  SKIPPED \] EveryOp/CudaOps\.\S+ \(", out, re.M))
check(skipped > 100, f"the CUDA op sweep skipped ({skipped} tests)")
check(re.search(r"^\[  SKIPPED \] EveryOp/CudaOps\.MatchesTheCpuBackend/matmul_2d_bf16_strided ",
                out, re.M) is not None, "a skipped test's name reads as its case")
check(re.search(r"^  MatchesTheCpuBackend/matmul_2d_bf16_strided  # GetParam\(\) = "
                r"matmul_2d bf16 strided$", listing, re.M) is not None,
      "the listing prints the case's parameter as words")
last = out.rstrip("\n").splitlines()[-1]
m = re.fullmatch(r"(\d+) GPU tests skipped: no CUDA device", last)
check(m is not None, f"the program's last line counts the GPU skips: {last!r}")
check(m is None or int(m.group(1)) >= skipped, "the count covers every skipped op test")

# scripts/test's filter: ctest's list of GPU-skipped names becomes one line; other skips stay.
with tempfile.TemporaryDirectory() as build:
    os.makedirs(f"{build}/Testing/Temporary")
    log = ""
    for i, (name, output) in enumerate([
            ("EveryOp/CudaOps.MatchesTheCpuBackend/abs_f32", "1 GPU test skipped: no CUDA device"),
            ("EveryOp/CudaOps.MatchesTheCpuBackend/abs_f16", "1 GPU test skipped: no CUDA device"),
            ("Fp8Golden.Matches", "no golden file")], 1):
        log += (f"{i}/3 Testing: {name}\n{i}/3 Test: {name}\nCommand: x\nOutput:\n"
                f"----------\n[ RUN      ] {name}\n{output}\n<end of output>\n"
                f"Test time =   0.01 sec\n----------\nTest Skipped.\n")
    open(f"{build}/Testing/Temporary/LastTest.log", "w").write(log)
    ctest_out = ("1/3 Test #1: EveryOp/CudaOps.MatchesTheCpuBackend/abs_f32 ...***Skipped\n"
                 "100% tests passed, 0 tests failed out of 3\n\n"
                 "The following tests did not run:\n"
                 "\t  1 - EveryOp/CudaOps.MatchesTheCpuBackend/abs_f32 (Skipped)\n"
                 "\t  2 - EveryOp/CudaOps.MatchesTheCpuBackend/abs_f16 (Skipped)\n"
                 "\t  3 - Fp8Golden.Matches (Skipped)\n")
    r = subprocess.run([sys.executable, os.path.join(SOURCE, "tools", "ctest_summary.py"), build],
                       input=ctest_out, capture_output=True, text=True)
    lines = r.stdout.splitlines()
    check(lines[-1:] == ["2 GPU tests skipped: no CUDA device"],
          f"scripts/test ends with the count: {lines[-1:]}")
    check("\t  3 - Fp8Golden.Matches (Skipped)" in lines, "other skips are still listed")
    check(not any("CudaOps" in l and "(Skipped)" in l for l in lines),
          "GPU-skipped names leave the list")
    check(lines[0].startswith("1/3 Test #1"), "the rest passes through")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print(f"all checks passed ({last})")
