#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora (fuzz/corpus/<target>/) and dictionaries' companions.

The seeds are small valid inputs of every kind each parser reads, so the fuzzer starts from the
deep paths instead of rediscovering the formats: safetensors files of every dtype (numpy and the
`safetensors` package, as PyTorch users write them) and a real Mantissa checkpoint; IDX images and
labels, raw and gzip, cut from Fashion-MNIST; token shards of both widths and a flat token file;
tokenizer files (a trained one and hand-made edge cases); numbers; training configurations;
run configs (TOML: configs/*.toml and the printed defaults); click logs (`mantissa clicks`, TSV and
CSV, and hand-made lines).

    python3 fuzz/make_seeds.py [--cli build/mantissa]

The CLI (built by scripts/setup) makes the checkpoint, the token shards and the tokenizer; the
rest needs numpy, ml_dtypes and safetensors (installed by scripts/setup). Deterministic: the same
files each time. The seeds are committed; rerun this after a format changes.
"""

import argparse
import gzip
import json
import pathlib
import shutil
import struct
import subprocess
import tempfile

import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

HERE = pathlib.Path(__file__).resolve().parent
FASHION = pathlib.Path("/usr/share/datasets/fashion-mnist")


def put(target, name, data):
    d = HERE / "corpus" / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def safetensors_seeds(cli, tmp):
    rng = np.random.default_rng(0)
    cases = {
        "f32-matrix": {"w": rng.standard_normal((3, 4)).astype(np.float32)},
        "every-dtype": {
            "f64": np.array([1.5, -2.0], np.float64),
            "f32": np.array([0.1], np.float32),
            "f16": np.array([65504, -0.0], np.float16),
            "bf16": np.array([1, 2, 3], ml_dtypes.bfloat16),
            "e4m3": np.array([448, -0.5], ml_dtypes.float8_e4m3fn),
            "e5m2": np.array([57344, 1e-5], ml_dtypes.float8_e5m2),
            "i64": np.array([-1, 2**40], np.int64),
            "i32": np.array([7], np.int32),
            "u8": np.array([0, 255], np.uint8),
            "bool": np.array([True, False]),
        },
        "scalar-and-empty": {"s": np.array(3.0, np.float32), "e": np.zeros((0, 5), np.float32)},
        "four-dims": {"x": np.arange(16, dtype=np.float16).reshape(1, 2, 2, 4)},
    }
    for name, tensors in cases.items():
        path = tmp / f"{name}.safetensors"
        save_file(tensors, str(path), metadata={"note": name} if name != "f32-matrix" else None)
        put("safetensors", name, path.read_bytes())
    # A real checkpoint: model, optimizer moments, loss-scaler state, config and checksums.
    ckpt = tmp / "checkpoint.safetensors"
    subprocess.run([cli, "train", "--model", "mlp", "--data", "synthetic", "--synthetic-size",
                    "64", "--batch-size", "32", "--steps", "2", "--precision", "fp16",
                    "--optimizer", "adamw", "--checkpoint", str(ckpt), "--threads", "1",
                    "--no-progress"], check=True, capture_output=True)
    # Its names, dtypes and metadata, with every tensor cut to one element along each dim: small
    # enough for the fuzzer to mutate quickly (a whole MLP's is 2.8 MB).
    with safe_open(str(ckpt), "numpy") as f:
        meta = f.metadata()
        small = {k: np.ascontiguousarray(f.get_tensor(k)[(slice(0, 1),) * f.get_tensor(k).ndim])
                 for k in f.keys()}
    path = tmp / "small-checkpoint.safetensors"
    save_file(small, str(path), metadata=meta)
    put("safetensors", "mantissa-checkpoint-cut", path.read_bytes())
    return ckpt


def idx_seeds():
    images = gzip.decompress((FASHION / "t10k-images-idx3-ubyte.gz").read_bytes())
    labels = gzip.decompress((FASHION / "t10k-labels-idx1-ubyte.gz").read_bytes())
    n = 2
    img = struct.pack(">IIII", 0x803, n, 28, 28) + images[16:16 + n * 784]
    lab = struct.pack(">II", 0x801, n) + labels[8:8 + n]
    put("idx", "images-2", img)
    put("idx", "labels-2", lab)
    put("idx", "images-2.gz", gzip.compress(img, mtime=0))
    put("idx", "labels-2.gz", gzip.compress(lab, mtime=0))
    put("idx", "dims2", struct.pack(">III", 0x802, 2, 3) + bytes(range(6)))
    put("idx", "dims4", struct.pack(">IIIII", 0x804, 1, 1, 2, 2) + bytes(4))
    # Two gzip members, as `cat a.gz b.gz` makes.
    put("idx", "labels-2-members.gz", gzip.compress(lab[:5], mtime=0) + gzip.compress(lab[5:], mtime=0))


def token_seeds(cli, tmp):
    text = tmp / "text.txt"
    text.write_text("the cat sat on the mat\n%\nthe theme of the thesis\n%\nsing, sang, sung\n")
    out = tmp / "tok"
    subprocess.run([cli, "tokenize", "--input", str(text), "--out", str(out), "--vocab-size",
                    "270", "--min-frequency", "1", "--val-fraction", "0.3"],
                   check=True, capture_output=True)
    put("token_shard", "shard-u16", (out / "train.bin").read_bytes())
    put("token_shard", "shard-u16-val", (out / "val.bin").read_bytes())
    put("tokenizer", "trained", (out / "tokenizer.json").read_bytes())
    # A uint32 shard (vocabulary above 65536) written by hand in the documented layout.
    tokens = np.array([0, 70000, 5, 65536], np.uint32)
    header = b"MTTOKENS" + struct.pack("<IIIIQQ", 1, 64, 70001, 4, len(tokens), 0)
    put("token_shard", "shard-u32", header.ljust(64, b"\0") + tokens.tobytes())
    put("token_shard", "shard-empty", (b"MTTOKENS" + struct.pack("<IIIIQQ", 1, 64, 257, 2, 0, 0)).ljust(64, b"\0"))
    put("token_shard", "flat-u16", np.array([1, 2, 300, 65535], np.uint16).tobytes())


def tokenizer_seeds():
    eot = {"id": None, "content": "<|endoftext|>"}

    def doc(merges, specials):
        s = [dict(eot, id=256 + len(merges) + k, content=c) for k, c in enumerate(specials)]
        return json.dumps({"format": "mantissa-bpe", "version": 1,
                           "vocab_size": 256 + len(merges) + len(specials),
                           "pre_tokenizer": "gpt2", "merges": merges,
                           "special_tokens": s}).encode()

    put("tokenizer", "byte-level", doc([], ["<|endoftext|>"]))
    put("tokenizer", "chained-merges", doc([[116, 104], [256, 101], [257, 32]], ["<|endoftext|>"]))
    put("tokenizer", "two-specials", doc([[97, 97]], ["<|pad|>", "<|endoftext|>"]))


def number_seeds():
    for i, text in enumerate(["12.31", "-1.5", "1e-5", "0x1.8p-3", "inf", "-nan", "65504",
                              "448", "57344", "1e39", "4.9e-324", "3.4028235e38", " 0.1 ",
                              "-0", "1.00000011920928955078125", "6.1035156e-05"]):
        put("number", f"n{i:02d}", text.encode())


def config_seeds(ckpt):
    # The configuration a checkpoint carries, as --resume reads it, and variations of it.
    n = struct.unpack("<Q", ckpt.read_bytes()[:8])[0]
    meta = json.loads(ckpt.read_bytes()[8:8 + n])["__metadata__"]
    config = json.loads(meta["mantissa.config"])
    put("config", "from-checkpoint", json.dumps(config).encode())
    variants = [{"precision": "bf16", "opt_level": "O2"}, {"model": "gpt2_tiny", "data": "synthetic-text"},
                {"lr": 1e-300, "batch_size": 1}, {"device": "cuda:1"}]
    for i, change in enumerate(variants):
        put("config", f"variant{i}", json.dumps(dict(config, **change)).encode())
    return config


def run_config_seeds(cli):
    # The example run configs, and the default configuration as --print-config writes it.
    for path in sorted((HERE.parent / "configs").glob("*.toml")):
        put("run_config", path.stem, path.read_bytes())
    printed = subprocess.run([cli, "train", "--print-config"], check=True, capture_output=True)
    put("run_config", "printed-defaults", printed.stdout)
    keys = [line.split(" = ")[0] for line in printed.stdout.decode().splitlines()
            if " = " in line and not line.startswith("#")]
    (HERE / "run_config.dict").write_text(
        "# Keys of a run config, as --print-config names them (made by make_seeds.py)\n"
        + "".join(f'"{k} = "\n' for k in keys))


def click_log_seeds(cli, tmp):
    # Synthetic logs as `mantissa clicks` writes them (Criteo's 40 columns, TSV and CSV), and
    # hand-made lines: other widths, missing values, CRLF, an empty line.
    for name in ("clicks.tsv", "clicks.csv"):
        out = tmp / name
        subprocess.run([cli, "clicks", "--out", str(out), "--examples", "12", "--seed", "1"],
                       check=True, capture_output=True)
        put("click_log", "synthetic-" + name.split(".")[1], out.read_bytes())
    put("click_log", "small-missing", b"1\t3\t\t0.5\tab\t\n0\t-2\t7\t\t\tcd\r\n\n1\t\t\t1e3\tab\tcd\n")
    put("click_log", "dense-only", b"0\t1\t2\n1\t4\t5\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cli", default=str(HERE.parent / "build" / "mantissa"))
    args = ap.parse_args()
    shutil.rmtree(HERE / "corpus", ignore_errors=True)
    with tempfile.TemporaryDirectory() as t:
        tmp = pathlib.Path(t)
        ckpt = safetensors_seeds(args.cli, tmp)
        idx_seeds()
        token_seeds(args.cli, tmp)
        tokenizer_seeds()
        number_seeds()
        config = config_seeds(ckpt)
        run_config_seeds(args.cli)
        click_log_seeds(args.cli, tmp)
    # The configuration's keys as a dictionary: the fuzzer combines them instead of guessing.
    keys = "".join(f'"\\"{k}\\""\n' for k in config)
    (HERE / "config.dict").write_text("# Keys of the training configuration (made by make_seeds.py)\n" + keys)


if __name__ == "__main__":
    main()
