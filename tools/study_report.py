#!/usr/bin/env python3
"""The precision study's report: report.md and its PNG plots from the results.json that
`mantissa study` writes (docs/study.md).

    python3 tools/study_report.py study/results.json --out study

Needs numpy and matplotlib (Debian: python3-numpy, python3-matplotlib).
"""
import argparse
import gzip
import json
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

# The formats' ranges, as binary exponents of |x| (bucket e holds 2^e <= |x| < 2^(e+1)).
FP16_MIN_SUBNORMAL = -24  # 2^-24; below 2^-25 a value rounds to zero
FP16_MIN_NORMAL = -14
FP16_MAX = 15  # the largest finite fp16 is 65504 < 2^16
BF16_MIN_SUBNORMAL = -133
BF16_MIN_NORMAL = -126
BF16_EPS = -7  # 2^-7: the distance from 1 to the next bf16
FP16_EPS = -10

# Tolerances of the acceptance check: bf16 with round-to-nearest against fp32.
ACCURACY_PP = 0.3
RELATIVE = 0.01

METRIC_LABELS = {
    "test_accuracy": "test accuracy (%)",
    "test_loss": "validation loss (nats/token)",
    "frechet_distance": "Fréchet distance (own classifier's features)",
    "log_loss": "held-out log loss",
}


def metric_label(metric, family=None):
    if family and family.get("metric_label"):
        return family["metric_label"]
    return METRIC_LABELS.get(metric, metric.replace("_", " "))


def is_accuracy(metric):
    return "accuracy" in metric or metric == "auc"


def final_metric(cell, metric):
    """The cell's last evaluation of `metric`, or None (a failed cell, no evaluation)."""
    for r in reversed(cell.get("eval", [])):
        if r.get(metric) is not None:
            return float(r[metric])
    return None


def shown(value, metric):
    if value is None:
        return "—"
    return f"{100 * value:.2f}" if is_accuracy(metric) else f"{value:.4f}"


def mean_std(values):
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return None, None, 0
    a = np.array(values, dtype=np.float64)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0, len(a)


def summary_of(cell, key):
    s = cell.get("summary") or {}
    v = s.get(key)
    return float(v) if isinstance(v, (int, float)) else None


def recipe_colors(recipes):
    cmap = plt.get_cmap("tab20")
    return {r: cmap(i % 20) for i, r in enumerate(recipes)}


def table_rows(results, family):
    """Per recipe: the statistics the table shows, computed from the cells (not probes)."""
    metric = family["metric"]
    cells = [c for c in results["cells"] if c["model"] == family["name"] and not c.get("probe")]
    by_recipe = {}
    for c in cells:
        by_recipe.setdefault(c["recipe"], []).append(c)
    # Differences and ratios are paired: each cell against fp32's cell of the same seed (a seed
    # can change the data, e.g. the synthetic click log), then averaged over the seeds.
    base = {c["seed"]: c for c in by_recipe.get("fp32", [])}

    def paired(group, value, combine):
        out = []
        for c in group:
            b = base.get(c["seed"])
            x, y = value(c), (value(b) if b is not None else None)
            if x is not None and y is not None and math.isfinite(x) and math.isfinite(y):
                out.append(combine(x, y))
        return mean_std(out)[0]

    rows = []
    for recipe in [r["name"] for r in results["recipes"]]:
        group = by_recipe.get(recipe, [])
        if not group:
            continue
        m, sd, n = mean_std([final_metric(c, metric) for c in group])
        skipped, _, _ = mean_std([summary_of(c, "skipped_steps") for c in group])
        scale, _, _ = mean_std([summary_of(c, "loss_scale") for c in group])
        statuses = sorted({c["status"] for c in group})
        if is_accuracy(metric):
            delta = paired(group, lambda c: final_metric(c, metric), lambda x, y: (x - y) * 100)
        else:
            delta = paired(group, lambda c: final_metric(c, metric),
                           lambda x, y: (x - y) / abs(y) * 100 if y != 0 else float("nan"))
        ratio = lambda x, y: x / y if y > 0 else float("nan")  # noqa: E731
        time_ratio = paired(group, lambda c: summary_of(c, "train_seconds"), ratio)
        memory_ratio = paired(group, lambda c: summary_of(c, "peak_memory_bytes"), ratio)
        rows.append({
            "recipe": recipe,
            "mean": m,
            "std": sd,
            "n": n,
            "seeds": len(group),
            "delta": delta,
            "time_ratio": time_ratio,
            "memory_ratio": memory_ratio,
            "skipped": skipped,
            "scale": scale,
            "status": ", ".join(statuses),
            "message": next((c.get("message") for c in group if c.get("message")), None),
        })
    return rows


