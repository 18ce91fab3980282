#!/usr/bin/env python3
"""Golden trajectory of PyTorch's own loss scaler, torch.amp.GradScaler("cpu"), for
tests/amp/grad_scaler_test.cpp (GoldenTrajectory).

Two optimizers (plain SGD, lr 2^-4) over two fp32 parameters; every step sets gradients
S * g_true (exact: S is a power of two, g_true dyadic) and then, by a scripted pattern, writes
+inf, -inf or NaN into one element of one or both gradients, calls unscale_ first on some steps,
and update(new_scale) on one. Recorded per step: whether each optimizer's step was skipped, the
combined found_inf, the scale and growth tracker after update(), and both weights (exact in
fp32: every value is dyadic). torch is not needed by the test: the output is committed.

    /work/torchenv/bin/python tools/reference/make_scaler_golden.py \
        --out tests/data/golden/grad_scaler_trajectory.json
"""
import argparse
import json

import torch

STEPS = 60
INIT_SCALE = 2.0**16
GROWTH_INTERVAL = 3
LR = 2.0**-4


def event_for(k):
    # Runs of clean steps (long enough to grow), single and consecutive overflows in either
    # optimizer or both, every kind of non-finite value.
    pattern = {
        4: "inf_a", 5: "nan_b", 9: "ninf_b", 10: "both", 11: "nan_a", 12: "inf_a",
        20: "nan_a", 27: "both", 28: "inf_b", 33: "nan_b", 45: "inf_a", 46: "inf_a",
        47: "inf_a", 48: "inf_a", 49: "inf_a", 50: "inf_a", 55: "nan_a",
    }
    return pattern.get(k, "clean")


def true_grad(n, k, which):
    # Dyadic values, a few bits each.
    return [((((k * 7 + i * 3 + which) % 9) - 4) / 8.0) for i in range(n)]


def poison(value_kind):
    return {"inf": float("inf"), "ninf": float("-inf"), "nan": float("nan")}[value_kind]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    a0 = [1.0, -0.5, 0.25, 2.0, -1.0]
    b0 = [0.75, -2.0, 0.5]
    a = torch.tensor(a0, dtype=torch.float32, requires_grad=True)
    b = torch.tensor(b0, dtype=torch.float32, requires_grad=True)
    opt_a = torch.optim.SGD([a], lr=LR)
    opt_b = torch.optim.SGD([b], lr=LR)
    scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_factor=2.0,
                                  backoff_factor=0.5, growth_interval=GROWTH_INTERVAL)
    steps = []
    for k in range(STEPS):
        event = event_for(k)
        scaler.scale(torch.tensor(1.0))  # PyTorch makes its scale on the first scale() call
        s = scaler.get_scale()
        ga, gb = true_grad(5, k, 0), true_grad(3, k, 1)
        a.grad = torch.tensor(ga, dtype=torch.float32) * s
        b.grad = torch.tensor(gb, dtype=torch.float32) * s
        pos_a, pos_b = k % 5, k % 3
        if event == "both":
            a.grad[pos_a] = poison("nan")
            b.grad[pos_b] = poison("inf")
        elif event != "clean":
            kind, which = event.split("_")
            if which == "a":
                a.grad[pos_a] = poison(kind)
            else:
                b.grad[pos_b] = poison(kind)
        unscale_first = k % 7 == 3
        if unscale_first:
            scaler.unscale_(opt_a)
        a_before, b_before = a.detach().clone(), b.detach().clone()
        scaler.step(opt_a)
        scaler.step(opt_b)
        states = scaler._per_optimizer_states
        skipped_a = sum(v.item() for v in states[id(opt_a)]["found_inf_per_device"].values()) > 0
        skipped_b = sum(v.item() for v in states[id(opt_b)]["found_inf_per_device"].values()) > 0
        assert skipped_a == bool(torch.equal(a.detach(), a_before))
        assert skipped_b == bool(torch.equal(b.detach(), b_before))
        found = skipped_a or skipped_b
        new_scale = 1024.0 if k == 38 else None
        if new_scale is None:
            scaler.update()
        else:
            scaler.update(new_scale)
        steps.append({
            "event": event, "pos_a": pos_a, "pos_b": pos_b, "grad_a": ga, "grad_b": gb,
            "unscale_first": unscale_first, "new_scale": new_scale,
            "skipped_a": skipped_a, "skipped_b": skipped_b, "found_inf": found,
            "scale": scaler.get_scale(), "growth_tracker": int(scaler._get_growth_tracker()),
            "a": [float(x) for x in a.detach()], "b": [float(x) for x in b.detach()],
        })
    out = {
        "torch_version": torch.__version__, "init_scale": INIT_SCALE, "growth_factor": 2.0,
        "backoff_factor": 0.5, "growth_interval": GROWTH_INTERVAL, "lr": LR, "a0": a0, "b0": b0,
        "steps": steps,
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
