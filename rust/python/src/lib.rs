use pyo3::prelude::*;
mod packing;
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", npumem_core::version())?;
    packing::register(m)?;
    Ok(())
}
