#!/usr/bin/env python3
"""Writes the PyTorch golden files that tests/tensor/golden_test.cpp compares Mantissa's ops with:
one small safetensors file per case under tests/data/golden/ (all of them together well under
1 MB). The files are committed: CI has no torch. Regenerate them, after changing a case, with

    /work/torchenv/bin/python tools/reference/make_tensor_golden.py [--out tests/data/golden]

(any Python with torch, numpy and safetensors; CPU only, deterministic for the seeds below).

Naming convention, inside each file:
  in.<x>      an input of the computation: float32, or int64 class targets, or a bool mask
  param.<p>   a parameter (weight, bias): float32
  buffer.<b>  a buffer as it was before the step (batch norm's running_mean, running_var)
  after.<b>   the same buffer after the step (updated in place by the op)
  out.<y>     an output of the forward computation (also intermediate values of a composite)
  gout.<y>    the upstream gradient dL/d out.<y> that the backward pass starts from; only the
              outputs that have one are differentiated: L = sum_y <gout.y, out.y>
  grad.<x>    dL/d in.<x> or dL/d param.<x> (inputs and parameters never share a name)
and the file's metadata:
  op          what the case computes (matmul, linear, conv2d, conv_transpose2d, batch_norm,
              layer_norm, softmax, log_softmax, cross_entropy, sdpa, composite_mlp)
  case        the file's name without extension
  ...         the op's options as strings: int lists as "2,1", numbers in Python's repr form,
              booleans as "true"/"false", names as they are (see each case below)
  torch       the torch version that made the file; generator: this script

Every float input is drawn in float32; the computation runs in float64 from those exact values
and its results are rounded to float32 once, so the files hold the correctly rounded answer
rather than one float32 implementation's rounding errors.
"""
import argparse
import json
import os
import sys

try:
    import torch
    import torch.nn.functional as F
    from safetensors.torch import save_file
except ImportError as e:
    sys.exit(f"make_tensor_golden.py needs torch and safetensors ({e})")


def ints(values) -> str:
    return ",".join(str(int(v)) for v in values)


class Case:
    """Builds one golden file: tensors are registered with their prefixes, then run()."""

    def __init__(self, name: str, op: str, seed: int, **options):
        self.name = name
        self.gen = torch.Generator().manual_seed(seed)
        self.meta = {"op": op, "case": name}
        for k, v in options.items():
            if isinstance(v, bool):
                self.meta[k] = "true" if v else "false"
            elif isinstance(v, (list, tuple)):
                self.meta[k] = ints(v)
            elif isinstance(v, str):
                self.meta[k] = v
            else:
                self.meta[k] = repr(v)
        self.saved = {}  # name -> float32 / int64 / bool tensor as stored
        self.leaves = {}  # in.* / param.* name -> float64 tensor that requires grad
        self.buffers = {}  # buffer name -> float64 tensor updated in place

    def randn(self, *shape, scale=1.0):
        return torch.randn(tuple(shape), generator=self.gen, dtype=torch.float32) * scale

    def uniform(self, *shape, low=0.0, high=1.0):
        u = torch.rand(tuple(shape), generator=self.gen, dtype=torch.float32)
        return u * (high - low) + low

    def randint(self, high, *shape):
        return torch.randint(0, high, shape, generator=self.gen, dtype=torch.int64)

    def tensor(self, prefix: str, name: str, value: torch.Tensor, grad: bool = True):
        key = f"{prefix}.{name}"
        self.saved[key] = value.contiguous()
        if value.is_floating_point():
            v = value.double()
            if prefix == "buffer":
                v = v.clone()
                self.buffers[name] = v
            elif grad:
                v = v.requires_grad_()
                self.leaves[key] = v
            return v
        return value.clone()

    def input(self, name, value, grad=True):
        return self.tensor("in", name, value, grad)

    def param(self, name, value):
        return self.tensor("param", name, value)

    def buffer(self, name, value):
        return self.tensor("buffer", name, value)

    def run(self, outputs: dict, differentiate=None, gouts=None):
        """outputs: name -> float64 tensor. differentiate: the outputs that get a gout (all by
        default); gouts: fixed upstream gradients by output name (random otherwise)."""
        differentiate = list(outputs) if differentiate is None else differentiate
        gouts = dict(gouts or {})
        for k in differentiate:
            if k not in gouts:
                gouts[k] = self.randn(*outputs[k].shape)
            self.saved[f"gout.{k}"] = gouts[k].float().contiguous()
        torch.autograd.backward([outputs[k] for k in differentiate],
                                [gouts[k].double() for k in differentiate])
        for k, v in outputs.items():
            self.saved[f"out.{k}"] = v.detach().float().contiguous()
        for k, v in self.buffers.items():
            self.saved[f"after.{k}"] = v.detach().float().contiguous()
        for key, v in self.leaves.items():
            assert v.grad is not None, f"{self.name}: no gradient reached {key}"
            self.saved["grad." + key.split(".", 1)[1]] = v.grad.float().contiguous()

    def save(self, out_dir: str) -> str:
        meta = dict(self.meta, torch=torch.__version__,
                    generator="tools/reference/make_tensor_golden.py")
        path = os.path.join(out_dir, f"{self.name}.safetensors")
        save_file(self.saved, path, metadata=meta)
        sort_metadata(path)
        return path


