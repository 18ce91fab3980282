#!/usr/bin/env python3
"""The training step of every reference model (mlp, cnn, resnet, vit, gpt2_tiny, lstm): `mantissa
bench` next to its PyTorch eager mirror (tools/bench/torch_models.py) with the same thread count,
in fp32, bf16 O1 (PyTorch: autocast) and bf16 O2 (PyTorch: a bf16 model with fp32 master weights
by hand), alternating runs in one invocation. Each (model, threads) runs --rounds rounds, each
round every precision once per implementation, every run its own process; each side keeps its
best median. The parameter counts must be equal (else it stops, naming both). Prints ms/step,
speedup = PyTorch ms / Mantissa ms, peak memory (Mantissa's tensors, both RSS), the geometric
mean of the speedups, our bf16 O2 over our fp32, and the issue-14 aims met or missed:
  every row >= 1.3x; geometric mean over the models >= 1.6x; bf16 O2 >= 1.6x fp32 on gpt2_tiny
  and vit (ours, from the same run).
Image models take batch 128 of 1x28x28 (as `mantissa bench`); token models batch 128 of
--seq-len 64 over the default vocabulary of 256 (`mantissa bench`'s defaults and the issue's
table: 8192 tokens a step), next-token cross-entropy at every position. PyTorch comes from pip
(several GB) and is not part of the default test run.
  python3 tools/bench/train_compare.py [--models mlp,cnn,...] [--precisions fp32,bf16,bf16:O2]
      [--threads 1,2] [--rounds 3] [--steps 20] [--warmup 3] [--mantissa PATH | --build DIR]
      [--torch-python PATH] [--json-out FILE] [--baseline OLD_MANTISSA] [--torch-channels-last]
--torch-channels-last runs PyTorch's conv models in torch.channels_last (Mantissa's resnet runs
channels-last on the CPU by default; PyTorch's default is NCHW). --baseline adds an earlier build of mantissa, run in the same alternating rounds (before/after
figures from one run, on one machine state); its rows carry baseline_ms and baseline_speedup.
"""
import argparse
import json
import math
import os
import sys

from bench_util import ROOT, add_compare_options, run_json

MODELS = ("mlp", "cnn", "resnet", "vit", "gpt2_tiny", "lstm")
TOKEN_MODELS = ("gpt2_tiny", "lstm")
PRECISIONS = ("fp32", "bf16", "bf16:O2")
AIM_SPEEDUP = 1.3  # every row
AIM_GEOMEAN = 1.6  # over the models, per precision and thread count
AIM_O2 = 1.6  # our bf16 O2 over our fp32
O2_AIM_MODELS = ("gpt2_tiny", "vit")


def label_of(entry):
    """`mantissa bench`'s label of a --precision entry: 'bf16' -> 'bf16 O1', 'bf16:O2' ->
    'bf16 O2'."""
    precision, _, level = entry.partition(":")
    if level:
        return f"{precision} {level}"
    return precision + (" O1" if precision == "bf16" else "")


def parse_list(ap, text, allowed, option):
    items = [s for s in text.split(",") if s]
    for s in items:
        if s not in allowed:
            ap.error(f"{option}: unknown entry '{s}' (one of {', '.join(map(str, allowed))})")
    if not items:
        ap.error(f"{option} is empty")
    return items


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def mib(b):
    return b / 2**20


