"""Built-in workloads: the demo (the project's main job) and trace replay."""

from __future__ import annotations

from npumem.workloads.demo import DemoResult, run_demo

__all__ = ["DemoResult", "run_demo"]
