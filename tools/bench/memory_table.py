#!/usr/bin/env python3
"""Bytes per parameter of a model's training state, from the formula and measured: `mantissa train`
runs a few steps of each configuration on synthetic text (one process, and 2 ranks under mpirun
with --zero), and each row prints the formula's bytes per parameter by component (weights,
gradients, fp32 masters or Kahan compensations, optimizer state), the optimizer's own count of
its state bytes (`optimizer_state_bytes`: moments, block scales, masters, compensations) against
the formula's, and the measured peak tensor memory of the largest rank against the formula's
total. What the peak holds beyond the formula is the activations and the step's transients
(`peak - formula`, printed).

  python3 tools/bench/memory_table.py [--model gpt2] [--steps 3] [--ranks 1,2] [--zero 0,1,2]
      [--configs NAME,...] [--json-out FILE] [--from-json FILE]

The formula counts each parameter's elements (read from a checkpoint of the model): weights and
gradients in the weights' dtype, fp32 masters under O2, a compensation in the weights' dtype
under Kahan, each moment in its --optim-state format (fp8 and 8bit: 1 byte and an fp32 absmax per
block of 256; parameters under 4096 elements keep fp32 state), masters and moments divided
between the ranks under --zero 1, 2 and 3, gradients too under --zero 2 and 3, weights too under
--zero 3 (plus what it holds gathered at its peak), and the gradient buckets' buffers of data
parallel (formula()). docs/memory.md records a run.
"""
import json
import math
import os
import subprocess
import tempfile

from bench_util import (MPIRUN_FLAGS, bench_env, mantissa_binary, mpi_parser, run_json,
                        write_rows)

BLOCK, MIN_NUMEL = 256, 4096

# name -> (train options, weight bytes, master, compensation, optimizer state format)
CONFIGS = {
    "fp32 AdamW": (["--precision", "fp32"], 4, False, False, "fp32"),
    "bf16 O2 AdamW": (["--precision", "bf16", "--opt-level", "O2"], 2, True, False, "fp32"),
    "+ bf16 moments": (["--precision", "bf16", "--opt-level", "O2", "--optim-state", "bf16"], 2,
                       True, False, "bf16"),
    "+ 8-bit moments": (["--precision", "bf16", "--opt-level", "O2", "--optim-state", "8bit"], 2,
                        True, False, "8bit"),
    "bf16-pure SR + 8-bit": (["--precision", "bf16-pure", "--optim-state", "8bit"], 2, False,
                             False, "8bit"),
    "bf16-pure Kahan + 8-bit": (["--precision", "bf16-pure", "--compensation", "kahan",
                                 "--optim-state", "8bit"], 2, False, True, "8bit"),
}


