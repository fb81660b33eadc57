"""Worker threads of the demo workloads: started and waited for so that an exception in the
waiting thread (Ctrl-C, SIGTERM) stops them before it goes on."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

__all__ = ["run_workers"]


def run_workers(threads: Sequence[threading.Thread], stop: threading.Event) -> None:
    """Start `threads` and wait for each to end. An exception raised in the calling thread
    meanwhile (Ctrl-C, or SIGTERM through its handler) sets `stop`, which the workers check
    between their steps, waits for every thread started, then goes on. SIGINT and SIGTERM
    are held while the threads start, so that none comes between two starts."""
    started: list[threading.Thread] = []
    try:
        with _stop_signals_held():
            for t in threads:
                t.start()
                started.append(t)
        for t in started:
            t.join()
    except BaseException:
        stop.set()
        for t in started:
            t.join()
        raise


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
