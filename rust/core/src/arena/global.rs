//! The global pool: the whole arena in chunk units. It grants single chunks to core pools and
//! serves large requests as exact runs of contiguous chunks (300 MiB takes 150 chunks of 2 MiB,
//! not a 512 MiB power of two).
//!
//! A bitmap says which chunks are taken; a run is claimed word by word with CAS in ascending
//! address order and rolled back if a word is contended. Because every claimer goes upwards, two
//! claimers can never roll each other back: the one that holds the lower contested word wins, so
//! the protocol is lock-free. An epoch counter, bumped by every release and rollback, tells a
//! scan that found nothing whether the bitmap changed under it and a rescan is worth it.
//!
//! A count of the free chunks answers whether any chunk is free in one load, where a read of
//! the bitmap takes a load per 64 chunks (512 on an arena of 64 GiB, on every failing
//! allocation). It is an upper bound of the free bits at every moment: a release adds its
//! chunks before it clears their bits, a claim takes them off after it has set every bit (a
//! rolled-back claim never counted). So a chunk whose bit is clear is always counted, and
//! "none counted" means none free, while a claim or a release is under way too (the other
//! order, a claim that takes off first or a release that adds last, could count a chunk that
//! stayed free out while another chunk changes hands: the loom model below races that).
//!
//! Per chunk, a state word records what the chunk is: free in the global pool, owned by a core,
//! or the head or body of a run (the head keeps the run's length and whether a tail follows it,
//! `arena/tail.rs`, so a free can be validated and only one of two racing frees of the same run
//! wins).

use crate::arena::geometry::Geometry;
use crate::config::Placement;
use crate::error::Result;
use crate::util::sync::{AtomicU64, AtomicUsize, Ordering};
use crate::util::zeroed::Zeroed;

const KIND_SHIFT: u32 = 56;
const PAYLOAD: u64 = (1 << KIND_SHIFT) - 1;
/// Where a `FrontedRun` keeps its tail's units (below: its length in chunks).
const FRONT_TAIL_SHIFT: u32 = 32;

/// What a chunk is used for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChunkState {
    /// In the global pool (its buddy tree is retired).
    Free,
    /// Granted to core pool `core`.
    Core(usize),
    /// The first chunk of a run of `len` chunks.
    RunHead(usize),
    /// The first chunk of a run of `len` whole chunks whose block goes on into a tail at the
    /// start of the chunk after the run (a core chunk; see `arena/tail.rs`).
    TailedRunHead(usize),
    /// The first of the `len` whole chunks of a block that starts in the free end of the core
    /// chunk before them (a *front*) and ends in a tail of `tail` units at the start of the
    /// chunk after them (none when 0; see `arena/front.rs`).
    FrontedRun { len: usize, tail: u64 },
    /// A later chunk of a run.
    RunBody,
    /// Outside the pool's regions (a pool that can grow): no memory behind it.
    Absent,
}

impl ChunkState {
    fn encode(self) -> u64 {
        match self {
            ChunkState::Free => 0,
            ChunkState::Core(c) => (1 << KIND_SHIFT) | c as u64,
            ChunkState::RunHead(len) => (2 << KIND_SHIFT) | len as u64,
            ChunkState::RunBody => 3 << KIND_SHIFT,
            ChunkState::Absent => 4 << KIND_SHIFT,
            ChunkState::TailedRunHead(len) => (5 << KIND_SHIFT) | len as u64,
            ChunkState::FrontedRun { len, tail } => (6 << KIND_SHIFT) | (tail << FRONT_TAIL_SHIFT) | len as u64,
        }
    }

    fn decode(word: u64) -> ChunkState {
        match word >> KIND_SHIFT {
            0 => ChunkState::Free,
            1 => ChunkState::Core((word & PAYLOAD) as usize),
            2 => ChunkState::RunHead((word & PAYLOAD) as usize),
            3 => ChunkState::RunBody,
            5 => ChunkState::TailedRunHead((word & PAYLOAD) as usize),
            6 => ChunkState::FrontedRun {
                len: (word & ((1 << FRONT_TAIL_SHIFT) - 1)) as usize,
                tail: (word & PAYLOAD) >> FRONT_TAIL_SHIFT,
            },
            _ => ChunkState::Absent,
        }
    }
}