def fmt_or_dash(v, spec):
    return "—" if v is None else format(v, spec)


def table_markdown(family, rows):
    metric = family["metric"]
    acc = is_accuracy(metric)
    head = (f"| recipe | {metric_label(metric, family)} | Δ vs fp32 ({'pp' if acc else '%'}) "
            "| time / fp32 | memory / fp32 | skipped steps | final loss scale | status |")
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["mean"] is None:
            value = "—"
        else:
            value = shown(r["mean"], metric)
            if r["n"] > 1:
                value += " ± " + (f"{100 * r['std']:.2f}" if acc else f"{r['std']:.4f}")
            value += f" (n={r['n']})"
        status = r["status"]
        if r["message"] and r["status"] != "ok":
            status += ": " + r["message"].split("\n")[0][:120].replace("|", "/")
        lines.append("| {} | {} | {} | {} | {} | {} | {} | {} |".format(
            r["recipe"], value,
            fmt_or_dash(r["delta"], "+.2f"),
            fmt_or_dash(r["time_ratio"], ".2f"),
            fmt_or_dash(r["memory_ratio"], ".2f"),
            fmt_or_dash(r["skipped"], ".1f"),
            fmt_or_dash(r["scale"], ".4g"),
            status))
    return "\n".join(lines)


def reference_lines(results, family):
    """What the metric is measured against, where the family's evaluations say: the planted
    model's log loss and the constant predictor's (synthetic click log), the Fréchet distance of
    real images (the sampling noise's floor)."""
    cells = [c for c in results["cells"] if c["model"] == family["name"] and c.get("eval")]
    if not cells:
        return []
    last = cells[0]["eval"][-1]
    out = []
    if last.get("bayes_log_loss") is not None:
        out.append(f"The planted model's log loss (the best achievable) on the held-out clicks: "
                   f"{last['bayes_log_loss']:.4f}; a constant predictor's: "
                   f"{last.get('constant_log_loss', float('nan')):.4f}.")
    if last.get("frechet_distance_real") is not None:
        out.append(f"Real training images against the test images score "
                   f"{last['frechet_distance_real']:.4f}: the floor that sampling noise sets.")
    return out + [""] if out else []


def verdicts(family, rows):
    """The acceptance check: bf16 with round-to-nearest (O1, O2) against fp32."""
    metric = family["metric"]
    out = []
    base = next((r for r in rows if r["recipe"] == "fp32"), None)
    for r in rows:
        if r["recipe"] not in ("bf16-O1", "bf16-O2") or r["delta"] is None:
            continue
        if is_accuracy(metric):
            ok = abs(r["delta"]) <= ACCURACY_PP
            out.append(f"{r['recipe']} is {r['delta']:+.2f} pp from fp32: "
                       f"{'within' if ok else 'NOT within'} {ACCURACY_PP} pp")
        else:
            ok = abs(r["delta"]) <= RELATIVE * 100
            out.append(f"{r['recipe']} is {r['delta']:+.2f} % from fp32: "
                       f"{'within' if ok else 'NOT within'} {RELATIVE * 100:.0f} %")
    # How far fp32 itself moves from seed to seed: what a difference must exceed to mean anything.
    if out and base is not None and base["n"] > 1 and base["mean"]:
        noise = 100 * base["std"] if is_accuracy(metric) else 100 * base["std"] / abs(base["mean"])
        out.append(f"fp32's own spread over seeds (initialization, data order and, for "
                   f"synthetic data, the data): {noise:.2f} "
                   f"{'pp' if is_accuracy(metric) else '%'} (n={base['n']})")
    return out


