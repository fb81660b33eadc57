//! Reading typed results back from the dicts their `as_dict()` gives (as saved files keep
//! them): `PoolStats.from_dict` and the classes inside it, which pickle that way too.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyString};

use crate::args;
use crate::errors::{error, ErrorClass};

/// `d` as a dict, or a `TypeError` naming the class it was to become.
pub(crate) fn dict_of<'py>(d: &Bound<'py, PyAny>, class: &str) -> PyResult<Bound<'py, PyDict>> {
    d.cast::<PyDict>().cloned().map_err(|_| {
        error(ErrorClass::ArgumentType, format!("{class}.from_dict takes a dict, got {}", args::type_name(d)))
    })
}

/// Field `key` of `d`, for a `class` (its type's zero when missing). A value the field cannot
/// hold is refused with the class and the field named: an int out of an int field's range as
/// `InvalidArgumentError`, a str that is no valid text likewise, any other value as
/// `ArgumentTypeError`.
pub(crate) fn field<'py, T>(d: &Bound<'py, PyDict>, class: &str, key: &str) -> PyResult<T>
where
    T: for<'a> FromPyObject<'a, 'py> + Default,
{
    let Some(v) = d.get_item(key)? else {
        return Ok(T::default());
    };
    v.extract::<T>().map_err(|_| {
        let py = v.py();
        let what = format!("{class}.from_dict: field {key:?}");
        let got = v.repr().map_or_else(|_| args::type_name(&v), |r| r.to_string());
        // What the field holds, told by what it takes.
        let takes = |sample: Bound<'py, PyAny>| sample.extract::<T>().is_ok();
        let (ints, floats) = match (0u8.into_pyobject(py), 0.5f64.into_pyobject(py)) {
            (Ok(int), Ok(float)) => (takes(int.into_any()), takes(float.into_any())),
            _ => (false, false),
        };
        let int = v.is_instance_of::<PyInt>() && !v.is_instance_of::<PyBool>();
        if ints && !floats && int {
            return error(ErrorClass::InvalidArgument, format!("{what} must be an int from 0 to 2^64 - 1, got {got}"));
        }
        if let Ok(text) = v.cast::<PyString>() {
            if let Err(err) = args::text(text, &what, ErrorClass::InvalidArgument) {
                return err;
            }
        }
        let kind = match (ints, floats) {
            (true, false) => "an int from 0 to 2^64 - 1",
            (true, true) => "a number",
            _ => "a str or None",
        };
        error(ErrorClass::ArgumentType, format!("{what} must be {kind}, got {} ({got})", args::type_name(&v)))
    })
}

/// List field `key` of `d`, for a `class`, each item parsed with `parse` (empty when missing).
pub(crate) fn list<'py, T>(
    d: &Bound<'py, PyDict>,
    class: &str,
    key: &str,
    parse: impl Fn(&Bound<'py, PyAny>) -> PyResult<T>,
) -> PyResult<Vec<T>> {
    let Some(v) = d.get_item(key)? else {
        return Ok(Vec::new());
    };
    let items = v.try_iter().map_err(|_| {
        error(
            ErrorClass::ArgumentType,
            format!("{class}.from_dict: field {key:?} must be a list of dicts, got {}", args::type_name(&v)),
        )
    })?;
    items.map(|item| parse(&item?)).collect()
}

/// What pickle and `copy` rebuild a class with `from_dict` from: `(cls.from_dict,
/// (as_dict(),))`, the round trip that saved files make.
pub(crate) fn reduce<'py>(
    obj: &Bound<'py, PyAny>,
    fields: Bound<'py, PyDict>,
) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyDict>,))> {
    Ok((obj.get_type().getattr("from_dict")?, (fields,)))
}
