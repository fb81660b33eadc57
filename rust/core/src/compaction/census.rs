//! The census: every live block by handle, taken on a paused pool, sorted by where it lives
//! (buddy blocks, chunk runs, slab objects by slab), with the live slabs and how many units of
//! each chunk the arena counts as covered. The planners read it; they never read the pool.

use super::piece::{Home, Piece};
use crate::arena::geometry::Geometry;
use crate::arena::global::ChunkState;
use crate::arena::slab::caches::{SlabClass, SlabView};
use crate::handle::id::Handle;
use crate::handle::table::SlotInfo;
use crate::pool::pool::Pool;

/// A live block found by the census.
#[derive(Debug, Clone)]
pub(crate) struct Item {
    pub(crate) handle: Handle,
    /// Its slot (`core` reduced to the pool's cores: the core a chunk granted for it goes to).
    pub(crate) info: SlotInfo,
    /// Not pinned (and, for a census that claims, marked moving by it).
    pub(crate) movable: bool,
    /// Where it lives.
    pub(crate) home: Home,
}

impl Item {
    /// Its move, going nowhere yet; `None` for a block its home cannot hold (a corrupt pool).
    pub(crate) fn piece(&self, geometry: &Geometry, classes: &[SlabClass]) -> Option<Piece> {
        Piece::of_block(self.handle, &self.info, self.info.core as usize, self.home, geometry, classes).ok()
    }
}

/// Every live block, by where it lives.
#[derive(Default, Clone)]
pub(crate) struct Census {
    /// Buddy blocks of core chunks.
    pub(crate) buddy: Vec<Item>,
    /// Chunk runs.
    pub(crate) runs: Vec<Item>,
    /// Slab objects, by slab id (an index: slab ids are dense).
    pub(crate) objects: Vec<Vec<Item>>,
    /// Every live slab.
    pub(crate) slabs: Vec<SlabView>,
    /// Units of each chunk the arena counts as covered (by any block, with a handle or not).
    pub(crate) covered: Vec<u64>,
}

impl Census {
    /// The objects of slab `id`.
    pub(crate) fn items(&self, id: u32) -> &[Item] {
        self.objects.get(id as usize).map_or(&[][..], Vec::as_slice)
    }

    /// Add an object of slab `id`.
    pub(crate) fn add_object(&mut self, id: u32, item: Item) {
        let i = id as usize;
        if self.objects.len() <= i {
            self.objects.resize_with(i + 1, Vec::new);
        }
        self.objects[i].push(item);
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
    /// Where the live block at `offset` lives.
    pub(crate) fn home_of(&self, offset: usize) -> Home {
        if let Some(slab) = self.arena().slabs.lookup(offset) {
            return Home::Object(slab);
        }
        let chunk = self.arena().geometry.chunk_of(offset);
        match (chunk < self.arena().geometry.chunks).then(|| self.arena().global.state(chunk)) {
            Some(ChunkState::RunHead(chunks)) => Home::Run { chunks },
            Some(ChunkState::Core(_)) => Home::Buddy,
            _ => Home::Lost,
        }
    }

    /// Every live block (call while paused). With `claim`, every unpinned block is marked
    /// moving as it is found (the caller must clear each mark, moved or not); pinned ones stay
    /// put.
    pub(crate) fn census(&self, claim: bool) -> Census {
        let g = &self.arena().geometry;
        let covered = (0..g.chunks).map(|c| g.usable_units(c) - self.arena().free_units(c)).collect();
        let mut census = Census { slabs: self.arena().slabs.views(), covered, ..Census::default() };
        let cores = self.arena().cores.len();
        let mut add = |handle: Handle, mut info: SlotInfo, movable: bool| {
            info.core = (info.core as usize % cores) as u16;
            let home = self.home_of(info.offset);
            let item = Item { handle, info, movable, home };
            match home {
                Home::Object(slab) => census.add_object(slab.id, item),
                Home::Run { .. } => census.runs.push(item),
                Home::Buddy | Home::Lost => census.buddy.push(item),
            }
        };
        if claim {
            self.handles().claim_live(&mut add);
        } else {
            self.handles().for_each_live(&mut |handle, info| add(handle, info, info.pins == 0));
        }
        census
    }
}
