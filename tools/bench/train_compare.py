#!/usr/bin/env python3
"""Training step of the `mlp` and `cnn` (batch 128): `mantissa bench` next to PyTorch eager with
the same thread count, alternating runs in one invocation; prints ms/step, peak memory and the
ratio. PyTorch comes from pip (several GB) and is not part of the default test run.
  python3 tools/bench/train_compare.py [--torch-python PATH] [--build build] [--rounds 3]
"""
import argparse
import os
import sys

from bench_util import ROOT, add_compare_options, run_json


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    add_compare_options(ap, steps=30)
    ap.add_argument("--batch-size", type=int, default=128)
    args = ap.parse_args()
    ours = os.path.join(args.build, "mantissa")
    if not os.path.exists(ours):
        sys.exit(f"{ours} is missing: build first (scripts/setup)")
    torch_script = os.path.join(ROOT, "tools", "bench", "torch_models.py")
    print(f"training step (forward + cross-entropy + backward + SGD momentum), fp32, "
          f"batch {args.batch_size}, best median of {args.rounds} alternating runs")
    print(f"{'model':>5} {'threads':>7} {'mantissa ms':>12} {'pytorch ms':>11} {'speedup':>8} "
          f"{'mantissa tensors peak':>22} {'mantissa RSS':>13} {'pytorch RSS':>12}")
    for model in ("mlp", "cnn"):
        for threads in (1, 2):
            common = ["--model", model, "--threads", str(threads), "--steps", str(args.steps),
                      "--batch-size", str(args.batch_size), "--json"]
            best = {}
            for _ in range(args.rounds):
                for impl, cmd in (("mantissa", [ours, "bench"]),
                                  ("pytorch", [args.torch_python, torch_script])):
                    r = run_json(cmd + common)
                    if impl not in best or r["ms_per_step"] < best[impl]["ms_per_step"]:
                        best[impl] = r
            m, p = best["mantissa"], best["pytorch"]
            print(f"{model:>5} {threads:>7} {m['ms_per_step']:>12.2f} {p['ms_per_step']:>11.2f} "
                  f"{p['ms_per_step'] / m['ms_per_step']:>7.2f}x "
                  f"{m['peak_memory_bytes'] / 2**20:>18.1f} MiB {m['peak_rss_bytes'] / 2**20:>9.0f} MiB "
                  f"{p['peak_rss_bytes'] / 2**20:>8.0f} MiB")


if __name__ == "__main__":
    main()
