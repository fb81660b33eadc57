"""The interpreter exits normally while a daemon thread runs Python code inside a pool call (a
callback, a generator the call iterates, an `__index__`, the package's view of a snapshot):
before Python 3.14 such a thread is ended by a forced unwind, which must not reach the
binding's entry point and abort. Nor may a thread that waits without the GIL for another
thread's pause panic when it finds the interpreter gone."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SPIN = """
import threading, time
import npumem

def spin(*args):
    while True:
        sum(range(100))

pool = npumem.Pool(4 << 20, cores=1{pool_args})
{setup}
started = threading.Event()
def run():
    started.set()
    {call}
threading.Thread(target=run, daemon=True).start()
started.wait()
time.sleep(0.2)
print("exiting", flush=True)
"""

CASES = {
    "oom handler": (
        "",
        "held = pool.alloc(3 << 20)\npool.set_oom_handler(spin)",
        "pool.alloc(2 << 20)",
    ),
    "growth hook": (
        ", max_capacity=8 << 20, on_grow=spin",
        "held = [pool.alloc(2 << 20), pool.alloc(2 << 20)]",
        "pool.alloc(1 << 20)",
    ),
    "mover": (
        "",
        "other = npumem.Pool(8 << 20, cores=1, backing='none')\n"
        "blocks = [other.alloc(100_000) for _ in range(40)]\n"
        "for b in blocks[::2]:\n    b.free()",
        "other.compact_step(other.pause(), mover=spin)",
    ),
    "on_evict": (
        "",
        "from npumem.kv import KVCache\n"
        "kv = KVCache(pool, num_layers=1, num_kv_heads=1, head_dim=8, capacity_tokens=64,"
        " on_evict=spin)",
        "kv.add_sequence(1, 1000)",
    ),
    "__index__": (
        "",
        "class Size:\n    def __index__(self):\n        spin()",
        "pool.alloc(Size())",
    ),
    "a generator of sizes": (
        "",
        "def sizes():\n    yield 64\n    spin()",
        "pool.alloc_many(sizes())",
    ),
    "the snapshot view": (
        "",
        "npumem._core.install_views(spin)",
        "pool.snapshot()",
    ),
    "a wait for another thread's pause": (
        "",
        "def pauses():\n    while True:\n"
        "        with pool.pause(1):\n            time.sleep(0.01)\n"
        "threading.Thread(target=pauses, daemon=True).start()\n"
        "# The interpreter's teardown takes a while: a waiter looks for signals meanwhile.\n"
        "class SlowToGo:\n    def __del__(self):\n        time.sleep(0.2)\nslow = SlowToGo()",
        "pauses()",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_exit_while_a_daemon_thread_runs_python_code_in_a_call(case: str) -> None:
    pool_args, setup, call = CASES[case]
    script = SPIN.format(pool_args=pool_args, setup=setup, call=call)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "exiting\n", "")
