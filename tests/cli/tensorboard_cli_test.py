#!/usr/bin/env python3
"""`mantissa train --tensorboard DIR` read back by the real TensorBoard.

1. The event file through tensorboard's own reader (EventAccumulator): every number of every
   train, eval, underflow and fp8 metrics record is a scalar at the record's step with the same
   value (as float32, what TensorBoard stores); the histograms (weights, gradients, log2|g|) and
   the configuration text are there.
2. As a person looks at it: `tensorboard --logdir` serves the run, headless Chromium (driven by
   Selenium through chromium-driver) opens its Time Series page filtered to train/loss, and within
   a minute a screenshot must show both curves (train/loss and train/loss_scale) drawn across
   their plots.

usage: tensorboard_cli_test.py MANTISSA [SCREENSHOT.png]
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import numpy as np
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

BIN = sys.argv[1]
SHOT = sys.argv[2] if len(sys.argv) > 2 else None
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def train(*args):
    p = subprocess.run([BIN, "train", "--no-progress", "--threads", "2", *args],
                       capture_output=True, text=True, timeout=300)
    check(p.returncode == 0, f"train {args} exits 0 ({p.returncode}): {p.stderr[-800:]}")


def accumulator(run_dir):
    ea = EventAccumulator(run_dir, size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    ea.Reload()
    return ea


def expected_scalars(records):
    """{tag: {step: value}} from the metrics records, as the run log maps them."""
    want = {}
    for r in records:
        kind, step = r["kind"], r.get("step")
        if kind in ("train", "eval", "underflow"):
            for key, value in r.items():
                # A non-finite number is null in the metrics and left out of TensorBoard.
                if key in ("kind", "step", "epoch") or not isinstance(value, (int, float)):
                    continue
                want.setdefault(f"{kind}/{key}", {})[step] = float(value)
        elif kind == "fp8":
            for layer in r["layers"]:
                for role, stats in layer.items():
                    if isinstance(stats, dict):
                        for key, value in stats.items():
                            if value is not None:
                                    want.setdefault(f"fp8/{layer['layer']}/{role}/{key}", {})[step] = value
    return want


def compare(ea, records, label):
    want = expected_scalars(records)
    tags = set(ea.Tags()["scalars"])
    check(tags == set(want), f"{label}: scalar tags {sorted(tags ^ set(want))} differ")
    for tag, by_step in want.items():
        if tag not in tags:
            continue
        got = {e.step: e.value for e in ea.Scalars(tag)}
        check(set(got) == set(by_step), f"{label}: {tag} steps {sorted(got)} != {sorted(by_step)}")
        for step, value in by_step.items():
            expect = float(np.float32(value))
            if step in got and not (got[step] == expect or (np.isnan(got[step]) and np.isnan(expect))):
                check(False, f"{label}: {tag} at step {step}: {got[step]!r} != {expect!r}")
                break


with tempfile.TemporaryDirectory() as tmp:
    logdir = os.path.join(tmp, "runs")
    # fp16 with a loss scale that starts far too high: it backs off (a curve with steps), the
    # underflow measurement runs, gradients and weights are histogrammed every 10 steps.
    fp16_metrics = os.path.join(tmp, "fp16.jsonl")
    train("--model", "mlp", "--data", "synthetic", "--synthetic-size", "2560", "--batch-size", "64",
          "--epochs", "2", "--precision", "fp16", "--init-scale", "1e12", "--underflow-every", "8",
          "--log-every", "4", "--histogram-every", "10", "--metrics", fp16_metrics,
          "--tensorboard", os.path.join(logdir, "fp16"))
    records = [json.loads(line) for line in open(fp16_metrics)]
    ea = accumulator(os.path.join(logdir, "fp16"))
    compare(ea, records, "fp16")
    scalars = set(ea.Tags()["scalars"])
    for tag in ("train/loss", "train/lr", "train/loss_scale", "train/skipped_steps",
                "train/grad_norm", "train/samples_per_s", "train/peak_memory_bytes",
                "eval/test_loss", "eval/test_accuracy", "underflow/cast_unscaled"):
        check(tag in scalars, f"the scalar {tag} is written")
    scales = [e.value for e in ea.Scalars("train/loss_scale")] if "train/loss_scale" in scalars else []
    check(len(set(scales)) > 1 and scales[0] > scales[-1],
          f"the loss scale backs off from 1e12: {scales[:6]}")
    skipped = [e.value for e in ea.Scalars("train/skipped_steps")] if "train/skipped_steps" in scalars else []
    check(skipped and skipped[-1] > 0, f"skipped steps are counted: {skipped[:6]}")
    nulls = [r["step"] for r in records if r["kind"] == "train" and r.get("grad_norm") is None]
    check(nulls, "a skipped step's grad norm is inf: null in the metrics, left out of TensorBoard")

    histograms = set(ea.Tags()["histograms"])
    params = ["1.weight", "1.bias", "4.weight", "4.bias", "7.weight", "7.bias"]
    for p in params:
        tag = f"weights/{p}"
        steps = [h.step for h in ea.Histograms(tag)] if tag in histograms else []
        check(steps == list(range(10, 81, 10)), f"{tag} every 10 steps: {steps}")
    # Skipped steps' gradients are all inf/NaN: no histogram then (TensorBoard cannot draw one).
    grads = [h.step for h in ea.Histograms("gradients/1.weight")] if "gradients/1.weight" in histograms else []
    check(grads and grads[-1] == 80, f"gradient histograms of the applied steps: {grads}")
    w = ea.Histograms("weights/1.weight")[-1].histogram_value if "weights/1.weight" in histograms else None
    check(w is not None and w.num == 784 * 256 and sum(w.bucket) == w.num and w.min < 0 < w.max,
          f"the weight histogram counts every weight: {w and (w.num, sum(w.bucket))}")
    under = [r for r in records if r["kind"] == "underflow"]
    logs = ea.Histograms("underflow/log2_abs_gradient") if "underflow/log2_abs_gradient" in histograms else []
    check([h.step for h in logs] == [r["step"] for r in under],
          f"a log2|g| histogram per underflow measurement: {[h.step for h in logs]}")
    for h, r in zip(logs, under):
        v = h.histogram_value
        check(v.num == r["nonzero"] and sum(v.bucket) == v.num and v.min >= -149 and v.max <= 128,
              f"log2|g| at step {h.step} counts the {r['nonzero']} non-zero gradients: {v.num}")
    text = ea.Tensors("config") if "config" in ea.Tags()["tensors"] else []
    check(text and b'model = "mlp"' in text[0].tensor_proto.string_val[0],
          f"the configuration is a text summary: {ea.Tags()['tensors']}")

    # fp8: the per-layer amax / scale / range records, on a second run in the same log dir.
    fp8_metrics = os.path.join(tmp, "fp8.jsonl")
    train("--model", "mlp", "--data", "synthetic", "--synthetic-size", "640", "--batch-size", "64",
          "--epochs", "1", "--precision", "fp8", "--fp8-layers", "all", "--log-every", "5",
          "--metrics", fp8_metrics, "--tensorboard", os.path.join(logdir, "fp8"))
    fp8_records = [json.loads(line) for line in open(fp8_metrics)]
    ea8 = accumulator(os.path.join(logdir, "fp8"))
    compare(ea8, fp8_records, "fp8")
    check(any(t.startswith("fp8/1/input/") for t in ea8.Tags()["scalars"]),
          f"fp8 tags: {sorted(ea8.Tags()['scalars'])[:5]}")

    # A person's look: the served page in a headless browser.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    board = subprocess.Popen([sys.executable, "-m", "tensorboard.main", "--logdir", logdir,
                              "--port", str(port), "--host", "127.0.0.1"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        runs = []
        deadline = time.time() + 60
        while time.time() < deadline and "fp16" not in runs:
            try:
                runs = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/data/runs", timeout=2))
            except OSError:
                time.sleep(0.5)
        check("fp16" in runs, f"tensorboard serves the run: {runs}")
        # ... and has read all of it (it loads event files in the background).
        want = len(expected_scalars(records)["train/loss_scale"])
        points = []
        while time.time() < deadline and len(points) < want:
            try:
                points = json.load(urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/data/plugin/scalars/scalars?run=fp16"
                    "&tag=train/loss_scale", timeout=2))
            except (OSError, ValueError):
                pass
            if len(points) < want:
                time.sleep(0.5)
        check(len(points) == want, f"tensorboard serves all {want} points: {len(points)}")
        chromedriver = shutil.which("chromedriver")
        check(chromedriver is not None,
              "chromium and chromium-driver are installed (scripts/test installs them)")
        png = SHOT or os.path.join(tmp, "tensorboard.png")

        def curves(image):
            """Pixel columns holding a line in the two cards (train/loss, train/loss_scale) side
            by side. Grid, axes and text are grey; the interface's orange is left out; the runs'
            legend dots are below the plots."""
            img = np.asarray(image.convert("RGB")).astype(int)
            spread = img.max(axis=2) - img.min(axis=2)
            orange = (img[..., 0] > 200) & (img[..., 2] < 120)
            plots = ((spread >= 25) & ~orange)[190:470]
            return (int(plots[:, 300:700].any(axis=0).sum()),
                    int(plots[:, 710:1110].any(axis=0).sum()))

        columns = (0, 0)
        if chromedriver and "fp16" in runs:
            # Through WebDriver, so the test waits as a person would, in real time, until the
            # curves are drawn (Chromium's --screenshot with a virtual-time budget came back with
            # the cards still empty on a loaded machine). SVG lines: without a GPU, headless
            # Chromium left TensorBoard's WebGL charts blank in every try here.
            from selenium import webdriver
            from selenium.webdriver.chrome.service import Service
            opts = webdriver.ChromeOptions()
            for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                        "--window-size=1400,900"):
                opts.add_argument(arg)
            driver = webdriver.Chrome(service=Service(chromedriver), options=opts)
            try:
                driver.set_window_size(1400, 900)
                driver.get(f"http://127.0.0.1:{port}/?forceSVG=true&runFilter=fp16"
                           "&tagFilter=train/loss#timeseries")
                shown = time.time() + 60
                while time.time() < shown and min(columns) < 100:
                    time.sleep(1)
                    driver.save_screenshot(png)
                    columns = curves(Image.open(png))
            finally:
                driver.quit()
        check(min(columns) >= 100,
              f"the screenshot shows both curves: {columns} columns hold a line ({png})")
    finally:
        board.terminate()
        board.wait(timeout=30)

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("tensorboard: all checks passed")
