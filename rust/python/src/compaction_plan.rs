//! `CompactionPlan` and `PlannedMove`: what a compaction would do (`Pool.plan_compaction`).

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyTuple};

use crate::args;
use crate::byte_text;
use crate::errors::{error, ErrorClass};
use crate::repr;

/// The kinds of a planned move.
const MOVE_KINDS: [&str; 4] = ["block", "slab object", "run", "slab"];
/// The modes of a plan.
const PLAN_MODES: [&str; 3] = ["full", "incremental", "evacuate"];

/// One move a compaction would make: a `"block"`, `"slab object"`, `"run"` (of whole chunks)
/// or `"slab"` (a slab with all its objects) from `src` to `dst`.
#[pyclass(module = "npumem._core", frozen, eq, get_all)]
#[derive(Clone, PartialEq, Eq)]
pub struct PlannedMove {
    /// What moves.
    kind: String,
    /// Where it is.
    src: usize,
    /// Where it would go.
    dst: usize,
    /// Bytes to copy.
    nbytes: usize,
    /// Blocks it re-points (a slab: its objects).
    blocks: usize,
}

#[pymethods]
impl PlannedMove {
    /// A move, checked: `kind` one of `"block"`, `"slab object"`, `"run"`, `"slab"`, the
    /// figures ints from 0.
    #[new]
    fn new(
        kind: &Bound<'_, PyAny>,
        src: &Bound<'_, PyAny>,
        dst: &Bound<'_, PyAny>,
        nbytes: &Bound<'_, PyAny>,
        blocks: &Bound<'_, PyAny>,
    ) -> PyResult<PlannedMove> {
        Ok(PlannedMove {
            kind: args::one_of(kind, "kind", &MOVE_KINDS)?,
            src: args::count(src, "src")?,
            dst: args::count(dst, "dst")?,
            nbytes: args::count(nbytes, "nbytes")?,
            blocks: args::count(blocks, "blocks")?,
        })
    }

    /// The fields as a dict.
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("kind", &self.kind)?;
        d.set_item("src", self.src)?;
        d.set_item("dst", self.dst)?;
        d.set_item("nbytes", self.nbytes)?;
        d.set_item("blocks", self.blocks)?;
        Ok(d)
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        repr::dataclass_like("PlannedMove", &self.as_dict(py)?)
    }
}

/// The answer to "what if we compacted now?": the moves, the bytes, and the largest free block
/// expected afterwards (an estimate: the pool keeps changing).
#[pyclass(module = "npumem._core", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct CompactionPlan {
    mode: String,
    moves: Vec<PlannedMove>,
    blocks: usize,
    bytes: usize,
    chunks_emptied: usize,
    bytes_free: usize,
    bytes_free_after: usize,
    largest_free_before: usize,
    largest_free_after: usize,
}

impl CompactionPlan {
    /// The core's plan, for a compaction of `mode`.
    pub(crate) fn from_core(mode: &str, p: &npumem_core::CompactionPlan) -> CompactionPlan {
        let moves = p
            .moves
            .iter()
            .map(|m| PlannedMove {
                kind: m.kind.to_string(),
                src: m.from,
                dst: m.to,
                nbytes: m.bytes,
                blocks: m.blocks,
            })
            .collect();
        CompactionPlan {
            mode: mode.to_string(),
            moves,
            blocks: p.blocks,
            bytes: p.bytes,
            chunks_emptied: p.chunks_emptied,
            bytes_free: p.bytes_free,
            bytes_free_after: p.bytes_free_after,
            largest_free_before: p.largest_free_before,
            largest_free_after: p.largest_free_after,
        }
    }
}

/// `external_fragmentation` with the largest free block `largest` of `free` free bytes.
fn fragmentation(largest: usize, free: usize) -> f64 {
    if free == 0 {
        0.0
    } else {
        (1.0 - largest as f64 / free as f64).max(0.0)
    }
}

#[pymethods]
impl CompactionPlan {
    /// A plan, checked: `mode` one of `"full"`, `"incremental"`, `"evacuate"`, `moves` an
    /// iterable of `PlannedMove`, the figures ints from 0 (`bytes_free_after` defaults to
    /// `bytes_free`).
    #[new]
    #[pyo3(signature = (
        mode, moves, blocks, bytes, chunks_emptied, bytes_free, largest_free_before,
        largest_free_after, bytes_free_after = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        mode: &Bound<'_, PyAny>,
        moves: &Bound<'_, PyAny>,
        blocks: &Bound<'_, PyAny>,
        bytes: &Bound<'_, PyAny>,
        chunks_emptied: &Bound<'_, PyAny>,
        bytes_free: &Bound<'_, PyAny>,
        largest_free_before: &Bound<'_, PyAny>,
        largest_free_after: &Bound<'_, PyAny>,
        bytes_free_after: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<CompactionPlan> {
        let mode = args::one_of(mode, "mode", &PLAN_MODES)?;
        let not_moves = || {
            error(
                ErrorClass::ArgumentType,
                format!("moves must be an iterable of PlannedMove, got {}", args::type_name(moves)),
            )
        };
        if moves.is_instance_of::<pyo3::types::PyString>() {
            return Err(not_moves());
        }
        let mut planned = Vec::new();
        for (i, item) in moves.try_iter().map_err(|_| not_moves())?.enumerate() {
            let item = item?;
            let m = item.cast::<PlannedMove>().map_err(|_| {
                error(
                    ErrorClass::ArgumentType,
                    format!("moves[{i}] must be a PlannedMove, got {}", args::type_name(&item)),
                )
            })?;
            planned.push(m.get().clone());
        }
        Ok(CompactionPlan {
            mode,
            moves: planned,
            blocks: args::count(blocks, "blocks")?,
            bytes: args::count(bytes, "bytes")?,
            chunks_emptied: args::count(chunks_emptied, "chunks_emptied")?,
            bytes_free: args::count(bytes_free, "bytes_free")?,
            bytes_free_after: match bytes_free_after {
                Some(after) => args::count(after, "bytes_free_after")?,
                None => args::count(bytes_free, "bytes_free")?,
            },
            largest_free_before: args::count(largest_free_before, "largest_free_before")?,
            largest_free_after: args::count(largest_free_after, "largest_free_after")?,
        })
    }

