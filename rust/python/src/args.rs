//! Checking Python arguments before they reach npumem-core: every refusal is a typed error that
//! names the argument, what it got and what it needs.

use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyString};

use crate::errors::{error, Kind};

/// The type name of `value`, for messages.
pub(crate) fn type_name(value: &Bound<'_, PyAny>) -> String {
    value.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
}

/// An integer argument (a Python `int` or anything with `__index__`, but not a `bool`).
pub(crate) fn integer(value: &Bound<'_, PyAny>, name: &str, kind: Kind) -> PyResult<i128> {
    let refuse = || error(kind, format!("{name} must be an int, got {}", type_name(value)));
    if value.is_instance_of::<PyBool>() {
        return Err(refuse());
    }
    if value.is_instance_of::<PyInt>() {
        return value.extract::<i128>().map_err(|_| error(kind, format!("{name} is out of range")));
    }
    let index = value.call_method0("__index__").map_err(|_| refuse())?;
    index.extract::<i128>().map_err(|_| error(kind, format!("{name} is out of range")))
}

/// A size in bytes: an int > 0 (`capacity` is the pool's, for the "too large" message).
pub(crate) fn size(value: &Bound<'_, PyAny>, name: &str, capacity: usize) -> PyResult<usize> {
    size_named(value, || name.to_string(), capacity)
}

/// [`size`] with the argument's name made only if an error needs it (batches of thousands).
pub(crate) fn size_named(value: &Bound<'_, PyAny>, name: impl Fn() -> String, capacity: usize) -> PyResult<usize> {
    if let Ok(n) = value.extract::<usize>() {
        if n > 0 && n <= capacity && !value.is_instance_of::<PyBool>() {
            return Ok(n); // the common case: no name needed
        }
    }
    let name = name();
    let n = match integer(value, &name, Kind::ArgumentType) {
        Ok(n) => n,
        // An int beyond i128: a value problem, not a type problem.
        Err(_) if value.is_instance_of::<PyInt>() && !value.is_instance_of::<PyBool>() => {
            if value.lt(0)? {
                return Err(error(Kind::InvalidArgument, format!("{name} must be greater than 0, got {value}")));
            }
            return Err(error(
                Kind::RequestTooLarge,
                format!("{name} = {value} can never be allocated: the pool's capacity is {capacity} bytes"),
            ));
        }
        Err(err) => return Err(err),
    };
    if n <= 0 {
        return Err(error(Kind::InvalidArgument, format!("{name} must be greater than 0, got {n}")));
    }
    if n > capacity as i128 {
        return Err(error(
            Kind::RequestTooLarge,
            format!("{name} = {n} can never be allocated: the pool's capacity is {capacity} bytes"),
        ));
    }
    Ok(n as usize)
}

/// An optional alignment: a power of two, at most the capacity.
pub(crate) fn alignment(value: Option<&Bound<'_, PyAny>>, capacity: usize) -> PyResult<Option<usize>> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    let a = integer(value, "align", Kind::ArgumentType)?;
    if a <= 0 || (a & (a - 1)) != 0 {
        return Err(error(Kind::InvalidArgument, format!("align must be a power of two, got {a}")));
    }
    if a > capacity as i128 {
        return Err(error(Kind::InvalidArgument, format!("align = {a} is larger than the arena ({capacity} bytes)")));
    }
    Ok(Some(a as usize))
}

/// An optional tag: `None` or a `str`.
pub(crate) fn tag<'py>(value: Option<&Bound<'py, PyAny>>) -> PyResult<Option<Bound<'py, PyString>>> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    value
        .cast::<PyString>()
        .map(|s| Some(s.clone()))
        .map_err(|_| error(Kind::ArgumentType, format!("tag must be a str or None, got {}", type_name(value))))
}

/// A configuration integer (a `ConfigError` names the field).
pub(crate) fn config_int(value: &Bound<'_, PyAny>, field: &str) -> PyResult<usize> {
    let n = integer(value, field, Kind::Config)?;
    if n < 0 {
        return Err(error(Kind::Config, format!("invalid pool configuration: {field} must not be negative, got {n}")));
    }
    usize::try_from(n)
        .map_err(|_| error(Kind::Config, format!("invalid pool configuration: {field} is too large ({n})")))
}
