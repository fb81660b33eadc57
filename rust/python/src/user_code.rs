//! Python code that a binding call runs on its caller's thread: a user's callback (an
//! out-of-memory handler, a growth hook, a mover, `on_evict`), a generator the call iterates,
//! an `__index__`, the package's views; and [`attach`], which every caller in this crate takes
//! the GIL with.
//!
//! Before Python 3.14, a thread that runs Python code while the interpreter exits is ended
//! with `pthread_exit`, which unwinds the thread's stack ("forced unwinding"). Through a
//! binding call, that unwind would run the call's cleanups (releasing a GIL state that is no
//! longer current) and reach PyO3's entry point, which cannot pass it on: the process aborts
//! ("FATAL: exception not rethrown"). The calls here stop such an unwind where they called
//! Python and park the thread for good, as Python 3.14 does with such threads and PyO3 does
//! where it attaches one: the interpreter exits normally, and nothing more of the binding call
//! runs. For the unwind to reach that stop, the CPython functions are called as functions that
//! may unwind (PyO3 declares them as never unwinding, so a frame that calls them need not be
//! prepared for it). A Rust panic unwinds through as before.

use std::os::raw::c_int;

use pyo3::ffi::PyObject;
use pyo3::prelude::*;
use pyo3::types::{PyIterator, PyTuple};
use pyo3::BoundObject;

/// CPython's functions that run Python code, as pointers of a type that may unwind (see the
/// module documentation). A declaration of the same symbols with this ABI would clash with
/// PyO3's, and the compiler would keep one of the two; pointers it cannot see through
/// (`black_box`) make every call a call that may unwind.
mod unwinding {
    use std::hint::black_box;

    use super::{c_int, PyObject};
    use pyo3::ffi;

    pub(super) fn call() -> unsafe extern "C-unwind" fn(*mut PyObject, *mut PyObject, *mut PyObject) -> *mut PyObject {
        let f: unsafe extern "C" fn(*mut PyObject, *mut PyObject, *mut PyObject) -> *mut PyObject = ffi::PyObject_Call;
        // SAFETY: the same function and arguments; only the ABI's unwinding is declared.
        unsafe { std::mem::transmute(black_box(f)) }
    }

    pub(super) fn iter_next() -> unsafe extern "C-unwind" fn(*mut PyObject) -> *mut PyObject {
        let f: unsafe extern "C" fn(*mut PyObject) -> *mut PyObject = ffi::PyIter_Next;
        // SAFETY: as above.
        unsafe { std::mem::transmute(black_box(f)) }
    }

    pub(super) fn is_true() -> unsafe extern "C-unwind" fn(*mut PyObject) -> c_int {
        let f: unsafe extern "C" fn(*mut PyObject) -> c_int = ffi::PyObject_IsTrue;
        // SAFETY: as above.
        unsafe { std::mem::transmute(black_box(f)) }
    }
}

/// `Python::attach`, except in a thread without the GIL that finds the interpreter gone (its
/// exit under way, as a daemon thread waiting without the GIL may): that thread parks for good,
/// as Python 3.14 does with such threads and PyO3 does where the exit ends one while it takes
/// the GIL back (as the calls below do), rather than panic. (A thread that holds the GIL, as the
/// exit's own thread does, is attached as always.)
pub(crate) fn attach<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> R {
    let mut f = Some(f);
    let mut run = |py: Python<'_>| (f.take().expect("run once"))(py);
    if let Some(done) = Python::try_attach(&mut run) {
        return done;
    }
    // SAFETY: callable at any time.
    if unsafe { pyo3::ffi::Py_IsInitialized() } == 0 {
        loop {
            std::thread::park();
        }
    }
    Python::attach(run)
}

/// `callable(*args)`.
pub(crate) fn call<'py, A>(callable: &Bound<'py, PyAny>, args: A) -> PyResult<Bound<'py, PyAny>>
where
    A: IntoPyObject<'py, Target = PyTuple>,
    A::Error: Into<PyErr>,
{
    let py = callable.py();
    let args = args.into_pyobject(py).map_err(Into::into)?.into_bound();
    let call = unwinding::call();
    let guard = ParkOnThreadExit;
    // SAFETY: both objects are live and the GIL is held (`Bound`); no keyword arguments.
    let raw = unsafe { call(callable.as_ptr(), args.as_ptr(), std::ptr::null_mut()) };
    std::mem::forget(guard);
    // SAFETY: a new reference, or NULL with the exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, raw) }
}

/// `bool(object)` (its `__bool__` or `__len__` may be Python code).
pub(crate) fn is_truthy(object: &Bound<'_, PyAny>) -> PyResult<bool> {
    let is_true = unwinding::is_true();
    let guard = ParkOnThreadExit;
    // SAFETY: the object is live and the GIL is held (`Bound`).
    let answer = unsafe { is_true(object.as_ptr()) };
    std::mem::forget(guard);
    match answer {
        -1 => Err(PyErr::fetch(object.py())),
        answer => Ok(answer != 0),
    }
}

/// The items of a Python iterator that a call takes one by one (a generator runs Python code
/// for every item).
pub(crate) fn each<'py>(items: Bound<'py, PyIterator>) -> impl Iterator<Item = PyResult<Bound<'py, PyAny>>> {
    std::iter::from_fn(move || {
        let py = items.py();
        let next = unwinding::iter_next();
        let guard = ParkOnThreadExit;
        // SAFETY: the iterator is live and the GIL is held (`Bound`).
        let raw = unsafe { next(items.as_ptr()) };
        std::mem::forget(guard);
        // SAFETY: a new reference; or NULL, with an exception set unless the iterator is done.
        match unsafe { Bound::from_owned_ptr_or_opt(py, raw) } {
            Some(item) => Some(Ok(item)),
            None => PyErr::take(py).map(Err),
        }
    })
}

/// Dropped only when an unwind passes the frame that holds it (see the module documentation).
struct ParkOnThreadExit;

impl Drop for ParkOnThreadExit {
    fn drop(&mut self) {
        // A Rust panic has counted itself: it goes on. Anything else is the thread's exit.
        if std::thread::panicking() {
            return;
        }
        loop {
            std::thread::park();
        }
    }
}
