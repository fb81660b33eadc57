//! The free ranges of the linear scan ([`linear_scan`](super::greedy::linear_scan)): disjoint,
//! never touching, all below the top of what is placed. They are kept by start (to join a
//! range freed with the ones it touches) and by *length class*, the floor of the length's
//! base-2 logarithm (to find the lowest range that holds a buffer without walking the shorter
//! ones), with each class's lowest start at hand. Every change takes O(log n) steps. A search
//! takes a step per class, then walks, below the lowest range of the classes that surely hold
//! the buffer, the classes whose ranges may be too short for it (its own class up to the one
//! of its size plus its alignment): O(log n) for each, plus a step for each range there that
//! it looks at and that does not hold it.

use std::collections::{BTreeMap, BTreeSet};

use crate::plan_search::instance::align_up;

/// Length classes: one per bit of a 64-bit length.
const CLASSES: usize = 64;

/// The length class of `len` (at least 1).
fn class_of(len: u64) -> usize {
    debug_assert!(len > 0);
    63 - len.leading_zeros() as usize
}

/// Free ranges `[lo, hi)` of the linear scan (see the module's documentation).
pub(crate) struct FreeRanges {
    /// Every range's end, by its start.
    by_start: BTreeMap<u64, u64>,
    /// Every range as `(lo, hi)`, in its length class, in address order.
    by_class: Vec<BTreeSet<(u64, u64)>>,
    /// Each class's lowest start (`u64::MAX` when it has no range), and a bit per class that has
    /// a range.
    lowest: [u64; CLASSES],
    classes: u64,
}

/// Where a search found room: the range's start and the buffer's aligned start in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fit {
    pub(crate) range: u64,
    pub(crate) start: u64,
}

impl FreeRanges {
    pub(crate) fn new() -> FreeRanges {
        FreeRanges {
            by_start: BTreeMap::new(),
            by_class: (0..CLASSES).map(|_| BTreeSet::new()).collect(),
            lowest: [u64::MAX; CLASSES],
            classes: 0,
        }
    }

    /// Add `[lo, hi)`, which touches no other range (an empty one is not kept).
    pub(crate) fn insert(&mut self, lo: u64, hi: u64) {
        if lo < hi {
            let class = class_of(hi - lo);
            self.by_start.insert(lo, hi);
            self.by_class[class].insert((lo, hi));
            self.lowest[class] = self.lowest[class].min(lo);
            self.classes |= 1 << class;
        }
    }

    /// Take out the range that starts at `lo`; returns its end.
    fn remove(&mut self, lo: u64) -> u64 {
        let hi = self.by_start.remove(&lo).expect("a free range starts there");
        let class = class_of(hi - lo);
        self.by_class[class].remove(&(lo, hi));
        if self.lowest[class] == lo {
            match self.by_class[class].first() {
                Some(&(next, _)) => self.lowest[class] = next,
                None => {
                    self.lowest[class] = u64::MAX;
                    self.classes &= !(1 << class);
                }
            }
        }
        hi
    }

    /// Free `[lo, hi)` (a buffer's bytes, below `top`), joined with the ranges it touches; a
    /// range that reaches `top` lowers it instead of staying in the list.
    pub(crate) fn free(&mut self, lo: u64, hi: u64, top: &mut u64) {
        let (mut lo, mut hi) = (lo, hi);
        if let Some((&before, &end)) = self.by_start.range(..lo).next_back() {
            if end == lo {
                self.remove(before);
                lo = before;
            }
        }
        if self.by_start.contains_key(&hi) {
            hi = self.remove(hi);
        }
        if hi == *top {
            *top = lo;
        } else {
            self.insert(lo, hi);
        }
    }

