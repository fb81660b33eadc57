"""Built-in workloads: the demo (the project's main job) and trace replay."""

from __future__ import annotations

from npumem.workloads.demo import DemoResult, default_capacity, run_demo, write_outputs
from npumem.workloads.replay import ReplayResult, replay_trace
from npumem.workloads.service import SupportsCompact

__all__ = [
    "DemoResult",
    "ReplayResult",
    "SupportsCompact",
    "default_capacity",
    "replay_trace",
    "run_demo",
    "write_outputs",
]
