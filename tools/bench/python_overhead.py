#!/usr/bin/env python3
"""What the Python package costs over C++ (issue 19's aims): an mlp training step driven from
Python against the same step in C++ (`mantissa bench`), and bulk rounding through
`mantissa.round` against the C++ kernel (`bench_numerics`), measured in turns on this machine.

    python3 tools/bench/python_overhead.py [--mantissa build/mantissa] [--rounds 5] [--threads 1]

Needs the package installed (`pip install .`). Prints each run's median and the ratios.
"""
import argparse
import json
import statistics
import subprocess
import time

import numpy as np

import mantissa as mt


def python_steps(precision, batch, steps, warmup):
    """The C++ bench's step (tools/mantissa/bench_cmd.cpp) from Python: SGD(0.01, 0.9), forward
    (autocast for bf16), cross-entropy, backward, step. Median seconds."""
    model = mt.make_model("mlp")
    opt = mt.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng = np.random.default_rng(1)
    x = mt.from_numpy(rng.uniform(-1, 1, (batch, 1, 28, 28)).astype(np.float32))
    y = mt.from_numpy(rng.integers(0, 10, batch))
    times = []
    for i in range(warmup + steps):
        t0 = time.perf_counter()
        opt.zero_grad()
        with mt.autocast("cpu", dtype="bf16", enabled=precision == "bf16"):
            loss = mt.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def cpp_steps(exe, precision, batch, steps, warmup, threads):
    out = subprocess.run([exe, "bench", "--model", "mlp", "--precision", precision, "--batch-size",
                          str(batch), "--steps", str(steps), "--warmup", str(warmup), "--threads",
                          str(threads), "--json"], check=True, capture_output=True, text=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    row = r["results"][0] if "results" in r else r
    return row["ms_per_step"] / 1e3 if "ms_per_step" in row else row["seconds_per_step"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mantissa", default="build/mantissa")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    mt.set_num_threads(args.threads)
    print(f"mlp training step, batch {args.batch_size}, {args.threads} thread(s), median of "
          f"{args.steps} steps, {args.rounds} rounds in turns")
    for precision in ("fp32", "bf16"):
        py, cc = [], []
        for _ in range(args.rounds):
            cc.append(cpp_steps(args.mantissa, precision, args.batch_size, args.steps, 5, args.threads))
            py.append(python_steps(precision, args.batch_size, args.steps, 5))
        p, c = statistics.median(py), statistics.median(cc)
        print(f"  {precision:5} C++ {1e3 * c:7.3f} ms   Python {1e3 * p:7.3f} ms   Python/C++ {p / c:5.3f}")

    n = 16 << 20  # 64 MiB of fp32
    x = np.random.default_rng(2).normal(size=n).astype(np.float32)
    buf = np.empty_like(x)
    for rounding in ("nearest", "stochastic"):
        best = float("inf")
        for _ in range(15):
            np.copyto(buf, x)
            t0 = time.perf_counter()
            mt.round(buf, "bf16", rounding=rounding, out=buf)
            best = min(best, time.perf_counter() - t0)
        print(f"  mantissa.round(bf16, {rounding:10}, in place): {best * 1e3:6.2f} ms, "
              f"{x.nbytes / best / 1e9:5.2f} GB/s")


if __name__ == "__main__":
    main()
