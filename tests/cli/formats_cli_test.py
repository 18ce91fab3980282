#!/usr/bin/env python3
"""`mantissa formats` as a user runs it: output, JSON document, exit codes."""
import json
import math
import subprocess
import sys

BIN = sys.argv[1]
failures = []


def run(*args):
    p = subprocess.run([BIN, *args], capture_output=True, text=True)
    return p.returncode, p.stdout, p.stderr


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


# The example, human and JSON.
rc, out, err = run("formats", "12.31")
check(rc == 0, f"formats 12.31 exits 0 (got {rc}, {err})")
fp32_row = next((l for l in out.splitlines() if l.split()[:1] == ["fp32"]), "")
check(fp32_row.split()[1:4] == ["0", "10000010", "10001001111010111000011"],
      f"fp32 bits of 12.31 are split sign/exp/mantissa: {fp32_row!r}")
check("0x4144f5c3" in out, "fp32 hex of 12.31")
ALL = ["fp32", "tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp6_e2m3", "fp6_e3m2", "fp4_e2m1",
       "e8m0"]
for name in ALL:
    check(name in out, f"human output lists {name}")
e8m0_row = next((l for l in out.splitlines() if l.split()[:1] == ["e8m0"]), "")
check(e8m0_row.split()[1:5] == ["-", "10000011", "-", "0x83"],
      f"e8m0 has no sign and no mantissa: 12.31 = 1.54 * 2^3 -> 2^4, shown with dashes: {e8m0_row!r}")

rc, out, err = run("formats", "--json", "12.31")
doc = json.loads(out)
check(doc["input"] == "12.31" and doc["rounding"] == "nearest", "json input/rounding")
names = [f["name"] for f in doc["formats"]]
check(names == ALL, f"json format order {names}")
byname = {f["name"]: f for f in doc["formats"]}
check(byname["fp4_e2m1"]["value"] == 6 and byname["fp4_e2m1"]["overflow"],
      f"fp4 of 12.31 saturates to 6 (no inf): {byname['fp4_e2m1']}")
check(byname["fp6_e3m2"]["value"] == 12 and byname["fp6_e3m2"]["bits"] == "0 110 10",
      f"fp6_e3m2 of 12.31: {byname['fp6_e3m2']}")
check(byname["e8m0"]["value"] == 16 and byname["e8m0"]["bits"] == "10000011",
      f"e8m0 of 12.31 is 2^4, one field: {byname['e8m0']}")
fp32 = doc["formats"][0]
check(fp32["bits"] == "0 10000010 10001001111010111000011", "json fp32 bits")
check(fp32["hex"] == "0x4144f5c3", "json fp32 hex")
check(abs(fp32["value"] - 12.3100004196167) < 1e-12, "json fp32 value")
check(fp32["class"] == "normal" and fp32["overflow"] is False and fp32["underflow"] is False,
      "json fp32 class and flags")
check(math.isclose(fp32["abs_error"], 12.3100004196167 - 12.31, rel_tol=1e-6), "json abs_error")
check(math.isclose(fp32["rel_error"], fp32["abs_error"] / 12.31, rel_tol=1e-12), "json rel_error")
fp16 = doc["formats"][2]
check(fp16["value"] == 12.3125 and fp16["hex"] == "0x4a28", f"fp16 of 12.31 is 12.3125 ({fp16})")

# Truncation differs from nearest where it should.
rc, out, _ = run("formats", "--json", "--rounding", "truncate", "12.31")
doc = json.loads(out)
check(doc["rounding"] == "truncate", "json rounding truncate")
check(doc["formats"][1]["bits"].endswith("1000100111"), "tf32 truncated mantissa")

# Several numbers: an array; every input form; negative words.
rc, out, err = run("formats", "--json", "1e-5", "0x1.8p-3", "inf", "-inf", "nan", "-2.5", "1e400")
check(rc == 0, f"many numbers exit 0 ({err})")
docs = json.loads(out)
check(isinstance(docs, list) and len(docs) == 7, "several numbers give a JSON array")
check(docs[1]["formats"][0]["value"] == 0.1875, "hex float parsed")
check(docs[2]["formats"][4]["class"] == "nan", "fp8_e4m3 of inf is NaN (no inf in the format)")
check(docs[3]["formats"][5]["value"] == "-inf", "-inf shown as a string in JSON")
check(docs[4]["formats"][0]["class"] == "nan", "nan parsed")
check(docs[6]["formats"][0]["overflow"] is True, "1e400 overflows fp32")
check(docs[0]["formats"][4]["underflow"] is True, "1e-5 underflows fp8_e4m3")

# Overflow flags and saturation.
doc = json.loads(run("formats", "--json", "70000")[1])
check(doc["formats"][2]["class"] == "inf" and doc["formats"][2]["overflow"], "fp16 overflow to inf")
doc = json.loads(run("formats", "--json", "--overflow", "saturate", "70000")[1])
check(doc["formats"][2]["value"] == 65504, "fp16 saturates to 65504")

# The table.
rc, out, _ = run("formats", "--table")
check(rc == 0 and "65504" in out and "448" in out and "57344" in out, "format table")
tab = json.loads(run("formats", "--table", "--json")[1])
check([t["name"] for t in tab][2] == "fp16" and tab[2]["max_finite"] == 65504, "json table")
row = {t["name"]: t for t in tab}
check(row["fp4_e2m1"]["max_finite"] == 6 and row["fp4_e2m1"]["min_subnormal"] == 0.5 and
      not row["fp4_e2m1"]["has_nan"] and row["fp4_e2m1"]["nan"] is None, f"fp4 row {row['fp4_e2m1']}")
check(row["fp6_e2m3"]["max_finite"] == 7.5 and row["fp6_e3m2"]["max_finite"] == 28, "fp6 rows")
check(row["e8m0"]["has_sign"] is False and row["e8m0"]["nan"] == "0xff" and
      row["e8m0"]["max_finite"] == 2.0**127 and row["e8m0"]["min_normal"] == 2.0**-127, f"e8m0 row {row['e8m0']}")
rc, out, _ = run("formats", "1.3", "--format", "fp4_e2m1")
check(rc == 0 and "fp4_e2m1" in out and " 1.5 " in out and "fp32" not in out,
      f"--format fp4_e2m1 shows that row only: {out!r}")
rc, _, err = run("formats", "1.3", "--format", "fp5")
check(rc == 2 and "fp4_e2m1" in err and "e8m0" in err, f"an unknown --format lists the table: {err!r}")

# Mistakes: one line naming the problem, exit code 2, nothing on stdout.
for bad in (["formats", "abc"], ["formats", ""], ["formats", "1.5x"], ["formats", "12", "abc"]):
    rc, out, err = run(*bad)
    check(rc == 2, f"{bad} exits 2 (got {rc})")
    check(out == "", f"{bad} prints nothing on stdout (got {out!r})")
    check(len(err.strip().splitlines()) == 1 and "not a number" in err, f"{bad} one-line error: {err!r}")
    check(repr(bad[-1])[1:-1] in err or bad[-1] == "", f"{bad} error names the input: {err!r}")
rc, _, err = run("formats", "--rounding", "up", "1")
check(rc == 2 and "rounding" in err, f"bad --rounding exits 2 ({rc}, {err!r})")
rc, _, err = run("formats")
check(rc == 2, f"no number exits 2 ({rc}, {err!r})")
rc, _, err = run("nonsense")
check(rc == 2, f"unknown command exits 2 ({rc})")

print("all CLI checks passed" if not failures else f"{len(failures)} CLI checks failed")
sys.exit(1 if failures else 0)
