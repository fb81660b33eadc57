//! The exception classes of npumem and the one place where errors become them.
//!
//! The classes are made once, when `npumem._core` is imported, by calling the built-in `type`
//! with a tuple of bases: so `OutOfMemoryError` is both an `NpumemError` and a `MemoryError`,
//! and `except MemoryError` around an allocation keeps working. `npumem.errors` re-exports them
//! (`npumem.errors.X is npumem._core.X`).

use crate::byte_text;
use crate::user_code;
use npumem_core::{Error, HandleFault, Shortfall};
use pyo3::exceptions::{
    PyBaseException, PyBufferError, PyException, PyMemoryError, PyRuntimeError, PyTimeoutError, PyTypeError,
    PyValueError,
};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};
use pyo3::PyTypeInfo;
use pyo3::{ffi, intern};

/// The exception classes, in the order [`create`] makes them (bases before subclasses).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum ErrorClass {
    Npumem,
    OutOfMemory,
    InvalidArgument,
    ArgumentType,
    RequestTooLarge,
    InvalidHandle,
    DoubleFree,
    PinnedBlock,
    NoBacking,
    Export,
    PoolBusy,
    Config,
    Corruption,
    Move,
}

/// Every class, in creation order.
const ALL: [ErrorClass; 14] = [
    ErrorClass::Npumem,
    ErrorClass::OutOfMemory,
    ErrorClass::InvalidArgument,
    ErrorClass::ArgumentType,
    ErrorClass::RequestTooLarge,
    ErrorClass::InvalidHandle,
    ErrorClass::DoubleFree,
    ErrorClass::PinnedBlock,
    ErrorClass::NoBacking,
    ErrorClass::Export,
    ErrorClass::PoolBusy,
    ErrorClass::Config,
    ErrorClass::Corruption,
    ErrorClass::Move,
];

