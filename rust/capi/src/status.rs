//! Status codes, the core error each one stands for, `npumem_strerror`, and the per-thread
//! message of the last failed call. Every entry point runs its body through [`guard`], so a
//! panic becomes `NPUMEM_ERR_INTERNAL` instead of unwinding into C.

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use npumem_core::{Error, HandleFault};

/// The result of every call: `NPUMEM_OK` (0) or one of the `NPUMEM_ERR_*` codes.
pub type Status = c_int;

pub const OK: Status = 0;
pub const ERR_NULL_ARGUMENT: Status = 1;
pub const ERR_INVALID_POOL: Status = 2;
pub const ERR_CONFIG: Status = 3;
pub const ERR_INVALID_SIZE: Status = 4;
pub const ERR_TOO_LARGE: Status = 5;
pub const ERR_INVALID_ALIGNMENT: Status = 6;
pub const ERR_OUT_OF_MEMORY: Status = 7;
pub const ERR_INVALID_HANDLE: Status = 8;
pub const ERR_FOREIGN_HANDLE: Status = 9;
pub const ERR_DOUBLE_FREE: Status = 10;
pub const ERR_PINNED: Status = 11;
pub const ERR_INVALID_BLOCK: Status = 12;
pub const ERR_NO_BACKING: Status = 13;
pub const ERR_BACKING: Status = 14;
pub const ERR_BUSY: Status = 15;
pub const ERR_CORRUPTION: Status = 16;
pub const ERR_ABI_MISMATCH: Status = 17;
pub const ERR_INTERNAL: Status = 18;
pub const ERR_INVALID_ARGUMENT: Status = 19;
pub const ERR_NOT_PINNED: Status = 20;

/// The fixed description of each code, NUL-terminated, indexed by code.
const DESCRIPTIONS: [&CStr; 21] = [
    c"success",
    c"a required pointer argument is NULL",
    c"the pool pointer does not name a live pool",
    c"invalid pool configuration",
    c"invalid size",
    c"the request is larger than the pool and can never succeed",
    c"invalid alignment",
    c"out of memory",
    c"the handle does not name a live block of this pool",
    c"the handle belongs to another pool",
    c"double free: the block was already freed",
    c"the block is pinned and cannot be freed",
    c"no live block of that size at that offset",
    c"the pool has no host memory behind it",
    c"host memory could not be mapped or allocated",
    c"the pool is paused or busy; try again",
    c"pool metadata is inconsistent",
    c"the caller and the library disagree on the ABI (struct size or version)",
    c"internal error (a bug in npumem; details in npumem_last_error)",
    c"an argument is malformed",
    c"the block holds no pin to drop",
];

const UNKNOWN: &CStr = c"unknown status code";

/// The fixed description of `status` (never NULL; static storage).
pub fn describe(status: Status) -> &'static CStr {
    usize::try_from(status).ok().and_then(|i| DESCRIPTIONS.get(i)).copied().unwrap_or(UNKNOWN)
}

/// The code that stands for a core error (the innermost one of a batch error).
pub fn code_of(err: &Error) -> Status {
    match err.root() {
        Error::Config { .. } => ERR_CONFIG,
        Error::InvalidSize { .. } => ERR_INVALID_SIZE,
        Error::TooLarge { .. } => ERR_TOO_LARGE,
        Error::InvalidAlignment { .. } => ERR_INVALID_ALIGNMENT,
        Error::OutOfMemory { .. } => ERR_OUT_OF_MEMORY,
        Error::InvalidHandle(HandleFault::Foreign) => ERR_FOREIGN_HANDLE,
        Error::InvalidHandle(_) => ERR_INVALID_HANDLE,
        Error::DoubleFree | Error::NamedTwice { .. } => ERR_DOUBLE_FREE,
        Error::Pinned { .. } | Error::PinLimit { .. } => ERR_PINNED,
        Error::InvalidBlock { .. } => ERR_INVALID_BLOCK,
        Error::NoBacking => ERR_NO_BACKING,
        Error::Backing(_) | Error::HostMemory { .. } => ERR_BACKING,
        Error::Paused
        | Error::Busy { .. }
        | Error::PausedTooLong { .. }
        | Error::PausedAtFork { .. }
        | Error::Interrupted { .. }
        | Error::CopiesInterrupted { .. }
        | Error::ForkedMidCall
        | Error::Moving
        | Error::Relocating
        | Error::AlreadyPaused
        | Error::PauseInsideCall
        | Error::NotPaused => ERR_BUSY,
        Error::Corruption(_) | Error::CopyBackFailed { .. } => ERR_CORRUPTION,
        _ => ERR_INTERNAL,
    }
}

thread_local! {
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Record `message` as this thread's last error.
pub fn set_last_error(message: &str) {
    let message = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|last| *last.borrow_mut() = Some(message));
}

/// This thread's last error message ("" before the first failure): valid until this thread's
/// next failing call.
pub fn last_error_ptr() -> *const c_char {
    LAST_ERROR.with(|last| last.borrow().as_ref().map_or(c"".as_ptr(), |m| m.as_ptr()))
}

/// Record a core error as this thread's last error and return its code.
pub fn fail(err: &Error) -> Status {
    set_last_error(&err.to_string());
    code_of(err)
}

/// Record a message and return `status`.
pub fn fail_with(status: Status, message: &str) -> Status {
    set_last_error(message);
    status
}

/// Run `body`; a panic becomes [`ERR_INTERNAL`] with its message as the last error.
#[inline]
pub fn guard(body: impl FnOnce() -> Status) -> Status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(status) => status,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_string());
            // Reporting must not panic again (the message may be odd; the thread-local may be
            // gone at thread exit): a second failure is dropped.
            let _ = catch_unwind(AssertUnwindSafe(|| set_last_error(&format!("internal error: {what}"))));
            ERR_INTERNAL
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_has_a_description() {
        for code in OK..=ERR_NOT_PINNED {
            assert_ne!(describe(code), UNKNOWN, "code {code}");
        }
        assert_eq!(describe(-1), UNKNOWN);
        assert_eq!(describe(ERR_NOT_PINNED + 1), UNKNOWN);
    }

    #[test]
    fn batch_errors_report_their_root() {
        let err = Error::batch(3, Error::DoubleFree);
        assert_eq!(code_of(&err), ERR_DOUBLE_FREE);
    }

    #[test]
    fn a_panic_becomes_internal_with_its_message() {
        let status = guard(|| panic!("boom"));
        assert_eq!(status, ERR_INTERNAL);
        // SAFETY: the pointer is this thread's NUL-terminated last error.
        let message = unsafe { CStr::from_ptr(last_error_ptr()) };
        assert_eq!(message.to_str().unwrap(), "internal error: boom");
    }
}
