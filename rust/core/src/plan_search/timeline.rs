//! A whole planning problem as columns (live ranges, sizes, alignments, pinned offsets), and the
//! passes over it that must stay fast at millions of buffers: the lower bound on the bytes live
//! at once, the pairs live together (counted, never listed), the check that a packing's live
//! buffers never share a byte, and the greedy placements (`greedy.rs`).
//!
//! Every pass is O(n log n) plus, for the placements in an order, the pairs they look at;
//! nothing here holds a list of the pairs. `npumem.plan` (its `greedy`, `bounds` and
//! `solution` modules) documents what each pass means for the planner.

use std::collections::{BTreeMap, BTreeSet};

use crate::plan_search::instance::{PackingError, MAX_SPAN};

/// A planning problem's buffers, checked: buffer `i` is live on `[lower[i], upper[i])`, takes
/// `size[i]` bytes at a multiple of `align_mask[i] + 1`, and is pinned at `fixed[i]` when that
/// is not `None`.
#[derive(Debug, Clone)]
pub struct Timeline {
    pub(crate) lower: Vec<i64>,
    pub(crate) upper: Vec<i64>,
    pub(crate) size: Vec<u64>,
    pub(crate) align_mask: Vec<u64>,
    pub(crate) fixed: Vec<Option<u64>>,
}

impl Timeline {
    /// Builds and checks the columns: equal lengths, `lower[i] < upper[i]`, `size[i] > 0`,
    /// power-of-two alignments, pinned offsets that are multiples of the alignment, and every
    /// size and pinned end within [`MAX_SPAN`] bytes (the buffers together may need more: the
    /// bound says so, and a placement that passes it ends beyond it).
    pub fn new(
        lower: Vec<i64>,
        upper: Vec<i64>,
        size: Vec<u64>,
        alignment: &[u64],
        fixed: Vec<Option<u64>>,
    ) -> Result<Self, PackingError> {
        let n = lower.len();
        for (what, len) in
            [("upper", upper.len()), ("sizes", size.len()), ("alignments", alignment.len()), ("fixed", fixed.len())]
        {
            if len != n {
                return Err(PackingError(format!("{what} has {len} entries for {n} buffers")));
            }
        }
        if u32::try_from(n).is_err() {
            return Err(PackingError(format!("{n} buffers are more than 2^32 - 1")));
        }
        for i in 0..n {
            if lower[i] >= upper[i] {
                return Err(PackingError(format!("buffer {i}: upper {} is not above lower {}", upper[i], lower[i])));
            }
            if size[i] == 0 {
                return Err(PackingError(format!("buffer {i} has size 0")));
            }
            if !alignment[i].is_power_of_two() {
                return Err(PackingError(format!("buffer {i}: alignment {} is not a power of two", alignment[i])));
            }
            if let Some(offset) = fixed[i] {
                if offset % alignment[i] != 0 {
                    return Err(PackingError(format!(
                        "buffer {i}: pinned offset {offset} is not a multiple of its alignment {}",
                        alignment[i]
                    )));
                }
                if u128::from(offset) + u128::from(size[i]) > u128::from(MAX_SPAN) {
                    return Err(PackingError(format!(
                        "buffer {i}: pinned at {offset}, it ends beyond the {MAX_SPAN} bytes (2^63 - 1) a \
                         packing may span"
                    )));
                }
            }
            if size[i] > MAX_SPAN {
                return Err(PackingError(format!(
                    "buffer {i}: size {} is more than the {MAX_SPAN} bytes (2^63 - 1) a packing may span",
                    size[i]
                )));
            }
        }
        Ok(Self { align_mask: alignment.iter().map(|a| a - 1).collect(), lower, upper, size, fixed })
    }

    /// Number of buffers.
    pub fn len(&self) -> usize {
        self.lower.len()
    }

    /// Whether there is no buffer.
    pub fn is_empty(&self) -> bool {
        self.lower.is_empty()
    }

    /// For each buffer, how many others are live at the same time: `n - 1` less those that end
    /// at or before its start and those that start at or after its end.
    pub fn overlap_counts(&self) -> Vec<u64> {
        let n = self.len();
        let mut lowers = self.lower.clone();
        let mut uppers = self.upper.clone();
        lowers.sort_unstable();
        uppers.sort_unstable();
        (0..n)
            .map(|i| {
                let ended = uppers.partition_point(|&u| u <= self.lower[i]);
                let later = n - lowers.partition_point(|&l| l < self.upper[i]);
                (n - 1 - ended - later) as u64
            })
            .collect()
    }

