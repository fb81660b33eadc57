//! `StagedCompaction`: a compaction planned while the pool runs (`Pool.stage_compaction`), to
//! run once on the paused pool (`Pool.run_staged`).

use std::sync::Mutex;

use pyo3::prelude::*;

use crate::errors::{error, ErrorClass};
use crate::step_report::StepReport;

/// A compaction planned without stopping the pool: `Pool.run_staged(pause, staged)` checks
/// its moves on the paused pool (each block still where it was planned, each destination still
/// free), drops the stale ones and makes the others. It runs once.
#[pyclass(module = "npumem._core", frozen)]
pub struct StagedCompaction {
    staged: Mutex<Option<npumem_core::StagedCompaction>>,
    /// What its run made, once it has run.
    report: Mutex<Option<StepReport>>,
    moves: usize,
    bytes: usize,
    planning_seconds: f64,
}

impl StagedCompaction {
    pub(crate) fn new(staged: npumem_core::StagedCompaction) -> StagedCompaction {
        StagedCompaction {
            moves: staged.moves(),
            bytes: staged.bytes(),
            planning_seconds: staged.planning().as_secs_f64(),
            staged: Mutex::new(Some(staged)),
            report: Mutex::new(None),
        }
    }

    /// Keep what its run made (see `report`).
    pub(crate) fn ran(&self, report: StepReport) {
        *self.report.lock().unwrap_or_else(|p| p.into_inner()) = Some(report);
    }

    /// The plan, taken out to run (an error if it ran already).
    pub(crate) fn take(&self) -> PyResult<npumem_core::StagedCompaction> {
        let mut slot = self.staged.lock().unwrap_or_else(|p| p.into_inner());
        slot.take().ok_or_else(|| error(ErrorClass::InvalidArgument, "this staged compaction ran already"))
    }
}

#[pymethods]
impl StagedCompaction {
    /// Moves planned, all batches together.
    #[getter]
    fn moves(&self) -> usize {
        self.moves
    }

    /// Bytes the moves would copy.
    #[getter]
    fn bytes(&self) -> usize {
        self.bytes
    }

    /// How long planning took (seconds; the pool was not stopped for it).
    #[getter]
    fn planning_seconds(&self) -> f64 {
        self.planning_seconds
    }

    /// What `Pool.run_staged` made of it (its `StepReport`), `None` until it has run: also there
    /// for a caller whose `run_staged` call was interrupted as it returned (Ctrl-C during a long
    /// run is handled then), so that the moves made are not lost from its records.
    #[getter]
    fn report(&self) -> Option<StepReport> {
        self.report.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn __repr__(&self) -> String {
        format!(
            "StagedCompaction(moves={}, bytes={}, planning_seconds={:.6})",
            self.moves, self.bytes, self.planning_seconds
        )
    }
}