/// A base of an exception class: one of ours, or a built-in exception.
enum Base {
    Ours(ErrorClass),
    Builtin(fn(Python<'_>) -> Bound<'_, PyType>),
}

fn builtin<T: PyTypeInfo>(py: Python<'_>) -> Bound<'_, PyType> {
    T::type_object(py)
}

impl ErrorClass {
    /// The class's name, its bases and its docstring.
    fn spec(self) -> (&'static str, &'static [Base], &'static str) {
        use ErrorClass::*;
        match self {
            Npumem => {
                ("NpumemError", &[Base::Builtin(builtin::<PyException>)], "Base class of every error npumem raises.")
            }
            OutOfMemory => (
                "OutOfMemoryError",
                &[Base::Ours(Npumem), Base::Builtin(builtin::<PyMemoryError>)],
                "No block of the requested size could be found, although the request itself is valid.\n\n\
                 The message gives the bytes asked, the bytes free and the largest free block that the\n\
                 failed allocation found: a request of that size succeeds while nothing else changes the\n\
                 pool (at most the exact `pool.stats().largest_free_block`, which reads the whole pool). The numbers are also attributes: `requested`, `bytes_free`,\n\
                 `largest_free_block` (`None` when the error was not raised by a pool).",
            ),
            InvalidArgument => (
                "InvalidArgumentError",
                &[Base::Ours(Npumem), Base::Builtin(builtin::<PyValueError>)],
                "An argument has a value the call cannot accept (a zero size, an alignment that is not a\n\
                 power of two, ...). The pool is left exactly as it was.",
            ),
            ArgumentType => (
                "ArgumentTypeError",
                &[Base::Ours(InvalidArgument), Base::Builtin(builtin::<PyTypeError>)],
                "An argument has the wrong type (a float where an int is needed, ...).",
            ),
            RequestTooLarge => (
                "RequestTooLargeError",
                &[Base::Ours(InvalidArgument), Base::Ours(OutOfMemory)],
                "The request can never succeed: it is larger than the whole arena (or than the part of\n\
                 it that blocks can use, when the arena ends in a part shorter than its smallest block,\n\
                 or, in a pool that grows, than the largest region it can ever have). Its attributes\n\
                 are those of `OutOfMemoryError`: `requested`, `bytes_free`, `largest_free_block`.\n\n\
                 It is both misuse (`ValueError`) and a request for more memory than there is\n\
                 (`MemoryError`), so either `except` clause catches it.",
            ),
            InvalidHandle => (
                "InvalidHandleError",
                &[Base::Ours(Npumem), Base::Builtin(builtin::<PyValueError>)],
                "A block handle that is freed, stale, or belongs to another pool.",
            ),
            DoubleFree => ("DoubleFreeError", &[Base::Ours(InvalidHandle)], "A block was freed twice."),
            PinnedBlock => (
                "PinnedBlockError",
                &[Base::Ours(Npumem), Base::Builtin(builtin::<PyRuntimeError>)],
                "The block is pinned (explicitly, or by a live buffer view) and cannot be freed or moved.",
            ),
            NoBacking => (
                "NoBackingError",
                &[Base::Ours(Npumem), Base::Builtin(builtin::<PyBufferError>)],
                "The pool has no host memory behind it (`backing=\"none\"`): its bytes live on the\n\
                 device, so there is no buffer to view. Without a `base_address` either, its blocks\n\
                 have no addresses, and DLPack exports nothing of them.",
            ),
            Export => (
                "ExportError",
                &[Base::Ours(Npumem), Base::Builtin(builtin::<PyBufferError>)],
                "A DLPack export (`__dlpack__`) asked for what npumem does not do: a copy\n\
                 (`copy=True`), or another device than the block's (`dl_device`). npumem exports a\n\
                 block in place, on its pool's device. A `BufferError` too, as the array API asks.",
            ),
            PoolBusy => (
                "PoolBusyError",
                &[Base::Ours(Npumem), Base::Builtin(builtin::<PyTimeoutError>)],
                "The pool could not be paused in time (an in-flight call or another pause did not\n\
                 finish), or a call was made where it would wait for itself: from inside a compaction's\n\
                 mover, or a second pause of the thread that holds one. In a child process, also every\n\
                 call to a pool that another thread of the parent was inside (or pausing) at the fork.",
            ),
            Config => (
                "ConfigError",
                &[Base::Ours(Npumem), Base::Builtin(builtin::<PyValueError>)],
                "An invalid pool configuration. The message names the field and the rule it broke.",
            ),
            Corruption => (
                "CorruptionError",
                &[Base::Ours(Npumem)],
                "The pool's metadata is inconsistent (raised by `Pool.check()`, with the details), or a \
                 compaction's mover failed and so did its copies back: the metadata was undone, but blocks may \
                 have lost bytes on the device (its `__cause__` is the mover's exception).",
            ),
            Move => (
                "MoveError",
                &[Base::Ours(Npumem), Base::Builtin(builtin::<PyValueError>)],
                "A batch of block moves (compaction) was refused or undone: a destination outside the\n\
                 arena, misaligned, not free or overlapping another one, moves that overwrite each other\n\
                 in a cycle with no free space to bounce through, a pause that no longer holds the pool.\n\
                 Nothing moved: the pool and every block are as they were.",
            ),
        }
    }

    /// The class object (made on first use).
    pub(crate) fn class(self, py: Python<'_>) -> PyResult<&Bound<'_, PyType>> {
        Ok(classes(py)?[self as usize].bind(py))
    }
}

/// The module the classes say they belong to: the public one that re-exports them, as
/// tracebacks and pickles name them.
const PUBLIC_MODULE: &str = "npumem.errors";

static CLASSES: PyOnceLock<Vec<Py<PyType>>> = PyOnceLock::new();

fn classes(py: Python<'_>) -> PyResult<&Vec<Py<PyType>>> {
    CLASSES.get_or_try_init(py, || create(py))
}

/// Make every class, bases first.
fn create(py: Python<'_>) -> PyResult<Vec<Py<PyType>>> {
    let mut made: Vec<Py<PyType>> = Vec::with_capacity(ALL.len());
    for class in ALL {
        debug_assert_eq!(made.len(), class as usize);
        let (name, bases, doc) = class.spec();
        let bases = bases
            .iter()
            .map(|base| match base {
                Base::Ours(ours) => made[*ours as usize].bind(py).clone(),
                Base::Builtin(of) => of(py),
            })
            .collect::<Vec<_>>();
        let namespace = PyDict::new(py);
        namespace.set_item("__doc__", doc)?;
        namespace.set_item("__module__", PUBLIC_MODULE)?;
        if class == ErrorClass::OutOfMemory {
            // A method made of a Rust function: `partialmethod` binds it like a Python one.
            let init = wrap_pyfunction!(out_of_memory_init, py)?;
            namespace.set_item("__init__", py.import("functools")?.getattr("partialmethod")?.call1((init,))?)?;
        }
        let made_class = PyType::type_object(py).call1((name, PyTuple::new(py, bases)?, namespace))?;
        made.push(made_class.cast_into::<PyType>()?.unbind());
    }
    Ok(made)
}

/// `OutOfMemoryError.__init__`: the message, and the figures as attributes.
#[pyfunction]
#[pyo3(
    signature = (this, message, requested = None, bytes_free = None, largest_free_block = None),
    text_signature = "(self, message, requested=None, bytes_free=None, largest_free_block=None)"
)]
fn out_of_memory_init(
    this: &Bound<'_, PyAny>,
    message: &Bound<'_, PyAny>,
    requested: Option<&Bound<'_, PyAny>>,
    bytes_free: Option<&Bound<'_, PyAny>>,
    largest_free_block: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    PyBaseException::type_object(this.py()).getattr("__init__")?.call1((this, message))?;
    this.setattr("requested", requested)?;
    this.setattr("bytes_free", bytes_free)?;
    this.setattr("largest_free_block", largest_free_block)?;
    Ok(())
}

/// Add every exception class to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    for class in ALL {
        m.add(class.spec().0, class.class(m.py())?)?;
    }
    Ok(())
}

