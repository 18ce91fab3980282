#!/usr/bin/env python3
"""`mantissa clicks` and `mantissa train --model dcn` as a user runs them (small runs)."""
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


quick = ["--threads", "2", "--workers", "0", "--batch-size", "128", "--hash-buckets", "1000",
         "--no-progress"]
with tempfile.TemporaryDirectory() as tmp:
    log = os.path.join(tmp, "clicks.tsv")
    rc, out, err = run("clicks", "--out", log, "--examples", "3000", "--seed", "4",
                       "--hash-buckets", "1000")
    check(rc == 0 and "wrote 3000 examples" in out and "log loss" in out,
          f"clicks writes the log ({rc}): {out!r} {err[-300:]!r}")
    lines = open(log).read().splitlines() if os.path.exists(log) else []
    check(len(lines) == 3000 and len(lines[0].split("\t")) == 40, "a Criteo-layout TSV")

    # The file and the in-memory log are the same data: the same run on both ends the same.
    rc, out, err = run("train", "--model", "dcn", "--data", "clicks", "--data-path", log,
                       "--seed", "4", "--steps", "15", "--json", *quick)
    check(rc == 0, f"train on the file exits 0 ({rc}): {err[-500:]}")
    from_file = json.loads(out) if rc == 0 else {}
    rc, out, err = run("train", "--model", "dcn", "--data", "synthetic-clicks",
                       "--synthetic-size", "3000", "--seed", "4", "--steps", "15", "--json", *quick)
    check(rc == 0, f"train on synthetic-clicks exits 0 ({rc}): {err[-500:]}")
    in_memory = json.loads(out) if rc == 0 else {}
    check(from_file.get("steps") == 15 and "bayes_log_loss" not in from_file,
          f"a real log has no Bayes figure: {from_file}")
    check(in_memory.get("log_loss") is not None and
          abs(in_memory.get("log_loss", 0) - from_file.get("log_loss", 1)) < 1e-12,
          f"file and memory agree: {from_file.get('log_loss')} vs {in_memory.get('log_loss')}")
    check(in_memory.get("bayes_log_loss", 0) < in_memory.get("constant_log_loss", 0),
          f"the Bayes log loss is below the constant predictor's: {in_memory}")

    # The progress lines and the final line.
    rc, out, err = run("train", "--model", "dcn", "--data", "synthetic-clicks",
                       "--synthetic-size", "3000", "--steps", "20", "--log-every", "10",
                       "--precision", "bf16", "--threads", "2", "--workers", "0",
                       "--hash-buckets", "1000", "--batch-size", "128")
    check(rc == 0 and "step 10/20" in err and "held-out log loss" in err,
          f"progress lines ({rc}): {err[-500:]!r}")
    check("held-out log loss" in out and "Bayes" in out and "bf16 O1" in out,
          f"the final line: {out!r}")

    # Mistakes: exit 2 and one clear message.
    rc, _, err = run("train", "--model", "dcn", "--data", "clicks")
    check(rc == 2 and "--data-path" in err, f"clicks without a path: {rc} {err!r}")
    bad = os.path.join(tmp, "bad.tsv")
    with open(bad, "w") as f:
        f.write("1\t2\ta\n0\tx\tb\n")
    rc, _, err = run("train", "--model", "dcn", "--data", "clicks", "--data-path", bad, *quick)
    check(rc == 2 and "bad.tsv:2:" in err and "not a number" in err, f"a bad line: {rc} {err!r}")
    rc, _, err = run("train", "--model", "dcn", "--data", "synthetic")
    check(rc == 2 and "synthetic-clicks" in err, f"image data for dcn: {rc} {err!r}")
    rc, _, err = run("train", "--model", "cnn", "--data", "synthetic-clicks")
    check(rc == 2 and "images" in err, f"click data for cnn: {rc} {err!r}")

sys.exit(1 if failures else 0)
