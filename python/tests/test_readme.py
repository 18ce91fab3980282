"""The README's Python example runs as printed and trains."""
import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_example_trains_in_bf16():
    blocks = re.findall(r"^```python\n(.*?)^```$", README.read_text(), re.M | re.S)
    assert blocks, "README.md has a Python example"
    code = blocks[0]
    assert len(code.strip().splitlines()) <= 12
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loss = float(re.search(r"bf16 loss after 30 steps: ([0-9.]+)", out.stdout).group(1))
    assert loss < 2.0  # from ln(10) = 2.30 at the start
