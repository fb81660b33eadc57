//! `PackingInstance`: the search of the lifetime planner (`npumem.plan`) over static offsets,
//! from `npumem_core::plan_search`.
//!
//! `PackingInstance(...)` is built once per component; `instance.search(...)` runs one
//! depth-first run with the GIL released. `PlanTimeline(...)` holds a whole problem as columns
//! for the passes that must stay fast at millions of buffers (the bound, the pairs counted, the
//! overlap check, the greedy placements), each run with the GIL released.

use std::time::{Duration, Instant};

use npumem_core::plan_search::{
    self, Key, Limits, Order, PackingError, PackingInstance as Instance, Timeline, Verdict,
};
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
    /// `C` (sections), `G` (alignment), compared largest first, then `rank`. With
    /// `follow_order`, a forced section is chosen by the order's first child instead of by the
    /// fewest children.
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
                Key::from_letter(c).ok_or_else(|| PackingError(format!("unknown order key {c:?} (W, A, T, Z, C or G)")))
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

/// A whole planning problem as columns: buffer `i` is live on `[lower[i], upper[i])`, takes
/// `sizes[i]` bytes at a multiple of `alignments[i]`, pinned at `fixed[i]` unless that is `None`.
#[pyclass(frozen, module = "npumem._core")]
pub struct PlanTimeline {
    inner: Timeline,
}

/// The deadline `seconds` from now (`None`: none; at or below 0: passed already).
fn deadline_in(seconds: Option<f64>) -> PyResult<Option<Instant>> {
    match seconds {
        None => Ok(None),
        Some(s) if s.is_nan() => Err(errors::plan_search(PackingError("time_limit is NaN".to_string()))),
        Some(s) if s <= 0.0 => Ok(Some(Instant::now())),
        Some(s) => Ok(deadline_after(s)),
    }
}

/// Offsets for Python: a buffer left unplaced (`u64::MAX`) is -1.
fn signed(offsets: Vec<u64>) -> Vec<i64> {
    offsets.into_iter().map(|o| i64::try_from(o).unwrap_or(-1)).collect()
}

#[pymethods]
impl PlanTimeline {
    #[new]
    fn new(
        lower: Vec<i64>,
        upper: Vec<i64>,
        sizes: Vec<u64>,
        alignments: Vec<u64>,
        fixed: Vec<Option<u64>>,
    ) -> PyResult<Self> {
        Timeline::new(lower, upper, sizes, &alignments, fixed).map(|inner| Self { inner }).map_err(errors::plan_search)
    }

    /// Number of buffers.
    fn __len__(&self) -> usize {
        self.inner.len()
    }

    /// For each buffer, how many others are live at the same time.
    fn overlap_counts(&self, py: Python<'_>) -> Vec<u64> {
        detached(py, || self.inner.overlap_counts())
    }

    /// The number of pairs of buffers live at the same time.
    fn overlap_pairs(&self, py: Python<'_>) -> u64 {
        detached(py, || self.inner.overlap_pairs())
    }

    /// The live-bytes and alignment lower bound on any packing's arena.
    fn live_bound(&self, py: Python<'_>) -> u64 {
        detached(py, || self.inner.live_bound())
    }

    /// Two buffers live together whose bytes overlap at `offsets` (the smaller index first), or
    /// `None`.
    fn first_overlap(&self, py: Python<'_>, offsets: Vec<u64>) -> PyResult<Option<(u32, u32)>> {
        detached(py, || self.inner.first_overlap(&offsets)).map_err(errors::plan_search)
    }

    /// The buffers of `order` placed in turn in the best (`best_fit`) or the lowest gap; `None`
    /// when `time_limit` seconds pass first. Buffers neither pinned nor in `order` get -1.
    #[pyo3(signature = (order, best_fit, time_limit=None))]
    fn place_in_order(
        &self,
        py: Python<'_>,
        order: Vec<u32>,
        best_fit: bool,
        time_limit: Option<f64>,
    ) -> PyResult<Option<Vec<i64>>> {
        if let Some(&bad) = order.iter().find(|&&i| i as usize >= self.inner.len()) {
            return Err(errors::plan_search(PackingError(format!("order names buffer {bad} of {}", self.inner.len()))));
        }
        let mut named = vec![false; self.inner.len()];
        if let Some(&twice) = order.iter().find(|&&i| std::mem::replace(&mut named[i as usize], true)) {
            return Err(errors::plan_search(PackingError(format!("order names buffer {twice} twice"))));
        }
        let deadline = deadline_in(time_limit)?;
        Ok(detached(py, || plan_search::place_in_order(&self.inner, &order, best_fit, deadline)).map(signed))
    }

    /// The linear scan's offsets (see `npumem.plan.greedy.linear_scan`); past `time_limit`
    /// seconds each buffer looks at a bounded number of free ranges.
    #[pyo3(signature = (time_limit=None))]
    fn linear_scan(&self, py: Python<'_>, time_limit: Option<f64>) -> PyResult<Vec<i64>> {
        let deadline = deadline_in(time_limit)?;
        Ok(signed(detached(py, || plan_search::linear_scan(&self.inner, deadline))))
    }
}

/// The moment `seconds` (finite, >= 0) from now, or none when that is past what an `Instant`
/// can hold (a limit of 1e300 s is no limit).
fn deadline_after(seconds: f64) -> Option<Instant> {
    Duration::try_from_secs_f64(seconds).ok().and_then(|d| Instant::now().checked_add(d))
}
