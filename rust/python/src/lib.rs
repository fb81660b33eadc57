//! npumem-python: the thin PyO3 layer over npumem-core, built by maturin as `npumem._core`.
//!
//! Each Python class has one home: `pool/` (`Pool`, and `Deferred`, what `Pool.deferred()`
//! returns), `block.rs` (`Block`), `pause.rs`
//! (`Pause`), `pinned.rs` (`Pinned` and pinning), `stats.rs` (`PoolStats` and its parts),
//! `block_info.rs` (`BlockInfo`), `step_report.rs` (`StepReport`), `compaction_plan.rs`
//! (`CompactionPlan`, `PlannedMove`), `trace.rs` (`TraceStatus`), `measure.rs` (`Measurement`,
//! what `Pool.measure()` returns), `tag_stats.rs` (`TagStats`), `snapshot.rs` (`RawSnapshot`),
//! `plan_search.rs` (`PackingInstance`, `PlanTimeline`) and `transfer.rs` (`Transfer`, one copy a mover makes).
//! Results cross the boundary as these typed classes, never as dicts; `repr.rs` writes their
//! reprs, and `from_dict.rs` reads the stats classes back from the dicts saved files keep.
//!
//! Errors become Python exceptions in one place (`errors.rs`, which also defines the exception
//! classes); work that can take long runs without the GIL through one helper (`gil.rs`);
//! arguments are checked in `args.rs`. A failing allocation's retry through the out-of-memory
//! handler is `oom.rs`; the `on_grow` and `on_trim` callables of a pool that grows are
//! `growth.rs`; calling a Python mover is `mover.rs`; tag strings are interned
//! through `tags.rs` (the core holds the table and the counters by tag; `tag_stats.rs` reads
//! them); Python call stacks of allocations
//! (`trace_start(stacks=True)`) are kept in `stacks.rs`. A block leaves as a DLPack capsule
//! through `dlpack.rs` (and as a NumPy array through `array.rs`); a pool leaves for C code in the
//! same process as an `npumem_pool*` of the C ABI (the `npumem-capi` crate) through `c_pool.rs`.
//!
//! The binding imports nothing from the Python package: what `Pool.snapshot()` returns, and how
//! byte counts read in the text of typed results, come from callables the package installs
//! (`views.rs`).

mod args;
mod array;
mod block;
mod block_info;
mod byte_text;
mod c_pool;
mod compaction_plan;
mod dlpack;
mod errors;
mod from_dict;
mod gil;
mod growth;
mod kv;
mod measure;
mod mover;
mod oom;
mod pause;
mod pinned;
mod plan_search;
mod pool;
mod py_alloc;
mod repr;
mod snapshot;
mod stacks;
mod staged_compaction;
mod stats;
mod step_report;
mod tag_stats;
mod tags;
mod trace;
mod transfer;
mod user_code;
mod views;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", npumem_core::version())?;
    m.add("MAX_TAG_BYTES", npumem_core::MAX_TAG_BYTES)?;
    errors::register(m)?;
    m.add_class::<pool::state::Pool>()?;
    m.add_class::<block::Block>()?;
    m.add_class::<kv::PagedKV>()?;
    m.add_class::<block_info::BlockInfo>()?;
    m.add_class::<transfer::Transfer>()?;
    m.add_class::<pause::Pause>()?;
    m.add_class::<pinned::Pinned>()?;
    m.add_class::<pool::deferred::Deferred>()?;
    m.add_class::<stats::PoolStats>()?;
    m.add_class::<stats::CoreStats>()?;
    m.add_class::<stats::SizeClassStats>()?;
    m.add_class::<step_report::StepReport>()?;
    m.add_class::<compaction_plan::CompactionPlan>()?;
    m.add_class::<staged_compaction::StagedCompaction>()?;
    m.add_class::<compaction_plan::PlannedMove>()?;
    m.add_class::<trace::TraceStatus>()?;
    m.add_class::<tag_stats::TagStats>()?;
    m.add_class::<measure::Measurement>()?;
    m.add_class::<snapshot::RawSnapshot>()?;
    m.add_class::<plan_search::PackingInstance>()?;
    m.add_class::<plan_search::PlanTimeline>()?;
    m.add_function(wrap_pyfunction!(views::install_views, m)?)?;
    m.add_function(wrap_pyfunction!(oom::oom_handler_may_wait, m)?)?;
    m.add_function(wrap_pyfunction!(oom::oom_request_sizes, m)?)?;
    m.add_function(wrap_pyfunction!(oom::oom_retry_may_grow, m)?)?;
    Ok(())
}
