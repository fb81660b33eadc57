//! The one place where errors become Python exceptions. The exception classes are defined in
//! Python (`npumem.errors`, so they can have two bases, like `OutOfMemoryError(NpumemError,
//! MemoryError)`) and imported once.

use npumem_core::{Error, HandleFault};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyType;

/// The exception classes of `npumem.errors`.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    OutOfMemory,
    InvalidArgument,
    ArgumentType,
    RequestTooLarge,
    InvalidHandle,
    DoubleFree,
    PinnedBlock,
    NoBacking,
    PoolBusy,
    Config,
    Corruption,
    Move,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::OutOfMemory => "OutOfMemoryError",
            Kind::InvalidArgument => "InvalidArgumentError",
            Kind::ArgumentType => "ArgumentTypeError",
            Kind::RequestTooLarge => "RequestTooLargeError",
            Kind::InvalidHandle => "InvalidHandleError",
            Kind::DoubleFree => "DoubleFreeError",
            Kind::PinnedBlock => "PinnedBlockError",
            Kind::NoBacking => "NoBackingError",
            Kind::PoolBusy => "PoolBusyError",
            Kind::Config => "ConfigError",
            Kind::Corruption => "CorruptionError",
            Kind::Move => "MoveError",
        }
    }

    fn class<'py>(self, py: Python<'py>) -> PyResult<&'py Bound<'py, PyType>> {
        static CLASSES: [PyOnceLock<Py<PyType>>; 12] = [const { PyOnceLock::new() }; 12];
        CLASSES[self as usize].import(py, "npumem.errors", self.name())
    }
}

/// A Python exception of `kind` with `message`.
pub(crate) fn error(kind: Kind, message: impl Into<String>) -> PyErr {
    let message = message.into();
    Python::attach(|py| match kind.class(py).and_then(|cls| cls.call1((message.clone(),))) {
        Ok(instance) => PyErr::from_value(instance),
        Err(import_failed) => import_failed,
    })
}

/// A planner search input the core refused (`InvalidArgumentError`).
pub(crate) fn packing(err: npumem_core::plan_search::PackingError) -> PyErr {
    error(Kind::InvalidArgument, err.0)
}

/// Map an npumem-core error to its Python exception.
pub(crate) fn to_py(err: Error) -> PyErr {
    let message = err.to_string();
    let kind = match err.root() {
        Error::Config { .. } => Kind::Config,
        Error::InvalidSize { .. } | Error::InvalidAlignment { .. } => Kind::InvalidArgument,
        Error::TooLarge { .. } => Kind::RequestTooLarge,
        &Error::OutOfMemory { requested, bytes_free, largest_free_block } => {
            let (requested, bytes_free, largest) = (requested, bytes_free, largest_free_block);
            return Python::attach(|py| {
                match Kind::OutOfMemory.class(py).and_then(|cls| cls.call1((message, requested, bytes_free, largest))) {
                    Ok(instance) => PyErr::from_value(instance),
                    Err(import_failed) => import_failed,
                }
            });
        }
        Error::Backing(_) => Kind::OutOfMemory,
        Error::InvalidHandle(HandleFault::Freed | HandleFault::Foreign | HandleFault::Unknown) => Kind::InvalidHandle,
        Error::DoubleFree => Kind::DoubleFree,
        Error::Pinned { .. } => Kind::PinnedBlock,
        Error::InvalidBlock { .. } => Kind::InvalidHandle,
        Error::NoBacking => Kind::NoBacking,
        Error::Paused | Error::Busy { .. } | Error::PausedTooLong { .. } => Kind::PoolBusy,
        // compaction (issue 5)
        Error::Moving | Error::Relocating | Error::AlreadyPaused => Kind::PoolBusy,
        Error::InvalidMove { .. } | Error::MoveCycle { .. } | Error::MoverFailed(_) | Error::NotPaused => Kind::Move,
        Error::Corruption(_) | Error::Batch { .. } => Kind::Corruption,
        _ => Kind::Corruption,
    };
    error(kind, message)
}
