//! Statistics by tag: for each tag, the live blocks, the bytes they asked for, and the peak of
//! those bytes (`PoolStats.by_tag`).
//!
//! The binding keeps them, for the blocks allocated and freed through Python: `Pool.alloc` and
//! `alloc_many` add a block, `Block.free`, `Pool.free` and `free_many` take it away, each after
//! the core call succeeded. Every update happens with the GIL held, so updates never race and
//! plain relaxed loads and stores suffice (no read-modify-write on the allocation path).
//!
//! Cardinality is bounded: the first [`NAMED_TAGS`] tags a pool sees have their own counters,
//! later tags share one (`"(other tags)"`), and blocks without a tag have theirs (`None`).

use std::sync::atomic::{AtomicUsize, Ordering};

use pyo3::prelude::*;

use crate::repr;
use crate::tags::Tags;

/// Tags with counters of their own (tag ids 1 to this; id 0 is "no tag").
pub(crate) const NAMED_TAGS: usize = 63;
/// The label of the counters that later tags share.
pub(crate) const OTHER_TAGS: &str = "(other tags)";
const SLOTS: usize = NAMED_TAGS + 2; // no tag, the named tags, the others

#[derive(Default)]
struct Counters {
    blocks: AtomicUsize,
    bytes: AtomicUsize,
    peak: AtomicUsize,
}

/// A pool's counters by tag.
pub(crate) struct TagCounters {
    slots: [Counters; SLOTS],
}

impl Default for TagCounters {
    fn default() -> TagCounters {
        TagCounters { slots: std::array::from_fn(|_| Counters::default()) }
    }
}

fn slot(tag: u32) -> usize {
    (tag as usize).min(NAMED_TAGS + 1)
}

fn bump(cell: &AtomicUsize, f: impl FnOnce(usize) -> usize) -> usize {
    let value = f(cell.load(Ordering::Relaxed));
    cell.store(value, Ordering::Relaxed);
    value
}

impl TagCounters {
    /// A block of `nbytes` with tag id `tag` was allocated (call with the GIL held).
    #[inline]
    pub(crate) fn allocated(&self, _py: Python<'_>, tag: u32, nbytes: usize) {
        let c = &self.slots[slot(tag)];
        bump(&c.blocks, |n| n + 1);
        let bytes = bump(&c.bytes, |n| n + nbytes);
        if bytes > c.peak.load(Ordering::Relaxed) {
            c.peak.store(bytes, Ordering::Relaxed);
        }
    }

    /// A block of `nbytes` with tag id `tag` was freed (call with the GIL held).
    #[inline]
    pub(crate) fn freed(&self, _py: Python<'_>, tag: u32, nbytes: usize) {
        let c = &self.slots[slot(tag)];
        bump(&c.blocks, |n| n.saturating_sub(1));
        bump(&c.bytes, |n| n.saturating_sub(nbytes));
    }

    /// Every peak back to the bytes in use now (call with the GIL held).
    pub(crate) fn reset_peaks(&self, _py: Python<'_>) {
        for c in &self.slots {
            c.peak.store(c.bytes.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// The figures of every tag that has had a block, largest bytes in use first.
    pub(crate) fn read(&self, py: Python<'_>, tags: &Tags) -> Vec<TagStats> {
        let mut out: Vec<TagStats> = self
            .slots
            .iter()
            .enumerate()
            .filter(|(_, c)| c.peak.load(Ordering::Relaxed) > 0 || c.blocks.load(Ordering::Relaxed) > 0)
            .map(|(i, c)| TagStats {
                tag: match i {
                    0 => None,
                    i if i <= NAMED_TAGS => tags.name_string(py, i as u32),
                    _ => Some(OTHER_TAGS.to_string()),
                },
                blocks_in_use: c.blocks.load(Ordering::Relaxed),
                requested_bytes_in_use: c.bytes.load(Ordering::Relaxed),
                peak_requested_bytes_in_use: c.peak.load(Ordering::Relaxed),
            })
            .collect();
        out.sort_by(|a, b| b.requested_bytes_in_use.cmp(&a.requested_bytes_in_use).then(a.tag.cmp(&b.tag)));
        out
    }
}

/// One tag's share of a pool (`PoolStats.by_tag`): its live blocks, the bytes they asked for,
/// and the highest that figure has been (since the pool was made or `reset_peak()`).
/// `tag` is None for blocks without a tag and `"(other tags)"` for the tags after the first 63.
#[pyclass(module = "npumem._core", frozen, eq, get_all)]
#[derive(Clone, PartialEq, Eq)]
pub struct TagStats {
    /// The tag (None: blocks without one).
    tag: Option<String>,
    /// Live blocks with the tag.
    blocks_in_use: usize,
    /// Bytes those blocks asked for.
    requested_bytes_in_use: usize,
    /// The highest `requested_bytes_in_use` seen.
    peak_requested_bytes_in_use: usize,
}

impl TagStats {
    /// The fields as a dict.
    pub(crate) fn dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        let d = pyo3::types::PyDict::new(py);
        d.set_item("tag", &self.tag)?;
        d.set_item("blocks_in_use", self.blocks_in_use)?;
        d.set_item("requested_bytes_in_use", self.requested_bytes_in_use)?;
        d.set_item("peak_requested_bytes_in_use", self.peak_requested_bytes_in_use)?;
        Ok(d)
    }
}

#[pymethods]
impl TagStats {
    /// The fields as a dict.
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        self.dict(py)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        repr::dataclass_like("TagStats", &self.as_dict(py)?)
    }
}
