"""Training from Python: the AMP recipe in a loop of one's own, and the Trainer."""
import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np
import pytest

import mantissa as mt

CONFIG = {"model": "mlp", "data": "synthetic", "synthetic-size": 1024, "batch-size": 64,
          "steps": 12, "epochs": 1, "lr": 0.05, "momentum": 0.9, "weight-decay": 0.0,
          "schedule": "constant", "seed": 3, "threads": 1, "workers": 1, "log-every": 1,
          "precision": "fp16", "progress": False}


def python_loop(config):
    """The PyTorch AMP recipe written in Python; the batches are the Trainer's loader's."""
    source = mt.Trainer(config)  # its loader: the same seeded batches as the CLI's run
    model = mt.make_model(config["model"], seed=config["seed"])
    opt = mt.SGD(model.parameters(), lr=config["lr"], momentum=config["momentum"],
                 weight_decay=config["weight-decay"])
    scaler = mt.GradScaler()
    losses = []
    for _ in range(config["steps"]):
        x, y = source.next_batch()
        opt.zero_grad()
        with mt.autocast("cpu", dtype="f16"):
            loss = mt.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    return losses, scaler.get_scale()


def cli_losses(config, tmp_path):
    exe = os.environ.get("MANTISSA_CLI") or shutil.which("mantissa")
    if exe is None:
        pytest.skip("no mantissa CLI (set MANTISSA_CLI)")
    metrics = tmp_path / "m.jsonl"
    toml = tmp_path / "run.toml"
    toml.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in config.items()))
    subprocess.run([exe, "train", "--config", str(toml), "--metrics", str(metrics)],
                   check=True, capture_output=True)
    return [r["loss"] for r in map(json.loads, metrics.read_text().splitlines())
            if r["kind"] == "train"]


def test_a_python_amp_loop_reaches_the_clis_losses(tmp_path):
    ours, scale = python_loop(CONFIG)
    theirs = cli_losses(CONFIG, tmp_path)
    assert len(theirs) == CONFIG["steps"]
    assert ours == theirs  # bit for bit: the same kernels, batches, rounding and scaler
    assert ours[-1] < 0.5 * ours[0] and scale == 65536.0


def test_trainer_fit_with_a_callback_and_evaluate():
    records = []
    t = mt.Trainer(dict(CONFIG, precision="bf16"))
    summary = t.fit(callback=records.append)
    kinds = [r["kind"] for r in records]
    assert kinds.count("train") == CONFIG["steps"] and kinds[-1] == "summary"
    assert summary["steps"] == CONFIG["steps"] and summary["precision"] == "bf16"
    assert [r["loss"] for r in records if r["kind"] == "train"] == t.step_losses()
    e = t.evaluate()
    assert 0 <= e["accuracy"] <= 1 and e["loss"] == pytest.approx(summary["test_loss"])
    assert 'model = "mlp"' in t.config


def test_trainer_runs_the_fp4_recipe_and_its_ablation_flags():
    records = []
    t = mt.Trainer(dict(CONFIG, precision="fp4", **{"fp4-recipe": "mxfp4", "fp4-sr": "off",
                                                     "fp4-layers": "all"}))
    summary = t.fit(callback=records.append)
    assert summary["precision"] == "fp4" and summary["fp4"]["recipe"] == "mxfp4"
    assert summary["fp4"]["sr"] is False and summary["fp4"]["layers"] >= 1
    assert any(r["kind"] == "fp4" for r in records)
    assert all(np.isfinite(t.step_losses()))
    with pytest.raises(mt.Error, match="unknown --fp4-rht 'maybe'"):
        mt.Trainer(dict(CONFIG, precision="fp4", **{"fp4-rht": "maybe"}))


def test_config_mistakes_are_value_errors():
    with pytest.raises(mt.Error, match="did you mean 'batch-size'"):
        mt.Trainer({"bach-size": 3})
    with pytest.raises(ValueError, match="'lr': --lr must be a number"):
        mt.Trainer({"lr": "fast"})
    with pytest.raises(mt.Error, match="must be a bool, int, float or str"):
        mt.Trainer({"lr": [1]})


def test_a_callback_that_raises_stops_fit():
    def stop(record):
        if record["kind"] == "train" and record["step"] == 3:
            raise RuntimeError("enough")
    t = mt.Trainer(CONFIG)
    with pytest.raises(RuntimeError, match="enough"):
        t.fit(callback=stop)


def test_ctrl_c_stops_fit_after_the_step_under_way(tmp_path):
    script = tmp_path / "long.py"
    script.write_text(
        "import mantissa as mt, sys\n"
        "t = mt.Trainer({'model': 'mlp', 'data': 'synthetic', 'synthetic-size': 100000,\n"
        "                'epochs': 50, 'threads': 1, 'progress': False})\n"
        "print('fitting', flush=True)\n"
        "try:\n"
        "    t.fit()\n"
        "except KeyboardInterrupt:\n"
        "    print('interrupted at step', t.step, flush=True)\n"
        "    sys.exit(3)\n")
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                         cwd=tmp_path)
    assert p.stdout.readline().strip() == "fitting"
    import time
    time.sleep(1.0)
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 3 and "interrupted at step" in out
    assert int(out.split()[-1]) > 0
    # As the CLI: the state is saved (no checkpoint path given: in the working directory).
    assert (tmp_path / "mantissa-interrupted.safetensors").exists()


def test_narrow_optimizer_state_from_python():
    """AdamW with 8-bit moments keeps a quarter of fp32's state bytes and trains the same loop
    to about the same loss; a wrong format name is a ValueError naming the choices."""
    losses, sizes = {}, {}
    for fmt in ("fp32", "8bit"):
        model = mt.make_model("mlp", seed=1)
        opt = mt.AdamW(model.parameters(), lr=1e-3, exp_avg_format=fmt, exp_avg_sq_format=fmt)
        source = mt.Trainer(dict(CONFIG, precision="fp32"))
        for _ in range(CONFIG["steps"]):  # the batches of the loader's run
            x, y = source.next_batch()
            opt.zero_grad()
            loss = mt.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        losses[fmt], sizes[fmt] = loss.item(), opt.state_nbytes()
    assert sizes["8bit"] < 0.3 * sizes["fp32"]
    assert abs(losses["8bit"] - losses["fp32"]) < 0.05 * losses["fp32"]
    with pytest.raises(ValueError, match="8bit"):
        mt.AdamW(model.parameters(), exp_avg_format="int8")
