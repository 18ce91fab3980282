#!/usr/bin/env python3
"""Writes the PyTorch golden files that tests/train/golden_lm_test.cpp replays: ten AdamW steps of
the language models `gpt2_tiny` and `lstm` from Mantissa's own initial weights, on fixed token
batches, in fp32 and under bf16 autocast. One file per model: tests/data/golden/lm_<model>.safetensors
(tens of KB: the batches, the per-step losses and, for the final weights, each tensor's L2 norm and
64 of its elements at evenly spaced positions). CI has no torch: the files are committed.
Regenerate them (after changing a model's architecture or initialisation, or a setting below) from
the repository root with

    cmake -S . -B build-golden -G Ninja -DMANTISSA_CUDA=OFF -DMANTISSA_BUILD_BENCHMARKS=OFF
    ninja -C build-golden export_init
    /work/torchenv/bin/python tools/reference/make_lm_golden.py build-golden/tests/export_init

(any Python with torch, numpy and safetensors; CPU, one thread, deterministic).

How: `export_init --model M --vocab-size VOCAB --context CONTEXT` writes the model's initial
state_dict (make_model(M, {.seed = SEED, .vocab_size, .max_seq_len})); this script builds the same
architecture in torch.nn under the same state_dict names, loads the weights strictly, draws the
batches from numpy (a seeded successor table with noise, so the loss moves), and runs STEPS steps
of torch.optim.AdamW (LR, BETAS, EPS, WEIGHT_DECAY on the "decay" group) with the grouping the
Trainer uses for token models: weights of two or more dims decay; biases, norm weights and
embeddings (wte, wpe, encoder; lm_head is wte) do not. Loss: mean next-token cross-entropy.
Dropout is 0 and nothing else is random.
"""

import argparse
import pathlib
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.numpy import save_file
from safetensors.torch import load_file

SEED = 5
VOCAB = 64
CONTEXT = 32
BATCH = 8
STEPS = 10
LR = 1e-3
BETAS = (0.9, 0.999)
EPS = 1e-8
WEIGHT_DECAY = 0.1
SAMPLES = 64  # elements kept of each final tensor


class Block(nn.Module):
    """Mantissa's TransformerBlock: pre-LN, fused qkv split q | k | v, causal attention, GELU tanh."""

    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim, eps=1e-5)
        self.attn = nn.Module()
        self.attn.qkv = nn.Linear(dim, 3 * dim)
        self.attn.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim, eps=1e-5)
        self.mlp = nn.Module()
        self.mlp.fc1 = nn.Linear(dim, 4 * dim)
        self.mlp.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.attn.qkv(self.norm1(x)).split(c, dim=-1)
        heads = lambda z: z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        x = x + self.attn.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp.fc2(F.gelu(self.mlp.fc1(self.norm2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, context, layers=4, heads=4, dim=128):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim, eps=1e-5)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as Mantissa's (both names in the state_dict)

    def forward(self, tokens):
        h = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1]))
        for block in self.blocks:
            h = block(h)
        return self.lm_head(self.ln_f(h))

    def no_decay(self, name):
        return name.startswith(("wte.", "wpe.", "ln_f.")) or ".norm" in name


class LSTMLM(nn.Module):
    """Mantissa's `lstm`: encoder (Embedding 128), rnn (2-layer LSTM 256), decoder (Linear)."""

    def __init__(self, vocab):
        super().__init__()
        self.encoder = nn.Embedding(vocab, 128)
        self.rnn = nn.LSTM(128, 256, num_layers=2, batch_first=True)
        self.decoder = nn.Linear(256, vocab)

    def forward(self, tokens):
        return self.decoder(self.rnn(self.encoder(tokens))[0])

    def no_decay(self, name):
        return name.startswith("encoder.")


def batches(vocab, seed):
    """STEPS batches of (x, y): windows of a successor-table stream, 10% of it noise."""
    rng = np.random.default_rng(seed)
    table = rng.integers(0, vocab, size=vocab)
    n = STEPS * BATCH * (CONTEXT + 1)
    stream = np.empty(n, dtype=np.int64)
    stream[0] = 0
    noise = rng.random(n) < 0.1
    random = rng.integers(0, vocab, size=n)
    for i in range(1, n):
        stream[i] = random[i] if noise[i] else table[stream[i - 1]]
    w = stream.reshape(STEPS, BATCH, CONTEXT + 1)
    return w[:, :, :-1].copy(), w[:, :, 1:].copy()


def run(model, xs, ys, autocast):
    decay, rest = [], []
    for name, p in model.named_parameters():
        (rest if p.dim() < 2 or model.no_decay(name) else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS, foreach=False)
    losses = []
    for x, y in zip(torch.from_numpy(xs), torch.from_numpy(ys)):
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return np.array(losses, dtype=np.float64)


def sample_positions(n):
    return np.unique(np.round(np.linspace(0, n - 1, num=min(SAMPLES, n))).astype(np.int64))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("export_init", help="the export_init program of a Mantissa build")
    ap.add_argument("--out-dir", default="tests/data/golden")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for name, make in (("gpt2_tiny", lambda: GPT(VOCAB, CONTEXT)), ("lstm", lambda: LSTMLM(VOCAB))):
        with tempfile.TemporaryDirectory() as tmp:
            init_path = pathlib.Path(tmp) / "init.safetensors"
            subprocess.run([args.export_init, "--model", name, "--out", str(init_path), "--seed",
                            str(SEED), "--vocab-size", str(VOCAB), "--context", str(CONTEXT)],
                           check=True)
            init = {k[len("init."):]: v for k, v in load_file(str(init_path)).items()}
        xs, ys = batches(VOCAB, SEED)
        out = {"batch_x": xs, "batch_y": ys}
        for tag, autocast in (("fp32", False), ("bf16", True)):
            model = make()
            own = model.state_dict()
            assert list(own) == list(init), f"{name}: state_dict names differ:\n{list(own)}\n{list(init)}"
            for k in own:
                assert own[k].shape == init[k].shape, f"{name}: {k} {own[k].shape} vs {init[k].shape}"
            model.load_state_dict(init, strict=True)
            out[f"losses_{tag}"] = run(model, xs, ys, autocast)
            if tag == "fp32":
                for k, v in init.items():
                    out[f"init_norm.{k}"] = np.array(np.linalg.norm(v.double().numpy().ravel()))
                for k, v in model.state_dict().items():
                    flat = v.detach().double().numpy().ravel()
                    pos = sample_positions(flat.size)
                    out[f"final_norm.{k}"] = np.array(np.linalg.norm(flat))
                    out[f"final_index.{k}"] = pos
                    out[f"final_sample.{k}"] = flat[pos].astype(np.float32)
        meta = {"model": name, "seed": str(SEED), "vocab_size": str(VOCAB), "context": str(CONTEXT),
                "batch": str(BATCH), "steps": str(STEPS), "lr": repr(LR), "beta1": repr(BETAS[0]),
                "beta2": repr(BETAS[1]), "eps": repr(EPS), "weight_decay": repr(WEIGHT_DECAY),
                "torch": torch.__version__}
        path = pathlib.Path(args.out_dir) / f"lm_{name}.safetensors"
        save_file(out, str(path), metadata=meta)
        print(f"{path}: fp32 losses {out['losses_fp32'][0]:.6f} -> {out['losses_fp32'][-1]:.6f}, "
              f"bf16 {out['losses_bf16'][0]:.6f} -> {out['losses_bf16'][-1]:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
