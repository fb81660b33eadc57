//! Slab operations for compaction: claiming and giving back an object at an exact position
//! without the allocation path's side effects (the slab part of the exact-position API,
//! `arena/exact.rs`), moving a whole slab to another block (its objects keep their indices),
//! and tidying slabs afterwards. All of these run while the pool is paused: nothing races them
//! but pins, which the slabs do not see.

use super::caches::{
    class_of, generation_of, owner_of, pack_current, SlabBlocks, SlabCaches, SlabRef, ALL_FREE, RETIRED,
};
use crate::util::sync::Ordering;

impl SlabCaches {
    /// The index of the object that starts at `offset` in `slab`, if one does.
    pub(crate) fn object_at(&self, slab: SlabRef, offset: usize) -> Option<u32> {
        let class = &self.classes.classes[slab.class];
        let base = offset & !(class.slab_bytes - 1);
        class.index_of(offset - base)
    }

    /// Claim the object at `offset` of `slab`: it must be free (and the slab live).
    pub(crate) fn claim_at(&self, slab: SlabRef, offset: usize) -> Result<(), &'static str> {
        let j = self.object_at(slab, offset).ok_or("not the start of a slab object")?;
        let bit = 1u64 << j;
        let word = &self.slab(slab.id).free;
        let mut current = word.load(Ordering::Acquire);
        loop {
            if current & RETIRED != 0 {
                return Err("the slab there was given back");
            }
            if current & bit == 0 {
                return Err("the slab object there is in use");
            }
            match word.compare_exchange_weak(current, current & !bit, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(()),
                Err(seen) => current = seen,
            }
        }
    }

    /// Give back the object at `offset` of `slab` with no listing or retiring (see
    /// [`SlabCaches::tidy`]); `Err` (and no change) when it is not allocated.
    pub(crate) fn unclaim_at(&self, slab: SlabRef, offset: usize) -> Result<(), &'static str> {
        let j = self.object_at(slab, offset).ok_or("not the start of a slab object")?;
        let bit = 1u64 << j;
        let previous = self.slab(slab.id).free.fetch_or(bit, Ordering::AcqRel);
        if previous & (RETIRED | bit) != 0 {
            if previous & bit == 0 {
                self.slab(slab.id).free.fetch_and(!bit, Ordering::AcqRel);
            }
            return Err("the slab object is not allocated");
        }
        Ok(())
    }

    /// First half of moving slabs: clear the directory entries of slab `id` at its old place.
    /// (Clear every moving slab's before [`SlabCaches::rebase`] sets any: one may move onto
    /// another's old place.)
    pub(crate) fn unmap(&self, id: u32) {
        let slab = self.slab(id);
        let k = class_of(slab.meta.load(Ordering::Acquire));
        self.unmap_at(k, slab.base.load(Ordering::Acquire) as usize);
    }

    /// Second half: slab `id` is at `new_base` now (the caller moved the bytes and the buddy
    /// blocks); its base and its directory entries follow; its objects keep their indices.
    pub(crate) fn rebase(&self, id: u32, new_base: usize) {
        let slab = self.slab(id);
        let meta = slab.meta.load(Ordering::Acquire);
        let (k, owner) = (class_of(meta), owner_of(meta));
        let bytes = self.classes.classes[k].slab_bytes;
        debug_assert_eq!(new_base % bytes, 0, "slabs are naturally aligned buddy blocks");
        slab.base.store(new_base as u64, Ordering::Release);
        self.map(id, k, owner, new_base);
    }

    /// Put slab `id` back in order after objects came or went behind the allocator's back: an
    /// all-free slab that is not its owner's current one is retired (its block goes back
    /// through `blocks`), a partial one is listed for its owner (unless it is current or listed
    /// already). Returns whether it retired.
    pub(crate) fn tidy(&self, id: u32, blocks: &dyn SlabBlocks) -> bool {
        let slab = self.slab(id);
        let word = slab.free.load(Ordering::Acquire);
        let meta = slab.meta.load(Ordering::Acquire);
        if word & RETIRED != 0 || generation_of(meta) == 0 {
            return false;
        }
        let (k, owner, generation) = (class_of(meta), owner_of(meta), generation_of(meta));
        let current = self.cores[owner].current[k].load(Ordering::Acquire) == pack_current(id, generation);
        if word == ALL_FREE && !current {
            if slab.free.compare_exchange(ALL_FREE, RETIRED, Ordering::AcqRel, Ordering::Acquire).is_ok() {
                self.retire(id, blocks);
                return true;
            }
            return false;
        }
        if word != self.classes.classes[k].full() && !current {
            self.relist(id, generation, owner, k);
        }
        false
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use crate::arena::slab::caches::SlabClasses;
    use crate::util::sync::{AtomicU64, AtomicUsize};
    use loom::sync::Arc;
    use loom::thread;

    /// Slabs carved one after another; releases are counted.
    #[derive(Default)]
    struct Arena {
        next: AtomicU64,
        released: AtomicUsize,
        last_released: AtomicU64,
    }

    impl SlabBlocks for Arena {
        fn carve(&self, bytes: usize) -> Option<usize> {
            Some(self.next.fetch_add(bytes as u64, Ordering::Relaxed) as usize)
        }
        fn release(&self, base: usize, _bytes: usize) {
            self.released.fetch_add(1, Ordering::AcqRel);
            self.last_released.store(base as u64, Ordering::Release);
        }
    }

    /// 2048-byte objects in 4096-byte slabs: two objects per slab, one slab per carve.
    fn caches() -> (Arc<SlabCaches>, Arc<Arena>) {
        let classes = SlabClasses::new(&[2048], 4096, 4096, 32768);
        assert_eq!(classes.classes[0].objects, 2);
        (Arc::new(SlabCaches::new(classes, 1 << 20, 1).unwrap()), Arc::new(Arena::default()))
    }

    /// A relocation claims a slab's free object as a destination while the slab's owner
    /// allocates from it: exactly one of them gets the object.
    #[test]
    fn a_claimed_destination_is_never_also_allocated() {
        loom::model(|| {
            let (caches, arena) = caches();
            let (a, _) = caches.alloc(0, 0, &*arena).unwrap();
            let slab = caches.lookup(a).unwrap();
            let other = a ^ 2048; // the slab's other object, free
            let relocator = {
                let caches = caches.clone();
                thread::spawn(move || caches.claim_at(slab, other).is_ok())
            };
            let (mine, _) = caches.alloc(0, 0, &*arena).unwrap();
            let claimed = relocator.join().unwrap();
            assert_ne!(mine, a);
            assert_eq!(claimed, mine != other, "the object went to both or to neither");
            // Everything back: the slab (and any slab carved meanwhile) empties and is reclaimed.
            caches.free(caches.lookup(mine).unwrap(), mine, &*arena).unwrap();
            caches.free(slab, a, &*arena).unwrap();
            if claimed {
                caches.unclaim_at(slab, other).unwrap();
                caches.tidy(slab.id, &*arena);
            }
            caches.reclaim(&*arena);
            assert!(caches.views().is_empty(), "slabs left behind");
        });
    }

    /// An object moves out of a full slab `S` (claim in the destination, give back the source,
    /// tidy `S`) while another thread frees `S`'s other object: `S` retires exactly once,
    /// whichever of the two empties it, and its id is recycled safely afterwards.
    #[test]
    fn a_moved_out_object_and_a_remote_free_retire_the_slab_once() {
        loom::model(|| {
            let (caches, arena) = caches();
            let (a, _) = caches.alloc(0, 0, &*arena).unwrap();
            let (b, _) = caches.alloc(0, 0, &*arena).unwrap(); // S is full
            let (c, _) = caches.alloc(0, 0, &*arena).unwrap(); // D is current, one object free
            let source = caches.lookup(a).unwrap();
            let destination = caches.lookup(c).unwrap();
            let d = c ^ 2048;
            let freer = {
                let (caches, arena) = (caches.clone(), arena.clone());
                thread::spawn(move || caches.free(caches.lookup(b).unwrap(), b, &*arena).unwrap())
            };
            caches.claim_at(destination, d).unwrap();
            caches.unclaim_at(source, a).unwrap();
            caches.tidy(source.id, &*arena);
            freer.join().unwrap();
            assert_eq!(arena.released.load(Ordering::Acquire), 1, "the source slab retires exactly once");
            assert_eq!(arena.last_released.load(Ordering::Acquire) as usize, a & !4095);
            assert!(caches.lookup(a).is_none() && caches.lookup(b).is_none(), "stale directory entries");
            // The retired slab may sit on the partial stack: the next allocations skip it and
            // never hand out the moved object or its neighbour twice.
            let (e, _) = caches.alloc(0, 0, &*arena).unwrap();
            let (f, _) = caches.alloc(0, 0, &*arena).unwrap();
            let live = [c, d, e, f];
            for (i, x) in live.iter().enumerate() {
                assert!(live[i + 1..].iter().all(|y| y != x), "an object is in use twice: {live:?}");
            }
            for off in [c, e, f] {
                caches.free(caches.lookup(off).unwrap(), off, &*arena).unwrap();
            }
            caches.unclaim_at(destination, d).unwrap();
            caches.tidy(destination.id, &*arena);
            caches.reclaim(&*arena);
            assert!(caches.views().is_empty(), "slabs left behind");
        });
    }
}
