#!/usr/bin/env python3
"""Per-op overhead, Mantissa vs PyTorch eager, side by side: a chain of 64 ops on a (4, 4) f32
tensor, where the arithmetic is nothing and the time is dispatch, allocation and the autograd
record. Three modes per op: forward (no graph), record (the input needs a gradient) and backward
(record, then backward through the chain); microseconds per op, the median of --reps chains, the
best of --rounds alternating runs of each side.

  python3 tools/bench/dispatch_compare.py [--torch-python PATH] [--build build] [--rounds 3]

PyTorch is timed from Python (what a PyTorch user pays), Mantissa from C++ (bench/dispatch_bench.cpp,
what a Mantissa user pays); both on one thread.
"""
import argparse
import json
import os
import resource
import sys
import time

from bench_util import ROOT, add_compare_options, best_per_op

CHAIN = 64
MODES = ("forward", "record", "backward")


def torch_side(reps):
    """Runs in the PyTorch interpreter: one JSON line per op, as bench_dispatch --json prints."""
    import statistics
    import torch
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(1)
    w = torch.rand(4, 4, generator=g) - 0.5
    ops = {
        "add": lambda x: x + w,
        "mul": lambda x: x * w,
        "relu": torch.relu,
        "tanh": torch.tanh,
        "matmul": lambda x: x @ w,
        "linear": lambda x: torch.nn.functional.linear(x, w),
        "sum_keepdim": lambda x: x.sum(1, keepdim=True),
        "reshape": lambda x: x.reshape(16).reshape(4, 4),
    }
    for name, step in ops.items():
        row = {"op": name}
        for mode in MODES:
            us = []
            for r in range(reps + reps // 10):
                x = torch.rand(4, 4, generator=g) - 0.5
                if mode != "forward":
                    x.requires_grad_(True)
                t0 = time.perf_counter()
                y = x
                for _ in range(CHAIN):
                    y = step(y)
                if mode == "backward":
                    y.sum().backward()
                t = (time.perf_counter() - t0) * 1e6 / CHAIN
                if r >= reps // 10:
                    us.append(t)
            row[f"{mode}_us"] = statistics.median(us)
        print(json.dumps(row))
    print(json.dumps({"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    add_compare_options(ap, steps=0)
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--torch-side", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json-out", help="write every row to this file")
    args = ap.parse_args()
    if args.torch_side:
        return torch_side(args.reps)
    ours = os.path.join(args.build, "bench", "bench_dispatch")
    if not os.path.exists(ours):
        sys.exit(f"{ours} is missing: build first (scripts/setup)")
    sides = {"mantissa": [ours, "--json", "--reps", str(args.reps)],
             "pytorch": [args.torch_python, os.path.abspath(__file__), "--torch-side",
                         "--reps", str(args.reps)]}
    best, rss, ops = best_per_op(sides, args.rounds, [f"{m}_us" for m in MODES])
    print(f"Per-op overhead, us per op (chain of {CHAIN} on a (4, 4) f32 tensor, 1 thread, "
          f"best of {args.rounds})")
    print(f"{'op':<12}" + "".join(f"{m + ' ours':>16}{m + ' torch':>16}{'ratio':>7}" for m in MODES))
    rows = []
    for op in ops:
        line = f"{op:<12}"
        row = {"op": op}
        for m in MODES:
            o, t = best[("mantissa", op, f"{m}_us")], best[("pytorch", op, f"{m}_us")]
            line += f"{o:>16.2f}{t:>16.2f}{t / o:>6.2f}x"
            row.update({f"{m}_us_mantissa": o, f"{m}_us_pytorch": t})
        rows.append(row)
        print(line)
    print(f"peak RSS: mantissa {rss.get('mantissa', 0) / 2**20:.0f} MiB, "
          f"pytorch {rss.get('pytorch', 0) / 2**20:.0f} MiB")
    print("(ratio: PyTorch us / Mantissa us; PyTorch is timed from Python, Mantissa from C++)")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"rows": rows, "peak_rss_bytes": rss}, f, indent=1)


if __name__ == "__main__":
    main()
