"""Host memory: a pool never aborts the interpreter for want of host memory, and an empty pool's
metadata costs host memory in proportion to use, not capacity.

Each case runs in a child interpreter, under an address-space limit where it matters, so a
regression kills the child, not the test runner.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

GIB = 1 << 30

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="RLIMIT_AS and /proc are Linux"
)


def run_child(body: str, address_space: int | None = None) -> str:
    """Run `body` in a fresh interpreter (under an address-space limit if given); its stdout."""
    limit = ""
    if address_space is not None:
        limit = (
            "import resource\n"
            f"resource.setrlimit(resource.RLIMIT_AS, ({address_space}, {address_space}))\n"
        )
    code = limit + textwrap.dedent(body)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"child died ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done.stdout


TYPED = """
import npumem
def attempt(make):
    try:
        make()
    except npumem.NpumemError as e:
        print(type(e).__name__)
    else:
        print("made")
"""


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        ("npumem.Pool(16 << 20, core_reserve=2**33)", {"ConfigError"}),
        ("npumem.Pool(2**48)", {"OutOfMemoryError"}),
        ("npumem.Pool(2**48, backing='none')", {"OutOfMemoryError", "made"}),
        ("npumem.Pool(2**40, backing='none')", {"OutOfMemoryError", "made"}),
    ],
)
def test_huge_or_absurd_pools_are_typed_errors_under_an_address_space_limit(
    make: str, expected: set[str]
) -> None:
    out = run_child(TYPED + f"attempt(lambda: {make})\n", address_space=6 * GIB)
    assert out.strip() in expected, out


def test_out_of_host_memory_is_an_out_of_memory_error_naming_the_host() -> None:
    out = run_child(
        """
        import npumem
        try:
            npumem.Pool(2**48)
        except npumem.OutOfMemoryError as e:
            assert isinstance(e, MemoryError)
            print(e)
        """,
        address_space=6 * GIB,
    )
    assert "host" in out, out


def test_an_empty_terabyte_pool_costs_at_most_64_mib_of_rss() -> None:
    out = run_child(
        """
        import npumem

        def rss():
            with open("/proc/self/status") as f:
                line = next(l for l in f if l.startswith("VmRSS:"))
            return int(line.split()[1]) * 1024

        before = rss()
        pool = npumem.Pool(1 << 40, backing="none", cores=4)
        made = rss()
        blocks = [pool.alloc(n) for n in (64, 5000, 1 << 20, 300 << 20)]
        for b in blocks:
            b.free()
        pool.check()
        print(made - before, rss() - before)
        """
    )
    made, used = (int(x) for x in out.split())
    assert made <= 64 << 20, f"creating an empty 1 TiB pool grew RSS by {made} bytes"
    assert used <= 64 << 20, f"an empty 1 TiB pool after a few blocks grew RSS by {used} bytes"


@pytest.mark.parametrize(
    "call",
    [
        "pool.plan_compaction('full')",
        "pool.stage_compaction('full')",
        "with pool.pause() as pause: pool.compact_step(pause, 'full')",
    ],
)
def test_a_compaction_short_of_host_memory_is_an_error_not_an_abort(call: str) -> None:
    # 30,000 live blocks over 4,096 chunks: planning their compaction takes about 10 MB of
    # host memory. With 4 MiB of address space left, the call asks for its bound first and is
    # refused, with the pool left as it was.
    out = run_child(
        f"""
        import random, resource
        import npumem

        pool = npumem.Pool(8 << 30, backing="none", cores=2)
        rng = random.Random(1)
        sizes = [256, 3000, 70000, 5000, 200000]
        blocks = [pool.alloc(rng.choice(sizes)) for _ in range(60000)]
        for b in blocks[::2]:
            b.free()
        blocks = blocks[1::2]
        before = pool.stats()

        with open("/proc/self/status") as f:
            size = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:"))
        limit = size + (4 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            {call}
        except npumem.OutOfMemoryError as e:
            print(type(e).__name__, "host" in str(e))
        else:
            print("ran")
        after = pool.stats()
        figures = ("blocks_in_use", "bytes_in_use")
        same = all(getattr(after, f) == getattr(before, f) for f in figures)
        print(same, after.requested_bytes_in_use == before.requested_bytes_in_use)
        pool.alloc(64).free()
        print("runs")
        """
    )
    lines = out.split("\n")
    assert lines[0] == "OutOfMemoryError True", out
    assert lines[1] == "True True", out
    assert lines[2] == "runs", out
