//! The deadline of a search run, read every so much work rather than every so many nodes: a
//! node looks at every buffer still to place, so at thousands of buffers 256 nodes took a
//! tenth of a second or more past the deadline.

use std::time::Instant;

/// Buffers looked at between two reads of the clock: a millisecond or two of search at most,
/// and a read (tens of nanoseconds) per thousands of buffers costs nothing measurable.
pub(crate) const CHECK_WORK: u64 = 1 << 12;

/// A deadline and the work done since the clock was last read.
pub(crate) struct Clock {
    deadline: Option<Instant>,
    work: u64,
}

impl Clock {
    /// The first [`Clock::passed`] reads the clock, so a run past its deadline does no node.
    pub(crate) fn new(deadline: Option<Instant>) -> Self {
        Self { deadline, work: CHECK_WORK }
    }

    /// Adds `work` (buffers about to be looked at); whether the deadline has passed, reading
    /// the clock once [`CHECK_WORK`] has accumulated since the last read.
    #[inline]
    pub(crate) fn passed(&mut self, work: usize) -> bool {
        let Some(deadline) = self.deadline else {
            return false;
        };
        self.work += work as u64 + 1;
        if self.work < CHECK_WORK {
            return false;
        }
        self.work = 0;
        Instant::now() >= deadline
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_first_look_reads_the_clock() {
        assert!(Clock::new(Some(Instant::now())).passed(0));
        assert!(!Clock::new(None).passed(usize::MAX >> 1));
    }

    #[test]
    fn the_clock_is_read_once_enough_work_is_done() {
        let mut clock = Clock::new(Some(Instant::now() + Duration::from_millis(500)));
        assert!(!clock.passed(0));
        std::thread::sleep(Duration::from_millis(600));
        // Not read yet: too little work since the last read.
        assert!(!clock.passed(10));
        assert!(clock.passed(CHECK_WORK as usize));
    }
}
