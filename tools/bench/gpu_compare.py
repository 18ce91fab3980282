#!/usr/bin/env python3
"""GPU training step of `gpt2` (124M, T=1024) and `vit_base` (B/16, 224x224): `mantissa bench
--device cuda` next to PyTorch eager (+ AMP) of the same model, batch and optimizer on the same
GPU, alternating runs in one invocation. Prints ms/step, tokens or images per second, MFU, peak
memory and the ratios Mantissa / PyTorch. Runs on the GPU machine (scripts/device-check calls it).

Precisions (as `mantissa bench --precision` spells them): fp32 (strict fp32 GEMMs), tf32, fp16
and fp16:O2 (PyTorch: autocast fp16 + GradScaler for both; it has no O2), bf16 (autocast bf16).

MFU = model FLOPs per step / step time / 989 TFLOP/s (H100 SXM dense bf16), with model FLOPs =
6 * N * tokens + 12 * L * T * d * tokens (PaLM's count: N all parameters, the attention scores
and their product with V counted without the causal saving); tokens = B * T (gpt2: T = seq len;
vit: T = 197 patches + class token). The same formula for both implementations, so the MFU ratio
is the throughput ratio.

  python3 tools/bench/gpu_compare.py [--build build-cuda] [--models gpt2,vit_base]
      [--precision fp32,tf32,fp16,fp16:O2,bf16] [--gpt2-batch 8] [--vit-batch 64]
      [--rounds 2] [--steps 10] [--require-gpu]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

from bench_util import add_compare_options

PEAK_FLOPS = 989e12
GPT2 = dict(vocab=50257, context=1024, layers=12, heads=12, dim=768)
VIT = dict(patch=16, image=224, layers=12, heads=12, dim=768, classes=10)  # mantissa's default
HERE = os.path.abspath(__file__)


def label_of(entry):
    """mantissa bench's label of a --precision entry: 'bf16' -> 'bf16 O1', 'fp16:O2' -> 'fp16 O2'."""
    precision, _, level = entry.partition(":")
    if level:
        return f"{precision} {level}"
    return precision + (" O1" if precision in ("bf16", "fp16") else "")


def model_flops(model, params, batch, seq_len):
    c = GPT2 if model == "gpt2" else VIT
    layers, dim = c["layers"], c["dim"]
    t = seq_len if model == "gpt2" else (VIT["image"] // VIT["patch"]) ** 2 + 1
    tokens = batch * t
    return 6 * params * tokens + 12 * layers * t * dim * tokens


# ---- the PyTorch side (a worker process per configuration: its peak memory is its own) --------
def torch_models():
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from torch_models import Attention  # the CPU comparison's: the same MultiheadAttention

    class Block(nn.Module):
        """Pre-LN block as src/nn/layers.cpp's TransformerBlock: x + attn(norm1(x)), then
        x + mlp(norm2(x)); mlp = fc1 (4x), GELU, fc2; dropout 0 throughout."""

        def __init__(self, dim, heads, causal, gelu, eps):
            super().__init__()
            self.norm1 = nn.LayerNorm(dim, eps=eps)
            self.attn = Attention(dim, heads, causal)
            self.norm2 = nn.LayerNorm(dim, eps=eps)
            self.fc1, self.fc2 = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)
            self.gelu = gelu

        def forward(self, x):
            x = x + self.attn(self.norm1(x))
            return x + self.fc2(F.gelu(self.fc1(self.norm2(x)), approximate=self.gelu))

    class GPT(nn.Module):
        """src/nn/models_text.cpp: wte + wpe, blocks (causal, GELU tanh, LN eps 1e-5), ln_f,
        lm_head tied to wte (no bias)."""

        def __init__(self, c):
            super().__init__()
            self.wte = nn.Embedding(c["vocab"], c["dim"])
            self.wpe = nn.Embedding(c["context"], c["dim"])
            self.blocks = nn.Sequential(*[Block(c["dim"], c["heads"], True, "tanh", 1e-5)
                                          for _ in range(c["layers"])])
            self.ln_f = nn.LayerNorm(c["dim"])
            self.lm_head = nn.Linear(c["dim"], c["vocab"], bias=False)
            self.lm_head.weight = self.wte.weight
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, 0.0, 0.02)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)

        def forward(self, tokens):
            pos = torch.arange(tokens.shape[1], device=tokens.device)
            return self.lm_head(self.ln_f(self.blocks(self.wte(tokens) + self.wpe(pos))))

    class ViT(nn.Module):
        """src/nn/models_vision.cpp: conv patch embedding, class token, position embedding,
        blocks (GELU exact, LN eps 1e-6), norm, head on the class token."""

        def __init__(self, c):
            super().__init__()
            n = (c["image"] // c["patch"]) ** 2
            self.proj = nn.Conv2d(3, c["dim"], c["patch"], stride=c["patch"])
            self.cls_token = nn.Parameter(torch.randn(1, 1, c["dim"]) * 1e-6)
            self.pos_embed = nn.Parameter(torch.randn(1, n + 1, c["dim"]) * 0.02)
            self.blocks = nn.Sequential(*[Block(c["dim"], c["heads"], False, "none", 1e-6)
                                          for _ in range(c["layers"])])
            self.norm = nn.LayerNorm(c["dim"], eps=1e-6)
            self.head = nn.Linear(c["dim"], c["classes"])

        def forward(self, x):
            p = self.proj(x).flatten(2).transpose(1, 2)
            h = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), p], 1) + self.pos_embed
            return self.head(self.norm(self.blocks(h))[:, 0])

    return GPT, ViT


