"""Every misuse raises its typed error with a message that names the problem, and leaves the
pool exactly as it was (check() passes, stats and live blocks unchanged)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

import npumem
from helpers import assert_unchanged, assert_unchanged_but_one_failure, state_of

MIB = 1 << 20


@pytest.fixture
def pool() -> Iterator[npumem.Pool]:
    p = npumem.Pool(16 * MIB, cores=2)
    # Something live (held: a dropped block is freed), so "unchanged" means something.
    held = [p.alloc(1000, tag="keep"), p.alloc(3 * MIB)]
    yield p
    del held


class _Index:
    """An object whose `__index__` returns `value`, whatever it is."""

    def __init__(self, value: object) -> None:
        self.value = value

    def __index__(self) -> Any:
        return self.value


BAD_ALLOCS: list[tuple[str, Callable[[npumem.Pool], Any], type[Exception], str]] = [
    ("size zero", lambda p: p.alloc(0), npumem.InvalidArgumentError, "greater than 0, got 0"),
    ("negative size", lambda p: p.alloc(-5), npumem.InvalidArgumentError, "got -5"),
    (
        "size above capacity",
        lambda p: p.alloc(16 * MIB + 1),
        npumem.RequestTooLargeError,
        "capacity",
    ),
    (
        "huge size",
        lambda p: p.alloc(1 << 200),
        npumem.RequestTooLargeError,
        "can never be allocated",
    ),
    (
        "huge negative size",
        lambda p: p.alloc(-(1 << 200)),
        npumem.InvalidArgumentError,
        "greater than 0",
    ),
    ("float size", lambda p: p.alloc(1.5), npumem.ArgumentTypeError, "must be an int, got float"),
    ("str size", lambda p: p.alloc("10"), npumem.ArgumentTypeError, "got str"),
    ("bool size", lambda p: p.alloc(True), npumem.ArgumentTypeError, "got bool"),
    ("None size", lambda p: p.alloc(None), npumem.ArgumentTypeError, "got NoneType"),
    (
        "alignment zero",
        lambda p: p.alloc(64, align=0),
        npumem.InvalidArgumentError,
        "power of two, got 0",
    ),
    (
        "alignment not a power of two",
        lambda p: p.alloc(64, align=48),
        npumem.InvalidArgumentError,
        "got 48",
    ),
    (
        "negative alignment",
        lambda p: p.alloc(64, align=-64),
        npumem.InvalidArgumentError,
        "got -64",
    ),
    (
        "alignment above the arena",
        lambda p: p.alloc(64, align=32 * MIB),
        npumem.InvalidArgumentError,
        "larger than the arena",
    ),
    (
        "float alignment",
        lambda p: p.alloc(64, align=64.0),
        npumem.ArgumentTypeError,
        "align must be an int",
    ),
    ("tag not a str", lambda p: p.alloc(64, tag=5), npumem.ArgumentTypeError, "tag must be a str"),
    (
        "tag with a lone surrogate",
        lambda p: p.alloc(64, tag="\ud800"),
        npumem.InvalidArgumentError,
        r"tag is not valid text: it contains a lone surrogate \('\\ud800' at index 0\)",
    ),
    (
        "alloc_many tag with a lone surrogate",
        lambda p: p.alloc_many([64, 64], tag="ok\udfff"),
        npumem.InvalidArgumentError,
        "tag is not valid text: it contains a lone surrogate",
    ),
    (
        "__index__ that returns a float",
        lambda p: p.alloc(_Index(1.5)),
        npumem.ArgumentTypeError,
        r"nbytes must be an int, got _Index whose __index__\(\) returned float, not an int",
    ),
    (
        "__index__ that returns a huge int",
        lambda p: p.alloc(_Index(1 << 200)),
        npumem.RequestTooLargeError,
        "can never be allocated",
    ),
    (
        "huge alignment",
        lambda p: p.alloc(64, align=1 << 200),
        npumem.InvalidArgumentError,
        "larger than the arena",
    ),
    (
        "huge trace capacity",
        lambda p: p.trace_start(1 << 200),
        npumem.InvalidArgumentError,
        r"capacity must be between 1 and \d+ events, got 1606938044",
    ),
    (
        "endless pause",
        lambda p: p.pause(float("inf")),
        npumem.InvalidArgumentError,
        "timeout must be a finite number of seconds",
    ),
    (
        "adopt of a huge handle",
        lambda p: p.adopt(1 << 200),
        npumem.InvalidHandleError,
        "is not a block's handle",
    ),
    (
        "free of a non-block",
        lambda p: p.free(5),
        npumem.ArgumentTypeError,
        "takes an npumem.Block, got int",
    ),
]


@pytest.mark.parametrize(
    ("case", "call", "error", "message"), BAD_ALLOCS, ids=[c[0] for c in BAD_ALLOCS]
)
def test_bad_arguments(
    pool: npumem.Pool,
    case: str,
    call: Callable[[npumem.Pool], Any],
    error: type[Exception],
    message: str,
) -> None:
    before = state_of(pool)
    with pytest.raises(error, match=message) as info:
        call(pool)
    assert isinstance(info.value, npumem.NpumemError)
    if error is npumem.RequestTooLargeError:  # also a failed allocation, counted as one
        assert_unchanged_but_one_failure(pool, before)
    else:
        assert_unchanged(pool, before)


def test_too_large_is_both_misuse_and_out_of_memory(pool: npumem.Pool) -> None:
    with pytest.raises(ValueError):
        pool.alloc(32 * MIB)
    with pytest.raises(MemoryError):
        pool.alloc(32 * MIB)
    assert pool.stats().failed_allocs == 2, "an OutOfMemoryError is a failed allocation"


def test_double_free(pool: npumem.Pool) -> None:
    blk = pool.alloc(500)
    blk.free()
    before = state_of(pool)
    with pytest.raises(npumem.DoubleFreeError, match="double free"):
        blk.free()
    with pytest.raises(npumem.DoubleFreeError):
        pool.free(blk)
    assert_unchanged(pool, before)


def test_double_free_after_the_slot_was_reused(pool: npumem.Pool) -> None:
    old = pool.alloc(500)
    old.free()
    new = pool.alloc(500)  # likely the same slot and offset
    before = state_of(pool)
    with pytest.raises(npumem.DoubleFreeError):
        old.free()
    assert new.alive, "a stale handle must never free the block that reused its slot"
    assert_unchanged(pool, before)


def test_block_of_another_pool(pool: npumem.Pool) -> None:
    other = npumem.Pool(4 * MIB, cores=1)
    foreign = other.alloc(100)
    before, other_before = state_of(pool), state_of(other)
    with pytest.raises(npumem.InvalidHandleError, match="another pool"):
        pool.free(foreign)
    assert foreign.alive
    assert_unchanged(pool, before)
    assert_unchanged(other, other_before)


FREED_BLOCK_USES: list[tuple[str, Callable[[npumem.Block], Any]]] = [
    ("offset", lambda b: b.offset),
    ("block_bytes", lambda b: b.block_bytes),
    ("align", lambda b: b.align),
    ("pins", lambda b: b.pins),
    ("memoryview", lambda b: memoryview(b)),
]


@pytest.mark.parametrize(("use", "call"), FREED_BLOCK_USES, ids=[u[0] for u in FREED_BLOCK_USES])
def test_using_a_freed_block(
    pool: npumem.Pool, use: str, call: Callable[[npumem.Block], Any]
) -> None:
    blk = pool.alloc(256)
    blk.free()
    before = state_of(pool)
    with pytest.raises(npumem.InvalidHandleError, match="freed"):
        call(blk)
    assert not blk.alive
    assert blk.nbytes == 256  # what was asked stays readable
    assert_unchanged(pool, before)


def test_buffer_on_a_none_backing() -> None:
    pool = npumem.Pool(4 * MIB, cores=1, backing="none")
    blk = pool.alloc(100)
    before = state_of(pool)
    with pytest.raises(npumem.NoBackingError, match='backing="none"'):
        memoryview(blk)
    assert blk.pins == 0, "a refused view must not leave a pin"
    assert_unchanged(pool, before)


def test_freeing_a_block_with_a_live_view(pool: npumem.Pool) -> None:
    blk = pool.alloc(100)
    view = memoryview(blk)
    before = state_of(pool)
    with pytest.raises(npumem.PinnedBlockError, match="live buffer views"):
        blk.free()
    assert_unchanged(pool, before)
    view.release()
    blk.free()


def test_out_of_memory_leaves_the_pool_as_it_was_but_counts_the_failure() -> None:
    pool = npumem.Pool(4 * MIB, cores=1)
    _held = pool.alloc(3 * MIB)  # held: a dropped block is freed
    before = pool.stats().as_dict()
    with pytest.raises(npumem.OutOfMemoryError):
        pool.alloc(2 * MIB)
    after = pool.stats().as_dict()
    assert after.pop("failed_allocs") == before.pop("failed_allocs") + 1
    per_core_after, per_core_before = after.pop("per_core"), before.pop("per_core")
    assert after == before
    assert sum(c["failed_allocs"] for c in per_core_after) == 1 + sum(
        c["failed_allocs"] for c in per_core_before
    )
    pool.check()


BAD_CONFIGS: list[tuple[dict[str, Any], str]] = [
    ({"capacity": 0}, "capacity must be greater than 0"),
    ({"capacity": -1}, "capacity must not be negative"),
    ({"capacity": 1.5}, "capacity must be an int"),
    ({"capacity": "1M"}, "capacity must be an int"),
    ({"capacity": 1 << 60}, "capacity must be at most"),
    ({"cores": 0}, "cores must be between 1"),
    ({"cores": -2}, "cores must not be negative"),
    ({"cores": 5000}, "cores must be between 1"),
    ({"chunk_size": 3 << 20}, "chunk_size must be a power of two"),
    ({"chunk_size": 4096, "bank_size": 4096}, "chunk_size must be at least twice the largest slab"),
    ({"min_block": 32}, "min_block must be at least 64"),
    ({"min_block": 384}, "min_block must be a power of two"),
    ({"bank_size": 3000}, "bank_size must be a power of two"),
    ({"bank_size": 4 << 20}, "bank_size must be at most chunk_size"),
    ({"alignment": 48}, "alignment must be a power of two"),
    ({"alignment": 0}, "alignment must be a power of two"),
    ({"slab_sizes": [64, 64]}, "slab_sizes must be strictly increasing"),
    ({"slab_sizes": list(range(1, 257))}, "slab_sizes must have at most 255 entries"),
    ({"slab_sizes": [0]}, "slab_sizes entry 0 must be positive"),
    ({"slab_sizes": [8192]}, "at most bank_size"),
    ({"slab_sizes": "abc"}, "slab_sizes must be a sequence of ints"),
    ({"slab_sizes": 64}, "slab_sizes must be a sequence of ints"),
    ({"slab_sizes": [64.0]}, r"slab_sizes\[0\] must be an int"),
    ({"backing": "gpu"}, 'backing must be "host" or "none"'),
    ({"backing": 3}, 'backing must be "host" or "none"'),
    ({"placement": "worst-fit"}, 'placement must be "best-fit" or "first-fit"'),
    ({"name": 5}, "name must be a str"),
    ({"core_reserve": -1}, "core_reserve must not be negative"),
]


@pytest.mark.parametrize(("kwargs", "message"), BAD_CONFIGS, ids=[m for _, m in BAD_CONFIGS])
def test_bad_configuration(kwargs: dict[str, Any], message: str) -> None:
    args = {"capacity": 16 * MIB, **kwargs}
    capacity = args.pop("capacity")
    with pytest.raises(npumem.ConfigError, match=message):
        npumem.Pool(capacity, **args)


@pytest.mark.parametrize("deferring", [False, True])
def test_free_many_naming_a_block_twice_names_both_items(
    pool: npumem.Pool, deferring: bool
) -> None:
    a, b = pool.alloc(100), pool.alloc(200)
    before = state_of(pool)
    with pytest.raises(npumem.DoubleFreeError, match=r"names one block twice \(items 0 and 2\)"):
        if deferring:
            with pool.deferred():
                pool.free_many([a, b, a])
        else:
            pool.free_many([a, b, a])
    assert a.alive and b.alive
    assert_unchanged(pool, before)
    pool.free_many([a, b])


def test_free_many_of_a_detached_block_names_its_class_once(pool: npumem.Pool) -> None:
    a, b = pool.alloc(100), pool.alloc(200)
    owner = pool.adopt(b.detach())
    before = state_of(pool)
    with pytest.raises(npumem.InvalidHandleError) as info:
        pool.free_many([a, b])
    assert str(info.value) == (
        "item 1 of the batch: the block was detached from this object (Block.detach()); "
        "adopt its handle to use it"
    )
    assert_unchanged(pool, before)
    pool.free_many([a, owner])


def test_a_pool_name_with_a_lone_surrogate_is_a_config_error() -> None:
    with pytest.raises(npumem.ConfigError, match="name is not valid text: it contains a lone"):
        npumem.Pool(MIB, cores=1, name="pool-\ud800")


def test_a_kv_cache_tag_with_a_lone_surrogate_changes_nothing(pool: npumem.Pool) -> None:
    from npumem.kv import KVCache

    before = state_of(pool)
    with pytest.raises(npumem.InvalidArgumentError, match="tag is not valid text"):
        KVCache(pool, num_layers=1, num_kv_heads=1, head_dim=8, tag="\ud800", capacity_tokens=64)
    assert_unchanged(pool, before)


def test_a_deferred_scope_let_go_while_open_closes_and_frees_its_queue() -> None:
    import gc

    p = npumem.Pool(16 * MIB, cores=1)
    scope = p.deferred()
    scope.__enter__()
    queued = p.alloc(MIB)
    queued.free()
    assert p.stats().deferred_pending == 1
    del scope
    gc.collect()
    assert p.stats().deferred_pending == 0
    assert p.stats().blocks_in_use == 0
    later = p.alloc(MIB)
    later.free()  # not queued: the scope is closed
    assert (p.stats().deferred_pending, p.stats().blocks_in_use) == (0, 0)
    p.alloc(15 * MIB).free()
    assert p.check() == 0


def test_cycles_through_a_pools_callbacks_are_collected() -> None:
    import gc

    from npumem.kv import KVCache

    def pools() -> int:
        return sum(type(o) is npumem.Pool for o in gc.get_objects())

    def make(kind: str) -> None:
        p = npumem.Pool(4 * MIB, cores=1)
        p.alloc(1000).free()  # the next block comes from the free list of Block objects
        if kind == "block":
            reserve = p.alloc(1000)
            p.set_oom_handler(lambda n: reserve.free() or True)
        elif kind == "growth hook":
            box: list[npumem.Pool] = []
            grows = npumem.Pool(
                4 * MIB, cores=1, max_capacity=8 * MIB, on_grow=lambda o, n: box[0].stats()
            )
            box.append(grows)
        else:
            cache = KVCache(p, num_layers=1, num_kv_heads=1, head_dim=8)
            p.set_oom_handler(lambda n: bool(cache))

    gc.collect()
    before = pools()
    for kind in ["block", "kv", "growth hook"] * 3:
        make(kind)
    gc.collect()
    assert pools() == before
