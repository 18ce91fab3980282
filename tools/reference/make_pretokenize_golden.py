#!/usr/bin/env python3
"""GPT-2's pre-split, by the very regular expression GPT-2 uses (with the `regex` module, as
openai/gpt-2's encoder.py does), for tests/data/tokenizer_test.cpp (PretokenizeMatchesGpt2Regex).

The strings are drawn from an alphabet on which Mantissa's character classes (tokenizer.h) agree
with Unicode's exactly: ASCII, Latin-1 letters and digits, CJK, Greek and Cyrillic letters, the
Unicode spaces, dashes, quotes and an emoji, with contraction fragments ('s 'll 'RE...) mixed in.
Seeded: the output is committed and reproducible. `regex` is not needed by the test.

    python3 tools/reference/make_pretokenize_golden.py --out tests/data/golden/pretokenize_gpt2.json
"""
import argparse
import json
import random

import regex

PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

ATOMS = (list("abcXYZ019 \t\n\r\x0b\x0c'!.,-\"$#(") + ["  ", "   ", "\n\n", "'s", "'t", "'re",
         "'ve", "'m", "'ll", "'d", "'S", "'LL", "''", "é", "ü", "ß", "中文", "αβ", "жи", "²",
         "½", "\u00a0", "\u3000", "\u2003", "\u2014", "\u201c", "\u201d", "\u2019", "😀", "×"])

FIXED = [
    "Hello world's  test 123!!",
    "I'm sure you'll see they're right, we've done it, he'd say. It's 'quoted'.",
    "a\n\nb  \t c   ",
    "  leading and trailing  ",
    "tabs\tand\nnewlines\r\nmixed \n",
    "price: $1,234.56 (approx.)",
    "don't DON'T don\u2019t",
    "",
    " ",
    "\n",
    "x",
    "123abc456",
    "hello   world",
    "naïve café — “quotes” 😀😀 中文字符",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--count", type=int, default=400)
    args = ap.parse_args()
    rng = random.Random(13)
    texts = list(FIXED)
    for _ in range(args.count):
        texts.append("".join(rng.choice(ATOMS) for _ in range(rng.randint(1, 24))))
    pat = regex.compile(PATTERN)
    cases = []
    for t in texts:
        pieces = pat.findall(t)
        assert "".join(pieces) == t
        cases.append({"text": t, "pieces": pieces})
    # One case per line: reviewable diffs, and still one JSON document.
    with open(args.out, "w", encoding="utf-8") as f:
        f.write('{"pattern": %s,\n "cases": [\n' % json.dumps(PATTERN))
        f.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in cases))
        f.write("\n]}\n")


if __name__ == "__main__":
    main()
