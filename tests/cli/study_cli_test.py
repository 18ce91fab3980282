#!/usr/bin/env python3
"""`mantissa study --quick` as a user runs it: every family trains and its loss falls, the
underflow picture is recorded, results.json holds every cell, the report's tables equal what
results.json says (recomputed here), its PNGs are real images, a rerun reruns nothing and a
removed cell alone is rerun; mistakes get a clear message.

usage: study_cli_test.py MANTISSA [--models LIST]
  --models LIST  the families of the quick run (default: all seven); the sanitizer build names a
                 few, as the whole quick matrix under ASan takes longer than CI allows
"""
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile
import time

BIN = sys.argv[1]
MODELS = sys.argv[sys.argv.index("--models") + 1].split(",") if "--models" in sys.argv else []
failures = []


def run(*args, timeout=600):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def png_size(path):
    """(width, height) of a PNG file, from its signature and IHDR chunk."""
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n" or head[12:16] != b"IHDR":
        return None
    return struct.unpack(">II", head[16:24])


def last_metric(cell, metric):
    for r in reversed(cell.get("eval", [])):
        if r.get(metric) is not None:
            return r[metric]
    return None


# ---- mistakes first: nothing runs, the message says what to do
rc, _, err = run("study", "--models", "mlp,nope", "--out", "/nonexistent/x")
check(rc == 2 and "no model family 'nope'" in err and "gpt2_tiny" in err,
      f"an unknown family is named with the choices: rc {rc}, {err!r}")
rc, _, err = run("study", "--recipes", "fp64")
check(rc == 2 and "no recipe 'fp64'" in err and "bf16-O2-trunc" in err,
      f"an unknown recipe is named with the choices: rc {rc}, {err!r}")
rc, _, err = run("study", "--seeds", "0")
check(rc == 2 and "--seeds" in err, f"--seeds 0 is refused: rc {rc}, {err!r}")