/// Where a run with a tail goes (`GlobalPool::choose_tailed`): its first chunk, and whether
/// its tail takes a fresh chunk or shares a core chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TailSpot {
    /// The run's chunks and the free chunk after them, which is granted for the tail.
    Fresh(usize),
    /// The run's chunks, followed by a core chunk whose start holds the tail.
    Shared(usize),
}

/// A maximal run of free chunks `[start, start + len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FreeRun {
    pub(crate) start: usize,
    pub(crate) len: usize,
}

pub(crate) struct GlobalPool {
    chunks: usize,
    /// One bit per chunk (lazily committed: see `util/zeroed.rs`).
    taken: Zeroed<AtomicU64>,
    /// One word per chunk, zero (`Free`) until first used.
    state: Zeroed<AtomicU64>,
    epoch: AtomicU64,
    /// Free chunks, counted ahead of the bitmap (see the module documentation).
    free: AtomicUsize,
    placement: Placement,
    /// Chunks at or beyond it are absent (see the module documentation).
    end: AtomicUsize,
}

impl GlobalPool {
    /// The first `present` chunks free, the rest absent; `Error::HostMemory` when the host has
    /// no room for the tables.
    pub(crate) fn new(geometry: &Geometry, placement: Placement, present: usize) -> Result<GlobalPool> {
        let chunks = geometry.chunks;
        let pool = GlobalPool {
            chunks,
            taken: Zeroed::new(chunks.div_ceil(64), "the global pool's chunk bitmap")?,
            state: Zeroed::new(chunks, "the global pool's chunk states")?,
            epoch: AtomicU64::new(0),
            free: AtomicUsize::new(present.min(chunks)),
            placement,
            end: AtomicUsize::new(present.min(chunks)),
        };
        pool.mark_absent_tail(present.min(chunks));
        Ok(pool)
    }

