//! The chunks whose rest a run's tail hid on purpose. A chunk granted for a tail has every level
//! hidden from its core's searches (`tail.rs`), so that small blocks do not settle next to a
//! run that comes and goes; its rest serves other blocks once a free there announces room or a
//! failing allocation reveals it (`reveal.rs`). The failing allocation finds such chunks here,
//! wherever they lie, instead of reading every chunk's free-space word.
//!
//! The set is a hint kept by one rule. Whoever hides a chunk's rest adds the chunk after hiding
//! it, with a read-modify-write of the chunk's bitmap word even when its bit is set; whoever
//! goes through the set takes each member out (a read-modify-write too) before it looks at the
//! chunk, and puts it back when the rest stays hidden. The two read-modify-writes of a word are
//! ordered: an add after the take leaves the chunk in the set, and a take after the add reads
//! what came before it, the hiding included. So once a hider is done, a chunk hidden on
//! purpose is in the set unless a pass revealed it (the loom models below race the two). A
//! free that announces room in a member takes it out by the same rule, so that failing
//! allocations do not pay for members whose rest is shown already.

use crate::arena::chunk_sets::ChunkSets;
use crate::error::Result;

/// The set (see the module documentation).
pub(crate) struct HiddenRests(ChunkSets);

impl HiddenRests {
    /// An empty set over `chunks` chunks.
    pub(crate) fn new(chunks: usize) -> Result<HiddenRests> {
        Ok(HiddenRests(ChunkSets::new(chunks, 1, "the set of chunks with a hidden rest")?))
    }

    /// Chunk `chunk`'s rest was just hidden.
    #[inline]
    pub(crate) fn add(&self, chunk: usize) {
        self.0.insert_ordered(0, chunk);
    }

    /// Take every member that `among` (a bitmap word of chunks, by word index) and `wanted`
    /// keep out and call `visit` on it; a chunk for which `visit` returns true (its rest stays
    /// hidden) goes back into the set. A member passed over stays in the set untouched, as a
    /// visit that keeps it would leave it: a look that needs no visit (a member whose rest
    /// cannot hold the request) spares the two read-modify-writes of one.
    pub(crate) fn pass(
        &self,
        among: &dyn Fn(usize) -> u64,
        wanted: &dyn Fn(usize) -> bool,
        visit: &mut dyn FnMut(usize) -> bool,
    ) {
        let mut from = 0;
        while let Some(chunk) = self.0.next(0, from, among) {
            from = chunk + 1;
            if wanted(chunk) {
                self.visit(chunk, &mut || visit(chunk));
            }
        }
    }

    /// A free announced room in `chunk`, so its rest is no longer hidden on purpose: take it
    /// out of the set, as a pass does, unless `hidden_on_purpose()` says that it is hidden
    /// again by then. Otherwise the member would stay until a failing allocation's pass, which
    /// would read the chunk's line only to drop it (on the churn at 85%, about 180 of them at
    /// the first failure).
    pub(crate) fn forget(&self, chunk: usize, hidden_on_purpose: &mut dyn FnMut() -> bool) {
        self.visit(chunk, hidden_on_purpose);
    }

    /// Take `chunk` out, and put it back when `keep()` says so (after the take).
    #[inline]
    fn visit(&self, chunk: usize, keep: &mut dyn FnMut() -> bool) {
        self.0.remove(0, chunk);
        if keep() {
            self.0.insert_ordered(0, chunk);
        }
    }

    /// The members, in address order.
    #[cfg(all(test, not(loom)))]
    pub(crate) fn members(&self) -> Vec<usize> {
        let mut members = Vec::new();
        while let Some(chunk) = self.0.next(0, members.last().map_or(0, |&c: &usize| c + 1), &|_| u64::MAX) {
            members.push(chunk);
        }
        members
    }

