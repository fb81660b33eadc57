use pyo3::prelude::*;
#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", npumem_core::version())?;
    Ok(())
}
