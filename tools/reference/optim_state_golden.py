#!/usr/bin/env python3
"""Writes tests/data/golden/optim_state.safetensors, the reference that tests/optim/state_format_test.cpp
holds the low-precision optimizer states to (include/mantissa/optim/state_format.h), and prints
how this definition compares with bitsandbytes' own.

Run from the repository root with any Python that has numpy, ml_dtypes and safetensors:

    python3 tools/reference/optim_state_golden.py                 # writes the golden file
    python3 tools/reference/optim_state_golden.py --bitsandbytes  # and compares with bitsandbytes
    python3 tools/reference/optim_state_golden.py --check FILE    # is FILE current? (CTest)

(--bitsandbytes needs torch and bitsandbytes: pip install torch bitsandbytes; CPU only.)

What it defines, independently of the C++ (a port of the definitions, not of the code):
- the dynamic maps: bitsandbytes' create_dynamic_map(signed, 7 exponent bits, 8 bits), each
  value computed in float64 and rounded once to float32;
- blockwise 8-bit quantization: per block of BLOCK elements absmax = max |x|, code = the number of
  midpoints (float32, (map[k] + map[k+1]) / 2) below x / absmax (ties to the lower index: the
  rule of bitsandbytes' reference quantizer, torch.bucketize over the midpoints);
- blockwise fp8: code = e4m3(x * (448 / absmax)) to nearest even, saturating; the second
  moment stored as its square root;
- AdamW (torch.optim.AdamW's formula, Mantissa's order of float32 operations, constants
  rounded from float64) whose moments are stored in each format between steps; tensors under
  MIN_NUMEL elements keep float32 state.

With --bitsandbytes: the maps against bitsandbytes.functional.create_dynamic_map (how many entries
differ, by how many ulps), this quantizer against bitsandbytes' quantize_blockwise on the CPU,
and five AdamW steps of this port against bitsandbytes.optim.AdamW8bit.
"""
import argparse
import math
import os

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

BLOCK = 256
MIN_NUMEL = 4096
F = np.float32


def dynamic_map(signed):
    values = []
    for i in range(7):
        parts = 2**i if signed else 2 ** (i + 1)
        scale = 10.0 ** (i - 6)
        for k in range(parts):
            lo = 0.1 + k * (0.9 / parts)
            hi = 0.1 + (k + 1) * (0.9 / parts)
            v = scale * ((lo + hi) / 2.0)
            values.append(v)
            if signed:
                values.append(-v)
    values += [0.0, 1.0]
    assert len(values) == 256
    return np.sort(np.array(values, dtype=np.float64).astype(F))


def midpoints(m):
    return ((m[:-1] + m[1:]) / F(2)).astype(F)