def sort_metadata(path: str) -> None:
    """safetensors writes the metadata map in hash order, different on every run; sorting it
    (same keys, same length, data untouched) makes regenerated files byte-identical."""
    with open(path, "r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        header["__metadata__"] = dict(sorted(header["__metadata__"].items()))
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        assert len(text) <= n, "the reordered header must fit where the old one was"
        f.seek(8)
        f.write(text + b" " * (n - len(text)))


# ---- the cases ---------------------------------------------------------------------------------

def matmul_cases():
    shapes = {
        "matmul_2d": ((5, 7), (7, 4)),
        "matmul_batched": ((2, 3, 5, 6), (3, 6, 4)),  # broadcast batch dims
        "matmul_mat_vec": ((2, 4, 6), (6,)),
        "matmul_vec_mat": ((6,), (2, 6, 4)),
    }
    for i, (name, (sa, sb)) in enumerate(shapes.items()):
        c = Case(name, "matmul", seed=100 + i)
        a = c.input("a", c.randn(*sa))
        b = c.input("b", c.randn(*sb))
        c.run({"y": torch.matmul(a, b)})
        yield c


def linear_case():
    c = Case("linear", "linear", seed=110)
    x = c.input("x", c.randn(2, 3, 8))
    w = c.param("weight", c.randn(5, 8, scale=0.3))
    b = c.param("bias", c.randn(5))
    c.run({"y": F.linear(x, w, b)})
    yield c


def conv2d_cases():
    configs = [
        # name, x shape, weight shape, bias, stride, padding, dilation, groups
        ("conv2d", (2, 3, 7, 7), (4, 3, 3, 3), True, (1, 1), (0, 0), (1, 1), 1),
        ("conv2d_stride_pad", (2, 3, 9, 8), (6, 3, 3, 2), True, (2, 1), (1, 2), (1, 1), 1),
        ("conv2d_dilation_groups", (1, 4, 8, 8), (6, 2, 3, 3), False, (1, 2), (2, 1), (2, 1), 2),
    ]
    for i, (name, sx, sw, bias, stride, padding, dilation, groups) in enumerate(configs):
        c = Case(name, "conv2d", seed=120 + i, stride=stride, padding=padding, dilation=dilation,
                 groups=groups, bias=bias)
        x = c.input("x", c.randn(*sx))
        w = c.param("weight", c.randn(*sw, scale=0.4))
        b = c.param("bias", c.randn(sw[0])) if bias else None
        y = F.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)
        c.run({"y": y})
        yield c


