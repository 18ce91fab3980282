#!/usr/bin/env python3
"""Data-parallel scaling on this machine: `mantissa train` on synthetic data, one process with 1
and with 2 threads against `mpirun -n 2 ... --distributed` with 1 thread per rank, runs
alternating, each --rounds times (the best kept). Per row: throughput (samples or tokens/s over
the training time), the ratio to one process with 1 thread, peak tensor memory and optimizer
state of the largest rank, and for the 2-rank runs the time inside the gradient collectives and
the share of it hidden behind backward (1 - waited / inside).

  python3 tools/bench/dist_scaling.py [--models cnn,gpt2_tiny] [--steps 60] [--rounds 2]
      [--batch-size 64] [--grad-comm fp32,bf16] [--zero 0,1] [--train-args "..."]
      [--json-out FILE]

--zero 0,1 adds ZeRO-1 rows (optimizer state sharded); --train-args passes options to every run,
e.g. "--optimizer adamw --lr 1e-3 --precision bf16 --opt-level O2" (fp32 masters and AdamW's
two moments: 12 bytes of state per parameter, what ZeRO-1 shares out).

The aims of issue 15: 2 ranks >= 1.8x one rank's throughput; 2 ranks x 1 thread >= 0.9x one
process x 2 threads (at the same global batch: 2 x the per-rank batch).
"""

from bench_util import MPIRUN_FLAGS, mantissa_binary, mpi_parser, run_json, write_rows




def main():
    ap = mpi_parser(__doc__)
    ap.add_argument("--models", default="cnn,gpt2_tiny")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=64, help="per rank (images)")
    ap.add_argument("--token-batch-size", type=int, default=16, help="per rank (tokens)")
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--grad-comm", default="fp32", help="comma-separated, for the 2-rank rows")
    ap.add_argument("--zero", default="0", help="comma-separated ZeRO stages, for the 2-rank rows")
    ap.add_argument("--train-args", default="", help="more `mantissa train` options, for every run")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    binary = mantissa_binary(args.build)

    rows = []
    print(f"{'model':<10} {'setup':<36} {'throughput':>12} {'vs 1x1':>7} {'peak MiB':>9} "
          f"{'state MiB':>9} {'comm s':>7} {'hidden':>7}")
    for model in args.models.split(","):
        tokens = model in ("gpt2_tiny", "gpt2", "lstm")
        b = args.token_batch_size if tokens else args.batch_size
        base = ["train", "--model", model, "--steps", str(args.steps), "--json", "--no-progress",
                "--workers", "0", "--log-every", "1000", *args.train_args.split()]
        base += (["--data", "synthetic-text", "--seq-len", str(args.seq_len),
                  "--synthetic-size", "2000000"] if tokens else
                 ["--data", "synthetic", "--synthetic-size", "20000"])
        setups = [("1 process x 1 thread, B", 1, 1, b, None, "0"),
                  ("1 process x 2 threads, B", 1, 2, b, None, "0"),
                  ("1 process x 2 threads, 2B", 1, 2, 2 * b, None, "0")]
        for comm in args.grad_comm.split(","):
            for zero in args.zero.split(","):
                label = f"{comm}{', ZeRO-1' if zero == '1' else ''}"
                setups.append((f"2 ranks x 1 thread, B ({label})", 2, 1, b, comm, zero))
        best = {}
        for _ in range(args.rounds):
            for name, ranks, threads, batch, comm, zero in setups:
                cmd = base + ["--threads", str(threads), "--batch-size", str(batch)]
                if ranks > 1:
                    cmd = [args.mpirun, *MPIRUN_FLAGS, "-n", str(ranks), binary, *cmd,
                           "--distributed", "--grad-comm", comm, "--zero", zero]
                else:
                    cmd = [binary, *cmd]
                r = run_json(cmd)
                unit = args.seq_len if tokens else 1
                per_s = r["steps"] * batch * ranks * unit / r["train_seconds"]
                if name not in best or per_s > best[name]["per_s"]:
                    best[name] = {"per_s": per_s, "result": r}
        one = best[setups[0][0]]["per_s"]
        for name, ranks, threads, batch, comm, zero in setups:
            r = best[name]["result"]
            c = r.get("comm", {})
            inside, waited = c.get("comm_seconds", 0), c.get("exposed_seconds", 0)
            hidden = 1 - waited / inside if inside > 0 else float("nan")
            row = {"model": model, "setup": name, "ranks": ranks, "threads": threads,
                   "batch_per_rank": batch, "per_s": best[name]["per_s"],
                   "unit": "tokens/s" if tokens else "samples/s",
                   "vs_one": best[name]["per_s"] / one, "peak_bytes": r["peak_memory_bytes"],
                   "optimizer_state_bytes": r["optimizer_state_bytes"], "zero": int(zero),
                   "comm_seconds": inside, "exposed_seconds": waited, "hidden": hidden}
            rows.append(row)
            comm_txt = f"{inside:>7.2f} {100 * hidden:>6.0f}%" if ranks > 1 else ""
            print(f"{model:<10} {name:<36} {row['per_s']:>12.0f} {row['vs_one']:>6.2f}x "
                  f"{r['peak_memory_bytes'] / 2**20:>9.1f} "
                  f"{r['optimizer_state_bytes'] / 2**20:>9.2f} {comm_txt}", flush=True)
    write_rows(args.json_out, rows)


if __name__ == "__main__":
    main()