    /// The number of pairs of buffers live at the same time: all pairs less those where one
    /// ends at or before the other starts (each such pair counted once, from the later one).
    pub fn overlap_pairs(&self) -> u64 {
        let n = self.len() as u64;
        let mut lowers = self.lower.clone();
        let mut uppers = self.upper.clone();
        lowers.sort_unstable();
        uppers.sort_unstable();
        let mut apart: u64 = 0;
        let mut ended = 0usize;
        for &l in &lowers {
            while ended < uppers.len() && uppers[ended] <= l {
                ended += 1;
            }
            apart += ended as u64;
        }
        n * n.saturating_sub(1) / 2 - apart
    }

    /// Events of the sweeps over time: `(time, 0 for an end / 1 for a start, buffer)`, sorted,
    /// so that at one time the ends come first (ranges are half-open), then problem order.
    fn events(&self, keep: impl Fn(usize) -> bool) -> Vec<(i64, u8, u32)> {
        let mut events = Vec::with_capacity(2 * self.len());
        for i in (0..self.len()).filter(|&i| keep(i)) {
            events.push((self.upper[i], 0, i as u32));
            events.push((self.lower[i], 1, i as u32));
        }
        events.sort_unstable();
        events
    }

    /// The static lower bound on any packing's arena (the live bytes and alignment bounds of
    /// `npumem.plan.bounds`): the most bytes live at one time; and, for each alignment `g` of
    /// the problem and each time, over the buffers live then that are aligned to at least `g`
    /// (all at multiples of `g`): their sizes rounded up to `g`, less the largest padding that
    /// rounding added to one of them (the topmost buffer needs only its size).
    pub fn live_bound(&self) -> u64 {
        let events = self.events(|_| true);
        let mut alignments: Vec<u64> = self.align_mask.iter().map(|m| m + 1).collect();
        alignments.sort_unstable();
        alignments.dedup();
        let aligned = alignments.len() > 1 || alignments.first().is_some_and(|&a| a > 1);
        let class: Vec<usize> = if aligned {
            self.align_mask.iter().map(|m| alignments.binary_search(&(m + 1)).unwrap_or(0)).collect()
        } else {
            Vec::new()
        };
        // Per alignment `g` (by its index): the buffers live now aligned to at least `g`, their
        // count, their sizes rounded up to `g` (in 128 bits: a large alignment rounds every
        // small buffer up to it), and how many of them each padding has (rounded less size).
        let classes = if aligned { alignments.len() } else { 0 };
        let mut count = vec![0i64; classes];
        let mut rounded = vec![0i128; classes];
        let mut paddings: Vec<BTreeMap<u64, u32>> = vec![BTreeMap::new(); classes];
        let (mut live, mut most, mut best) = (0i128, 0i128, 0i128);
        for (k, &(time, kind, i)) in events.iter().enumerate() {
            let i = i as usize;
            let starts = kind == 1;
            let sign: i128 = if starts { 1 } else { -1 };
            let size = self.size[i];
            live += sign * i128::from(size);
            if aligned {
                for c in 0..=class[i] {
                    let g = alignments[c];
                    // A size is below 2^63, a multiple of every alignment: no overflow.
                    let padding = size.next_multiple_of(g) - size;
                    count[c] += sign as i64;
                    rounded[c] += sign * (i128::from(size) + i128::from(padding));
                    if starts {
                        *paddings[c].entry(padding).or_insert(0) += 1;
                    } else if let Some(n) = paddings[c].get_mut(&padding) {
                        *n -= 1;
                        if *n == 0 {
                            paddings[c].remove(&padding);
                        }
                    }
                }
            }
            if events.get(k + 1).is_some_and(|e| e.0 == time) {
                continue; // every event at this time first
            }
            most = most.max(live);
            for c in (0..classes).filter(|&c| count[c] > 0) {
                let largest = paddings[c].last_key_value().map_or(0, |(&p, _)| p);
                best = best.max(rounded[c] - i128::from(largest));
            }
        }
        // Sums of fewer than 2^32 values below 2^64 fit in 128 bits; a bound beyond 64 bits
        // (which no plan can meet) is cut to `u64::MAX`.
        most.max(best).min(i128::from(u64::MAX)) as u64
    }

