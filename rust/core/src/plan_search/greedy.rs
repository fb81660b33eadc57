//! The greedy placements of the lifetime planner over a whole [`Timeline`]: the rules
//! production runtimes use (buffers in a given order, each in the best or the lowest gap among
//! the placed buffers live with it) and the linear scan (buffers in order of their start, each
//! at the lowest free range at that moment). `npumem.plan.greedy` chooses the orders and keeps
//! the best result.
//!
//! The rules look at every placed buffer live with the one they place, but they never hold a
//! list of the pairs: [`OverlapIndex`] finds the buffers live with one as it is placed, in time
//! proportional to their number (those that start during its range come from the buffers
//! sorted by start; those live when it starts from a segment tree over time), with
//! O(n log n) memory.
//!
//! Offsets and ends saturate at `u64::MAX`: buffers that together need more than 64 bits
//! (each fits on its own, see [`Timeline::new`]) get a placement that ends beyond what a plan
//! addresses, which `npumem.plan` refuses, instead of offsets that wrapped around.

use std::time::Instant;

use crate::plan_search::free_ranges::FreeRanges;
use crate::plan_search::instance::align_up;
use crate::plan_search::timeline::Timeline;

/// Placements (or buffers looked at) between two looks at the clock.
const CHECK_EVERY: usize = 64;

/// The free ranges too short for it that the linear scan looks at for one buffer once its
/// deadline has passed.
pub const LATE_WALK: usize = 64;

/// Finds the buffers live at the same time as a given one without listing every pair.
///
/// Buffers are named by their *position* in the order of their start (`by_lower[p]` is the
/// buffer at position `p`): the buffers live with one start close to it in that order, so
/// that arrays kept by position are read from a few places in memory, not from all over.
pub struct OverlapIndex<'a> {
    timeline: &'a Timeline,
    /// Buffer indices sorted by `lower` (ties in problem order), their positions there, and
    /// their `lower` values in that order.
    pub by_lower: Vec<u32>,
    pub position: Vec<u32>,
    lower_sorted: Vec<i64>,
    /// For each position: the first position with the same start, and the tree leaf that
    /// starts at its start (leaf `k` is `[t_k, t_k+1)`, the distinct times sorted).
    tie_start: Vec<u32>,
    leaf: Vec<u32>,
    /// A segment tree over the leaves (`leaves` a power of two, node 1 the root): each buffer is
    /// stored at the nodes that cover its range exactly, as a compressed sparse row.
    leaves: usize,
    node_start: Vec<usize>,
    node_items: Vec<u32>,
}

impl<'a> OverlapIndex<'a> {
    /// Builds the index: O(n log n) time and memory.
    pub fn new(timeline: &'a Timeline) -> Self {
        let n = timeline.len();
        let mut by_lower: Vec<u32> = (0..n as u32).collect();
        by_lower.sort_unstable_by_key(|&i| (timeline.lower[i as usize], i));
        let lower_sorted = by_lower.iter().map(|&i| timeline.lower[i as usize]).collect();
        let mut position = vec![0u32; n];
        for (p, &i) in by_lower.iter().enumerate() {
            position[i as usize] = p as u32;
        }
        let mut times: Vec<i64> = timeline.lower.iter().chain(&timeline.upper).copied().collect();
        times.sort_unstable();
        times.dedup();
        let leaves = times.len().max(1).next_power_of_two();
        let rank = |t: i64| times.partition_point(|&x| x < t);
        let spans: Vec<(usize, usize)> =
            by_lower.iter().map(|&i| (rank(timeline.lower[i as usize]), rank(timeline.upper[i as usize]))).collect();
        let leaf = spans.iter().map(|&(a, _)| a as u32).collect();
        let mut tie_start = vec![0u32; n];
        for p in 1..n {
            tie_start[p] = if spans[p].0 == spans[p - 1].0 { tie_start[p - 1] } else { p as u32 };
        }
        drop(times);
        // Count, then fill, the nodes of each range.
        let mut node_start = vec![0usize; 2 * leaves + 1];
        for &(a, b) in &spans {
            for_each_cover(leaves, a, b, |node| node_start[node + 1] += 1);
        }
        for k in 1..node_start.len() {
            node_start[k] += node_start[k - 1];
        }
        let mut fill = node_start.clone();
        let mut node_items = vec![0u32; node_start[2 * leaves]];
        for (p, &(a, b)) in spans.iter().enumerate() {
            for_each_cover(leaves, a, b, |node| {
                node_items[fill[node]] = p as u32;
                fill[node] += 1;
            });
        }
        Self { timeline, by_lower, position, lower_sorted, tie_start, leaf, leaves, node_start, node_items }
    }

