//! Running one batch of moves: every source given back and every destination taken in the
//! metadata (undone if one cannot be), the bytes copied in a safe order (or handed to the
//! caller's mover), the handles re-pointed, and the slabs and chunks the sources left tidied.
//!
//! Sources are given back before destinations are taken, so a destination may overlap its own
//! source or another moving block's (a slide); everything else it overlaps makes the batch fail
//! before any byte moves. The caller has marked every moving handle (`begin_move`); whatever
//! happens, every mark is cleared on return.

use std::time::Instant;

use super::model::Model;
use super::order::{order, Step, Transfer};
use super::{BatchMover, MovedBlocks};
use crate::arena::exact::Swept;
use crate::arena::global::ChunkState;
use crate::arena::layout::Layout;
use crate::arena::slab::caches::SlabRef;
use crate::error::{Error, Result};
use crate::handle::id::Handle;
use crate::handle::table::SlotInfo;
use crate::pool::pool::Pool;

/// What a moving block is.
#[derive(Debug, Clone)]
pub(crate) enum Kind {
    /// A slab object of size class `class`, now in slab `from_slab`; it goes to a free object of
    /// a slab of the same class.
    SlabObject { class: usize, from_slab: SlabRef },
    /// A buddy block in a core chunk.
    Buddy,
    /// A run of `chunks` whole chunks.
    Run { chunks: usize },
    /// A whole slab (its buddy block) with every object in it: `(handle, offset)`.
    Slab { id: u32, objects: Vec<(Handle, usize)> },
}

/// One move of a batch.
#[derive(Debug, Clone)]
pub(crate) struct Unit {
    pub(crate) kind: Kind,
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

impl Unit {
    /// The bytes that must move: what the block asked for (a slab: all of it).
    pub(crate) fn copy_len(&self) -> usize {
        match self.kind {
            Kind::Slab { .. } => self.extent,
            _ => self.size,
        }
    }

    pub(crate) fn transfer(&self) -> Transfer {
        Transfer { src: self.from, dst: self.to, len: self.copy_len() }
    }

    /// Every handle this move re-points.
    pub(crate) fn handles(&self) -> Vec<Handle> {
        match &self.kind {
            Kind::Slab { objects, .. } => objects.iter().map(|&(h, _)| h).collect(),
            _ => self.handle.into_iter().collect(),
        }
    }

    /// How many blocks (handles) it moves.
    pub(crate) fn blocks(&self) -> usize {
        match &self.kind {
            Kind::Slab { objects, .. } => objects.len(),
            _ => 1,
        }
    }
}

/// What the metadata phase did, for undoing it.
#[derive(Default)]
struct Journal {
    released: Vec<usize>,
    granted: Vec<(usize, usize)>,
    retired: Vec<(usize, usize)>,
    reserved: Vec<usize>,
    swept: Swept,
}

impl Pool {
    /// The move of the live block `handle` (marked moving; `info` is its slot), going nowhere
    /// yet (`to == from`).
    pub(crate) fn unit_of(&self, handle: Handle, info: &SlotInfo) -> Result<Unit> {
        let align = 1usize << info.align_log2;
        let mut unit = Unit {
            kind: Kind::Buddy,
            handle: Some(handle),
            size: info.size,
            align,
            core: info.core as usize % self.arena().cores.len(),
            from: info.offset,
            to: info.offset,
            extent: 0,
        };
        if let Some(slab) = self.arena().slabs.lookup(info.offset) {
            unit.kind = Kind::SlabObject { class: slab.class, from_slab: slab };
            unit.extent = self.arena().slabs.classes.classes[slab.class].size;
            return Ok(unit);
        }
        let chunk = self.arena().geometry.chunk_of(info.offset);
        match (chunk < self.arena().geometry.chunks).then(|| self.arena().global.state(chunk)) {
            Some(ChunkState::RunHead(len)) => {
                unit.kind = Kind::Run { chunks: len };
                unit.extent = self.arena().run_bytes(chunk, len);
            }
            Some(ChunkState::Core(_)) => {
                let b = self
                    .arena()
                    .buddy_layout(info.size)
                    .ok_or_else(|| corrupt(handle, "a run-sized block in a core chunk"))?;
                unit.extent = b.units as usize * self.arena().geometry.min_block;
            }
            _ => return Err(corrupt(handle, "its chunk holds no block")),
        }
        Ok(unit)
    }

