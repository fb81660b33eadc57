//! Cutting a batch's copies into *waves* for a mover, so that a mover failing partway never
//! loses a byte.
//!
//! The copy order (`order.rs`) is sequential: each copy may overwrite bytes that earlier copies
//! have read, and may read bytes an earlier copy wrote (a cycle broken through free space of the
//! arena: one block goes out to a scratch place, and later from there to its destination). Sources
//! are pairwise disjoint, and so are destinations. A mover gets the copies one wave at a time: within a wave the copies touch
//! disjoint bytes and no destination overlaps a source that any copy of the same or a later wave
//! still has to read, so the copies of a wave may run in parallel and in any order. A copy whose
//! destination overlaps its own source (a short slide) is cut into pieces no longer than the
//! distance it slides, each piece a copy of its own, in the wave after the piece whose bytes it
//! overwrites.
//!
//! If the mover fails during wave `w`, whatever part of wave `w` it did overwrote no byte still
//! needed, and the waves before it are undone by their reverse copies (destination back to
//! source), last wave first, through the same mover: a reverse wave never overwrites the copy
//! another reverse copy of the same or a later step still has to read (the argument mirrors the
//! forward one). Then every source holds its block's bytes again.

use super::order::Transfer;

/// `sequential` (a valid copy order) cut into waves, in the order they must run.
pub(crate) fn waves(sequential: &[Transfer]) -> Vec<Vec<Transfer>> {
    let copies = split_self_overlaps(sequential);
    let n = copies.len();
    let sources = Index::new(&copies, |t| t.src);
    let destinations = Index::new(&copies, |t| t.dst);
    let mut wave = vec![0usize; n];
    let mut count = 0;
    for (b, t) in copies.iter().enumerate() {
        let mut w = 0;
        // After every earlier copy that reads bytes this one overwrites, and after every earlier
        // copy that wrote bytes this one reads.
        for a in sources.overlapping(&copies, |s| s.src, t.dst, t.len).chain(destinations.overlapping(
            &copies,
            |s| s.dst,
            t.src,
            t.len,
        )) {
            if a < b {
                w = w.max(wave[a] + 1);
            }
        }
        wave[b] = w;
        count = count.max(w + 1);
    }
    let mut out: Vec<Vec<Transfer>> = vec![Vec::new(); count];
    for (t, w) in copies.into_iter().zip(wave) {
        out[w].push(t);
    }
    out
}

/// The copies sorted by one of their ranges (sources, or destinations), which are pairwise
/// disjoint: a binary search finds those a range overlaps.
struct Index {
    by_start: Vec<usize>,
    starts: Vec<usize>,
}

impl Index {
    fn new(copies: &[Transfer], start: impl Fn(&Transfer) -> usize) -> Index {
        let mut by_start: Vec<usize> = (0..copies.len()).collect();
        by_start.sort_unstable_by_key(|&i| start(&copies[i]));
        let starts = by_start.iter().map(|&i| start(&copies[i])).collect();
        Index { by_start, starts }
    }

    /// The copies whose range overlaps `[at, at + len)`.
    fn overlapping<'a>(
        &'a self,
        copies: &'a [Transfer],
        start: impl Fn(&Transfer) -> usize + 'a,
        at: usize,
        len: usize,
    ) -> impl Iterator<Item = usize> + 'a {
        let end = at + len;
        let first = self.starts.partition_point(|&s| s < at).saturating_sub(1);
        self.by_start[first..]
            .iter()
            .zip(&self.starts[first..])
            .take_while(move |&(_, &s)| s < end)
            .map(|(&i, _)| i)
            .filter(move |&i| {
                let c = &copies[i];
                start(c) + c.len > at
            })
    }
}

/// The copies of `waves` reversed (destination back to source), last wave first.
pub(crate) fn reverse(waves: &[Vec<Transfer>]) -> Vec<Vec<Transfer>> {
    waves
        .iter()
        .rev()
        .map(|wave| wave.iter().map(|t| Transfer { src: t.dst, dst: t.src, len: t.len }).collect())
        .collect()
}