def conv_transpose2d_cases():
    configs = [
        # name, x shape, weight shape (in, out/groups, kH, kW), bias, stride, padding,
        # output_padding, dilation, groups
        ("conv_transpose2d", (2, 4, 7, 7), (4, 3, 4, 4), True, (2, 2), (1, 1), (0, 0), (1, 1), 1),
        ("conv_transpose2d_outpad_groups", (2, 4, 5, 4), (4, 2, 3, 3), True, (2, 3), (1, 0),
         (1, 2), (1, 1), 2),
        ("conv_transpose2d_dilation", (1, 3, 5, 6), (3, 2, 3, 2), False, (1, 2), (0, 1), (0, 1),
         (2, 1), 1),
    ]
    for i, (name, sx, sw, bias, stride, padding, out_pad, dilation, groups) in enumerate(configs):
        c = Case(name, "conv_transpose2d", seed=140 + i, stride=stride, padding=padding,
                 output_padding=out_pad, dilation=dilation, groups=groups, bias=bias)
        x = c.input("x", c.randn(*sx))
        w = c.param("weight", c.randn(*sw, scale=0.4))
        b = c.param("bias", c.randn(sw[1] * groups)) if bias else None
        y = F.conv_transpose2d(x, w, b, stride=stride, padding=padding, output_padding=out_pad,
                               groups=groups, dilation=dilation)
        c.run({"y": y})
        yield c


def batch_norm_cases():
    configs = [
        # name, x shape, training, momentum, eps
        ("batch_norm_train", (4, 3, 5, 5), True, 0.1, 1e-5),
        ("batch_norm_train_2d", (8, 6), True, 0.2, 1e-3),
        ("batch_norm_eval", (4, 3, 2, 2), False, 0.1, 1e-5),
    ]
    for i, (name, sx, training, momentum, eps) in enumerate(configs):
        c = Case(name, "batch_norm", seed=130 + i, training=training, momentum=momentum, eps=eps)
        ch = sx[1]
        x = c.input("x", c.randn(*sx) * 2.0 + 0.5)
        w = c.param("weight", c.uniform(ch, low=0.5, high=1.5))
        b = c.param("bias", c.randn(ch))
        rm = c.buffer("running_mean", c.randn(ch, scale=0.5))
        rv = c.buffer("running_var", c.uniform(ch, low=0.5, high=2.0))
        y = F.batch_norm(x, rm, rv, w, b, training=training, momentum=momentum, eps=eps)
        c.run({"y": y})
        yield c


def layer_norm_cases():
    c = Case("layer_norm", "layer_norm", seed=140, normalized_shape=(8,), eps=1e-5, affine=True)
    x = c.input("x", c.randn(2, 5, 8) * 1.5 - 0.3)
    w = c.param("weight", c.uniform(8, low=0.5, high=1.5))
    b = c.param("bias", c.randn(8))
    c.run({"y": F.layer_norm(x, (8,), w, b, eps=1e-5)})
    yield c

    c = Case("layer_norm_2d_noaffine", "layer_norm", seed=141, normalized_shape=(4, 6), eps=1e-6,
             affine=False)
    x = c.input("x", c.randn(3, 4, 6))
    c.run({"y": F.layer_norm(x, (4, 6), eps=1e-6)})
    yield c


def softmax_cases():
    for i, (name, op, shape, dim) in enumerate([
        ("softmax", "softmax", (3, 4, 6), -1),
        ("softmax_dim1", "softmax", (3, 4, 6), 1),
        ("log_softmax", "log_softmax", (4, 7), -1),
    ]):
        c = Case(name, op, seed=150 + i, dim=dim)
        x = c.input("x", c.randn(*shape, scale=2.0))
        fn = F.softmax if op == "softmax" else F.log_softmax
        c.run({"y": fn(x, dim=dim)})
        yield c


