"""The example in the compaction package's docstring runs as written."""

from __future__ import annotations

import doctest

import npumem.compaction


def test_package_example() -> None:
    failures, tried = doctest.testmod(npumem.compaction, verbose=False)
    assert tried > 0 and failures == 0
