"""The README quickstart and the package docstring run as written."""

from __future__ import annotations

import doctest
import re
import subprocess
import sys
from pathlib import Path

import npumem

ROOT = Path(__file__).resolve().parents[1]


def test_readme_quickstart_runs() -> None:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "the README has a Python quickstart"
    for code in blocks:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert "out of memory" in done.stdout


def test_package_docstring_examples() -> None:
    failures, tried = doctest.testmod(npumem, verbose=False)
    assert tried > 0 and failures == 0
