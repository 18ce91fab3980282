#!/usr/bin/env python3
"""PyTorch eager counterpart of `mantissa bench`: one training step (forward, cross-entropy,
backward, SGD lr 0.01 momentum 0.9) of the same reference model on the same batch shape, in one
precision; prints one JSON line. The architectures mirror src/nn/models_vision.cpp and
src/nn/models_text.cpp layer for layer (same shapes, so the same parameter count), with the
inputs `mantissa bench` feeds them: images U(-1, 1) of 1x28x28 and 10 classes, or tokens
(batch, seq_len) over the default vocabulary of 256 with a next-token target at every position.
The parameter names are ours (the PyTorch originals'): the model part of a `mantissa train
--checkpoint` file loads with strict=True (gpt2_tiny's context is max(256, --seq-len) here, as in
`mantissa bench`; `mantissa train` makes it --seq-len).

Precisions, as `mantissa bench --precision` spells them:
  fp32     plain fp32.
  bf16     PyTorch AMP: fp32 weights, torch.autocast("cpu", bfloat16) around forward and loss.
  bf16:O2  Apex O2 by hand: the model in bf16 except batch norms (kept fp32), the input cast to
           bf16 and the logits back to fp32 for the loss; SGD runs on fp32 master copies of the
           bf16 weights (gradients copied up, updated masters copied down, with _foreach ops).

  python3 tools/bench/torch_models.py --model gpt2_tiny --precision bf16 --threads 1 [--steps 30]
"""
import argparse
import json
import math
import resource

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench_util import median_ms

NUM_CLASSES = 10  # nn::ModelConfig's defaults
IMAGE_SIZE = 28
VOCAB = 256
MAX_SEQ_LEN = 256  # `mantissa bench` raises it to --seq-len when that is longer
IMAGE_MODELS = ("mlp", "cnn", "resnet", "vit")
TOKEN_MODELS = ("gpt2_tiny", "lstm")
MODELS = IMAGE_MODELS + TOKEN_MODELS
PRECISIONS = ("fp32", "bf16", "bf16:O2")


# ---- image models (src/nn/models_vision.cpp) -----------------------------------------------------
def mlp():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Dropout(0.0),
                         nn.Linear(256, 128), nn.ReLU(), nn.Dropout(0.0), nn.Linear(128, 10))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        layers, channels = [], 1
        for width in (32, 64):
            layers += [nn.Conv2d(channels, width, 5, padding=2), nn.BatchNorm2d(width), nn.ReLU(),
                       nn.MaxPool2d(2)]
            channels = width
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(64 * 7 * 7, 128), nn.ReLU(),
                                        nn.Dropout(0.0), nn.Linear(128, 10))

    def forward(self, x):
        return self.classifier(self.features(x))


def conv_bn(cin, cout, k, stride):
    """A bias-free conv (padding k // 2) and its batch norm."""
    return nn.Conv2d(cin, cout, k, stride, k // 2, bias=False), nn.BatchNorm2d(cout)


class BasicBlock(nn.Module):
    """torchvision's: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), the shortcut a 1x1
    conv + BN where the shape changes (option B, as ours; not the paper's zero padding)."""

    def __init__(self, cin, planes, stride):
        super().__init__()
        self.conv1, self.bn1 = conv_bn(cin, planes, 3, stride)
        self.conv2, self.bn2 = conv_bn(planes, planes, 3, 1)
        self.downsample = None
        if stride != 1 or cin != planes:
            self.downsample = nn.Sequential(*conv_bn(cin, planes, 1, stride))

    def forward(self, x):
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(out + (self.downsample(x) if self.downsample is not None else x))


class ResNet(nn.Module):
    """`resnet`: CIFAR-style ResNet-20 (3x3 stem of 16, stages 16/32/64 of 3 BasicBlocks, the
    first block of stages 2 and 3 with stride 2), global average pool, fc; torchvision's init."""

    def __init__(self, blocks=3, widths=(16, 32, 64)):
        super().__init__()
        self.conv1, self.bn1 = conv_bn(1, widths[0], 3, 1)
        stages, cin = [], widths[0]
        for s, width in enumerate(widths):
            stages.append(nn.Sequential(*[BasicBlock(cin if b == 0 else width, width,
                                                     2 if s > 0 and b == 0 else 1)
                                          for b in range(blocks)]))
            cin = width
        self.layer1, self.layer2, self.layer3 = stages
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, NUM_CLASSES)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.layer3(self.layer2(self.layer1(h)))
        return self.fc(self.avgpool(h).flatten(1))


