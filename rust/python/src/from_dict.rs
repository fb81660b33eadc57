//! Reading typed results back from the dicts their `as_dict()` gives (as saved files keep
//! them): `PoolStats.from_dict` and the classes inside it.

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::args;
use crate::errors::{error, ErrorClass};

/// `d` as a dict, or a `TypeError` naming the class it was to become.
pub(crate) fn dict_of<'py>(d: &Bound<'py, PyAny>, class: &str) -> PyResult<Bound<'py, PyDict>> {
    d.cast::<PyDict>().cloned().map_err(|_| {
        error(ErrorClass::ArgumentType, format!("{class}.from_dict takes a dict, got {}", args::type_name(d)))
    })
}

/// Field `key` of `d` (its type's zero when missing).
pub(crate) fn field<'py, T>(d: &Bound<'py, PyDict>, key: &str) -> PyResult<T>
where
    T: for<'a> FromPyObject<'a, 'py> + Default,
{
    match d.get_item(key)? {
        Some(v) => v
            .extract::<T>()
            .map_err(|_| error(ErrorClass::ArgumentType, format!("{key} cannot be {}", args::type_name(&v)))),
        None => Ok(T::default()),
    }
}

/// List field `key` of `d`, each item parsed with `parse` (empty when missing).
pub(crate) fn list<'py, T>(
    d: &Bound<'py, PyDict>,
    key: &str,
    parse: impl Fn(&Bound<'py, PyAny>) -> PyResult<T>,
) -> PyResult<Vec<T>> {
    match d.get_item(key)? {
        Some(v) => v.try_iter()?.map(|item| parse(&item?)).collect(),
        None => Ok(Vec::new()),
    }
}