with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "study")
    # The time/memory ladder on the CPU: its three rungs that apply there (30 steps each).
    args = ["study", "--quick", "--out", out, "--threads", "1", "--ladder", "cpu"]
    if MODELS:
        args += ["--models", ",".join(MODELS)]
    t0 = time.time()
    rc, _, err = run(*args)
    first_seconds = time.time() - t0
    print(f"study --quick: {first_seconds:.0f} s")
    check(rc == 0, f"study --quick exits 0: {err[-2000:]}")
    results = json.load(open(os.path.join(out, "results.json")))
    families = results["families"]
    check(not MODELS or [f["name"] for f in families] == MODELS,
          f"the families asked for: {[f['name'] for f in families]}")
    recipes = [r["name"] for r in results["recipes"]]
    check(recipes == ["fp32", "bf16-O1", "bf16-O2-trunc", "fp16-O1", "fp16-noscale"],
          f"--quick's recipes: {recipes}")
    cells = [c for c in results["cells"] if not c["probe"]]
    check(len(cells) == len(families) * len(recipes),
          f"{len(cells)} cells for {len(families)} families x {len(recipes)} recipes")
    for c in cells:
        name = f"{c['model']} {c['recipe']}"
        check(c["status"] == "ok", f"{name}: status {c['status']} {c.get('message', '')}")
        # Training makes progress: the mean of the last third of the logged losses is below the
        # first logged loss. A GAN's two losses pull against each other (their sum need not
        # fall): its discriminator's loss falls, and so does the Fréchet distance.
        key = "loss_d" if c["model"] == "dcgan" else "loss"
        losses = [r[key] for r in c["train"] if r.get(key) is not None]
        if c["model"] == "dcgan":
            fd = [r["frechet_distance"] for r in c["eval"]]
            check(len(fd) >= 2 and fd[-1] < fd[0], f"{name}: the Fréchet distance falls: {fd}")
        if len(losses) >= 3:
            tail = losses[-max(1, len(losses) // 3):]
            check(sum(tail) / len(tail) < losses[0],
                  f"{name}: {key} falls ({losses[0]:.4f} -> {sum(tail) / len(tail):.4f})")
        else:
            check(False, f"{name}: {len(losses)} logged losses")
        metric = next(f["metric"] for f in families if f["name"] == c["model"])
        v = last_metric(c, metric)
        check(v is not None and math.isfinite(v), f"{name}: a final {metric}: {v}")
        check(c["summary"].get("train_seconds", 0) > 0, f"{name}: a training time")

    # The underflow picture: the first family's fp16-O1 and no-scale probes.
    probes = [c for c in results["cells"] if c["probe"]]
    check(sorted(c["recipe"] for c in probes) == ["fp16-O1", "fp16-noscale"],
          f"the probes: {[(c['model'], c['recipe']) for c in probes]}")
    for p in probes:
        recs = p.get("underflow", [])
        check(len(recs) >= 4, f"{p['recipe']} probe: {len(recs)} underflow measurements")
        for r in recs:
            a = r["activations"]
            hist = sum(a["log2"]["counts"])
            check(hist == a["nonzero"], f"activation histogram {hist} != nonzero {a['nonzero']}")
            check(a["cast_unscaled"] > 0, "some activation gradients flush to zero unscaled")
            check(a["cast_scaled"] <= a["cast_unscaled"], "scaling does not lose more")
            check(r["updates"]["lost_bf16"] >= r["updates"]["lost_fp16"],
                  "bf16 loses at least the updates fp16 loses")
        if p["recipe"] == "fp16-noscale" and recs:
            check(all(r["loss_scale"] == 1 for r in recs), "no-scale runs at scale 1")

    # The ladder: fp32 -> +AMP -> +set_to_none ran, each changing one setting; the two rungs
    # that copy batches to a GPU do not apply on the CPU.
    ladder = results["ladder"]
    rungs = ladder["rungs"]
    check([r["rung"] for r in rungs] == ["fp32", "amp", "set_to_none", "pinned", "prefetcher"],
          f"the ladder's rungs: {[r['rung'] for r in rungs]}")
    check([r["status"] for r in rungs] == ["ok"] * 3 + ["not_applicable"] * 2,
          f"the ladder's statuses: {[(r['rung'], r['status'], r.get('message')) for r in rungs]}")
    for r in rungs[:3]:
        check(r.get("ms_per_step", 0) > 0 and r.get("peak_memory_bytes", 0) > 0 and
              r.get("timed_steps", 0) >= 20, f"ladder {r['rung']}: timed: {r.get('ms_per_step')} "
              f"ms over {r.get('timed_steps')} steps, peak {r.get('peak_memory_bytes')}")
    settings = [(r["config"]["precision"], r["config"]["zero_grad"],
                 r["config"]["input_pipeline"]) for r in rungs[:3]]
    check(settings[0] == ("fp32", "zeros", "pageable") and settings[1][1:] == settings[0][1:]
          and settings[1][0] != "fp32" and settings[2] == (settings[1][0], "none", "pageable"),
          f"each rung adds one setting: {settings}")

    # The report: its tables are results.json's numbers, its plots real PNGs.
    report = open(os.path.join(out, "report.md")).read()
    section = report.split("## The time/memory ladder")[1].split("\n## ")[0]
    shown = dict(re.findall(r"^\| ([a-z_0-9]+) \| [^|]+ \| ([0-9.]+|—) \|", section, re.M))
    for r in rungs:
        want = f"{r['ms_per_step']:.3f}" if r["status"] == "ok" else "—"
        check(shown.get(r["rung"]) == want,
              f"ladder {r['rung']}: report {shown.get(r['rung'])}, results.json {want}")
    check("ladder.png" in section, "the ladder's figure is shown")
    for fam in families:
        section = report.split(f"## {fam['name']} (")[1].split("\n## ")[0]
        rows = re.findall(r"^\| ([A-Za-z0-9-]+) \| ([0-9.]+)", section, re.M)
        check(len(rows) == len(recipes), f"{fam['name']}: {len(rows)} table rows")
        for recipe, shown in rows:
            cell = next(c for c in cells if c["model"] == fam["name"] and c["recipe"] == recipe)
            v = last_metric(cell, fam["metric"])
            want = f"{100 * v:.2f}" if "accuracy" in fam["metric"] else f"{v:.4f}"
            check(shown == want, f"{fam['name']} {recipe}: report {shown}, results.json {want}")
        check(f"curves-{fam['name']}.png" in section, f"{fam['name']}: its curves are shown")
    images = re.findall(r"!\[[^\]]*\]\(([^)]+\.png)\)", report)
    check(len(images) >= len(families) + 4, f"{len(images)} plots in the report")
    for img in images:
        size = png_size(os.path.join(out, img))
        check(size is not None and size[0] >= 600 and size[1] >= 300, f"{img}: a PNG, {size}")

    # Resumable: a rerun finds every cell finished; a removed cell alone is rerun.
    t0 = time.time()
    rc, _, err = run(*args)
    check(rc == 0 and "were finished already" in err and " ..." not in err,
          f"a rerun reruns nothing: {err[-500:]}")
    check(time.time() - t0 < first_seconds / 3, "a rerun is quick")
    victim = os.path.join(out, "cells", "mlp", "bf16-O1-seed0.json")
    before = json.load(open(victim))
    os.remove(victim)
    rc, _, err = run(*args)
    started = [line for line in err.splitlines() if line.endswith(" ...")]
    check(rc == 0 and len(started) == 1 and "mlp bf16-O1 seed 0" in started[0],
          f"only the removed cell reruns: {started}")
    again = json.load(open(victim))
    check([r["loss"] for r in again["train"]] == [r["loss"] for r in before["train"]],
          "the rerun cell trains the same losses")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("ok")