# ---- transformer pieces (src/nn/layers.cpp) ------------------------------------------------------
class Attention(nn.Module):
    """MultiheadAttention: one fused qkv Linear (C -> 3C, split q | k | v, each head a contiguous
    slice), scaled_dot_product_attention, proj Linear (C -> C)."""

    def __init__(self, dim, heads, causal):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Mlp(nn.Module):
    def __init__(self, dim, hidden, gelu):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(dim, hidden), nn.Linear(hidden, dim)
        self.gelu = gelu

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate=self.gelu))


class Block(nn.Module):
    """TransformerBlock, pre-LN: x + attn(norm1(x)), then x + mlp(norm2(x)); mlp ratio 4. The
    dropouts are p = 0, which both implementations skip."""

    def __init__(self, dim, heads, causal, gelu, eps):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=eps)
        self.attn = Attention(dim, heads, causal)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = Mlp(dim, 4 * dim, gelu)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    """(B, C, H, W) -> (B, N, D): a conv of kernel and stride `patch`, flattened."""

    def __init__(self, dim, patch):
        super().__init__()
        self.proj = nn.Conv2d(1, dim, patch, stride=patch)

    def forward(self, x):
        return self.proj(x).flatten(2).transpose(1, 2)


class ViT(nn.Module):
    """`vit`: patch 4 on 28x28 (7x7 = 49 patches and a class token), dim 64, 4 blocks of 4 heads
    (GELU exact, LayerNorm eps 1e-6), norm, head on the class token; timm's init."""

    def __init__(self, patch=4, dim=64, depth=4, heads=4):
        super().__init__()
        tokens = (IMAGE_SIZE // patch) ** 2 + 1
        self.patch_embed = PatchEmbed(dim, patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim) * 1e-6)
        self.pos_embed = nn.Parameter(torch.randn(1, tokens, dim) * 0.02)
        self.blocks = nn.Sequential(*[Block(dim, heads, False, "none", 1e-6)
                                      for _ in range(depth)])
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, NUM_CLASSES)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, 0.0, 0.02)
                nn.init.zeros_(m.bias)

    def forward(self, x):
        p = self.patch_embed(x)
        # As ours: the class token in the patches' dtype (bf16 under autocast).
        cls = self.cls_token.expand(x.shape[0], -1, -1).to(p.dtype)
        h = torch.cat([cls, p], 1) + self.pos_embed
        return self.head(self.norm(self.blocks(h))[:, 0])


# ---- token models (src/nn/models_text.cpp) -------------------------------------------------------
class GPT(nn.Module):
    """`gpt2_tiny`: wte + wpe (context max(256, seq_len)), 4 causal blocks of 4 heads, dim 128,
    GELU tanh, LayerNorm eps 1e-5, ln_f, lm_head without bias tied to wte; GPT-2's init."""

    def __init__(self, context, vocab=VOCAB, layers=4, heads=4, dim=128):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(context, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads, True, "tanh", 1e-5)
                                      for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                residual = name.endswith(("attn.proj.weight", "mlp.fc2.weight"))
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * layers) if residual else 0.02)

    def forward(self, tokens):
        pos = torch.arange(tokens.shape[1], device=tokens.device)
        return self.lm_head(self.ln_f(self.blocks(self.wte(tokens) + self.wpe(pos))))