    /// Bytes of its tables the host has committed.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn resident_bytes(&self) -> usize {
        self.taken.resident_bytes() + self.state.resident_bytes()
    }

    pub(crate) fn state(&self, chunk: usize) -> ChunkState {
        let word = self.state[chunk].load(Ordering::Acquire);
        if word == 0 && chunk >= self.end.load(Ordering::Acquire) {
            return ChunkState::Absent;
        }
        ChunkState::decode(word)
    }

    pub(crate) fn set_state(&self, chunk: usize, state: ChunkState) {
        self.state[chunk].store(state.encode(), Ordering::Release);
    }

    /// Change a chunk's state from `from` to `to`; `false` (and no change) if it was not `from`.
    pub(crate) fn swap_state(&self, chunk: usize, from: ChunkState, to: ChunkState) -> bool {
        self.state[chunk].compare_exchange(from.encode(), to.encode(), Ordering::AcqRel, Ordering::Acquire).is_ok()
    }

    pub(crate) fn is_taken(&self, chunk: usize) -> bool {
        self.taken[chunk / 64].load(Ordering::Acquire) & (1 << (chunk % 64)) != 0
    }

    /// Whether any chunk may be free now (absent chunks count as taken): a caller that finds
    /// none need not look for a run. One load of the count of free chunks, an upper bound of
    /// the bitmap's (see the module documentation): `false` means that no chunk was free when
    /// it was read; `true` may also come from a claim under way.
    pub(crate) fn has_free(&self) -> bool {
        self.free.load(Ordering::Acquire) > 0
    }

    /// How many chunks are free: exact on a paused pool (no claim or release under way), an
    /// upper bound otherwise (see the module documentation).
    pub(crate) fn free_chunks(&self) -> usize {
        self.free.load(Ordering::Acquire)
    }

    /// The maximal free runs now, in address order, the chunks of `also_free` (in address order:
    /// core chunks that are empty and could be reclaimed) counted free too: a word of the bitmap
    /// at a time, so an arena of millions of chunks costs a load per 64 of them.
    pub(crate) fn free_runs(&self, also_free: &[usize]) -> Vec<FreeRun> {
        debug_assert!(also_free.is_sorted());
        let mut runs = Vec::new();
        let end = self.end();
        let mut also = also_free.iter().copied().peekable();
        let mut start: Option<usize> = None;
        for w in 0..end.div_ceil(64) {
            let present = if (w + 1) * 64 <= end { u64::MAX } else { (1u64 << (end % 64)) - 1 };
            let base = w * 64;
            let mut counted = 0u64;
            while let Some(chunk) = also.next_if(|&c| c < base + 64) {
                if chunk >= base {
                    counted |= 1 << (chunk - base);
                }
            }
            let free = (!self.taken[w].load(Ordering::Acquire) | counted) & present;
            // `at`: the first bit of the word not looked at yet.
            let mut at = 0u32;
            while at < 64 {
                let rest = free >> at;
                match start {
                    None if rest == 0 => break,
                    None => {
                        at += rest.trailing_zeros();
                        start = Some(base + at as usize);
                    }
                    Some(s) => {
                        let taken = !rest & (present >> at);
                        if taken == 0 {
                            break; // the run goes on into the next word, or to the arena's end
                        }
                        at += taken.trailing_zeros();
                        runs.push(FreeRun { start: s, len: base + at as usize - s });
                        start = None;
                    }
                }
            }
        }
        if let Some(s) = start {
            runs.push(FreeRun { start: s, len: end - s });
        }
        runs
    }

    /// How many chunks the bitmap shows free now, a word at a time (absent chunks count as
    /// taken): exact on a paused pool.
    pub(crate) fn free_in_bitmap(&self) -> usize {
        let end = self.end();
        (0..end.div_ceil(64))
            .map(|w| {
                let present = if (w + 1) * 64 <= end { u64::MAX } else { (1u64 << (end % 64)) - 1 };
                (!self.taken[w].load(Ordering::Acquire) & present).count_ones() as usize
            })
            .sum()
    }

    /// The maximal free runs now, in address order ([`GlobalPool::free_runs`] with no chunk
    /// counted free besides the free ones); none, without a read of the bitmap, when the count
    /// of free chunks is zero.
    pub(crate) fn free_runs_now(&self) -> Vec<FreeRun> {
        if !self.has_free() {
            return Vec::new(); // none was free when the count was read: no word need be
        }
        self.free_runs(&[])
    }

    /// Where in `run` a block of `len` chunks holding `bytes` bytes, starting at a multiple of
    /// `align` chunks, could go (its first chunk), if anywhere.
    fn place_in(geometry: &Geometry, run: FreeRun, len: usize, bytes: usize, align: usize) -> Option<usize> {
        let start = run.start.div_ceil(align) * align;
        if start + len > run.start + run.len {
            return None;
        }
        (geometry.run_bytes(start, len) >= bytes).then_some(start)
    }

    /// How runs are placed.
    pub(crate) fn placement(&self) -> Placement {
        self.placement
    }

    /// The release epoch: a scan that found nothing may give up if it is unchanged after.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Where in `runs` (the free runs now) a block of `len` whole chunks and a tail goes,
    /// starting at a multiple of `align` chunks, holding `bytes` bytes with its tail if the
    /// tail takes a fresh chunk: `len + 1` free chunks (`TailSpot::Fresh`), or `len` free
    /// chunks at the end of a run followed by a chunk that `shares` accepts for the tail
    /// (`TailSpot::Shared`, a core chunk whose start is free). Best fit takes the run that
    /// leaves the fewest free chunks, a shared tail first on a tie (it takes no chunk from the
    /// global pool); first fit the first run, a shared tail first. `shares` is asked only for
    /// the candidates in that order, until one is accepted.
    pub(crate) fn choose_tailed(
        &self,
        geometry: &Geometry,
        runs: &[FreeRun],
        len: usize,
        bytes: usize,
        align: usize,
        shares: &mut dyn FnMut(usize) -> bool,
    ) -> Option<TailSpot> {
        let end = self.end();
        // (free chunks left in the run, fresh, first chunk)
        let mut candidates: Vec<(usize, bool, usize)> = Vec::new();
        for &run in runs {
            let after = run.start + run.len;
            if run.len >= len && after < end && (after - len) % align == 0 {
                candidates.push((run.len - len, false, after - len));
            }
            if let Some(start) = Self::place_in(geometry, run, len + 1, bytes, align) {
                candidates.push((run.len - len - 1, true, start));
            }
        }
        if self.placement == Placement::BestFit {
            candidates.sort_unstable();
        }
        candidates.into_iter().find_map(|(_, fresh, start)| match fresh {
            true => Some(TailSpot::Fresh(start)),
            false => shares(start + len).then_some(TailSpot::Shared(start)),
        })
    }

    /// Claim `len` contiguous chunks that hold at least `bytes` bytes, starting at a multiple of
    /// `align` chunks. Returns the first chunk; its state is still `Free` for the caller to set.
    pub(crate) fn claim(&self, geometry: &Geometry, len: usize, bytes: usize, align: usize) -> Option<usize> {
        self.claim_placed(geometry, len, bytes, align, &|_| false)
    }

    /// Claim one chunk that holds `bytes` bytes for a core (a grant): as [`GlobalPool::claim`],
    /// except that in a free run after a chunk that `keep_next_free` names (a core chunk whose
    /// free end a block with a front could take, `front.rs`) it takes the run's last chunk, so
    /// that free end stays next to free chunks instead of next to a chunk of small blocks.
    pub(crate) fn claim_grant(
        &self,
        geometry: &Geometry,
        bytes: usize,
        keep_next_free: &dyn Fn(usize) -> bool,
    ) -> Option<usize> {
        self.claim_placed(geometry, 1, bytes, 1, keep_next_free)
    }

    /// [`GlobalPool::claim`]; one chunk at the end of a run after a chunk `from_end` names.
    fn claim_placed(
        &self,
        geometry: &Geometry,
        len: usize,
        bytes: usize,
        align: usize,
        from_end: &dyn Fn(usize) -> bool,
    ) -> Option<usize> {
        let at_end = |run: FreeRun, start: usize| {
            let last = run.start + run.len - 1;
            match len == 1
                && last > start
                && geometry.chunk_bytes(last) >= bytes
                && run.start > 0
                && from_end(run.start - 1)
            {
                true => last,
                false => start,
            }
        };
        loop {
            let epoch = self.epoch.load(Ordering::Acquire);
            let runs = self.free_runs_now();
            let candidates = runs
                .iter()
                .filter_map(|&run| Self::place_in(geometry, run, len, bytes, align).map(|start| (run, start)));
            let choice = match self.placement {
                Placement::FirstFit => candidates.into_iter().next(),
                Placement::BestFit => candidates.min_by_key(|(run, start)| (run.len, *start)),
            };
            match choice.map(|(run, start)| (run, at_end(run, start))) {
                Some((_, start)) => {
                    if self.try_take(start, len) {
                        return Some(start);
                    }
                }
                None => {
                    if self.epoch.load(Ordering::Acquire) == epoch {
                        return None;
                    }
                }
            }
        }
    }

    /// Bits `[start, start + len)` grouped by bitmap word: `(word, mask)`.
    fn words_of(start: usize, len: usize) -> impl Iterator<Item = (usize, u64)> {
        let end = start + len;
        let mut at = start;
        std::iter::from_fn(move || {
            if at >= end {
                return None;
            }
            let word = at / 64;
            let lo = at % 64;
            let hi = (end - word * 64).min(64);
            let mask = if hi - lo == 64 { u64::MAX } else { ((1u64 << (hi - lo)) - 1) << lo };
            at = (word + 1) * 64;
            Some((word, mask))
        })
    }

    /// Take chunks `[start, start + len)` if all are free now (ascending, rolled back on conflict).
    pub(crate) fn try_take(&self, start: usize, len: usize) -> bool {
        let mut claimed: Vec<(usize, u64)> = Vec::new();
        for (word, mask) in Self::words_of(start, len) {
            let cell = &self.taken[word];
            let mut current = cell.load(Ordering::Acquire);
            loop {
                if current & mask != 0 {
                    for &(w, m) in &claimed {
                        self.taken[w].fetch_and(!m, Ordering::AcqRel);
                    }
                    if !claimed.is_empty() {
                        self.epoch.fetch_add(1, Ordering::AcqRel);
                    }
                    return false;
                }
                match cell.compare_exchange_weak(current, current | mask, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => break,
                    Err(seen) => current = seen,
                }
            }
            claimed.push((word, mask));
        }
        // Taken off the count once every bit is set: the count stays an upper bound.
        self.free.fetch_sub(len, Ordering::AcqRel);
        true
    }

    /// Give chunks `[start, start + len)` back (their states must already be `Free`).
    pub(crate) fn release(&self, start: usize, len: usize) {
        // Counted before a bit is cleared: the count stays an upper bound.
        self.free.fetch_add(len, Ordering::AcqRel);
        for (word, mask) in Self::words_of(start, len) {
            self.taken[word].fetch_and(!mask, Ordering::AcqRel);
        }
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }
}