def cross_entropy_cases():
    configs = [
        # name, logits shape, ignore_index, label_smoothing, reduction, ignored positions
        ("cross_entropy", (8, 5), -100, 0.0, "mean", []),
        ("cross_entropy_smooth_ignore", (10, 6), -100, 0.1, "mean", [2, 7]),
        ("cross_entropy_spatial_sum", (2, 4, 3, 3), 1, 0.2, "sum", None),
        ("cross_entropy_none", (6, 4), -100, 0.05, "none", [3]),
    ]
    for i, (name, shape, ignore, smoothing, reduction, ignored) in enumerate(configs):
        c = Case(name, "cross_entropy", seed=160 + i, ignore_index=ignore,
                 label_smoothing=smoothing, reduction=reduction)
        logits = c.input("logits", c.randn(*shape, scale=1.5))
        target_shape = (shape[0],) + tuple(shape[2:])
        target = c.randint(shape[1], *target_shape)
        for j in ignored or []:
            target[j] = ignore
        target = c.input("target", target)
        loss = F.cross_entropy(logits, target, ignore_index=ignore, label_smoothing=smoothing,
                               reduction=reduction)
        c.run({"loss": loss})
        yield c


def sdpa_cases():
    configs = [
        # name, q shape, kv shape, causal, mask kind, scale
        ("sdpa", (2, 2, 5, 8), (2, 2, 6, 8), False, None, None),
        ("sdpa_causal", (2, 3, 6, 4), (2, 3, 6, 4), True, None, None),
        ("sdpa_bool_mask_scale", (2, 4, 8), (2, 5, 8), False, "bool", 0.3),
        ("sdpa_additive_mask", (1, 2, 3, 4), (1, 2, 3, 4), False, "float", None),
    ]
    for i, (name, sq, skv, causal, mask_kind, scale) in enumerate(configs):
        options = {"causal": causal}
        if scale is not None:
            options["scale"] = scale
        c = Case(name, "sdpa", seed=170 + i, **options)
        q = c.input("q", c.randn(*sq))
        k = c.input("k", c.randn(*skv))
        v = c.input("v", c.randn(*skv))
        mask = None
        tq, tk = sq[-2], skv[-2]
        if mask_kind == "bool":
            keep = c.uniform(tq, tk) > 0.4
            keep[torch.arange(tq), torch.arange(tq) % tk] = True  # no query without a key
            mask = c.input("mask", keep)
        elif mask_kind == "float":
            mask = c.input("mask", c.randn(tq, tk), grad=False)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)
        c.run({"y": y})
        yield c


def composite_case():
    """linear -> gelu -> layer_norm -> linear -> cross_entropy, every intermediate saved."""
    c = Case("composite_mlp", "composite_mlp", seed=180, label_smoothing=0.1, eps=1e-5)
    x = c.input("x", c.randn(6, 8))
    w1 = c.param("fc1.weight", c.randn(12, 8, scale=0.35))
    b1 = c.param("fc1.bias", c.randn(12, scale=0.1))
    g = c.param("ln.weight", c.uniform(12, low=0.8, high=1.2))
    beta = c.param("ln.bias", c.randn(12, scale=0.1))
    w2 = c.param("fc2.weight", c.randn(5, 12, scale=0.3))
    b2 = c.param("fc2.bias", c.randn(5, scale=0.1))
    target = c.input("target", c.randint(5, 6))
    h1 = F.linear(x, w1, b1)
    h2 = F.gelu(h1)
    h3 = F.layer_norm(h2, (12,), g, beta, eps=1e-5)
    logits = F.linear(h3, w2, b2)
    loss = F.cross_entropy(logits, target, label_smoothing=0.1)
    c.run({"h1": h1, "h2": h2, "h3": h3, "logits": logits, "loss": loss},
          differentiate=["loss"], gouts={"loss": torch.tensor(0.75)})
    yield c


ALL = [matmul_cases, linear_case, conv2d_cases, conv_transpose2d_cases, batch_norm_cases,
       layer_norm_cases, softmax_cases, cross_entropy_cases, sdpa_cases, composite_case]


def main() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    default_out = os.path.normpath(os.path.join(here, "..", "..", "tests", "data", "golden"))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default=default_out)
    args = ap.parse_args()

    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out, exist_ok=True)
    total = 0
    for family in ALL:
        for case in family():
            path = case.save(args.out)
            size = os.path.getsize(path)
            total += size
            print(f"{path}: {size} bytes, {len(case.saved)} tensors")
    print(f"total {total} bytes")


if __name__ == "__main__":
    main()
