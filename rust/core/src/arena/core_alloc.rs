//! The buddy path of an allocation inside the chunks a core owns: a core's hint, its records
//! of free nodes and its level maps lead to a chunk, whose tree is searched through its bunch
//! summaries; the claimed nodes' units are counted taken. The pool (`pool/alloc.rs`) decides
//! which core's chunks to try, and when to grant a fresh chunk.

use super::arena::Arena;
use super::buddy::{Conflict, Node, Summary};
use super::chunk_space::Probe;
use super::core_pool::Hint;
use super::geometry::TRIM_SHIFT;
use super::layout::BuddyLayout;

/// How many recorded free nodes that fail their claim an allocation drops before it searches.
const MAX_RECORD_MISSES: u32 = 4;

/// How many levels above a block's an allocation that takes the node a free just released looks
/// for that free's record, to drop it.
const FREED_RECORD_LEVELS: u32 = 3;

impl Arena {
    /// Block `b` in a chunk owned by `owner`; returns its offset. Tries the owner's hint first,
    /// then, in address order (first fit: small blocks gather low, the high chunks stay whole
    /// for large blocks), the chunks that its level maps say may hold a free node of the
    /// block's level. A chunk whose search finds nothing is hidden at that level until a free
    /// there may have made room. The loom models in `loom_free_path.rs` race it with the free
    /// path.
    pub(crate) fn alloc_in_core(&self, b: &BuddyLayout, owner: usize) -> Option<usize> {
        let pool = &self.cores[owner];
        let hint = pool.hint(b.level).filter(|&(chunk, _)| chunk < self.geometry.chunks);
        if let Some((chunk, Hint::Freed(index))) = hint {
            // The node the last free of this level released: what it held, a block of this
            // level holds again (its pieces lie inside the freed ones when it is not larger).
            let e = Node { level: b.level, index };
            if index % b.step == 0 {
                // That free recorded the largest free node around it, mostly this node or one
                // a few levels larger: found before the claim (see `CorePool::free_holding`)
                // and dropped after it, as it no longer holds free room.
                let held = (b.level.saturating_sub(FREED_RECORD_LEVELS)..=b.level)
                    .rev()
                    .find_map(|level| pool.free_holding(level, chunk, b.level, index));
                if self.claim_in(chunk, b, e, true).is_ok() {
                    let offset = self.commit(chunk, b, e);
                    // The node is no longer free: the hint names its bunch instead, as after a
                    // search that succeeded there (a claim of the node would only fail).
                    pool.set_hint(b.level, chunk, self.shape.bunch_of(e));
                    if let Some(held) = held {
                        pool.drop_held(&held);
                        if held.level == b.level {
                            self.took_recorded(owner, chunk, b.level, held.sole);
                        }
                    }
                    return Some(offset);
                }
            }
        }
        if b.step <= 1 {
            if let Some(offset) = self.alloc_recorded(b, owner) {
                return Some(offset);
            }
        }
        if let Some((chunk, Hint::Bunch(bunch))) = hint {
            let tree = self.tree(chunk);
            let node = self.shape.search_in_bunch(tree, b.level, bunch, b.step, &mut |e| self.claim(chunk, b, e));
            if let Some(node) = node {
                return Some(self.commit(chunk, b, node));
            }
        }
        let owned = |w: usize| pool.owned_word(w);
        let mut from = 0;
        while let Some(chunk) = pool.maps.next(b.level, from, &owned) {
            from = chunk + 1;
            let space = &self.lines[chunk].space;
            let (free_units, probe) = space.look();
            if free_units < b.units {
                // No node of the block's level (or a larger one) can be free there: hidden
                // like a chunk whose search found nothing, until a free makes one.
                pool.maps.hide(space, chunk, b.level, probe);
                continue;
            }
            if let Some(offset) = self.alloc_in_chunk(chunk, b, owner, probe, false) {
                return Some(offset);
            }
            if b.step <= 1 {
                pool.maps.hide(space, chunk, b.level, probe);
            }
        }
        None
    }