    /// The lowest range that holds `size` bytes from a multiple of `mask + 1`, and the
    /// buffer's start there. Every range of a class whose shortest range holds the buffer even
    /// at the worst alignment (a *sure* class) holds it: the lowest of those is known without a
    /// search. Then each shorter class from `size`'s own up that has a range below the lowest
    /// found so far gives the first of its ranges in address order that holds the buffer, up
    /// to that lowest. With `misses`, at most that many ranges that do not hold it are looked
    /// at in all; once they are used up, each class is looked at only at its first range, so
    /// the answer may be a higher range than the lowest that holds the buffer, but never none
    /// while a sure class has a range.
    pub(crate) fn lowest_fit(&self, size: u64, mask: u64, mut misses: Option<usize>) -> Option<Fit> {
        // Every range of this class or a longer one holds the buffer: it is at least
        // `size + mask` long, and an aligned start is at most `mask` bytes into it.
        let sure = size.checked_add(mask).and_then(u64::checked_next_power_of_two).map_or(CLASSES, class_of);
        let from = |class: usize| if class >= CLASSES { 0 } else { self.classes & !((1u64 << class) - 1) };
        let mut best: Option<Fit> = None;
        let mut sure_classes = from(sure);
        while sure_classes != 0 {
            let c = sure_classes.trailing_zeros() as usize;
            sure_classes &= sure_classes - 1;
            if best.is_none_or(|b| self.lowest[c] < b.range) {
                best = Some(Fit { range: self.lowest[c], start: align_up(self.lowest[c], mask) });
            }
        }
        let mut classes = from(class_of(size)) & !from(sure);
        while classes != 0 {
            let c = classes.trailing_zeros() as usize;
            classes &= classes - 1;
            for &(lo, hi) in &self.by_class[c] {
                if best.is_some_and(|b| lo >= b.range) {
                    break;
                }
                let start = align_up(lo, mask);
                if start.saturating_add(size) <= hi {
                    best = Some(Fit { range: lo, start });
                    break;
                }
                match misses.as_mut() {
                    Some(0) => break,
                    Some(left) => *left -= 1,
                    None => {}
                }
            }
        }
        best
    }

    /// Place `size` bytes at `fit` (from [`FreeRanges::lowest_fit`]): the range's rest on
    /// either side stays free.
    pub(crate) fn take(&mut self, fit: Fit, size: u64) {
        let hi = self.remove(fit.range);
        self.insert(fit.start + size, hi);
        self.insert(fit.range, fit.start);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan_search::test_instances::Rng;

    /// The lowest range that holds the buffer, range by range in address order.
    fn reference(ranges: &[(u64, u64)], size: u64, mask: u64) -> Option<Fit> {
        ranges.iter().find_map(|&(lo, hi)| {
            let start = align_up(lo, mask);
            (start.saturating_add(size) <= hi).then_some(Fit { range: lo, start })
        })
    }

    #[test]
    fn the_lowest_fit_is_the_first_range_in_address_order_that_holds_the_buffer() {
        for seed in 0..200 {
            let mut rng = Rng(seed + 1);
            let mut free = FreeRanges::new();
            let mut ranges = Vec::new();
            let mut at = 0;
            for _ in 0..1 + rng.below(60) {
                at += 1 + rng.below(5000);
                let longest = if rng.below(4) == 0 { 40_000 } else { 3000 };
                let len = 1 + rng.below(longest);
                free.insert(at, at + len);
                ranges.push((at, at + len));
                at += len;
            }
            for _ in 0..50 {
                let size = 1 + rng.below(8000);
                let mask = (1u64 << rng.below(12)) - 1;
                let want = reference(&ranges, size, mask);
                assert_eq!(free.lowest_fit(size, mask, None), want, "seed {seed} size {size} mask {mask}");
                // With few looks allowed: a range that holds the buffer, never one that does
                // not, and never a lower one than the lowest.
                if let Some(got) = free.lowest_fit(size, mask, Some(2)) {
                    let hi = ranges.iter().find(|r| r.0 == got.range).expect("a range").1;
                    assert!(got.start & mask == 0 && got.start >= got.range && got.start + size <= hi);
                    assert!(want.is_some_and(|w| w.range <= got.range), "seed {seed}");
                }
            }
        }
    }

    #[test]
    fn frees_join_the_ranges_they_touch_and_lower_the_top() {
        let mut free = FreeRanges::new();
        let mut top = 100;
        free.insert(10, 20);
        free.insert(40, 50);
        free.free(20, 40, &mut top); // joins both
        assert_eq!(free.by_start.iter().map(|(&l, &h)| (l, h)).collect::<Vec<_>>(), vec![(10, 50)]);
        free.free(60, 100, &mut top); // reaches the top
        assert_eq!(top, 60);
        free.free(50, 60, &mut top); // joins (10, 50) and reaches the top
        assert_eq!(top, 10);
        assert!(free.by_start.is_empty() && free.by_class.iter().all(BTreeSet::is_empty));
        free.insert(0, 8);
        free.take(Fit { range: 0, start: 4 }, 2);
        assert_eq!(free.by_start.iter().map(|(&l, &h)| (l, h)).collect::<Vec<_>>(), vec![(0, 4), (6, 8)]);
        assert_eq!(free.lowest_fit(3, 0, None), Some(Fit { range: 0, start: 0 }));
        assert_eq!(free.lowest_fit(2, 3, None), Some(Fit { range: 0, start: 0 }));
        assert_eq!(free.lowest_fit(5, 0, None), None);
    }
}
