#!/usr/bin/env python3
"""Checks that the layers of the design (docs/design.md, "Layers") depend one way: a file may
include headers of its own layer and of the layers below it, never of a layer above; and only the
backend layer may include a device backend's own headers (src/backend/cpu/, src/backend/cuda/).

Every source and header under src/, include/mantissa/, tools/mantissa/, bench/ and python/src/
(the Python module, which may include public headers only) belongs to the
first layer whose patterns match its path (relative to src/ or include/mantissa/, without the
extension). A quoted #include is resolved the same way. An include of a higher layer is reported
with the file, the line and both layers; the exit status is the number of such includes (0: the
layering holds). `--list` prints every file's layer.

Run by CTest (test `layering`) and so by scripts/test and CI.
"""

import argparse
import fnmatch
import pathlib
import re
import sys

# Bottom to top. A pattern is a path under src/ or include/mantissa/ without the extension, with
# shell wildcards; a pattern ending in "/" is a folder. The first layer that matches wins, so a
# narrower pattern listed in a lower layer takes a file out of its folder's layer.
LAYERS = [
    ("base", ["core/error", "core/cpu", "core/warning", "core/vocabulary", "core/clock"]),
    ("numerics", ["numerics/"]),
    ("core", ["core/"]),
    # The Tensor type itself: what the backends compute on. Its methods are implemented with the
    # ops (src/tensor/tensor.cpp belongs to "ops").
    ("tensor", ["include:tensor/tensor"]),
    ("backend", ["backend/"]),
    # The one path of an op: autocast policy -> backend kernel -> autograd record, and the
    # backward engine that runs what the ops recorded (it accumulates gradients with ops).
    # The op-level half of mixed precision sits here too: the autocast policy every op consults,
    # and fp8's quantization, scaled GEMMs and region (autocast/).
    ("ops", ["tensor/", "autograd/", "autocast/"]),
    # Quality metrics of what a model makes (the Frechet distance, MS-SSIM): computed with ops.
    ("metrics", ["metrics/"]),
    ("io", ["io/"]),
    ("data", ["data/"]),
    ("nn", ["nn/"]),
    ("optim", ["optim/"]),
    # The mixed-precision recipe on top of models and optimizers: GradScaler, opt levels.
    ("amp", ["amp/"]),
    # Data parallel: communicators (MPI, NCCL) and the DDP gradient buckets, over models,
    # optimizers and the loss scaler; the trainer drives it.
    ("dist", ["dist/"]),
    # The run's configuration: the option table, its vocabularies, run configs and --resume.
    ("config", ["config/"]),
    ("train", ["train/"]),
    # The precision study: the matrix of model families x recipes, run with the training layer.
    ("study", ["study/"]),
    ("tools", ["mantissa", "tools:", "bench:", "python:"]),
]

# A device backend's own folder is private to the backend layer: the layers above reach a device
# only through the Backend interface (backend/backend.h) and the public core/ headers.
PRIVATE = ["backend/cpu/", "backend/cuda/"]

ROOTS = [("src", "src"), ("include", "include/mantissa"), ("tools", "tools/mantissa"),
         ("bench", "bench"), ("python", "python/src")]
SUFFIXES = {".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(kind, rel):
    """The layer index of a file of `kind` (src, include, tools, bench) at `rel` (no suffix)."""
    for index, (_, patterns) in enumerate(LAYERS):
        for pattern in patterns:
            if ":" in pattern:
                want, _, pat = pattern.partition(":")
                if want != kind:
                    continue
                if pat == "" or fnmatch.fnmatch(rel, pat) or rel.startswith(pat):
                    return index
                continue
            if kind in ("tools", "bench", "python"):
                continue
            if pattern.endswith("/") and rel.startswith(pattern):
                return index
            if fnmatch.fnmatch(rel, pattern):
                return index
    return None


def resolve(include, root):
    """(kind, rel) of a quoted include, or None for a file outside the project's layers."""
    path = pathlib.PurePosixPath(include)
    rel = str(path.with_suffix(""))
    if include.startswith("mantissa/"):
        return "include", rel[len("mantissa/"):]
    if (root / "src" / include).exists():
        return "src", rel
    return None


def files(root):
    for kind, folder in ROOTS:
        base = root / folder
        for path in sorted(base.rglob("*")):
            if path.suffix in SUFFIXES and path.is_file():
                yield kind, str(path.relative_to(base).with_suffix("")), path


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default=pathlib.Path(__file__).resolve().parents[1],
                        type=pathlib.Path, help="the repository (default: this script's)")
    parser.add_argument("--list", action="store_true", help="print every file's layer")
    args = parser.parse_args()
    root = args.root

    upward, unplaced, checked = [], [], 0
    for kind, rel, path in files(root):
        own = layer_of(kind, rel)
        if own is None:
            unplaced.append(str(path.relative_to(root)))
            continue
        if args.list:
            print(f"{LAYERS[own][0]:9} {path.relative_to(root)}")
        for number, line in enumerate(path.read_text().splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = resolve(m.group(1), root)
            if target is None:
                # A header next to the file (tools/mantissa/commands.h): its own layer.
                continue
            other = layer_of(*target)
            if other is None:
                unplaced.append(m.group(1))
                continue
            checked += 1
            private = next((p for p in PRIVATE if target[1].startswith(p)), None)
            if private and target[0] == "src" and not (kind == "src" and rel.startswith("backend/")):
                upward.append(f"{path.relative_to(root)}:{number}: includes \"{m.group(1)}\", "
                              f"private to {private}; go through backend/backend.h")
                continue
            if kind == "python" and target[0] == "src":
                upward.append(f"{path.relative_to(root)}:{number}: includes \"{m.group(1)}\"; the "
                              "Python module uses the public API (include/mantissa/) only")
                continue
            if other > own:
                upward.append(f"{path.relative_to(root)}:{number}: {LAYERS[own][0]} includes "
                              f"\"{m.group(1)}\" of the higher layer {LAYERS[other][0]}")
    for u in sorted(set(unplaced)):
        print(f"no layer for {u}: add it to LAYERS in tools/check_layers.py and to "
              "docs/design.md", file=sys.stderr)
    for u in upward:
        print(u, file=sys.stderr)
    order = " < ".join(name for name, _ in LAYERS)
    print(f"{checked} includes checked against the layers {order}: {len(upward)} upward",
          file=sys.stderr)
    return min(len(upward) + len(set(unplaced)), 125)


if __name__ == "__main__":
    sys.exit(main())
