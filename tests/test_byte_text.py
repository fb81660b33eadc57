"""The byte counts in the extension's messages read as `npumem.sizes.format_bytes` writes
them: the binding writes them itself (`rust/python/src/byte_text.rs`), and this compares the
two over sizes from bytes to exbibytes, the ties of the one-decimal rounding included."""

from __future__ import annotations

import random
import re

import pytest

import npumem
from npumem.sizes import format_bytes

UNITS = [1, 1 << 10, 1 << 20, 1 << 30, 1 << 40]


def sizes() -> list[int]:
    rng = random.Random(11)
    out = {1023, 1024, 1025, (1 << 63) - 1, (1 << 64) - 1}
    for unit in UNITS[1:]:
        for whole in (1, 2, 9, 10, 99, 100, 999, 1000, 1023, 1024, 5000, 123456):
            for tenths in range(10):
                base = whole * unit + tenths * unit // 10
                # Around each tenth, and on the ties of the rounding: x.x5 of the unit.
                out.update({base, base + 1, base - 1, base + unit // 20, base + unit // 20 + 1})
                out.update({base + unit // 4, base + 3 * unit // 4})
    out.update(rng.randrange(1, 1 << 64) for _ in range(2000))
    out.update(int(2 ** rng.uniform(10, 63.9)) for _ in range(2000))
    return sorted(n for n in out if 1 <= n < 1 << 64)


ASKED = re.compile(r"nbytes = (.*?) can never be allocated")


def exact(n: int) -> str:
    return f"{format_bytes(n)} ({n} bytes)" if n >= 1024 else f"{n} bytes"


def test_the_messages_write_byte_counts_as_format_bytes_does() -> None:
    pool = npumem.Pool(4 << 20, cores=1, backing="none")
    checked = 0
    for n in sizes():
        if n <= pool.capacity:
            continue
        with pytest.raises(npumem.RequestTooLargeError) as caught:
            pool.alloc(n)
        found = ASKED.search(str(caught.value))
        assert found is not None, str(caught.value)
        assert found.group(1) == exact(n), n
        checked += 1
    assert checked > 5000


def test_an_out_of_memory_message_writes_its_three_counts_as_format_bytes_does() -> None:
    pool = npumem.Pool(64 << 20, cores=1, backing="none")
    held = [pool.alloc(1 << 20) for _ in range(64)]
    with pytest.raises(npumem.OutOfMemoryError) as caught:
        pool.alloc(3 << 20)
    err = caught.value
    assert type(err) is npumem.OutOfMemoryError
    assert err.args == (str(err),)
    assert err.requested == 3 << 20
    text = str(err)
    assert f"asked for {exact(3 << 20)}" in text, text
    assert f"{exact(err.bytes_free)} free" in text, text
    assert f"the largest free block found is {exact(err.largest_free_block)}" in text, text
    pool.free_many(held)