def state_bytes(numel, fmt):
    """One moment of a parameter of `numel` elements."""
    if fmt == "fp32" or (fmt in ("fp8", "8bit") and numel < MIN_NUMEL):
        return 4 * numel
    if fmt == "bf16":
        return 2 * numel
    return numel + 4 * ((numel + BLOCK - 1) // BLOCK)


def parameter_sizes(binary, base):
    """The element count of every parameter the optimizer steps (a tied weight once), from the
    moments of a one-step fp32 checkpoint, and of each transformer block (ZeRO-3's units)."""
    from safetensors import safe_open

    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "c.safetensors")
        r = subprocess.run([binary, *base, "--steps", "1", "--precision", "fp32", "--checkpoint",
                            path], env=bench_env(),
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(r.stderr[-2000:])
        sizes, blocks = [], {}
        with safe_open(path, "np") as f:
            for k in f.keys():
                if k.startswith("blocks."):
                    b = int(k.split(".")[1])
                    blocks[b] = blocks.get(b, 0) + math.prod(f.get_slice(k).get_shape())
                if not (k.startswith("optimizer.state.") and k.endswith(".exp_avg")):
                    continue
                shape = f.get_slice(k).get_shape()
                n = 1
                for s in shape:
                    n *= s
                sizes.append(n)
        return sizes, list(blocks.values())


def formula(sizes, blocks, weight, master, compensation, fmt, ranks, zero):
    """Bytes of one rank by component. With several ranks the gradients travel in the weights'
    dtype (c = weight bytes): plain data parallel and ZeRO-1 keep every bucket's flat buffer
    (c per parameter), ZeRO-1 also the received segment (c / N); ZeRO-2 keeps the segment alone,
    which is then its gradients (its buckets' buffers live only while they are sent). ZeRO-3
    keeps 1/N of the weights, and at its peak (backward) also the root unit whole (all but the
    blocks: the tied embedding, gathered from forward to the step) and two blocks (one running,
    one prefetched)."""
    n = sum(sizes)
    share = ranks if zero >= 1 else 1
    moments = sum(2 * state_bytes(s, fmt) for s in sizes)
    comm = 0.0
    if ranks > 1 and zero <= 1:
        comm = weight * n + (weight * n / ranks if zero == 1 else 0)
    weights = weight * n
    if zero == 3:
        gathered = (n - sum(blocks)) + 2 * max(blocks, default=0)
        weights = weight * (n / ranks + gathered)
    return {
        "weights": weights,
        "gradients": weight * n / (ranks if zero >= 2 else 1),
        "masters": (4 * n if master else 0) / share,
        "compensation": (weight * n if compensation else 0) / share,
        "moments": moments / share,
        "comm": comm,
    }



def main():
    ap = mpi_parser(__doc__)
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--zero", default="0,1,2", help="ZeRO stages of the multi-rank rows")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--json-out")
    ap.add_argument("--from-json", help="print the table again from a --json-out file's "
                    "measurements (the formula recomputed; one 1-step run for the sizes)")
    args = ap.parse_args()
    binary = mantissa_binary(args.build)
    base = ["train", "--model", args.model, "--data", "synthetic-text", "--seq-len",
            str(args.seq_len), "--synthetic-size", "200000", "--batch-size", str(args.batch_size),
            "--optimizer", "adamw", "--lr", "1e-4", "--json", "--no-progress", "--workers", "0",
            "--eval-batches", "1", "--log-every", "1000", "--threads", "1"]
    sizes, blocks = parameter_sizes(binary, base)
    n = sum(sizes)
    run = f"measured in {args.from_json}" if args.from_json else (
        f"batch {args.batch_size} x {args.seq_len} tokens, {args.steps} steps")
    print(f"{args.model}: {n} parameters ({n / 1e6:.1f} M), {len(sizes)} tensors; {run}; per rank")
    head = (f"{'config':<26} {'ranks':>5} {'ZeRO':>4} | {'w':>4} {'g':>4} {'m/c':>4} "
            f"{'opt':>5} {'comm':>4} {'B/param':>7} | {'state MiB':>9} {'formula':>8} | "
            f"{'peak MiB':>8} {'formula':>8} {'peak-f':>7} {'B/param':>7}")
    print(head)
    measured = {}
    if args.from_json:
        with open(args.from_json) as fh:
            for row in json.load(fh):
                measured[(row["config"], row["ranks"], row["zero"])] = row
    rows = []
    for name in args.configs.split(","):
        opts, weight, master, comp, fmt = CONFIGS[name]
        for ranks in [int(r) for r in args.ranks.split(",")]:
            for zero in ([0] if ranks == 1 else [int(z) for z in args.zero.split(",")]):
                if args.from_json:
                    m = measured.get((name, ranks, zero))
                    if m is None:
                        continue
                    peak, state = m["peak_bytes"], m["state_bytes"]
                else:
                    cmd = [binary, *base, *opts, "--steps", str(args.steps)]
                    if ranks > 1:
                        # bf16 gradients travel in bf16 (in fp32 they would come back fp32).
                        comm = "bf16" if weight == 2 else "fp32"
                        cmd = [args.mpirun, *MPIRUN_FLAGS, "-n", str(ranks), *cmd,
                               "--distributed", "--zero", str(zero), "--grad-comm", comm]
                    r = run_json(cmd)
                    peak, state = r["peak_memory_bytes"], r["optimizer_state_bytes"]
                f = formula(sizes, blocks, weight, master, comp, fmt, ranks, zero)
                total = sum(f.values())
                state_f = f["masters"] + f["compensation"] + f["moments"]
                rows.append({"config": name, "ranks": ranks, "zero": zero, "formula": f,
                             "formula_bytes": total, "state_bytes": state,
                             "state_formula_bytes": state_f, "peak_bytes": peak, "parameters": n})
                print(f"{name:<26} {ranks:>5} {zero:>4} | {f['weights'] / n:>4.1f} "
                      f"{f['gradients'] / n:>4.1f} {(f['masters'] + f['compensation']) / n:>4.1f} "
                      f"{f['moments'] / n:>5.2f} {f['comm'] / n:>4.1f} {total / n:>7.2f} | "
                      f"{state / 2**20:>9.1f} {state_f / 2**20:>8.1f} | "
                      f"{peak / 2**20:>8.1f} {total / 2**20:>8.1f} "
                      f"{(peak - total) / 2**20:>7.1f} {peak / n:>7.2f}", flush=True)
    write_rows(args.json_out, rows)


if __name__ == "__main__":
    main()
