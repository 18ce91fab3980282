#!/usr/bin/env python3
"""`mpirun -n 2 mantissa train --distributed` as a user runs it, on this machine's real mpirun:
one result line (rank 0's), one metrics file with the world size, a checkpoint that resumes in
one process; ranks started with different configurations refuse to train, and so do ranks
started without --distributed (two whole runs writing the same files); a rank killed with
SIGKILL makes the job stop, non-zero, within 30 s, with a message naming the rank. With --zero 1
(ZeRO-1, 2, 3) the checkpoint holds the same tensors as without, bit for bit, the optimizer state per
rank is smaller, and a sharded run resumes to the same result as an unsharded one.

  distributed_cli_test.py MANTISSA MPIRUN [MPIRUN_FLAGS...]
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from checkpoint_file import differing, state  # noqa: E402

BIN, MPIRUN, FLAGS = sys.argv[1], sys.argv[2], sys.argv[3:]
failures = []
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def mpirun(*ranks, timeout=240):
    """ranks: one argument list per rank group (MPMD), each run by -n 1."""
    cmd = [MPIRUN, *FLAGS]
    for i, args in enumerate(ranks):
        cmd += ([":"] if i else []) + ["-n", "1", BIN, *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)
    return p.returncode, p.stdout, p.stderr


small = ["train", "--data", "synthetic", "--synthetic-size", "2048", "--model", "mlp",
         "--batch-size", "32", "--threads", "1", "--workers", "0", "--no-progress",
         "--distributed"]
with tempfile.TemporaryDirectory() as tmp:
    ckpt = os.path.join(tmp, "run.safetensors")
    metrics = os.path.join(tmp, "metrics.jsonl")
    args = small + ["--epochs", "1", "--json", "--checkpoint", ckpt, "--metrics", metrics]
    rc, out, err = mpirun(args, args)
    check(rc == 0, f"2 ranks train ({rc}): {err[-800:]}")
    lines = [l for l in out.splitlines() if l.startswith("{")]
    check(len(lines) == 1, f"only rank 0 prints the result: {out!r}")
    result = json.loads(lines[0]) if lines else {}
    check(result.get("world_size") == 2 and result.get("comm", {}).get("buckets", 0) >= 1,
          f"the result names the world and the communication: {result}")
    # 2048 examples, 2 ranks x 32: 32 steps an epoch.
    check(result.get("steps") == 32, f"an epoch is 2048 / (2 x 32) steps: {result.get('steps')}")
    summaries = [json.loads(l) for l in open(metrics)] if os.path.exists(metrics) else []
    check(sum(1 for r in summaries if r.get("kind") == "summary") == 1,
          "one summary record: rank 0 alone writes metrics")
    check(err.count("epoch 1/1") == 1, f"one epoch line, rank 0's: {err[-500:]!r}")

    # The 2-rank checkpoint goes on in one process.
    p = subprocess.run([BIN, "train", "--resume", ckpt, "--epochs", "2", "--json",
                        "--no-progress"], capture_output=True, text=True, env=ENV, timeout=240)
    check(p.returncode == 0 and json.loads(p.stdout).get("steps", 0) > 32,
          f"a 2-rank checkpoint resumes on 1 rank ({p.returncode}): {p.stderr[-500:]}")

    # ZeRO-1 and 2: AdamW with fp32 masters (bf16 O2), the state (and the gradients) sharded;
    # everything else as without.
    results, ckpts = {}, {}
    for zero in ("0", "1", "2", "3"):
        ckpts[zero] = os.path.join(tmp, f"zero{zero}.safetensors")
        zargs = small + ["--optimizer", "adamw", "--lr", "1e-3", "--precision", "bf16",
                         "--opt-level", "O2", "--epochs", "1", "--json", "--zero", zero,
                         "--checkpoint", ckpts[zero]]
        rc, out, err = mpirun(zargs, zargs)
        check(rc == 0, f"2 ranks train with --zero {zero} ({rc}): {err[-800:]}")
        lines = [l for l in out.splitlines() if l.startswith("{")]
        results[zero] = json.loads(lines[0]) if lines else {}
    if all(results.values()):
        for zero in ("1", "2", "3"):
            check(results[zero]["test_loss"] == results["0"]["test_loss"],
                  f"ZeRO-{zero} trains as plain data parallel: {results[zero]['test_loss']} vs "
                  f"{results['0']['test_loss']}")
        s0, s1 = results["0"]["optimizer_state_bytes"], results["1"]["optimizer_state_bytes"]
        check(s1 < s0, f"ZeRO-1 holds less optimizer state per rank: {s1} vs {s0}")
        # (The peaks include the checkpoint's gather, the same for both.)
        p1, p2 = results["1"]["peak_memory_bytes"], results["2"]["peak_memory_bytes"]
        check(p2 < p1, f"ZeRO-2 holds less memory at its peak per rank than ZeRO-1: {p2} vs {p1}")
        print(f"mlp bf16 O2 AdamW, 2 ranks: optimizer state per rank {s0} B -> {s1} B (ZeRO-1); "
              f"peak {results['0']['peak_memory_bytes']} B, {p1} B (ZeRO-1), {p2} B (ZeRO-2)")
    if all(os.path.exists(c) for c in ckpts.values()):
        for zero in ("1", "2", "3"):
            differ = differing(ckpts["0"], ckpts[zero])
            check(not differ, f"a ZeRO-{zero} checkpoint holds the unsharded run's tensors, bit "
                  f"for bit: {differ[:5]}")
        # Resumed, sharded or not, from any of the checkpoints: the same run.
        finals = []
        # (A resume writes its own checkpoint over the one it read: the ZeRO-2 one twice, copied.)
        again = os.path.join(tmp, "zero2-again.safetensors")
        shutil.copyfile(ckpts["2"], again)
        for zero, ck in (("0", ckpts["0"]), ("1", ckpts["1"]), ("2", ckpts["2"]), ("3", ckpts["3"]),
                         ("0", again)):
            rargs = ["train", "--resume", ck, "--epochs", "2", "--json", "--no-progress",
                     "--distributed", "--zero", zero, "--threads", "1", "--workers", "0"]
            rc, out, err = mpirun(rargs, rargs)
            check(rc == 0, f"resume with --zero {zero} ({rc}): {err[-500:]}")
            lines = [l for l in out.splitlines() if l.startswith("{")]
            finals.append(json.loads(lines[0]).get("test_loss") if lines else None)
        check(finals[0] is not None and all(f == finals[0] for f in finals),
              f"resumed with and without ZeRO-1, 2 and 3: the same result {finals}")
    p = subprocess.run([BIN, *small[:-1], "--steps", "2", "--zero", "1"], capture_output=True,
                       text=True, env=ENV, timeout=60)
    check(p.returncode != 0 and "--zero" in p.stderr and "--distributed" in p.stderr,
          f"--zero without --distributed is refused, naming both ({p.returncode}): {p.stderr!r}")

    # Ctrl-C on mpirun: it passes SIGTERM to the ranks, which agree to stop after the same step,
    # write one checkpoint and say how to continue; the job then resumes to its end.
    stop_ckpt = os.path.join(tmp, "stopped.safetensors")
    stop_metrics = os.path.join(tmp, "stopped.jsonl")
    # Epochs enough that it cannot end before the signal arrives, however fast the machine.
    sargs = [("8192" if a == "2048" else a) for a in small] + ["--epochs", "1000", "--zero", "1",
                     "--checkpoint", stop_ckpt, "--metrics", stop_metrics, "--log-every", "1"]
    job = subprocess.Popen([MPIRUN, *FLAGS, "-n", "2", BIN, *sargs], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env=ENV)
    deadline = time.time() + 60
    while time.time() < deadline and job.poll() is None and not (
            os.path.exists(stop_metrics) and
            sum(1 for l in open(stop_metrics) if '"kind":"train"' in l) >= 20):
        time.sleep(0.05)
    job.send_signal(signal.SIGINT)
    output, _ = job.communicate(timeout=60)
    # The command that continues names the checkpoint and gives again the options of how this
    # launch ran (a resumed run takes those from its own command line, not the checkpoint).
    cont = [l for l in output.splitlines() if "--resume " + stop_ckpt in l]
    check(os.path.exists(stop_ckpt) and cont and cont[0].strip().startswith("mpirun -n 2 ") and
          all(f in cont[0] for f in (" --distributed", " --zero 1", " --no-progress")),
          f"Ctrl-C on mpirun: a checkpoint and the command that continues: {output[-800:]!r}")
    check(output.count("stopped after step") == 1, f"one rank reports the stop: {output[-800:]!r}")
    # Resumed to the end of the epoch it stopped in (8192 / (2 x 32) = 128 steps an epoch).
    epoch = state(stop_ckpt)["epoch"] if os.path.exists(stop_ckpt) else 0
    rargs = ["train", "--resume", stop_ckpt, "--epochs", str(epoch + 1), "--distributed",
             "--zero", "1", "--json", "--no-progress", "--threads", "1", "--workers", "0"]
    rc, out, err = mpirun(rargs, rargs)
    lines = [l for l in out.splitlines() if l.startswith("{")]
    check(rc == 0 and lines and json.loads(lines[0]).get("steps") == 128 * (epoch + 1),
          f"the stopped job resumes to the end of its epoch ({rc}): {err[-500:]}")

    # Ranks started differently refuse, naming why.
    rc, out, err = mpirun(small + ["--steps", "5", "--lr", "0.1"],
                          small + ["--steps", "5", "--lr", "0.2"])
    check(rc != 0 and "different training configurations" in err and "2-rank job" in err,
          f"mismatched ranks are refused ({rc}): {err[-500:]!r}")

    # mpirun without --distributed would start two whole runs writing the same files: refused.
    alone = [a for a in small if a != "--distributed"] + ["--steps", "2", "--checkpoint", ckpt]
    before = os.path.getmtime(ckpt)
    rc, out, err = mpirun(alone, alone)
    check(rc != 0 and "--distributed is not given" in err and os.path.getmtime(ckpt) == before,
          f"mpirun without --distributed is refused, nothing written ({rc}): {err[-500:]!r}")

    # A rank killed mid-run: the job stops within 30 s, non-zero, the rank named.
    long_run = small[:] + ["--epochs", "100000"]  # runs until it is killed
    cmd = [MPIRUN, *FLAGS, "-n", "2", BIN, *long_run]
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=ENV)
    victim = None
    deadline = time.time() + 60
    while victim is None and time.time() < deadline and job.poll() is None:
        time.sleep(0.5)
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                environ = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
                exe = os.readlink(f"/proc/{pid}/exe")
            except OSError:
                continue
            if os.path.basename(exe) == "mantissa" and b"OMPI_COMM_WORLD_RANK=1" in environ:
                victim = int(pid)
    check(victim is not None, "found rank 1's process")
    if victim is not None:
        time.sleep(3)  # training is under way
        os.kill(victim, signal.SIGKILL)
        t0 = time.time()
        try:
            output, _ = job.communicate(timeout=30)
            took = time.time() - t0
            check(job.returncode != 0, f"the job exits non-zero after a rank dies ({job.returncode})")
            check("rank 1" in output, f"the message names the rank: {output[-800:]!r}")
            # The launcher's SIGTERM to the survivor: it cannot promise a checkpoint.
            check("writing a checkpoint (again" not in output,
                  f"the survivor promises no checkpoint it cannot write: {output[-800:]!r}")
            print(f"killed rank 1: the job stopped {took:.1f} s later, exit {job.returncode}")
        except subprocess.TimeoutExpired:
            job.kill()
            check(False, "the job still ran 30 s after rank 1 was killed")
    else:
        job.kill()

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("ok")