def curve_plot(results, family, path):
    metric = family["metric"]
    recipes = [r["name"] for r in results["recipes"]]
    colors = recipe_colors(recipes)
    cells = [c for c in results["cells"]
             if c["model"] == family["name"] and not c.get("probe") and c.get("seed") == 0]
    fig, (ax_loss, ax_metric) = plt.subplots(1, 2, figsize=(13, 4.8))
    for c in sorted(cells, key=lambda c: recipes.index(c["recipe"])):
        style = "--" if c["recipe"].startswith("fp16") else ":" if c["recipe"].startswith(
            "fp8") else "-"
        train = [(r["step"], r["loss"]) for r in c.get("train", [])
                 if r.get("loss") is not None and math.isfinite(r["loss"])]
        if train:
            s, l = zip(*train)
            ax_loss.plot(s, l, style, color=colors[c["recipe"]], label=c["recipe"], lw=1.4)
        ev = [(r["step"], r[metric]) for r in c.get("eval", []) if r.get(metric) is not None]
        if ev:
            s, v = zip(*ev)
            v = [100 * x for x in v] if is_accuracy(metric) else v
            ax_metric.plot(s, v, style, marker="o", ms=3, color=colors[c["recipe"]],
                           label=c["recipe"], lw=1.4)
    ax_loss.set_xlabel("optimizer step")
    ax_loss.set_ylabel("training loss (logged steps)")
    ax_loss.set_title(f"{family['name']}: training loss, seed 0")
    ax_metric.set_xlabel("optimizer step")
    ax_metric.set_ylabel(metric_label(metric, family))
    ax_metric.set_title(f"{family['name']}: {metric_label(metric, family)}")
    for ax in (ax_loss, ax_metric):
        ax.grid(alpha=0.3)
    handles, labels = ax_loss.get_legend_handles_labels()
    if not handles:
        handles, labels = ax_metric.get_legend_handles_labels()
    fig.legend(handles, labels, loc="center right", fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def histogram_arrays(h):
    """exponents, counts of a log2 histogram record ({min_exponent, counts})."""
    counts = np.array(h.get("counts", []), dtype=np.float64)
    return np.arange(len(counts)) + int(h.get("min_exponent", 0)), counts


def shade_formats(ax, y_top, xlim):
    """fp16's ranges on a log2 axis (bf16's reach far below: named when it is on the plot)."""
    lo, hi = xlim
    ax.axvspan(lo, FP16_MIN_SUBNORMAL - 1, color="#d62728", alpha=0.08, lw=0)
    ax.axvspan(FP16_MIN_SUBNORMAL - 1, FP16_MIN_NORMAL, color="#ff7f0e", alpha=0.12, lw=0)
    ax.axvspan(FP16_MIN_NORMAL, min(FP16_MAX + 1, hi), color="#2ca02c", alpha=0.07, lw=0)
    for x, label in ((FP16_MIN_SUBNORMAL - 1, "fp16 zero below 2^-25"),
                     (FP16_MIN_NORMAL, "fp16 normal from 2^-14"),
                     (FP16_MAX + 1, "fp16 overflow at 2^16"),
                     (BF16_MIN_NORMAL, "bf16 normal from 2^-126")):
        if lo < x < hi:
            ax.axvline(x, color="k", lw=0.8, ls=":")
            ax.text(x - 0.4, y_top * 0.97, label, rotation=90, va="top", ha="right", fontsize=7)
    ax.set_xlim(lo, hi)


def underflow_plots(results, family, out_dir):
    """The gradient-underflow picture of one family's probes; returns (markdown, figure paths)."""
    probes = {c["recipe"]: c for c in results["cells"]
              if c["model"] == family["name"] and c.get("probe") and c.get("underflow")}
    if "fp16-O1" not in probes:
        return "", []
    name = family["name"]
    records = probes["fp16-O1"]["underflow"]
    first, last = records[0], records[-1]
    figs = []

    # 1. log2|g| of the activation gradients (fp32 reference), where fp16 puts them, at the
    #    first and the last measurement, unscaled and multiplied by the scaler's scale.
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), sharey=True)
    lows, highs = [], []
    for rec in (first, last):
        e, _ = histogram_arrays(rec["activations"]["log2"])
        shift = math.log2(rec["loss_scale"]) if rec.get("loss_scale", 1) > 0 else 0.0
        if len(e):
            lows.append(e.min())
            highs.append(e.max() + 1 + shift)
    xlim = (min(lows + [-40]) - 3, max(highs + [17]) + 2)
    # One height for both panels (they share the y axis), the labels inside it.
    top = 0.05
    for rec in (first, last):
        _, n = histogram_arrays(rec["activations"]["log2"])
        if n.sum() > 0:
            top = max(top, (n / n.sum()).max())
    top *= 1.15
    for ax, rec in zip(axes, (first, last)):
        e, n = histogram_arrays(rec["activations"]["log2"])
        total = max(n.sum(), 1)
        frac = n / total
        scale = rec.get("loss_scale", 1.0)
        shift = math.log2(scale) if scale > 0 else 0.0
        shade_formats(ax, top, xlim)
        ax.bar(e + 0.5, frac, width=1.0, color="#1f77b4", alpha=0.75,
               label="activation gradients (fp32)")
        ax.step(e + shift, frac, where="post", color="#9467bd", lw=1.2,
                label=f"× loss scale {scale:g} (2^{shift:g})")
        a = rec["activations"]
        nz = max(a["nonzero"], 1)
        ax.set_title(f"{name}, step {rec['step']}: activation gradients\n"
                     f"{100 * a['cast_unscaled'] / nz:.2f}% flush to zero in fp16 unscaled, "
                     f"{100 * a['cast_scaled'] / nz:.4f}% at the scale", fontsize=10)
        ax.set_xlabel("log2 |gradient| (binary exponent)")
        ax.set_ylim(0, top)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of non-zero values")
    axes[0].legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    p1 = os.path.join(out_dir, f"underflow-{name}-activations.png")
    fig.savefig(p1, dpi=110)
    plt.close(fig)
    figs.append(p1)

    # 2. Over training: the fractions lost, with and without loss scaling.
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.4))
    for recipe, style in (("fp16-O1", "-"), ("fp16-noscale", "--")):
        if recipe not in probes:
            continue
        recs = probes[recipe]["underflow"]
        steps = [r["step"] for r in recs]
        act = [100 * r["activations"]["cast_unscaled"] / max(r["activations"]["nonzero"], 1)
               for r in recs]
        act_scaled = [100 * r["activations"]["cast_scaled"] / max(r["activations"]["nonzero"], 1)
                      for r in recs]
        observed = [100 * r["observed"] / max(r["nonzero"], 1) for r in recs]
        if recipe == "fp16-O1":
            ax.plot(steps, act, "-o", ms=3, color="#d62728",
                    label="activation grads cast to fp16 unscaled")
            ax.plot(steps, act_scaled, "-o", ms=3, color="#2ca02c",
                    label="activation grads at the dynamic scale")
        ax2.plot(steps, observed, style + "o", ms=3,
                 label=f"{recipe}: weight grads that are zero in the run")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("% of non-zero fp32 values that are zero")
    ax.set_title(f"{name}: activation gradients lost in fp16")
    ax2.set_xlabel("optimizer step")
    ax2.set_ylabel("% of non-zero fp32 weight gradients")
    ax2.set_title(f"{name}: weight gradients zero in the fp16 runs")
    for a in (ax, ax2):
        a.grid(alpha=0.3)
        a.legend(fontsize=8)
    fig.tight_layout()
    p2 = os.path.join(out_dir, f"underflow-{name}-over-training.png")
    fig.savefig(p2, dpi=110)
    plt.close(fig)
    figs.append(p2)

    # 3. Weights and updates: |Δw| / |w| against bf16's and fp16's epsilon.
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.4))
    u = last["updates"]
    e, n = histogram_arrays(u["log2_ratio"])
    frac = n / max(n.sum(), 1)
    ax.bar(e + 0.5, frac, width=1.0, color="#8c564b", alpha=0.8, label="|Δw| / |w| of the step")
    for x, label in ((BF16_EPS - 1, "bf16: ε/2 = 2^-8"), (FP16_EPS - 1, "fp16: ε/2 = 2^-11")):
        ax.axvline(x, color="k", ls=":", lw=0.9)
        ax.text(x + 0.2, (frac.max() if len(frac) else 0.1) * 0.95, label, rotation=90,
                va="top", fontsize=8)
    moved = max(u["moved"], 1)
    ax.set_title(f"{name}, step {last['step']}: update / weight\n"
                 f"{100 * u['lost_bf16'] / moved:.1f}% of updates lost in bf16 weights without a "
                 f"master, {100 * u['lost_fp16'] / moved:.1f}% in fp16", fontsize=10)
    ax.set_xlabel("log2 (|update| / |weight|)")
    ax.set_ylabel("fraction of the weights that moved")
    ax.grid(alpha=0.3)
    for key, color, label in (("weights", "#17becf", "weights"),
                              ("weight_gradients", "#bcbd22", "weight gradients (fp32)")):
        e2, n2 = histogram_arrays(last[key])
        ax2.step(e2, n2 / max(n2.sum(), 1), where="post", color=color, label=label)
    shade_formats(ax2, 0.3, (-60, 18))
    ax2.set_xlabel("log2 |value|")
    ax2.set_ylabel("fraction of non-zero values")
    ax2.set_title(f"{name}, step {last['step']}: weights and weight gradients", fontsize=10)
    ax2.legend(fontsize=8)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    p3 = os.path.join(out_dir, f"underflow-{name}-updates.png")
    fig.savefig(p3, dpi=110)
    plt.close(fig)
    figs.append(p3)

    a0, a1 = first["activations"], last["activations"]
    lines = [
        f"### {name}",
        "",
        f"fp16-O1 probe, {len(records)} measurements. Of the non-zero fp32 activation gradients, "
        f"{100 * a0['cast_unscaled'] / max(a0['nonzero'], 1):.2f}% (step {first['step']}) and "
        f"{100 * a1['cast_unscaled'] / max(a1['nonzero'], 1):.2f}% (step {last['step']}) become "
        "zero cast to fp16 unscaled; at the scale the scaler chose "
        f"({first['loss_scale']:g}, {last['loss_scale']:g}): "
        f"{100 * a0['cast_scaled'] / max(a0['nonzero'], 1):.4f}% and "
        f"{100 * a1['cast_scaled'] / max(a1['nonzero'], 1):.4f}%.",
    ]
    if "fp16-noscale" in probes:
        recs = probes["fp16-noscale"]["underflow"]
        zero = sum(r["observed"] for r in recs) / max(sum(r["nonzero"] for r in recs), 1)
        scaled = sum(r["observed"] for r in records) / max(sum(r["nonzero"] for r in records), 1)
        lines += ["", f"Weight gradients that are zero in the run's own gradients (non-zero in "
                      f"fp32), over all measurements: {100 * zero:.3f}% without loss scaling, "
                      f"{100 * scaled:.3f}% with it."]
    rows = [(l["name"], l.get("zero_rows", 0)) for l in last.get("layers", [])
            if l.get("zero_rows", 0)]
    if rows:
        lines += ["", f"At step {last['step']} the run's gradients left whole rows at zero where "
                      "fp32's had values (a row: one output unit; in an LSTM weight, one gate "
                      "unit): " + ", ".join(f"{k} of `{n}`" for n, k in rows) + "."]
    lines += ["", f"At step {last['step']}, {100 * u['lost_bf16'] / moved:.1f}% of the weight "
                  f"updates would be lost by bf16 weights without an fp32 master "
                  f"({100 * u['lost_fp16'] / moved:.1f}% by fp16): the failure master weights "
                  "fix.", ""]
    for p in figs:
        lines.append(f"![{os.path.basename(p)}]({os.path.basename(p)})")
    return "\n".join(lines) + "\n", figs