    /// Calls `visit` with the position of every buffer live at the same time as buffer `i`,
    /// each once: those that start in `[lower, upper)` of `i`, then those live across its
    /// start.
    ///
    /// # Panics
    ///
    /// If `i` is not the index of a buffer of the timeline.
    pub fn for_each_overlap(&self, i: usize, mut visit: impl FnMut(usize)) {
        let (lower, upper) = (self.timeline.lower[i], self.timeline.upper[i]);
        let own = self.position[i] as usize;
        let first = self.tie_start[own] as usize;
        // The end of the buffers that start before `upper`: a galloping search from `own`, as
        // it is most often close (the binary searches over all positions miss the cache).
        let after = &self.lower_sorted[own..];
        let mut step = 1;
        while step < after.len() && after[step] < upper {
            step *= 2;
        }
        let reach = (step / 2 + 1).min(after.len());
        let last = own + reach + after[reach..(step + 1).min(after.len())].partition_point(|&l| l < upper);
        for p in first..last {
            if p != own {
                visit(p);
            }
        }
        // Ranges covering the leaf that starts at `lower` hold it and end after it.
        let mut node = self.leaves + self.leaf[own] as usize;
        while node >= 1 {
            for &p in &self.node_items[self.node_start[node]..self.node_start[node + 1]] {
                if self.lower_sorted[p as usize] < lower {
                    visit(p as usize);
                }
            }
            node >>= 1;
        }
    }
}

/// Calls `f` with the nodes of a segment tree of `leaves` leaves that cover leaves `a..b`
/// exactly (at most two per level).
fn for_each_cover(leaves: usize, a: usize, b: usize, mut f: impl FnMut(usize)) {
    let (mut lo, mut hi) = (a + leaves, b + leaves);
    while lo < hi {
        if lo & 1 == 1 {
            f(lo);
            lo += 1;
        }
        if hi & 1 == 1 {
            hi -= 1;
            f(hi);
        }
        lo >>= 1;
        hi >>= 1;
    }
}

