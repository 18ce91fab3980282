#!/usr/bin/env python3
"""Mantissa vs PyTorch eager on this CPU, measured side by side in one run.

For each (threads, dtype) the two implementations run alternately, --rounds times each, and
each keeps its best median; the table prints ms/step, peak memory and the ratios.
  python3 tools/bench/mlp_compare.py [--torch-python PATH] [--build build] [--rounds 3]
PyTorch comes from pip (several GB); it is not part of the default test run.
"""
import argparse
import os
import sys

from bench_util import ROOT, add_compare_options, run_json


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    add_compare_options(ap, steps=40)
    args = ap.parse_args()
    ours = os.path.join(args.build, "bench", "bench_mlp")
    torch_script = os.path.join(ROOT, "tools", "bench", "torch_mlp.py")
    if not os.path.exists(ours):
        sys.exit(f"{ours} is missing: build first (scripts/setup)")

    rows = {}
    for threads in (1, 2):
        for dtype in ("f32", "bf16"):
            best = {}
            for _ in range(args.rounds):
                for impl, cmd in (("mantissa", [ours]), ("pytorch", [args.torch_python, torch_script])):
                    r = run_json(cmd + ["--threads", str(threads), "--dtype", dtype,
                                   "--steps", str(args.steps), "--json"])
                    if impl not in best or r["ms_per_step"] < best[impl]["ms_per_step"]:
                        best[impl] = r
            rows[(threads, dtype)] = best

    print("MLP 784-1024-1024-10, batch 256: forward + cross-entropy + backward + SGD update")
    print(f"{'threads':>7} {'dtype':>5} {'mantissa ms':>12} {'pytorch ms':>11} {'speedup':>8} "
          f"{'mantissa tensors peak':>22} {'mantissa RSS':>13} {'pytorch RSS':>12}")
    for (threads, dtype), best in rows.items():
        m, p = best["mantissa"], best["pytorch"]
        print(f"{threads:>7} {dtype:>5} {m['ms_per_step']:>12.2f} {p['ms_per_step']:>11.2f} "
              f"{p['ms_per_step'] / m['ms_per_step']:>7.2f}x {m['peak_bytes'] / 2**20:>18.1f} MiB "
              f"{m['peak_rss_bytes'] / 2**20:>9.0f} MiB {p['peak_rss_bytes'] / 2**20:>8.0f} MiB")
    print("(tensors peak: bytes held by tensors, from Mantissa's allocator; RSS: the whole process,"
          " libraries included; PyTorch has no CPU tensor-memory counter)")
    for threads in (1, 2):
        f32 = rows[(threads, "f32")]["mantissa"]["ms_per_step"]
        bf16 = rows[(threads, "bf16")]["mantissa"]["ms_per_step"]
        print(f"mantissa bf16 vs f32, {threads} thread(s): {f32 / bf16:.2f}x faster")

    print("\nmatmul 1024^3: Mantissa's matmul() vs the bare oneDNN primitive and PyTorch")
    print(f"{'threads':>7} {'dtype':>5} {'mantissa GF/s':>14} {'oneDNN GF/s':>12} {'overhead':>9} {'pytorch GF/s':>13}")
    for threads in (1, 2):
        for dtype in ("f32", "bf16"):
            m = max((run_json([ours, "--matmul", "1024", "--threads", str(threads), "--dtype", dtype,
                          "--steps", "20", "--json"]) for _ in range(args.rounds)),
                    key=lambda r: r["gflops"])
            p = max((run_json([args.torch_python, torch_script, "--matmul", "1024", "--threads",
                          str(threads), "--dtype", dtype, "--steps", "20"]) for _ in range(args.rounds)),
                    key=lambda r: r["gflops"])
            print(f"{threads:>7} {dtype:>5} {m['gflops']:>14.1f} {m['onednn_gflops']:>12.1f} "
                  f"{m['onednn_gflops'] / m['gflops']:>8.3f}x {p['gflops']:>13.1f}")


if __name__ == "__main__":
    main()
