#!/usr/bin/env python3
"""gpt2_tiny on a tokenized corpus in every precision recipe, side by side: the final validation
loss and perplexity (and their gap to fp32), tokens/s, peak memory, skipped steps, and a sample of
text from each model. What the language-model issue's acceptance run records.

    mantissa tokenize --out out/fortunes                 # BPE 4096 on /usr/share/games/fortunes
    python3 tools/bench/lm_recipes.py --data out/fortunes --steps 2000 [--recipes fp32,bf16:O1]

Every run is `mantissa train --model gpt2_tiny --data text` with the same seed, data, schedule
(AdamW, warmup + cosine) and --threads; only the precision differs. Runs are sequential (each is
minutes long); the machine should be otherwise idle for the tokens/s column to mean anything.
"""
import argparse
import json
import os
import subprocess
import sys

RECIPES = {
    "fp32": ["--precision", "fp32"],
    "bf16:O1": ["--precision", "bf16", "--opt-level", "O1"],
    "bf16:O2": ["--precision", "bf16", "--opt-level", "O2"],
    "fp16:O2": ["--precision", "fp16", "--opt-level", "O2"],
    "bf16-pure": ["--precision", "bf16-pure"],
    # fp8 (docs/fp8.md): the Linear GEMMs in fp8, everything else as bf16 O2.
    "fp8:delayed": ["--precision", "fp8", "--opt-level", "O2", "--fp8-recipe", "delayed"],
    "fp8:delayed-e4m3": ["--precision", "fp8", "--opt-level", "O2", "--fp8-recipe", "delayed",
                         "--fp8-format", "e4m3"],
    "fp8:current": ["--precision", "fp8", "--opt-level", "O2", "--fp8-recipe", "current"],
    "fp8:mxfp8": ["--precision", "fp8", "--opt-level", "O2", "--fp8-recipe", "mxfp8"],
    "fp8:blockwise": ["--precision", "fp8", "--opt-level", "O2", "--fp8-recipe", "blockwise"],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mantissa", default="build/mantissa")
    ap.add_argument("--data", default="out/fortunes", help="a directory written by mantissa tokenize")
    ap.add_argument("--out", default="out/lm-recipes")
    ap.add_argument("--recipes", default=",".join(r for r in RECIPES if not r.startswith("fp8")),
                    help="comma-separated, of: " + ", ".join(RECIPES))
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", default="3e-3")
    ap.add_argument("--warmup", type=int, default=100,
                    help="warmup steps (at most a tenth of --steps is used)")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--eval-batches", default="0", help="0: the whole validation shard")
    ap.add_argument("--prompt", default="The meaning of life is")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for name in args.recipes.split(","):
        tag = name.replace(":", "-")
        metrics = os.path.join(args.out, f"{tag}.jsonl")
        ckpt = os.path.join(args.out, f"{tag}.safetensors")
        if os.path.exists(metrics):
            os.remove(metrics)
        cmd = [args.mantissa, "train", "--model", "gpt2_tiny", "--data", "text", "--data-path",
               args.data, "--seq-len", str(args.seq_len), "--batch-size", str(args.batch_size),
               "--optimizer", "adamw", "--lr", args.lr, "--weight-decay", "0.1", "--warmup",
               str(min(args.warmup, args.steps // 10)), "--schedule", "cosine", "--steps", str(args.steps), "--epochs", "1000",
               "--eval-batches", args.eval_batches, "--threads", args.threads, "--no-progress",
               "--log-every", "500", "--metrics", metrics, "--checkpoint", ckpt, "--json",
               *RECIPES[name]]
        print(f"== {name}: {' '.join(cmd)}", file=sys.stderr, flush=True)
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"{name} failed ({run.returncode}): {run.stderr[-2000:]}")
        result = json.loads(run.stdout)
        # Training tokens over training time (evaluations excluded), from the run's own result.
        tokens = result["steps"] * args.batch_size * args.seq_len
        result["tokens_per_s"] = tokens / result["train_seconds"]
        sample = subprocess.run([args.mantissa, "generate", "--checkpoint", ckpt, "--prompt",
                                 args.prompt, "--max-tokens", "40", "--seed", "1", "--json"],
                                capture_output=True, text=True)
        result["sample"] = json.loads(sample.stdout)["completion"] if sample.returncode == 0 else ""
        result["name"] = name
        rows.append(result)
    base = next((r for r in rows if r["name"] == "fp32"), rows[0])
    print(f"\ngpt2_tiny, {args.steps} steps of {args.batch_size} x {args.seq_len} tokens, "
          f"{args.threads} threads; ratios to {base['name']}")
    bf16 = next((r for r in rows if r["name"] == "bf16:O2"), None)
    print(f"{'recipe':<17} {'val loss':>9} {'vs fp32':>8} {'vs bf16 O2':>10} {'ppl':>8} "
          f"{'tokens/s':>9} {'speed':>6} {'peak MiB':>9} {'memory':>7} {'skipped':>8}")
    for r in rows:
        gap = 100 * (r["test_loss"] - base["test_loss"]) / base["test_loss"]
        gap16 = f"{100 * (r['test_loss'] - bf16['test_loss']) / bf16['test_loss']:>+9.2f}%" if bf16 else f"{'-':>10}"
        print(f"{r['name']:<17} {r['test_loss']:>9.4f} {gap:>+7.2f}% {gap16} {r['val_perplexity']:>8.2f} "
              f"{r['tokens_per_s']:>9.0f} {r['tokens_per_s'] / base['tokens_per_s']:>5.2f}x "
              f"{r['peak_memory_bytes'] / 2**20:>9.1f} "
              f"{r['peak_memory_bytes'] / base['peak_memory_bytes']:>6.2f}x {r['skipped_steps']:>8}")
    print()
    for r in rows:
        print(f"{r['name']}: {args.prompt}{r['sample']!r}")
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
