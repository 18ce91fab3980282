#!/usr/bin/env python3
"""`mantissa tokenize` as a user runs it, on a tiny corpus this test writes itself."""
import json
import os
import struct
import subprocess
import sys
import tempfile

BIN = sys.argv[1]
failures = []


def run(*args):
    p = subprocess.run([BIN, *args], capture_output=True)
    return p.returncode, p.stdout, p.stderr.decode("utf-8", "replace")


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def header(path):
    with open(path, "rb") as f:
        b = f.read(64)
    magic, version, hbytes, vocab, width, count, fp = struct.unpack("<8sIIIIQQ", b[:40])
    return {"magic": magic, "version": version, "header_bytes": hbytes, "vocab": vocab,
            "width": width, "count": count, "fingerprint": fp}


EOT = b"<|endoftext|>"
with tempfile.TemporaryDirectory() as tmp:
    corpus = os.path.join(tmp, "corpus")
    os.makedirs(os.path.join(corpus, "sub"))
    # A fortune file (entries between lines of "%"), a plain file, invalid UTF-8, an empty file,
    # a binary index and a link (both skipped in a directory).
    entries = [f"Fortune number {i}: the quick brown fox's {i * 7} jumps over the lazy dog.\n"
               f"\t-- Someone, {1900 + i}\n".encode() for i in range(40)]
    with open(os.path.join(corpus, "fortunes"), "wb") as f:
        f.write(b"%\n".join(entries))
    docs = list(entries)
    plain = "Plain text — with “quotes”, naïve café, and 😀.\nSecond line   with spaces.  \n"
    with open(os.path.join(corpus, "sub", "plain.txt"), "wb") as f:
        f.write(plain.encode())
    docs.append(plain.encode())
    invalid = b"bytes \xff\xfe \xc3( \xed\xa0\x80 not UTF-8\n"
    with open(os.path.join(corpus, "sub", "raw"), "wb") as f:
        f.write(invalid)
    docs.append(invalid)
    open(os.path.join(corpus, "empty"), "wb").close()
    with open(os.path.join(corpus, "fortunes.dat"), "wb") as f:
        f.write(b"\x00\x00\x00\x02" + b"\x00" * 20)
    os.symlink(os.path.join(corpus, "fortunes"), os.path.join(corpus, "fortunes.u8"))

    out = os.path.join(tmp, "out")
    rc, stdout, err = run("tokenize", "--input", corpus, "--out", out, "--vocab-size", "300",
                          "--val-fraction", "0.1", "--seed", "3", "--json")
    check(rc == 0, f"tokenize exits 0 ({rc}): {err[-500:]}")
    r = json.loads(stdout) if rc == 0 else {}
    check(r.get("documents") == len(docs), f"documents {r.get('documents')} != {len(docs)}")
    check(r.get("files") == 4 and r.get("skipped") == 2, f"files/skipped: {r}")
    check(r.get("bytes") == sum(map(len, docs)), f"bytes: {r.get('bytes')}")
    check(r.get("val_documents") == 4 and r.get("train_documents") == len(docs) - 4,
          f"split: {r}")
    check(r.get("vocab_size") == 300 and r.get("merges") == 43 and r.get("eot_id") == 299,
          f"vocabulary: {r}")
    check(r.get("train_bytes_per_token", 0) > 1.5, f"merges compress: {r}")
    check(r.get("encode_mb_per_s", 0) > 0, f"encoding speed reported: {r}")
    for name in ("tokenizer.json", "train.bin", "val.bin"):
        check(os.path.exists(os.path.join(out, name)), f"{name} written")
    check(sorted(os.listdir(out)) == ["tokenizer.json", "train.bin", "val.bin"],
          f"no temporary files left: {os.listdir(out)}")
    h = header(os.path.join(out, "train.bin"))
    check(h["magic"] == b"MTTOKENS" and h["version"] == 1 and h["header_bytes"] == 64
          and h["vocab"] == 300 and h["width"] == 2 and h["count"] == r.get("train_tokens")
          and h["fingerprint"] != 0, f"train.bin header: {h}")
    check(os.path.getsize(os.path.join(out, "train.bin")) == 64 + 2 * h["count"], "train.bin size")
    tok = json.load(open(os.path.join(out, "tokenizer.json")))
    check(tok["format"] == "mantissa-bpe" and len(tok["merges"]) == 43, "tokenizer.json content")

    # Decoding both shards gives back every document exactly, each followed by <|endoftext|>.
    texts = []
    for shard in ("train.bin", "val.bin"):
        rc, text, err = run("tokenize", "--decode", os.path.join(out, shard))
        check(rc == 0, f"decode {shard} ({rc}): {err[-300:]}")
        check(text.endswith(EOT), f"{shard} ends with end-of-text")
        texts += text.split(EOT)[:-1]
    check(sorted(texts) == sorted(docs), "decode(encode(corpus)) == corpus, document by document")

    rc, text, err = run("tokenize", "--decode", os.path.join(out, "train.bin"), "--show", "5")
    check(rc == 0 and len(text.splitlines()) == 5, f"--show 5 ({rc}): {text!r} {err[-200:]}")

    # The same tokenizer again: the same tokens.
    out2 = os.path.join(tmp, "out2")
    rc, stdout, err = run("tokenize", "--input", corpus, "--out", out2, "--val-fraction", "0.1",
                          "--seed", "3", "--tokenizer", os.path.join(out, "tokenizer.json"),
                          "--json")
    check(rc == 0 and json.loads(stdout)["tokenizer"] == "loaded", f"--tokenizer ({rc}) {err}")
    for shard in ("train.bin", "val.bin"):
        same = open(os.path.join(out, shard), "rb").read() == open(os.path.join(out2, shard), "rb").read()
        check(same, f"{shard} is identical when encoded with the saved tokenizer")

    # Byte level: vocab 257, one token per byte plus one end-of-text per document.
    out3 = os.path.join(tmp, "out3")
    rc, stdout, err = run("tokenize", "--input", corpus, "--out", out3, "--byte-level",
                          "--val-fraction", "0", "--json")
    b = json.loads(stdout) if rc == 0 else {}
    check(rc == 0 and b.get("vocab_size") == 257 and b.get("merges") == 0
          and b.get("train_tokens") == sum(map(len, docs)) + len(docs) and b.get("val_tokens") == 0,
          f"--byte-level ({rc}): {b} {err[-300:]}")
    rc, text, err = run("tokenize", "--decode", os.path.join(out3, "train.bin"))
    check(rc == 0 and text.split(EOT)[:-1] == docs, "byte-level round trip, in the corpus's order")

    # A human summary names what was done.
    rc, stdout, err = run("tokenize", "--input", os.path.join(corpus, "fortunes"), "--out",
                          os.path.join(tmp, "out4"), "--vocab-size", "280")
    s = stdout.decode()
    check(rc == 0 and "bytes/token" in s and "MB/s" in s and "trained in" in s,
          f"summary ({rc}): {s!r} {err[-300:]}")

    # Mistakes: exit 2, one message naming the file and the problem, nothing half-written.
    rc, _, err = run("tokenize", "--input", os.path.join(tmp, "nowhere"), "--out", out)
    check(rc == 2 and "nowhere" in err and "does not exist" in err, f"missing input: {rc} {err!r}")
    rc, _, err = run("tokenize", "--input", os.path.join(corpus, "empty"), "--out", out)
    check(rc == 2 and "empty" in err and "no text" in err, f"empty input: {rc} {err!r}")
    rc, _, err = run("tokenize", "--input", corpus, "--vocab-size", "100", "--out", out)
    check(rc == 2 and "vocab-size" in err, f"tiny vocabulary: {rc} {err!r}")
    bad_tok = os.path.join(tmp, "bad.json")
    with open(bad_tok, "w") as f:
        f.write('{"format": "mantissa-bpe", "version": 1, "merges": [[65, 999]]')
    rc, _, err = run("tokenize", "--input", corpus, "--tokenizer", bad_tok, "--out", out)
    check(rc == 2 and "bad.json" in err and "not valid JSON" in err, f"broken tokenizer: {rc} {err!r}")
    rc, _, err = run("tokenize", "--decode", os.path.join(out3, "train.bin"), "--tokenizer",
                     os.path.join(out, "tokenizer.json"))
    check(rc == 2 and "train.bin" in err and "vocabulary of 257" in err,
          f"shard and tokenizer disagree: {rc} {err!r}")
    bad_shard = os.path.join(tmp, "bad.bin")
    with open(bad_shard, "wb") as f:
        f.write(open(os.path.join(out, "train.bin"), "rb").read()[:100])
    rc, _, err = run("tokenize", "--decode", bad_shard, "--tokenizer", os.path.join(out, "tokenizer.json"))
    check(rc == 2 and "bad.bin" in err and "truncated" in err, f"truncated shard: {rc} {err!r}")
    with open(bad_shard, "wb") as f:
        f.write(b"NOTTOKENS" + b"\x00" * 100)
    rc, _, err = run("tokenize", "--decode", bad_shard, "--tokenizer", os.path.join(out, "tokenizer.json"))
    check(rc == 2 and "bad.bin" in err and "MTTOKENS" in err, f"wrong magic: {rc} {err!r}")
    rc, _, err = run("tokenize", "--byte-level", "--tokenizer", bad_tok)
    check(rc == 2 and "excludes" in err, f"--byte-level with --tokenizer: {rc} {err!r}")
    check(sorted(os.listdir(out)) == ["tokenizer.json", "train.bin", "val.bin"],
          f"failed runs left the output as it was: {os.listdir(out)}")
    if not os.path.isdir("/usr/share/games/fortunes"):
        rc, _, err = run("tokenize", "--out", out)
        check(rc == 2 and "apt-get install fortunes" in err, f"default corpus missing: {rc} {err!r}")

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print("tokenize CLI: all checks passed")
