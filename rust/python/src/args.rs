//! Checking Python arguments before they reach npumem-core: every refusal is a typed error that
//! names the argument, what it got and what it needs.

use npumem_core::{CompactionMode, MAX_TRACE_CAPACITY};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyString};

use crate::byte_text;
use crate::errors::{error, ErrorClass};
use crate::user_code;

/// The type name of `value`, for messages.
pub(crate) fn type_name(value: &Bound<'_, PyAny>) -> String {
    // Not `to_string()`: that goes through `str()`, which runs pending signal handlers.
    value.get_type().name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|_| "?".into())
}

/// The class of a refusal for a value out of range, where `class` is the one for a wrong type
/// (a configuration keeps its `ConfigError`).
fn range_class(class: ErrorClass) -> ErrorClass {
    match class {
        ErrorClass::ArgumentType => ErrorClass::InvalidArgument,
        other => other,
    }
}

/// The value of an integer argument (a Python `int` or anything with `__index__`, but not a
/// `bool`): `Ok(n)`, or `Err(its decimal text)` for an int beyond 128 bits. `class` is the
/// error class of a value that is no int.
pub(crate) fn int_value(value: &Bound<'_, PyAny>, name: &str, class: ErrorClass) -> PyResult<Result<i128, String>> {
    let refuse = || error(class, format!("{name} must be an int, got {}", type_name(value)));
    if value.is_instance_of::<PyBool>() {
        return Err(refuse());
    }
    let int = if value.is_instance_of::<PyInt>() {
        value.clone()
    } else {
        if !value.hasattr("__index__")? {
            return Err(refuse());
        }
        // An exception from `__index__` itself (a KeyboardInterrupt, a bug in it) is the caller's.
        let index = user_code::call(&value.getattr("__index__")?, ())?;
        if !index.is_instance_of::<PyInt>() {
            return Err(error(
                class,
                format!(
                    "{name} must be an int, got {} whose __index__() returned {}, not an int",
                    type_name(value),
                    type_name(&index)
                ),
            ));
        }
        index
    };
    // `str()` runs pending signal handlers: their exception (Ctrl-C) is raised, not printed.
    match int.extract::<i128>() {
        Ok(n) => Ok(Ok(n)),
        Err(_) => Ok(Err(int.str()?.to_string_lossy().into_owned())),
    }
}

/// An integer argument (a Python `int` or anything with `__index__`, but not a `bool`), within
/// 128 bits; `class` is the error class of a value that is no int (one out of range raises
/// `InvalidArgumentError`, or the `ConfigError` of a configuration).
pub(crate) fn integer(value: &Bound<'_, PyAny>, name: &str, class: ErrorClass) -> PyResult<i128> {
    int_value(value, name, class)?.map_err(|text| error(range_class(class), format!("{name} = {text} is out of range")))
}

/// A count or a figure in bytes `name`: an int from 0 to the largest `usize`
/// (`ArgumentTypeError` for another type, `InvalidArgumentError` out of range).
pub(crate) fn count(value: &Bound<'_, PyAny>, name: &str) -> PyResult<usize> {
    let n = integer(value, name, ErrorClass::ArgumentType)?;
    usize::try_from(n).map_err(|_| {
        error(ErrorClass::InvalidArgument, format!("{name} must be an int from 0 to {}, got {n}", usize::MAX))
    })
}

/// A duration `name` in seconds: an int or a float, finite and >= 0 (`ArgumentTypeError` for
/// another type, `InvalidArgumentError` for NaN, an infinity or a negative value).
pub(crate) fn seconds(value: &Bound<'_, PyAny>, name: &str) -> PyResult<f64> {
    let wrong_type =
        || error(ErrorClass::ArgumentType, format!("{name} must be a number of seconds, got {}", type_name(value)));
    if value.is_instance_of::<PyBool>() {
        return Err(wrong_type());
    }
    let s: f64 = value.extract().map_err(|_| wrong_type())?;
    if !(s.is_finite() && s >= 0.0) {
        return Err(error(
            ErrorClass::InvalidArgument,
            format!("{name} must be a finite number of seconds >= 0, got {}", value.repr()?),
        ));
    }
    Ok(s)
}

