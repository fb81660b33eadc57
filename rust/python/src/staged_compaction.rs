//! `StagedCompaction`: a compaction planned while the pool runs (`Pool.stage_compaction`), to
//! run once on the paused pool (`Pool.run_staged`).

use std::sync::Mutex;

use pyo3::prelude::*;

use crate::errors::{error, ErrorClass};

/// A compaction planned without stopping the pool: `Pool.run_staged(pause, staged)` checks
/// its moves on the paused pool (each block still where it was planned, each destination still
/// free), drops the stale ones and makes the others. It runs once.
#[pyclass(module = "npumem._core", frozen)]
pub struct StagedCompaction {
    staged: Mutex<Option<npumem_core::StagedCompaction>>,
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
        }
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

    fn __repr__(&self) -> String {
        format!(
            "StagedCompaction(moves={}, bytes={}, planning_seconds={:.6})",
            self.moves, self.bytes, self.planning_seconds
        )
    }
}
