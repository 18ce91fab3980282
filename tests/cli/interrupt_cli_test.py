#!/usr/bin/env python3
"""`mantissa train` stopped by Ctrl-C (SIGINT) or SIGTERM, as a user stops it: the run ends after
the step under way with exit status 130 / 143, writes a checkpoint of the state mid-epoch, prints
the command that continues it; continued, it ends with the very tensors an uninterrupted run
ends with (byte for byte). A second Ctrl-C ends the process at once and leaves the last
checkpoint whole. Resuming a run that is already complete says so and what to pass, instead of
reporting an evaluation it never made.

  interrupt_cli_test.py MANTISSA
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from checkpoint_file import differing, state  # noqa: E402

BIN = sys.argv[1]
ENV = dict(os.environ, OMP_NUM_THREADS="1")
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


# 2 epochs of 128 steps: long enough to be stopped mid-epoch, short to finish.
RUN = ["train", "--data", "synthetic", "--synthetic-size", "4096", "--model", "mlp",
       "--batch-size", "32", "--epochs", "2", "--threads", "1", "--workers", "0",
       "--no-progress", "--optimizer", "adamw", "--lr", "1e-3", "--precision", "fp16",
       "--opt-level", "O2", "--dropout", "0.1", "--log-every", "1"]


def started(metrics, steps):
    """Waits until the run's metrics show `steps` train records (at most 60 s)."""
    deadline = time.time() + 60
    while time.time() < deadline:
        if os.path.exists(metrics):
            n = sum(1 for line in open(metrics) if '"kind":"train"' in line)
            if n >= steps:
                return True
        time.sleep(0.02)
    return False


with tempfile.TemporaryDirectory() as tmp:
    whole = os.path.join(tmp, "whole.safetensors")
    p = subprocess.run([BIN, *RUN, "--checkpoint", whole], capture_output=True, text=True,
                       env=ENV, timeout=300)
    check(p.returncode == 0, f"the uninterrupted run ({p.returncode}): {p.stderr[-500:]}")

    # Resuming a finished run: nothing to train, so no result, but what to pass.
    p = subprocess.run([BIN, "train", "--resume", whole, "--no-progress"], capture_output=True,
                       text=True, env=ENV, timeout=120)
    check(p.returncode == 2 and "already complete" in p.stderr and "--epochs" in p.stderr
          and "accuracy" not in p.stdout,
          f"resuming a finished run says so ({p.returncode}): {p.stderr!r} {p.stdout!r}")

    for sig, code, name in ((signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 143, "SIGTERM")):
        ckpt = os.path.join(tmp, f"stopped-{name}.safetensors")
        metrics = os.path.join(tmp, f"metrics-{name}.jsonl")
        job = subprocess.Popen([BIN, *RUN, "--checkpoint", ckpt, "--metrics", metrics],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
        # Early in the first of 256 steps: the signal arrives long before the run would end.
        check(started(metrics, 5), f"{name}: the run started")
        job.send_signal(sig)
        out, err = job.communicate(timeout=60)
        check(job.returncode == code, f"{name}: exit status {job.returncode}, not {code}: {err[-500:]}")
        check(f"{os.path.realpath(BIN)} train --resume {ckpt}" in err,
              f"{name}: the message gives the command that continues: {err[-500:]!r}")
        check("stopped after step" in err and "test acc" not in err,
              f"{name}: says where it stopped, and reports no evaluation it did not make: "
              f"{err[-500:]!r}")
        check(not any(l.startswith("{") for l in out.splitlines()),
              f"{name}: no result printed for a stopped run: {out!r}")
        summaries = [l for l in open(metrics) if '"kind":"summary"' in l]
        check(not summaries, f"{name}: no summary record for a stopped run")
        if not os.path.exists(ckpt):
            check(False, f"{name}: no checkpoint written")
            continue
        where = state(ckpt)
        check(0 < where["batch"] < 128, f"{name}: stopped mid-epoch: {where}")
        print(f"{name}: stopped at step {where['step']} (epoch {where['epoch']}, batch "
              f"{where['batch']}), exit {job.returncode}")
        p = subprocess.run([BIN, "train", "--resume", ckpt, "--no-progress"],
                           capture_output=True, text=True, env=ENV, timeout=300)
        check(p.returncode == 0, f"{name}: the resumed run ({p.returncode}): {p.stderr[-500:]}")
        differ = differing(whole, ckpt)
        check(not differ, f"{name}: stopped and continued, the run ends byte for byte as one "
                          f"that was not stopped ({differ[:5]})")

    # Ctrl-C twice: out at once, the checkpoint of the first epoch still whole.
    ckpt = os.path.join(tmp, "twice.safetensors")
    metrics = os.path.join(tmp, "metrics-twice.jsonl")
    endless = [("1000" if a == "2" else a) for a in RUN]  # --epochs 1000: it cannot end first
    job = subprocess.Popen([BIN, *endless, "--checkpoint", ckpt, "--metrics", metrics],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    check(started(metrics, 140), "twice: the run reached its second epoch")
    job.send_signal(signal.SIGINT)
    job.send_signal(signal.SIGINT)
    t0 = time.time()
    job.communicate(timeout=60)
    check(job.returncode in (-signal.SIGINT, 130),
          f"twice: ended by the signal ({job.returncode})")
    print(f"twice: ended {time.time() - t0:.2f} s after the second Ctrl-C, exit {job.returncode}")
    if os.path.exists(ckpt):
        p = subprocess.run([BIN, "eval", "--checkpoint", ckpt], capture_output=True, text=True,
                           env=ENV, timeout=120)
        check(p.returncode == 0, f"twice: the last checkpoint loads ({p.returncode}): {p.stderr}")
    else:
        check(False, "twice: the first epoch's checkpoint is missing")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("ok")