    /// `"full"`, `"incremental"` or `"evacuate"`.
    #[getter]
    fn mode(&self) -> &str {
        &self.mode
    }

    /// Every move, in the order the batches would run them.
    #[getter]
    fn moves<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.moves.iter().cloned())
    }

    /// Blocks it would move.
    #[getter]
    fn blocks(&self) -> usize {
        self.blocks
    }

    /// Bytes it would copy.
    #[getter]
    fn bytes(&self) -> usize {
        self.bytes
    }

    /// How many more chunks the pool would hold free after the step (`stats().chunks_free`):
    /// what the step's `chunks_freed` reports.
    #[getter]
    fn chunks_emptied(&self) -> usize {
        self.chunks_emptied
    }

    /// The pool's `bytes_free` now.
    #[getter]
    fn bytes_free(&self) -> usize {
        self.bytes_free
    }

    /// The pool's `bytes_free` expected afterwards: more than now when the compaction packs
    /// slab objects and gives the slabs it empties back.
    #[getter]
    fn bytes_free_after(&self) -> usize {
        self.bytes_free_after
    }

    /// The largest free block now.
    #[getter]
    fn largest_free_before(&self) -> usize {
        self.largest_free_before
    }

    /// The largest free block expected afterwards.
    #[getter]
    fn largest_free_after(&self) -> usize {
        self.largest_free_after
    }

    /// How much the largest free block would grow (bytes).
    #[getter]
    fn expected_gain(&self) -> i128 {
        self.largest_free_after as i128 - self.largest_free_before as i128
    }

    /// `external_fragmentation` now.
    #[getter]
    fn fragmentation_before(&self) -> f64 {
        fragmentation(self.largest_free_before, self.bytes_free)
    }

    /// `external_fragmentation` expected afterwards.
    #[getter]
    fn fragmentation_after(&self) -> f64 {
        fragmentation(self.largest_free_after, self.bytes_free_after)
    }

    /// Every field, the moves as dicts, plus the derived figures.
    fn as_dict<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("mode", &self.mode)?;
        let moves = PyList::empty(py);
        for m in &self.moves {
            moves.append(m.as_dict(py)?)?;
        }
        d.set_item("moves", moves)?;
        d.set_item("blocks", self.blocks)?;
        d.set_item("bytes", self.bytes)?;
        d.set_item("chunks_emptied", self.chunks_emptied)?;
        d.set_item("bytes_free", self.bytes_free)?;
        d.set_item("bytes_free_after", self.bytes_free_after)?;
        d.set_item("largest_free_before", self.largest_free_before)?;
        d.set_item("largest_free_after", self.largest_free_after)?;
        d.set_item("expected_gain", self.expected_gain())?;
        d.set_item("fragmentation_before", self.fragmentation_before())?;
        d.set_item("fragmentation_after", self.fragmentation_after())?;
        Ok(d)
    }

    /// The fields but the moves, which it counts.
    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let fields = PyDict::new(py);
        fields.set_item("mode", &self.mode)?;
        fields.set_item("blocks", self.blocks)?;
        fields.set_item("bytes", self.bytes)?;
        fields.set_item("chunks_emptied", self.chunks_emptied)?;
        fields.set_item("bytes_free", self.bytes_free)?;
        fields.set_item("bytes_free_after", self.bytes_free_after)?;
        fields.set_item("largest_free_before", self.largest_free_before)?;
        fields.set_item("largest_free_after", self.largest_free_after)?;
        let text = repr::dataclass_like("CompactionPlan", &fields)?;
        Ok(format!("{}, moves=<{} moves>)", text.strip_suffix(')').unwrap_or(&text), self.moves.len()))
    }

    fn __str__(&self) -> String {
        format!(
            "compaction plan ({}): {} blocks, {} to move, {} chunk(s) emptied; largest free block {} -> {} \
             (fragmentation {:.1}% -> {:.1}%)",
            self.mode,
            byte_text::group_thousands(&self.blocks.to_string()),
            byte_text::format_bytes(self.bytes),
            self.chunks_emptied,
            byte_text::format_bytes(self.largest_free_before),
            byte_text::format_bytes(self.largest_free_after),
            self.fragmentation_before() * 100.0,
            self.fragmentation_after() * 100.0
        )
    }
}