    /// Two buffers live at the same time whose bytes `[offsets[i], offsets[i] + size)` overlap,
    /// as indices (the smaller first), or `None` when there are none. One sweep over time: the
    /// buffers live at each moment are kept ordered by offset, and each new one is compared
    /// with its two neighbours there.
    pub fn first_overlap(&self, offsets: &[u64]) -> Result<Option<(u32, u32)>, PackingError> {
        if offsets.len() != self.len() {
            return Err(PackingError(format!("{} offsets for {} buffers", offsets.len(), self.len())));
        }
        // Ends in 128 bits: an offset near the top of 64 bits still ends after it starts.
        let mut live: BTreeSet<(u128, u128, u32)> = BTreeSet::new();
        for (_, starts, i) in self.events(|_| true) {
            let at = u128::from(offsets[i as usize]);
            let key = (at, at + u128::from(self.size[i as usize]), i);
            if starts == 0 {
                live.remove(&key);
                continue;
            }
            let pair = |j: u32| Some((i.min(j), i.max(j)));
            if let Some(&(_, end, j)) = live.range(..key).next_back() {
                if end > key.0 {
                    return Ok(pair(j));
                }
            }
            if let Some(&(start, _, j)) = live.range(key..).next() {
                if start < key.1 {
                    return Ok(pair(j));
                }
            }
            live.insert(key);
        }
        Ok(None)
    }
}

/// Whole problems for the tests of the timeline's passes and of the placements.
#[cfg(test)]
pub(crate) mod samples {
    use super::Timeline;
    use crate::plan_search::test_instances::Rng;

    /// Whole problems for the timeline's passes: buffers as (lower, upper, size, alignment).
    pub(crate) fn timeline(buffers: &[(i64, i64, u64, u64)]) -> Timeline {
        Timeline::new(
            buffers.iter().map(|b| b.0).collect(),
            buffers.iter().map(|b| b.1).collect(),
            buffers.iter().map(|b| b.2).collect(),
            &buffers.iter().map(|b| b.3).collect::<Vec<_>>(),
            vec![None; buffers.len()],
        )
        .unwrap()
    }