def ladder_rows(ladder):
    """Per rung: ms/step and peak memory, and both over the fp32 rung's and the rung before's."""
    rungs = ladder.get("rungs", [])
    base = next((r for r in rungs if r.get("rung_index") == 0 and r.get("status") == "ok"), None)
    rows, before = [], None
    for r in rungs:
        ms, mem = r.get("ms_per_step"), r.get("peak_memory_bytes")
        ok = r.get("status") == "ok" and ms is not None

        def over(key, ref):
            v = r.get(key)
            return v / ref[key] if ok and ref is not None and v and ref.get(key) else None

        rows.append({
            "rung": r["rung"],
            "description": r.get("description", ""),
            "recipe": r.get("recipe"),
            "ms": ms if ok else None,
            "memory_mib": mem / 2**20 if ok and mem is not None else None,
            "speedup": (base["ms_per_step"] / ms) if ok and base and ms else None,
            "step_gain": (before["ms_per_step"] / ms) if ok and before and ms else None,
            "memory_ratio": over("peak_memory_bytes", base),
            "status": r.get("status", "?"),
            "message": r.get("message"),
        })
        if ok:
            before = r
    return rows


def ladder_markdown(rows):
    lines = ["| rung | what it adds | ms / step | speed-up over fp32 | over the rung before "
             "| peak memory (MiB) | memory / fp32 | status |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        status = r["status"]
        if r["message"] and status != "ok":
            status += ": " + r["message"].split("\n")[0][:120].replace("|", "/")
        lines.append("| {} | {} | {} | {} | {} | {} | {} | {} |".format(
            r["rung"], r["description"].replace("|", "/"), fmt_or_dash(r["ms"], ".3f"),
            fmt_or_dash(r["speedup"], ".2f"), fmt_or_dash(r["step_gain"], ".2f"),
            fmt_or_dash(r["memory_mib"], ".1f"), fmt_or_dash(r["memory_ratio"], ".2f"), status))
    return "\n".join(lines)


def ladder_plot(ladder, rows, path):
    shown_rows = [r for r in rows if r["ms"] is not None]
    names = [r["rung"] for r in shown_rows]
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(12, 4.2))
    y = np.arange(len(shown_rows))[::-1]
    ax_t.barh(y, [r["ms"] for r in shown_rows], color="tab:blue")
    ax_m.barh(y, [r["memory_mib"] or 0 for r in shown_rows], color="tab:orange")
    for ax in (ax_t, ax_m):
        ax.set_yticks(y)
        ax.set_yticklabels(names)
        ax.grid(axis="x", alpha=0.3)
    ax_t.set_xlim(0, 1.15 * max(r["ms"] for r in shown_rows))
    for yi, r in zip(y, shown_rows):
        if r["speedup"] is not None:
            ax_t.text(r["ms"], yi, f" {r['speedup']:.2f}x", va="center", fontsize=9)
    ax_t.set_xlabel("milliseconds per training step (after warm-up)")
    ax_m.set_xlabel("peak tensor memory (MiB)")
    ax_t.set_title(f"{ladder['model']} on {ladder['device']}: time per step")
    ax_m.set_title(f"{ladder['model']} on {ladder['device']}: peak memory")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ladder_section(results, out_dir):
    """The time/memory ladder's markdown and its figure (None when there is none)."""
    ladder = results.get("ladder")
    if not ladder:
        return [], []
    md = ["## The time/memory ladder", ""]
    if ladder.get("skipped"):
        return md + [f"Not run: {ladder['skipped']}.", ""], []
    rows = ladder_rows(ladder)
    steps = {r.get("timed_steps") for r in ladder.get("rungs", []) if r.get("timed_steps")}
    md.append(f"`{ladder['model']}` on {ladder['device']} ({ladder.get('device_name', '?')}), "
              "trained the same steps once per rung; each rung adds one thing to the one "
              "before. "
              "Time per step is measured from the first logged step to the last (the first "
              "steps' kernel selection and allocations left out"
              + (f"; {', '.join(str(s) for s in sorted(steps))} steps timed" if steps else "")
              + "); memory is the run's peak tensor memory on the device (on the CPU it "
              "includes the dataset's tensors).")
    md.append("")
    md.append(ladder_markdown(rows))
    md.append("")
    figures = []
    if any(r["ms"] is not None for r in rows):
        path = os.path.join(out_dir, "ladder.png")
        ladder_plot(ladder, rows, path)
        figures.append(path)
        md += ["![ladder](ladder.png)", ""]
    return md, figures


