//! The atomics every lock-free protocol in this crate uses: `std`'s normally, `loom`'s when the
//! crate is built with `--cfg loom`, so the loom models exercise the very code that ships.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// Tell the CPU (or loom's scheduler) that this thread is waiting for another one.
#[inline]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}

/// A value alone on its cache line(s), so counters of different cores never share one.
/// 128 bytes: adjacent-line prefetching on x86 pairs 64-byte lines.
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct CachePadded<T>(pub(crate) T);

impl<T> std::ops::Deref for CachePadded<T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        &self.0
    }
}
