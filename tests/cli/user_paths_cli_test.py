#!/usr/bin/env python3
"""The paths a new user takes, through the real executable: what they give is honoured or refused
by name (never silently replaced), resuming keeps the file they named, limits are checked before
any work, paths work from any directory, and every message speaks in flags. One section per item
of the user-paths issue (docs/training.md: "Checkpoints and resuming", "Stopping a run",
gradient accumulation's step that must fit the data; docs/nn.md: generate's sliding window).

  user_paths_cli_test.py MANTISSA
"""
import hashlib
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time

BIN = os.path.abspath(sys.argv[1])
SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
ENV = dict(os.environ, OMP_NUM_THREADS="1")
failures = []


def run(*args, cwd=None, timeout=120):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, cwd=cwd, env=ENV,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def refused(args, *says, cwd=None, timeout=120):
    """The command exits 2 with every string of `says` in its message, and prints nothing else."""
    rc, out, err = run(*args, cwd=cwd, timeout=timeout)
    ok = rc == 2 and out == "" and all(s in err for s in says)
    check(ok, f"{' '.join(args)}: expected exit 2 naming {says}; got {rc}: {err[-600:]!r}")
    return err


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def rewrite_metadata(src, dst, edit):
    """Copies a safetensors file with its header's __metadata__ changed by `edit` (a function of
    the dict), the tensor bytes as they were: what a user editing the header does."""
    data = open(src, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    edit(header["__metadata__"])
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    open(dst, "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:])


MLP = ["train", "--data", "synthetic", "--synthetic-size", "1024", "--model", "mlp",
       "--batch-size", "64", "--threads", "1", "--workers", "0", "--no-progress"]
GAN = ["train", "--model", "dcgan", "--data", "synthetic", "--synthetic-size", "256",
       "--batch-size", "32", "--threads", "1", "--fd-feature-steps", "3", "--no-progress",
       "--json"]

with tempfile.TemporaryDirectory() as tmp:
    here = lambda *p: os.path.join(tmp, *p)  # noqa: E731

    # 1. The GAN honours what it is given: an explicit --lr or --optimizer changes the run.
    def gan_loss(*extra):
        rc, out, err = run(*GAN, "--steps", "3", *extra)
        check(rc == 0, f"dcgan {extra} ({rc}): {err[-400:]}")
        return json.loads(out)["final_loss_d"] if rc == 0 else None

    base = gan_loss()
    for extra in (["--lr", "0.05"], ["--optimizer", "sgd"], ["--weight-decay", "0.5"]):
        check(gan_loss(*extra) != base, f"dcgan {extra} runs differently from the defaults")

    # 2. --resume: a changed option is taken or refused by name, never silently replaced.
    ckpt = here("run.safetensors")
    rc, _, err = run(*MLP, "--steps", "4", "--checkpoint", ckpt)
    check(rc == 0, f"the first run ({rc}): {err[-300:]}")
    for flag in (["--clip-grad-norm", "1e-6"], ["--nesterov"], ["--synthetic-size", "2048"]):
        refused(["train", "--resume", ckpt, "--steps", "6", *flag, "--no-progress"], flag[0])

    # 3. A refused run writes nothing: no metrics file for a run that never happened.
    metrics = here("refused.jsonl")
    refused(["train", "--resume", ckpt, "--lr", "0.5", "--metrics", metrics], "--lr")
    refused([*MLP, "--batch-size", "100000", "--metrics", metrics], "--batch-size")
    check(not os.path.exists(metrics), "a refused run leaves no metrics file")

    # 4. Resuming from a copy writes the copy, not the file the copy came from.
    copy = here("copy.safetensors")
    shutil.copy(ckpt, copy)
    before = sha(ckpt)
    rc, _, err = run("train", "--resume", copy, "--steps", "6", "--no-progress")
    check(rc == 0, f"resume from a copy ({rc}): {err[-300:]}")
    check(sha(ckpt) == before, "resuming from a copy leaves the original as it was")
    check(sha(copy) != before, "resuming from a copy writes the copy")

    # 5. The configuration and training state are checksummed: an edited lr is refused.
    edited = here("edited.safetensors")

    def raise_lr(meta):
        config = json.loads(meta["mantissa.config"])
        config["lr"] = 10.0
        meta["mantissa.config"] = json.dumps(config)

    rewrite_metadata(ckpt, edited, raise_lr)
    refused(["train", "--resume", edited, "--steps", "6"], "changed after it was written")

    # 6 and 7. Limits checked up front, one rule per number, the same from the CLI and TOML.
    t0 = time.time()
    refused([*MLP, "--grad-accum", "1000000"], "--grad-accum", timeout=30)
    refused(["train", "--model", "gpt2_tiny", "--data", "synthetic-text", "--grad-accum",
             "1000000", "--no-progress"], "--grad-accum", "tokens", timeout=30)
    check(time.time() - t0 < 30, "a step larger than the data is refused at once")
    refused([*MLP, "--batch-size", "9223372036854775807"], "--batch-size")
    refused([*MLP, "--steps", "-1"], "--steps")
    refused([*MLP, "--seed", "-1"], "--seed")
    toml = here("seed.toml")
    open(toml, "w").write("seed = -1\n")
    refused(["train", "--config", toml, "--data", "synthetic"], "seed")
    err = refused([*MLP, "--lr", "inf"], "--lr", "inf")
    check("null" not in err, f"--lr inf is named as inf: {err!r}")
    open(toml, "w").write("lr = inf\n")
    err = refused(["train", "--config", toml, "--data", "synthetic"], "lr", "inf")
    check("null" not in err, f"TOML lr = inf is named as inf: {err!r}")

    # 8. A language model's checkpoint works from any directory; moved data is named with the
    # option that fixes it.
    corpus = here("corpus")
    os.makedirs(corpus)
    with open(os.path.join(corpus, "a.txt"), "w") as f:
        f.write("\n%\n".join(f"fortune {i}: the quick brown fox jumps over the lazy dog {i * 7}"
                             for i in range(200)))
    rc, _, err = run("tokenize", "--input", "corpus", "--out", "tok", "--vocab-size", "300",
                     cwd=tmp)
    check(rc == 0, f"tokenize ({rc}): {err[-300:]}")
    lm = ["train", "--model", "gpt2_tiny", "--data", "text", "--data-path", "tok", "--seq-len",
          "16", "--batch-size", "8", "--steps", "3", "--threads", "1", "--no-progress"]
    rc, _, err = run(*lm, "--checkpoint", "lm.safetensors", cwd=tmp)
    check(rc == 0, f"train a language model ({rc}): {err[-300:]}")
    elsewhere = here("elsewhere")
    os.makedirs(elsewhere)
    lm_ckpt = here("lm.safetensors")
    rc, out, err = run("eval", "--checkpoint", lm_ckpt, "--json", cwd=elsewhere)
    check(rc == 0, f"eval from another directory ({rc}): {err[-300:]}")
    rc, out, err = run("generate", "--checkpoint", lm_ckpt, "--max-tokens", "5", "--json",
                       cwd=elsewhere)
    check(rc == 0, f"generate from another directory ({rc}): {err[-300:]}")
    os.rename(here("tok"), here("tok_moved"))
    refused(["eval", "--checkpoint", lm_ckpt], "--data-path")
    refused(["generate", "--checkpoint", lm_ckpt], "--tokenizer")
    rc, _, err = run("eval", "--checkpoint", lm_ckpt, "--data-path", here("tok_moved"))
    check(rc == 0, f"eval --data-path of the moved data ({rc}): {err[-300:]}")
    os.rename(here("tok_moved"), here("tok"))

    # 9. generate past the model's context (--seq-len 16): the window slides; flags are checked
    # before anything is printed, in flags' names.
    rc, out, err = run("generate", "--checkpoint", lm_ckpt, "--max-tokens", "64", "--json",
                       "--temperature", "1", "--top-k", "0")
    got = json.loads(out) if rc == 0 else {}
    check(rc == 0 and (got.get("tokens") == 64 or got.get("stopped") == "endoftext"),
          f"generate 64 tokens past a context of 16 ({rc}): {out!r} {err[-300:]!r}")
    for flag, value in (("--top-p", "2"), ("--top-k", "-1"), ("--temperature", "-1")):
        err = refused(["generate", "--checkpoint", lm_ckpt, "--prompt", "fortune", flag, value],
                      flag)
        check("generate: generate" not in err and "top_p" not in err, f"{flag}: {err!r}")

    # 10. A one-document corpus tokenizes to a directory that trains (the end of train.bin held
    # out); a binary file is refused, not tokenized as text.
    one = here("one")
    os.makedirs(one)
    open(os.path.join(one, "a.txt"), "w").write("one document of words " * 40)
    rc, _, err = run("tokenize", "--input", one, "--out", here("one_tok"), "--byte-level")
    check(rc == 0 and "5%" in err, f"tokenize one document ({rc}): {err[-300:]}")
    rc, _, err = run("train", "--model", "gpt2_tiny", "--data", "text", "--data-path",
                     here("one_tok"), "--seq-len", "8", "--batch-size", "2", "--steps", "2",
                     "--threads", "1", "--no-progress")
    check(rc == 0 and "holds no tokens" in err, f"train on an empty val.bin ({rc}): {err[-300:]}")
    refused(["tokenize", "--input", BIN, "--out", here("bin_tok")], "binary")

    # 11. bench runs what it lists and names what it cannot.
    rc, out, _ = run("bench", "--help")
    models_line = next((l for l in out.splitlines() if "--model" in l), "")
    check("dcgan_discriminator" not in models_line and "cnn" in models_line,
          f"bench --help lists the models it runs: {models_line!r}")
    check("128" in next((l for l in out.splitlines() if "--seq-len" in l), ""),
          "bench's --seq-len defaults to train's 128")
    for model, says in (("dcgan_generator", "--model dcgan"), ("dcgan", "mantissa train"),
                        ("dcn", "mantissa train")):
        refused(["bench", "--model", model, "--steps", "1"], says)
    err = refused(["bench", "--model", "cnn", "--precision", "fp8", "--steps", "1"],
                  "--fp8-layers all", "2 Linear layers")
    rc, out, _ = run("train", "--help")
    check("dcgan_generator" not in out, "train --help lists no GAN halves")

    # 12. Click logs: a checkpoint given a log of another layout, and a binary file.
    log3, log4 = here("three.tsv"), here("four.tsv")
    open(log3, "w").write("".join(f"{i % 2}\t0.{i}\tc{i % 5}\n" for i in range(40)))
    open(log4, "w").write("".join(f"{i % 2}\t0.{i}\tc{i % 5}\td{i % 3}\n" for i in range(40)))
    clicks = here("clicks.safetensors")
    rc, _, err = run("train", "--model", "dcn", "--data", "clicks", "--data-path", log3,
                     "--batch-size", "8", "--steps", "2", "--threads", "1", "--no-progress",
                     "--checkpoint", clicks)
    check(rc == 0, f"train on a click log ({rc}): {err[-300:]}")
    err = refused(["eval", "--checkpoint", clicks, "--data-path", log4], "does not fit")
    check("load_state_dict" not in err, f"another layout in the user's words: {err!r}")
    err = refused(["train", "--model", "dcn", "--data", "clicks", "--data-path", BIN], "binary")
    check(all(32 <= ord(c) < 127 or c == "\n" for c in err), f"no raw bytes printed: {err!r}")

    # 14. The command that continues a stopped run names the executable that ran.
    # 16. A GAN stopped by Ctrl-C says so, with that command.
    stop_ckpt = here("stopped.safetensors")
    p = subprocess.Popen([BIN, *GAN, "--steps", "100000", "--checkpoint", stop_ckpt,
                          "--log-every", "1", "--metrics", here("gan.jsonl")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    deadline = time.time() + 60
    while time.time() < deadline and not (
            os.path.exists(here("gan.jsonl")) and '"kind":"train"' in open(here("gan.jsonl")).read()):
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    check(p.returncode == 130 and "stopped by Ctrl-C" in err and
          f"{os.path.realpath(BIN)} train --resume {stop_ckpt}" in err,
          f"a stopped GAN says how to continue with this executable ({p.returncode}): {err[-500:]!r}")

    # 15. Parse errors name the option, the value, the nearest spelling and the subcommand's help.
    for args, says in (
            (["train", "--bach-size", "3"], ["--bach-size", "--batch-size", "mantissa train --help"]),
            (["train", "--epochs", "1", "--epochs", "2"], ["--epochs", "once"]),
            (["trian"], ["'trian'", "'train'"]),
            (["bogus"], ["'bogus'", "train, eval"]),
            (["eval"], ["--checkpoint is required", "mantissa eval --help"]),
            (["train", "--model"], ["--model needs a value"]),
            (["bench", "--steps", "1.5"], ["--steps", "integer", "'1.5'"]),
            (["generate", "--checkpoint", lm_ckpt, "--top-p", "abc"], ["--top-p", "number", "'abc'"]),
            (["train", "stray"], ["'stray'"])):
        err = refused(args, *says)
        check("not expected" not in err and "Could not convert" not in err and
              "mantissa --help' for the commands" not in err, f"{args}: CLI11's words: {err!r}")

    # 16. Internal names stay out of messages.
    tok = json.load(open(here("tok", "tokenizer.json")))
    tok["merges"] = "a b"
    json.dump(tok, open(here("merges.json"), "w"))
    refused(["tokenize", "--tokenizer", here("merges.json"), "--input", corpus, "--out",
             here("t2")], "\"merges\" is string")
    p = subprocess.run([sys.executable, "-c", "import mantissa"], capture_output=True, text=True,
                       env=dict(ENV, PYTHONPATH=os.path.join(SRC, "python")), cwd=tmp)
    check(p.returncode != 0 and "not built" in p.stderr and "circular" not in p.stderr.splitlines()[-1],
          f"importing the source tree without the extension: {p.stderr[-300:]!r}")

    # 17. Help: eval and generate take --threads; eval names language models.
    for sub in ("eval", "generate"):
        rc, out, _ = run(sub, "--help")
        check("--threads" in out, f"{sub} --help has --threads")
    rc, out, _ = run("eval", "--help")
    check("language model" in out, "eval --help mentions language models")

    # Beside the list, the same kind found and fixed: numbers a subcommand ignored or named by
    # its C++ name, a missing file reported as a missing tokenizer.
    refused(["clicks", "--out", here("x.tsv"), "--dense", "-1"], "--dense")
    refused(["tokenize", "--input", corpus, "--out", here("t3"), "--show", "-3"], "--show")
    refused(["tokenize", "--decode", here("nowhere.bin")], "nowhere.bin", "does not exist")
    refused(["eval", "--checkpoint", ckpt, "--threads", "-2"], "--threads")
    refused(["bench", "--steps", "1", "--threads", "-1"], "--threads")

print("FAILED:" if failures else "all passed", len(failures) or "")
sys.exit(1 if failures else 0)
