//! `PackingInstance`: the search of the lifetime planner (`npumem.plan`) over static offsets,
//! from `npumem_core::plan_search`.
//!
//! `PackingInstance(...)` is built once per component; `instance.search(...)` runs one
//! depth-first run with the GIL released.

use std::time::{Duration, Instant};

use npumem_core::plan_search::{self, Key, Limits, Order, PackingError, PackingInstance as Instance, Verdict};
use pyo3::prelude::*;

use crate::errors;
use crate::gil::detached;

/// One component of a planning problem, ready for [`PackingInstance::search`].
#[pyclass(frozen, module = "npumem._core")]
pub struct PackingInstance {
    inner: Instance,
}

#[pymethods]
impl PackingInstance {
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        sizes: Vec<u64>,
        alignments: Vec<u64>,
        sec_lo: Vec<u32>,
        sec_hi: Vec<u32>,
        n_sections: usize,
        neighbors: Vec<Vec<u32>>,
        obstacles: Vec<Vec<(u64, u64)>>,
    ) -> PyResult<Self> {
        Instance::new(sizes, &alignments, sec_lo, sec_hi, n_sections, &neighbors, &obstacles)
            .map(|inner| Self { inner })
            .map_err(errors::plan_search)
    }

    /// Number of buffers.
    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// One run: returns `(exhausted, offsets or None, arena, nodes)`.
    fn search(
        &self,
        py: Python<'_>,
        rank: Vec<u32>,
        capacity: u64,
        target: u64,
        node_limit: u64,
        time_limit: f64,
    ) -> PyResult<(bool, Option<Vec<u64>>, u64, u64)> {
        if rank.len() != self.inner.len() {
            return Err(errors::plan_search(PackingError(format!(
                "rank has {} entries for {} buffers",
                rank.len(),
                self.inner.len()
            ))));
        }
        if !time_limit.is_finite() || time_limit < 0.0 {
            return Err(errors::plan_search(PackingError(format!(
                "time_limit must be finite and >= 0, got {time_limit}"
            ))));
        }
        let inner = &self.inner;
        let out = detached(py, || {
            let deadline = deadline_after(time_limit);
            plan_search::search(inner, &rank, &Limits { capacity, target, node_limit, deadline })
        });
        Ok((out.exhausted, out.offsets, out.arena, out.nodes))
    }

    /// One decision run at `capacity`: returns `("found" | "exhausted" | "stopped", offsets or
    /// None, nodes)`. `keys` are letters of `W` (width), `A` (area), `T` (total), `Z` (size),
    /// `C` (sections), compared largest first, then `rank`. With `follow_order`, a forced section
    /// is chosen by the order's first child instead of by the fewest children.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (keys, widths, rank, capacity, node_limit, time_limit, follow_order=false))]
    fn decide(
        &self,
        py: Python<'_>,
        keys: &str,
        widths: Vec<u64>,
        rank: Vec<u32>,
        capacity: u64,
        node_limit: u64,
        time_limit: f64,
        follow_order: bool,
    ) -> PyResult<(&'static str, Option<Vec<u64>>, u64)> {
        for (what, len) in [("rank", rank.len()), ("widths", widths.len())] {
            if len != self.inner.len() {
                return Err(errors::plan_search(PackingError(format!(
                    "{what} has {len} entries for {} buffers",
                    self.inner.len()
                ))));
            }
        }
        let keys = keys
            .chars()
            .map(|c| {
                Key::from_letter(c).ok_or_else(|| PackingError(format!("unknown order key {c:?} (W, A, T, Z or C)")))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(errors::plan_search)?;
        let order = Order { follow_order, ..Order::new(keys, widths, rank) };
        if !time_limit.is_finite() || time_limit < 0.0 {
            return Err(errors::plan_search(PackingError(format!(
                "time_limit must be finite and >= 0, got {time_limit}"
            ))));
        }
        let inner = &self.inner;
        let out = detached(py, || {
            let deadline = deadline_after(time_limit);
            plan_search::decide(inner, &order, capacity, node_limit, deadline)
        });
        let verdict = match out.verdict {
            Verdict::Found => "found",
            Verdict::Exhausted => "exhausted",
            Verdict::Stopped => "stopped",
        };
        Ok((verdict, out.offsets, out.nodes))
    }
}

/// The moment `seconds` (finite, >= 0) from now, or none when that is past what an `Instant`
/// can hold (a limit of 1e300 s is no limit).
fn deadline_after(seconds: f64) -> Option<Instant> {
    Duration::try_from_secs_f64(seconds).ok().and_then(|d| Instant::now().checked_add(d))
}
