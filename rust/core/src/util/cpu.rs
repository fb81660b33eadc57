//! Which per-core pool a thread uses: the CPU it runs on (`sched_getcpu`), modulo the number of
//! core pools. Only a hint: a thread may migrate at any moment, and every operation stays
//! correct when it does (frees go to the block's owner, whatever core the caller is on). So the
//! answer is cached per thread and asked again every `REFRESH` calls: a thread that migrates
//! keeps its old core for a few operations, which costs locality, never correctness. The cache
//! also keeps the core pool it found for the last number of core pools asked, so that a call
//! pays no division.

use std::cell::Cell;

/// Calls between two `sched_getcpu`s.
const REFRESH: u32 = 64;

/// A thread's cached answer.
#[derive(Clone, Copy)]
struct Cached {
    /// The CPU found last.
    cpu: u32,
    /// Calls left before asking again.
    left: u32,
    /// The number of core pools `core` is for.
    cores: u32,
    /// `cpu % cores`.
    core: u32,
}

thread_local! {
    static CACHED: Cell<Cached> = const { Cell::new(Cached { cpu: 0, left: 0, cores: 0, core: 0 }) };
}

/// The CPU this thread runs on now (0 when the kernel cannot say).
#[inline]
pub(crate) fn current_cpu() -> usize {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: sched_getcpu has no preconditions; it returns -1 on failure.
        let cpu = unsafe { libc::sched_getcpu() };
        if cpu >= 0 {
            return cpu as usize;
        }
    }
    0
}

/// The core pool for this thread now, out of `cores`.
#[inline]
pub(crate) fn current_core(cores: usize) -> usize {
    if cores == 1 {
        return 0;
    }
    CACHED
        .try_with(|cached| {
            let c = cached.get();
            if c.left > 0 && c.cores as usize == cores {
                cached.set(Cached { left: c.left - 1, ..c });
                return c.core as usize;
            }
            core_after_miss(cached, c, cores)
        })
        .unwrap_or_else(|_| current_cpu() % cores)
}

/// [`current_core`] when the cache is due for a refresh or was for another number of core pools.
#[cold]
#[inline(never)]
fn core_after_miss(cached: &Cell<Cached>, c: Cached, cores: usize) -> usize {
    let (cpu, left) = if c.left > 0 { (c.cpu, c.left - 1) } else { (current_cpu() as u32, REFRESH) };
    let core = cpu as usize % cores;
    cached.set(Cached { cpu, left, cores: cores as u32, core: core as u32 });
    core
}

#[cfg(all(test, not(loom)))]
mod tests {
    #[test]
    fn core_is_in_range() {
        for cores in 1..8 {
            for _ in 0..200 {
                assert!(super::current_core(cores) < cores);
            }
        }
    }
}