/// Each copy whose destination overlaps its own source, cut into pieces no longer than the
/// distance it moves, in an order in which each piece overwrites only bytes already copied.
fn split_self_overlaps(sequential: &[Transfer]) -> Vec<Transfer> {
    let mut out = Vec::with_capacity(sequential.len());
    for &t in sequential {
        let distance = t.src.abs_diff(t.dst);
        if distance == 0 || distance >= t.len {
            out.push(t);
        } else if t.dst < t.src {
            // Down: lowest piece first; piece k lands on piece k - 1's source.
            let mut at = 0;
            while at < t.len {
                let len = distance.min(t.len - at);
                out.push(Transfer { src: t.src + at, dst: t.dst + at, len });
                at += len;
            }
        } else {
            // Up: highest piece first.
            let mut end = t.len;
            while end > 0 {
                let start = end.saturating_sub(distance);
                out.push(Transfer { src: t.src + start, dst: t.dst + start, len: end - start });
                end = start;
            }
        }
    }
    out
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::compaction::order::{order, Step};

    /// A seeded stream of pseudo-random numbers (a linear congruential generator).
    fn lcg(seed: u64) -> impl FnMut() -> usize {
        let mut state = seed;
        move || {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) as usize
        }
    }

    fn t(src: usize, dst: usize, len: usize) -> Transfer {
        Transfer { src, dst, len }
    }

    fn sequential(ts: &[Transfer]) -> Vec<Transfer> {
        // Cycles are not given to this helper: every step is a copy.
        order(ts, false).unwrap().into_iter().map(|s| if let Step::Copy(i) = s { ts[i] } else { panic!() }).collect()
    }

    /// Memory with a pattern per source; run the first `k` copies of the waves (in wave order,
    /// each wave's copies in reverse order to show they may run in any order), then undo the
    /// completed waves, and check every source holds its bytes; with every copy done, check
    /// every destination does.
    fn check_every_prefix(ts: &[Transfer]) {
        check_every_prefix_of(ts, &sequential(ts));
    }

    /// The copies of `ts` in order, its cycles broken through scratch places from `scratch` on
    /// (as `execute.rs` does when a mover copies the bytes).
    fn through_scratch(ts: &[Transfer], scratch: usize) -> Vec<Transfer> {
        let steps = order(ts, true).unwrap();
        let (mut at, mut place) = (scratch, vec![0; ts.len()]);
        for &step in &steps {
            if let Step::Save(i) = step {
                place[i] = at;
                at += ts[i].len;
            }
        }
        steps
            .iter()
            .map(|&step| match step {
                Step::Copy(i) => ts[i],
                Step::Save(i) => Transfer { dst: place[i], ..ts[i] },
                Step::Restore(i) => Transfer { src: place[i], ..ts[i] },
            })
            .collect()
    }

    /// As [`check_every_prefix`], with the copies given (`copies` performs `ts`).
    fn check_every_prefix_of(ts: &[Transfer], copies: &[Transfer]) {
        let size = copies.iter().map(|t| (t.src + t.len).max(t.dst + t.len)).max().unwrap();
        let mut mem0 = vec![0u16; size];
        for (i, t) in ts.iter().enumerate() {
            for k in 0..t.len {
                mem0[t.src + k] = ((i as u16 + 1) << 8) | k as u16;
            }
        }
        let ws = waves(copies);
        let total: usize = ws.iter().map(Vec::len).sum();
        for budget in 0..=total {
            let mut mem = mem0.clone();
            let mut left = budget;
            let mut full_waves = 0;
            for wave in &ws {
                let mut done = 0;
                for c in wave.iter().rev() {
                    if left == 0 {
                        break;
                    }
                    mem.copy_within(c.src..c.src + c.len, c.dst);
                    left -= 1;
                    done += 1;
                }
                if done < wave.len() {
                    break;
                }
                full_waves += 1;
            }
            if budget == total {
                for (i, t) in ts.iter().enumerate() {
                    for k in 0..t.len {
                        assert_eq!(mem[t.dst + k], ((i as u16 + 1) << 8) | k as u16);
                    }
                }
                continue;
            }
            for wave in reverse(&ws[..full_waves]) {
                for c in wave.iter().rev() {
                    mem.copy_within(c.src..c.src + c.len, c.dst);
                }
            }
            for (i, t) in ts.iter().enumerate() {
                for k in 0..t.len {
                    assert_eq!(mem[t.src + k], ((i as u16 + 1) << 8) | k as u16, "budget {budget} move {i} byte {k}");
                }
            }
        }
    }

    #[test]
    fn a_chain_runs_in_waves_and_every_prefix_can_be_undone() {
        // 2 lands on 1's source, 1 on 0's source, 0 in free space.
        check_every_prefix(&[t(0, 100, 10), t(20, 0, 10), t(40, 20, 10)]);
        assert_eq!(waves(&sequential(&[t(0, 100, 10), t(20, 0, 10), t(40, 20, 10)])).len(), 3);
    }

    #[test]
    fn short_slides_are_cut_into_pieces() {
        check_every_prefix(&[t(10, 7, 20)]);
        check_every_prefix(&[t(10, 14, 20)]);
        check_every_prefix(&[t(40, 30, 25), t(10, 0, 25), t(70, 60, 3)]);
    }

    #[test]
    fn cycles_through_scratch_places_read_the_saved_bytes_after_they_were_written() {
        // A swap, and a three-cycle with a tail: one block of each cycle goes out to a scratch
        // place and later from there to its destination.
        for ts in [
            vec![t(0, 20, 10), t(20, 0, 10)],
            vec![t(0, 20, 10), t(20, 40, 10), t(40, 0, 10), t(60, 0, 0)],
            vec![t(0, 20, 10), t(20, 40, 10), t(40, 0, 10), t(60, 50, 8)],
        ] {
            let ts: Vec<Transfer> = ts.into_iter().filter(|t| t.len > 0).collect();
            let copies = through_scratch(&ts, 1000);
            assert!(copies.len() > ts.len(), "a cycle goes through scratch");
            check_every_prefix_of(&ts, &copies);
            assert!(waves(&copies).iter().all(|w| !w.is_empty()), "no empty wave");
        }
        // Random permutations of equal slots: cycles of every length.
        let mut next = lcg(7);
        for _ in 0..100 {
            let n = 2 + next() % 6;
            let mut slots: Vec<usize> = (0..n).collect();
            for i in (1..n).rev() {
                slots.swap(i, next() % (i + 1));
            }
            let ts: Vec<Transfer> =
                (0..n).filter(|&i| slots[i] != i).map(|i| t(i * 16, slots[i] * 16, 4 + i % 12)).collect();
            if !ts.is_empty() {
                check_every_prefix_of(&ts, &through_scratch(&ts, n * 16));
            }
        }
    }

    #[test]
    fn independent_copies_share_one_wave() {
        let ws = waves(&[t(0, 100, 10), t(20, 200, 10), t(40, 300, 10)]);
        assert_eq!(ws.len(), 1);
        assert_eq!(ws[0].len(), 3);
    }

    #[test]
    fn random_batches_survive_every_prefix() {
        let mut next = lcg(99);
        for _ in 0..100 {
            // Blocks of 4..12 bytes at disjoint places; each moves by a random distance into
            // space that no destination overlaps.
            let n = 1 + next() % 5;
            let mut ts = Vec::new();
            let mut dsts: Vec<(usize, usize)> = Vec::new();
            for i in 0..n {
                let len = 4 + next() % 8;
                let src = i * 16;
                let mut tries = 0;
                loop {
                    let dst = next() % (n * 16 + 16);
                    if dsts.iter().all(|&(d, l)| dst + len <= d || d + l <= dst) && dst != src {
                        dsts.push((dst, len));
                        ts.push(t(src, dst, len));
                        break;
                    }
                    tries += 1;
                    if tries > 50 {
                        break;
                    }
                }
            }
            if order(&ts, false).is_ok() && !ts.is_empty() {
                check_every_prefix(&ts);
            }
        }
    }
}