# The groups of recipes the report shows side by side for a family: each its rows (a prefix),
# the recipe the others are compared with, and the references shown above them.
RECIPE_GROUPS = (
    {"title": "FP4 ablation", "prefix": "fp4-", "baseline": "fp4-nvfp4",
     "references": ("fp32", "bf16-O1", "fp8-delayed"), "plot": "fp4"},
    {"title": "fp8 recipes and accumulation", "prefix": "fp8-", "baseline": "fp8-current",
     "references": ("fp32", "bf16-O1"), "plot": "fp8"},
)


def recipe_group(results, family, rows, out_dir, group):
    """A group of recipes (RECIPE_GROUPS) next to its baseline and the bf16 and fp32 references:
    a table and a loss-curve plot (markdown lines and the figure, or nothing)."""
    members = [r for r in rows if r["recipe"].startswith(group["prefix"]) and r["mean"] is not None]
    if not members:
        return [], []
    metric = family["metric"]
    acc = is_accuracy(metric)
    by_name = {r["recipe"]: r for r in rows}
    base = by_name.get(group["baseline"])

    def delta(r, ref):
        if ref is None or ref["mean"] is None or r["mean"] is None:
            return None
        if acc:
            return (r["mean"] - ref["mean"]) * 100
        return (r["mean"] - ref["mean"]) / abs(ref["mean"]) * 100 if ref["mean"] else None

    unit = "pp" if acc else "%"
    md = [f"### {group['title']}: {family['name']}", "",
          f"| recipe | {metric_label(metric, family)} | Δ vs {group['baseline']} ({unit}) | "
          f"Δ vs bf16-O1 ({unit}) | time / fp32 | status |", "|---|---|---|---|---|---|"]
    shown_rows = [by_name[n] for n in group["references"] if n in by_name] + members
    for r in shown_rows:
        md.append("| {} | {} | {} | {} | {} | {} |".format(
            r["recipe"], shown(r["mean"], metric) if r["mean"] is not None else "—",
            fmt_or_dash(delta(r, base), "+.2f"), fmt_or_dash(delta(r, by_name.get("bf16-O1")), "+.2f"),
            fmt_or_dash(r["time_ratio"], ".2f"), r["status"]))
    md.append("")
    names = {r["recipe"] for r in shown_rows}
    subset = dict(results)
    subset["cells"] = [c for c in results["cells"] if c["recipe"] in names]
    subset["recipes"] = [r for r in results["recipes"] if r["name"] in names]
    name = f"curves-{group['plot']}-{family['name']}"
    png = os.path.join(out_dir, name + ".png")
    curve_plot(subset, family, png)
    md += [f"![{name}]({name}.png)", ""]
    return md, [png]


