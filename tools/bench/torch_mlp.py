#!/usr/bin/env python3
"""PyTorch eager counterpart of bench/mlp_bench.cpp: the same MLP step or GEMM, one JSON line.

Run with a Python that has torch (pip), e.g. the venv tools/bench/mlp_compare.py points at.
"""
import argparse
import json
import resource
import statistics
import time

import torch
import torch.nn.functional as F

from bench_util import median_ms


def mlp(args):
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10)).to(dtype)
    x = torch.randn(256, 784, dtype=dtype)
    y = torch.randint(0, 10, (256,))
    lr = 0.01

    def step():
        for p in model.parameters():
            p.grad = None
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(p.grad, alpha=-lr)

    return {"bench": "mlp", "ms_per_step": median_ms(step, args.warmup, args.steps)}


def matmul(args):
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    n = args.matmul
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    times = []
    for i in range(args.steps + 3):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return {"bench": "matmul", "n": n, "gflops": 2 * n**3 / statistics.median(times) / 1e9}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--matmul", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="accepted for symmetry: output is always JSON")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    r = matmul(args) if args.matmul else mlp(args)
    r.update(impl="pytorch", dtype=args.dtype, threads=args.threads, torch=torch.__version__,
             peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    print(json.dumps(r))


if __name__ == "__main__":
    main()