/// A `str` argument `name` that must be one of `choices` (`ArgumentTypeError` for another
/// type, `InvalidArgumentError` for another value).
pub(crate) fn one_of(value: &Bound<'_, PyAny>, name: &str, choices: &[&str]) -> PyResult<String> {
    let listed = || choices.iter().map(|c| format!("{c:?}")).collect::<Vec<_>>().join(", ");
    let text = value.cast::<PyString>().map_err(|_| {
        error(ErrorClass::ArgumentType, format!("{name} must be a str ({}), got {}", listed(), type_name(value)))
    })?;
    let text = self::text(text, name, ErrorClass::InvalidArgument)?;
    if !choices.contains(&text) {
        return Err(error(ErrorClass::InvalidArgument, format!("{name} must be one of {}, got {text:?}", listed())));
    }
    Ok(text.to_string())
}

/// The largest block a pool can ever hand out, and why (for the "too large" message).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Largest {
    /// The largest request ([`npumem_core::Pool::largest_request`]).
    pub(crate) bytes: usize,
    /// The pool's `max_capacity` (its capacity when it cannot grow).
    pub(crate) capacity: usize,
    /// The bytes of the first region of a pool that grows; `None` for one that cannot.
    pub(crate) first_region: Option<usize>,
}

impl Largest {
    pub(crate) fn of(pool: &npumem_core::Pool) -> Largest {
        let config = pool.config();
        Largest {
            bytes: pool.largest_request(),
            capacity: pool.max_capacity(),
            first_region: config.grows().then_some(config.capacity),
        }
    }
}

/// A size in bytes: an int > 0, at most `largest.bytes`.
#[inline]
pub(crate) fn size(value: &Bound<'_, PyAny>, name: &str, largest: Largest) -> PyResult<usize> {
    size_named(value, || name.to_string(), largest)
}

/// [`size`] with the argument's name made only if an error needs it (batches of thousands).
#[inline]
pub(crate) fn size_named(value: &Bound<'_, PyAny>, name: impl Fn() -> String, largest: Largest) -> PyResult<usize> {
    if let Some(n) = exact_int_size(value) {
        if n > 0 && n <= largest.bytes {
            return Ok(n); // the common case: no name needed
        }
    }
    size_checked(value, &name(), largest)
}

/// The value of an exact `int` (not a subclass such as `bool`) that fits a `usize`, read
/// without a conversion protocol; None for anything else.
#[inline(always)]
fn exact_int_size(value: &Bound<'_, PyAny>) -> Option<usize> {
    if !value.is_exact_instance_of::<PyInt>() {
        return None;
    }
    // SAFETY: `value` is a live `int` object and the GIL is held (`Bound`).
    let n = unsafe { ffi::PyLong_AsSize_t(value.as_ptr()) };
    if n == usize::MAX {
        // SAFETY: the GIL is held; the error is the conversion's overflow (a negative or too
        // large int), which the slow path reports with the argument's name.
        let failed = unsafe { !ffi::PyErr_Occurred().is_null() };
        if failed {
            // SAFETY: as above.
            unsafe { ffi::PyErr_Clear() };
            return None;
        }
    }
    Some(n)
}

/// [`size_named`] past its fast path: every other value, and every refusal.
#[cold]
fn size_checked(value: &Bound<'_, PyAny>, name: &str, largest: Largest) -> PyResult<usize> {
    // An int is read here; anything else through its `__index__` in `int_value`, the one place
    // that calls it.
    if value.is_instance_of::<PyInt>() {
        if let Ok(n) = value.extract::<usize>() {
            if n > 0 && n <= largest.bytes && !value.is_instance_of::<PyBool>() {
                return Ok(n);
            }
        }
    }
    let n = match int_value(value, name, ErrorClass::ArgumentType)? {
        Ok(n) => n,
        // An int beyond i128: a value problem, not a type problem.
        Err(text) if text.starts_with('-') => {
            return Err(error(ErrorClass::InvalidArgument, format!("{name} must be greater than 0, got {text}")));
        }
        Err(text) => return Err(too_large(name, &text, None, largest)),
    };
    if n <= 0 {
        return Err(error(ErrorClass::InvalidArgument, format!("{name} must be greater than 0, got {n}")));
    }
    if n > largest.bytes as i128 {
        let size = usize::try_from(n).ok();
        let asked = size.map_or_else(|| n.to_string(), byte_text::exact);
        return Err(too_large(name, &asked, size, largest));
    }
    Ok(n as usize)
}

