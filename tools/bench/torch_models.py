#!/usr/bin/env python3
"""PyTorch eager counterpart of `mantissa bench`: one training step (forward, cross-entropy,
backward, SGD with momentum) of the same `mlp` or `cnn` on the same batch shape; one JSON line.
The architectures mirror src/nn/models_vision.cpp layer for layer.
"""
import argparse
import json
import resource

import torch
import torch.nn as nn
import torch.nn.functional as F

from bench_util import median_ms


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="cnn", choices=["mlp", "cnn"])
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true", help="accepted for symmetry: output is JSON")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = mlp() if args.model == "mlp" else CNN()
    model.train()
    x = torch.rand(args.batch_size, 1, 28, 28) * 2 - 1
    y = torch.randint(0, 10, (args.batch_size,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    ms = median_ms(step, args.warmup, args.steps)
    print(json.dumps({"impl": "pytorch", "model": args.model, "batch_size": args.batch_size,
                      "threads": args.threads, "ms_per_step": ms,
                      "samples_per_s": args.batch_size / (ms / 1e3),
                      "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                      "torch": torch.__version__}))


if __name__ == "__main__":
    main()
