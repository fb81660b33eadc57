//! The trace's clock: nanoseconds since the pool was made, cheap enough to read on every event.
//!
//! [`Clock::now_ns`] reads the monotonic clock (`Instant`, about 25 ns through the vDSO). When
//! the kernel itself keeps time with the CPU's time-stamp counter (Linux on x86_64 with
//! `clocksource = tsc`: an invariant counter, synchronised across cores), a trace reads the
//! counter instead (`rdtsc`, a few nanoseconds where it overlaps other work) and scales it to
//! the same nanoseconds with a [`TscScale`] calibrated against `Instant` when the trace starts.
//! An event stores the raw counter; the drain scales it, so the alloc/free path pays only the
//! read. Events of one trace share one linear scale, so their order is the counter's order;
//! their times drift from `Instant` by the calibration error (parts per million).
//!
//! `rdtsc` does not wait for earlier instructions (`rdtscp` does, at about 25 ns a read on the
//! machines measured): the counter may be read a few tens of nanoseconds before the loads that
//! precede it in the program complete. Events of different threads closer than that may
//! therefore carry times in the wrong order; the drain (`trace/merge.rs`) keeps what a replay
//! needs regardless: each thread's own order, and a block's free and moves after its alloc.

use std::time::Instant;

/// Nanoseconds since an origin.
pub(crate) struct Clock {
    origin: Instant,
}

impl Clock {
    pub(crate) fn new() -> Clock {
        Clock { origin: Instant::now() }
    }

    /// Nanoseconds since the clock was made.
    #[inline]
    pub(crate) fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    /// A time-stamp counter scaled to [`Clock::now_ns`], when the counter is trustworthy here.
    /// Takes about a millisecond (it measures the counter's rate); `None` also when three
    /// attempts could not agree with the clock (a machine too loaded to measure).
    pub(crate) fn calibrate(&self) -> Option<TscScale> {
        if !tsc::trusted() {
            return None;
        }
        (0..3).find_map(|_| self.try_calibrate())
    }

    /// A clock reading and the counter at the same moment: of 16 tries, the one whose two
    /// counter reads around the clock read are closest (a thread preempted between them would
    /// pair the clock with a counter value milliseconds off).
    fn paired_reading(&self) -> (u64, u64) {
        (0..16)
            .map(|_| {
                let before = tsc::read();
                let ns = self.now_ns();
                let after = tsc::read();
                (after.wrapping_sub(before), ns, before / 2 + after / 2)
            })
            .min_by_key(|&(spread, _, _)| spread)
            .map(|(_, ns, tsc)| (ns, tsc))
            .expect("16 readings")
    }

    fn try_calibrate(&self) -> Option<TscScale> {
        let (ns0, tsc0) = self.paired_reading();
        let (mut ns1, mut tsc1) = self.paired_reading();
        while ns1 - ns0 < 1_000_000 {
            (ns1, tsc1) = self.paired_reading();
        }
        let ticks = tsc1.checked_sub(tsc0)?;
        // Between 100 MHz and 20 GHz, or something is off.
        let ns = ns1 - ns0;
        if ticks < ns / 10 || ticks > ns * 20 {
            return None;
        }
        let scale = TscScale { tsc0: tsc1, ns0: ns1, mul: (((ns as u128) << 32) / ticks as u128) as u64 };
        // Check the scale against the clock a little later: within 1% of the time since.
        let (ns2, tsc2) = loop {
            let (ns2, tsc2) = self.paired_reading();
            if ns2 - ns1 >= 200_000 {
                break (ns2, tsc2);
            }
        };
        let error = scale.at(tsc2).abs_diff(ns2);
        (error * 100 <= ns2 - ns1).then_some(scale)
    }
}

/// Counter ticks to clock nanoseconds: `ns0 + (tsc - tsc0) * mul / 2^32`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TscScale {
    tsc0: u64,
    ns0: u64,
    mul: u64,
}

impl TscScale {
    /// The counter now, unscaled: what an event records, scaled by [`TscScale::at`] when
    /// drained.
    #[inline]
    pub(crate) fn ticks(&self) -> u64 {
        tsc::read()
    }

    /// Clock nanoseconds at counter value `tsc` (never below 0).
    #[inline]
    pub(crate) fn at(&self, tsc: u64) -> u64 {
        let delta = tsc.wrapping_sub(self.tsc0) as i64 as i128;
        let ns = self.ns0 as i128 + ((delta * self.mul as i128) >> 32);
        ns.max(0) as u64
    }
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod tsc {
    use std::sync::OnceLock;

    /// Whether the kernel keeps time with the counter (it checked it is invariant and in step
    /// across cores).
    pub(super) fn trusted() -> bool {
        static TRUSTED: OnceLock<bool> = OnceLock::new();
        *TRUSTED.get_or_init(|| {
            std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
                .is_ok_and(|s| s.trim() == "tsc")
        })
    }

    /// The counter (`rdtsc`: not ordered with the instructions around it).
    #[inline]
    pub(super) fn read() -> u64 {
        // SAFETY: rdtsc is available wherever the kernel uses the TSC as its clocksource
        // (checked by `trusted` before any read); it reads the counter and nothing else.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
mod tsc {
    pub(super) fn trusted() -> bool {
        false
    }

    pub(super) fn read() -> u64 {
        0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn scaling_is_linear_and_never_negative() {
        // 2.5 ticks per nanosecond (a 2.5 GHz counter): mul = 2^32 / 2.5.
        let s = TscScale { tsc0: 1_000_000, ns0: 400, mul: ((1u128 << 32) * 2 / 5) as u64 };
        assert_eq!(s.at(1_000_000), 400);
        assert_eq!(s.at(1_000_000 + 2_500_000_000), 400 + 1_000_000_000 - 1);
        assert_eq!(s.at(1_000_000 - 500), 200);
        assert_eq!(s.at(0), 0, "clamped at the pool's creation");
        let mut last = 0;
        for t in (0..10_000_000u64).step_by(997) {
            let ns = s.at(t);
            assert!(ns >= last);
            last = ns;
        }
    }

    #[test]
    fn the_counter_is_used_exactly_when_trusted_and_then_follows_the_clock() {
        let clock = Clock::new();
        let scale = clock.calibrate();
        assert_eq!(scale.is_some(), tsc::trusted(), "a trusted counter must calibrate");
        if let Some(scale) = scale {
            let mut last = 0;
            for _ in 0..1000 {
                let t = scale.at(scale.ticks());
                assert!(t >= last, "the scaled counter went back");
                last = t;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
            // Bracket a counter reading between two clock readings; a bracket wider than 50 µs
            // means the thread was preempted in between (a loaded machine), so read again.
            let tight = (0..1000)
                .map(|_| (clock.now_ns(), scale.at(scale.ticks()), clock.now_ns()))
                .find(|&(a, _, c)| c - a < 50_000)
                .expect("some reading is not preempted");
            let (a, b, c) = tight;
            assert!(b + 200_000 >= a && b <= c + 200_000, "counter {b} ns vs clock {a}..{c} ns");
        }
    }
}