    /// Whether `unit.to` can hold the block as its kind needs: inside the arena, aligned,
    /// bank-safe, at a place its kind of block can start. (Whether the place is free is decided
    /// when it is taken.)
    pub(crate) fn check_destination(&self, unit: &Unit) -> std::result::Result<(), String> {
        let (to, size) = (unit.to, unit.size);
        let usable = self.arena().geometry.usable_capacity();
        if to >= usable || size > usable - to {
            return Err(format!("destination {to} (+{size} bytes) lies outside the arena ({usable} usable bytes)"));
        }
        if to % unit.align != 0 {
            return Err(format!("destination {to} is not aligned to the block's alignment {}", unit.align));
        }
        let bank = self.config().bank_size;
        let bank_ok = if size <= bank { to / bank == (to + size - 1) / bank } else { to % bank == 0 };
        if !bank_ok {
            return Err(format!("destination {to} (+{size} bytes) breaks the bank rule (bank size {bank})"));
        }
        match &unit.kind {
            Kind::SlabObject { class, .. } => {
                let size_class = self.arena().slabs.classes.classes[*class].size;
                match self.arena().slabs.lookup(to) {
                    Some(s) if s.class == *class && self.arena().slabs.object_at(s, to).is_some() => Ok(()),
                    _ => Err(format!(
                        "destination {to} is not an object of a slab of the block's size class ({size_class} bytes)"
                    )),
                }
            }
            Kind::Buddy => {
                let Layout::Buddy(b) = self.arena().geometry.layout(size, unit.align) else {
                    return Err("the block is not a buddy block".into());
                };
                // Any unit of a chunk may start one (a packed block: see `BuddyLayout`), as
                // long as it ends inside the chunk; alignment and banks are checked above.
                let within = self.arena().geometry.unit_in_chunk(to);
                let chunk = self.arena().geometry.chunk_of(to);
                if to % self.arena().geometry.min_block != 0
                    || within + b.units > self.arena().geometry.usable_units(chunk)
                {
                    return Err(format!(
                        "destination {to} is not where a {}-byte buddy block can start (a multiple of {} bytes, \
                         with the whole block inside one {}-byte chunk)",
                        b.units as usize * self.arena().geometry.min_block,
                        self.arena().geometry.min_block,
                        self.arena().geometry.chunk_size
                    ));
                }
                Ok(())
            }
            Kind::Run { chunks } => {
                let Layout::Run { align_chunks, .. } = self.arena().geometry.layout(size, unit.align) else {
                    return Err("the block is not a chunk run".into());
                };
                let start = self.arena().geometry.chunk_of(to);
                if to % self.arena().geometry.chunk_size != 0 || start % align_chunks != 0 {
                    return Err(format!(
                        "destination {to} is not the start of a chunk (a chunk run starts on a multiple of {} bytes)",
                        self.arena().geometry.chunk_size * align_chunks
                    ));
                }
                if start + chunks > self.arena().geometry.chunks
                    || self.arena().run_bytes(start, *chunks) != unit.extent
                {
                    return Err(format!("destination {to} leaves no room for the run's {chunks} chunks"));
                }
                Ok(())
            }
            Kind::Slab { .. } => {
                if to % unit.extent != 0 {
                    return Err(format!("a slab of {} bytes cannot start at {to}", unit.extent));
                }
                Ok(())
            }
        }
    }

    /// Where each transfer that `steps` save goes meanwhile when a mover copies the bytes
    /// (indexed by transfer; empty when nothing is saved): free space of the arena that no
    /// source or destination of the batch touches, found before the metadata changes (nobody
    /// else allocates while the batch runs). `None` when there is not enough.
    fn scratch_for(&self, units: &[Unit], transfers: &[Transfer], steps: &[Step]) -> Option<Vec<usize>> {
        let saves: Vec<usize> =
            steps.iter().filter_map(|&s| if let Step::Save(i) = s { Some(i) } else { None }).collect();
        if saves.is_empty() {
            return Some(Vec::new());
        }
        let g = &self.arena().geometry;
        let mut model = Model::of(self); // sources are still taken in it
        for u in units {
            let chunk = g.chunk_of(u.to);
            match u.kind {
                Kind::Run { chunks } => model.set_run(chunk, chunks, true),
                Kind::Buddy | Kind::Slab { .. } => {
                    model.occupy(chunk, g.unit_in_chunk(u.to), (u.extent / g.min_block) as u64, u.core)
                }
                Kind::SlabObject { .. } => {} // inside a slab, taken already
            }
        }
        let mut scratch = vec![usize::MAX; transfers.len()];
        for i in saves {
            let len = transfers[i].len;
            let units = len.div_ceil(g.min_block) as u64;
            let place = if len <= g.chunk_size {
                (0..g.chunks).find_map(|c| model.find(c, 0, units, 1, u64::MAX).map(|p| (c, p)))
            } else {
                None
            };
            scratch[i] = match place {
                Some((c, p)) => {
                    model.occupy(c, p, units, 0);
                    g.offset_of(c, p)
                }
                None => {
                    let chunks = len.div_ceil(g.chunk_size);
                    let start = (0..=g.chunks.checked_sub(chunks)?).find(|&d| {
                        (d..d + chunks).all(|c| model.is_empty(c)) && self.arena().run_bytes(d, chunks) >= len
                    })?;
                    model.set_run(start, chunks, true);
                    start * g.chunk_size
                }
            };
        }
        Some(scratch)
    }

