#!/usr/bin/env python3
"""`mantissa --version` as a user runs it, and the build-time script behind its git commit.

    version_cli_test.py MANTISSA CMAKE SOURCE_DIR BUILD_TYPE
"""
import os
import re
import subprocess
import sys
import tempfile

BIN, CMAKE, SOURCE, BUILD_TYPE = sys.argv[1:5]
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(*args, **kw):
    return subprocess.run(list(args), capture_output=True, text=True, **kw)


p = run(BIN, "--version")
check(p.returncode == 0, f"--version exits 0 (got {p.returncode}, {p.stderr})")
print(p.stdout)
lines = p.stdout.splitlines()
first = lines[0] if lines else ""
m = re.fullmatch(r"mantissa (\d+\.\d+\.\d+) \(git ([0-9a-f]{7,40}(?:-dirty)?|unknown), "
                 r"(\S+) build, (.+)\)", first)
check(m is not None, f"first line: version, git commit, build type, compiler: {first!r}")
if m:
    version, commit, build_type, compiler = m.groups()
    cmakelists = open(os.path.join(SOURCE, "CMakeLists.txt")).read()
    project = re.search(r"project\(mantissa VERSION (\S+)", cmakelists).group(1)
    check(version == project, f"version {version} is CMakeLists.txt's {project}")
    check(build_type == BUILD_TYPE, f"build type {build_type} is {BUILD_TYPE}")
    check(re.match(r"(GNU|Clang|AppleClang|IntelLLVM) \d", compiler) is not None,
          f"compiler named with its version: {compiler!r}")
    head = run("git", "-C", SOURCE, "rev-parse", "--short=12", "HEAD")
    if head.returncode == 0 and commit != "unknown":
        check(commit.split("-")[0] == head.stdout.strip(),
              f"git commit {commit} is HEAD's {head.stdout.strip()}")

fields = dict(l.split(":", 1) for l in lines[1:] if ":" in l and not l.startswith(" "))
fields = {k.strip(): v.strip() for k, v in fields.items()}
for name in ("cuda", "cudnn", "nccl", "mpi"):
    check(re.match(r"(not )?built in", fields.get(name, "")) is not None,
          f"{name}: says whether it is built in ({fields.get(name)!r})")
check((fields.get("cuda", "").startswith("built")) == (fields.get("cudnn", "").startswith("built")),
      "cuDNN comes with the CUDA backend")
check(re.match(r"\d+ \(.+\)", fields.get("gpus", "")) is not None,
      f"gpus: a count and why ({fields.get('gpus')!r})")

# The CPU features and GPU count are what `mantissa info` detects.
info = run(BIN, "info").stdout
info_cpu = re.search(r"^cpu features: (.*)$", info, re.M)
check(info_cpu is not None and fields.get("cpu features") == info_cpu.group(1),
      f"cpu features as `mantissa info` says: {fields.get('cpu features')!r}")
info_gpus = re.search(r"^cuda devices: (\d+)", info, re.M)
check(info_gpus is not None and fields.get("gpus", "").split()[:1] == [info_gpus.group(1)],
      "gpu count as `mantissa info` says")
check(info.splitlines()[0] == f"mantissa {m.group(1) if m else '?'}", "info's first line")

# Outside a git checkout (a release tarball) the commit is "unknown"; the header is rewritten
# only when its text changes (so a rebuild on the same commit recompiles nothing).
script = os.path.join(SOURCE, "cmake", "build_info.cmake")
with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "info.h")
    args = [CMAKE, f"-DSOURCE_DIR={tmp}", f"-DOUT={out}", "-DVERSION=9.8.7", "-DBUILD_TYPE=Release",
            "-DCOMPILER=GNU 12", "-DCUDA=not built in", "-DCUDNN=not built in",
            "-DNCCL=not built in", "-DMPI=not built in", "-P", script]
    # GIT_CEILING_DIRECTORIES: a temporary folder inside some other checkout is still no checkout.
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=os.path.dirname(tmp))
    r = run(*args, env=env)
    check(r.returncode == 0, f"build_info.cmake runs outside a checkout ({r.stderr})")
    text = open(out).read() if os.path.exists(out) else ""
    check('kGitHash = "unknown"' in text, "no git checkout: commit unknown")
    check('kVersion = "9.8.7"' in text, "version written")
    os.utime(out, (1, 1))
    run(*args, env=env)
    check(os.stat(out).st_mtime == 1, "an unchanged header is not rewritten")

if failures:
    print(f"{len(failures)} check(s) failed")
    sys.exit(1)
print("all checks passed")
