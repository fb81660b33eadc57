//! The exact-position API: take the bytes of a buddy block, a chunk run or a whole chunk at the
//! position the caller names, or give them back, with none of the allocation path's side
//! effects (no search, no hint, no chunk going back to the global pool by itself). Compaction
//! uses it on a paused pool, so the only writer is the caller. Whole chunks are
//! `Arena::grant_exact` and `Arena::retire_swept` (`chunks.rs`); slab objects
//! `SlabCaches::claim_at` and `SlabCaches::unclaim_at` (`slab/exact.rs`); runs with a tail
//! `Arena::tailed_run_reserve_at` and `Arena::tailed_run_release_raw` (`tail.rs`).
//!
//! The free path (`arena/release.rs`) gives blocks back through the same primitives
//! ([`Arena::unmark_buddy`], [`Arena::free_run`]), after its own checks.

use std::collections::HashSet;

use super::arena::Arena;
use super::buddy::{Node, TreeShape, MAX_BLOCK_NODES};
use super::chunk_space::Probe;
use super::geometry::TRIM_SHIFT;
use super::global::ChunkState;
use super::layout::{BuddyLayout, Layout};

/// Why a free found nothing to release where no block is allocated: a block freed twice, or an
/// offset that never held one, which the pool cannot tell apart.
pub(crate) const NOTHING_ALLOCATED: &str = "no block is allocated there (freed already, or never allocated)";

/// Chunks whose buddy tree was swept (`sweep_all`) during the current batch (lazy-coalescing
/// marks cleared: a node is free for `try_alloc` exactly when no block covers any of its units).
#[derive(Default)]
pub(crate) struct Swept(HashSet<usize>);

impl Swept {
    /// Forget every sweep (after blocks were taken and given back again).
    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }

    /// Note that `chunk` is swept now; `true` when it was not yet (the caller sweeps it).
    pub(crate) fn insert(&mut self, chunk: usize) -> bool {
        self.0.insert(chunk)
    }
}

/// What giving back a buddy block's nodes learnt ([`Arena::unmark_buddy_coalesced`]).
pub(crate) struct Unmarked {
    /// The chunk's free units after.
    pub(crate) after: u64,
    /// The level of the largest free node around the block's first node, when the
    /// announcement had to find it.
    pub(crate) coalesced: Option<u32>,
    /// The free's epoch, when its announcement made that node the only free node of its level
    /// or a larger one in the chunk (`LevelMaps::announce`): an allocation that takes the node
    /// while the epoch holds may hide the level again.
    pub(crate) sole: Option<Probe>,
    /// The free run around the block (units `[start, stop)` of the chunk, read after its
    /// release: `TreeShape::free_run_around`), when the caller asked for it.
    pub(crate) run: Option<(u64, u64)>,
}

impl Arena {
    /// The chunk and first unit of a buddy block of layout `b` at `offset`, if a block can
    /// start there (on a unit, inside one chunk; packed blocks start anywhere the bank rule
    /// allows, which the caller checks).
    fn block_start(&self, offset: usize, b: &BuddyLayout) -> Option<(usize, u64)> {
        let chunk = self.geometry.chunk_of(offset);
        let within = self.geometry.unit_in_chunk(offset);
        if chunk >= self.geometry.chunks
            || offset & (self.geometry.min_block - 1) != 0
            || within + b.units > self.geometry.usable_units(chunk)
        {
            return None;
        }
        Some((chunk, within))
    }

