//! `StepReport`: what one compaction step did (`Pool.compact_step`, `Pool.run_staged`).

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::args;
use crate::repr;

/// One stop of the pool: what moved and how long the pool was stopped.
///
/// `planning_seconds` and `moving_seconds` are the parts the Rust core measured;
/// `pause_seconds` is the whole stop: as `Pool.compact_step` returns it, the step's own time
/// under the pause (planning and moving); as `Pool.run_staged` returns it, checking and moving
/// (the planning ran before the pause); a `Compactor` replaces it (`with_pause`) with the stop
/// it measured, waiting for calls in flight included. `stale`: moves of a staged compaction
/// dropped because the pool changed since it was planned.
#[pyclass(module = "npumem._core", frozen, eq, get_all)]
#[derive(Clone, PartialEq)]
pub struct StepReport {
    /// Blocks moved.
    blocks: usize,
    /// Bytes copied.
    bytes: usize,
    /// How many more chunks the pool holds free after the step than before it
    /// (`stats().chunks_free`).
    chunks_freed: usize,
    /// The whole stop of the pool (seconds).
    pause_seconds: f64,
    /// Time spent planning (seconds).
    planning_seconds: f64,
    /// Time spent moving (seconds).
    moving_seconds: f64,
    /// Whether the stop took longer than the compactor's pause budget.
    over_budget: bool,
    /// Batches run.
    batches: usize,
    /// Copies made (each a `memmove` or one mover transfer).
    transfers: usize,
    /// Moves of a staged compaction dropped because the pool changed since it was planned.
    stale: usize,
}

impl StepReport {
    pub(crate) fn from_core(r: &npumem_core::StepReport) -> StepReport {
        let (planning, moving) = (r.planning.as_secs_f64(), r.moving.as_secs_f64());
        // A staged compaction planned before the pause; under it, it checked and moved.
        let staged = r.checking.as_secs_f64() + moving;
        StepReport {
            blocks: r.blocks,
            bytes: r.bytes,
            chunks_freed: r.chunks_freed,
            pause_seconds: if r.checking.is_zero() && r.stale == 0 { planning + moving } else { staged },
            planning_seconds: planning,
            moving_seconds: moving,
            over_budget: false,
            batches: r.batches,
            transfers: r.transfers,
            stale: r.stale,
        }
    }
}

#[pymethods]
impl StepReport {
    /// A report, checked: the counts ints from 0, the seconds finite numbers >= 0.
    #[new]
    #[pyo3(
        signature = (
            blocks, bytes, chunks_freed, pause_seconds, planning_seconds, moving_seconds,
            over_budget = false, *, batches = None, transfers = None, stale = None,
        ),
        text_signature = "(blocks, bytes, chunks_freed, pause_seconds, planning_seconds, moving_seconds, over_budget=False, *, batches=0, transfers=0, stale=0)"
    )]
    #[allow(clippy::too_many_arguments)]
    fn new(
        blocks: &Bound<'_, PyAny>,
        bytes: &Bound<'_, PyAny>,
        chunks_freed: &Bound<'_, PyAny>,
        pause_seconds: &Bound<'_, PyAny>,
        planning_seconds: &Bound<'_, PyAny>,
        moving_seconds: &Bound<'_, PyAny>,
        over_budget: bool,
        batches: Option<&Bound<'_, PyAny>>,
        transfers: Option<&Bound<'_, PyAny>>,
        stale: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<StepReport> {
        let count = |value: Option<&Bound<'_, PyAny>>, name| value.map_or(Ok(0), |v| args::count(v, name));
        Ok(StepReport {
            blocks: args::count(blocks, "blocks")?,
            bytes: args::count(bytes, "bytes")?,
            chunks_freed: args::count(chunks_freed, "chunks_freed")?,
            pause_seconds: args::seconds(pause_seconds, "pause_seconds")?,
            planning_seconds: args::seconds(planning_seconds, "planning_seconds")?,
            moving_seconds: args::seconds(moving_seconds, "moving_seconds")?,
            over_budget,
            batches: count(batches, "batches")?,
            transfers: count(transfers, "transfers")?,
            stale: count(stale, "stale")?,
        })
    }

    /// The same report with the stop as the caller measured it (a finite number of seconds
    /// >= 0).
    #[pyo3(signature = (pause_seconds, *, over_budget = false))]
    fn with_pause(&self, pause_seconds: &Bound<'_, PyAny>, over_budget: bool) -> PyResult<StepReport> {
        let pause_seconds = args::seconds(pause_seconds, "pause_seconds")?;
        Ok(StepReport { pause_seconds, over_budget, ..self.clone() })
    }

    /// The fields as a dict.
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("blocks", self.blocks)?;
        d.set_item("bytes", self.bytes)?;
        d.set_item("chunks_freed", self.chunks_freed)?;
        d.set_item("pause_seconds", self.pause_seconds)?;
        d.set_item("planning_seconds", self.planning_seconds)?;
        d.set_item("moving_seconds", self.moving_seconds)?;
        d.set_item("over_budget", self.over_budget)?;
        d.set_item("batches", self.batches)?;
        d.set_item("transfers", self.transfers)?;
        d.set_item("stale", self.stale)?;
        Ok(d)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        repr::dataclass_like("StepReport", &self.as_dict(py)?)
    }
}
