//! The census: every live block by handle, sorted by where it lives (buddy blocks, chunk runs,
//! slab objects by slab), with the live slabs and how many units of each chunk the arena counts
//! as covered. The planners read it; they never read the pool.
//!
//! An item is small (40 bytes) and says where its block lives in one word ([`Place`]); the
//! full [`Home`] (a slab's class and owner) is only looked up for the blocks a planner turns
//! into moves ([`Census::piece`]).

use super::piece::{Home, Piece};
use crate::arena::front::FrontLayout;
use crate::arena::geometry::Geometry;
use crate::arena::global::ChunkState;
use crate::arena::slab::caches::{SlabClass, SlabRef, SlabView};
use crate::handle::id::Handle;
use crate::handle::table::SlotInfo;
use crate::pool::pool::Pool;

/// Where a census item lives, in one word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// A buddy block of a core chunk.
    Buddy,
    /// The head of a run of this many whole chunks (and a tail after them when its size says
    /// so: `Layout::RunTail`).
    Run(u32),
    /// An object of the slab with this id.
    Object(u32),
    /// A block with a front (`arena/front.rs`), listed with the runs: it moves only to another
    /// place with a front (which holds as many bytes).
    Fronted,
    /// Its chunk holds no block (a corrupt pool): it cannot move.
    Lost,
}

/// A live block found by the census.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Item {
    pub(crate) handle: Handle,
    pub(crate) place: Place,
    pub(crate) offset: usize,
    /// Bytes asked for.
    pub(crate) size: usize,
    /// The core a chunk granted for it goes to (reduced to the pool's cores).
    pub(crate) core: u16,
    pub(crate) align_log2: u8,
    /// Not pinned (and, for a census that claims, marked moving by it).
    pub(crate) movable: bool,
}

impl Item {
    /// The item of the live block `handle` whose slot says `info`; `cores` is the pool's number
    /// of cores.
    pub(crate) fn of_slot(handle: Handle, info: &SlotInfo, cores: usize, place: Place, movable: bool) -> Item {
        Item {
            handle,
            place,
            offset: info.offset,
            size: info.size,
            core: (info.core as usize % cores) as u16,
            align_log2: info.align_log2,
            movable,
        }
    }
}

/// Every live block, by where it lives.
#[derive(Default, Clone)]
pub(crate) struct Census {
    /// Buddy blocks of core chunks (and blocks whose chunk holds none: `Place::Lost`).
    pub(crate) buddy: Vec<Item>,
    /// Chunk runs.
    pub(crate) runs: Vec<Item>,
    /// Slab objects, by slab id (an index: slab ids are dense).
    pub(crate) objects: Vec<Vec<Item>>,
    /// The slab each id of `objects` names (`None` for ids without objects).
    slab_refs: Vec<Option<SlabRef>>,
    /// Every live slab.
    pub(crate) slabs: Vec<SlabView>,
    /// Units of each chunk the arena counts as covered (by any block, with a handle or not).
    pub(crate) covered: Vec<u64>,
    /// The stamp of each chunk's free-space word, read before anything else of the chunk
    /// (`ChunkSpace::stamp`): a chunk whose stamp is the same later is unchanged since.
    pub(crate) stamps: Vec<u64>,
}

impl Census {
    /// The objects of slab `id`.
    pub(crate) fn items(&self, id: u32) -> &[Item] {
        self.objects.get(id as usize).map_or(&[][..], Vec::as_slice)
    }

    /// Add an object of `slab` (its item's place names the slab).
    pub(crate) fn add_object(&mut self, slab: SlabRef, item: Item) {
        let i = slab.id as usize;
        if self.objects.len() <= i {
            self.objects.resize_with(i + 1, Vec::new);
            self.slab_refs.resize(i + 1, None);
        }
        self.slab_refs[i] = Some(slab);
        self.objects[i].push(Item { place: Place::Object(slab.id), ..item });
    }

    /// Where `item` lives, in full.
    pub(crate) fn home(&self, item: &Item) -> Home {
        match item.place {
            Place::Buddy => Home::Buddy,
            Place::Run(chunks) => Home::Run { chunks: chunks as usize },
            Place::Object(id) => match self.slab_refs.get(id as usize).copied().flatten() {
                Some(slab) => Home::Object(slab),
                None => Home::Lost,
            },
            Place::Fronted => Home::Fronted,
            Place::Lost => Home::Lost,
        }
    }

    /// The move of `item`, going nowhere yet; `None` for a block its home cannot hold (a
    /// corrupt pool).
    pub(crate) fn piece(&self, item: &Item, geometry: &Geometry, classes: &[SlabClass]) -> Option<Piece> {
        let place = (item.offset, item.size, item.align_log2);
        Piece::of_block(item.handle, place, item.core as usize, self.home(item), geometry, classes).ok()
    }

