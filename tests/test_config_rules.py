"""The readers of saved files check a file's pool configuration in Python
(`npumem.monitor.validate.check_config`) by the rules the Rust core checks when it makes a pool
(`PoolConfig::validate`). The two must agree: a configuration a file reader accepts is one a
pool can have (`replay` makes one of it), and one it refuses, a pool refuses too. Random
configurations around every rule's edges, each given to both."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

import npumem
from npumem.monitor import FileFormatError
from npumem.monitor.validate import check_config

_POWERS = [1 << k for k in range(0, 30)]
_SIZES = st.one_of(
    st.sampled_from(_POWERS),
    st.sampled_from(_POWERS).map(lambda p: p + 1),
    st.sampled_from(_POWERS).map(lambda p: max(p - 1, 1)),
    st.integers(min_value=1, max_value=1 << 30),
)


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    """A valid configuration with a few fields moved, each to an edge of its rules or
    anywhere."""

    def field(valid: int, edges: list[int]) -> int:
        if draw(st.integers(0, 2)):
            return valid
        return draw(st.sampled_from(edges) | _SIZES)

    chunk = field(2 << 20, [1 << 10, 1 << 12, 1 << 16, 1 << 24, 1 << 30])
    config: dict[str, Any] = {
        "capacity": field(64 << 20, [chunk, 2 * chunk, 3 * chunk + 1, 64, 63, 1 << 32]),
        "cores": field(2, [1, 3, 16, 1024, 1025]),
        "chunk_size": chunk,
        "min_block": field(256, [32, 63, 64, 128, 4096, chunk // 2, chunk]),
        "bank_size": field(4096, [1024, chunk, 2 * chunk]),
        "alignment": field(256, [1, 64, 4096, 1 << 27]),
    }
    if draw(st.booleans()):
        config["core_reserve"] = draw(st.sampled_from([0, 1, 4, 1024, 1025, 5000]))
    if draw(st.booleans()):
        sizes = draw(st.lists(st.integers(min_value=0, max_value=1 << 14), max_size=6))
        config["slab_sizes"] = sorted(set(sizes)) if draw(st.integers(0, 3)) else sizes
    return config


def _pool_accepts(config: dict[str, Any]) -> bool:
    try:
        npumem.Pool(backing="none", **config)
    except npumem.ConfigError:
        return False
    return True


def _reader_accepts(config: dict[str, Any]) -> bool:
    try:
        check_config(config, "f.json")
    except FileFormatError:
        return False
    return True


@given(configs())
def test_a_file_reader_and_a_pool_accept_the_same_configurations(config: dict[str, Any]) -> None:
    assert _reader_accepts(config) == _pool_accepts(config), config


def test_the_edges_of_the_rules_agree() -> None:
    base = {"capacity": 64 << 20, "cores": 2, "chunk_size": 2 << 20, "min_block": 256}
    base |= {"bank_size": 4096, "alignment": 256}
    cases = [
        base,
        base | {"capacity": (1 << 48) + 1},
        base | {"cores": 1024},
        base | {"cores": 1025},
        base | {"min_block": 64},
        base | {"min_block": 32},
        base | {"min_block": 1 << 20},
        base | {"min_block": 2 << 20},
        base | {"bank_size": 4 << 20},
        base | {"alignment": 128 << 20},
        base | {"slab_sizes": [64, 64]},
        base | {"slab_sizes": [64, 8192]},
        base | {"slab_sizes": [0]},
        base | {"core_reserve": 1024},
        base | {"core_reserve": 1025},
    ]
    for config in cases:
        assert _reader_accepts(config) == _pool_accepts(config), config
    assert _reader_accepts(base) and not _reader_accepts(base | {"cores": 1025})
