//! npumem-python: the thin PyO3 layer over npumem-core, built by maturin as `npumem._core`.
//!
//! Errors become Python exceptions in one place (`errors.rs`); work that can take long runs
//! without the GIL through one helper (`gil.rs`); arguments are checked in `args.rs`. The
//! classes (`Pool`, `Block`, `PoolStats`) do nothing but convert and delegate.

mod args;
mod block;
mod compaction;
mod errors;
mod gil;
mod kv;
mod monitor;
mod packing;
mod pool;
mod stats;

use pyo3::prelude::*;

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", npumem_core::version())?;
    m.add_class::<pool::Pool>()?;
    m.add_class::<block::Block>()?;
    m.add_class::<kv::PagedKV>()?;
    m.add_class::<compaction::Pause>()?;
    m.add_class::<compaction::Pinned>()?;
    m.add_class::<stats::PoolStats>()?;
    m.add_class::<stats::CoreStats>()?;
    m.add_class::<stats::SizeClassStats>()?;
    packing::register(m)?;
    Ok(())
}