/// The `RequestTooLargeError` of a request of `size` bytes (`None`: more than a `usize`
/// holds) larger than any block the pool can hold, and why.
fn too_large(name: &str, asked: &str, size: Option<usize>, largest: Largest) -> PyErr {
    let capacity = byte_text::exact(largest.capacity);
    let most = byte_text::exact(largest.bytes);
    let why = match largest.first_region {
        _ if size.is_none_or(|n| n > largest.capacity) => format!("the pool's whole capacity is {capacity}"),
        Some(first) => format!(
            "no block of this pool can be larger than {most}. A block lies inside one region; the first \
             region, of {}, is never given back, and regions lie at least one chunk apart, so a region added \
             later holds at most max_capacity, {capacity}, less the first region, in whole chunks",
            byte_text::exact(first)
        ),
        None => format!(
            "of the pool's {capacity}, blocks can use {} bytes (the rest is shorter than the smallest block)",
            largest.bytes
        ),
    };
    error(ErrorClass::RequestTooLarge, format!("{name} = {asked} can never be allocated: {why}"))
}

/// An optional alignment: a power of two, at most the capacity.
pub(crate) fn alignment(value: Option<&Bound<'_, PyAny>>, capacity: usize) -> PyResult<Option<usize>> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    let a = int_value(value, "align", ErrorClass::ArgumentType)?.map_err(|text| match text.starts_with('-') {
        true => error(ErrorClass::InvalidArgument, format!("align must be a power of two, got {text}")),
        false => {
            error(ErrorClass::InvalidArgument, format!("align = {text} is larger than the arena ({capacity} bytes)"))
        }
    })?;
    if a <= 0 || (a & (a - 1)) != 0 {
        return Err(error(ErrorClass::InvalidArgument, format!("align must be a power of two, got {a}")));
    }
    if a > capacity as i128 {
        return Err(error(
            ErrorClass::InvalidArgument,
            format!("align = {a} is larger than the arena ({capacity} bytes)"),
        ));
    }
    Ok(Some(a as usize))
}

/// An optional tag: `None` or a non-empty `str` of valid text, of at most `MAX_TAG_BYTES` bytes
/// of UTF-8, that is not the pooled tags' row.
pub(crate) fn tag<'py>(value: Option<&Bound<'py, PyAny>>) -> PyResult<Option<Bound<'py, PyString>>> {
    let Some(value) = value.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    let tag = value
        .cast::<PyString>()
        .map_err(|_| error(ErrorClass::ArgumentType, format!("tag must be a str or None, got {}", type_name(value))))?;
    let name = text(tag, "tag", ErrorClass::InvalidArgument)?;
    if name.is_empty() {
        // Untagged blocks are reported with an empty tag (Prometheus labels, JSON rows).
        return Err(error(
            ErrorClass::InvalidArgument,
            "tag must not be empty: an empty tag reads as no tag".to_string(),
        ));
    }
    if name.len() > npumem_core::MAX_TAG_BYTES {
        // Written with every trace event that names it, and kept while idle (`stats/tags.rs`).
        return Err(error(
            ErrorClass::InvalidArgument,
            format!(
                "tag is {} bytes long in UTF-8; a tag is at most {} bytes (npumem.MAX_TAG_BYTES)",
                name.len(),
                npumem_core::MAX_TAG_BYTES
            ),
        ));
    }
    if name == npumem_core::OTHER_TAGS {
        return Err(error(
            ErrorClass::InvalidArgument,
            format!(
                "tag {:?} names the row of the pooled tags (stats().by_tag); choose another name",
                npumem_core::OTHER_TAGS
            ),
        ));
    }
    Ok(Some(tag.clone()))
}