    /// Release the nodes of buddy block `b` that starts at unit `within` of `chunk`, and give
    /// its units back; returns the chunk's free units after. `Err` (and no change) when the
    /// block is not allocated there; of two callers releasing the same block, one gets `Err`.
    #[inline(always)]
    pub(crate) fn unmark_buddy(&self, chunk: usize, b: &BuddyLayout, within: u64) -> Result<u64, &'static str> {
        let after = self.unmark_buddy_coalesced(chunk, b, within, false)?.after;
        // The step did not carry the chunk's stretch memo (`stretch_classes.rs`).
        self.stretch_classes.mark_unsure(chunk);
        Ok(after)
    }

    /// [`Arena::unmark_buddy`], also telling what the announcement learnt ([`Unmarked`]).
    /// With `read_run`, the free run around the block is read once the block is released,
    /// and the announcement takes the levels of the largest free nodes around its pieces from
    /// it instead of climbing the tree for each.
    #[inline(always)]
    pub(crate) fn unmark_buddy_coalesced(
        &self,
        chunk: usize,
        b: &BuddyLayout,
        within: u64,
        read_run: bool,
    ) -> Result<Unmarked, &'static str> {
        let (after, hidden, epoch) = self.unmark_nodes(chunk, b, within)?;
        let depth = self.geometry.depth;
        let run = read_run.then(|| self.shape.free_run_around(self.tree(chunk), within, within + b.units));
        let pieces = b.pieces_at(depth, within);
        let quiet = Unmarked { after, coalesced: None, sole: None, run };
        if within & (b.enclosing - 1) != 0 {
            // A packed block: its pieces may lie at any level, side by side in any order.
            self.announce_nodes(chunk, hidden, Some(epoch), run, pieces);
            return Ok(quiet);
        }
        // With nothing hidden, only pieces inside summarized bunches have a summary to lower. At
        // its enclosing node's start a piece is at most TRIM_SHIFT levels below that node; a
        // block of one node has none to lower when the summaries around it rule nothing out.
        let deepest = if b.is_whole() { b.level } else { b.level + TRIM_SHIFT };
        if hidden == 0
            && (deepest < self.shape.summarized_from()
                || b.is_whole()
                    && self.shape.summaries_settled(self.summaries(chunk), Node::covering(depth, within, b.enclosing)))
        {
            return Ok(quiet);
        }
        let (coalesced, sole) = self.announce_block(chunk, hidden, epoch, run, pieces);
        Ok(Unmarked { after, coalesced, sole: sole.then_some(epoch), run })
    }

    /// [`Arena::announce_free`] for the pieces of a block at its enclosing node's start. Every
    /// later piece lies in the enclosing node's right half, so it joins a free node larger than
    /// that half only through the first piece: the first piece's largest free node is the
    /// largest of them all, and it alone decides the owner's announcement (its epoch step
    /// made `epoch`). Returns its level when it was found, and whether the announcement made
    /// the first piece's largest free node the only one of its level or larger in the chunk
    /// (`LevelMaps::announce`). `run`: the free run around the block, when it was read.
    #[inline]
    fn announce_block(
        &self,
        chunk: usize,
        hidden: u32,
        epoch: Probe,
        run: Option<(u64, u64)>,
        mut pieces: impl Iterator<Item = Node>,
    ) -> (Option<u32>, bool) {
        let tree = self.tree(chunk);
        let summaries = self.summaries(chunk);
        let Some(first) = pieces.next() else {
            return (None, false);
        };
        let mut coalesced = None;
        let mut sole = false;
        self.shape.announce_in_bunches(tree, summaries, (first, first), run, &mut coalesced);
        if hidden != 0 {
            let level = *coalesced.get_or_insert_with(|| self.shape.coalesced_level_in(tree, first, run));
            if level < hidden {
                sole = self.announce_to_owner(chunk, level, Some(epoch), hidden);
            }
        }
        for node in pieces {
            // A later piece's largest free node is no larger than the first's: the first's
            // level lowers the summaries enough, found at most once for all the pieces.
            self.shape.announce_in_bunches(tree, summaries, (node, first), run, &mut coalesced);
        }
        (coalesced, sole)
    }

    /// The release of [`Arena::unmark_buddy`] without its announcement: the nodes released and
    /// the units given back (the epoch advanced). Returns the free units after and the
    /// hidden-level threshold and the epoch the step made.
    #[inline(always)]
    fn unmark_nodes(&self, chunk: usize, b: &BuddyLayout, within: u64) -> Result<(u64, u32, Probe), &'static str> {
        let tree = self.tree(chunk);
        let depth = self.geometry.depth;
        if b.is_one_node_at(within) {
            // One node: its release is the check (and decides a race of two callers).
            if self.shape.release(tree, Node::covering(depth, within, b.enclosing)).is_err() {
                return Err(self.not_allocated_there(chunk, within));
            }
        } else {
            // Several nodes: all must be allocated before any is freed; the release of the
            // first bunch's nodes decides who frees the block when two callers race.
            let mut nodes = [Node { level: 0, index: 0 }; MAX_BLOCK_NODES];
            let mut count = 0;
            for p in b.pieces_at(depth, within) {
                if count == MAX_BLOCK_NODES {
                    return self.unmark_many(chunk, b, within);
                }
                nodes[count] = p;
                count += 1;
            }
            if self.shape.release_block(tree, &nodes[..count]).is_err() {
                return Err(self.not_allocated_there(chunk, within));
            }
        }
        Ok(self.lines[chunk].space.give_stepped(b.units))
    }

    /// Why no block of the size given starts at unit `within` of `chunk` (its free found
    /// nothing to release): a node on the way from that unit's leaf to the root is allocated,
    /// so another block holds the unit, starting there (of another size) or before it; or none
    /// is ([`NOTHING_ALLOCATED`]). Read for the error only.
    #[cold]
    pub(super) fn not_allocated_there(&self, chunk: usize, within: u64) -> &'static str {
        let tree = self.tree(chunk);
        let depth = self.geometry.depth;
        for level in (0..=depth).rev() {
            let node = Node { level, index: within >> (depth - level) };
            if self.shape.is_allocated(tree, node) {
                return match node.start(depth) == within {
                    true => "a block of another size is allocated there",
                    false => "another block holds these bytes",
                };
            }
        }
        NOTHING_ALLOCATED
    }

    /// Why a free of `size` requested bytes at `offset`, whose chunk is free in the global pool,
    /// found nothing to release: the block would run past the pool's regions, or no block is
    /// allocated there ([`NOTHING_ALLOCATED`]). Read for the error only.
    #[cold]
    pub(crate) fn why_free_chunk(&self, offset: usize, size: usize) -> &'static str {
        let g = &self.geometry;
        let last = offset.saturating_add(size.max(1) - 1);
        if last >= g.usable_capacity()
            || (g.chunk_of(offset)..=g.chunk_of(last)).any(|c| self.global.state(c) == ChunkState::Absent)
        {
            return "the block would run past the pool's regions";
        }
        NOTHING_ALLOCATED
    }

    /// [`Arena::unmark_nodes`] for a packed block of more than [`MAX_BLOCK_NODES`] nodes, one node at a
    /// time.
    #[cold]
    fn unmark_many(&self, chunk: usize, b: &BuddyLayout, within: u64) -> Result<(u64, u32, Probe), &'static str> {
        let tree = self.tree(chunk);
        let depth = self.geometry.depth;
        if !b.pieces_at(depth, within).all(|p| self.shape.is_allocated(tree, p)) {
            return Err(self.not_allocated_there(chunk, within));
        }
        let mut pieces = b.pieces_at(depth, within);
        let first = pieces.next().expect("a block has at least one node");
        if self.shape.release(tree, first).is_err() {
            return Err(self.not_allocated_there(chunk, within));
        }
        for p in pieces {
            let _ = self.shape.release(tree, p);
        }
        Ok(self.lines[chunk].space.give_stepped(b.units))
    }

    /// After `nodes` of `chunk` were released and its epoch advanced (which returned `hidden`):
    /// lower the summaries of the bunches around them, and, if the owner's level maps hide a
    /// level that the release may have made servable, announce it (`level_maps.rs`).
    #[inline]
    /// The step did not carry the chunk's stretch memo: the chunk is unsure
    /// (`stretch_classes.rs`).
    pub(crate) fn announce_free(&self, chunk: usize, hidden: u32, nodes: impl Iterator<Item = Node>) {
        self.stretch_classes.mark_unsure(chunk);
        self.announce_nodes(chunk, hidden, None, None, nodes);
    }

    /// [`Arena::announce_free`] after an epoch step that made `given` (`None`: not known), with
    /// `run` the free run around the nodes when it was read.
    #[inline]
    fn announce_nodes(
        &self,
        chunk: usize,
        hidden: u32,
        given: Option<Probe>,
        run: Option<(u64, u64)>,
        nodes: impl Iterator<Item = Node>,
    ) {
        let tree = self.tree(chunk);
        let summaries = self.summaries(chunk);
        let mut largest: Option<u32> = None;
        for node in nodes {
            let mut coalesced = None;
            self.shape.announce_in_bunches(tree, summaries, (node, node), run, &mut coalesced);
            if hidden != 0 {
                let level = coalesced.unwrap_or_else(|| self.shape.coalesced_level_in(tree, node, run));
                largest = Some(largest.map_or(level, |l| l.min(level)));
            }
        }
        if let Some(level) = largest.filter(|&l| l < hidden) {
            self.announce_to_owner(chunk, level, given, hidden);
        }
    }

    /// Announce a free node of `level` in `chunk` to its owner's level maps, after the epoch
    /// step that made `given` and returned the threshold `hidden`; whether the node is the only
    /// one of its level or larger there (`LevelMaps::announce`). A chunk whose every level was
    /// hidden on purpose (the rest of a run's tail) has that rest shown now: it leaves the set
    /// of such chunks (`hidden_rests.rs`).
    #[inline(never)]
    fn announce_to_owner(&self, chunk: usize, level: u32, given: Option<Probe>, hidden: u32) -> bool {
        let ChunkState::Core(owner) = self.global.state(chunk) else {
            return false;
        };
        let space = &self.lines[chunk].space;
        let sole = self.cores[owner].maps.announce(space, chunk, level, given);
        let depth = self.geometry.depth;
        if hidden > depth {
            self.hidden_rests.forget(chunk, &mut || space.hidden() > depth);
        }
        sole
    }

    /// Give back the buddy block of `size` bytes at `offset` (nothing else happens: an emptied
    /// chunk stays with its core).
    pub(crate) fn buddy_release_raw(&self, offset: usize, size: usize) -> Result<(), String> {
        let b = self.geometry.buddy_layout(size).ok_or("a block of this size is a chunk run")?;
        let (chunk, start) = self.block_start(offset, &b).ok_or("not the start of a buddy block")?;
        self.unmark_buddy(chunk, &b, start)
            .map(|_| ())
            .map_err(|why| format!("no buddy block of {size} bytes at offset {offset}: {why}"))
    }

    /// [`Arena::buddy_release_raw`] without telling the bunch summaries and the owner's level
    /// maps (on a paused pool, for a batch that gives back many blocks): the caller calls
    /// [`Arena::announce_chunk`] for the block's chunk before anyone allocates again.
    pub(crate) fn buddy_release_quiet(&self, offset: usize, size: usize) -> Result<(), String> {
        let b = self.geometry.buddy_layout(size).ok_or("a block of this size is a chunk run")?;
        let (chunk, start) = self.block_start(offset, &b).ok_or("not the start of a buddy block")?;
        self.unmark_nodes(chunk, &b, start)
            .map(|_| ())
            .map_err(|why| format!("no buddy block of {size} bytes at offset {offset}: {why}"))
    }

    /// After quiet releases in `chunk` (on a paused pool): forget its bunch summaries and show
    /// every level of it in its owner's level maps, as a reveal does (`reveal.rs`). Setting a
    /// level's bit is always safe: a search that finds nothing there hides it again. Once per
    /// chunk this costs a few stores, where announcing each release costs a climb of the tree.
    /// The releases' epoch steps did not carry the chunk's stretch memo, which still names the
    /// longest stretch before them: the chunk is unsure (`stretch_classes.rs`), so that the
    /// searches through the length classes read its tree instead of passing it over.
    pub(crate) fn announce_chunk(&self, chunk: usize) {
        self.stretch_classes.mark_unsure(chunk);
        let ChunkState::Core(owner) = self.global.state(chunk) else { return };
        TreeShape::reset_summaries(self.summaries(chunk));
        if self.lines[chunk].space.hidden() != 0 {
            self.cores[owner].maps.reveal(&self.lines[chunk].space, chunk);
        }
    }

    /// Take the buddy block of `size` bytes at `offset` in a core chunk: every unit of it must
    /// be free. The chunk's tree is swept first (once per batch, see [`Swept`]).
    pub(crate) fn buddy_reserve_at(&self, offset: usize, size: usize, swept: &mut Swept) -> Result<(), String> {
        let b = self.geometry.buddy_layout(size).ok_or("a block of this size is a chunk run")?;
        let (chunk, start) = self
            .block_start(offset, &b)
            .ok_or_else(|| format!("offset {offset} cannot start a block of {size} bytes inside one chunk"))?;
        if !matches!(self.global.state(chunk), ChunkState::Core(_)) {
            return Err(format!("chunk {chunk} does not belong to a core pool"));
        }
        let tree = self.tree(chunk);
        if swept.0.insert(chunk) {
            self.shape.sweep_all(tree);
        }
        let depth = self.geometry.depth;
        for (i, p) in b.pieces_at(depth, start).enumerate() {
            if self.shape.try_alloc(tree, p).is_err() {
                for q in b.pieces_at(depth, start).take(i) {
                    let _ = self.shape.release(tree, q);
                }
                return Err(format!("the bytes at offset {offset} (+{size}) are not free"));
            }
        }
        let after = self.take_units(chunk, b.units);
        self.lower_memo_after_take(chunk, after);
        Ok(())
    }

    /// Give the run of `len` chunks at chunk `start` back to the global pool; `false` (and no
    /// change) when no such run starts there (of two callers, one gets `false`).
    #[inline]
    pub(crate) fn free_run(&self, start: usize, len: usize) -> bool {
        self.free_run_headed(start, len, ChunkState::RunHead(len))
    }

    /// [`Arena::free_run`] for a run whose head is in state `head` (a plain run's or one with a
    /// tail, `arena/tail.rs`; the tail is not touched).
    #[inline]
    pub(crate) fn free_run_headed(&self, start: usize, len: usize, head: ChunkState) -> bool {
        if !self.global.swap_state(start, head, ChunkState::Free) {
            return false;
        }
        for c in start + 1..start + len {
            self.global.set_state(c, ChunkState::Free);
        }
        self.global.release(start, len);
        true
    }

    /// Mark chunks `[start, start + len)`, just taken from the global pool, as one run.
    #[inline]
    pub(crate) fn mark_run(&self, start: usize, len: usize) {
        for c in start + 1..start + len {
            self.global.set_state(c, ChunkState::RunBody);
        }
        self.global.set_state(start, ChunkState::RunHead(len));
    }

    /// Give back the run of `len` chunks starting at chunk `start`.
    pub(crate) fn run_release_raw(&self, start: usize, len: usize) -> Result<(), String> {
        match self.free_run(start, len) {
            true => Ok(()),
            false => Err(format!("no run of {len} chunks starts at chunk {start}")),
        }
    }

    /// Give back the run of `len` chunks at chunk `start` that holds a block of `size` bytes,
    /// and its tail if the block has one (`arena/tail.rs`).
    pub(crate) fn run_release_sized(&self, start: usize, len: usize, size: usize) -> Result<(), String> {
        match self.geometry.layout(size, 1) {
            Layout::RunTail { tail, .. } => self.tailed_run_release_raw(start, len, &tail),
            _ => self.run_release_raw(start, len),
        }
    }

    /// Take the run of `len` chunks at chunk `start` for a block of `size` bytes, and its tail
    /// at the start of the core chunk after them if the block has one (that chunk's tree is
    /// swept first, once per batch, see [`Swept`]).
    pub(crate) fn run_reserve_sized(
        &self,
        start: usize,
        len: usize,
        size: usize,
        swept: &mut Swept,
    ) -> Result<(), String> {
        match self.geometry.layout(size, 1) {
            Layout::RunTail { tail, .. } => {
                let last = start + len;
                if last < self.geometry.chunks
                    && matches!(self.global.state(last), ChunkState::Core(_))
                    && swept.0.insert(last)
                {
                    self.shape.sweep_all(self.tree(last));
                }
                self.tailed_run_reserve_at(start, len, &tail)
            }
            _ => self.run_reserve_at(start, len),
        }
    }

    /// Take chunks `[start, start + len)` as one run: all must be free in the global pool.
    pub(crate) fn run_reserve_at(&self, start: usize, len: usize) -> Result<(), String> {
        if start + len > self.geometry.chunks || !self.global.try_take(start, len) {
            return Err(format!("chunks {start}..{} are not all free", start + len));
        }
        self.mark_run(start, len);
        Ok(())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::arena::slab::caches::SlabClasses;
    use crate::config::PoolConfig;

    /// A bare arena of 16 chunks of 2 MiB on two cores: no handles, no pool.
    fn arena() -> Arena {
        let config = PoolConfig::new(32 << 20).cores(2);
        config.validate().unwrap();
        let classes = SlabClasses::of(&config);
        Arena::new(&config, classes).unwrap()
    }

    #[test]
    fn a_buddy_block_is_taken_and_given_back_where_asked() {
        let a = arena();
        let chunk = 3;
        assert!(a.grant_exact(chunk, 1));
        assert!(!a.grant_exact(chunk, 0), "a granted chunk is not free");
        let at = chunk * a.geometry.chunk_size + (64 << 10);
        let mut swept = Swept::default();
        a.buddy_reserve_at(at, 64 << 10, &mut swept).unwrap();
        assert!(a.buddy_reserve_at(at + 4096, 4096, &mut swept).is_err(), "inside the block just taken");
        assert_eq!(a.lines[chunk].space.free_units(), a.geometry.usable_units(chunk) - 256);
        a.buddy_release_raw(at, 64 << 10).unwrap();
        assert!(a.buddy_release_raw(at, 64 << 10).is_err(), "given back already");
        assert!(a.chunk_is_empty(chunk), "nothing else happened: the chunk stays with its core");
        assert_eq!(a.global.state(chunk), ChunkState::Core(1));
        assert!(a.retire_swept(chunk, 1));
        assert_eq!(a.global.state(chunk), ChunkState::Free);
    }

    /// A quiet release tells nobody; announcing its chunk afterwards shows every level of it,
    /// the free half's among them, and makes the chunk unsure: its stretch memo names the
    /// longest stretch from before the release.
    #[test]
    fn a_chunk_announced_after_quiet_releases_shows_its_largest_free_node() {
        let a = arena();
        let chunk = 3;
        assert!(a.grant_exact(chunk, 1));
        let base = chunk * a.geometry.chunk_size;
        let half = a.geometry.chunk_size / 2;
        let mut swept = Swept::default();
        a.buddy_reserve_at(base, half, &mut swept).unwrap();
        a.buddy_reserve_at(base + half, half, &mut swept).unwrap();
        // A search found nothing at every level above 5: they are hidden (the two halves left
        // the chunk full, which hid every level already).
        let probe = a.lines[chunk].space.probe(0).unwrap();
        assert!(a.lines[chunk].space.raise_hidden(5, probe));
        let hidden = a.lines[chunk].space.hidden();
        assert!(hidden >= 5);
        a.buddy_release_quiet(base + half, half).unwrap();
        assert_eq!(a.lines[chunk].space.hidden(), hidden, "a quiet release announces nothing");
        assert!(a.buddy_release_quiet(base + half, half).is_err(), "given back already");
        assert_eq!(a.stretch_classes.unsure_word(chunk / 64) & 1 << (chunk % 64), 0, "a quiet release tells nothing");
        a.announce_chunk(chunk);
        assert_eq!(a.lines[chunk].space.hidden(), 0, "every level is shown");
        assert_ne!(
            a.stretch_classes.unsure_word(chunk / 64) & 1 << (chunk % 64),
            0,
            "the memo from before the releases no longer bounds the chunk's stretches"
        );
        assert_eq!(a.lines[chunk].space.free_units(), a.geometry.usable_units(chunk) / 2);
    }

    #[test]
    fn a_buddy_block_needs_a_core_chunk_and_a_unit_start() {
        let a = arena();
        let mut swept = Swept::default();
        assert!(a.buddy_reserve_at(0, 4096, &mut swept).is_err(), "chunk 0 is in the global pool");
        assert!(a.grant_exact(0, 0));
        assert!(a.buddy_reserve_at(100, 4096, &mut swept).is_err(), "not on a unit");
        assert!(a.buddy_reserve_at(a.geometry.chunk_size - 256, 4096, &mut swept).is_err(), "past the chunk's end");
        assert!(a.buddy_reserve_at(0, 4 << 20, &mut swept).is_err(), "a chunk run");
    }

    #[test]
    fn a_run_is_taken_and_given_back_at_its_chunks() {
        let a = arena();
        a.run_reserve_at(4, 3).unwrap();
        assert!(a.run_reserve_at(6, 2).is_err(), "overlaps the run");
        assert_eq!((a.global.state(4), a.global.state(5)), (ChunkState::RunHead(3), ChunkState::RunBody));
        assert!(a.run_release_raw(4, 2).is_err(), "not the run's length");
        a.run_release_raw(4, 3).unwrap();
        assert!(a.run_release_raw(4, 3).is_err(), "given back already");
        assert!((4..7).all(|c| a.global.state(c) == ChunkState::Free && !a.global.is_taken(c)));
        assert!(a.run_reserve_at(15, 2).is_err(), "past the arena's end");
    }

    #[test]
    fn reclaiming_retires_exactly_the_empty_chunks() {
        let a = arena();
        for (chunk, owner) in [(1, 0), (2, 0), (5, 1)] {
            assert!(a.grant_exact(chunk, owner));
        }
        let mut swept = Swept::default();
        a.buddy_reserve_at(2 * a.geometry.chunk_size, 4096, &mut swept).unwrap();
        assert_eq!(a.reclaim_empty_chunks(false), 2);
        assert_eq!(a.global.state(2), ChunkState::Core(0), "a chunk in use stays");
        assert_eq!((a.global.state(1), a.global.state(5)), (ChunkState::Free, ChunkState::Free));
        a.buddy_release_raw(2 * a.geometry.chunk_size, 4096).unwrap();
        assert_eq!(a.retire_empty_chunks(), 1);
        assert_eq!(a.reclaim_empty_chunks(true), 0);
    }
}