/// A Python exception of `class` with `message`.
pub(crate) fn error(class: ErrorClass, message: impl Into<String>) -> PyErr {
    let message = message.into();
    user_code::attach(|py| match class.class(py).and_then(|cls| user_code::call(cls, (message,))) {
        Ok(instance) => PyErr::from_value(instance),
        Err(failed) => failed,
    })
}

/// `err`, the failure of a call, with the exception that a user callback run by that call
/// raised as its `__cause__`; or that exception itself when it is no `Exception` (a
/// `KeyboardInterrupt`, a `SystemExit`) or a `CorruptionError` (a compaction the callback ran
/// that lost bytes: never hidden behind another error): those go through as they are.
pub(crate) fn caused_by(py: Python<'_>, err: PyErr, raised: PyErr) -> PyErr {
    if !raised.is_instance_of::<PyException>(py) || is_corruption(py, &raised) {
        return raised;
    }
    err.set_cause(py, Some(raised));
    err
}

/// Whether `raised` is a `CorruptionError`.
fn is_corruption(py: Python<'_>, raised: &PyErr) -> bool {
    ErrorClass::Corruption.class(py).is_ok_and(|class| raised.is_instance(py, class))
}

/// A planner search input the core refused (`InvalidArgumentError`).
pub(crate) fn plan_search(err: npumem_core::plan_search::PackingError) -> PyErr {
    error(ErrorClass::InvalidArgument, err.0)
}