def measure(args, ours, model, threads, entries):
    """{entry: {"mantissa": record, "pytorch": record[, "baseline": record]}}, each the best
    median of the rounds."""
    tokens = model in TOKEN_MODELS
    common = ["--model", model, "--threads", str(threads), "--steps", str(args.steps),
              "--warmup", str(args.warmup), "--json", "--batch-size",
              str(args.token_batch_size if tokens else args.batch_size)]
    if tokens:
        common += ["--seq-len", str(args.seq_len)]
    torch_script = os.path.join(ROOT, "tools", "bench", "torch_models.py")
    best = {e: {} for e in entries}
    for _ in range(args.rounds):
        for e in entries:
            torch_cmd = [args.torch_python, torch_script]
            if args.torch_channels_last:
                torch_cmd.append("--channels-last")
            impls = [("mantissa", [ours, "bench"]), ("pytorch", torch_cmd)]
            if args.baseline:
                impls.append(("baseline", [args.baseline, "bench"]))
            for impl, cmd in impls:
                try:
                    r = run_json(cmd + common + ["--precision", e])
                except RuntimeError as err:
                    sys.exit(f"train_compare: {impl} {model} {e} {threads} thread(s) failed: {err}")
                if r["precision"] != label_of(e):
                    sys.exit(f"train_compare: {impl} ran '{r['precision']}' for '{e}'")
                if impl not in best[e] or r["ms_per_step"] < best[e][impl]["ms_per_step"]:
                    best[e][impl] = r
            m, p = best[e]["mantissa"]["parameters"], best[e]["pytorch"]["parameters"]
            if m != p:
                sys.exit(f"train_compare: {model} has {m:,} parameters in mantissa but {p:,} in "
                         f"its PyTorch mirror (tools/bench/torch_models.py): not the same model")
    return best


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_compare_options(ap, steps=20)
    ap.add_argument("--mantissa", help="the mantissa binary (default: BUILD/mantissa)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--precisions", default=",".join(PRECISIONS))
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps before the timed ones")
    ap.add_argument("--batch-size", type=int, default=128, help="image models")
    ap.add_argument("--token-batch-size", type=int, default=128, help="token models")
    ap.add_argument("--seq-len", type=int, default=64, help="token models")
    ap.add_argument("--json-out", help="write every row and the summaries to this file")
    ap.add_argument("--baseline", help="an earlier mantissa binary, timed in the same rounds")
    ap.add_argument("--torch-channels-last", action="store_true",
                    help="run PyTorch's cnn and resnet in torch.channels_last (its default is "
                         "NCHW; mantissa's resnet runs channels-last on the CPU by default)")
    args = ap.parse_args()
    models = parse_list(ap, args.models, MODELS, "--models")
    entries = parse_list(ap, args.precisions, PRECISIONS, "--precisions")
    try:
        thread_counts = [int(t) for t in args.threads.split(",") if t]
    except ValueError:
        ap.error(f"--threads: expected comma-separated integers, got '{args.threads}'")
    if not thread_counts or min(thread_counts) < 1:
        ap.error("--threads needs positive thread counts")
    if min(args.rounds, args.steps, args.batch_size, args.token_batch_size, args.seq_len) < 1:
        ap.error("--rounds, --steps, the batch sizes and --seq-len must be positive")
    if args.warmup < 0:
        ap.error("--warmup must be at least 0")
    ours = args.mantissa or os.path.join(args.build, "mantissa")
    if not os.path.exists(ours):
        sys.exit(f"{ours} is missing: build first (scripts/setup)")
    if args.baseline and not os.path.exists(args.baseline):
        sys.exit(f"{args.baseline} (--baseline) is missing")
    if not os.path.exists(args.torch_python):
        sys.exit(f"{args.torch_python} is missing: pass --torch-python (a Python with torch)")

    print(f"training step (forward + cross-entropy + backward + SGD lr 0.01 momentum 0.9) of "
          f"{ours} next to PyTorch eager; images: batch {args.batch_size} of 1x28x28; tokens: "
          f"batch {args.token_batch_size} x seq {args.seq_len}; best median of {args.rounds} "
          f"alternating rounds of {args.steps} steps ({args.warmup} warm-up)")
    print(f"speedup = pytorch ms / mantissa ms ('<' below the {AIM_SPEEDUP}x aim); memory: "
          f"mantissa's tensors at their peak in one step, and each process's peak RSS")
    load_start = os.getloadavg()[0]
    print(f"{os.cpu_count()} cores, load average {load_start:.1f} at the start (other work on "
          f"the machine makes the times noisy, the 2-thread ones most)", flush=True)
    header = (f"{'model':<9} {'precision':<9} {'threads':>7} {'mantissa ms':>11} "
              f"{'pytorch ms':>10} {'speedup':>8} {'tensors MiB':>11} {'mantissa RSS':>12} "
              f"{'pytorch RSS':>11}" + (f" {'before ms':>10} {'before x':>8}" if args.baseline else ""))
    print(header, flush=True)
    rows = []
    for model in models:
        tokens = model in TOKEN_MODELS
        for threads in thread_counts:
            best = measure(args, ours, model, threads, entries)
            for e in entries:
                m, p = best[e]["mantissa"], best[e]["pytorch"]
                speedup = p["ms_per_step"] / m["ms_per_step"]
                rows.append({
                    "model": model, "precision": label_of(e), "threads": threads,
                    "batch_size": args.token_batch_size if tokens else args.batch_size,
                    "seq_len": args.seq_len if tokens else None, "parameters": m["parameters"],
                    "mantissa_ms": m["ms_per_step"], "pytorch_ms": p["ms_per_step"],
                    "speedup": speedup, "mantissa_peak_bytes": m["peak_memory_bytes"],
                    "mantissa_rss_bytes": m["peak_rss_bytes"],
                    "pytorch_rss_bytes": p["peak_rss_bytes"], "mantissa": m, "pytorch": p})
                before = ""
                if args.baseline:
                    b = best[e]["baseline"]
                    rows[-1].update({"baseline_ms": b["ms_per_step"],
                                     "baseline_speedup": p["ms_per_step"] / b["ms_per_step"],
                                     "baseline": b})
                    before = f" {b['ms_per_step']:>10.2f} {rows[-1]['baseline_speedup']:>7.2f}x"
                mark = "<" if speedup < AIM_SPEEDUP else " "
                print(f"{model:<9} {label_of(e):<9} {threads:>7} {m['ms_per_step']:>11.2f} "
                      f"{p['ms_per_step']:>10.2f} {speedup:>7.2f}x{mark}"
                      f"{mib(m['peak_memory_bytes']):>11.1f} "
                      f"{mib(m['peak_rss_bytes']):>8.0f} MiB {mib(p['peak_rss_bytes']):>7.0f} MiB"
                      + before, flush=True)

    # Geometric means of the speedups: over the models, per precision and thread count.
    labels = [label_of(e) for e in entries]
    geo = {}
    print(f"\ngeometric mean of the speedups over the models ('<' below the {AIM_GEOMEAN}x aim)")
    print(f"{'precision':<9} " + " ".join(f"{f'{t} thr':>8}" for t in thread_counts)
          + f" {'all':>8}")
    for lab in labels + ["all"]:
        cells = []
        for t in thread_counts + ["all"]:
            g = geomean([r["speedup"] for r in rows if lab in ("all", r["precision"])
                         and t in ("all", r["threads"])])
            geo[f"{lab}/{t}"] = g
            cells.append(f"{g:>7.2f}x" + ("<" if g < AIM_GEOMEAN else " "))
        print(f"{lab:<9} " + "".join(cells))

    if args.baseline:
        print(f"\nthe same for --baseline {args.baseline}")
        for lab in labels + ["all"]:
            cells = []
            for t in thread_counts + ["all"]:
                g = geomean([r["baseline_speedup"] for r in rows
                             if lab in ("all", r["precision"]) and t in ("all", r["threads"])])
                geo[f"baseline {lab}/{t}"] = g
                cells.append(f"{g:>7.2f}x ")
            print(f"{lab:<9} " + "".join(cells))

    # bf16 O2 over fp32 within each implementation, from this run's rows.
    o2 = []
    by_key = {(r["model"], r["precision"], r["threads"]): r for r in rows}
    if "fp32" in labels and "bf16 O2" in labels:
        print(f"\nbf16 O2 over fp32 (ms fp32 / ms bf16 O2; '<' below the {AIM_O2}x aim on "
              f"{' and '.join(O2_AIM_MODELS)})")
        print(f"{'model':<9} {'threads':>7} {'mantissa':>9} {'pytorch':>9}")
        for model in models:
            for t in thread_counts:
                f, h = by_key[(model, "fp32", t)], by_key[(model, "bf16 O2", t)]
                ours_r = f["mantissa_ms"] / h["mantissa_ms"]
                theirs = f["pytorch_ms"] / h["pytorch_ms"]
                o2.append({"model": model, "threads": t, "mantissa": ours_r, "pytorch": theirs})
                mark = "<" if model in O2_AIM_MODELS and ours_r < AIM_O2 else " "
                print(f"{model:<9} {t:>7} {ours_r:>8.2f}x{mark}{theirs:>8.2f}x")

    load_end = os.getloadavg()[0]
    print(f"\nload average {load_end:.1f} at the end")
    below = [r for r in rows if r["speedup"] < AIM_SPEEDUP]
    geo_missed = [k for k, g in geo.items()
                  if "all" not in k and not k.startswith("baseline") and g < AIM_GEOMEAN]
    o2_missed = [x for x in o2 if x["model"] in O2_AIM_MODELS and x["mantissa"] < AIM_O2]
    print(f"aims: {len(rows) - len(below)}/{len(rows)} rows >= {AIM_SPEEDUP}x"
          + (" (below: " + ", ".join(f"{r['model']} {r['precision']} {r['threads']}t "
                                      f"{r['speedup']:.2f}x" for r in below) + ")"
             if below else ""))
    print(f"aims: geometric mean over the models >= {AIM_GEOMEAN}x: overall {geo['all/all']:.2f}x; "
          + (f"missed for {', '.join(geo_missed)}" if geo_missed else "met for every precision "
             "and thread count"))
    if any(x["model"] in O2_AIM_MODELS for x in o2):
        print(f"aims: our bf16 O2 >= {AIM_O2}x our fp32 on {', '.join(O2_AIM_MODELS)}: "
              + (", ".join(f"missed on {x['model']} {x['threads']}t ({x['mantissa']:.2f}x)"
                           for x in o2_missed) or "met"))
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"config": {"mantissa": ours, "baseline": args.baseline,
                                  "torch_python": args.torch_python,
                                  "rounds": args.rounds, "steps": args.steps,
                                  "warmup": args.warmup, "batch_size": args.batch_size,
                                  "token_batch_size": args.token_batch_size,
                                  "seq_len": args.seq_len, "cores": os.cpu_count(),
                                  "load_average": [load_start, load_end]},
                       "rows": rows, "geomean": geo, "bf16_o2_over_fp32": o2,
                       "rows_below_aim": len(below)}, f, indent=1)
        print(f"rows written to {args.json_out}")


if __name__ == "__main__":
    main()