    /// Run a batch (see the module documentation). `index[i]` is the caller's number for
    /// `units[i]` (errors name it); `created` are slabs made for the batch (retired again if it
    /// fails). Units going nowhere are dropped first.
    pub(crate) fn execute(
        &self,
        units: Vec<Unit>,
        index: Vec<usize>,
        created: Vec<u32>,
        mover: Option<BatchMover<'_, '_>>,
    ) -> Result<MovedBlocks> {
        let started = Instant::now();
        let mut kept = Vec::with_capacity(units.len());
        let mut numbers = Vec::with_capacity(units.len());
        for (unit, i) in units.into_iter().zip(index) {
            if unit.to == unit.from {
                self.end_moves(&unit);
            } else {
                kept.push(unit);
                numbers.push(i);
            }
        }
        let units = kept;
        let transfers: Vec<Transfer> = units.iter().map(Unit::transfer).collect();
        let steps = order(&transfers, true).expect("with bouncing allowed every batch has an order");
        // When the caller copies the bytes (a mover, or the transfers this returns on a pool
        // without host memory), a cycle is broken through free space of the arena; host memory
        // we copy ourselves bounces through a buffer.
        let caller_copies = mover.is_some() || self.arena().backing.is_none();
        let scratch = if caller_copies { self.scratch_for(&units, &transfers, &steps) } else { Some(Vec::new()) };
        let Some(scratch) = scratch else {
            let blocks = order(&transfers, false).err().unwrap_or(0);
            units.iter().for_each(|u| self.end_moves(u));
            self.tidy_slabs(&created);
            return Err(Error::MoveCycle { blocks });
        };
        let mut journal = Journal::default();
        if let Err((i, reason)) = self.swap_metadata(&units, &mut journal) {
            let undone = self.undo(&units, &mut journal);
            units.iter().for_each(|u| self.end_moves(u));
            self.tidy_slabs(&created);
            undone?;
            return Err(Error::batch(numbers[i], Error::InvalidMove { reason }));
        }
        // The copies in order: a saved transfer goes through its scratch place, or (host memory)
        // through a bounce buffer, which the caller does not see.
        let through_scratch = !scratch.is_empty();
        let ordered: Vec<Transfer> = steps
            .iter()
            .filter_map(|&s| match s {
                Step::Copy(i) => Some(transfers[i]),
                Step::Save(i) => through_scratch.then(|| Transfer { dst: scratch[i], ..transfers[i] }),
                Step::Restore(i) if through_scratch => Some(Transfer { src: scratch[i], ..transfers[i] }),
                Step::Restore(i) => Some(transfers[i]),
            })
            .collect();
        if let Some(mover) = mover {
            if let Err(reason) = mover(&ordered) {
                let undone = self.undo(&units, &mut journal);
                units.iter().for_each(|u| self.end_moves(u));
                self.tidy_slabs(&created);
                undone?;
                return Err(Error::MoverFailed(reason));
            }
        }
        if let Some(backing) = &self.arena().backing {
            let base = backing.base().as_ptr();
            let mut saved: Vec<Option<Vec<u8>>> = vec![None; transfers.len()];
            for &step in &steps {
                // SAFETY: every range is inside the arena (checked or planned); the moving blocks
                // are marked (no pins, so no views of them) and the pool is paused, so nobody else
                // reads or writes these bytes; destinations are reserved for these blocks.
                unsafe {
                    match step {
                        Step::Copy(i) => {
                            let t = transfers[i];
                            super::copy::copy(base.add(t.src), base.add(t.dst), t.len);
                        }
                        Step::Save(i) => {
                            let t = transfers[i];
                            saved[i] = Some(std::slice::from_raw_parts(base.add(t.src), t.len).to_vec());
                        }
                        Step::Restore(i) => {
                            let t = transfers[i];
                            let bytes = saved[i].take().expect("saved before it is restored");
                            std::ptr::copy_nonoverlapping(bytes.as_ptr(), base.add(t.dst), t.len);
                        }
                    }
                }
            }
            super::copy::fence(); // the bytes are in place before any handle points at them
        }
        // Re-point, then let pins and frees go on.
        let mut blocks = 0;
        let mut bytes = 0;
        let mut slabs_touched: Vec<u32> = created;
        // Slabs: every old place is unmapped before any new one is mapped (one slab may move
        // onto another's old place).
        for unit in &units {
            if let Kind::Slab { id, .. } = unit.kind {
                self.arena().slabs.unmap(id);
            }
        }
        for unit in &units {
            match &unit.kind {
                Kind::Slab { id, objects } => {
                    self.arena().slabs.rebase(*id, unit.to);
                    for &(h, offset) in objects {
                        self.handles().set_moved_offset(h, offset - unit.from + unit.to);
                    }
                }
                Kind::SlabObject { from_slab, .. } => {
                    slabs_touched.push(from_slab.id);
                    if let Some(s) = self.arena().slabs.lookup(unit.to) {
                        slabs_touched.push(s.id);
                    }
                    self.handles().set_moved_offset(unit.handle.expect("a block has a handle"), unit.to);
                }
                _ => self.handles().set_moved_offset(unit.handle.expect("a block has a handle"), unit.to),
            }
            blocks += unit.blocks();
            bytes += unit.copy_len();
        }
        for unit in &units {
            self.end_moves(unit);
            match &unit.kind {
                Kind::Slab { objects, .. } => {
                    for &(h, offset) in objects {
                        let _ = self.record_move(h, offset, offset - unit.from + unit.to);
                    }
                }
                _ => {
                    let _ = self.record_move(unit.handle.expect("a block has a handle"), unit.from, unit.to);
                }
            }
        }
        slabs_touched.sort_unstable();
        slabs_touched.dedup();
        self.tidy_slabs(&slabs_touched);
        let chunks_freed = self.arena().retire_empty_chunks();
        Ok(MovedBlocks {
            blocks,
            bytes,
            transfers: ordered,
            bounced: steps.iter().filter(|s| matches!(s, Step::Save(_))).count(),
            chunks_freed,
            elapsed: started.elapsed(),
        })
    }

