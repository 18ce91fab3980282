#!/usr/bin/env python3
"""Run configs as a user writes them: `mantissa train --config run.toml`, `--print-config`,
`--config-from` a checkpoint or a metrics file, the mistakes, and every file in configs/.

usage: config_cli_test.py MANTISSA SOURCE_DIR
"""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

BIN, SOURCE = sys.argv[1], sys.argv[2]
failures = []


def run(*args):
    p = subprocess.run([BIN, *args], capture_output=True, text=True, timeout=300)
    return p.returncode, p.stdout, p.stderr


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def keys(toml_text):
    return dict(re.findall(r"^([a-z0-9-]+) = (.*)$", toml_text, re.M))


# Every option of `train --help` is a key of the printed configuration, with the same name.
rc, help_text, _ = run("train", "--help")
options = set(re.findall(r"^\s+(?:-\w, )?--([a-z0-9-]+)", help_text, re.M))
rc, printed, err = run("train", "--print-config")
check(rc == 0, f"--print-config exits 0: {err}")
not_config = {"help", "json", "config", "config-from", "print-config", "no-progress", "resume"}
missing = sorted(o for o in options - not_config if o not in keys(printed))
check(len(options) > 50 and not missing, f"options without a config key: {missing}")
check("progress" in keys(printed), "--no-progress is the key progress")

with tempfile.TemporaryDirectory() as tmp:
    cfg = os.path.join(tmp, "run.toml")
    metrics = os.path.join(tmp, "m.jsonl")
    ckpt = os.path.join(tmp, "run.safetensors")
    with open(cfg, "w") as f:
        f.write(f"""# a small run
model = "mlp"
data = "synthetic"
synthetic_size = 1024   # underscores stand for dashes
batch-size = 64
epochs = 1
lr = 0.02
seed = 7
threads = 1
precision = "bf16"
metrics = "{metrics}"
checkpoint = "{ckpt}"
""")
    # The command line overrides the file.
    rc, out, err = run("train", "--config", cfg, "--lr", "0.03", "--print-config")
    k = keys(out)
    check(rc == 0 and k.get("lr") == "0.03" and k.get("batch-size") == "64" and
          k.get("model") == '"mlp"' and k.get("synthetic-size") == "1024",
          f"file + command line: {rc} {err} {k.get('lr')} {k.get('batch-size')}")
    # The printed configuration reads back to itself.
    printed_cfg = os.path.join(tmp, "printed.toml")
    with open(printed_cfg, "w") as f:
        f.write(out)
    rc, again, err = run("train", "--config", printed_cfg, "--print-config")
    check(rc == 0 and again == out, f"--print-config reads back to itself: {err}")

    rc, out, err = run("train", "--config", cfg, "--no-progress", "--json")
    check(rc == 0, f"a run from the file trains: {rc} {err[-400:]}")
    first = json.loads(out) if rc == 0 else {}
    head = json.loads(open(metrics).readline()) if os.path.exists(metrics) else {}
    check(head.get("kind") == "config" and head.get("config", {}).get("lr") == 0.02,
          f"the metrics file begins with the configuration: {str(head)[:200]}")

    # Reproduced from its outputs: the same configuration (but its outputs), the same result.
    for source in (ckpt, metrics):
        rc, out, err = run("train", "--config-from", source, "--print-config")
        k = keys(out)
        check(rc == 0 and k.get("lr") == "0.02" and k.get("seed") == "7" and
              k.get("metrics") == '""' and k.get("checkpoint") == '""',
              f"--config-from {os.path.basename(source)}: {rc} {err} {k.get('metrics')}")
        rc, out, err = run("train", "--config-from", source, "--no-progress", "--json")
        again = json.loads(out) if rc == 0 else {}
        check(rc == 0 and again.get("test_loss") == first.get("test_loss") and
              again.get("steps") == first.get("steps"),
              f"the rerun from {os.path.basename(source)} gives the same result: {rc} "
              f"{again.get('test_loss')} vs {first.get('test_loss')} {err[-300:]}")
    rc, out, err = run("train", "--config-from", ckpt, "--epochs", "2", "--print-config")
    check(rc == 0 and keys(out).get("epochs") == "2", "--config-from then the command line")
    with open(os.path.join(tmp, "other.jsonl"), "w") as f:
        f.write('{"kind":"train","step":1}\n')
    rc, _, err = run("train", "--config-from", os.path.join(tmp, "other.jsonl"))
    check(rc == 2 and "without a configuration record" in err, f"a metrics file without one: {err}")

    # Mistakes: exit 2, the file, the line and the key, nothing written.
    bad = os.path.join(tmp, "bad.toml")
    out_metrics = os.path.join(tmp, "never.jsonl")
    cases = [
        ("bach-size = 32", "bad.toml:2: unknown key 'bach-size'; did you mean 'batch-size'?"),
        ("batch-size = \"32\"", "bad.toml:2: 'batch-size' must be an integer, not a string"),
        ("batch-size = 0", "bad.toml:2: 'batch-size': --batch-size must be positive"),
        ("precision = \"fp12\"", "bad.toml:2: 'precision'"),
        ("[training]\nlr = 1", "bad.toml:2: 'training' is a table"),
        ("[optimizer]\nlr = 1", "bad.toml:2: 'optimizer' must be a string (in quotes), not a table"),
        ("model = \"mlp", "bad.toml:2:"),
    ]
    for body, says in cases:
        with open(bad, "w") as f:
            f.write(f'metrics = "{out_metrics}"\n{body}\n')
        rc, out, err = run("train", "--config", bad)
        check(rc == 2 and says in err and "Traceback" not in err and not os.path.exists(out_metrics),
              f"{body!r}: {rc} {err!r}")
    rc, _, err = run("train", "--config", os.path.join(tmp, "absent.toml"))
    check(rc == 2 and "absent.toml" in err, f"a missing file is named: {err}")
    rc, _, err = run("train", "--resume", ckpt, "--config", cfg)
    check(rc == 2 and "--resume" in err, f"--resume with --config is refused: {err}")

# The shipped examples are valid configurations.
examples = sorted(glob.glob(os.path.join(SOURCE, "configs", "*.toml")))
check(len(examples) >= 8, f"configs/ holds the examples: {examples}")
for path in examples:
    rc, out, err = run("train", "--config", path, "--print-config")
    model = os.path.basename(path).split(".")[0].replace("_fp8", "")
    check(rc == 0 and keys(out).get("model") == f'"{model}"', f"{path}: {rc} {err}")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("config: all checks passed")
