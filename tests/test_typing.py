"""The types users see: the README's numpy idiom and a block passed to `np.from_dlpack` pass
mypy --strict, and the stubs' Literal types refuse misspelt modes and backings."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MISUSE = """\
import npumem
from npumem.compaction import Compactor

pool = npumem.Pool(1 << 20, backing="gpu")
Compactor(pool).compact("fulll")
pool.compact_step(pool.pause(), "ful")
"""

# numpy's `from_dlpack` takes what declares `__dlpack__` to return a capsule.
DLPACK = """\
import numpy as np
import npumem

pool = npumem.Pool(1 << 20)
arr = np.from_dlpack(pool.alloc(4096))
print(arr.nbytes)
"""


def test_readme_idiom_passes_mypy_strict_and_literals_catch_typos(tmp_path: Path) -> None:
    code = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    assert code
    (tmp_path / "readme_example.py").write_text(code[0])
    (tmp_path / "misuse.py").write_text(MISUSE)
    (tmp_path / "dlpack.py").write_text(DLPACK)
    config = tmp_path / "mypy.ini"
    config.write_text("[mypy]\n")
    command = [sys.executable, "-m", "mypy", "--strict", "--no-incremental"]
    command += ["--config-file", str(config), "readme_example.py", "misuse.py", "dlpack.py"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    lines = done.stdout.splitlines()
    assert not [x for x in lines if x.startswith(("readme_example.py", "dlpack.py"))], done.stdout
    errors = [x for x in lines if x.startswith("misuse.py") and ": error:" in x]
    assert len(errors) == 3, done.stdout
    assert any("'gpu'" in x for x in errors) and any("'fulll'" in x for x in errors)
