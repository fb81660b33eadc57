//! `Pause`: a held pause of a pool (`Pool.pause()`).

use std::sync::{Arc, Mutex, TryLockError};
use std::time::Duration;

use npumem_core::{Error, PauseToken};
use pyo3::prelude::*;

use crate::args;
use crate::errors::{error, to_py, ErrorClass};
use crate::gil::without_gil;
use crate::pool::state::Pool;

/// A held pause of a pool: alloc and free calls of other threads wait until it is resumed
/// (`resume()`, leaving a `with` block, or garbage collection). The thread that paused may still
/// use the pool.
#[pyclass(module = "npumem._core", frozen)]
pub struct Pause {
    core: Arc<npumem_core::Pool>,
    pool: Py<Pool>,
    token: Mutex<Option<PauseToken>>,
}

impl Drop for Pause {
    fn drop(&mut self) {
        let token = self.token.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(token) = token {
            if self.core.resume(&token).is_ok() {
                // Blocks collected while the pool was paused are freed now.
                Python::try_attach(|py| self.pool.get().retry_stranded(py));
            }
        }
    }
}

fn in_use() -> PyErr {
    error(ErrorClass::PoolBusy, "this pause is in use by another call (a compaction or a mover running under it)")
}

impl Pause {
    /// Pause `pool`, waiting (without the GIL) at most `timeout` seconds for calls in flight.
    pub(crate) fn take(pool: &Bound<'_, Pool>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<Pause> {
        let seconds = args::timeout(timeout)?;
        let core = pool.get().core.clone();
        let token = without_gil(pool.py(), || core.pause(Duration::from_secs_f64(seconds)))?;
        Ok(Pause { core, pool: pool.clone().unbind(), token: Mutex::new(Some(token)) })
    }

    /// The pause an argument names (it must pause `pool`).
    pub(crate) fn of<'a>(pool: &Pool, value: &'a Bound<'_, PyAny>) -> PyResult<&'a Pause> {
        let pause = value
            .cast::<Pause>()
            .map_err(|_| {
                error(
                    ErrorClass::ArgumentType,
                    format!("pause must be an npumem.Pause, got {}", args::type_name(value)),
                )
            })?
            .get();
        if !Arc::ptr_eq(&pause.core, &pool.core) {
            return Err(error(ErrorClass::InvalidArgument, "the pause belongs to another pool"));
        }
        Ok(pause)
    }

    /// Run `work` with the token, if the pause still holds.
    pub(crate) fn with_token<T>(&self, work: impl FnOnce(&PauseToken) -> PyResult<T>) -> PyResult<T> {
        let guard = match self.token.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::WouldBlock) => return Err(in_use()),
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
        };
        match guard.as_ref() {
            Some(token) => work(token),
            None => Err(to_py(Error::NotPaused)),
        }
    }
}

#[pymethods]
impl Pause {
    /// Let the pool run again (nothing happens if it was resumed already).
    fn resume(&self, py: Python<'_>) -> PyResult<()> {
        let mut guard = match self.token.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::WouldBlock) => return Err(in_use()),
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
        };
        if let Some(token) = guard.as_ref() {
            let core = &self.core;
            without_gil(py, || core.resume(token))?;
            *guard = None;
            drop(guard);
            // Blocks collected while the pool was paused are freed now.
            self.pool.get().retry_stranded(py);
        }
        Ok(())
    }

    /// Whether this pause still holds the pool.
    #[getter]
    fn held(&self) -> bool {
        match self.token.try_lock() {
            Ok(guard) => guard.as_ref().is_some_and(|t| self.core.holds(t)),
            Err(_) => true, // in use by a call under it
        }
    }

    /// The paused pool.
    #[getter]
    fn pool(&self, py: Python<'_>) -> Py<Pool> {
        self.pool.clone_ref(py)
    }

    /// The pause itself; one resumed already cannot be entered (the `with` body would run
    /// with the pool running).
    fn __enter__(slf: Py<Self>) -> PyResult<Py<Self>> {
        slf.get().with_token(|_| Ok(()))?;
        Ok(slf)
    }

    /// Resume on leaving the `with` block.
    #[pyo3(signature = (_exc_type = None, _exc = None, _tb = None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        _exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        self.resume(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        format!("<npumem.Pause of pool {} held={}>", self.core.id(), self.held())
    }
}