    /// Block `b` (natural alignment) at a node of its level that `owner`'s record of free nodes
    /// holds (`arena/core_pool.rs`), newest first. A record that fails its claim (taken since)
    /// is dropped; after a few such, the search takes over.
    #[inline(always)]
    fn alloc_recorded(&self, b: &BuddyLayout, owner: usize) -> Option<usize> {
        let pool = &self.cores[owner];
        for _ in 0..MAX_RECORD_MISSES {
            let (chunk, index, sole) = pool.take_free(b.level)?;
            let e = Node { level: b.level, index };
            if chunk < self.geometry.chunks && self.claim_in(chunk, b, e, true).is_ok() {
                let offset = self.commit(chunk, b, e);
                self.took_recorded(owner, chunk, b.level, sole);
                return Some(offset);
            }
        }
        None
    }

    /// An allocation took the node of `level` in `chunk` that a record of `owner` named (its
    /// claim came after it read the record). When the free that recorded it left it the only
    /// free node of its level or a larger one there (`sole`, that free's epoch), and no free
    /// came since, the chunk has none left: hide the level in the owner's maps as a search that
    /// found nothing does, with that epoch as its probe (`arena/level_maps.rs`, *Take*).
    #[inline(always)]
    fn took_recorded(&self, owner: usize, chunk: usize, level: u32, sole: Option<Probe>) {
        if let Some(epoch) = sole {
            self.hide_taken(owner, chunk, level, epoch);
        }
    }

    #[inline(never)]
    fn hide_taken(&self, owner: usize, chunk: usize, level: u32, epoch: Probe) {
        self.cores[owner].maps.hide(&self.lines[chunk].space, chunk, level, epoch);
    }

    /// Search chunk `chunk` for block `b` (its epoch read as `probe` before); returns the
    /// block's offset. `thorough` also looks for a trimmed block's pieces where no whole
    /// enclosing node is free: twice the search, so only for the last resort (and always where
    /// the enclosing node cannot fit, in the arena's short last chunk).
    pub(crate) fn alloc_in_chunk(
        &self,
        chunk: usize,
        b: &BuddyLayout,
        hint_owner: usize,
        probe: Probe,
        thorough: bool,
    ) -> Option<usize> {
        let tree = self.tree(chunk);
        let space = &self.lines[chunk].space;
        let moved = || space.moved_since(probe);
        let summary = Summary::new(self.summaries(chunk), &moved);
        let cursor = self.cores[hint_owner].hint(b.level).and_then(|(c, hint)| {
            (c == chunk).then(|| match hint {
                Hint::Bunch(bunch) => bunch,
                Hint::Freed(index) => self.shape.bunch_of(Node { level: b.level, index }),
            })
        });
        let node =
            self.shape.search_summarized(tree, &summary, b.level, b.step, cursor, &mut |e| self.claim(chunk, b, e));
        let node = match node {
            Some(node) => {
                self.cores[hint_owner].set_hint(b.level, chunk, self.shape.bunch_of(node));
                node
            }
            None if !b.is_whole() && (thorough || self.geometry.usable_units(chunk) < b.enclosing) => {
                self.search_pieces(chunk, b)?
            }
            None => return None,
        };
        Some(self.commit(chunk, b, node))
    }

