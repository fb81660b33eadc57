//! One depth-first run over canonical packings (see the module documentation of
//! `npumem.plan.search` for the rules and why they are sound).

use std::time::Instant;

use super::clock::Clock;
use super::instance::{align_up, PackingInstance};
use super::lowest::Lowest;

/// Stopping rules of one run.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest arena accepted; every packing found lowers it to one byte below that packing.
    pub capacity: u64,
    /// Stop at the first packing of at most this many bytes.
    pub target: u64,
    /// Stop after this many nodes (placements).
    pub node_limit: u64,
    /// Stop at this instant (read every few thousand buffers looked at).
    pub deadline: Option<Instant>,
}

/// What one run found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The whole tree was explored: no packing within the final capacity exists.
    pub exhausted: bool,
    /// The best packing found, offsets in buffer order.
    pub offsets: Option<Vec<u64>>,
    /// Its arena (0 when none was found).
    pub arena: u64,
    /// Nodes expanded.
    pub nodes: u64,
}

struct State<'a> {
    inst: &'a PackingInstance,
    rank: &'a [u32],
    floor_max: Vec<u64>,
    placed: Vec<bool>,
    offsets: Vec<u64>,
    floor: Vec<u64>,
    rem: Vec<u64>,
    last: u64,
    prev: usize,
    top: u64,
    lowest: Lowest,
}

const NONE: usize = usize::MAX;

/// Children of a node: (offset, rank, buffer), sorted.
type Children = Vec<(u64, u32, u32)>;

impl State<'_> {
    /// Children of the current node, sorted by (offset, rank), into `out`; `false` prunes.
    fn candidates(&mut self, capacity: u64, out: &mut Children) -> bool {
        out.clear();
        let inst = self.inst;
        let n = inst.len();
        let last = self.last;
        self.lowest.reset();
        let (mut end1, mut end1_q, mut end2) = (u64::MAX, NONE, u64::MAX);
        for q in 0..n {
            if self.placed[q] {
                continue;
            }
            let r = inst.raw_offset(q, self.floor_max[q]);
            let size = inst.sizes[q];
            let end = r + size;
            if end <= last {
                return false; // it fits below every later buffer: not canonical
            }
            if end < end1 {
                end2 = end1;
                end1 = end;
                end1_q = q;
            } else if end < end2 {
                end2 = end;
            }
            let lowest_offset = if r < last {
                // Dead for now: it must rest on a buffer live with it placed at >= last.
                let support = inst.smallest_unplaced_neighbor(q, &self.placed);
                match support {
                    Some(s) => align_up(last.saturating_add(s), inst.align_mask[q]),
                    None => return false,
                }
            } else {
                r
            };
            if lowest_offset.saturating_add(size) > capacity {
                return false;
            }
            self.lowest.chmin(inst.sec_lo[q] as usize, inst.sec_hi[q] as usize, lowest_offset);
            if r < last || (r == last && self.prev != NONE && self.rank[q] < self.rank[self.prev]) {
                continue;
            }
            out.push((r, self.rank[q], q as u32));
        }
        self.lowest.finish();
        for s in 0..inst.n_sections {
            let low = self.lowest.leaf(s);
            if low != u64::MAX && low.saturating_add(self.rem[s]) > capacity {
                return false;
            }
        }
        out.sort_unstable();
        out.retain(|&(r, _, q)| r < if q as usize == end1_q { end2 } else { end1 });
        if let Some(cut) = self.first_without_room(capacity, out) {
            out.truncate(cut);
        }
        if let Some(&(_, _, q0)) = out.first() {
            let hatless = inst.neighbors(q0 as usize).iter().all(|&x| self.placed[x as usize]);
            if hatless {
                out.truncate(1); // nothing can go on top of it: placing it now is never worse
            }
        }
        true
    }
}

impl State<'_> {
    /// The first child (sorted by offset) whose offset `r` leaves some section too little room:
    /// every later placement starts at `r` or above, so in each section whose floor is not above
    /// `r` the buffers still to place must fit between `r` and the capacity. Every later child
    /// starts at least as high and fails too.
    fn first_without_room(&self, capacity: u64, children: &Children) -> Option<usize> {
        let mut checked = None;
        for (k, &(r, _, _)) in children.iter().enumerate() {
            if checked.is_some_and(|c| r <= c) {
                continue;
            }
            let room = capacity.saturating_sub(r);
            if !(0..self.inst.n_sections).all(|s| self.rem[s] <= room || self.floor[s] > r) {
                return Some(k);
            }
            checked = Some(r);
        }
        None
    }
}

