//! The decision search: does a component fit within a capacity? Depth-first over canonical
//! packings, split into independent parts whenever the buffers placed so far cut time apart
//! (see the module documentation of `npumem.plan.search` for the rules and why they are sound).

use std::collections::HashMap;
use std::time::Instant;

use super::clock::Clock;
use super::instance::{align_up, PackingInstance};
use super::lowest::Lowest;

/// What [`decide`] concluded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A packing within the capacity was found.
    Found,
    /// The whole tree was explored: no packing within the capacity exists.
    Exhausted,
    /// The node limit or the deadline stopped the run first.
    Stopped,
}

/// The result of one decision run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub verdict: Verdict,
    /// The packing, offsets in buffer order, when the verdict is [`Verdict::Found`].
    pub offsets: Option<Vec<u64>>,
    /// Nodes expanded.
    pub nodes: u64,
}

/// A key of the order in which children that share an offset are tried, largest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// Time steps the buffer is live (given in [`Order::widths`]).
    Width,
    /// Width times size.
    Area,
    /// The most bytes still to place in one of the buffer's sections, counted when a part starts.
    Total,
    /// Size in bytes.
    Size,
    /// Number of sections the buffer is live in.
    Sections,
    /// Alignment in bytes.
    Alignment,
}

impl Key {
    /// The key of one letter of MiniMalloc's notation, `W`, `A`, `T`, `Z` or `C`, or `G` (the
    /// alignment, which MiniMalloc's orders do not use).
    pub fn from_letter(letter: char) -> Option<Self> {
        match letter {
            'W' => Some(Self::Width),
            'A' => Some(Self::Area),
            'T' => Some(Self::Total),
            'Z' => Some(Self::Size),
            'C' => Some(Self::Sections),
            'G' => Some(Self::Alignment),
            _ => None,
        }
    }
}

/// The order of children at one offset: `keys` compared in turn (largest first), then `rank`
/// (smallest first). Every part that the search splits off is ordered afresh.
#[derive(Debug, Clone)]
pub struct Order {
    pub keys: Vec<Key>,
    /// Time steps each buffer is live.
    pub widths: Vec<u64>,
    /// The last tie-break, one distinct value per buffer.
    pub rank: Vec<u32>,
    /// Branch on forced sections (see the module documentation of `npumem.plan.search`): on by
    /// default; off only to measure the rule or to check it against the plain search.
    pub forced_sections: bool,
    /// Of the forced sections, take one that the first child in this order covers (when there
    /// is one) instead of the one with the fewest children: the two choices fail on different
    /// instances, so the schedule runs orders of both kinds.
    pub follow_order: bool,
    /// Stop a node's children at the first offset that leaves some section too little room
    /// (see `Decider::room_above`): on by default; off only to check it against the plain search.
    pub room_cutoff: bool,
}

impl Order {
    /// An order by `keys`, then `rank`, with every rule on.
    pub fn new(keys: Vec<Key>, widths: Vec<u64>, rank: Vec<u32>) -> Self {
        Self { keys, widths, rank, forced_sections: true, follow_order: false, room_cutoff: true }
    }
}

/// A set of unplaced buffers that no unplaced buffer outside it is live with, over the sections
/// `lo .. hi`.
struct Part {
    buffers: Vec<u32>,
    lo: usize,
    hi: usize,
}

/// How a subtree ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Status {
    Found,
    NotFound,
    Stopped,
}

struct Decider<'a> {
    inst: &'a PackingInstance,
    order: &'a Order,
    /// Position of each buffer in the order of its current part.
    rank: Vec<u32>,
    capacity: u64,
    node_limit: u64,
    clock: Clock,
    nodes: u64,
    placed: Vec<bool>,
    solution: Vec<u64>,
    /// Highest end of a placed buffer live with each buffer.
    floor_max: Vec<u64>,
    /// Sum of the sizes of the unplaced buffers live in each section.
    rem: Vec<u64>,
    /// Number of unplaced buffers live in both section `s` and `s + 1`.
    cuts: Vec<u32>,
    /// Highest end of a placed buffer live in each section (0 when none).
    floor: Vec<u64>,
    /// Scratch: per section, the number of children that can start at the lowest level.
    cover: Vec<i32>,
    /// Saved floors of the sections of each placement on the current branch, in order.
    floor_trail: Vec<u64>,
    /// Saved `floor_max` of the buffers each placement on the current branch raised.
    raised_trail: Vec<(u32, u64)>,
    /// Whether to branch on the most constrained full section (see [`Decider::forced_section`]).
    forced: bool,
    /// Parts already decided, by [`Decider::part_key`]: the packing found (offsets in the
    /// order of the part's buffers) or `None` when the part cannot be packed.
    memo: HashMap<Vec<u64>, Option<Vec<u64>>>,
    memo_words: usize,
    /// Scratch of [`Decider::room_beside`]: neighbours of the child's buffer (`mark == stamp`)
    /// and the lowest start per section.
    mark: Vec<u32>,
    stamp: u32,
    window: Vec<u64>,
}