/// The text of a string argument `name`: a `str` that UTF-8 can encode, so none with a lone
/// surrogate (such as `"\ud800"`, which the core's strings, files and metrics cannot hold);
/// `class` is the error class of one that has.
pub(crate) fn text<'a>(value: &'a Bound<'_, PyString>, name: &str, class: ErrorClass) -> PyResult<&'a str> {
    value.to_str().map_err(|err| {
        let py = value.py();
        let at = err.value(py).getattr("start").and_then(|s| s.extract::<usize>()).ok();
        let which = at
            .and_then(|i| value.get_item(i).ok())
            .and_then(|c| c.repr().ok())
            .map_or_else(String::new, |c| format!(" ({c} at index {})", at.unwrap_or(0)));
        error(
            class,
            format!("{name} is not valid text: it contains a lone surrogate{which}, which UTF-8 cannot encode"),
        )
    })
}

/// A configuration integer (a `ConfigError` names the field).
pub(crate) fn config_int(value: &Bound<'_, PyAny>, field: &str) -> PyResult<usize> {
    let n = integer(value, field, ErrorClass::Config)?;
    if n < 0 {
        return Err(error(
            ErrorClass::Config,
            format!("invalid pool configuration: {field} must not be negative, got {n}"),
        ));
    }
    usize::try_from(n)
        .map_err(|_| error(ErrorClass::Config, format!("invalid pool configuration: {field} is too large ({n})")))
}

/// How long `Pool.pause()` waits by default (seconds).
const DEFAULT_PAUSE_TIMEOUT: f64 = 10.0;

/// A pause timeout in seconds: a number >= 0 (at most an hour is used), or the default.
pub(crate) fn timeout(value: Option<&Bound<'_, PyAny>>) -> PyResult<f64> {
    let Some(t) = value.filter(|t| !t.is_none()) else {
        return Ok(DEFAULT_PAUSE_TIMEOUT);
    };
    if t.is_instance_of::<PyBool>() {
        return Err(error(ErrorClass::ArgumentType, "timeout must be a number of seconds, got bool"));
    }
    let s: f64 = t.extract().map_err(|_| {
        error(ErrorClass::ArgumentType, format!("timeout must be a number of seconds, got {}", type_name(t)))
    })?;
    if s.is_infinite() && s > 0.0 {
        return Err(error(
            ErrorClass::InvalidArgument,
            "timeout must be a finite number of seconds >= 0 (a pause waits at most an hour), got inf",
        ));
    }
    if !(s.is_finite() && s >= 0.0) {
        return Err(error(ErrorClass::InvalidArgument, format!("timeout must be a number of seconds >= 0, got {s}")));
    }
    Ok(s.min(3600.0))
}

/// Events a trace holds when `trace_start` is given no capacity.
const DEFAULT_TRACE_CAPACITY: i128 = 65536;

/// A trace capacity: between 1 and `MAX_TRACE_CAPACITY` events, or the default.
pub(crate) fn trace_capacity(value: Option<&Bound<'_, PyAny>>) -> PyResult<usize> {
    let refuse = |got: &str| {
        error(
            ErrorClass::InvalidArgument,
            format!("capacity must be between 1 and {MAX_TRACE_CAPACITY} events, got {got}"),
        )
    };
    let n = match value.filter(|c| !c.is_none()) {
        Some(c) => int_value(c, "capacity", ErrorClass::ArgumentType)?.map_err(|text| refuse(&text))?,
        None => DEFAULT_TRACE_CAPACITY,
    };
    if n < 1 || n > MAX_TRACE_CAPACITY as i128 {
        return Err(refuse(&n.to_string()));
    }
    Ok(n as usize)
}

/// A yes/no option: `True`, `False` or None (no).
pub(crate) fn flag(value: Option<&Bound<'_, PyAny>>, name: &str) -> PyResult<bool> {
    match value {
        None => Ok(false),
        Some(v) if v.is_none() => Ok(false),
        Some(v) => v.cast::<PyBool>().map(|b| b.is_true()).map_err(|_| {
            error(ErrorClass::ArgumentType, format!("{name} must be True or False, got {}", type_name(v)))
        }),
    }
}

/// An optional callable (`what` names it in the error).
pub(crate) fn callable(value: Option<&Bound<'_, PyAny>>, what: &str) -> PyResult<Option<Py<PyAny>>> {
    match value.filter(|m| !m.is_none()) {
        Some(m) if m.is_callable() => Ok(Some(m.clone().unbind())),
        Some(m) => Err(error(ErrorClass::ArgumentType, format!("{what} must be callable, got {}", type_name(m)))),
        None => Ok(None),
    }
}

