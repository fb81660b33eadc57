//! `Block.as_array(dtype, shape)`: a NumPy array over a host block's bytes, without copying.
//! It is made through DLPack (`numpy.from_dlpack`), so the array holds the block's pin for as
//! long as it (or any view of it) lives.

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
    let (count, shape) = match shape.filter(|s| !s.is_none()) {
        None => {
            if itemsize == 0 || nbytes % itemsize != 0 {
                return Err(error(
                    ErrorClass::InvalidArgument,
                    format!("the block's {nbytes} bytes are not a whole number of {} items", dtype.str()?),
                ));
            }
            let count = nbytes / itemsize;
            (Some(count), PyTuple::new(py, [count])?)
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
            (count, PyTuple::new(py, dims)?)
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
    let bytes = numpy.getattr("from_dlpack")?.call1((block,))?;
    // `PySlice::new` leaks the ints it makes its slice of (pyo3 0.30): the slice type is called
    // instead.
    let first = py.get_type::<pyo3::types::PySlice>().call1((0usize, needed))?;
    let used = bytes.get_item(first)?;
    used.call_method1("view", (dtype,))?.call_method1("reshape", (shape,))
}

/// One dimension of a shape: an int >= 0.
fn dimension(value: &Bound<'_, PyAny>) -> PyResult<usize> {
    let n = args::integer(value, "shape", ErrorClass::ArgumentType)?;
    usize::try_from(n)
        .map_err(|_| error(ErrorClass::InvalidArgument, format!("shape dimensions must be >= 0, got {n}")))
}
