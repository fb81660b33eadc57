//! `npumem.PoolStats`, `npumem.CoreStats` and `npumem.SizeClassStats`: plain snapshots of
//! `npumem_core::PoolStats`. Their fields come from the core's field lists
//! (`npumem_core::pool_stats_fields!` and the others), so both sides have the same fields;
//! `PoolStats.by_tag`, `deferred_pending` and `auto_freed` are the binding's own
//! (`tag_stats.rs`, `pool/pending.rs`).

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::from_dict::{dict_of, field, list, reduce};
use crate::tag_stats::TagStats;

/// Defines a frozen Python class from a core field list: `[attributes, name from core type;
/// nested lists; `+` binding lists; `=` binding counters]`, with `convert` (from the core struct),
/// `dict` (the fields as a dict) and `parse` (back from such a dict, as saved files hold it).
/// Binding lists and counters are kept by the binding, not the core (`by_tag`,
/// `deferred_pending`): `convert` leaves them empty (zero) and the caller fills them.
macro_rules! py_stats_class {
    (
        [$(#[$attr:meta])* $name:ident from $core:ty; $($nested:ident: $nty:ident,)*
         $(+ $extra:ident: $ety:ident,)*
         $(= $(#[$sdoc:meta])* $scalar:ident: $sty:ty,)*]
        $($(#[$doc:meta])* $field:ident: $ty:ty,)*
    ) => {
        $(#[$attr])*
        #[pyclass(module = "npumem._core", frozen, eq, get_all)]
        #[derive(Clone, PartialEq)]
        pub struct $name {
            $($(#[$doc])* $field: $ty,)*
            $($nested: Vec<$nty>,)*
            $($extra: Vec<$ety>,)*
            $($(#[$sdoc])* $scalar: $sty,)*
        }

        impl $name {
            fn convert(s: $core) -> $name {
                $name {
                    $($field: s.$field,)*
                    $($nested: s.$nested.into_iter().map($nty::convert).collect(),)*
                    $($extra: Vec::new(),)*
                    $($scalar: Default::default(),)*
                }
            }

            /// Back from a dict of `dict` (a missing field is 0, a missing list empty).
            pub(crate) fn parse(d: &Bound<'_, PyAny>) -> PyResult<$name> {
                let d = dict_of(d, stringify!($name))?;
                Ok($name {
                    $($field: field(&d, stringify!($name), stringify!($field))?,)*
                    $($nested: list(&d, stringify!($name), stringify!($nested), $nty::parse)?,)*
                    $($extra: list(&d, stringify!($name), stringify!($extra), $ety::parse)?,)*
                    $($scalar: field(&d, stringify!($name), stringify!($scalar))?,)*
                })
            }

            fn dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
                let d = PyDict::new(py);
                $(d.set_item(stringify!($field), self.$field)?;)*
                $(d.set_item(stringify!($scalar), self.$scalar)?;)*
                $(d.set_item(
                    stringify!($nested),
                    self.$nested.iter().map(|c| c.dict(py)).collect::<PyResult<Vec<_>>>()?,
                )?;)*
                $(d.set_item(
                    stringify!($extra),
                    self.$extra.iter().map(|c| c.dict(py)).collect::<PyResult<Vec<_>>>()?,
                )?;)*
                Ok(d)
            }
        }
    };
}

npumem_core::core_stats_fields!(
    py_stats_class,
    /// One core pool's share of a `PoolStats`.
    CoreStats from npumem_core::CoreStats;
);

npumem_core::class_stats_fields!(
    py_stats_class,
    /// One slab size class of a `PoolStats`.
    SizeClassStats from npumem_core::ClassStats;
);

npumem_core::pool_stats_fields!(
    py_stats_class,
    /// A snapshot of a pool: usage, fragmentation and counters.
    PoolStats from npumem_core::PoolStats;
    size_classes: SizeClassStats,
    per_core: CoreStats,
    + by_tag: TagStats,
    = /// Frees queued and not yet made: deferred frees (`Pool.defer_free`, `with
      /// pool.deferred():` scopes of every thread) and frees of collected blocks that wait for
      /// the pool (paused by another thread, or the block pinned).
      deferred_pending: u64,
    = /// Blocks freed because their last reference went (or their last pin, after a `with`
      /// block's exit raised), not by a `free()` call.
      auto_freed: u64,
);

#[pymethods]
impl CoreStats {
    /// A `CoreStats` from the dict `as_dict()` gives (a missing field is 0).
    #[staticmethod]
    fn from_dict(d: &Bound<'_, PyAny>) -> PyResult<CoreStats> {
        CoreStats::parse(d)
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyDict>,))> {
        reduce(slf.as_any(), slf.get().dict(slf.py())?)
    }

    /// The fields as a dict.
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.dict(py)
    }

    fn __repr__(&self) -> String {
        format!(
            "CoreStats(core={}, chunks={}, bytes_in_use={}, bytes_free={}, alloc_count={}, free_count={})",
            self.core, self.chunks, self.bytes_in_use, self.bytes_free, self.alloc_count, self.free_count
        )
    }
}

#[pymethods]
impl SizeClassStats {
    /// A `SizeClassStats` from the dict `as_dict()` gives (a missing field is 0).
    #[staticmethod]
    fn from_dict(d: &Bound<'_, PyAny>) -> PyResult<SizeClassStats> {
        SizeClassStats::parse(d)
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyDict>,))> {
        reduce(slf.as_any(), slf.get().dict(slf.py())?)
    }

    /// The fields as a dict.
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.dict(py)
    }

    fn __repr__(&self) -> String {
        format!(
            "SizeClassStats(size={}, blocks_in_use={}, slabs={}, waste_bytes={})",
            self.size, self.blocks_in_use, self.slabs, self.waste_bytes
        )
    }
}

impl PoolStats {
    /// The binding's snapshot of a core snapshot (`capacity` is the pool's, as in `s`), with the
    /// binding's figures by tag.
    pub(crate) fn from_core(s: npumem_core::PoolStats, capacity: usize, by_tag: Vec<TagStats>) -> PoolStats {
        debug_assert_eq!(s.capacity, capacity);
        PoolStats { by_tag, ..PoolStats::convert(s) }
    }

    /// With the binding's counters of waiting and collected frees.
    pub(crate) fn with_frees(self, deferred_pending: u64, auto_freed: u64) -> PoolStats {
        PoolStats { deferred_pending, auto_freed, ..self }
    }
}

#[pymethods]
impl PoolStats {
    /// A `PoolStats` from the dict `as_dict()` gives, as snapshot and trace files keep it (a
    /// missing field is 0, a missing list empty).
    #[staticmethod]
    fn from_dict(d: &Bound<'_, PyAny>) -> PyResult<PoolStats> {
        PoolStats::parse(d)
    }

    fn __reduce__<'py>(slf: &Bound<'py, Self>) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyDict>,))> {
        reduce(slf.as_any(), slf.get().dict(slf.py())?)
    }

    /// `bytes_in_use / usable_capacity` (0.0 for an empty arena).
    #[getter]
    fn usage(&self) -> f64 {
        if self.usable_capacity == 0 {
            0.0
        } else {
            self.bytes_in_use as f64 / self.usable_capacity as f64
        }
    }

    /// The fields as a dict (`size_classes`, `per_core` and `by_tag` as lists of dicts).
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.dict(py)
    }

    fn __repr__(&self) -> String {
        format!(
            "PoolStats(capacity={}, bytes_in_use={}, bytes_free={}, peak_bytes_in_use={}, \
             largest_free_block={}, external_fragmentation={:.4}, alloc_count={}, free_count={}, \
             failed_allocs={}, overflow_allocs={})",
            self.capacity,
            self.bytes_in_use,
            self.bytes_free,
            self.peak_bytes_in_use,
            self.largest_free_block,
            self.external_fragmentation,
            self.alloc_count,
            self.free_count,
            self.failed_allocs,
            self.overflow_allocs
        )
    }
}
