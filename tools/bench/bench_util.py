"""What the side-by-side benchmark scripts share: the repository root, the common options, running
a benchmark command that prints JSON, alternating per-op runs of two sides, and timing a step
(the median after a warm-up)."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def add_compare_options(ap, steps):
    """The options of a mantissa-vs-PyTorch comparison script."""
    ap.add_argument("--torch-python",
                    default=os.environ.get("TORCH_PYTHON", "/work/torchenv/bin/python"))
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=steps)


def bench_env():
    """The environment of a benchmark process: this one's, without OMP_WAIT_POLICY. Both sides
    use OpenMP, and the test scripts' passive waiting (threads sleep between parallel regions)
    makes every fork a wake-up: a 2-thread LSTM step, made of many small parallel ops per time
    step, took 400 ms instead of 160. Both sides run with the OpenMP default."""
    env = dict(os.environ)
    env.pop("OMP_WAIT_POLICY", None)
    return env


def mpi_parser(doc):
    """The argument parser of a script that runs `mantissa train` alone and under mpirun: --build
    (where the binary is) and --mpirun; the script adds its own options."""
    ap = argparse.ArgumentParser(description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--mpirun", default="mpirun")
    return ap


def mantissa_binary(build):
    """The `mantissa` binary of a build directory; exits saying to build when it is missing."""
    binary = os.path.join(build, "mantissa")
    if not os.path.exists(binary):
        sys.exit(f"{binary} is missing: build first (scripts/setup)")
    return binary


# mpirun as the tests run it (tests/CMakeLists.txt explains each flag).
MPIRUN_FLAGS = ["--allow-run-as-root", "--oversubscribe", "--bind-to", "none"]


def run_json(cmd):
    """Runs a benchmark command (`mantissa train --json`, bench, or either under mpirun) and
    returns the JSON object on its last output line that holds one; raises RuntimeError with the
    command and the end of its stderr when it fails."""
    r = subprocess.run(cmd, capture_output=True, text=True, env=bench_env())
    lines = [line for line in r.stdout.splitlines() if line.startswith("{")]
    if r.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stderr[-3000:]}")
    return json.loads(lines[-1])


def write_rows(path, rows):
    """A benchmark's rows as JSON (--json-out), when a path is given."""
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)


def run_lines(cmd):
    """Runs a one-thread benchmark command and returns the JSON objects it printed, one a line."""
    env = bench_env()
    env["OMP_NUM_THREADS"] = "1"
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stderr[-3000:]}")
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def best_per_op(sides, rounds, fields):
    """Runs each side's command (sides: name -> argv; each prints one JSON row per op with an
    "op" key, and a last row with "peak_rss_bytes") `rounds` times, alternating the sides.
    Returns (best, rss, ops): best[(side, op, field)] is the smallest value of each field over
    the rounds, rss[side] the largest peak RSS, ops the ops in their first order."""
    best, rss, ops = {}, {}, []
    for _ in range(rounds):
        for side, cmd in sides.items():
            for row in run_lines(cmd):
                if "peak_rss_bytes" in row:
                    rss[side] = max(rss.get(side, 0), row["peak_rss_bytes"])
                    continue
                if row["op"] not in ops:
                    ops.append(row["op"])
                for field in fields:
                    key = (side, row["op"], field)
                    best[key] = min(best.get(key, float("inf")), row[field])
    return best, rss, ops


def median_ms(step, warmup, steps):
    """Milliseconds of the median of `steps` calls of step(), after `warmup` untimed ones."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3
