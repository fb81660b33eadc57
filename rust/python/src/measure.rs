//! `Pool.measure()`: statistics of a scope, like RMM's statistics adaptor push and pop.
//!
//! Entering starts a new peak of the pool (`Pool::reset_peak`, remembering the old one) and
//! notes the counters; leaving reads them again and gives the pool back the larger of the two
//! peaks, so scopes nest and the pool's own peak is never lost. The figures cover the whole
//! pool (every thread), not only the thread that opened the scope.

use std::sync::Mutex;
use std::time::Instant;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::errors::{error, ErrorClass};
use crate::pool::state::Pool;
use crate::repr;

/// The counters when the scope began.
struct Start {
    at: Instant,
    outer_peak: usize,
    allocs: u64,
    frees: u64,
    failed: u64,
    bytes_in_use: usize,
}

/// The figures of a finished scope.
#[derive(Clone, Copy, Default)]
struct Figures {
    peak_bytes_in_use: usize,
    allocs: u64,
    frees: u64,
    failed_allocs: u64,
    bytes_in_use_at_start: usize,
    bytes_in_use_at_end: usize,
    seconds: f64,
}

#[derive(Default)]
struct State {
    start: Option<Start>,
    done: Option<Figures>,
}

/// The statistics of one `with pool.measure() as m:` scope: its peak of bytes in use, the
/// allocations, frees and failed allocations made in it, and the bytes in use when it began
/// and ended. The figures are read when the scope ends (None before).
#[pyclass(module = "npumem._core", frozen)]
pub struct Measurement {
    pool: Py<Pool>,
    state: Mutex<State>,
}

impl Measurement {
    pub(crate) fn new(pool: Py<Pool>) -> Measurement {
        Measurement { pool, state: Mutex::new(State::default()) }
    }

    fn figures(&self) -> Option<Figures> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).done
    }
}

#[pymethods]
impl Measurement {
    fn __enter__(slf: Bound<'_, Self>) -> PyResult<Bound<'_, Self>> {
        let this = slf.get();
        let mut state = this.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.start.is_some() || state.done.is_some() {
            return Err(error(ErrorClass::InvalidArgument, "a measurement is used once: call pool.measure() again"));
        }
        let core = &this.pool.get().core;
        let stats = core.stats();
        let outer_peak = core.reset_peak();
        state.start = Some(Start {
            at: Instant::now(),
            outer_peak,
            allocs: stats.alloc_count,
            frees: stats.free_count,
            failed: stats.failed_allocs,
            bytes_in_use: stats.bytes_in_use,
        });
        drop(state);
        Ok(slf)
    }

    #[pyo3(signature = (_exc_type=None, _exc=None, _tb=None))]
    fn __exit__(
        &self,
        _exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> bool {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(start) = state.start.take() {
            let core = &self.pool.get().core;
            let stats = core.stats();
            core.raise_peak(start.outer_peak);
            state.done = Some(Figures {
                peak_bytes_in_use: stats.peak_bytes_in_use,
                allocs: stats.alloc_count.saturating_sub(start.allocs),
                frees: stats.free_count.saturating_sub(start.frees),
                failed_allocs: stats.failed_allocs.saturating_sub(start.failed),
                bytes_in_use_at_start: start.bytes_in_use,
                bytes_in_use_at_end: stats.bytes_in_use,
                seconds: start.at.elapsed().as_secs_f64(),
            });
        }
        false
    }

    /// The highest bytes in use during the scope (the pool's whole peak, every thread).
    #[getter]
    fn peak_bytes_in_use(&self) -> Option<usize> {
        self.figures().map(|f| f.peak_bytes_in_use)
    }

    /// Allocations made during the scope.
    #[getter]
    fn allocs(&self) -> Option<u64> {
        self.figures().map(|f| f.allocs)
    }

    /// Frees made during the scope.
    #[getter]
    fn frees(&self) -> Option<u64> {
        self.figures().map(|f| f.frees)
    }

    /// Allocations that failed during the scope.
    #[getter]
    fn failed_allocs(&self) -> Option<u64> {
        self.figures().map(|f| f.failed_allocs)
    }

    /// Bytes in use when the scope began.
    #[getter]
    fn bytes_in_use_at_start(&self) -> Option<usize> {
        self.figures().map(|f| f.bytes_in_use_at_start)
    }

    /// Bytes in use when the scope ended.
    #[getter]
    fn bytes_in_use_at_end(&self) -> Option<usize> {
        self.figures().map(|f| f.bytes_in_use_at_end)
    }

    /// How long the scope lasted, in seconds.
    #[getter]
    fn seconds(&self) -> Option<f64> {
        self.figures().map(|f| f.seconds)
    }

    /// The figures as a dict (None values before the scope ended).
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let f = self.figures();
        let d = PyDict::new(py);
        d.set_item("peak_bytes_in_use", f.map(|f| f.peak_bytes_in_use))?;
        d.set_item("allocs", f.map(|f| f.allocs))?;
        d.set_item("frees", f.map(|f| f.frees))?;
        d.set_item("failed_allocs", f.map(|f| f.failed_allocs))?;
        d.set_item("bytes_in_use_at_start", f.map(|f| f.bytes_in_use_at_start))?;
        d.set_item("bytes_in_use_at_end", f.map(|f| f.bytes_in_use_at_end))?;
        d.set_item("seconds", f.map(|f| f.seconds))?;
        Ok(d)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        repr::dataclass_like("Measurement", &self.as_dict(py)?)
    }
}
