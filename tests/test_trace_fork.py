"""A child process forked while another thread was inside a trace call (waiting for a pause
that a third thread held) answers every trace call: the calls that need that pause are refused
with `PoolBusyError`, the others run, and none waits forever for a pause or a lock that no
thread of the child can release."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

import pytest

import npumem

MIB = 1 << 20

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")


def _in_child(pool: npumem.Pool) -> int:
    """What the child reports through its exit status: 0 when every call answered as it should:
    the drain (the trace's lock was free at the fork: a start or a stop takes it only once the
    pool is paused), and the stop and the start refused, since the pause they need was held by
    a thread of the parent."""
    signal.alarm(20)  # a call that waits for a lock no thread here holds ends the child
    outcomes = []
    for call in (pool.trace_drain, pool.trace_stop, lambda: pool.trace_start(64)):
        try:
            call()
            outcomes.append("ok")
        except npumem.PoolBusyError as err:
            outcomes.append("busy" if "forked" in str(err) else "other busy")
    status = pool.trace_status()
    if outcomes == ["ok", "busy", "busy"] and status.capacity > 0:
        return 0
    sys.stderr.write(f"{outcomes} {status}\n")
    return 3


def test_a_fork_while_another_thread_waits_in_a_trace_call() -> None:
    pool = npumem.Pool(16 * MIB, cores=1)
    pool.trace_start(4096)
    paused, resume = threading.Event(), threading.Event()

    def pauser() -> None:
        with pool.pause(timeout=10.0):
            paused.set()
            resume.wait(10.0)

    holder = threading.Thread(target=pauser)
    holder.start()
    assert paused.wait(10.0)
    # trace_stop waits for the pause that `holder` holds (it would take the trace's lock after).
    stopper = threading.Thread(target=pool.trace_stop)
    stopper.start()
    time.sleep(0.3)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        code = 1
        try:
            code = _in_child(pool)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    resume.set()
    holder.join(10.0)
    stopper.join(10.0)
    assert os.WIFEXITED(status), (
        f"the child was killed by signal {os.WTERMSIG(status)} (a wait that never ended)"
    )
    assert os.WEXITSTATUS(status) == 0
    # The parent's trace goes on as before.
    pool.trace_start(4096)
    pool.alloc(1000).free()
    assert len(pool.trace_drain()) == 2
    pool.check()
