"""Write a large, valid trace file (format npumem-trace, version 2) without a pool, streaming:
the input of the figures in BENCHMARKS.md, "The file tools on large inputs".

    python benches/large_trace.py OUT.json EVENTS [--failed-every N] [--move-every N]

Four cores allocate and free blocks of 256 B to 1 MiB at random offsets of a 1 GiB arena,
about 20,000 live at a time, 20 tags; `--failed-every N` makes every Nth event a failed
allocation, `--move-every N` every Nth a move.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from typing import TextIO

from bench_args import non_negative_int, positive_int
from npumem import fileio
from npumem.errors import NpumemError

CAPACITY = 1 << 30
CONFIG = {
    "capacity": CAPACITY,
    "cores": 4,
    "chunk_size": 1 << 21,
    "min_block": 256,
    "bank_size": 1 << 21,
    "alignment": 256,
    "slab_sizes": [],
}
FIELDS = ["time_ns", "kind", "offset", "size", "core", "tag", "handle", "aux", "stack"]
SIZES = (256, 777, 3000, 4096, 65536, 1 << 20)


def write_trace(f: TextIO, n: int, failed_every: int, move_every: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    tags = [f"tag{i}" for i in range(20)]
    head = {
        "format": "npumem-trace",
        "version": 2,
        "pool": "large",
        "config": CONFIG,
        "dropped": 0,
        "stats_at_start": {},
        "stats_at_stop": {},
        "tags": tags,
        "stacks": [],
        "event_fields": FIELDS,
    }
    f.write(json.dumps(head)[:-1] + ',"events":[')
    live: list[tuple[int, int, int]] = []
    handle, t, sep = 1 << 64, 1000, ""
    capacity = CAPACITY
    for i in range(n):
        t += rng.randrange(1, 200)
        core, tag = rng.randrange(4), rng.randrange(len(tags))
        if failed_every and i % failed_every == 0:
            row = [t, "failed", 0, rng.randrange(1, 1 << 20), core, tag, "0", 256, -1]
        elif move_every and i % move_every == 0 and live:
            h, old, size = live[rng.randrange(len(live))]
            row = [t, "move", rng.randrange(capacity - size), size, core, -1, str(h), old, -1]
        elif live and (len(live) >= 20_000 or rng.random() < 0.5):
            j = rng.randrange(len(live))
            live[j], live[-1] = live[-1], live[j]
            h, offset, size = live.pop()
            row = [t, "free", offset, size, core, tag, str(h), 0, -1]
        else:
            size = rng.choice(SIZES)
            offset = rng.randrange(capacity - size) & ~255
            handle += 1
            live.append((handle, offset, size))
            row = [t, "alloc", offset, size, core, tag, str(handle), 256, -1]
        f.write(sep + json.dumps(row, separators=(",", ":")))
        sep = ","
    f.write("]}\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output")
    parser.add_argument("events", type=positive_int)
    parser.add_argument("--failed-every", type=non_negative_int, default=0, help="0: none")
    parser.add_argument("--move-every", type=non_negative_int, default=0, help="0: none")
    args = parser.parse_args()
    # Atomic: a write that fails or is interrupted leaves no partial trace behind.
    try:
        with fileio.text_writer(args.output) as f:
            write_trace(f, args.events, args.failed_every, args.move_every)
    except (OSError, NpumemError) as e:
        reason = getattr(e, "strerror", None) or e
        print(f"{parser.prog}: error: cannot write {args.output}: {reason}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