/// Words of part keys and packings kept in the memo before it is cleared.
const MEMO_WORDS: usize = 1 << 24;

impl Decider<'_> {
    /// Solves every part of `sections lo..hi` that the unplaced `buffers` split into, one after
    /// the other; any part that cannot be packed fails the whole.
    /// Every part continues the canonical order after the placement at `last` by `prev`.
    fn solve_parts(&mut self, buffers: &[u32], lo: usize, hi: usize, last: u64, prev: Option<u32>) -> Status {
        // Splitting into parts and ordering them looks at every buffer: at thousands of buffers
        // that is most of a node's time, so the deadline counts it too.
        if self.clock.passed(buffers.len()) {
            return Status::Stopped;
        }
        let mut start = lo;
        for s in lo..hi {
            let cut_here = s + 1 == hi || self.cuts[s] == 0;
            if !cut_here {
                continue;
            }
            let (a, b) = (start, s + 1);
            start = s + 1;
            let members: Vec<u32> = buffers
                .iter()
                .copied()
                .filter(|&q| {
                    let q = q as usize;
                    !self.placed[q] && (self.inst.sec_lo[q] as usize) < b && a < self.inst.sec_hi[q] as usize
                })
                .collect();
            if members.is_empty() {
                continue;
            }
            let key = self.part_key(&members, last);
            match self.memo.get(&key) {
                Some(Some(found)) => {
                    for (&q, &offset) in members.iter().zip(found) {
                        self.solution[q as usize] = offset;
                    }
                    continue;
                }
                Some(None) => return Status::NotFound,
                None => {}
            }
            let saved: Vec<u32> = members.iter().map(|&q| self.rank[q as usize]).collect();
            self.rerank(&members);
            let part = Part { buffers: members, lo: a, hi: b };
            let mut lows = (Lowest::new(a, b - a), Lowest::new(a, b - a));
            // Ranks start afresh: children at the offset `last` may come in any order.
            let status = self.dfs(&part, &mut lows, last, if self.order.keys.is_empty() { prev } else { None });
            if status == Status::Stopped {
                // The run is over and its ranks are dropped: restoring them at every level on
                // the way up took tens of milliseconds past the deadline at thousands of buffers.
                return status;
            }
            for (&q, &r) in part.buffers.iter().zip(&saved) {
                self.rank[q as usize] = r;
            }
            let found = (status == Status::Found)
                .then(|| part.buffers.iter().map(|&q| self.solution[q as usize]).collect::<Vec<u64>>());
            self.remember(key, found);
            if status != Status::Found {
                return status;
            }
        }
        Status::Found
    }

    /// What decides a part's fate: its buffers, the floor of each, and the last offset placed.
    /// Placed buffers act on a part only through the floors of its buffers.
    fn part_key(&self, members: &[u32], last: u64) -> Vec<u64> {
        let mut key = Vec::with_capacity(2 * members.len() + 1);
        key.push(last);
        for &q in members {
            key.push(u64::from(q));
            key.push(self.floor_max[q as usize]);
        }
        key
    }

    fn remember(&mut self, key: Vec<u64>, found: Option<Vec<u64>>) {
        let words = key.len() + found.as_ref().map_or(0, Vec::len);
        if self.memo_words + words > MEMO_WORDS {
            self.memo.clear();
            self.memo_words = 0;
        }
        self.memo_words += words;
        self.memo.insert(key, found);
    }

    /// Orders the buffers of a new part by [`Order::keys`], then by [`Order::rank`].
    fn rerank(&mut self, members: &[u32]) {
        let keys = &self.order.keys;
        if keys.is_empty() {
            return;
        }
        let inst = self.inst;
        let value = |key: Key, q: usize, total: u64| -> u64 {
            match key {
                Key::Width => self.order.widths[q],
                Key::Area => self.order.widths[q].saturating_mul(inst.sizes[q]),
                Key::Total => total,
                Key::Size => inst.sizes[q],
                Key::Sections => u64::from(inst.sec_hi[q] - inst.sec_lo[q]),
                Key::Alignment => inst.align_mask[q] + 1,
            }
        };
        let with_total = keys.contains(&Key::Total);
        let mut sorted: Vec<(u32, u64)> = members
            .iter()
            .map(|&q| {
                let qi = q as usize;
                let total = if with_total {
                    (inst.sec_lo[qi]..inst.sec_hi[qi]).map(|s| self.rem[s as usize]).max().unwrap_or(0)
                } else {
                    0
                };
                (q, total)
            })
            .collect();
        sorted.sort_unstable_by(|&(a, ta), &(b, tb)| {
            let (a, b) = (a as usize, b as usize);
            for &key in keys {
                let ord = value(key, b, tb).cmp(&value(key, a, ta));
                if ord.is_ne() {
                    return ord;
                }
            }
            self.order.rank[a].cmp(&self.order.rank[b])
        });
        for (position, &(q, _)) in sorted.iter().enumerate() {
            self.rank[q as usize] = position as u32;
        }
    }

    /// The lowest level any buffer of `part` can still start at: the least, over the sections
    /// with buffers still to place, of their floor or `last` when that is higher.
    fn level(&self, part: &Part, last: u64) -> u64 {
        (part.lo..part.hi).filter(|&s| self.rem[s] > 0).map(|s| self.floor[s].max(last)).min().unwrap_or(u64::MAX)
    }

    /// A *forced* section of `part`: one at the lowest `level` where, if no buffer started at
    /// that level, the lowest a buffer still to place could start (`above`: the least, over
    /// the section's buffers, of their raw offset when it is above the level, else the level
    /// plus the smallest buffer still to place that is live with it, on which it would rest)
    /// leaves too little room for the section's buffers still to place. One of them must start
    /// at the level, and since offsets never decrease along a branch it can be placed next: the
    /// children reduce to the buffers that start at the level and cover the section. Of the
    /// forced sections, the one with the fewest such children is returned (`None`: none), or
    /// with [`Order::follow_order`] the first that the order's first child at the level covers.
    fn forced_section(
        &mut self,
        part: &Part,
        last: u64,
        level: u64,
        above: &Lowest,
        children: &[(u64, u32, u32)],
    ) -> Option<usize> {
        let capacity = self.capacity;
        let forced = |d: &Self, s: usize| {
            d.rem[s] > 0 && d.floor[s].max(last) == level && above.leaf(s).saturating_add(d.rem[s]) > capacity
        };
        if !(part.lo..part.hi).any(|s| forced(self, s)) {
            return None;
        }
        let inst = self.inst;
        self.cover[part.lo..=part.hi].fill(0);
        for &(r, _, q) in children {
            if r == level {
                self.cover[inst.sec_lo[q as usize] as usize] += 1;
                self.cover[inst.sec_hi[q as usize] as usize] -= 1;
            }
        }
        let mut best: Option<(i32, usize)> = None;
        let mut running = 0;
        let first = if self.order.follow_order {
            children.iter().filter(|c| c.0 == level).min_by_key(|c| c.1).map(|c| c.2 as usize)
        } else {
            None
        };
        for s in part.lo..part.hi {
            running += self.cover[s];
            if forced(self, s) {
                if let Some(f) = first {
                    if (inst.sec_lo[f] as usize) <= s && s < inst.sec_hi[f] as usize {
                        return Some(s);
                    }
                }
                if best.is_none_or(|(count, _)| running < count) {
                    best = Some((running, s));
                }
            }
        }
        best.map(|(_, s)| s)
    }

    /// Whether a placement at offset `r` leaves room for the buffers still to place: every
    /// placement after it starts at `r` or above, so in every section of `part` whose floor is
    /// not above `r` the buffers still to place must fit between `r` and the capacity. False at
    /// `r` means false at every higher offset, which lets a node stop at its first child that
    /// fails it instead of expanding each child to find out.
    fn room_above(&self, part: &Part, r: u64) -> bool {
        let room = self.capacity.saturating_sub(r);
        (part.lo..part.hi).all(|s| self.rem[s] <= room || self.floor[s] > r)
    }

    /// Whether the child that places `q` at `r` passes its first check in the sections beside
    /// `q`'s own where an unplaced neighbour of `q` is live: in the child that neighbour starts
    /// at or above the end of `q`, every other buffer still to place at its raw offset, or
    /// when that is below `r` at `r` plus its smallest unplaced neighbour, on which it must rest;
    /// the lowest of those plus the bytes still to place in the section must fit the capacity.
    /// False means the child fails its first check.
    fn room_beside(&mut self, raws: &[(u64, u32)], q: u32, r: u64) -> bool {
        let inst = self.inst;
        let qi = q as usize;
        let (qlo, qhi) = (inst.sec_lo[qi] as usize, inst.sec_hi[qi] as usize);
        let end = r + inst.sizes[qi];
        self.stamp = self.stamp.wrapping_add(1);
        let (mut wlo, mut whi) = (qlo, qhi);
        for &x in inst.neighbors(qi) {
            let xi = x as usize;
            if !self.placed[xi] {
                self.mark[xi] = self.stamp;
                wlo = wlo.min(inst.sec_lo[xi] as usize);
                whi = whi.max(inst.sec_hi[xi] as usize);
            }
        }
        if wlo == qlo && whi == qhi {
            return true;
        }
        self.window[wlo..whi].fill(u64::MAX);
        for &(raw, x) in raws {
            let xi = x as usize;
            let (lo, hi) = ((inst.sec_lo[xi] as usize).max(wlo), (inst.sec_hi[xi] as usize).min(whi));
            if x == q || lo >= hi || (lo >= qlo && hi <= qhi) {
                continue;
            }
            let mask = inst.align_mask[xi];
            let low = if self.mark[xi] == self.stamp {
                align_up(raw.max(end), mask)
            } else if raw >= r {
                raw
            } else {
                inst.smallest_unplaced_neighbor(xi, &self.placed)
                    .map_or(self.capacity + 1, |s| align_up(r.saturating_add(s), mask))
            };
            for w in &mut self.window[lo..hi] {
                *w = (*w).min(low);
            }
        }
        (wlo..qlo).chain(qhi..whi).all(|s| {
            let low = self.window[s];
            low == u64::MAX || low.saturating_add(self.rem[s]) <= self.capacity
        })
    }

    /// Depth-first search in one part: the last placement of this part was at `last` (by the
    /// buffer `prev`).
    fn dfs(&mut self, part: &Part, lows: &mut (Lowest, Lowest), last: u64, prev: Option<u32>) -> Status {
        if self.nodes >= self.node_limit || self.clock.passed(part.buffers.len()) {
            return Status::Stopped;
        }
        self.nodes += 1;
        let inst = self.inst;
        let capacity = self.capacity;
        let mut children: Vec<(u64, u32, u32)> = Vec::with_capacity(part.buffers.len());
        // Raw offset of every buffer still to place, for the children's room check.
        let mut raws: Vec<(u64, u32)> = Vec::with_capacity(part.buffers.len());
        let (mut end1, mut end1_q, mut end2) = (u64::MAX, u32::MAX, u64::MAX);
        let level = self.level(part, last);
        let (lowest, above) = lows;
        lowest.reset();
        above.reset();
        for &q in &part.buffers {
            let qi = q as usize;
            if self.placed[qi] {
                continue;
            }
            let r = inst.raw_offset(qi, self.floor_max[qi]);
            raws.push((r, q));
            let size = inst.sizes[qi];
            let end = r + size;
            if end <= last {
                return Status::NotFound; // it fits below the last placement: not canonical
            }
            if end < end1 {
                end2 = end1;
                end1 = end;
                end1_q = q;
            } else if end < end2 {
                end2 = end;
            }
            let low = if r < last {
                // It must rest on a buffer live with it that is still to place (at >= last).
                let support = inst.smallest_unplaced_neighbor(qi, &self.placed);
                match support {
                    Some(s) => align_up(last.saturating_add(s), inst.align_mask[qi]),
                    None => return Status::NotFound,
                }
            } else {
                r
            };
            if low.saturating_add(size) > capacity {
                return Status::NotFound;
            }
            lowest.chmin(inst.sec_lo[qi] as usize, inst.sec_hi[qi] as usize, low);
            if self.forced {
                let next = if r != level {
                    low
                } else {
                    // Not at the level, it must rest on a buffer live with it placed there.
                    inst.smallest_unplaced_neighbor(qi, &self.placed)
                        .map_or(u64::MAX, |s| align_up(level.saturating_add(s), inst.align_mask[qi]))
                };
                above.chmin(inst.sec_lo[qi] as usize, inst.sec_hi[qi] as usize, next);
            }
            if r < last || (r == last && prev.is_some_and(|p| self.rank[qi] < self.rank[p as usize])) {
                continue;
            }
            children.push((r, self.rank[qi], q));
        }
        if end1 == u64::MAX {
            return Status::Found;
        }
        lowest.finish();
        for s in part.lo..part.hi {
            let low = lowest.leaf(s);
            if low != u64::MAX && low.saturating_add(self.rem[s]) > capacity {
                return Status::NotFound;
            }
        }
        let forced = if self.forced {
            above.finish();
            self.forced_section(part, last, level, above, &children)
        } else {
            None
        };
        if let Some(section) = forced {
            let inst = self.inst;
            children.retain(|&(r, _, q)| {
                r == level
                    && (inst.sec_lo[q as usize] as usize) <= section
                    && section < inst.sec_hi[q as usize] as usize
            });
            if children.is_empty() {
                return Status::NotFound;
            }
        }
        children.sort_unstable();
        let mut room_checked = None;
        for (r, _, q) in children {
            if r >= if q == end1_q { end2 } else { end1 } {
                continue; // another buffer would fit entirely below it
            }
            if self.order.room_cutoff && room_checked.is_none_or(|checked| r > checked) {
                if !self.room_above(part, r) {
                    break; // every later child starts at least as high
                }
                room_checked = Some(r);
            }
            let qi = q as usize;
            if self.order.room_cutoff && !self.room_beside(&raws, q, r) {
                // The child would fail its first check; nothing rests on q: stop as below.
                if inst.neighbors(qi).iter().all(|&x| self.placed[x as usize]) {
                    break;
                }
                continue;
            }
            let size = inst.sizes[qi];
            let end = r + size;
            // Place q.
            self.placed[qi] = true;
            let (lo, hi) = (inst.sec_lo[qi] as usize, inst.sec_hi[qi] as usize);
            let floor_mark = self.floor_trail.len();
            self.floor_trail.extend_from_slice(&self.floor[lo..hi]);
            for s in lo..hi {
                self.rem[s] -= size;
                self.floor[s] = end;
            }
            let mut cut = false;
            for s in lo..hi - 1 {
                self.cuts[s] -= 1;
                cut |= self.cuts[s] == 0;
            }
            let raised_mark = self.raised_trail.len();
            let mut hatless = true;
            for &x in inst.neighbors(qi) {
                let xi = x as usize;
                if self.placed[xi] {
                    continue;
                }
                hatless = false;
                if self.floor_max[xi] < end {
                    self.raised_trail.push((x, self.floor_max[xi]));
                    self.floor_max[xi] = end;
                }
            }
            // After a forced step the order among buffers at this offset is still the one set
            // by the last free choice (none when the offset is new).
            let next_prev = match forced {
                Some(_) if r == last => prev,
                Some(_) => None,
                None => Some(q),
            };
            let status = if cut {
                self.solve_parts(&part.buffers, part.lo, part.hi, r, next_prev)
            } else {
                self.dfs(part, lows, r, next_prev)
            };
            // Undo.
            for &(x, old) in self.raised_trail[raised_mark..].iter().rev() {
                self.floor_max[x as usize] = old;
            }
            self.raised_trail.truncate(raised_mark);
            for s in lo..hi - 1 {
                self.cuts[s] += 1;
            }
            for s in lo..hi {
                self.rem[s] += size;
            }
            self.floor[lo..hi].copy_from_slice(&self.floor_trail[floor_mark..]);
            self.floor_trail.truncate(floor_mark);
            self.placed[qi] = false;
            match status {
                Status::NotFound => {}
                Status::Found => {
                    self.solution[qi] = r;
                    return Status::Found;
                }
                Status::Stopped => return Status::Stopped,
            }
            if hatless {
                break; // nothing rests on it: if it fails here, every later child fails too
            }
        }
        Status::NotFound
    }
}

