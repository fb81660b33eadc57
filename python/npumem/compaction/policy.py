"""When a `Compactor` compacts on its own, and how."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from npumem._shown import shown
from npumem.errors import InvalidArgumentError

__all__ = ["DEFAULT_THRESHOLD", "MODES", "Mode", "Policy", "check_mode"]

#: Compact when `external_fragmentation` passes this (the seed articles' 30%).
DEFAULT_THRESHOLD = 0.30

#: The compaction modes: `"full"` (the pool stopped once, free space gathered in one run) and
#: `"incremental"` (steps of at most `max_bytes` of moves, the pool stopped per step).
Mode = Literal["full", "incremental"]
MODES: tuple[Mode, ...] = ("full", "incremental")


def check_mode(mode: object) -> Mode:
    """`mode` if it is one of `MODES`, else `InvalidArgumentError`."""
    if mode not in MODES:
        raise InvalidArgumentError(f"mode must be one of {MODES}, got {shown(mode)}")
    return mode


@dataclass(frozen=True, slots=True)
class Policy:
    """The rules of automatic compaction.

    `fragmentation_threshold`: `Compactor.maybe_compact()` (and `on_sample`) compact
    when the pool's `external_fragmentation` is above it; `None` turns that off.
    `on_failure`: once attached, an allocation that fails although the pool has at least that
    many bytes free compacts and is retried once. `min_interval`: seconds that must pass
    between two automatic compactions (a manual `Compactor.compact()` always runs).
    `mode`: what automatic compactions do; `max_bytes`: the moves of one incremental step;
    `max_steps`: the steps of one incremental compaction at most.
    `wait_for_room`: seconds a failed allocation of a pool that cannot grow any more waits for
    other threads to free room when compacting did not make it (or could not run yet), before
    it raises; 0 (the default) never waits. While it waits it checks the pool every
    millisecond, and compacts again once `min_interval` has passed, as TensorFlow's retrying
    allocator waits for frees. One allocation waits at a time (the others raise at once, so
    that their threads go on and free), and after a wait in vain none waits for
    `wait_for_room` seconds: a pool too small for its load fails fast rather than slowly.
    """

    fragmentation_threshold: float | None = DEFAULT_THRESHOLD
    on_failure: bool = True
    min_interval: float = 1.0
    mode: Mode = "full"
    max_bytes: int = 64 << 20
    max_steps: int = 64
    wait_for_room: float = 0.0

    def __post_init__(self) -> None:
        t = self.fragmentation_threshold
        if t is not None and (
            isinstance(t, bool) or not isinstance(t, int | float) or not 0.0 <= t < 1.0
        ):
            raise InvalidArgumentError(
                f"fragmentation_threshold must be a number in [0, 1) or None, got {shown(t)}"
            )
        if not isinstance(self.on_failure, bool):
            raise InvalidArgumentError(f"on_failure must be a bool, got {shown(self.on_failure)}")
        i = self.min_interval
        number = not isinstance(i, bool) and isinstance(i, int | float)
        if not (number and math.isfinite(i) and i >= 0):
            raise InvalidArgumentError(
                f"min_interval must be a number of seconds >= 0, got {shown(i)}"
            )
        w = self.wait_for_room
        number = not isinstance(w, bool) and isinstance(w, int | float)
        if not (number and math.isfinite(w) and w >= 0):
            raise InvalidArgumentError(
                f"wait_for_room must be a number of seconds >= 0, got {shown(w)}"
            )
        check_mode(self.mode)
        for name in ("max_bytes", "max_steps"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InvalidArgumentError(f"{name} must be an int >= 1, got {shown(v)}")
