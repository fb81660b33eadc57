"""What `from npumem import plan` gives a fresh interpreter: every name of `plan.__all__`,
the network builders and instance makers as attributes (as docs/planner.md writes
`plan.networks.resnet50`), without importing the submodules by hand."""

from __future__ import annotations

import subprocess
import sys


def test_a_fresh_import_reaches_every_documented_name() -> None:
    code = (
        "from npumem import plan\n"
        "missing = [n for n in plan.__all__ if not hasattr(plan, n)]\n"
        "assert not missing, missing\n"
        "graph = plan.networks.resnet50(batch=1)\n"
        "assert graph.tensors, 'an empty graph'\n"
        "assert len(plan.generator.instance('guillotine', 1)) > 0\n"
        "print(len(plan.__all__))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 0