fn passed(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

/// Places the buffers in `order` (indices; pinned buffers are where they are pinned, and may be
/// left out of the order or appear in it), each in the best (`best_fit`: the smallest) or the
/// lowest gap among the buffers already placed that are live at the same time, at the lowest
/// aligned offset of that gap; a buffer that fits no gap goes on top of them. `None` when
/// `deadline` passes first (the clock is read every `CHECK_EVERY` (64) buffers, and every
/// million buffers looked at). Buffers neither pinned nor in `order` keep `u64::MAX`.
///
/// # Panics
///
/// If `order` holds an index that is not a buffer of the timeline.
pub fn place_in_order(
    timeline: &Timeline,
    order: &[u32],
    best_fit: bool,
    deadline: Option<Instant>,
) -> Option<Vec<u64>> {
    let index = OverlapIndex::new(timeline);
    // Where each placed buffer lies, by position (`u64::MAX`: not placed yet).
    let mut placed: Vec<(u64, u64)> = index
        .by_lower
        .iter()
        .map(|&i| timeline.fixed[i as usize].map_or((u64::MAX, 0), |o| (o, o + timeline.size[i as usize])))
        .collect();
    let mut occupied: Vec<(u64, u64)> = Vec::new();
    let mut looked = 0usize;
    for (count, &i) in order.iter().enumerate() {
        let i = i as usize;
        if (count % CHECK_EVERY == 0 || looked >= 1 << 20) && passed(deadline) {
            return None;
        }
        if looked >= 1 << 20 {
            looked = 0;
        }
        if timeline.fixed[i].is_some() {
            continue;
        }
        occupied.clear();
        index.for_each_overlap(i, |p| {
            looked += 1;
            if placed[p].0 != u64::MAX {
                occupied.push(placed[p]);
            }
        });
        occupied.sort_unstable();
        let (size, mask) = (timeline.size[i], timeline.align_mask[i]);
        let mut cursor = 0u64;
        let mut chosen: Option<(u64, u64)> = None; // (offset, gap)
        for &(start, end) in &occupied {
            if start > cursor {
                let aligned = align_up(cursor, mask);
                if aligned.saturating_add(size) <= start {
                    let gap = start - cursor;
                    if !best_fit {
                        chosen = Some((aligned, gap));
                        break;
                    }
                    if chosen.is_none_or(|(_, best)| gap < best) {
                        chosen = Some((aligned, gap));
                    }
                }
            }
            cursor = cursor.max(end);
        }
        let offset = chosen.map_or(align_up(cursor, mask), |(offset, _)| offset);
        placed[index.position[i] as usize] = (offset, offset.saturating_add(size));
    }
    let mut offsets = vec![u64::MAX; timeline.len()];
    for (p, &i) in index.by_lower.iter().enumerate() {
        offsets[i as usize] = placed[p].0;
    }
    Some(offsets)
}

/// Offsets as a runtime allocator would give them: the buffers that are not pinned in order of
/// their start (ends first at one time, then problem order), each at the lowest aligned free
/// range at that moment above every pinned buffer; a range is free again once its buffer ends.
/// The free ranges are kept by start and by length class (`free_ranges.rs`), so a buffer's
/// search skips the ranges too short to hold it, and the time is O(n log n) plus the ranges of
/// a buffer's own length class that it looks at and that do not hold it. Once `deadline` has
/// passed, a search looks at [`LATE_WALK`] such ranges at most, and then at the lowest range
/// of each longer class only: the buffer may go higher than the lowest range that holds it,
/// never on top of what is live while a free range surely holds it.
pub fn linear_scan(timeline: &Timeline, deadline: Option<Instant>) -> Vec<u64> {
    let n = timeline.len();
    let base = (0..n).filter_map(|i| timeline.fixed[i].map(|o| o + timeline.size[i])).max().unwrap_or(0);
    let mut offsets: Vec<u64> = timeline.fixed.iter().map(|f| f.unwrap_or(u64::MAX)).collect();
    let movable = |i: usize| timeline.fixed[i].is_none();
    let mut events = Vec::with_capacity(2 * n);
    for i in (0..n).filter(|&i| movable(i)) {
        events.push((timeline.upper[i], 0u8, i as u32));
        events.push((timeline.lower[i], 1u8, i as u32));
    }
    events.sort_unstable();
    let mut free = FreeRanges::new();
    let mut top = base;
    let mut misses = None;
    for (count, &(_, starts, i)) in events.iter().enumerate() {
        if misses.is_none() && count % CHECK_EVERY == 0 && passed(deadline) {
            misses = Some(LATE_WALK);
        }
        let i = i as usize;
        let size = timeline.size[i];
        if starts == 0 {
            free.free(offsets[i], offsets[i].saturating_add(size), &mut top);
            continue;
        }
        let mask = timeline.align_mask[i];
        if let Some(fit) = free.lowest_fit(size, mask, misses) {
            free.take(fit, size);
            offsets[i] = fit.start;
        } else {
            let start = align_up(top, mask);
            free.insert(top, start);
            offsets[i] = start;
            top = start.saturating_add(size);
        }
    }
    offsets
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan_search::test_instances::Rng;
    use crate::plan_search::timeline::samples::{random, timeline};

    #[test]
    fn the_index_finds_exactly_the_buffers_live_together() {
        for seed in 0..100 {
            let b = random(seed, 1 + seed as usize);
            let t = timeline(&b);
            let index = OverlapIndex::new(&t);
            for i in 0..b.len() {
                let mut found = Vec::new();
                index.for_each_overlap(i, |p| found.push(index.by_lower[p] as usize));
                found.sort_unstable();
                let want: Vec<usize> = (0..b.len()).filter(|&j| j != i && b[i].0 < b[j].1 && b[j].0 < b[i].1).collect();
                assert_eq!(found, want, "seed {seed}, buffer {i}");
            }
        }
    }

    fn valid(t: &Timeline, offsets: &[u64]) -> bool {
        offsets.iter().enumerate().all(|(i, &o)| o != u64::MAX && o & t.align_mask[i] == 0)
            && t.first_overlap(offsets).unwrap().is_none()
    }

    #[test]
    fn placements_are_valid_and_keep_pinned_buffers() {
        for seed in 0..100 {
            let b = random(seed, 30);
            let mut t = timeline(&b);
            // Pin a few buffers where they cannot clash: each above everything else.
            let mut rng = Rng(seed + 3);
            let mut high = 1 << 20;
            for i in 0..b.len() {
                if rng.below(5) == 0 {
                    t.fixed[i] = Some(high);
                    high += 1 << 10;
                }
            }
            let order: Vec<u32> = (0..b.len() as u32).rev().collect();
            for best_fit in [false, true] {
                let offsets = place_in_order(&t, &order, best_fit, None).unwrap();
                assert!(valid(&t, &offsets), "seed {seed}");
                assert!((0..b.len()).all(|i| t.fixed[i].is_none_or(|f| offsets[i] == f)));
            }
            let offsets = linear_scan(&t, None);
            assert!(valid(&t, &offsets), "seed {seed}");
            let late = linear_scan(&t, Some(Instant::now()));
            assert!(valid(&t, &late), "seed {seed}");
        }
    }

    /// The linear scan, range by range: a sorted list of the free ranges, each buffer in the
    /// first range in address order that holds it from an aligned start, else on top.
    fn scan_by_walking(t: &Timeline) -> Vec<u64> {
        let n = t.len();
        let mut top = (0..n).filter_map(|i| t.fixed[i].map(|o| o + t.size[i])).max().unwrap_or(0);
        let mut offsets: Vec<u64> = t.fixed.iter().map(|f| f.unwrap_or(u64::MAX)).collect();
        let mut events = Vec::new();
        for i in (0..n).filter(|&i| t.fixed[i].is_none()) {
            events.push((t.upper[i], 0u8, i));
            events.push((t.lower[i], 1u8, i));
        }
        events.sort_unstable();
        let mut free: Vec<(u64, u64)> = Vec::new();
        for (_, starts, i) in events {
            let size = t.size[i];
            if starts == 0 {
                free.push((offsets[i], offsets[i] + size));
                free.sort_unstable();
                let mut joined: Vec<(u64, u64)> = Vec::new();
                for r in free {
                    match joined.last_mut() {
                        Some(last) if last.1 == r.0 => last.1 = r.1,
                        _ => joined.push(r),
                    }
                }
                if joined.last().is_some_and(|r| r.1 == top) {
                    top = joined.pop().unwrap().0;
                }
                free = joined;
                continue;
            }
            let mask = t.align_mask[i];
            let fit = free.iter().position(|&(lo, hi)| align_up(lo, mask) + size <= hi);
            if let Some(k) = fit {
                let (lo, hi) = free.remove(k);
                let start = align_up(lo, mask);
                free.extend([(lo, start), (start + size, hi)].into_iter().filter(|r| r.0 < r.1));
                free.sort_unstable();
                offsets[i] = start;
            } else {
                let start = align_up(top, mask);
                if start > top {
                    free.push((top, start));
                }
                offsets[i] = start;
                top = start + size;
            }
        }
        offsets
    }

    #[test]
    fn the_linear_scan_takes_the_lowest_free_range_that_holds_each_buffer() {
        for seed in 0..300 {
            let b = random(seed, 1 + seed as usize % 120);
            let mut t = timeline(&b);
            let mut rng = Rng(seed + 11);
            for i in 0..b.len() {
                if rng.below(8) == 0 {
                    t.fixed[i] = Some(rng.below(64) * 8);
                }
            }
            // Pinned buffers may clash with each other here; the scan only keeps them.
            assert_eq!(linear_scan(&t, None), scan_by_walking(&t), "seed {seed}");
        }
    }

    #[test]
    fn a_late_linear_scan_still_uses_a_free_range_above_many_short_ones() {
        // At time 0: 200 pairs of one-byte buffers (one lives long, one ends at 1), a buffer of
        // 1000 bytes that ends at 2 and one byte above it that lives long. From 3, a buffer of
        // 1000 bytes: 200 free bytes lie below the range its predecessor left, one by one.
        let mut b: Vec<(i64, i64, u64, u64)> = Vec::new();
        for _ in 0..200 {
            b.extend([(0, 100, 1, 1), (0, 1, 1, 1)]);
        }
        b.extend([(0, 2, 1000, 1), (0, 100, 1, 1), (3, 4, 1000, 1)]);
        let t = timeline(&b);
        let on_time = linear_scan(&t, None);
        let late = linear_scan(&t, Some(Instant::now()));
        // The range the first one left, joined with the one-byte gap below it.
        assert_eq!(on_time[402], on_time[400] - 1);
        assert_eq!(late[402], on_time[402], "a late scan finds it too");
        assert!(valid(&t, &late));
    }

    #[test]
    fn a_passed_deadline_stops_the_rules_before_the_first_buffer() {
        let t = timeline(&random(1, 10));
        assert!(place_in_order(&t, &[0, 1, 2], true, Some(Instant::now())).is_none());
    }

    #[test]
    fn first_fit_takes_the_lowest_gap_and_best_fit_the_smallest() {
        // 0..10 and 30..40 live over [0, 4); 10..30 (20 bytes) free once `a` ends at 1, and
        // 40.. above; best fit puts 5 bytes in the 20-byte gap at 10 only if it is smallest.
        let b = [(0, 4, 10, 1), (0, 1, 20, 1), (0, 4, 10, 1), (2, 3, 5, 1)];
        let t = timeline(&b);
        let placed = place_in_order(&t, &[0, 1, 2], true, None).unwrap();
        assert_eq!(&placed[..3], &[0, 10, 30]);
        for best_fit in [false, true] {
            let offsets = place_in_order(&t, &[0, 1, 2, 3], best_fit, None).unwrap();
            assert_eq!(offsets[3], 10);
        }
    }

    #[test]
    fn placements_near_the_top_of_64_bits_saturate_instead_of_wrapping() {
        let big = (1u64 << 63) - 1;
        // Two bytes aligned to 2^62 fit: 0 and 2^62.
        let t = Timeline::new(vec![0, 0], vec![1, 1], vec![1, 1], &[1 << 62, 1 << 62], vec![None; 2]).unwrap();
        for best_fit in [false, true] {
            assert_eq!(place_in_order(&t, &[0, 1], best_fit, None).unwrap(), vec![0, 1 << 62]);
        }
        assert_eq!(linear_scan(&t, None), vec![0, 1 << 62]);
        // Four of 2^63 - 1 bytes live together need more than 64 bits: the last ones end at
        // `u64::MAX` rather than at a small offset that wrapped around.
        let t = Timeline::new(vec![0; 4], vec![1; 4], vec![big; 4], &[1; 4], vec![None; 4]).unwrap();
        for best_fit in [false, true] {
            let offsets = place_in_order(&t, &[0, 1, 2, 3], best_fit, None).unwrap();
            assert_eq!(&offsets[..2], &[0, big]);
            assert!(offsets[2..].iter().all(|&o| o >= big), "{offsets:?}");
        }
        let offsets = linear_scan(&t, None);
        assert_eq!(&offsets[..2], &[0, big]);
        assert!(offsets[2..].iter().all(|&o| o >= big), "{offsets:?}");
    }
}