/// Decides whether `inst` packs within `capacity` bytes, exploring children that share an
/// offset in `order`. Stops after `node_limit` nodes or at `deadline`.
///
/// # Panics
///
/// If `order` does not have one rank and one width per buffer.
pub fn decide(
    inst: &PackingInstance,
    order: &Order,
    capacity: u64,
    node_limit: u64,
    deadline: Option<Instant>,
) -> Decision {
    let n = inst.len();
    assert_eq!(order.rank.len(), n, "one rank per buffer");
    assert_eq!(order.widths.len(), n, "one width per buffer");
    let sections = inst.n_sections;
    let mut rem = vec![0u64; sections];
    let mut cuts = vec![0u32; sections.saturating_sub(1)];
    for q in 0..n {
        let (lo, hi) = (inst.sec_lo[q] as usize, inst.sec_hi[q] as usize);
        for r in &mut rem[lo..hi] {
            *r += inst.sizes[q];
        }
        for c in &mut cuts[lo..hi - 1] {
            *c += 1;
        }
    }
    // No canonical packing ends above the span: a larger capacity decides the same, and
    // keeping it within the span keeps every sum (`capacity + 1` included) below 2^64.
    let capacity = capacity.min(inst.span);
    let mut decider = Decider {
        inst,
        order,
        rank: order.rank.clone(),
        capacity,
        node_limit,
        clock: Clock::new(deadline),
        nodes: 0,
        placed: vec![false; n],
        solution: vec![0; n],
        floor_max: vec![0; n],
        rem,
        cuts,
        floor: vec![0; sections],
        cover: vec![0; sections + 1],
        floor_trail: Vec::new(),
        raised_trail: Vec::new(),
        forced: order.forced_sections,
        memo: HashMap::new(),
        memo_words: 0,
        mark: vec![0; n],
        stamp: 0,
        window: vec![0; sections],
    };
    let all: Vec<u32> = (0..n as u32).collect();
    let status = if n == 0 { Status::Found } else { decider.solve_parts(&all, 0, sections, 0, None) };
    let nodes = decider.nodes;
    match status {
        Status::Found => Decision { verdict: Verdict::Found, offsets: Some(decider.solution), nodes },
        Status::NotFound => Decision { verdict: Verdict::Exhausted, offsets: None, nodes },
        Status::Stopped => Decision { verdict: Verdict::Stopped, offsets: None, nodes },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan_search::test_instances::{aligned, instance, random_buffers, Rng};

    fn order(rank: &[u32], keys: &str) -> Order {
        Order::new(
            keys.chars().map(|c| Key::from_letter(c).expect("key letter")).collect(),
            vec![1; rank.len()],
            rank.to_vec(),
        )
    }

    fn check(buffers: &[(u32, u32, u64)], offsets: &[u64], capacity: u64) {
        for (i, a) in buffers.iter().enumerate() {
            assert!(offsets[i] + a.2 <= capacity, "buffer {i} above the capacity");
            for (j, b) in buffers.iter().enumerate().skip(i + 1) {
                let live = a.0 < b.1 && b.0 < a.1;
                let apart = offsets[i] + a.2 <= offsets[j] || offsets[j] + b.2 <= offsets[i];
                assert!(!live || apart, "buffers {i} and {j} overlap");
            }
        }
    }

    #[test]
    fn minimalloc_example_fits_12_and_not_11() {
        let buffers = [(0, 3, 4), (3, 9, 4), (0, 9, 4), (9, 21, 4), (0, 21, 4)];
        let inst = instance(&buffers);
        let out = decide(&inst, &order(&[0, 1, 2, 3, 4], "WAT"), 12, u64::MAX, None);
        assert_eq!(out.verdict, Verdict::Found);
        check(&buffers, &out.offsets.expect("a packing"), 12);
        let out = decide(&inst, &order(&[4, 3, 2, 1, 0], "WAT"), 11, u64::MAX, None);
        assert_eq!(out.verdict, Verdict::Exhausted);
    }

    #[test]
    fn staircase_needs_seven() {
        let buffers = [(0, 2, 3), (1, 3, 3), (2, 4, 3), (0, 4, 1)];
        let inst = instance(&buffers);
        assert_eq!(decide(&inst, &order(&[0, 1, 2, 3], "WAT"), 6, u64::MAX, None).verdict, Verdict::Exhausted);
        let out = decide(&inst, &order(&[0, 1, 2, 3], "WAT"), 7, u64::MAX, None);
        check(&buffers, &out.offsets.expect("a packing"), 7);
    }

    #[test]
    fn parts_split_by_placed_buffers_are_solved_apart() {
        // A long buffer over everything, then two independent halves under it.
        let buffers = [(0, 8, 2), (0, 4, 3), (0, 2, 1), (2, 4, 1), (4, 8, 2), (4, 6, 2), (6, 8, 2)];
        let inst = instance(&buffers);
        for keys in ["", "WAT", "TWA", "ZC"] {
            let out = decide(&inst, &order(&[0, 1, 2, 3, 4, 5, 6], keys), 6, u64::MAX, None);
            check(&buffers, &out.offsets.expect("a packing"), 6);
        }
        assert_eq!(decide(&inst, &order(&[0, 1, 2, 3, 4, 5, 6], "WAT"), 5, u64::MAX, None).verdict, Verdict::Exhausted);
    }

    #[test]
    fn node_limit_stops() {
        let buffers: Vec<(u32, u32, u64)> = (0..30).map(|i| (i % 7, i % 7 + 3, 1 + (i as u64 * 7) % 5)).collect();
        let inst = instance(&buffers);
        let rank: Vec<u32> = (0..30).collect();
        let out = decide(&inst, &order(&rank, "WAT"), 1, 5, None);
        assert_ne!(out.verdict, Verdict::Found);
        assert!(out.nodes <= 5);
    }

    fn live_bytes_bound(buffers: &[(u32, u32, u64)]) -> u64 {
        let end = buffers.iter().map(|b| b.1).max().unwrap_or(0);
        (0..end).map(|t| buffers.iter().filter(|b| b.0 <= t && t < b.1).map(|b| b.2).sum()).max().unwrap_or(0)
    }

    fn plain(order: Order) -> Order {
        Order { forced_sections: false, room_cutoff: false, ..order }
    }

    #[test]
    fn forced_sections_agree_with_the_plain_search() {
        // Both searches are exhaustive here: they must agree on every capacity from the
        // live-bytes bound up, and every packing found must be valid.
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let (mut forced_nodes, mut cut_nodes, mut plain_nodes, mut infeasible) = (0, 0, 0, 0);
        for _ in 0..400 {
            let n = 4 + rng.below(6) as usize;
            let buffers = random_buffers(&mut rng, n, 6);
            let alignments: Vec<u64> = (0..n).map(|_| 1 << rng.below(3)).collect();
            let inst = aligned(&buffers, &alignments);
            let rank: Vec<u32> = (0..n as u32).collect();
            let bound = live_bytes_bound(&buffers);
            for capacity in bound..bound + 4 {
                let with = decide(&inst, &order(&rank, "WAT"), capacity, u64::MAX, None);
                let without = decide(&inst, &plain(order(&rank, "WAT")), capacity, u64::MAX, None);
                let follow = Order { follow_order: true, ..order(&rank, "WAT") };
                let following = decide(&inst, &follow, capacity, u64::MAX, None);
                let room_only = Order { forced_sections: false, ..order(&rank, "WAT") };
                let cut = decide(&inst, &room_only, capacity, u64::MAX, None);
                assert_eq!(cut.verdict, without.verdict, "{buffers:?} at {capacity}, room cutoff only");
                if let Some(offsets) = cut.offsets {
                    check(&buffers, &offsets, capacity);
                }
                cut_nodes += cut.nodes;
                assert_eq!(with.verdict, without.verdict, "{buffers:?} at {capacity}");
                assert_eq!(following.verdict, without.verdict, "{buffers:?} at {capacity}, following the order");
                if let Some(offsets) = following.offsets {
                    check(&buffers, &offsets, capacity);
                }
                forced_nodes += with.nodes;
                plain_nodes += without.nodes;
                if let Some(offsets) = with.offsets {
                    check(&buffers, &offsets, capacity);
                    assert!(offsets.iter().zip(&alignments).all(|(o, a)| o % a == 0));
                } else {
                    infeasible += 1;
                }
            }
        }
        assert!(infeasible > 50, "the cases must include capacities that are too small");
        assert!(forced_nodes < plain_nodes, "{forced_nodes} nodes with forced sections, {plain_nodes} without");
        // A child the room cutoff skips would fail at its first check: never more nodes.
        assert!(cut_nodes < plain_nodes, "{cut_nodes} nodes with the room cutoff, {plain_nodes} without");
    }

    #[test]
    fn orders_led_by_the_alignment_agree_with_the_plain_search() {
        // Exhaustive runs: the order of the children changes which packing is found first,
        // never whether one exists. The alignment key must also act: at offset 0 the most
        // aligned buffer comes first.
        assert_eq!(Key::from_letter('G'), Some(Key::Alignment));
        let mut rng = Rng(0x5851_f42d_4c95_7f2d);
        let mut found_first = 0;
        for _ in 0..200 {
            let n = 3 + rng.below(6) as usize;
            let buffers = random_buffers(&mut rng, n, 5);
            let alignments: Vec<u64> = (0..n).map(|_| 1 << rng.below(4)).collect();
            let inst = aligned(&buffers, &alignments);
            let rank: Vec<u32> = (0..n as u32).collect();
            let bound = live_bytes_bound(&buffers);
            for capacity in bound..bound + 6 {
                let led = decide(&inst, &order(&rank, "GWAT"), capacity, u64::MAX, None);
                let without = decide(&inst, &plain(order(&rank, "WAT")), capacity, u64::MAX, None);
                assert_eq!(led.verdict, without.verdict, "{buffers:?} {alignments:?} at {capacity}");
                if let Some(offsets) = led.offsets {
                    check(&buffers, &offsets, capacity);
                    assert!(offsets.iter().zip(&alignments).all(|(o, a)| o % a == 0));
                }
            }
            let most = *alignments.iter().max().unwrap();
            let wide = decide(&inst, &order(&rank, "G"), u64::MAX, u64::MAX, None);
            let offsets = wide.offsets.expect("a packing without a limit");
            found_first += usize::from((0..n).any(|q| alignments[q] == most && offsets[q] == 0));
        }
        assert_eq!(found_first, 200, "a buffer of the largest alignment at offset 0 every time");
    }

    /// A perfect packing of `steps` x `height` cut straight across, again and again, into
    /// `count` buffers (time or bytes), as (lower, upper, size).
    fn tiling(rng: &mut Rng, steps: u32, height: u64, count: usize) -> Vec<(u32, u32, u64)> {
        let mut rects = vec![(0, steps, 0, height)];
        while rects.len() < count {
            let k = rng.below(rects.len() as u64) as usize;
            let (t0, t1, a0, a1) = rects[k];
            if rng.below(2) == 0 && t1 - t0 >= 2 {
                let cut = t0 + 1 + rng.below(u64::from(t1 - t0 - 1)) as u32;
                rects[k] = (t0, cut, a0, a1);
                rects.push((cut, t1, a0, a1));
            } else if a1 - a0 >= 2 {
                let cut = a0 + 1 + rng.below(a1 - a0 - 1);
                rects[k] = (t0, t1, a0, cut);
                rects.push((t0, t1, cut, a1));
            }
        }
        rects.into_iter().map(|(t0, t1, a0, a1)| (t0, t1, a1 - a0)).collect()
    }

    #[test]
    fn perfect_tilings_fit_at_their_height() {
        let mut rng = Rng(42);
        for round in 0..200 {
            let buffers = tiling(&mut rng, 12, 40, 10 + round % 30);
            let inst = instance(&buffers);
            let rank: Vec<u32> = (0..buffers.len() as u32).collect();
            assert_eq!(live_bytes_bound(&buffers), 40);
            let out = decide(&inst, &order(&rank, "WAT"), 40, 1_000_000, None);
            assert_eq!(out.verdict, Verdict::Found, "{buffers:?}");
            check(&buffers, &out.offsets.expect("a packing"), 40);
        }
    }
}