    fn end_moves(&self, unit: &Unit) {
        for h in unit.handles() {
            self.handles().end_move(h);
        }
    }

    fn tidy_slabs(&self, ids: &[u32]) {
        for &id in ids {
            self.arena().slabs.tidy(id, self.arena());
        }
    }

    /// Give back every source, prepare the destination chunks, take every destination.
    /// `Err((i, why))` for the first move that cannot be done (the journal says what to undo).
    fn swap_metadata(&self, units: &[Unit], journal: &mut Journal) -> std::result::Result<(), (usize, String)> {
        for (i, u) in units.iter().enumerate() {
            let released = match &u.kind {
                Kind::SlabObject { from_slab, .. } => {
                    self.arena().slabs.unclaim_at(*from_slab, u.from).map_err(String::from)
                }
                Kind::Buddy => self.arena().buddy_release_raw(u.from, u.size),
                Kind::Run { chunks } => self.arena().run_release_raw(self.arena().geometry.chunk_of(u.from), *chunks),
                Kind::Slab { .. } => self.arena().buddy_release_raw(u.from, u.extent),
            };
            released.map_err(|why| (i, format!("the block at {} is not where its handle says: {why}", u.from)))?;
            journal.released.push(i);
        }
        for (i, u) in units.iter().enumerate() {
            self.prepare_chunks(u, journal).map_err(|why| (i, why))?;
        }
        for (i, u) in units.iter().enumerate() {
            let taken = match &u.kind {
                Kind::SlabObject { class, .. } => match self.arena().slabs.lookup(u.to) {
                    Some(s) if s.class == *class => self.arena().slabs.claim_at(s, u.to).map_err(String::from),
                    _ => Err("no slab of the block's size class is there".into()),
                },
                Kind::Buddy => self.arena().buddy_reserve_at(u.to, u.size, &mut journal.swept),
                Kind::Run { chunks } => self.arena().run_reserve_at(self.arena().geometry.chunk_of(u.to), *chunks),
                Kind::Slab { .. } => self.arena().buddy_reserve_at(u.to, u.extent, &mut journal.swept),
            };
            taken.map_err(|why| (i, format!("destination {} is not free: {why}", u.to)))?;
            journal.reserved.push(i);
        }
        Ok(())
    }

