//! Which per-core pool a thread uses: the CPU it runs on (`sched_getcpu`), modulo the number of
//! core pools. Only a hint: a thread may migrate at any moment, and every operation stays
//! correct when it does (frees go to the block's owner, whatever core the caller is on). So the
//! answer is cached per thread and asked again every `REFRESH` calls: a thread that migrates
//! keeps its old core for a few operations, which costs locality, never correctness.

use std::cell::Cell;

/// Calls between two `sched_getcpu`s.
const REFRESH: u32 = 64;

thread_local! {
    /// `(cpu, calls left before asking again)`.
    static CACHED: Cell<(u32, u32)> = const { Cell::new((0, 0)) };
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

/// The CPU this thread ran on recently.
#[inline]
fn recent_cpu() -> usize {
    CACHED
        .try_with(|cached| {
            let (cpu, left) = cached.get();
            if left > 0 {
                cached.set((cpu, left - 1));
                return cpu as usize;
            }
            let cpu = current_cpu();
            cached.set((cpu as u32, REFRESH));
            cpu
        })
        .unwrap_or_else(|_| current_cpu())
}

/// Ask the CPU again at this thread's next call: a caller that just moved the thread (pinned
/// it to a CPU) or made a pool gets that CPU's core at once, not the one cached before.
pub(crate) fn forget() {
    let _ = CACHED.try_with(|cached| cached.set((0, 0)));
}

/// The core pool for this thread now, out of `cores`.
#[inline]
pub(crate) fn current_core(cores: usize) -> usize {
    if cores == 1 {
        0
    } else {
        recent_cpu() % cores
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    #[test]
    fn a_forgotten_cpu_is_asked_again_at_the_next_call() {
        super::CACHED.with(|c| c.set((u32::MAX - 1, 50)));
        assert_eq!(super::recent_cpu(), (u32::MAX - 1) as usize, "cached");
        super::forget();
        assert_ne!(super::recent_cpu(), (u32::MAX - 1) as usize, "asked again: no CPU has that number");
    }

    #[test]
    fn core_is_in_range() {
        for cores in 1..8 {
            for _ in 0..200 {
                assert!(super::current_core(cores) < cores);
            }
        }
    }
}