/// The message of an `OutOfMemoryError`, in human units: what was asked, what is free, and
/// whether the total or the fragmentation is the cause (then a compaction can help), or, when
/// the largest free block found is at least the request, that the free place holds only some
/// sizes up to its own; in a pool that grows, whether its regions or the place for a new one
/// were too small.
pub(crate) fn out_of_memory_message(
    requested: usize,
    free: usize,
    largest: usize,
    largest_region: Option<usize>,
    unplaced_growth: Option<usize>,
) -> String {
    let asked = byte_text::exact(requested);
    let free_text = byte_text::exact(free);
    let largest_text = byte_text::exact(largest);
    if let Some(left) = unplaced_growth {
        // The limit had room for a region, the offset space no place for it.
        let left_text = byte_text::exact(left);
        format!(
            "out of memory: asked for {asked}; {free_text} are free and the largest free block found is \
             {largest_text}. The pool may still grow by {left_text} under its max_capacity, but its offset \
             space has no place for a region of this size: the regions that hold live blocks split it. Free \
             the blocks of such a region (the pool gives back a region left free when it needs the room), \
             or give the pool a larger max_capacity"
        )
    } else if let Some(region) = largest_region.filter(|&region| requested > region && requested <= free) {
        // Free enough, but in regions that are each too small: no compaction joins them.
        let region_text = byte_text::exact(region);
        format!(
            "out of memory: asked for {asked}; {free_text} are free, but the pool's regions (one per \
             growth, no block spans two) are smaller: the largest holds {region_text}, and the largest \
             free block found is {largest_text}. No compaction makes room: free the blocks of a region, \
             so that the pool gives it back and grows one large enough, or give the pool a larger \
             capacity or max_capacity"
        )
    } else if requested <= largest {
        // The place found holds its own size, not every smaller one (`docs/design.md`, "Stats;
        // counters"): say so, instead of blaming the fragmentation.
        format!(
            "out of memory: asked for {asked}; {free_text} are free and the largest free block found is \
             {largest_text}, but no free place holds a block of this size as the allocator lays it out (a \
             place across the end of a chunk holds only the sizes that cross it). A request of {largest_text} \
             succeeds there; a compaction may join the free memory (npumem.compaction.Compactor(pool).compact(), \
             or attach() one to compact on failure)"
        )
    } else if requested <= free {
        format!(
            "out of memory: asked for {asked}; {free_text} are free, but the largest free block found is \
             {largest_text}: the free memory is fragmented. A compaction may join it \
             (npumem.compaction.Compactor(pool).compact(), or attach() one to compact on failure)"
        )
    } else {
        format!(
            "out of memory: asked for {asked}, more than the {free_text} free; the largest free \
             block found is {largest_text}. Free other blocks, or make the pool larger"
        )
    }
}

/// The message of the `OutOfMemoryError` of item `index` of a batch that did not fit as a
/// whole: its item's figures, then the batch's (no compaction can make room that is not there).
fn batch_shortfall_message(
    index: usize,
    requested: usize,
    free: usize,
    largest: usize,
    shortfall: Shortfall,
) -> String {
    let asked = byte_text::exact(requested);
    let free_text = byte_text::exact(free);
    let largest_text = byte_text::exact(largest);
    let total = byte_text::exact(shortfall.asked);
    let room = byte_text::exact(shortfall.free);
    format!(
        "item {index} of the batch failed: out of memory: asked for {asked}; {free_text} were free then (the \
         batch's earlier items held the rest), the largest free block found is {largest_text}. The batch as a \
         whole does not fit: it asks for {total} in all, and the pool had {room} free for it. Free other \
         blocks, or make the pool larger; nothing of the batch stays allocated"
    )
}

/// An exception of `class` (`OutOfMemoryError` or one of its subclasses) with `message` and
/// the figures as attributes (`requested` an int, the size as the caller gave it).
pub(crate) fn with_figures(
    class: ErrorClass,
    message: String,
    requested: &Bound<'_, PyAny>,
    bytes_free: usize,
    largest_free_block: usize,
) -> PyErr {
    // Made as `__init__` would make it (`args` the message alone, the figures attributes),
    // without the call through `functools.partialmethod` that `__init__` is: the class's own
    // `tp_new`, as calling the class runs it (its `__new__` attribute is `MemoryError`'s,
    // which refuses a class whose `tp_new` is `BaseException`'s).
    let py = requested.py();
    let made = class.class(py).and_then(|cls| {
        let args = PyTuple::new(py, [message])?;
        // SAFETY: `cls` is a type; `PyType_GetSlot` of `Py_tp_new` gives its allocator's
        // constructor (every exception class has one), called as `type.__call__` calls it,
        // with a tuple of arguments and no keywords; it returns a new reference or NULL with
        // an exception set.
        let instance = unsafe {
            let slot = ffi::PyType_GetSlot(cls.as_ptr().cast(), ffi::Py_tp_new);
            if slot.is_null() {
                return Err(PyErr::fetch(py));
            }
            let new: ffi::newfunc = std::mem::transmute(slot);
            Bound::from_owned_ptr_or_err(py, new(cls.as_ptr().cast(), args.as_ptr(), std::ptr::null_mut()))?
        };
        instance.setattr(intern!(py, "requested"), requested)?;
        instance.setattr(intern!(py, "bytes_free"), bytes_free)?;
        instance.setattr(intern!(py, "largest_free_block"), largest_free_block)?;
        Ok(instance)
    });
    match made {
        Ok(instance) => PyErr::from_value(instance),
        Err(failed) => failed,
    }
}

