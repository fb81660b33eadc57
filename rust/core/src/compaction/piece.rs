//! A piece: what moves as one in a batch (a block, or a whole slab with its objects), where it
//! is and where it goes. The planners make pieces, the executor moves them.

use super::order::Transfer;
use crate::arena::front::FrontLayout;
use crate::arena::geometry::Geometry;
use crate::arena::layout::Layout;
use crate::arena::slab::caches::{SlabClass, SlabRef};
use crate::handle::id::Handle;

/// Where a live block lives, as the census found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Home {
    /// A buddy block of a core chunk.
    Buddy,
    /// The head of a run of `chunks` whole chunks.
    Run { chunks: usize },
    /// An object of a slab.
    Object(SlabRef),
    /// A block with a front (`arena/front.rs`): it moves to another place with a front.
    Fronted,
    /// Its chunk holds no block (the pool is corrupt): it cannot move.
    Lost,
}

/// What a piece is.
#[derive(Debug, Clone)]
pub(crate) enum PieceKind {
    /// A slab object of size class `class`, now in slab `from_slab`; it goes to a free object of
    /// a slab of the same class.
    SlabObject { class: usize, from_slab: SlabRef },
    /// A buddy block in a core chunk.
    Buddy,
    /// A run of `chunks` whole chunks (and its tail at the start of the chunk after them, when
    /// its size has one: `Layout::RunTail`).
    Run { chunks: usize },
    /// A whole slab (its buddy block) with every object in it: `(handle, offset)`.
    Slab { id: u32, objects: Vec<(Handle, usize)> },
}

/// One move of a batch.
#[derive(Debug, Clone)]
pub(crate) struct Piece {
    pub(crate) kind: PieceKind,
    /// The block's handle (`None` for a whole slab).
    pub(crate) handle: Option<Handle>,
    /// Bytes asked for (a slab: its block's bytes).
    pub(crate) size: usize,
    pub(crate) align: usize,
    /// The core a chunk granted for it goes to.
    pub(crate) core: usize,
    pub(crate) from: usize,
    pub(crate) to: usize,
    /// Bytes the block holds.
    pub(crate) extent: usize,
}

impl Piece {
    /// The move of the live block `handle` (`place`: its offset, size and alignment as a
    /// power of two; `core`: the core a chunk granted for it goes to; `home`: where it lives),
    /// going nowhere yet (`to == from`). `Err(why)` when the block is not a block its home can
    /// hold (a corrupt pool).
    pub(crate) fn of_block(
        handle: Handle,
        (offset, size, align_log2): (usize, usize, u8),
        core: usize,
        home: Home,
        geometry: &Geometry,
        classes: &[SlabClass],
    ) -> std::result::Result<Piece, &'static str> {
        let mut piece = Piece {
            kind: PieceKind::Buddy,
            handle: Some(handle),
            size,
            align: 1usize << align_log2,
            core,
            from: offset,
            to: offset,
            extent: 0,
        };
        match home {
            Home::Object(slab) => {
                piece.kind = PieceKind::SlabObject { class: slab.class, from_slab: slab };
                piece.extent = classes[slab.class].size;
            }
            Home::Run { chunks } => {
                piece.kind = PieceKind::Run { chunks };
                piece.extent = geometry.run_bytes(geometry.chunk_of(offset), chunks) + geometry.tail_bytes(size);
            }
            Home::Buddy => match geometry.layout(size, 1) {
                Layout::Buddy(b) => piece.extent = b.units as usize * geometry.min_block,
                Layout::Run { .. } | Layout::RunTail { .. } => return Err("a run-sized block in a core chunk"),
            },
            // A block with a front (`arena/front.rs`) moves as a run-like piece: to another place
            // with a front, where it holds as many bytes (its size rounded up to a unit), or, when
            // its size makes a run, to whole chunks as a run (`extent`: its bytes there).
            Home::Fronted => {
                piece.kind = PieceKind::Run { chunks: 0 };
                piece.extent = FrontLayout::of(geometry, offset, size)
                    .ok_or("no block with a front starts there")?
                    .bytes(geometry);
                if let Layout::Run { chunks, .. } | Layout::RunTail { chunks, .. } = geometry.layout(size, 1) {
                    piece.kind = PieceKind::Run { chunks };
                    piece.extent = geometry.run_bytes(0, chunks) + geometry.tail_bytes(size);
                }
            }
            Home::Lost => return Err("its chunk holds no block"),
        }
        Ok(piece)
    }

    /// The block with a front that a run-sized piece is at its destination (`None`: a run
    /// there, or another kind of piece; see `arena/front.rs`).
    pub(crate) fn front_at_destination(&self, g: &Geometry) -> Option<FrontLayout> {
        match self.kind {
            PieceKind::Run { .. } if self.to % g.chunk_size != 0 => FrontLayout::of(g, self.to, self.size),
            _ => None,
        }
    }

    /// The bytes the block holds at offset `at` (its source or its destination): those of a
    /// block with a front there, else `extent`.
    pub(crate) fn bytes_at(&self, g: &Geometry, at: usize) -> usize {
        match self.kind {
            PieceKind::Buddy | PieceKind::Run { .. } => {
                FrontLayout::of(g, at, self.size).map_or(self.extent, |f| f.bytes(g))
            }
            _ => self.extent,
        }
    }

    /// The bytes that must move: what the block asked for (a slab: all of it).
    pub(crate) fn copy_len(&self) -> usize {
        match self.kind {
            PieceKind::Slab { .. } => self.extent,
            _ => self.size,
        }
    }

    pub(crate) fn transfer(&self) -> Transfer {
        Transfer { src: self.from, dst: self.to, len: self.copy_len() }
    }

    /// Every handle this move re-points.
    pub(crate) fn handles(&self) -> Vec<Handle> {
        match &self.kind {
            PieceKind::Slab { objects, .. } => objects.iter().map(|&(h, _)| h).collect(),
            _ => self.handle.into_iter().collect(),
        }
    }

    /// Every handle this move re-points, without collecting them.
    pub(crate) fn each_handle(&self) -> impl Iterator<Item = Handle> + '_ {
        let (objects, single): (&[(Handle, usize)], Option<Handle>) = match &self.kind {
            PieceKind::Slab { objects, .. } => (objects, None),
            _ => (&[], self.handle),
        };
        objects.iter().map(|&(h, _)| h).chain(single)
    }

    /// How many blocks (handles) it moves.
    pub(crate) fn blocks(&self) -> usize {
        match &self.kind {
            PieceKind::Slab { objects, .. } => objects.len(),
            _ => 1,
        }
    }

    /// The name a compaction plan gives its kind (seen from Python).
    pub(crate) fn kind_name(&self) -> &'static str {
        match self.kind {
            PieceKind::SlabObject { .. } => "slab object",
            PieceKind::Buddy => "block",
            PieceKind::Run { .. } => "run",
            PieceKind::Slab { .. } => "slab",
        }
    }
}
