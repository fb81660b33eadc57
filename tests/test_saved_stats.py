"""The stats that snapshots and traces keep are typed (`PoolStats`), in memory and read back
from their files: `PoolStats.from_dict` is the inverse of `as_dict`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import npumem
from npumem.errors import ArgumentTypeError, InvalidArgumentError
from npumem.monitor import FileFormatError, Snapshot, TraceRecorder, load_snapshot, load_trace

MIB = 1 << 20


def test_pool_stats_from_dict_inverts_as_dict() -> None:
    pool = npumem.Pool(16 * MIB, cores=2)
    blocks = [pool.alloc(100 * (i + 1), tag="a" if i % 2 else None) for i in range(20)]
    stats = pool.stats()
    back = npumem.PoolStats.from_dict(stats.as_dict())
    assert back == stats and back.as_dict() == stats.as_dict()
    assert back.by_tag == stats.by_tag and back.per_core == stats.per_core
    assert npumem.TagStats.from_dict(stats.by_tag[0].as_dict()) == stats.by_tag[0]
    partial = npumem.PoolStats.from_dict({"capacity": 5})
    assert (partial.capacity, partial.bytes_in_use, partial.by_tag) == (5, 0, [])
    with pytest.raises(ArgumentTypeError, match=r'field "bytes_in_use" must be an int .*, got str'):
        npumem.PoolStats.from_dict({"bytes_in_use": "many"})
    with pytest.raises(npumem.NpumemError, match="takes a dict"):
        npumem.PoolStats.from_dict([1, 2])  # type: ignore[arg-type]
    pool.free_many(blocks)


@pytest.mark.parametrize(
    ("d", "error", "message"),
    [
        ({"capacity": -1}, InvalidArgumentError, r'PoolStats.from_dict: field "capacity" '),
        ({"capacity": 1 << 64}, InvalidArgumentError, r"an int from 0 to 2\^64 - 1, got 1844"),
        ({"capacity": 1.5}, ArgumentTypeError, r'field "capacity" must be an int .*got float'),
        ({"external_fragmentation": "x"}, ArgumentTypeError, "must be a number, got str"),
        ({"per_core": 5}, ArgumentTypeError, 'field "per_core" must be a list of dicts'),
        ({"per_core": [{"bytes_free": -2}]}, InvalidArgumentError, r'CoreStats.*"bytes_free"'),
        ({"by_tag": [{"tag": "\ud800"}]}, InvalidArgumentError, "lone surrogate"),
    ],
)
def test_a_field_the_stats_cannot_hold_is_named_in_a_typed_error(
    d: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        npumem.PoolStats.from_dict(d)


def test_snapshot_stats_are_typed_and_survive_a_file(tmp_path: Path) -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    blk = pool.alloc(1000, tag="w")
    snap = pool.snapshot()
    assert isinstance(snap.stats, npumem.PoolStats)
    assert snap.stats.by_tag[0].tag == "w"
    back = load_snapshot(snap.save(tmp_path / "s.json"))
    assert back.stats == snap.stats and back == snap
    obj = json.loads((tmp_path / "s.json").read_text())
    obj["stats"]["by_tag"] = [{"tag": 5}]
    with pytest.raises(FileFormatError, match=r'stats: .*field "tag" must be a str or None, got'):
        Snapshot.from_json_obj(obj)
    blk.free()


def test_trace_stats_are_typed_or_none(tmp_path: Path) -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    with TraceRecorder(pool) as rec:
        pool.alloc(64).free()
    trace = rec.trace
    assert isinstance(trace.stats_at_start, npumem.PoolStats)
    assert isinstance(trace.stats_at_stop, npumem.PoolStats)
    assert trace.stats_at_stop.alloc_count == 1
    back = load_trace(trace.save(tmp_path / "t.json"))
    assert back.stats_at_stop == trace.stats_at_stop
    obj = json.loads((tmp_path / "t.json").read_text())
    obj["stats_at_start"] = {}
    path = tmp_path / "t2.json"
    path.write_text(json.dumps(obj))
    assert load_trace(path).stats_at_start is None