/// Map an npumem-core error to its Python exception.
pub(crate) fn to_py(err: Error) -> PyErr {
    let class = match err.root() {
        Error::Config { .. } => ErrorClass::Config,
        Error::InvalidSize { .. } | Error::InvalidAlignment { .. } => ErrorClass::InvalidArgument,
        &Error::TooLarge { size, bytes_free, largest_free_block, .. } => {
            return user_code::attach(|py| {
                let size = size.into_pyobject(py).unwrap_or_else(|never| match never {}).into_any();
                with_figures(ErrorClass::RequestTooLarge, err.to_string(), &size, bytes_free, largest_free_block)
            });
        }
        &Error::OutOfMemory { requested, bytes_free, largest_free_block, largest_region, unplaced_growth } => {
            return user_code::attach(|py| {
                let message = match err {
                    Error::Batch { index, shortfall: Some(shortfall), .. } => {
                        batch_shortfall_message(index, requested, bytes_free, largest_free_block, shortfall)
                    }
                    Error::OutOfMemory { .. } => out_of_memory_message(
                        requested,
                        bytes_free,
                        largest_free_block,
                        largest_region,
                        unplaced_growth,
                    ),
                    // A batch wraps the root error ("item 3 of the batch failed: ..."): keep the context.
                    _ => {
                        let human = out_of_memory_message(
                            requested,
                            bytes_free,
                            largest_free_block,
                            largest_region,
                            unplaced_growth,
                        );
                        err.to_string().replace(&err.root().to_string(), &human)
                    }
                };
                let requested = requested.into_pyobject(py).unwrap_or_else(|never| match never {}).into_any();
                with_figures(ErrorClass::OutOfMemory, message, &requested, bytes_free, largest_free_block)
            });
        }
        Error::Backing(_) | Error::HostMemory { .. } => ErrorClass::OutOfMemory,
        Error::InvalidHandle(HandleFault::Freed | HandleFault::Foreign | HandleFault::Unknown) => {
            ErrorClass::InvalidHandle
        }
        Error::DoubleFree | Error::NamedTwice { .. } => ErrorClass::DoubleFree,
        Error::Pinned { .. } | Error::PinLimit { .. } => ErrorClass::PinnedBlock,
        Error::InvalidBlock { .. } => ErrorClass::InvalidHandle,
        Error::NoBacking => ErrorClass::NoBacking,
        Error::Paused
        | Error::Busy { .. }
        | Error::PausedTooLong { .. }
        | Error::PausedAtFork { .. }
        | Error::Interrupted { .. }
        | Error::CopiesInterrupted { .. }
        | Error::ForkedMidCall => ErrorClass::PoolBusy,
        Error::Moving | Error::Relocating | Error::AlreadyPaused | Error::PauseInsideCall => ErrorClass::PoolBusy,
        Error::InvalidMove { .. } | Error::MoveCycle { .. } | Error::MoverFailed(_) | Error::NotPaused => {
            ErrorClass::Move
        }
        Error::Corruption(_) | Error::CopyBackFailed { .. } | Error::Batch { .. } => ErrorClass::Corruption,
        _ => ErrorClass::Corruption,
    };
    error(class, err.to_string())
}