class LSTMLanguageModel(nn.Module):
    """`lstm`: encoder Embedding(256, 128), 2-layer LSTM of 256 (torch.nn.LSTM, batch first),
    decoder Linear(256, 256); PyTorch's word_language_model init."""

    def __init__(self, vocab=VOCAB, embed=128, hidden=256, layers=2):
        super().__init__()
        self.encoder = nn.Embedding(vocab, embed)
        self.drop = nn.Dropout(0.0)
        self.rnn = nn.LSTM(embed, hidden, layers, batch_first=True)
        self.decoder = nn.Linear(hidden, vocab)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, tokens):
        h, _ = self.rnn(self.drop(self.encoder(tokens)))
        return self.decoder(self.drop(h))


def make_model(name, seq_len):
    context = max(MAX_SEQ_LEN, seq_len)
    return {"mlp": mlp, "cnn": CNN, "resnet": ResNet, "vit": ViT,
            "gpt2_tiny": lambda: GPT(context), "lstm": LSTMLanguageModel}[name]()


# ---- the training step ---------------------------------------------------------------------------
class MasterWeights:
    """Apex O2's fp32 master copies of a bf16 model's bf16 parameters (fp32 ones, the batch
    norms, are updated in place): the optimizer steps on `params`; copy_grads() before the step,
    copy_back() after it."""

    def __init__(self, model):
        self.half = [p for p in model.parameters() if p.dtype != torch.float32]
        self.masters = [p.detach().float().requires_grad_() for p in self.half]
        for m in self.masters:
            m.grad = torch.zeros_like(m)
        self.params = self.masters + [p for p in model.parameters() if p.dtype == torch.float32]

    def copy_grads(self):
        torch._foreach_copy_([m.grad for m in self.masters], [p.grad for p in self.half])

    def copy_back(self):
        with torch.no_grad():
            torch._foreach_copy_(self.half, self.masters)


def make_step(model, precision, x, y, tokens):
    """One training step in `precision` (fp32, bf16 or bf16:O2), as a function."""
    masters = None
    if precision == "bf16:O2":
        model.to(torch.bfloat16)
        for m in model.modules():  # keep_batchnorm_fp32, as ours and Apex's O2
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.float()
        if x.is_floating_point():
            x = x.to(torch.bfloat16)
        masters = MasterWeights(model)
    params = masters.params if masters else list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.01, momentum=0.9)

    def loss_of(logits):
        if tokens:
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        return F.cross_entropy(logits, y)

    def step():
        model.zero_grad(set_to_none=True)
        if precision == "bf16":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = loss_of(model(x))
        else:
            loss = loss_of(model(x).float())
        loss.backward()
        if masters:
            masters.copy_grads()
        opt.step()
        if masters:
            masters.copy_back()

    return step


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="cnn", choices=MODELS)
    ap.add_argument("--precision", default="fp32", choices=PRECISIONS)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--seq-len", type=int, default=64, help="sequence length (token models)")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="accepted for symmetry: output is JSON")
    ap.add_argument("--channels-last", action="store_true",
                    help="conv models (cnn, resnet): weights and input in torch.channels_last")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tokens = args.model in TOKEN_MODELS
    model = make_model(args.model, args.seq_len)
    model.train()
    parameters = sum(p.numel() for p in model.parameters())  # a tied weight once
    if tokens:
        x = torch.randint(0, VOCAB, (args.batch_size, args.seq_len))
        y = torch.randint(0, VOCAB, (args.batch_size, args.seq_len))
    else:
        x = torch.rand(args.batch_size, 1, IMAGE_SIZE, IMAGE_SIZE) * 2 - 1
        y = torch.randint(0, NUM_CLASSES, (args.batch_size,))
        if args.channels_last and args.model in ("cnn", "resnet"):
            model = model.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
    step = make_step(model, args.precision, x, y, tokens)

    ms = median_ms(step, args.warmup, args.steps)
    samples = args.batch_size * (args.seq_len if tokens else 1)
    precision, _, level = args.precision.partition(":")
    label = precision + (f" {level}" if level else " O1" if precision == "bf16" else "")
    print(json.dumps({"impl": "pytorch", "model": args.model, "precision": label,
                      "batch_size": args.batch_size, "threads": torch.get_num_threads(),
                      "ms_per_step": ms,
                      "tokens_per_s" if tokens else "samples_per_s": samples / (ms / 1e3),
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "parameters": parameters, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
