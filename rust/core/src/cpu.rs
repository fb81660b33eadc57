//! Which per-core pool a thread uses: the CPU it runs on now (`sched_getcpu`), modulo the number
//! of core pools. Only a hint: a thread may migrate at any moment, and every operation stays
//! correct when it does (frees go to the block's owner, whatever core the caller is on).

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
        0
    } else {
        current_cpu() % cores
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    #[test]
    fn core_is_in_range() {
        for cores in 1..8 {
            assert!(super::current_core(cores) < cores);
        }
    }
}