def worker(args):
    import torch
    import torch.nn.functional as F

    GPT, ViT = torch_models()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    precision, _, _ = args.worker.partition(":")
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
    torch.backends.cudnn.allow_tf32 = precision == "tf32"
    torch.set_float32_matmul_precision("high" if precision == "tf32" else "highest")
    half = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)

    if args.model == "gpt2":
        model = GPT(GPT2).to(dev)
        x = torch.randint(0, GPT2["vocab"], (args.batch, args.seq_len), device=dev)
        y = torch.randint(0, GPT2["vocab"], (args.batch, args.seq_len), device=dev)
    else:
        model = ViT(VIT).to(dev)
        x = torch.rand(args.batch, 3, VIT["image"], VIT["image"], device=dev) * 2 - 1
        y = torch.randint(0, VIT["classes"], (args.batch,), device=dev)
    model.train()
    if args.optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=True)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, fused=True)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=half or torch.float32, enabled=half is not None):
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(args.steps):
        start.record()
        step()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    params = sum(p.numel() for p in model.parameters())  # the tied weight once
    print(json.dumps({"impl": "pytorch", "model": args.model, "precision": label_of(args.worker),
                      "batch_size": args.batch, "ms_per_step": statistics.median(times),
                      "peak_memory_bytes": peak, "parameters": params,
                      "optimizer": args.optimizer, "torch": torch.__version__}))


# ---- the driver -------------------------------------------------------------------------------
def run_lines(cmd):
    """Runs a command; returns the JSON objects of its output lines (raises with its stderr)."""
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stderr[-3000:]}")
    return [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]


def probe(python):
    """(ok, message) on whether `python` has torch and a CUDA GPU."""
    code = ("import torch, json; ok = torch.cuda.is_available(); print(json.dumps({'ok': ok, "
            "'torch': torch.__version__, 'gpu': torch.cuda.get_device_name() if ok else None}))")
    try:
        r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    except OSError as e:
        return False, f"cannot run {python}: {e}"
    if r.returncode != 0:
        return False, f"{python} has no usable torch: {r.stderr.strip().splitlines()[-1:]}"
    info = json.loads(r.stdout.strip().splitlines()[-1])
    if not info["ok"]:
        return False, f"torch {info['torch']} ({python}) sees no CUDA GPU"
    return True, f"torch {info['torch']} on {info['gpu']}"


