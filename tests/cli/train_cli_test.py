#!/usr/bin/env python3
"""`mantissa train` / `mantissa eval` as a user runs them (small synthetic runs)."""
import json
import os
import subprocess
import sys
import tempfile

BIN = sys.argv[1]
failures = []


def run(*args):
    p = subprocess.run([BIN, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


small = ["--data", "synthetic", "--model", "mlp", "--batch-size", "64", "--threads", "2",
         "--no-progress"]
with tempfile.TemporaryDirectory() as tmp:
    ckpt = os.path.join(tmp, "run.safetensors")
    metrics = os.path.join(tmp, "metrics.jsonl")
    rc, out, err = run("train", *small, "--epochs", "1", "--json", "--checkpoint", ckpt,
                       "--metrics", metrics)
    check(rc == 0, f"train exits 0 ({rc}): {err[-500:]}")
    result = json.loads(out) if rc == 0 else {}
    check(result.get("steps", 0) > 0 and 0 <= result.get("test_accuracy", -1) <= 1,
          f"train prints a JSON result: {out!r}")
    check("epoch 1/1" in err, f"an epoch summary line is printed: {err[-300:]!r}")
    kinds = [json.loads(line)["kind"] for line in open(metrics)] if os.path.exists(metrics) else []
    check(kinds and kinds[-1] == "summary" and "eval" in kinds, f"metrics records: {kinds}")

    rc, out, err = run("eval", "--checkpoint", ckpt, "--json")
    check(rc == 0 and abs(json.loads(out)["test_accuracy"] - result.get("test_accuracy", -1)) < 1e-12,
          f"eval reproduces the final test accuracy ({rc}, {out!r}, {err[-300:]!r})")

    # Resume for one more epoch; a run-defining flag that disagrees is refused.
    rc, out, err = run("train", "--resume", ckpt, "--epochs", "2", "--json", "--no-progress")
    check(rc == 0 and json.loads(out)["steps"] == 2 * result.get("steps", 0),
          f"resume continues to epoch 2 ({rc}, {out!r}, {err[-300:]!r})")
    rc, out, err = run("train", "--resume", ckpt, "--model", "cnn")
    check(rc == 2 and "--model" in err and "mlp" in err, f"resume with another --model: {rc} {err!r}")

    # Mistakes: exit 2, one clear message, nothing written.
    rc, _, err = run("train", "--model", "transformer9000", "--data", "synthetic")
    check(rc == 2 and "transformer9000" in err and "cnn" in err, f"unknown model: {rc} {err!r}")
    rc, _, err = run("train", "--data-dir", os.path.join(tmp, "nowhere"))
    check(rc == 2 and "nowhere" in err, f"missing data dir: {rc} {err!r}")
    # An unusable --checkpoint is refused before any training, not when the first epoch ends.
    for where, says in ((os.path.join(tmp, "nowhere", "run.safetensors"), "does not exist"),
                        (tmp, "is a directory")):
        rc, out, err = run("train", *small, "--epochs", "1", "--checkpoint", where)
        check(rc == 2 and says in err and "epoch 1/1" not in err and out == "",
              f"--checkpoint {where}: {rc} {err!r}")
    rc, _, err = run("train", "--data", "synthetic", "--batch-size", "0")
    check(rc == 2 and "batch-size" in err, f"bad batch size: {rc} {err!r}")
    bad = os.path.join(tmp, "bad.safetensors")
    with open(bad, "wb") as f:
        f.write(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    rc, _, err = run("eval", "--checkpoint", bad)
    check(rc == 2 and "bad.safetensors" in err, f"corrupted checkpoint: {rc} {err!r}")
    rc, _, err = run("train", "--data", "synthetic", "--metrics", os.path.join(tmp, "no", "dir", "m.jsonl"))
    check(rc == 2 and "metrics" in err, f"unwritable metrics path: {rc} {err!r}")

    # Mixed precision: the summary names the level; an O2 checkpoint evaluates the same.
    ckpt2 = os.path.join(tmp, "o2.safetensors")
    rc, out, err = run("train", *small, "--steps", "30", "--precision", "fp16", "--opt-level",
                       "O2", "--json", "--checkpoint", ckpt2)
    o2 = json.loads(out) if rc == 0 else {}
    check(rc == 0 and o2.get("opt_level") == "O2" and "fp32 master weights" in o2.get("amp", ""),
          f"fp16 O2 run ({rc}): {out!r} {err[-300:]!r}")
    rc, out, err = run("eval", "--checkpoint", ckpt2, "--json")
    check(rc == 0 and abs(json.loads(out)["test_accuracy"] - o2.get("test_accuracy", -1)) < 1e-12,
          f"eval of an O2 checkpoint reproduces its accuracy ({rc}, {out!r}, {err[-300:]!r})")
    rc, out, err = run("train", *small, "--steps", "9", "--precision", "fp16",
                       "--underflow-every", "3")
    check(rc == 0 and "underflow" in out and "at the loss scale" in out,
          f"underflow report ({rc}): {out!r} {err[-300:]!r}")
    rc, out, err = run("train", *small, "--steps", "3", "--precision", "bf16-pure")
    check(rc == 0 and "rounding stochastic" in out, f"bf16-pure ({rc}): {out!r} {err[-300:]!r}")
    # fp8: the recipe leads the summary, the eval of its checkpoint (with the delayed scales it
    # saved) reproduces the accuracy, and fp8 options without fp8 are refused.
    ckpt8 = os.path.join(tmp, "fp8.safetensors")
    rc, out, err = run("train", *small, "--steps", "12", "--precision", "fp8",
                       "--fp8-recipe", "delayed", "--json", "--checkpoint", ckpt8)
    f8 = json.loads(out) if rc == 0 else {}
    check(rc == 0 and f8.get("amp", "").startswith("fp8 delayed (hybrid)")
          and f8.get("fp8", {}).get("layers", 0) >= 1, f"fp8 run ({rc}): {out!r} {err[-300:]!r}")
    rc, out, err = run("eval", "--checkpoint", ckpt8, "--json")
    check(rc == 0 and abs(json.loads(out)["test_accuracy"] - f8.get("test_accuracy", -1)) < 1e-12,
          f"eval of an fp8 checkpoint reproduces its accuracy ({rc}, {out!r}, {err[-300:]!r})")
    for flags, needle in ((["--opt-level", "O2"], "half precision"),
                          (["--fp8-recipe", "rowwise"], "apply to --precision fp8"),
                          (["--precision", "fp8", "--fp8-accumulate", "fast:0"], "--fp8-accumulate takes fp32, fast"),
                          (["--precision", "fp8", "--fp8-recipe", "delayed", "--fp8-pow2-scales", "on"], "delayed scaling takes its scales from the amax history"),
                          (["--precision", "fp8", "--fp8-recipe", "tensorwise"], "unknown --fp8-recipe 'tensorwise'; use delayed: "),
                          (["--precision", "fp8", "--opt-level", "O3"], "bf16 O1 or O2"),
                          (["--precision", "bf16", "--rounding", "stochastic"], "half weights"),
                          (["--precision", "fp16", "--opt-level", "O7"], "unknown --opt-level 'O7'"),
                          (["--precision", "fp16", "--loss-scale", "-3"], "loss-scale")):
        rc, out, err = run("train", "--data", "synthetic", *flags)
        check(rc == 2 and needle in err and out == "", f"{flags}: {rc} {err!r}")

    # A language model: validation loss and perplexity, tokens/s, gradient accumulation, and the
    # eval of its checkpoint.
    lm = ["train", "--model", "gpt2_tiny", "--data", "synthetic-text", "--synthetic-size", "20000",
          "--vocab-size", "64", "--seq-len", "16", "--batch-size", "8", "--grad-accum", "2",
          "--optimizer", "adamw", "--lr", "3e-3", "--steps", "12", "--eval-every", "6",
          "--eval-batches", "2", "--threads", "2", "--no-progress"]
    ckpt3 = os.path.join(tmp, "lm.safetensors")
    rc, out, err = run(*lm, "--checkpoint", ckpt3)
    check(rc == 0 and "validation loss" in out and "perplexity" in out and "tokens/s" in out,
          f"gpt2_tiny run ({rc}): {out!r} {err[-300:]!r}")
    check("eval at step 6: val loss" in err and "perplexity" in err,
          f"--eval-every prints the evaluation: {err[-600:]!r}")
    rc, out, err = run("eval", "--checkpoint", ckpt3)
    check(rc == 0 and "perplexity" in out and "tokens" in out, f"eval of an LM ({rc}): {out!r} {err!r}")
    rc, out, err = run("train", "--model", "gpt2_tiny", "--data", "fashion-mnist")
    check(rc == 2 and "trains on tokens" in err and out == "", f"gpt2_tiny on images: {rc} {err!r}")

    # Text end to end: tokenize a corpus, train on its shards, generate from the checkpoint
    # (the same seed gives the same text; a checkpoint of an image model is refused).
    corpus = os.path.join(tmp, "corpus.txt")
    with open(corpus, "w") as f:
        for i in range(200):
            f.write(f"The cat number {i} sat on the mat and looked at the dog.\n%\n")
    shards = os.path.join(tmp, "shards")
    rc, out, err = run("tokenize", "--input", corpus, "--out", shards, "--vocab-size", "300")
    check(rc == 0, f"tokenize ({rc}): {err[-300:]!r}")
    ckpt4 = os.path.join(tmp, "text.safetensors")
    rc, out, err = run("train", "--model", "gpt2_tiny", "--data", "text", "--data-path", shards,
                       "--seq-len", "16", "--batch-size", "8", "--optimizer", "adamw", "--steps",
                       "5", "--threads", "2", "--no-progress", "--checkpoint", ckpt4)
    check(rc == 0 and "perplexity" in out, f"train on shards ({rc}): {out!r} {err[-300:]!r}")
    gen = ["generate", "--checkpoint", ckpt4, "--prompt", "The cat", "--max-tokens", "8",
           "--json"]
    rc1, out1, err1 = run(*gen, "--seed", "1")
    rc2, out2, _ = run(*gen, "--seed", "1")
    sample = json.loads(out1) if rc1 == 0 else {}
    again = json.loads(out2) if rc2 == 0 else {}
    check(rc1 == 0 and rc2 == 0 and sample.get("completion") == again.get("completion")
          and sample.get("prompt") == "The cat"
          and 0 < sample.get("tokens", 0) <= 8, f"generate is deterministic ({rc1}): {out1!r} {err1!r}")
    rc, out, err = run("generate", "--checkpoint", ckpt4, "--prompt", "The", "--max-tokens", "5")
    check(rc == 0 and out.startswith("The"), f"generate streams the text ({rc}): {out!r} {err!r}")
    rc, out, err = run("generate", "--checkpoint", ckpt, "--prompt", "x")
    check(rc == 2 and "image model" in err, f"generate from an image model: {rc} {err!r}")
    rc, out, err = run(*gen, "--max-tokens", "0")
    check(rc == 2 and "--max-tokens" in err, f"generate --max-tokens 0: {rc} {err!r}")

    # bench: one JSON row per precision; under autocast the weight-cast cache makes each
    # parameter's bf16 copy once per step, fp32 makes none. The LSTM's recurrent weights are read
    # by one op per layer (lstm_sequence), not one GEMM per time step: no weight is cast twice, so
    # the cache has no hits to count (it had one per step and layer when the steps were ops).
    rc, out, err = run("bench", "--model", "lstm", "--precision", "fp32,bf16", "--steps", "1",
                       "--warmup", "0", "--batch-size", "4", "--seq-len", "8", "--json")
    rows = [json.loads(line) for line in out.splitlines()] if rc == 0 else []
    check(len(rows) == 2 and rows[0]["weight_casts_per_step"] == 0
          and rows[1]["weight_casts_per_step"] > 0
          and rows[1]["cast_cache_hits_per_step"] == 0,
          f"bench --json cast-cache counts ({rc}): {out!r} {err[-300:]!r}")
    # --device: recorded in the summary; a bad name or a missing GPU is one line and exit 2.
    check(result.get("device") == "cpu", f"the summary names the device: {result}")
    rc, out, err = run("train", *small, "--steps", "2", "--device", "cpu", "--json")
    check(rc == 0 and json.loads(out).get("device") == "cpu", f"--device cpu ({rc}): {err[-300:]!r}")
    rc, out, err = run("eval", "--checkpoint", ckpt, "--device", "cpu", "--json")
    check(rc == 0 and json.loads(out).get("device") == "cpu", f"eval --device cpu ({rc}): {err!r}")
    for cmd in (["train", *small, "--steps", "2"], ["eval", "--checkpoint", ckpt],
                ["bench", "--steps", "1", "--warmup", "0"]):
        rc, out, err = run(*cmd, "--device", "tpu")
        check(rc == 2 and "tpu" in err and "cuda:N" in err and out == "",
              f"{cmd[0]} --device tpu: {rc} {err!r}")
    _, info, _ = run("info")
    if "cuda devices: 0 " in info:
        for cmd in (["train", *small, "--steps", "2"], ["eval", "--checkpoint", ckpt],
                    ["bench", "--steps", "1", "--warmup", "0"]):
            rc, out, err = run(*cmd, "--device", "cuda")
            lines = err.strip().splitlines()
            check(rc == 2 and len(lines) == 1 and "no CUDA device" in err
                  and "run with --device cpu" in err and out == "",
                  f"{cmd[0]} --device cuda without a GPU: {rc} {err!r}")

    # A run that diverges stops with exit status 3 and one message: what happened at which step,
    # the last good checkpoint, what may help; it writes no summary and keeps the checkpoint.
    boom = os.path.join(tmp, "boom.safetensors")
    boom_metrics = os.path.join(tmp, "boom.jsonl")
    rc, out, err = run("train", *small, "--epochs", "2", "--lr", "1e4", "--checkpoint", boom,
                       "--checkpoint-every", "2", "--metrics", boom_metrics)
    records = [json.loads(line) for line in open(boom_metrics)] if os.path.exists(boom_metrics) else []
    kinds = [r["kind"] for r in records]
    check(rc == 3 and "the run diverged: step" in err and "the loss is NaN" in err
          and "the last good state is step 2 in " + boom in err and "--on-divergence rollback" in err
          and "summary" not in kinds and "divergence" in kinds and os.path.exists(boom),
          f"a diverged run ({rc}): {err[-600:]!r} {kinds}")
    rc, out, err = run("train", *small, "--steps", "2", "--on-divergence", "rollback")
    check(rc == 2 and "give --checkpoint FILE" in err, f"rollback without --checkpoint: {rc} {err!r}")

print("all train CLI checks passed" if not failures else f"{len(failures)} train CLI checks failed")
sys.exit(1 if failures else 0)