/// The mode of a compaction: `"full"`, `"incremental"` (with `max_bytes`) or `"evacuate"`
/// (with `chunks`).
/// The name of a compaction mode: a `str` (which mode is checked by [`compaction_mode`]),
/// `"full"` when not given.
pub(crate) fn mode_name(mode: Option<&Bound<'_, PyAny>>) -> PyResult<String> {
    let Some(mode) = mode.filter(|m| !m.is_none()) else {
        return Ok("full".into());
    };
    let mode = mode.cast::<PyString>().map_err(|_| {
        error(
            ErrorClass::ArgumentType,
            format!("mode must be a str (\"full\", \"incremental\" or \"evacuate\"), got {}", type_name(mode)),
        )
    })?;
    // Not `to_string()`: that goes through `str()`, which runs pending signal handlers and
    // would print their exception as unraisable and answer a placeholder.
    Ok(mode.to_str()?.to_owned())
}

pub(crate) fn compaction_mode(
    mode: &str,
    max_bytes: Option<&Bound<'_, PyAny>>,
    chunks: Option<&Bound<'_, PyAny>>,
) -> PyResult<CompactionMode> {
    // An argument of another mode would be ignored: refused, so that a call never does other
    // than it says (`chunks=` with the default mode "full" compacts everything).
    let given = |arg: Option<&Bound<'_, PyAny>>| arg.is_some_and(|a| !a.is_none());
    for (name, arg, its_mode) in [("max_bytes", max_bytes, "incremental"), ("chunks", chunks, "evacuate")] {
        if given(arg) && mode != its_mode {
            return Err(error(
                ErrorClass::InvalidArgument,
                format!("{name} applies to mode=\"{its_mode}\" only; this call's mode is {mode:?}"),
            ));
        }
    }
    match mode {
        "full" => Ok(CompactionMode::Full),
        "incremental" => {
            let n = match max_bytes.filter(|m| !m.is_none()) {
                Some(m) => integer(m, "max_bytes", ErrorClass::ArgumentType)?,
                None => return Err(error(ErrorClass::InvalidArgument, "mode=\"incremental\" needs max_bytes")),
            };
            if n <= 0 {
                return Err(error(ErrorClass::InvalidArgument, format!("max_bytes must be greater than 0, got {n}")));
            }
            Ok(CompactionMode::Incremental { max_bytes: usize::try_from(n).unwrap_or(usize::MAX) })
        }
        "evacuate" => {
            let Some(list) = chunks.filter(|c| !c.is_none()) else {
                return Err(error(ErrorClass::InvalidArgument, "mode=\"evacuate\" needs chunks"));
            };
            let items = list.try_iter().map_err(|_| {
                error(ErrorClass::ArgumentType, format!("chunks must be an iterable of ints, got {}", type_name(list)))
            })?;
            let mut out = Vec::new();
            for (i, item) in user_code::each(items).enumerate() {
                let c = integer(&item?, &format!("chunks[{i}]"), ErrorClass::ArgumentType)?;
                out.push(usize::try_from(c).map_err(|_| {
                    error(ErrorClass::InvalidArgument, format!("chunks[{i}] must be a chunk index >= 0, got {c}"))
                })?);
            }
            Ok(CompactionMode::Evacuate { chunks: out })
        }
        other => Err(error(
            ErrorClass::InvalidArgument,
            format!("mode must be \"full\", \"incremental\" or \"evacuate\", got {other:?}"),
        )),
    }
}

/// Push `item` onto a batch's list, which grows with what the caller passed: when the host has
/// no memory for it, the typed out-of-memory error naming `what` (a `Vec` that cannot grow
/// aborts the process).
pub(crate) fn push_fallibly<T>(list: &mut Vec<T>, item: T, what: &'static str) -> PyResult<()> {
    if list.try_reserve(1).is_err() {
        let bytes = (list.len() + 1).saturating_mul(std::mem::size_of::<T>());
        return Err(crate::errors::to_py(npumem_core::Error::HostMemory { what, bytes }));
    }
    list.push(item);
    Ok(())
}