    /// Random whole problems: times in -10..41, sizes 1..50, alignments 1 to 8.
    pub(crate) fn random(seed: u64, n: usize) -> Vec<(i64, i64, u64, u64)> {
        let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
        (0..n)
            .map(|_| {
                let lower = rng.below(40) as i64 - 10;
                let upper = lower + 1 + rng.below(12) as i64;
                (lower, upper, 1 + rng.below(50), 1 << rng.below(4))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::samples::{random, timeline};
    use super::*;
    use crate::plan_search::test_instances::Rng;

    fn overlaps(b: &[(i64, i64, u64, u64)], i: usize, j: usize) -> bool {
        b[i].0 < b[j].1 && b[j].0 < b[i].1
    }

    #[test]
    fn counts_and_pairs_match_the_pairs_listed() {
        for seed in 0..50 {
            let b = random(seed, 1 + seed as usize * 3);
            let t = timeline(&b);
            let counts: Vec<u64> =
                (0..b.len()).map(|i| (0..b.len()).filter(|&j| j != i && overlaps(&b, i, j)).count() as u64).collect();
            assert_eq!(t.overlap_counts(), counts);
            assert_eq!(t.overlap_pairs(), counts.iter().sum::<u64>() / 2);
        }
    }

    #[test]
    fn the_live_bound_is_the_most_bytes_live_at_one_time_without_alignment() {
        for seed in 0..50 {
            let b: Vec<_> = random(seed, 40).into_iter().map(|(l, u, s, _)| (l, u, s, 1)).collect();
            let most = (-10..60).map(|t| b.iter().filter(|x| x.0 <= t && t < x.1).map(|x| x.2).sum::<u64>()).max();
            assert_eq!(timeline(&b).live_bound(), most.unwrap());
        }
    }

    /// With alignments: at each time and for each alignment `g`, the buffers live then aligned
    /// to at least `g`, their sizes rounded up to `g` less the largest padding, computed
    /// directly; and never below the live bytes.
    #[test]
    fn the_live_bound_rounds_each_alignment_class_and_saves_the_largest_padding() {
        for seed in 0..100 {
            let b = random(seed, 30);
            let mut want = 0;
            for t in -10..60 {
                let live: Vec<_> = b.iter().filter(|x| x.0 <= t && t < x.1).collect();
                want = want.max(live.iter().map(|x| x.2).sum::<u64>());
                for g in [1u64, 2, 4, 8] {
                    let held: Vec<_> =
                        live.iter().filter(|x| x.3 >= g).map(|x| (x.2.next_multiple_of(g), x.2)).collect();
                    let largest = held.iter().map(|&(r, s)| r - s).max().unwrap_or(0);
                    want = want.max(held.iter().map(|&(r, _)| r).sum::<u64>().saturating_sub(largest));
                }
            }
            assert_eq!(timeline(&b).live_bound(), want, "seed {seed}");
        }
    }

    #[test]
    fn the_first_overlap_is_found_exactly_when_there_is_one() {
        for seed in 0..200 {
            let b = random(seed, 12);
            let mut rng = Rng(seed + 7);
            let offsets: Vec<u64> = (0..b.len()).map(|_| rng.below(200)).collect();
            let clash = (0..b.len()).any(|i| {
                (i + 1..b.len())
                    .any(|j| overlaps(&b, i, j) && offsets[i] < offsets[j] + b[j].2 && offsets[j] < offsets[i] + b[i].2)
            });
            let found = timeline(&b).first_overlap(&offsets).unwrap();
            assert_eq!(found.is_some(), clash, "seed {seed}");
            if let Some((i, j)) = found {
                let (i, j) = (i as usize, j as usize);
                assert!(i < j && overlaps(&b, i, j));
                assert!(offsets[i] < offsets[j] + b[j].2 && offsets[j] < offsets[i] + b[i].2);
            }
        }
    }

    #[test]
    fn an_overlap_near_the_top_of_the_offsets_is_found() {
        let t = Timeline::new(vec![0, 0], vec![1, 1], vec![10, 10], &[1, 1], vec![None, None]).unwrap();
        assert_eq!(t.first_overlap(&[u64::MAX, u64::MAX]).unwrap(), Some((0, 1)));
        assert_eq!(t.first_overlap(&[u64::MAX - 1, u64::MAX]).unwrap(), Some((0, 1)));
        assert_eq!(t.first_overlap(&[u64::MAX - 5, u64::MAX]).unwrap(), Some((0, 1)));
        assert_eq!(t.first_overlap(&[u64::MAX - 10, u64::MAX]).unwrap(), None);
        assert_eq!(t.first_overlap(&[u64::MAX - 20, u64::MAX - 10]).unwrap(), None);
    }

    #[test]
    fn bad_columns_are_refused() {
        let err = Timeline::new(vec![0], vec![0], vec![1], &[1], vec![None]).unwrap_err();
        assert!(err.0.contains("not above"), "{err}");
        let err = Timeline::new(vec![0], vec![1], vec![1], &[3], vec![None]).unwrap_err();
        assert!(err.0.contains("power of two"), "{err}");
        let err = Timeline::new(vec![0], vec![1], vec![1], &[4], vec![Some(2)]).unwrap_err();
        assert!(err.0.contains("multiple"), "{err}");
        let err = Timeline::new(vec![0], vec![1], vec![1 << 63], &[1], vec![None]).unwrap_err();
        assert!(err.0.contains("more than"), "{err}");
        let err = Timeline::new(vec![0], vec![1], vec![2], &[1], vec![Some(MAX_SPAN - 1)]).unwrap_err();
        assert!(err.0.contains("ends beyond"), "{err}");
    }

    #[test]
    fn buffers_that_need_more_than_64_bits_together_get_a_saturated_bound() {
        let t = Timeline::new(vec![0; 4], vec![1; 4], vec![MAX_SPAN; 4], &[1; 4], vec![None; 4]).unwrap();
        assert_eq!(t.live_bound(), u64::MAX);
        let t = Timeline::new(vec![0, 0], vec![1, 1], vec![1, 1], &[1 << 62, 1 << 62], vec![None; 2]).unwrap();
        assert_eq!(t.live_bound(), (1 << 62) + 1);
    }
}
