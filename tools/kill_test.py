#!/usr/bin/env python3
"""Kill a training run at random moments and resume it, again and again: after every `kill -9`
the newest checkpoint must load, and the run resumed from it, killed again and so on, must end
with the very tensors (byte for byte) of a run that was never killed.

  python3 tools/kill_test.py BUILD/mantissa [--kills 30] [--seed 1] [--steps-per-epoch 64]

The run: an mlp on synthetic images, fp16 O2 with AdamW and dropout (master weights, the loss
scaler's state and the random generator all in the checkpoint), 2 epochs, a checkpoint every 4
steps besides each epoch's end. Kill moments are drawn uniformly over a run's expected length,
so some land in a step, some while a checkpoint is being written (its temporary file is then
left behind, and counted). Prints one line per kill and a summary; exits non-zero on any
mismatch. CTest runs it as `kill_resume` (label reliability).
"""
import argparse
import glob
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

from checkpoint_file import differing, state as state_of


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("binary")
    ap.add_argument("--kills", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps-per-epoch", type=int, default=64)
    args = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    rng = random.Random(args.seed)
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)
            print("FAIL:", what, flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        run = ["train", "--data", "synthetic", "--synthetic-size", str(32 * args.steps_per_epoch),
               "--model", "mlp", "--batch-size", "32", "--epochs", "2", "--threads", "1",
               "--workers", "0", "--no-progress", "--optimizer", "adamw", "--lr", "1e-3",
               "--precision", "fp16", "--opt-level", "O2", "--dropout", "0.1",
               "--checkpoint-every", "4"]
        ref = os.path.join(tmp, "ref", "run.safetensors")
        os.makedirs(os.path.dirname(ref))
        t0 = time.time()
        p = subprocess.run([args.binary, *run, "--checkpoint", ref], capture_output=True,
                           text=True, env=env, timeout=600)
        length = time.time() - t0
        check(p.returncode == 0, f"the uninterrupted run ({p.returncode}): {p.stderr[-500:]}")
        print(f"uninterrupted run: {length:.2f} s", flush=True)

        work = os.path.join(tmp, "killed")
        os.makedirs(work)
        ckpt = os.path.join(work, "run.safetensors")
        kills = torn = restarts = finished = 0

        def finish_chain(how):
            """A chain of kills and resumes that reached the end: it must match, then the next
            chain starts from scratch."""
            nonlocal finished
            differ = differing(ref, ckpt)
            check(not differ, f"a killed-and-resumed run ({how}) ends differently: {differ[:5]}")
            finished += 1
            os.remove(ckpt)

        while kills < args.kills:
            if os.path.exists(ckpt) and state_of(ckpt)["epoch"] >= 2:
                finish_chain("killed after its last checkpoint")
            cmd = ([args.binary, "train", "--resume", ckpt, "--no-progress"]
                   if os.path.exists(ckpt) else [args.binary, *run, "--checkpoint", ckpt])
            restarts += not os.path.exists(ckpt)
            job = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   text=True, env=env)
            time.sleep(rng.uniform(0.05, 0.6 * length))
            if job.poll() is not None:
                # Finished before the kill.
                check(job.returncode == 0, f"a resumed run failed ({job.returncode}): "
                                           f"{job.stderr.read()[-500:]}")
                if job.returncode != 0:
                    break
                finish_chain("finished before the next kill")
                continue
            job.send_signal(signal.SIGKILL)
            job.wait()
            kills += 1
            leftovers = [f for f in glob.glob(ckpt + ".tmp.*")]
            torn += bool(leftovers)
            for f in leftovers:
                os.remove(f)
            if os.path.exists(ckpt):
                try:
                    s = state_of(ckpt)
                    differing(ckpt, ckpt)  # reads every tensor
                    where = f"step {s['step']} (epoch {s['epoch']}, batch {s['batch']})"
                except Exception as e:  # noqa: BLE001 - any failure to read is the finding
                    check(False, f"kill {kills}: the newest checkpoint does not load: {e}")
                    break
            else:
                where = "before the first checkpoint"
            print(f"kill {kills:2d}: newest checkpoint at {where}"
                  f"{', a checkpoint was being written' if leftovers else ''}", flush=True)
        # The last chain runs to the end.
        if not (os.path.exists(ckpt) and state_of(ckpt)["epoch"] >= 2):
            cmd = ([args.binary, "train", "--resume", ckpt, "--no-progress"]
                   if os.path.exists(ckpt) else [args.binary, *run, "--checkpoint", ckpt])
            p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
            check(p.returncode == 0, f"the final resume ({p.returncode}): {p.stderr[-500:]}")
        if os.path.exists(ckpt):
            finish_chain("the last")
        print(f"{kills} kills ({torn} while a checkpoint was being written, {restarts} runs "
              f"started from scratch); {finished} killed-and-resumed runs reached the end, "
              f"{'all byte-identical' if not failures else 'NOT ALL identical'} to the "
              f"uninterrupted run's", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
