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

/// Nothing, except under loom: there, a sequentially consistent fence. Loom treats
/// sequentially consistent loads and read-modify-writes as acquire/release ones (a documented
/// limitation), so a protocol whose proof needs their single total order (a store-buffer
/// handshake: each side writes one word, then reads the other's) places this between its
/// write and its read, and the model checks what the `SeqCst` operations guarantee. On x86-64
/// those operations cost what acquire/release ones do; a real fence would not.
#[inline(always)]
pub(crate) fn seq_cst_for_loom() {
    #[cfg(loom)]
    fence(Ordering::SeqCst);
}

/// Run loom model `f` with at most `bound` preemptions, or fewer where `LOOM_MAX_PREEMPTIONS`
/// asks for fewer. For models of three threads whose calls retry compare-and-swap loops: their
/// schedules grow fast with the bound (the handle table's batch races take a minute each with
/// four preemptions, 17 s with three), and `make test` runs on two cores.
#[cfg(all(test, loom))]
pub(crate) fn loom_model_bounded<F: Fn() + Sync + Send + 'static>(bound: usize, f: F) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(builder.preemption_bound.map_or(bound, |b| b.min(bound)));
    builder.check(f);
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
