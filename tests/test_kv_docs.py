"""The Python examples of docs/kv.md and the docstring of npumem.kv run as written."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest

import npumem.kv

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "kv.md"
BLOCKS = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_guide_examples_run(code: str) -> None:
    exec(compile(code, str(GUIDE), "exec"), {})


def test_package_docstring() -> None:
    failures, tried = doctest.testmod(npumem.kv, verbose=False)
    assert tried > 0 and failures == 0
