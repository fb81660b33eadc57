"""The examples in the monitoring modules' docstrings run as written."""

from __future__ import annotations

import doctest
from types import ModuleType

import pytest

from npumem.monitor import prometheus, sampler, trace


@pytest.mark.parametrize("module", [sampler, trace, prometheus])
def test_module_examples(module: ModuleType) -> None:
    failures, tried = doctest.testmod(module, verbose=False)
    assert tried > 0 and failures == 0