    /// Make a census read while the pool ran agree with itself, as the planners assume. A slab
    /// record read while its slab was given back and another made with the record can show a
    /// slab that overlaps another one or sits off its class's alignment, and an object found
    /// through the slab directory can belong to a slab that the views show with another class,
    /// or not at all. Such slabs and objects are left out: the model then takes those chunks'
    /// cover from their trees (`Model::of_census`), and the moves planned on the rest are
    /// checked again when they run. An object kept is allocated in its slab's view.
    pub(crate) fn settle_slabs(&mut self, geometry: &Geometry, classes: &[SlabClass]) {
        self.slabs.sort_by_key(|v| v.base);
        let views = &self.slabs;
        let mut keep: Vec<bool> = views
            .iter()
            .map(|v| classes.get(v.class).is_some_and(|c| c.slab_bytes == v.bytes && v.base % v.bytes == 0))
            .collect();
        // By base: every view that starts before a view's end overlaps it.
        for i in 0..views.len() {
            let end = views[i].base + views[i].bytes;
            for k in (i + 1..views.len()).take_while(|&k| views[k].base < end) {
                (keep[i], keep[k]) = (false, false);
            }
        }
        let mut kept = keep.into_iter();
        self.slabs.retain(|_| kept.next().unwrap_or(false));
        let mut view_of: Vec<Option<usize>> = vec![None; self.objects.len()];
        for (i, v) in self.slabs.iter().enumerate() {
            if let Some(slot) = view_of.get_mut(v.id as usize) {
                *slot = Some(i);
            }
        }
        for (id, &at) in view_of.iter().enumerate() {
            let view = at.map(|i| (self.slabs[i].class, self.slabs[i].base, self.slabs[i].bytes));
            let agrees = self.slab_refs[id].zip(view).is_some_and(|(r, (class, _, _))| r.class == class);
            let Some((class, base, bytes)) = view.filter(|_| agrees) else {
                self.objects[id].clear();
                self.slab_refs[id] = None;
                continue;
            };
            let class = &classes[class];
            let object = |item: &Item| {
                (base..base + bytes)
                    .contains(&item.offset)
                    .then(|| class.index_of(item.offset - base))
                    .flatten()
                    .filter(|_| self.piece(item, geometry, classes).is_some())
            };
            let mut taken = 0u64;
            let items: Vec<Item> = self.objects[id]
                .iter()
                .filter(|item| object(item).map(|j| taken |= 1 << j).is_some())
                .copied()
                .collect();
            self.objects[id] = items;
            if let Some(i) = at {
                self.slabs[i].free &= !taken;
            }
        }
    }

    /// Every movable handle (for a census that claims: every handle it marked moving).
    pub(crate) fn claimed(&self) -> impl Iterator<Item = Handle> + '_ {
        self.buddy
            .iter()
            .chain(self.runs.iter())
            .chain(self.objects.iter().flatten())
            .filter(|i| i.movable)
            .map(|i| i.handle)
    }
}

impl Pool {
    /// Where the live block of `size` bytes at `offset` lives.
    pub(crate) fn home_of(&self, offset: usize, size: usize) -> Home {
        if let Some(slab) = self.arena().slabs.lookup(offset) {
            return Home::Object(slab);
        }
        match self.chunk_place(offset, size) {
            Place::Run(chunks) => Home::Run { chunks: chunks as usize },
            Place::Buddy => Home::Buddy,
            Place::Fronted => Home::Fronted,
            _ => Home::Lost,
        }
    }

    /// Where the block of `size` bytes at `offset` lives, for a block of no slab: its chunk's
    /// state (in a core chunk, requested bytes past the chunk's end make a block with a front).
    fn chunk_place(&self, offset: usize, size: usize) -> Place {
        let g = &self.arena().geometry;
        let chunk = g.chunk_of(offset);
        match (chunk < g.chunks).then(|| self.arena().global.state(chunk)) {
            Some(ChunkState::RunHead(chunks) | ChunkState::TailedRunHead(chunks)) => Place::Run(chunks as u32),
            Some(ChunkState::Core(_)) if FrontLayout::of(g, offset, size).is_some() => Place::Fronted,
            Some(ChunkState::Core(_)) => Place::Buddy,
            _ => Place::Lost,
        }
    }

    /// Every live block. On a paused pool it is exact. With `claim`, every unpinned block is
    /// marked moving as it is found (the caller must clear each mark, moved or not); pinned
    /// ones stay put.
    pub(crate) fn census(&self, claim: bool) -> Census {
        let g = &self.arena().geometry;
        let stamps = (0..g.chunks).map(|c| self.arena().lines[c].space.stamp()).collect();
        let covered = (0..g.chunks).map(|c| g.usable_units(c) - self.arena().free_units(c)).collect();
        let mut census = Census { slabs: self.arena().slabs.views(), covered, stamps, ..Census::default() };
        let cores = self.arena().cores.len();
        let slabs = &self.arena().slabs;
        let mut add = |handle: Handle, info: SlotInfo, movable: bool| {
            if let Some(slab) = slabs.lookup(info.offset) {
                census.add_object(slab, Item::of_slot(handle, &info, cores, Place::Object(slab.id), movable));
                return;
            }
            let place = self.chunk_place(info.offset, info.size);
            let item = Item::of_slot(handle, &info, cores, place, movable);
            match place {
                Place::Run(_) => census.runs.push(item),
                Place::Fronted => census.runs.push(item),
                _ => census.buddy.push(item),
            }
        };
        if claim {
            self.handles().claim_live(&mut add);
        } else {
            self.handles().for_each_live(&mut |handle, info| add(handle, info, info.pins == 0));
            // Read while the pool may run.
            census.settle_slabs(g, &slabs.classes.classes);
        }
        census
    }
}
