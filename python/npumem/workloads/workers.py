"""Worker threads of the demo workloads: started and waited for so that an exception in the
waiting thread (Ctrl-C, SIGTERM) stops them before it goes on."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

__all__ = ["run_workers"]


def run_workers(workers: Sequence[tuple[str, Callable[[], object]]], stop: threading.Event) -> None:
    """Run each `(name, work)` of `workers` in a thread of that name and wait for all of them.
    An exception raised in the calling thread meanwhile (Ctrl-C, or SIGTERM through its
    handler) sets `stop`, which the work checks between its steps, waits for every thread
    started, then goes on. SIGINT and SIGTERM are held while the threads start, so that none
    comes between two starts.

    The wait is on an event each thread sets as its work ends, never on `Thread.join`: a
    `join` that an exception interrupts may take its thread for ended while it still runs
    (CPython 3.11), and the next `join` then returns at once."""
    done: list[threading.Event] = []
    threads: list[threading.Thread] = []

    def body(work: Callable[[], object], ended: threading.Event) -> None:
        try:
            work()
        finally:
            ended.set()

    try:
        with _stop_signals_held():
            for name, work in workers:
                ended = threading.Event()
                thread = threading.Thread(target=body, args=(work, ended), name=name)
                thread.start()
                done.append(ended)
                threads.append(thread)
        for ended in done:
            ended.wait()
    except BaseException:
        stop.set()
        for ended in done:
            ended.wait()
        raise
    finally:
        for thread in threads:
            thread.join()  # each has ended its work: this only waits for its last steps


@contextmanager
def _stop_signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM for the calling thread while the block runs (the threads it
    starts inherit the mask, so those signals go to the main thread): a signal that comes
    meanwhile is delivered when the block ends."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
