//! `Block.as_array(dtype, shape)`: a NumPy array over a host block's bytes, without copying.
//! It is made through DLPack (`numpy.from_dlpack`), so the array holds the block's pin for as
//! long as it (or any view of it) lives.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyInt, PyTuple};

use crate::args;
use crate::errors::{error, ErrorClass};

/// The array of `dtype` (NumPy's `uint8` when None) and `shape` (as many items as fit when
/// None; an int or a sequence of ints) over `block`, whose bytes are `nbytes` long.
pub(crate) fn as_array<'py>(
    block: &Bound<'py, PyAny>,
    nbytes: usize,
    dtype: Option<&Bound<'py, PyAny>>,
    shape: Option<&Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let py = block.py();
    let numpy = py.import("numpy")?;
    let dtype = match dtype.filter(|d| !d.is_none()) {
        Some(d) => numpy.getattr("dtype")?.call1((d,)).map_err(|e| {
            error(
                ErrorClass::ArgumentType,
                format!("dtype must be a NumPy dtype, got {} ({})", args::type_name(d), e.value(py)),
            )
        })?,
        None => numpy.getattr("dtype")?.call1(("uint8",))?,
    };
    // Object arrays hold references, not bytes: no view of a block's bytes can be one.
    if dtype.getattr("hasobject")?.is_truthy()? {
        return Err(error(
            ErrorClass::InvalidArgument,
            format!("dtype {} holds Python objects, not bytes: a block's bytes cannot be viewed as it", dtype.str()?),
        ));
    }
    let itemsize: usize = dtype.getattr("itemsize")?.extract()?;
    // An unsized dtype ("V0", "S0") has no items to lay over bytes (NumPy makes no view of it).
    if itemsize == 0 {
        return Err(error(
            ErrorClass::InvalidArgument,
            format!("dtype {} has items of 0 bytes: no array of it can view a block's bytes", dtype.str()?),
        ));
    }
    let (count, shape, extent) = match shape.filter(|s| !s.is_none()) {
        None => {
            if nbytes % itemsize != 0 {
                return Err(error(
                    ErrorClass::InvalidArgument,
                    format!("the block's {nbytes} bytes are not a whole number of {} items", dtype.str()?),
                ));
            }
            let count = nbytes / itemsize;
            (Some(count), PyTuple::new(py, [count])?, Some(nbytes))
        }
        Some(shape) => {
            let dims: Vec<usize> = if shape.is_instance_of::<PyInt>() {
                vec![dimension(shape)?]
            } else {
                let items = shape.try_iter().map_err(|_| {
                    error(
                        ErrorClass::ArgumentType,
                        format!("shape must be an int or a sequence of ints, got {}", args::type_name(shape)),
                    )
                })?;
                items.map(|item| dimension(&item?)).collect::<PyResult<_>>()?
            };
            // None: the item count overflows (an empty dimension makes it 0 whatever the rest).
            let count =
                if dims.contains(&0) { Some(0) } else { dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)) };
            // What NumPy checks of every shape, an empty one too: the nonzero dimensions times
            // the item size, within its largest size (None beyond it).
            let extent = dims
                .iter()
                .filter(|&&d| d != 0)
                .try_fold(itemsize, |n, &d| n.checked_mul(d))
                .filter(|&n| n <= isize::MAX as usize);
            (count, PyTuple::new(py, dims)?, extent)
        }
    };
    let Some(needed) = count.and_then(|count| count.checked_mul(itemsize)) else {
        return Err(error(
            ErrorClass::InvalidArgument,
            format!(
                "the byte size of an array of shape {} of {} overflows 64 bits; the block has {nbytes} bytes",
                shape.repr()?,
                dtype.str()?
            ),
        ));
    };
    if needed > nbytes {
        return Err(error(
            ErrorClass::InvalidArgument,
            format!(
                "an array of shape {} of {} needs {needed} bytes; the block has {nbytes} bytes",
                shape.repr()?,
                dtype.str()?
            ),
        ));
    }
    if extent.is_none() {
        return Err(error(
            ErrorClass::InvalidArgument,
            format!(
                "NumPy makes no array of shape {} of {}: its nonzero dimensions times the item size are more \
                 than NumPy's largest size, {} bytes",
                shape.repr()?,
                dtype.str()?,
                isize::MAX
            ),
        ));
    }
    let bytes = numpy.getattr("from_dlpack")?.call1((block,))?;
    // `PySlice::new` leaks the ints it makes its slice of (pyo3 0.30): the slice type is called
    // instead.
    let first = py.get_type::<pyo3::types::PySlice>().call1((0usize, needed))?;
    let used = bytes.get_item(first)?;
    // Anything else NumPy refuses of the view (more dimensions than it has) is a bad argument.
    used.call_method1("view", (&dtype,))?.call_method1("reshape", (&shape,)).map_err(|err| {
        if err.is_instance_of::<PyValueError>(py) || err.is_instance_of::<PyTypeError>(py) {
            let shown = shape.repr().map_or_else(|_| "?".to_string(), |r| r.to_string());
            let dtype = dtype.str().map_or_else(|_| "?".to_string(), |r| r.to_string());
            error(
                ErrorClass::InvalidArgument,
                format!("NumPy makes no array of shape {shown} of {dtype} over the block's bytes: {}", err.value(py)),
            )
        } else {
            err
        }
    })
}

/// One dimension of a shape: an int from 0 to NumPy's largest dimension (`isize::MAX`).
fn dimension(value: &Bound<'_, PyAny>) -> PyResult<usize> {
    let n = args::int_value(value, "shape", ErrorClass::ArgumentType)?;
    match n {
        Ok(n) if n < 0 => Err(error(ErrorClass::InvalidArgument, format!("shape dimensions must be >= 0, got {n}"))),
        Err(text) if text.starts_with('-') => {
            Err(error(ErrorClass::InvalidArgument, format!("shape dimensions must be >= 0, got {text}")))
        }
        Ok(n) if n <= isize::MAX as i128 => Ok(n as usize),
        Ok(n) => Err(too_long(&n.to_string())),
        Err(text) => Err(too_long(&text)),
    }
}

/// The error for a dimension beyond NumPy's largest (`text`: its value).
fn too_long(text: &str) -> PyErr {
    error(
        ErrorClass::InvalidArgument,
        format!("shape dimensions must be at most {} (NumPy's largest), got {text}", isize::MAX),
    )
}
