//! Cutting a batch's copies into *waves* for a mover, so that a mover failing partway never
//! loses a byte.
//!
//! The copy order (`order.rs`) is sequential: each copy may overwrite bytes that earlier copies
//! have read. A mover gets the copies one wave at a time: within a wave the copies touch
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
    // Sources are pairwise disjoint: a binary search finds the sources a destination overlaps.
    let mut by_src: Vec<usize> = (0..n).collect();
    by_src.sort_unstable_by_key(|&i| copies[i].src);
    let starts: Vec<usize> = by_src.iter().map(|&i| copies[i].src).collect();
    let mut wave = vec![0usize; n];
    let mut count = 0;
    for (b, t) in copies.iter().enumerate() {
        let end = t.dst + t.len;
        let mut k = starts.partition_point(|&s| s < t.dst).saturating_sub(1);
        let mut w = 0;
        while k < n && starts[k] < end {
            let a = by_src[k];
            let s = &copies[a];
            if a != b && s.src < end && t.dst < s.src + s.len {
                debug_assert!(a < b, "a copy reads bytes an earlier copy overwrote");
                w = w.max(wave[a] + 1);
            }
            k += 1;
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
        let size = ts.iter().map(|t| (t.src + t.len).max(t.dst + t.len)).max().unwrap();
        let mut mem0 = vec![0u16; size];
        for (i, t) in ts.iter().enumerate() {
            for k in 0..t.len {
                mem0[t.src + k] = ((i as u16 + 1) << 8) | k as u16;
            }
        }
        let ws = waves(&sequential(ts));
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
    fn independent_copies_share_one_wave() {
        let ws = waves(&[t(0, 100, 10), t(20, 200, 10), t(40, 300, 10)]);
        assert_eq!(ws.len(), 1);
        assert_eq!(ws[0].len(), 3);
    }

    #[test]
    fn random_batches_survive_every_prefix() {
        let mut rng = 99u64;
        let mut next = || {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (rng >> 33) as usize
        };
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