    /// [`Arena::alloc_in_chunk`] in a chunk just granted. A chunk that was a core's before may
    /// keep orphan marks in its tree (`TreeShape::sweep_all` says how they come), which the
    /// search cleans only when they lie right below the node it claims: a trimmed block's
    /// pieces lower down would still meet them. Where the search finds no place in the
    /// granted chunk, every mark over an empty bunch goes and the search runs once more.
    ///
    /// The chunk holds a block now, so it serves no whole-chunk node: its level 0 is hidden
    /// right away (`Arena::hide_whole_chunk`).
    pub(crate) fn alloc_in_fresh_chunk(&self, chunk: usize, b: &BuddyLayout, core: usize) -> Option<usize> {
        let probe = self.lines[chunk].space.probe(0)?;
        let offset = self.alloc_in_chunk(chunk, b, core, probe, false).or_else(|| {
            self.shape.sweep_all(self.tree(chunk));
            let probe = self.lines[chunk].space.probe(b.units)?;
            self.alloc_in_chunk(chunk, b, core, probe, false)
        })?;
        self.hide_whole_chunk(chunk, core);
        Some(offset)
    }

    /// A trimmed block needs only its pieces free, not its whole enclosing node: find a free
    /// left half (the first piece) and claim the rest after it. This places blocks where the
    /// enclosing node's tail is in use, and in the arena's last chunk when the enclosing node
    /// reaches past the arena's end. Returns the enclosing node. The search cleans the phantom
    /// marks on its way to the half it finds, not those over the other pieces, in the other
    /// half: the claim cleans them (a mark left over an emptied bunch there refused every such
    /// block for good, while the statistics, which read the allocated nodes, counted the room).
    fn search_pieces(&self, chunk: usize, b: &BuddyLayout) -> Option<Node> {
        let tree = self.tree(chunk);
        let parent = |half: Node| Node { level: b.level, index: half.index / 2 };
        let half =
            self.shape.search(tree, b.level + 1, b.step * 2, &mut |n| self.claim_in(chunk, b, parent(n), true))?;
        Some(parent(half))
    }

    /// Claim the block with enclosing node `e`: the node itself, or its trimmed pieces (rolled
    /// back if one of them is taken).
    #[inline]
    fn claim(&self, chunk: usize, b: &BuddyLayout, e: Node) -> std::result::Result<(), Conflict> {
        self.claim_in(chunk, b, e, false)
    }

    /// [`Arena::claim`]; `cleaning`: clear phantom marks in the way of a piece first (a node
    /// found by other means than a search of the tree, which cleans them as it goes).
    #[inline(always)]
    fn claim_in(&self, chunk: usize, b: &BuddyLayout, e: Node, cleaning: bool) -> std::result::Result<(), Conflict> {
        let tree = self.tree(chunk);
        let shape = &self.shape;
        if b.is_whole() {
            return if cleaning { shape.try_alloc_cleaning(tree, e) } else { shape.try_alloc(tree, e) };
        }
        // At its enclosing node's start a trimmed block has at most TRIM_SHIFT pieces: one per
        // set bit of its units, largest first (what `b.pieces` gives, without the iterator).
        let depth = self.geometry.depth;
        let mut pieces = [e; TRIM_SHIFT as usize];
        let mut count = 0;
        let (mut start, mut rest) = (e.start(depth), b.units);
        while rest != 0 && count < pieces.len() {
            let units = 1u64 << (63 - rest.leading_zeros());
            pieces[count] = Node::covering(depth, start, units);
            (start, rest, count) = (start + units, rest - units, count + 1);
        }
        debug_assert!(pieces[..count].iter().copied().eq(b.pieces(depth, e)));
        match shape.try_alloc_block(tree, &pieces[..count], cleaning) {
            Ok(()) => Ok(()),
            Err((conflict, 0)) => Err(conflict),
            Err((_, undone)) => {
                let hidden = self.lines[chunk].space.refresh();
                self.announce_free(chunk, hidden, pieces[..undone].iter().copied());
                Err(Conflict::Taken)
            }
        }
    }

    /// Count the units of block `b`, just claimed at enclosing node `e` of `chunk`, taken;
    /// returns the block's offset.
    fn commit(&self, chunk: usize, b: &BuddyLayout, e: Node) -> usize {
        let after = self.take_units(chunk, b.units);
        self.lower_memo_after_take(chunk, after);
        self.geometry.offset_of(chunk, e.start(self.geometry.depth))
    }
}