def block_absmax(x):
    n = x.size
    out = np.zeros((n + BLOCK - 1) // BLOCK, dtype=F)
    for b in range(out.size):
        out[b] = np.max(np.abs(x[b * BLOCK : (b + 1) * BLOCK]))
    return out


def q8_encode(x, absmax, m):
    mid = midpoints(m)
    codes = np.zeros(x.size, dtype=np.uint8)
    for b in range(absmax.size):
        blk = x[b * BLOCK : (b + 1) * BLOCK]
        q = np.zeros_like(blk) if absmax[b] == 0 else (blk / absmax[b]).astype(F)
        codes[b * BLOCK : (b + 1) * BLOCK] = np.searchsorted(mid, q, side="left")
    return codes


def q8_decode(codes, absmax, m):
    scale = np.repeat(absmax, BLOCK)[: codes.size]
    return (m[codes] * scale).astype(F)


def fp8_encode(x, absmax):
    codes = np.zeros(x.size, dtype=np.uint8)
    for b in range(absmax.size):
        blk = x[b * BLOCK : (b + 1) * BLOCK]
        if absmax[b] == 0:
            continue
        inv = F(448.0) / absmax[b]
        y = np.clip((blk * inv).astype(F), F(-448), F(448))
        codes[b * BLOCK : (b + 1) * BLOCK] = y.astype(ml_dtypes.float8_e4m3fn).view(np.uint8)
    return codes


def fp8_decode(codes, absmax):
    scale = (np.repeat(absmax, BLOCK)[: codes.size] / F(448.0)).astype(F)
    return (codes.view(ml_dtypes.float8_e4m3fn).astype(F) * scale).astype(F)


class State:
    """One moment of one tensor, kept in `fmt` between steps."""

    def __init__(self, fmt, n, second):
        self.fmt = fmt if (fmt in ("fp32", "bf16") or n >= MIN_NUMEL) else "fp32"
        self.second = second
        self.map = dynamic_map(not second)
        self.value = np.zeros(n, dtype=F)
        self.codes = np.zeros(n, dtype=np.uint8)
        self.absmax = np.zeros((n + BLOCK - 1) // BLOCK, dtype=F)

    def load(self):
        if self.fmt in ("fp32", "bf16"):
            return self.value.copy()
        if self.fmt == "8bit":
            return q8_decode(self.codes, self.absmax, self.map)
        r = fp8_decode(self.codes, self.absmax)
        return (r * r).astype(F) if self.second else r

    def store(self, x):
        if self.fmt == "fp32":
            self.value = x.copy()
        elif self.fmt == "bf16":
            self.value = x.astype(ml_dtypes.bfloat16).astype(F)
        else:
            y = np.sqrt(x).astype(F) if (self.fmt == "fp8" and self.second) else x
            self.absmax = block_absmax(y)
            self.codes = (
                q8_encode(y, self.absmax, self.map)
                if self.fmt == "8bit"
                else fp8_encode(y, self.absmax)
            )

    def stored(self):
        if self.fmt == "fp32":
            return {"value": self.value}
        if self.fmt == "bf16":
            return {"value": self.value}  # bf16 values, exact in float32
        return {"codes": self.codes, "absmax": self.absmax}


def pow_int(base, n):
    result, b = 1.0, base
    while n > 0:
        if n & 1:
            result *= b
        b *= b
        n >>= 1
    return result


def adamw_step(p, g, m_state, v_state, t, lr, beta1, beta2, eps, wd):
    decay = F(1.0 - lr * wd)
    w = F(1.0 - beta1)
    b2, omb2, eps32 = F(beta2), F(1.0 - beta2), F(eps)
    neg_step = F(-(lr / (1.0 - pow_int(beta1, t))))
    bc2_sqrt = F(math.sqrt(1.0 - pow_int(beta2, t)))
    m = np.zeros_like(p) if t == 1 else m_state.load()
    v = np.zeros_like(p) if t == 1 else v_state.load()
    assert w < 0.5
    m = (m + w * (g - m)).astype(F)
    v = (v * b2 + (omb2 * g) * g).astype(F)
    denom = np.sqrt(v).astype(F)
    p = (p * decay + (neg_step * m) / (denom / bc2_sqrt + eps32)).astype(F)
    m_state.store(m)
    v_state.store(v)
    return p


def gradient(rng, n, step):
    # Magnitudes that vary by block (1e-4 .. 1e1), one block of zeros: the dynamic range a
    # block-scaled state must hold.
    scales = 10.0 ** rng.uniform(-4, 1, size=(n + BLOCK - 1) // BLOCK)
    g = rng.standard_normal(n) * np.repeat(scales, BLOCK)[:n]
    g[BLOCK : 2 * BLOCK] = 0
    if step % 2 == 1 and n > 3 * BLOCK + 5:
        g[3 * BLOCK + 5] = 1e-12  # far below its block: rounds to the map's smallest entries
    return g.astype(F)


def build(out):
    tensors = {}
    signed, unsigned = dynamic_map(True), dynamic_map(False)
    tensors["map.signed"] = signed
    tensors["map.unsigned"] = unsigned
    rng = np.random.default_rng(2026)
    # The quantizers on their own: values with exact midpoints, zeros, a zero block, a ragged end.
    n = 5 * BLOCK + 77
    x = (rng.standard_normal(n) * 10.0 ** rng.uniform(-3, 2, size=n)).astype(F)
    x[BLOCK : 2 * BLOCK] = 0
    mid = midpoints(signed)
    x[2 * BLOCK : 2 * BLOCK + 40] = mid[100:140] * F(1)  # exact ties within a block of absmax 1
    x[2 * BLOCK + 40] = 1.0
    x[2 * BLOCK + 41 : 3 * BLOCK] = np.clip(x[2 * BLOCK + 41 : 3 * BLOCK], -0.99, 0.99)
    tensors["quantize.x"] = x
    a = block_absmax(x)
    tensors["quantize.absmax"] = a
    tensors["quantize.q8_signed"] = q8_encode(x, a, signed)
    ax = np.abs(x)
    aa = block_absmax(ax)
    tensors["quantize.q8_unsigned"] = q8_encode(ax, aa, unsigned)
    tensors["quantize.fp8"] = fp8_encode(x, a)

    # AdamW, five steps, each format for both moments (and the mixes the CLI offers).
    hyper = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, wd=0.1)
    sizes = {"big": 5000, "small": 300}
    steps = 5
    p0 = {k: rng.standard_normal(s).astype(F) for k, s in sizes.items()}
    grads = {k: [gradient(rng, s, t) for t in range(steps)] for k, s in sizes.items()}
    for k in sizes:
        tensors[f"adamw.{k}.p0"] = p0[k]
        for t in range(steps):
            tensors[f"adamw.{k}.grad.{t}"] = grads[k][t]
    for name, (fm, fv) in {
        "fp32": ("fp32", "fp32"),
        "bf16": ("bf16", "bf16"),
        "fp8": ("fp8", "fp8"),
        "8bit": ("8bit", "8bit"),
        "8bit-bf16": ("8bit", "bf16"),
    }.items():
        for k, s in sizes.items():
            p = p0[k].copy()
            m, v = State(fm, s, False), State(fv, s, True)
            for t in range(steps):
                p = adamw_step(p, grads[k][t], m, v, t + 1, **hyper)
            tensors[f"adamw.{name}.{k}.p"] = p
            for moment, st in (("exp_avg", m), ("exp_avg_sq", v)):
                for field, value in st.stored().items():
                    tensors[f"adamw.{name}.{k}.{moment}.{field}"] = value
    if out is not None:
        os.makedirs(os.path.dirname(out), exist_ok=True)
        save_file(tensors, out)
        print(f"wrote {out}: {len(tensors)} tensors")
    return tensors


def compare_with_bitsandbytes(tensors):
    import bitsandbytes as bnb
    import bitsandbytes.functional as bf
    import torch

    for signed in (True, False):
        ours = tensors["map.signed" if signed else "map.unsigned"]
        theirs = bf.create_dynamic_map(signed=signed).numpy().astype(F)
        ulps = np.abs(ours.view(np.int32).astype(np.int64) - theirs.view(np.int32).astype(np.int64))
        print(
            f"dynamic map signed={signed}: {int((ulps != 0).sum())} of 256 entries differ from "
            f"bitsandbytes', at most {int(ulps.max())} ulp"
        )
    x = tensors["quantize.x"]
    ours = tensors["quantize.q8_signed"]
    # bitsandbytes' pure-PyTorch reference quantizer (argmin |x / absmax - code|), given this map.
    from bitsandbytes.backends.triton.kernels_optim import _quantize_blockwise_pytorch

    q, _ = _quantize_blockwise_pytorch(
        torch.from_numpy(x), torch.from_numpy(tensors["map.signed"]), BLOCK
    )
    theirs = q.numpy()
    print(
        f"blockwise 8-bit, bitsandbytes' pure-PyTorch reference quantizer on this map: "
        f"{int((theirs != ours).sum())} of {x.size} codes differ"
    )
    q, _ = bf.quantize_blockwise(torch.from_numpy(x), code=bf.create_dynamic_map(signed=True), blocksize=BLOCK)
    theirs = q.numpy()
    off = np.abs(theirs.astype(int) - ours.astype(int))
    print(
        f"blockwise 8-bit, bitsandbytes' CPU kernel (its own map, a 65536-bin lookup table): "
        f"{int((off != 0).sum())} of {x.size} codes differ ({int((off > 1).sum())} by more than one)"
    )
    # Five steps of bitsandbytes' AdamW8bit on the same weights and gradients.
    hyper = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    p = torch.nn.Parameter(torch.from_numpy(tensors["adamw.big.p0"].copy()))
    opt = bnb.optim.AdamW8bit([p], **hyper)
    for t in range(5):
        p.grad = torch.from_numpy(tensors[f"adamw.big.grad.{t}"].copy())
        opt.step()
    ref32 = tensors["adamw.fp32.big.p"]
    p0 = tensors["adamw.big.p0"]
    moved = np.linalg.norm(ref32 - p0)
    for name in ("8bit", "fp8", "bf16"):
        ours = tensors[f"adamw.{name}.big.p"]
        print(
            f"AdamW 5 steps, {name} moments vs fp32: |p - p_fp32| / |p_fp32 - p0| = "
            f"{np.linalg.norm(ours - ref32) / moved:.3e}"
        )
    bnb_p = p.detach().numpy()
    print(
        "AdamW 5 steps, bitsandbytes AdamW8bit vs fp32: "
        f"{np.linalg.norm(bnb_p - ref32) / moved:.3e}; vs this port's 8bit: "
        f"{np.linalg.norm(bnb_p - tensors['adamw.8bit.big.p']) / moved:.3e}"
    )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/data/golden/optim_state.safetensors")
    ap.add_argument(
        "--check",
        metavar="FILE",
        help="write nothing; exit 1 unless FILE holds exactly what this script computes",
    )
    ap.add_argument("--bitsandbytes", action="store_true", help="compare with bitsandbytes")
    args = ap.parse_args()
    if args.check:
        from safetensors.numpy import load_file

        ours = build(None)
        theirs = load_file(args.check)
        stale = sorted(
            k
            for k in set(ours) | set(theirs)
            if k not in ours or k not in theirs or ours[k].tobytes() != theirs[k].tobytes()
            or ours[k].dtype != theirs[k].dtype
        )
        if stale:
            print(f"{args.check} is not what this script computes: {stale[:8]}; rerun it")
            raise SystemExit(1)
        print(f"{args.check}: current ({len(ours)} tensors)")
    else:
        t = build(args.out)
        if args.bitsandbytes:
            compare_with_bitsandbytes(t)