def report(results, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    study = results["study"]
    machine = study.get("machine", {})
    md = ["# Precision study", ""]
    md.append(f"Command: `{study.get('command', 'mantissa study')}`  ")
    md.append(f"Mantissa {study.get('version', '?')} on {machine.get('cpu', '?')} "
              f"({machine.get('hardware_threads', '?')} hardware threads, features "
              f"{machine.get('cpu_features', '?')}), device {machine.get('device', 'cpu')}.")
    seeds = {}
    for c in results["cells"]:
        if not c.get("probe"):
            seeds.setdefault(c["recipe"], set()).add(c["seed"])
    counts = sorted({len(v) for v in seeds.values()})
    if len(counts) > 1:
        most = [r for r, v in seeds.items() if len(v) == counts[-1]]
        md.append(f"Seeds: {counts[-1]} for {', '.join(most)}; {counts[0]} for the other recipes "
                  "(n in each row).")
    elif counts:
        md.append(f"Seeds: {counts[0]} per cell.")
    md.append("")
    if not results["families"]:
        # The ladder alone (--models none).
        ladder_md, figures = ladder_section(results, out_dir)
        return write_report(out_dir, md + ladder_md), figures
    md.append("Every cell trains the same model from the same seed on the same data order with the "
              "same hyper-parameters; only the precision recipe differs. The metric is the last "
              "evaluation's, mean ± sample standard deviation over seeds. Δ, time and memory "
              "are paired: each cell against fp32's cell of the same seed, then averaged (Δ in "
              "percentage points for accuracy, percent for losses and distances; time is the "
              "training time, memory the peak tensor memory). Times are wall-clock on the "
              "machine named above, one cell after another: on a shared machine they carry its "
              "load.")
    md.append("")
    md.append("| recipe | what it does |")
    md.append("|---|---|")
    for r in results["recipes"]:
        md.append(f"| {r['name']} | {r['description']} |")
    md.append("")
    md.append("## Summary: bf16 (round to nearest) against fp32")
    md.append("")
    all_rows = {}
    for fam in results["families"]:
        rows = table_rows(results, fam)
        all_rows[fam["name"]] = rows
        v = verdicts(fam, rows)
        md.append(f"- **{fam['name']}** ({fam['kind']}): " + ("; ".join(v) if v else
                                                              "no bf16 or fp32 cell"))
    md.append("")
    figures = []
    for fam in results["families"]:
        rows = all_rows[fam["name"]]
        if not rows:
            continue
        md.append(f"## {fam['name']} ({fam['kind']})")
        md.append("")
        md.append(table_markdown(fam, rows))
        md.append("")
        md += reference_lines(results, fam)
        png = os.path.join(out_dir, f"curves-{fam['name']}.png")
        curve_plot(results, fam, png)
        figures.append(png)
        md.append(f"![curves-{fam['name']}](curves-{fam['name']}.png)")
        md.append("")
        for group in RECIPE_GROUPS:
            group_md, group_figures = recipe_group(results, fam, rows, out_dir, group)
            md += group_md
            figures += group_figures
    under = []
    for fam in results["families"]:
        text, figs = underflow_plots(results, fam, out_dir)
        if text:
            under.append(text)
            figures += figs
    if under:
        md.append("## The gradient-underflow picture")
        md.append("")
        md.append("Measured in separate fp16-O1 and fp16-noscale runs (seed 0) that also compute "
                  "every measured step's fp32 gradients: the gradient of every layer's output "
                  "(activation gradients), of every weight, and what the optimizer step did to "
                  "the weights. Shaded: where fp16 flushes to zero (red), its subnormals "
                  "(orange) and normal numbers (green).")
        md.append("")
        md += under
    ladder_md, ladder_figures = ladder_section(results, out_dir)
    return write_report(out_dir, md + ladder_md), figures + ladder_figures


def write_report(out_dir, md):
    path = os.path.join(out_dir, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(md) + "\n")
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", help="results.json written by mantissa study (or results.json.gz)")
    ap.add_argument("--out", default=None, help="output directory (default: results.json's)")
    args = ap.parse_args()
    opener = gzip.open if args.results.endswith(".gz") else open
    with opener(args.results, "rt") as f:
        results = json.load(f)
    out = args.out or os.path.dirname(os.path.abspath(args.results))
    path, figures = report(results, out)
    print(f"report: {path} ({len(figures)} plots)")


if __name__ == "__main__":
    sys.exit(main())