/// Absent chunks and regions (see the module documentation).
impl GlobalPool {
    /// The end of the highest region so far: chunks at or beyond it are absent.
    pub(crate) fn end(&self) -> usize {
        self.end.load(Ordering::Acquire)
    }

    /// Set the bits of chunks `[from, chunks)`, absent from the start (the bits of whole words
    /// are stored, so a large absent tail commits one bit per chunk).
    fn mark_absent_tail(&self, from: usize) {
        for (word, mask) in Self::words_of(from, self.chunks - from) {
            self.taken[word].fetch_or(mask, Ordering::AcqRel);
        }
    }

    /// Make absent chunks `[start, start + len)` free (one grower at a time): states first,
    /// then `end`, then the bits, so a claimer that takes one finds it whole. The absent chunks
    /// that `end` passes (those between the old end and the region, and the one after it) get
    /// their state written.
    pub(crate) fn publish(&self, start: usize, len: usize) {
        // The chunks between the old end and the region (an aligned region may start well past
        // it) were never written: they read as absent only while `end` is below them.
        let old_end = self.end.load(Ordering::Acquire);
        for chunk in old_end..start.saturating_sub(1) {
            if self.state[chunk].load(Ordering::Acquire) == 0 {
                self.set_state(chunk, ChunkState::Absent);
            }
        }
        for chunk in start.saturating_sub(1)..(start + len + 1).min(self.chunks) {
            let inside = chunk >= start && chunk < start + len;
            let state = if inside { ChunkState::Free } else { self.state(chunk) };
            if inside || state == ChunkState::Absent {
                self.set_state(chunk, state);
            }
        }
        self.end.fetch_max(start + len, Ordering::AcqRel);
        self.release(start, len);
    }