def fmt_bytes(b):
    return f"{b / 2**30:.2f} GiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    add_compare_options(ap, steps=10)
    ap.set_defaults(build=os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(HERE))),
                                       "build-cuda"), rounds=2)
    ap.add_argument("--models", default="gpt2,vit_base")
    ap.add_argument("--precision", default="fp32,tf32,fp16,fp16:O2,bf16")
    ap.add_argument("--gpt2-batch", type=int, default=8)
    ap.add_argument("--vit-batch", type=int, default=64)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--optimizer", choices=["auto", "sgd", "adamw"], default="auto",
                    help="auto: AdamW when `mantissa bench` takes --optimizer, else SGD momentum "
                         "(what it runs)")
    ap.add_argument("--require-gpu", action="store_true",
                    help="exit 1 (not 0) when torch, a GPU or the CUDA build is missing")
    # Internal: one PyTorch configuration in this process.
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    models = [m for m in args.models.split(",") if m]
    entries = [e for e in args.precision.split(",") if e]
    for m in models:
        if m not in ("gpt2", "vit_base"):
            ap.error(f"--models: unknown model '{m}' (gpt2 or vit_base)")
    for e in entries:
        if e.partition(":")[0] not in ("fp32", "tf32", "fp16", "bf16"):
            ap.error(f"--precision: unknown entry '{e}' (fp32, tf32, fp16[:O1|O2], bf16[:O1|O2])")
    if min(args.rounds, args.steps, args.gpt2_batch, args.vit_batch, args.seq_len) < 1:
        ap.error("--rounds, --steps, the batches and --seq-len must be positive")
    if args.seq_len > GPT2["context"]:
        ap.error(f"--seq-len must be at most gpt2's context {GPT2['context']}")

    def give_up(msg):
        print(f"gpu_compare: nothing measured: {msg}", flush=True)
        sys.exit(1 if args.require_gpu else 0)

    python = args.torch_python if os.path.exists(args.torch_python) else sys.executable
    ok, msg = probe(python)
    if not ok:
        give_up(msg)
    ours = os.path.join(args.build, "mantissa")
    if not os.path.exists(ours):
        give_up(f"{ours} is missing: build with -DMANTISSA_CUDA=ON first (scripts/device-check)")
    bench_help = subprocess.run([ours, "bench", "--help"], capture_output=True, text=True).stdout
    if "--device" not in bench_help:
        give_up(f"{ours} bench has no --device option")
    optimizer = args.optimizer
    if optimizer == "auto":
        optimizer = "adamw" if "--optimizer" in bench_help else "sgd"
    print(f"{msg}; mantissa {ours}; optimizer {optimizer}; best median of {args.rounds} "
          f"alternating rounds of {args.steps} steps", flush=True)

    table = []
    for model in models:
        batch = args.gpt2_batch if model == "gpt2" else args.vit_batch
        shape = (["--seq-len", str(args.seq_len)] if model == "gpt2"
                 else ["--image-size", str(VIT["image"]), "--in-channels", "3"])
        ours_cmd = [ours, "bench", "--model", model, "--device", "cuda", "--precision",
                    ",".join(entries), "--batch-size", str(batch), "--steps", str(args.steps),
                    "--warmup", str(args.warmup), "--json"] + shape
        if "--optimizer" in bench_help:
            ours_cmd += ["--optimizer", optimizer]
        best = {}  # (impl, label) -> the fastest run's record
        for rnd in range(args.rounds):
            runs = []
            try:
                runs += run_lines(ours_cmd)
            except RuntimeError as e:
                print(f"mantissa failed: {e}", flush=True)
            for e in entries:
                cmd = [python, HERE, "--worker", e, "--model", model, "--batch", str(batch),
                       "--seq-len", str(args.seq_len), "--steps", str(args.steps),
                       "--warmup", str(args.warmup), "--optimizer", optimizer]
                try:
                    runs += run_lines(cmd)
                except RuntimeError as err:
                    print(f"pytorch {model} {e} failed: {err}", flush=True)
            for r in runs:
                print(json.dumps(r), flush=True)
                key = (r["impl"], r["precision"])
                if key not in best or r["ms_per_step"] < best[key]["ms_per_step"]:
                    best[key] = r
        for e in entries:
            m, p = best.get(("mantissa", label_of(e))), best.get(("pytorch", label_of(e)))
            if m and p and m["parameters"] != p["parameters"]:
                print(f"warning: {model} has {m['parameters']} parameters in mantissa, "
                      f"{p['parameters']} in PyTorch", flush=True)
            table.append((model, batch, label_of(e), m, p))

    print("==== table")
    print("model FLOPs per step = 6*N*tokens + 12*L*T*d*tokens; MFU against 989 TFLOP/s; "
          "ratio = mantissa / pytorch (throughput: >1 is faster; memory: <1 is smaller)")
    print(f"{'model':<9} {'batch':>5} {'precision':<8} {'ms ours':>8} {'ms torch':>9} "
          f"{'rate ours':>10} {'rate torch':>11} {'MFU ours':>8} {'MFU torch':>9} "
          f"{'mem ours':>10} {'mem torch':>10} {'thr ratio':>9} {'mem ratio':>9}")
    for model, batch, label, m, p in table:
        def cells(r):
            if not r:
                return "-", "-", "-", "-"
            flops = model_flops(model, r["parameters"], batch, args.seq_len)
            per_step = batch * (args.seq_len if model == "gpt2" else 1)
            return (f"{r['ms_per_step']:.1f}", f"{per_step / (r['ms_per_step'] / 1e3):,.0f}",
                    f"{100 * flops / (r['ms_per_step'] / 1e3) / PEAK_FLOPS:.1f}%",
                    fmt_bytes(r["peak_memory_bytes"]))
        mo, po = cells(m), cells(p)
        thr = f"{p['ms_per_step'] / m['ms_per_step']:.2f}x" if m and p else "-"
        mem = (f"{m['peak_memory_bytes'] / p['peak_memory_bytes']:.2f}x" if m and p else "-")
        print(f"{model:<9} {batch:>5} {label:<8} {mo[0]:>8} {po[0]:>9} {mo[1]:>10} {po[1]:>11} "
              f"{mo[2]:>8} {po[2]:>9} {mo[3]:>10} {po[3]:>10} {thr:>9} {mem:>9}")
    print("(rate: tokens/s for gpt2, images/s for vit_base)")
    if any(not (m and p) for _, _, _, m, p in table):
        sys.exit(1)


if __name__ == "__main__":
    main()
