"""Monitoring: watch a pool's memory as it changes, be warned before it runs out, and see why an
allocation failed.

* `Monitor` samples `stats()` (in a background thread or on demand), keeps a bounded
  history and raises `Alert`s through `logging` and callbacks when usage or
  fragmentation pass thresholds (`sampler`).
* `PrometheusCollector` exports the stats to Prometheus (`prometheus`; the
  `prometheus` extra).
* `Snapshot` (`pool.snapshot()`) is the whole arena at one moment; `Trace` and
  `TraceRecorder` record alloc, free, move and failed-alloc events; both save and load as
  versioned JSON (`snapshot`, `trace`).
* Pictures: `plot_timeline()`, `plot_address_map()`, `plot_before_after()`,
  `plot_plan()`, `plot_trace()` (`plots`; the `plot` extra).
* The text report: `render_report()`, `report_text()` (`report`); `human_bytes` is
  `npumem.sizes.format_bytes()`.

The `npumem report`, `npumem plot` and `npumem replay` commands use these.
"""

from __future__ import annotations

from npumem.errors import MissingDependencyError
from npumem.monitor.errors import FileFormatError, MonitorError
from npumem.monitor.plots import (
    plot_address_map,
    plot_before_after,
    plot_plan,
    plot_timeline,
    plot_trace,
)
from npumem.monitor.prometheus import PrometheusCollector
from npumem.monitor.report import render_report, report_text
from npumem.monitor.sampler import Alert, Monitor, Sample, Thresholds
from npumem.monitor.snapshot import BlockRecord, Extent, Snapshot, load_snapshot
from npumem.monitor.trace import Trace, TraceEvent, TraceRecorder, load_trace
from npumem.sizes import format_bytes as human_bytes

__all__ = [
    "Alert",
    "BlockRecord",
    "Extent",
    "FileFormatError",
    "MissingDependencyError",
    "Monitor",
    "MonitorError",
    "PrometheusCollector",
    "Sample",
    "Snapshot",
    "Thresholds",
    "Trace",
    "TraceEvent",
    "TraceRecorder",
    "human_bytes",
    "load_snapshot",
    "load_trace",
    "plot_address_map",
    "plot_before_after",
    "plot_plan",
    "plot_timeline",
    "plot_trace",
    "render_report",
    "report_text",
]
