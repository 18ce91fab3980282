#!/usr/bin/env python3
"""The reference models' pointwise and row ops (GELU exact and tanh, layer norm, softmax,
cross-entropy, batch norm, ReLU, max pool, a bias gradient's sum over rows), Mantissa vs PyTorch
eager, side by side at the models' shapes: forward and backward ms of each, one thread, the median
of --reps runs, the best of --rounds alternating runs of each side.

  python3 tools/bench/ops_compare.py [--torch-python PATH] [--build build] [--rounds 3]

Mantissa is timed from C++ (bench/ops_bench.cpp), PyTorch from Python; at these sizes (1-10 ms
an op) the kernels dominate, not the call overhead.
"""
import argparse
import json
import os
import resource
import sys
import time

from bench_util import add_compare_options, best_per_op

MODES = ("forward", "backward")
# As bench/ops_bench.cpp builds them.
SHAPES = {"gelu": "6400x256", "gelu_tanh": "6400x256", "layer_norm": "8192x64",
          "softmax": "512x64x64", "cross_entropy": "8192x256", "batch_norm": "128x16x28x28",
          "relu": "128x16x28x28", "max_pool2d": "128x16x28x28", "sum_rows": "8192x512"}


def torch_side(reps):
    """Runs in the PyTorch interpreter: one JSON line per op, as bench_ops --json prints."""
    import statistics
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(1)

    def u(*shape):
        return torch.rand(*shape, generator=gen) * 4 - 2

    w64, b64 = torch.rand(64, generator=gen) + 0.5, torch.rand(64, generator=gen) * 2 - 1
    w16, b16 = torch.rand(16, generator=gen) + 0.5, torch.rand(16, generator=gen) * 2 - 1
    rm, rv = torch.zeros(16), torch.ones(16)
    target = (torch.arange(8192) * 7919) % 256
    ops = [
        ("gelu", lambda x: F.gelu(x), u(6400, 256)),
        ("gelu_tanh", lambda x: F.gelu(x, approximate="tanh"), u(6400, 256)),
        ("layer_norm", lambda x: F.layer_norm(x, (64,), w64, b64), u(8192, 64)),
        ("softmax", lambda x: F.softmax(x, -1), u(512, 64, 64)),
        ("cross_entropy", lambda x: F.cross_entropy(x, target), u(8192, 256)),
        ("batch_norm", lambda x: F.batch_norm(x, rm, rv, w16, b16, True), u(128, 16, 28, 28)),
        ("relu", torch.relu, u(128, 16, 28, 28)),
        ("max_pool2d", lambda x: F.max_pool2d(x, 2), u(128, 16, 28, 28)),
        ("sum_rows", lambda x: x.sum(0), u(8192, 512)),
    ]
    for name, fn, inp in ops:
        g = torch.rand(fn(inp).shape, generator=gen) * 2 - 1
        fwd, bwd = [], []
        for r in range(reps + 2):
            x = inp.detach().requires_grad_(True)
            t0 = time.perf_counter()
            y = fn(x)
            t1 = time.perf_counter()
            y.backward(g)
            t2 = time.perf_counter()
            if r >= 2:
                fwd.append((t1 - t0) * 1e3)
                bwd.append((t2 - t1) * 1e3)
        print(json.dumps({"op": name, "shape": SHAPES[name], "forward_ms": statistics.median(fwd),
                          "backward_ms": statistics.median(bwd)}))
    print(json.dumps({"peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_compare_options(ap, steps=0)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--torch-side", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--json-out", help="write every row to this file")
    args = ap.parse_args()
    if args.torch_side:
        return torch_side(args.reps)
    ours = os.path.join(args.build, "bench", "bench_ops")
    if not os.path.exists(ours):
        sys.exit(f"{ours} is missing: build first (scripts/setup)")
    sides = {"mantissa": [ours, "--json", "--reps", str(args.reps)],
             "pytorch": [args.torch_python, os.path.abspath(__file__), "--torch-side",
                         "--reps", str(args.reps)]}
    best, rss, ops = best_per_op(sides, args.rounds, [f"{m}_ms" for m in MODES])
    print(f"ms per op, one thread, best of {args.rounds} alternating runs of the median of "
          f"{args.reps}")
    print(f"{'op':<14}{'shape':<14}" +
          "".join(f"{m + ' ours':>16}{m + ' torch':>16}{'ratio':>7}" for m in MODES))
    rows = []
    for op in ops:
        shape = SHAPES[op]
        line = f"{op:<14}{shape:<14}"
        row = {"op": op, "shape": shape}
        for m in MODES:
            o, t = best[("mantissa", op, f"{m}_ms")], best[("pytorch", op, f"{m}_ms")]
            line += f"{o:>16.3f}{t:>16.3f}{t / o:>6.2f}x"
            row.update({f"{m}_ms_mantissa": o, f"{m}_ms_pytorch": t})
        rows.append(row)
        print(line)
    print(f"peak RSS: mantissa {rss.get('mantissa', 0) / 2**20:.0f} MiB, "
          f"pytorch {rss.get('pytorch', 0) / 2**20:.0f} MiB")
    print("(ratio: PyTorch ms / Mantissa ms)")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"rows": rows, "peak_rss_bytes": rss}, f, indent=1)


if __name__ == "__main__":
    main()