struct Undo {
    q: usize,
    last: u64,
    prev: usize,
    top: u64,
    floor_mark: usize,
    raised_mark: usize,
}

/// Runs one depth-first search over canonical packings of `inst`, with children that share an
/// offset ordered by `rank` (smaller first). See [`Limits`] for when it stops.
///
/// # Panics
///
/// If `rank` does not have one entry per buffer.
pub fn search(inst: &PackingInstance, rank: &[u32], limits: &Limits) -> Outcome {
    let n = inst.len();
    assert_eq!(rank.len(), n, "one rank per buffer");
    let mut st = State {
        inst,
        rank,
        floor_max: vec![0; n],
        placed: vec![false; n],
        offsets: vec![0; n],
        floor: vec![0; inst.n_sections],
        rem: vec![0; inst.n_sections],
        last: 0,
        prev: NONE,
        top: 0,
        lowest: Lowest::new(0, inst.n_sections),
    };
    for q in 0..n {
        for s in inst.sec_lo[q]..inst.sec_hi[q] {
            st.rem[s as usize] += inst.sizes[q];
        }
    }
    // No canonical packing ends above the span: a larger capacity is the same search, and
    // keeping it within the span keeps every sum below 2^64.
    let mut capacity = limits.capacity.min(inst.span);
    let mut best: Option<Vec<u64>> = None;
    let mut best_arena = 0;
    let mut nodes: u64 = 0;
    if n == 0 {
        return Outcome { exhausted: false, offsets: Some(Vec::new()), arena: 0, nodes };
    }
    // frames[d]: the children of depth d and the next one to try; spare lists are reused.
    let mut frames: Vec<(Children, usize)> = Vec::new();
    let mut spare: Vec<Children> = Vec::new();
    let mut undo: Vec<Undo> = Vec::new();
    let mut floor_trail: Vec<u64> = Vec::new();
    let mut raised_trail: Vec<(u32, u64)> = Vec::new();
    let mut first = Vec::new();
    if !st.candidates(capacity, &mut first) {
        return Outcome { exhausted: true, offsets: None, arena: 0, nodes: 1 };
    }
    frames.push((first, 0));
    let mut clock = Clock::new(limits.deadline);
    while !frames.is_empty() {
        // Undo the placement made from this frame's previous child, if any.
        if undo.len() == frames.len() {
            let u = undo.pop().expect("one undo record per placed child");
            let q = u.q;
            st.placed[q] = false;
            let (lo, hi) = (inst.sec_lo[q] as usize, inst.sec_hi[q] as usize);
            for (k, s) in (lo..hi).enumerate() {
                st.floor[s] = floor_trail[u.floor_mark + k];
                st.rem[s] += inst.sizes[q];
            }
            floor_trail.truncate(u.floor_mark);
            for &(x, old) in &raised_trail[u.raised_mark..] {
                st.floor_max[x as usize] = old;
            }
            raised_trail.truncate(u.raised_mark);
            st.last = u.last;
            st.prev = u.prev;
            st.top = u.top;
        }
        let (cands, pos) = frames.last_mut().expect("frame present");
        if *pos >= cands.len() {
            let (list, _) = frames.pop().expect("frame present");
            spare.push(list);
            continue;
        }
        if nodes >= limits.node_limit || clock.passed(n) {
            return Outcome { exhausted: false, offsets: best, arena: best_arena, nodes };
        }
        let (r, _, q) = cands[*pos];
        *pos += 1;
        let q = q as usize;
        let size = inst.sizes[q];
        if r + size > capacity {
            continue; // the capacity dropped since this frame was built
        }
        nodes += 1;
        let end = r + size;
        let mark = Undo {
            q,
            last: st.last,
            prev: st.prev,
            top: st.top,
            floor_mark: floor_trail.len(),
            raised_mark: raised_trail.len(),
        };
        for s in inst.sec_lo[q] as usize..inst.sec_hi[q] as usize {
            floor_trail.push(st.floor[s]);
            st.floor[s] = end;
            st.rem[s] -= size;
        }
        for &x in inst.neighbors(q) {
            let x = x as usize;
            if !st.placed[x] && st.floor_max[x] < end {
                raised_trail.push((x as u32, st.floor_max[x]));
                st.floor_max[x] = end;
            }
        }
        st.placed[q] = true;
        st.offsets[q] = r;
        undo.push(mark);
        st.last = r;
        st.prev = q;
        st.top = st.top.max(end);
        if undo.len() == n {
            best = Some(st.offsets.clone());
            best_arena = st.top;
            if st.top <= limits.target {
                return Outcome { exhausted: false, offsets: best, arena: best_arena, nodes };
            }
            capacity = st.top - 1;
            continue;
        }
        let mut children = spare.pop().unwrap_or_default();
        if st.candidates(capacity, &mut children) {
            frames.push((children, 0));
        } else {
            spare.push(children);
        }
    }
    Outcome { exhausted: true, offsets: best, arena: best_arena, nodes }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan_search::decide::{decide, Key, Order, Verdict};
    use crate::plan_search::instance::MAX_SPAN;
    use crate::plan_search::test_instances::{instance, random_buffers, Rng};

    fn limits(capacity: u64, target: u64) -> Limits {
        Limits { capacity, target, node_limit: u64::MAX, deadline: None }
    }

    #[test]
    fn minimalloc_example_reaches_12() {
        // input.12.csv of the MiniMalloc repository, in unit time steps.
        let inst = instance(&[(0, 3, 4), (3, 9, 4), (0, 9, 4), (9, 21, 4), (0, 21, 4)]);
        let out = search(&inst, &[0, 1, 2, 3, 4], &limits(100, 12));
        assert_eq!(out.arena, 12);
        let out = search(&inst, &[4, 3, 2, 1, 0], &limits(11, 0));
        assert!(out.exhausted);
        assert!(out.offsets.is_none());
    }

    #[test]
    fn minimizing_proves_optimum() {
        // A staircase whose optimum (7) is above the live-bytes bound (6).
        let inst = instance(&[(0, 2, 3), (1, 3, 3), (2, 4, 3), (0, 4, 1)]);
        let out = search(&inst, &[0, 1, 2, 3], &limits(u64::MAX / 2, 0));
        assert!(out.exhausted);
        let offsets = out.offsets.expect("a packing");
        assert_eq!(out.arena, 7);
        assert_eq!(offsets.len(), 4);
    }

    #[test]
    fn obstacles_and_alignment_are_respected() {
        let neighbors = vec![vec![1], vec![0]];
        let inst = PackingInstance::new(
            vec![10, 10],
            &[16, 1],
            vec![0, 0],
            vec![1, 1],
            1,
            &neighbors,
            &[vec![(0, 5)], vec![(0, 5)]],
        )
        .expect("valid");
        let out = search(&inst, &[0, 1], &limits(1000, 0));
        let offsets = out.offsets.expect("a packing");
        assert_eq!(offsets[0] % 16, 0);
        assert!(offsets.iter().all(|&o| o >= 5));
        assert_eq!(out.arena, 26); // [5, 15) then [16, 26)
    }

    #[test]
    fn minimum_agrees_with_the_plain_decision_search() {
        // The descent run proves its arena optimal; the plain decision search (no forced
        // sections, no room cutoff) must fit that arena and not one byte less.
        let mut rng = Rng(0x5851_f42d_4c95_7f2d);
        for _ in 0..300 {
            let n = 3 + rng.below(7) as usize;
            let buffers = random_buffers(&mut rng, n, 6);
            let inst = instance(&buffers);
            let rank: Vec<u32> = (0..n as u32).collect();
            let out = search(&inst, &rank, &limits(u64::MAX / 2, 0));
            assert!(out.exhausted && out.offsets.is_some(), "{buffers:?}");
            let plain = |capacity| {
                let order = Order {
                    forced_sections: false,
                    room_cutoff: false,
                    ..Order::new(vec![Key::Width, Key::Area, Key::Total], vec![1; n], rank.clone())
                };
                decide(&inst, &order, capacity, u64::MAX, None).verdict
            };
            assert_eq!(plain(out.arena), Verdict::Found, "{buffers:?} at {}", out.arena);
            assert_eq!(plain(out.arena - 1), Verdict::Exhausted, "{buffers:?} below {}", out.arena);
        }
    }

    #[test]
    fn bad_instances_are_refused() {
        assert!(PackingInstance::new(vec![0], &[1], vec![0], vec![1], 1, &[vec![]], &[vec![]]).is_err());
        assert!(PackingInstance::new(vec![1], &[3], vec![0], vec![1], 1, &[vec![]], &[vec![]]).is_err());
        assert!(PackingInstance::new(vec![1], &[1], vec![1], vec![1], 1, &[vec![]], &[vec![]]).is_err());
        assert!(PackingInstance::new(vec![1], &[1], vec![0], vec![1], 1, &[vec![0]], &[vec![]]).is_err());
    }

    #[test]
    fn alignments_near_the_top_of_the_bound_pack_without_overflow() {
        // Two bytes aligned to 2^62, live together: 0 and 2^62, though the sizes and the
        // padding add up to 2^63.
        let both = [vec![1], vec![0]];
        let inst =
            PackingInstance::new(vec![1, 1], &[1 << 62, 1 << 62], vec![0, 0], vec![1, 1], 1, &both, &[vec![], vec![]])
                .unwrap();
        let limits = Limits { capacity: u64::MAX, target: 0, node_limit: u64::MAX, deadline: None };
        let out = search(&inst, &[0, 1], &limits);
        assert_eq!((out.exhausted, out.arena), (true, (1 << 62) + 1));
        let mut offsets = out.offsets.unwrap();
        offsets.sort_unstable();
        assert_eq!(offsets, vec![0, 1 << 62]);
        let order = Order::new(vec![Key::Width], vec![1, 1], vec![0, 1]);
        assert_eq!(decide(&inst, &order, MAX_SPAN, u64::MAX, None).verdict, Verdict::Found);
        assert_eq!(decide(&inst, &order, 1 << 62, u64::MAX, None).verdict, Verdict::Exhausted);
        // Two aligned to 2^63: one at 0, the other's only place, 2^63, beyond the bound.
        let inst =
            PackingInstance::new(vec![8, 8], &[1 << 63, 1 << 63], vec![0, 0], vec![1, 1], 1, &both, &[vec![], vec![]])
                .unwrap();
        let out = search(&inst, &[0, 1], &limits);
        assert!(out.exhausted && out.offsets.is_none());
        assert_eq!(decide(&inst, &order, u64::MAX, u64::MAX, None).verdict, Verdict::Exhausted);
        // A pinned buffer up to the bound above both: each must fit below it.
        let near = [vec![(MAX_SPAN - 4, MAX_SPAN)], vec![(MAX_SPAN - 4, MAX_SPAN)]];
        let inst =
            PackingInstance::new(vec![1, 1], &[1 << 62, 1 << 62], vec![0, 0], vec![1, 1], 1, &both, &near).unwrap();
        let out = search(&inst, &[0, 1], &limits);
        assert_eq!(out.arena, (1 << 62) + 1);
    }

    #[test]
    fn an_instance_at_the_bound_packs_without_overflow_at_any_capacity() {
        let half = MAX_SPAN / 2;
        let inst = PackingInstance::new(
            vec![half, half],
            &[1, 1],
            vec![0, 0],
            vec![1, 1],
            1,
            &[vec![1], vec![0]],
            &[vec![], vec![]],
        )
        .unwrap();
        let limits = Limits { capacity: u64::MAX, target: 0, node_limit: u64::MAX, deadline: None };
        let out = search(&inst, &[0, 1], &limits);
        assert_eq!((out.offsets, out.arena), (Some(vec![0, half]), 2 * half));
        for capacity in [u64::MAX, MAX_SPAN] {
            let order = Order::new(vec![Key::Size], vec![1, 1], vec![0, 1]);
            let found = decide(&inst, &order, capacity, u64::MAX, None);
            assert_eq!((found.verdict, found.offsets), (Verdict::Found, Some(vec![0, half])));
        }
        let order = Order::new(vec![Key::Size], vec![1, 1], vec![0, 1]);
        assert_eq!(decide(&inst, &order, 2 * half - 1, u64::MAX, None).verdict, Verdict::Exhausted);
        // Three buffers live together, each at most a third of the bound: every lower bound of
        // the searches (an offset, a support and a size) stays a true bound.
        let third = MAX_SPAN / 3;
        let neighbors = [vec![1, 2], vec![0, 2], vec![0, 1]];
        let inst = PackingInstance::new(
            vec![third; 3],
            &[1; 3],
            vec![0; 3],
            vec![1; 3],
            1,
            &neighbors,
            &[vec![], vec![], vec![]],
        )
        .unwrap();
        let out = search(&inst, &[0, 1, 2], &limits);
        assert_eq!((out.exhausted, out.arena), (true, 3 * third));
        let order = Order::new(vec![Key::Size], vec![1; 3], vec![0, 1, 2]);
        assert_eq!(decide(&inst, &order, u64::MAX, u64::MAX, None).verdict, Verdict::Found);
        assert_eq!(decide(&inst, &order, 3 * third - 1, u64::MAX, None).verdict, Verdict::Exhausted);
    }
}