    /// Make the chunks under `u`'s destination what it needs: a core chunk for a buddy block or
    /// slab (a free chunk is granted), free chunks for a run (empty core chunks are retired).
    fn prepare_chunks(&self, u: &Unit, journal: &mut Journal) -> std::result::Result<(), String> {
        match &u.kind {
            Kind::SlabObject { .. } => Ok(()),
            Kind::Buddy | Kind::Slab { .. } => {
                let chunk = self.arena().geometry.chunk_of(u.to);
                match self.arena().global.state(chunk) {
                    ChunkState::Core(_) => Ok(()),
                    ChunkState::Free => {
                        if self.arena().grant_exact(chunk, u.core) {
                            journal.granted.push((chunk, u.core));
                            Ok(())
                        } else {
                            Err(format!("chunk {chunk} could not be granted"))
                        }
                    }
                    _ => Err(format!("destination {} lies in a chunk run that stays", u.to)),
                }
            }
            Kind::Run { chunks } => {
                let start = self.arena().geometry.chunk_of(u.to);
                for chunk in start..start + chunks {
                    match self.arena().global.state(chunk) {
                        ChunkState::Free => {}
                        ChunkState::Core(owner)
                            if self.arena().chunk_is_empty(chunk) && self.arena().retire_swept(chunk, owner) =>
                        {
                            journal.retired.push((chunk, owner));
                        }
                        _ => return Err(format!("destination {} overlaps live blocks in chunk {chunk}", u.to)),
                    }
                }
                Ok(())
            }
        }
    }

    /// Undo the metadata phase: the pool's blocks are where they were (a `Corruption` error if
    /// that proves impossible, which would be a bug).
    fn undo(&self, units: &[Unit], journal: &mut Journal) -> Result<()> {
        let mut findings = Vec::new();
        for &i in journal.reserved.iter().rev() {
            let u = &units[i];
            let r = match &u.kind {
                Kind::SlabObject { .. } => match self.arena().slabs.lookup(u.to) {
                    Some(s) => self.arena().slabs.unclaim_at(s, u.to).map_err(String::from),
                    None => Err("its slab is gone".into()),
                },
                Kind::Buddy => self.arena().buddy_release_raw(u.to, u.size),
                Kind::Run { chunks } => self.arena().run_release_raw(self.arena().geometry.chunk_of(u.to), *chunks),
                Kind::Slab { .. } => self.arena().buddy_release_raw(u.to, u.extent),
            };
            if let Err(why) = r {
                findings.push(format!("undo: destination {} of a move: {why}", u.to));
            }
        }
        for &(chunk, owner) in journal.granted.iter().rev() {
            if !self.arena().retire_swept(chunk, owner) {
                findings.push(format!("undo: chunk {chunk} granted for the batch did not empty"));
            }
        }
        for &(chunk, owner) in journal.retired.iter().rev() {
            if !self.arena().grant_exact(chunk, owner) {
                findings.push(format!("undo: chunk {chunk} could not go back to core {owner}"));
            }
        }
        journal.swept.clear();
        for &i in journal.released.iter().rev() {
            let u = &units[i];
            let r = match &u.kind {
                Kind::SlabObject { from_slab, .. } => {
                    self.arena().slabs.claim_at(*from_slab, u.from).map_err(String::from)
                }
                Kind::Buddy => self.arena().buddy_reserve_at(u.from, u.size, &mut journal.swept),
                Kind::Run { chunks } => self.arena().run_reserve_at(self.arena().geometry.chunk_of(u.from), *chunks),
                Kind::Slab { .. } => self.arena().buddy_reserve_at(u.from, u.extent, &mut journal.swept),
            };
            if let Err(why) = r {
                findings.push(format!("undo: source {} of a move: {why}", u.from));
            }
        }
        if findings.is_empty() {
            Ok(())
        } else {
            Err(Error::Corruption(findings))
        }
    }
}

#[cold]
fn corrupt(handle: Handle, why: &str) -> Error {
    Error::Corruption(vec![format!("live handle {handle:?}: {why}")])
}
