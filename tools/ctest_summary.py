#!/usr/bin/env python3
"""Filters ctest's output for scripts/test: passes it through as it comes, except that the tests
skipped for want of a GPU leave ctest's closing "The following tests did not run:" list (on CI
that is hundreds of CUDA tests) and are counted instead in one line:

    N GPU tests skipped: no CUDA device

The count comes from ctest's log of the run (Testing/Temporary/LastTest.log): every test
program ends its output with "N GPU test(s) skipped: no CUDA device" (tests/support/
gpu_skips.cpp), and ctest runs one test per program run.

    ctest ... | ctest_summary.py BUILD_DIR
"""
import re
import sys

SUMMARY = re.compile(r"^(\d+) GPU tests? skipped: no CUDA device$")


def gpu_skips(log_path):
    """Names of the tests in ctest's log whose output counts GPU skips, and the count."""
    names, count, name, in_output = set(), 0, None, False
    try:
        log = open(log_path, errors="replace")
    except OSError:
        return names, 0
    with log:
        for line in log:
            line = line.rstrip("\n")
            m = re.match(r"^\d+/\d+ Test: (.*)$", line)
            if m:
                name, in_output = m.group(1), False
            elif line == "Output:":
                in_output = True
            elif line == "<end of output>":
                in_output = False
            elif in_output and name is not None:
                m = SUMMARY.match(line)
                if m:
                    names.add(name)
                    count += int(m.group(1))
    return names, count


def main():
    build = sys.argv[1]
    held = None  # the lines of "The following tests did not run:", held back to the end
    rest = []
    for line in sys.stdin:
        if held is None and line.startswith("The following tests did not run:"):
            held = []
            continue
        if held is not None and not rest and line.startswith("\t"):
            held.append(line)
            continue
        if held is not None:
            rest.append(line)  # what ctest prints after the list (failures)
            continue
        sys.stdout.write(line)
        sys.stdout.flush()
    names, count = gpu_skips(f"{build}/Testing/Temporary/LastTest.log")
    kept = [l for l in (held or [])
            if (m := re.match(r"^\t\s*\d+ - (.*) \(Skipped\)$", l)) is None
            or m.group(1) not in names]
    if kept:
        sys.stdout.write("The following tests did not run:\n")
        sys.stdout.writelines(kept)
    sys.stdout.writelines(rest)
    if count:
        print(f"{count} GPU test{'s' if count != 1 else ''} skipped: no CUDA device")


if __name__ == "__main__":
    main()