    /// Make free chunks `[start, start + len)` absent, if every one is free now (`false` and no
    /// change otherwise): they are taken as a claim would, then marked absent.
    pub(crate) fn withdraw(&self, start: usize, len: usize) -> bool {
        if !self.try_take(start, len) {
            return false;
        }
        for chunk in start..start + len {
            self.set_state(chunk, ChunkState::Absent);
        }
        true
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::config::PoolConfig;

    fn setup(capacity: usize, placement: Placement) -> (Geometry, GlobalPool) {
        let g = Geometry::new(&PoolConfig::new(capacity));
        let p = GlobalPool::new(&g, placement, g.chunks).unwrap();
        (g, p)
    }

    /// The count of free chunks follows claims, rollbacks, releases, publications and
    /// withdrawals: equal to the bitmap's free chunks after each, and `has_free` true exactly
    /// when one is free (a pool that can grow, its tail absent).
    #[test]
    fn the_count_of_free_chunks_follows_the_bitmap() {
        let g = Geometry::new(&PoolConfig::new(300 * (2 << 20)));
        let p = GlobalPool::new(&g, Placement::BestFit, 200).unwrap();
        let free_bits = |p: &GlobalPool| (0..g.chunks).filter(|&c| !p.is_taken(c)).count();
        let mut rng = crate::arena::stretches::tests::Rng::new(7);
        let mut held: Vec<(usize, usize)> = Vec::new();
        let mut published = false;
        let (mut empty_seen, mut rollbacks) = (0, 0);
        for step in 0..4_000 {
            match rng.next() % 8 {
                0..=4 => {
                    let len = if rng.next() % 2 == 0 { 1 } else { 1 + (rng.next() % 40) as usize };
                    match p.claim(&g, len, len * g.chunk_size, 1) {
                        Some(start) => held.push((start, len)),
                        None => {
                            // A claim that meets a taken chunk past its first word rolls back.
                            let start = (rng.next() % 130) as usize;
                            match p.try_take(start, 70) {
                                true => held.push((start, 70)),
                                false => rollbacks += usize::from(p.is_taken(start + 69)),
                            }
                        }
                    }
                }
                5..=6 if !held.is_empty() => {
                    let (start, len) = held.swap_remove((rng.next() % held.len() as u64) as usize);
                    p.release(start, len);
                }
                7 if !published => {
                    p.publish(250, 50);
                    published = true;
                }
                7 => {
                    let start = 250 + (rng.next() % 40) as usize;
                    p.withdraw(start, 10);
                }
                _ => {}
            }
            let free = free_bits(&p);
            assert_eq!(p.free.load(Ordering::Acquire), free, "step {step}");
            assert_eq!(p.has_free(), free > 0, "step {step}");
            empty_seen += usize::from(free == 0);
        }
        assert!(empty_seen > 0 && rollbacks > 0, "full {empty_seen} times, {rollbacks} rollbacks");
    }

    #[test]
    fn exact_runs_not_powers_of_two() {
        let (g, p) = setup(800 << 20, Placement::BestFit);
        let start = p.claim(&g, 150, 300 << 20, 1).unwrap();
        assert_eq!(start, 0);
        assert_eq!(p.free_runs(&[]), vec![FreeRun { start: 150, len: 250 }]);
        p.release(start, 150);
        assert_eq!(p.free_runs(&[]), vec![FreeRun { start: 0, len: 400 }]);
    }

    #[test]
    fn best_fit_takes_the_smallest_hole() {
        let (g, p) = setup(64 << 20, Placement::BestFit);
        assert!(p.try_take(0, 32));
        p.release(2, 5); // hole of 5 at 2
        p.release(10, 2); // hole of 2 at 10
        assert_eq!(p.claim(&g, 2, 4 << 20, 1), Some(10));
        assert_eq!(p.claim(&g, 3, 6 << 20, 1), Some(2));
        let (g, p) = setup(64 << 20, Placement::FirstFit);
        assert!(p.try_take(0, 32));
        p.release(2, 5);
        p.release(10, 2);
        assert_eq!(p.claim(&g, 2, 4 << 20, 1), Some(2));
    }

    #[test]
    fn alignment_and_tail() {
        let (g, p) = setup((9 << 20) + (1 << 19), Placement::BestFit);
        assert_eq!(g.chunks, 5);
        // 9.5 MiB in 5 chunks: a full-arena block fits only because the tail counts.
        assert_eq!(p.claim(&g, 5, (9 << 20) + (1 << 19), 1), Some(0));
        p.release(0, 5);
        assert_eq!(p.claim(&g, 5, 10 << 20, 1), None);
        assert_eq!(p.claim(&g, 1, 1 << 20, 4), Some(0));
        assert_eq!(p.claim(&g, 1, 1 << 20, 4), Some(4));
        assert_eq!(p.claim(&g, 1, 1 << 20, 4), None);
    }

    #[test]
    fn multiword_claims_and_conflicts() {
        let (_, p) = setup(1 << 30, Placement::BestFit);
        assert!(p.try_take(60, 200));
        assert!(!p.try_take(250, 20), "overlaps the first run");
        assert!(p.try_take(260, 20));
        assert!(!p.is_taken(59));
        assert!(p.is_taken(259));
        assert!(!p.is_taken(280));
    }

    /// The free runs, chunk by chunk, with the chunks of `also_free` counted free: the model
    /// that [`GlobalPool::free_runs`] reads a word at a time.
    fn free_runs_by_chunk(p: &GlobalPool, also_free: &[usize]) -> Vec<FreeRun> {
        let mut runs = Vec::new();
        let mut start = None;
        for chunk in 0..p.end() {
            match (!p.is_taken(chunk) || also_free.contains(&chunk), start) {
                (true, None) => start = Some(chunk),
                (false, Some(s)) => {
                    runs.push(FreeRun { start: s, len: chunk - s });
                    start = None;
                }
                _ => {}
            }
        }
        if let Some(s) = start {
            runs.push(FreeRun { start: s, len: p.end() - s });
        }
        runs
    }

    #[test]
    fn free_runs_read_the_bitmap_a_word_at_a_time_as_a_chunk_by_chunk_walk_does() {
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        for chunks in [1usize, 63, 64, 65, 130, 512, 700] {
            let g = Geometry::new(&PoolConfig::new(chunks * (2 << 20)));
            for present in [chunks, chunks / 2 + 1] {
                let p = GlobalPool::new(&g, Placement::BestFit, present).unwrap();
                for round in 0..50 {
                    for c in 0..present {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        // Runs of every length: a chunk follows its neighbour's state mostly.
                        let flip = rng % [2, 5, 40][round % 3] == 0;
                        let taken = p.is_taken(c.saturating_sub(1)) ^ flip;
                        if taken != p.is_taken(c) {
                            if taken {
                                assert!(p.try_take(c, 1));
                            } else {
                                p.release(c, 1);
                            }
                        }
                    }
                    assert_eq!(p.free_runs_now(), free_runs_by_chunk(&p, &[]), "{chunks} chunks, {present} present");
                    // Taken chunks counted free, in every word and at its edges.
                    let also: Vec<usize> =
                        (0..present).filter(|&c| p.is_taken(c) && (c % 7 == round % 7 || c % 64 == 63)).collect();
                    assert_eq!(p.free_runs(&also), free_runs_by_chunk(&p, &also), "{chunks} chunks, counted {also:?}");
                }
            }
        }
    }

    #[test]
    fn concurrent_claims_never_overlap() {
        let (g, p) = setup(512 << 20, Placement::BestFit);
        let owner: Vec<AtomicU64> = (0..256).map(|_| AtomicU64::new(0)).collect();
        std::thread::scope(|s| {
            for id in 1..=4u64 {
                let (g, p, owner) = (&g, &p, &owner);
                s.spawn(move || {
                    let mut rng = id;
                    for _ in 0..3000 {
                        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        let len = 1 + (rng >> 60) as usize;
                        if let Some(start) = p.claim(g, len, len * g.chunk_size, 1) {
                            for cell in &owner[start..start + len] {
                                assert_eq!(cell.swap(id, Ordering::SeqCst), 0);
                            }
                            for cell in &owner[start..start + len] {
                                cell.store(0, Ordering::SeqCst);
                            }
                            p.release(start, len);
                        }
                    }
                });
            }
        });
        assert_eq!(p.free_runs(&[]), vec![FreeRun { start: 0, len: 256 }]);
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    //! Chunk-run claims that overlap: ascending claims with rollback never both win a chunk,
    //! and a rolled-back claim leaves nothing taken.
    use super::*;
    use crate::config::PoolConfig;
    use loom::sync::Arc;
    use loom::thread;

    #[test]
    fn overlapping_runs_never_share_a_chunk_and_rollbacks_leave_nothing() {
        loom::model(|| {
            // 130 chunks: the runs straddle the first bitmap word boundary (chunk 64).
            let g = Geometry::new(&PoolConfig::new(130 * (2 << 20)));
            let p = Arc::new(GlobalPool::new(&g, Placement::FirstFit, g.chunks).unwrap());
            let p2 = p.clone();
            let other = thread::spawn(move || p2.try_take(62, 4).then_some((62usize, 4usize)));
            let mine = p.try_take(63, 3).then_some((63usize, 3usize));
            let theirs = other.join().unwrap();
            assert!(mine.is_some() || theirs.is_some(), "one of two claims always wins");
            assert!(mine.is_none() || theirs.is_none(), "both runs hold chunks 63 and 64");
            let (start, len) = mine.or(theirs).unwrap();
            for chunk in 60..70 {
                assert_eq!(p.is_taken(chunk), (start..start + len).contains(&chunk), "chunk {chunk}");
            }
            p.release(start, len);
            assert!((60..70).all(|c| !p.is_taken(c)));
        });
    }
}

#[cfg(all(test, loom))]
mod loom_count_models {
    //! The count of free chunks against claims and releases: a chunk that stays free keeps
    //! `has_free` true while another chunk is released and claimed again at the same time.
    use super::*;
    use crate::config::PoolConfig;
    use loom::sync::Arc;
    use loom::thread;

    #[test]
    fn a_chunk_that_stays_free_is_always_counted() {
        loom::model(|| {
            let g = Geometry::new(&PoolConfig::new(4 * (2 << 20)));
            let p = Arc::new(GlobalPool::new(&g, Placement::FirstFit, g.chunks).unwrap());
            // Chunk 0 taken; chunk 3 stays free throughout; chunks 1 and 2 are taken by the
            // test so that only chunk 0 changes hands.
            assert!(p.try_take(0, 3));
            let releaser = {
                let p = p.clone();
                thread::spawn(move || p.release(0, 1))
            };
            let claimer = {
                let p = p.clone();
                thread::spawn(move || p.try_take(0, 1))
            };
            assert!(p.has_free(), "chunk 3 is free");
            releaser.join().unwrap();
            let claimed = claimer.join().unwrap();
            assert!(p.has_free());
            let free_bits = (0..4).filter(|&c| !p.is_taken(c)).count();
            assert_eq!(free_bits, if claimed { 1 } else { 2 });
            assert_eq!(p.free.load(Ordering::Acquire), free_bits, "the count agrees once all are done");
        });
    }
}

#[cfg(all(test, loom))]
mod loom_region_models {
    //! Publishing a region against concurrent claims: a claimer that takes a chunk of the new
    //! region finds it free and inside `end`, and the absent chunk between regions is never taken.
    use super::*;
    use crate::config::PoolConfig;
    use loom::sync::Arc;
    use loom::thread;

    #[test]
    fn a_claim_racing_a_publish_finds_the_region_whole() {
        loom::model(|| {
            let g = Geometry::new(&PoolConfig::new(8 << 20)); // 4 chunks of 2 MiB
            let p = Arc::new(GlobalPool::new(&g, Placement::FirstFit, 1).unwrap());
            assert!(p.try_take(0, 1), "the first region fills up");
            let grower = {
                let p = p.clone();
                thread::spawn(move || p.publish(2, 2))
            };
            assert!(!p.try_take(1, 1), "the absent chunk between regions is never taken");
            if let Some(start) = p.claim(&g, 1, g.chunk_size, 1) {
                assert!(start == 2 || start == 3, "claimed absent chunk {start}");
                assert_eq!(p.state(start), ChunkState::Free, "a claimed chunk of the region is whole");
                assert!(p.end() >= 4);
            }
            grower.join().unwrap();
            assert_eq!(p.state(1), ChunkState::Absent);
            assert!(p.is_taken(1));
            assert!(!p.try_take(1, 1));
        });
    }
}