    #[cfg(all(test, loom))]
    fn contains(&self, chunk: usize) -> bool {
        self.0.contains(0, chunk)
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    //! A hider (hide the chunk's every level, then add it) racing a pass (reveal a member whose
    //! rest is still hidden, or keep it): afterwards a chunk whose rest is hidden is in the set.
    use super::*;
    use crate::arena::chunk_space::ChunkSpace;
    use crate::arena::level_maps::LevelMaps;
    use loom::sync::Arc;
    use loom::thread;

    const DEPTH: u32 = 2;

    fn hidden_on_purpose(space: &ChunkSpace) -> bool {
        space.hidden() > DEPTH
    }

    /// What the chunk was before the race.
    #[derive(Clone, Copy)]
    enum Before {
        /// Not in the set, its levels visible.
        Open,
        /// An earlier tail hid the rest, and the chunk is in the set.
        Hidden,
        /// In the set, but a free there announced room since (a stale member).
        Stale,
    }

    /// What the pass does with the member.
    #[derive(Clone, Copy)]
    enum Pass {
        /// Takes it out and reveals it.
        Reveal,
        /// Takes it out and puts it back (too little room for the request).
        Keep,
        /// Passes over it without taking it out.
        Skip,
    }

    fn race(pass: Pass, before: Before) {
        loom::model(move || {
            let space = Arc::new(ChunkSpace::new(1 << DEPTH));
            let maps = Arc::new(LevelMaps::new(1, DEPTH as usize + 1).unwrap());
            let rests = Arc::new(HiddenRests::new(1).unwrap());
            maps.open(&space, 0);
            match before {
                Before::Open => {}
                Before::Hidden => {
                    maps.hide(&space, 0, DEPTH, space.probe(0).unwrap());
                    rests.add(0);
                }
                Before::Stale => rests.add(0),
            }
            let (sp2, m2, r2) = (space.clone(), maps.clone(), rests.clone());
            let hider = thread::spawn(move || {
                m2.hide(&sp2, 0, DEPTH, sp2.probe(0).unwrap());
                r2.add(0);
            });
            let wanted = |_| !matches!(pass, Pass::Skip);
            rests.pass(&|_| u64::MAX, &wanted, &mut |chunk| {
                if !hidden_on_purpose(&space) {
                    return false;
                }
                if let Pass::Reveal = pass {
                    maps.reveal(&space, chunk);
                    return false;
                }
                true // too little room for the request: it stays hidden
            });
            hider.join().unwrap();
            assert!(!hidden_on_purpose(&space) || rests.contains(0), "a hidden rest left the set");
        });
    }

    /// A free that announces room in the chunk (and then takes it out of the set) racing a
    /// hider: afterwards a chunk whose rest is hidden is in the set.
    #[test]
    fn a_hide_racing_a_free_that_forgets_the_chunk_leaves_a_hidden_rest_in_the_set() {
        for before in [Before::Hidden, Before::Stale] {
            loom::model(move || {
                let space = Arc::new(ChunkSpace::new(1 << DEPTH));
                let maps = Arc::new(LevelMaps::new(1, DEPTH as usize + 1).unwrap());
                let rests = Arc::new(HiddenRests::new(1).unwrap());
                maps.open(&space, 0);
                if let Before::Hidden = before {
                    maps.hide(&space, 0, DEPTH, space.probe(0).unwrap());
                }
                rests.add(0);
                let (sp2, m2, r2) = (space.clone(), maps.clone(), rests.clone());
                let hider = thread::spawn(move || {
                    m2.hide(&sp2, 0, DEPTH, sp2.probe(0).unwrap());
                    r2.add(0);
                });
                // The free: its release and step, then its announcement, then the set.
                maps.announce(&space, 0, 0, None);
                rests.forget(0, &mut || hidden_on_purpose(&space));
                hider.join().unwrap();
                assert!(!hidden_on_purpose(&space) || rests.contains(0), "a hidden rest left the set");
            });
        }
    }

    #[test]
    fn a_hide_racing_a_pass_that_reveals_leaves_a_hidden_rest_in_the_set() {
        for before in [Before::Open, Before::Hidden, Before::Stale] {
            race(Pass::Reveal, before);
        }
    }

    #[test]
    fn a_hide_racing_a_pass_that_keeps_the_chunk_leaves_it_in_the_set() {
        for before in [Before::Open, Before::Hidden, Before::Stale] {
            race(Pass::Keep, before);
        }
    }

    #[test]
    fn a_hide_racing_a_pass_that_skips_the_chunk_leaves_it_in_the_set() {
        for before in [Before::Open, Before::Hidden, Before::Stale] {
            race(Pass::Skip, before);
        }
    }
}
