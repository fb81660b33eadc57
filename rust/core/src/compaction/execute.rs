//! Running one batch of moves: every source given back and every destination taken in the
//! metadata (undone if one cannot be), the bytes copied in a safe order (or handed to the
//! caller's mover), the handles re-pointed, and the slabs and chunks the sources left tidied.
//!
//! Sources are given back before destinations are taken, so a destination may overlap its own
//! source or another moving block's (a slide); everything else it overlaps makes the batch fail
//! before any byte moves. The caller has marked every moving handle (`begin_move`); whatever
//! happens, every mark is cleared on return.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::time::Instant;

use super::model::Model;
use super::order::{order, Step, Transfer};
use super::piece::{Piece, PieceKind};
use super::types::{BatchMover, MovedBlocks};
use super::waves::{reverse, waves};
use crate::arena::exact::Swept;
use crate::arena::front::FrontLayout;
use crate::arena::global::ChunkState;
use crate::arena::layout::Layout;
use crate::error::{Error, Result};
use crate::gate::Interrupt;
use crate::handle::id::Handle;
use crate::handle::table::SlotInfo;
use crate::pool::pool::Pool;
use crate::util::failpoint;
use crate::util::grow::try_vec;

/// How many times a wave's copy back is tried before the batch is reported as corrupt.
const COPY_BACK_TRIES: usize = 3;

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
    pub(crate) fn piece_of(&self, handle: Handle, info: &SlotInfo) -> Result<Piece> {
        let core = info.core as usize % self.arena().cores.len();
        let home = self.home_of(info.offset, info.size);
        let place = (info.offset, info.size, info.align_log2);
        Piece::of_block(handle, place, core, home, &self.arena().geometry, &self.arena().slabs.classes.classes)
            .map_err(|why| corrupt(handle, why))
    }

    /// Whether `piece.to` can hold the block as its kind needs: inside the arena, aligned,
    /// bank-safe, at a place its kind of block can start. (Whether the place is free is decided
    /// when it is taken.)
    pub(crate) fn check_destination(&self, piece: &Piece) -> std::result::Result<(), String> {
        let (to, size) = (piece.to, piece.size);
        let (g, slabs) = (&self.arena().geometry, &self.arena().slabs);
        let usable = g.usable_capacity();
        if to >= usable || size > usable - to {
            return Err(format!("destination {to} (+{size} bytes) lies outside the arena ({usable} usable bytes)"));
        }
        if to % piece.align != 0 {
            return Err(format!("destination {to} is not aligned to the block's alignment {}", piece.align));
        }
        let bank = self.config().bank_size;
        let bank_ok = if size <= bank { to / bank == (to + size - 1) / bank } else { to % bank == 0 };
        if !bank_ok {
            return Err(format!("destination {to} (+{size} bytes) breaks the bank rule (bank size {bank})"));
        }
        match &piece.kind {
            PieceKind::SlabObject { class, .. } => {
                let size_class = slabs.classes.classes[*class].size;
                match slabs.lookup(to) {
                    Some(s) if s.class == *class && slabs.object_at(s, to).is_some() => Ok(()),
                    _ => Err(format!(
                        "destination {to} is not an object of a slab of the block's size class ({size_class} bytes)"
                    )),
                }
            }
            PieceKind::Buddy => {
                let Layout::Buddy(b) = g.layout(size, piece.align) else {
                    return Err("the block is not a buddy block".into());
                };
                // Any unit of a chunk may start one (a packed block: see `BuddyLayout`), as
                // long as it ends inside the chunk; alignment and banks are checked above.
                let within = g.unit_in_chunk(to);
                let chunk = g.chunk_of(to);
                if to % g.min_block != 0 || within + b.units > g.usable_units(chunk) {
                    return Err(format!(
                        "destination {to} is not where a {}-byte buddy block can start (a multiple of {} bytes, \
                         with the whole block inside one {}-byte chunk)",
                        b.units as usize * g.min_block,
                        g.min_block,
                        g.chunk_size
                    ));
                }
                Ok(())
            }
            PieceKind::Run { .. } if piece.front_at_destination(g).is_some() => {
                // A block with a front there (`arena/front.rs`): it fits the arena.
                if piece.align > g.chunk_size {
                    return Err(format!("a block aligned to {} bytes has no front", piece.align));
                }
                Ok(())
            }
            PieceKind::Run { chunks } => {
                let (align_chunks, tail) = match g.layout(size, piece.align) {
                    Layout::Run { align_chunks, .. } => (align_chunks, 0),
                    Layout::RunTail { align_chunks, tail, .. } => (align_chunks, tail.units),
                    Layout::Buddy(_) => return Err("the block is not a chunk run".into()),
                };
                let start = g.chunk_of(to);
                if to % g.chunk_size != 0 || start % align_chunks != 0 {
                    return Err(format!(
                        "destination {to} is not the start of a chunk (a chunk run starts on a multiple of {} bytes)",
                        g.chunk_size * align_chunks
                    ));
                }
                if start + chunks > g.chunks || g.run_bytes(start, *chunks) + g.tail_bytes(size) != piece.extent {
                    return Err(format!("destination {to} leaves no room for the run's {chunks} chunks"));
                }
                if tail > 0 && (start + chunks >= g.chunks || tail > g.usable_units(start + chunks)) {
                    return Err(format!(
                        "destination {to} leaves no room for the run's tail after its {chunks} chunks"
                    ));
                }
                Ok(())
            }
            PieceKind::Slab { .. } => {
                if to % piece.extent != 0 {
                    return Err(format!("a slab of {} bytes cannot start at {to}", piece.extent));
                }
                Ok(())
            }
        }
    }

    /// Where each transfer that `steps` save goes meanwhile when a mover copies the bytes
    /// (indexed by transfer; empty when nothing is saved): free space of the arena that no
    /// source or destination of the batch touches, found before the metadata changes (nobody
    /// else allocates while the batch runs). `None` when there is not enough.
    fn scratch_for(&self, pieces: &[Piece], transfers: &[Transfer], steps: &[Step]) -> Option<Vec<usize>> {
        let saves: Vec<usize> =
            steps.iter().filter_map(|&s| if let Step::Save(i) = s { Some(i) } else { None }).collect();
        if saves.is_empty() {
            return Some(Vec::new());
        }
        let g = &self.arena().geometry;
        let mut model = Model::of(self); // sources are still taken in it
        for u in pieces {
            let chunk = g.chunk_of(u.to);
            if let Some(f) = u.front_at_destination(g) {
                model.set_fronted(&f, true, u.core);
                continue;
            }
            match u.kind {
                PieceKind::Run { chunks } => {
                    model.set_run(chunk, chunks, true);
                    let tail = g.tail_bytes(u.size);
                    if tail > 0 {
                        model.occupy(chunk + chunks, 0, (tail / g.min_block) as u64, u.core);
                    }
                }
                PieceKind::Buddy | PieceKind::Slab { .. } => {
                    model.occupy(chunk, g.unit_in_chunk(u.to), (u.extent / g.min_block) as u64, u.core)
                }
                PieceKind::SlabObject { .. } => {} // inside a slab, taken already
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
                        (d..d + chunks).all(|c| model.is_empty(c)) && self.arena().geometry.run_bytes(d, chunks) >= len
                    })?;
                    model.set_run(start, chunks, true);
                    start * g.chunk_size
                }
            };
        }
        Some(scratch)
    }

    /// Run a batch (see the module documentation). `index[i]` is the caller's number for
    /// `pieces[i]` (errors name it); `created` are slabs made for the batch (retired again if it
    /// fails). Pieces going nowhere are dropped first.
    pub(crate) fn execute(
        &self,
        pieces: Vec<Piece>,
        index: Vec<usize>,
        created: Vec<u32>,
        mover: Option<BatchMover<'_, '_>>,
    ) -> Result<MovedBlocks> {
        let started = Instant::now();
        let free_before = self.arena().global.free_chunks();
        let mut kept = Vec::with_capacity(pieces.len());
        let mut numbers = Vec::with_capacity(pieces.len());
        for (piece, i) in pieces.into_iter().zip(index) {
            if piece.to == piece.from {
                self.end_moves(&piece);
            } else {
                kept.push(piece);
                numbers.push(i);
            }
        }
        let pieces = kept;
        let transfers: Vec<Transfer> = pieces.iter().map(Piece::transfer).collect();
        let steps = order(&transfers, true).expect("with bouncing allowed every batch has an order");
        // When the caller copies the bytes (a mover, or the transfers this returns on a pool
        // without host memory), a cycle is broken through free space of the arena; host memory
        // we copy ourselves bounces through a buffer.
        let caller_copies = mover.is_some() || self.arena().backing.is_none();
        let scratch = if caller_copies { self.scratch_for(&pieces, &transfers, &steps) } else { Some(Vec::new()) };
        let Some(scratch) = scratch else {
            let blocks = order(&transfers, false).err().unwrap_or(0);
            pieces.iter().for_each(|u| self.end_moves(u));
            self.tidy_slabs(&created);
            return Err(Error::MoveCycle { blocks });
        };
        // Host memory copies the sources that break cycles through bounce buffers: asked for now,
        // by their sizes, so that a host that refuses them leaves the batch undone.
        let mut bounce = match self.arena().backing.is_some().then(|| bounce_buffers(&transfers, &steps)) {
            None => Vec::new(),
            Some(Ok(buffers)) => buffers,
            Some(Err(e)) => {
                pieces.iter().for_each(|u| self.end_moves(u));
                self.tidy_slabs(&created);
                return Err(e);
            }
        };
        let mut journal = Journal::default();
        if let Err((i, reason)) = self.swap_metadata(&pieces, &mut journal) {
            let undone = self.undo(&pieces, &mut journal);
            pieces.iter().for_each(|u| self.end_moves(u));
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
        let mover_ran = mover.is_some();
        if let Some(mover) = mover {
            // One call per wave (`waves.rs`); a failure undoes the waves done by reverse copies.
            let waves = waves(&ordered);
            // A failpoint at each call (`mover.wave`, `mover.copy_back`) lets the crate's tests
            // fail every one in turn. A mover that panics has failed that call: the batch is
            // undone as for an error, rather than unwound with its blocks half moved.
            let mut call = |name: &'static str, copies: &[Transfer]| {
                if failpoint::fire(name) {
                    Err(format!("failpoint {name}"))
                } else {
                    panic::catch_unwind(AssertUnwindSafe(|| mover(copies)))
                        .unwrap_or_else(|payload| Err(format!("the mover panicked: {}", panic_text(&*payload))))
                }
            };
            for (w, wave) in waves.iter().enumerate() {
                let Err(reason) = call("mover.wave", wave) else { continue };
                // A copy back writes each block's bytes to where they were read from, which
                // nothing wrote since: tried again after a failure (a mover interrupted by a
                // signal), it copies the same bytes.
                let copied_back = reverse(&waves[..w]).iter().try_for_each(|back| {
                    let mut tried = call("mover.copy_back", back);
                    for _ in 1..COPY_BACK_TRIES {
                        if tried.is_ok() {
                            break;
                        }
                        tried = call("mover.copy_back", back);
                    }
                    tried
                });
                let undone = self.undo(&pieces, &mut journal);
                pieces.iter().for_each(|u| self.end_moves(u));
                self.tidy_slabs(&created);
                undone?;
                if let Err(copy_back) = copied_back {
                    return Err(Error::CopyBackFailed { mover: reason, copy_back, tries: COPY_BACK_TRIES });
                }
                return Err(Error::MoverFailed(reason));
            }
        }
        if let Some(backing) = &self.arena().backing {
            let base = backing.base().as_ptr();
            // The copies of a large batch take seconds: between two, the calling thread's
            // interrupt check (Ctrl-C in Python) may end them, and then they are undone. Not
            // after a mover ran (it would have to copy back as well).
            let mut interrupt = (!mover_ran).then(Interrupt::of_caller);
            let copying = Instant::now();
            for (done, &step) in steps.iter().enumerate() {
                // A failpoint at each step (`copies.interrupt`) lets the crate's tests end the
                // copies after every prefix.
                let ended = interrupt.is_some() && failpoint::fire("copies.interrupt");
                if ended || interrupt.as_mut().is_some_and(Interrupt::gives_up) {
                    // SAFETY: as below, for the steps made so far.
                    unsafe { undo_host_steps(base, &transfers, &steps[..done], &bounce) };
                    super::copy::fence();
                    let undone = self.undo(&pieces, &mut journal);
                    pieces.iter().for_each(|u| self.end_moves(u));
                    self.tidy_slabs(&created);
                    undone?;
                    return Err(Error::CopiesInterrupted { after_ms: copying.elapsed().as_millis() as u64 });
                }
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
                            // Within the room asked for: no allocation here.
                            bounce[i].extend_from_slice(std::slice::from_raw_parts(base.add(t.src), t.len));
                        }
                        Step::Restore(i) => {
                            let t = transfers[i];
                            // The saved bytes stay until the batch ends: an undo saves them again.
                            debug_assert_eq!(bounce[i].len(), t.len, "saved before it is restored");
                            std::ptr::copy_nonoverlapping(bounce[i].as_ptr(), base.add(t.dst), t.len);
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
        for piece in &pieces {
            if let PieceKind::Slab { id, .. } = piece.kind {
                self.arena().slabs.unmap(id);
            }
        }
        for piece in &pieces {
            match &piece.kind {
                PieceKind::Slab { id, objects } => {
                    self.arena().slabs.rebase(*id, piece.to);
                    for &(h, offset) in objects {
                        self.handles().set_moved_offset(h, offset - piece.from + piece.to);
                    }
                }
                PieceKind::SlabObject { from_slab, .. } => {
                    slabs_touched.push(from_slab.id);
                    if let Some(s) = self.arena().slabs.lookup(piece.to) {
                        slabs_touched.push(s.id);
                    }
                    self.handles().set_moved_offset(piece.handle.expect("a block has a handle"), piece.to);
                }
                _ => self.handles().set_moved_offset(piece.handle.expect("a block has a handle"), piece.to),
            }
            blocks += piece.blocks();
            bytes += piece.copy_len();
        }
        for piece in &pieces {
            // A block that leaves a front for a run holds other bytes after the move.
            let g = &self.arena().geometry;
            let (before, after) = (piece.bytes_at(g, piece.from), piece.bytes_at(g, piece.to));
            if before != after {
                self.count_resized(before, after);
            }
            self.end_moves(piece);
            match &piece.kind {
                PieceKind::Slab { objects, .. } => {
                    for &(h, offset) in objects {
                        let _ = self.record_move(h, offset, offset - piece.from + piece.to);
                    }
                }
                _ => {
                    let _ = self.record_move(piece.handle.expect("a block has a handle"), piece.from, piece.to);
                }
            }
        }
        slabs_touched.sort_unstable();
        slabs_touched.dedup();
        self.tidy_slabs(&slabs_touched);
        self.arena().retire_empty_chunks();
        let chunks_freed = self.arena().global.free_chunks().saturating_sub(free_before);
        // Sources were given back quietly (`swap_metadata`): announce each chunk that keeps
        // blocks once (an emptied chunk went back to the global pool above).
        let g = &self.arena().geometry;
        let mut quiet = vec![false; g.chunks];
        for u in pieces.iter().filter(|u| matches!(u.kind, PieceKind::Buddy | PieceKind::Slab { .. })) {
            quiet[g.chunk_of(u.from)] = true;
        }
        (0..g.chunks).filter(|&c| quiet[c]).for_each(|c| self.arena().announce_chunk(c));
        Ok(MovedBlocks {
            blocks,
            bytes,
            transfers: ordered,
            bounced: steps.iter().filter(|s| matches!(s, Step::Save(_))).count(),
            chunks_freed,
            elapsed: started.elapsed(),
        })
    }

    fn end_moves(&self, piece: &Piece) {
        for h in piece.each_handle() {
            self.handles().end_move(h);
        }
    }

    fn tidy_slabs(&self, ids: &[u32]) {
        for &id in ids {
            self.arena().slabs.tidy(id, self.arena());
        }
    }

    /// Give back every source (quietly: the chunks are announced once the batch is done, see
    /// `Arena::announce_chunk`; undone, the sources are taken again and nothing needs telling),
    /// prepare the destination chunks, take every destination.
    /// `Err((i, why))` for the first move that cannot be done (the journal says what to undo).
    fn swap_metadata(&self, pieces: &[Piece], journal: &mut Journal) -> std::result::Result<(), (usize, String)> {
        for (i, u) in pieces.iter().enumerate() {
            let released = match &u.kind {
                // A block with a front leaves its front, chunks and tail; it lands as its size
                // lays out at its destination (`arena/front.rs`).
                PieceKind::Buddy | PieceKind::Run { .. } if self.has_front(u) => {
                    self.arena().fronted_release_raw(u.from, u.size)
                }
                PieceKind::SlabObject { from_slab, .. } => {
                    self.arena().slabs.unclaim_at(*from_slab, u.from).map_err(String::from)
                }
                PieceKind::Buddy => self.arena().buddy_release_quiet(u.from, u.size),
                PieceKind::Run { chunks } => {
                    self.arena().run_release_sized(self.arena().geometry.chunk_of(u.from), *chunks, u.size)
                }
                PieceKind::Slab { .. } => self.arena().buddy_release_quiet(u.from, u.extent),
            };
            released.map_err(|why| (i, format!("the block at {} is not where its handle says: {why}", u.from)))?;
            journal.released.push(i);
        }
        for (i, u) in pieces.iter().enumerate() {
            self.prepare_chunks(u, journal).map_err(|why| (i, why))?;
        }
        for (i, u) in pieces.iter().enumerate() {
            let taken = match &u.kind {
                PieceKind::SlabObject { class, .. } => match self.arena().slabs.lookup(u.to) {
                    Some(s) if s.class == *class => self.arena().slabs.claim_at(s, u.to).map_err(String::from),
                    _ => Err("no slab of the block's size class is there".into()),
                },
                PieceKind::Buddy => self.arena().buddy_reserve_at(u.to, u.size, &mut journal.swept),
                PieceKind::Run { .. } if u.front_at_destination(&self.arena().geometry).is_some() => {
                    self.arena().fronted_reserve_at(u.to, u.size, &mut journal.swept)
                }
                PieceKind::Run { chunks } => self.arena().run_reserve_sized(
                    self.arena().geometry.chunk_of(u.to),
                    *chunks,
                    u.size,
                    &mut journal.swept,
                ),
                PieceKind::Slab { .. } => self.arena().buddy_reserve_at(u.to, u.extent, &mut journal.swept),
            };
            taken.map_err(|why| (i, format!("destination {} is not free: {why}", u.to)))?;
            journal.reserved.push(i);
        }
        Ok(())
    }

    /// Make the chunks under `u`'s destination what it needs: a core chunk for a buddy block or
    /// slab (a free chunk is granted), free chunks for a run (empty core chunks are retired).
    fn prepare_chunks(&self, u: &Piece, journal: &mut Journal) -> std::result::Result<(), String> {
        match &u.kind {
            PieceKind::SlabObject { .. } => Ok(()),
            PieceKind::Buddy | PieceKind::Slab { .. } => {
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
            PieceKind::Run { .. } if u.front_at_destination(&self.arena().geometry).is_some() => {
                self.prepare_front_chunks(u, journal)
            }
            PieceKind::Run { chunks } => {
                let start = self.arena().geometry.chunk_of(u.to);
                self.free_whole_chunks(u, start, *chunks, journal)?;
                // A tail goes to the start of the chunk after the run: a core chunk (a free
                // one is granted).
                let last = start + chunks;
                if self.arena().geometry.tail_bytes(u.size) > 0 && self.arena().global.state(last) == ChunkState::Free {
                    if !self.arena().grant_exact(last, u.core) {
                        return Err(format!("chunk {last} could not be granted for the run's tail"));
                    }
                    journal.granted.push((last, u.core));
                }
                Ok(())
            }
        }
    }

    /// Make the `count` whole chunks from `start` that piece `u` lands on free: free chunks
    /// stay, empty core chunks are retired (and journaled), any other is an error.
    fn free_whole_chunks(
        &self,
        u: &Piece,
        start: usize,
        count: usize,
        journal: &mut Journal,
    ) -> std::result::Result<(), String> {
        for chunk in start..start + count {
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

    /// Whether the source of `u` is a block with a front (`arena/front.rs`): a block in a
    /// core chunk whose requested bytes cross that chunk's end.
    fn has_front(&self, u: &Piece) -> bool {
        let g = &self.arena().geometry;
        FrontLayout::of(g, u.from, u.size).is_some()
            && matches!(self.arena().global.state(g.chunk_of(u.from)), ChunkState::Core(_))
    }

    /// [`Pool::prepare_chunks`] for a run-sized block that lands with a front
    /// (`arena/front.rs`): its front's chunk and its tail's a core chunk (a free one is
    /// granted), its whole chunks free (empty core chunks are retired).
    fn prepare_front_chunks(&self, u: &Piece, journal: &mut Journal) -> std::result::Result<(), String> {
        let g = &self.arena().geometry;
        let Some(f) = u.front_at_destination(g) else { return Err(format!("destination {} holds no front", u.to)) };
        self.free_whole_chunks(u, f.first_whole(), f.chunks, journal)?;
        let ends = [Some(f.chunk), (f.tail_units > 0).then(|| f.tail_chunk())];
        for chunk in ends.into_iter().flatten() {
            match self.arena().global.state(chunk) {
                ChunkState::Core(_) => {}
                ChunkState::Free if self.arena().grant_exact(chunk, u.core) => journal.granted.push((chunk, u.core)),
                _ => return Err(format!("chunk {chunk} cannot hold the front or the tail of the block at {}", u.to)),
            }
        }
        Ok(())
    }

    /// Undo the metadata phase: the pool's blocks are where they were (a `Corruption` error if
    /// that proves impossible, which would be a bug).
    fn undo(&self, pieces: &[Piece], journal: &mut Journal) -> Result<()> {
        let mut findings = Vec::new();
        for &i in journal.reserved.iter().rev() {
            let u = &pieces[i];
            let r = match &u.kind {
                PieceKind::SlabObject { .. } => match self.arena().slabs.lookup(u.to) {
                    Some(s) => self.arena().slabs.unclaim_at(s, u.to).map_err(String::from),
                    None => Err("its slab is gone".into()),
                },
                PieceKind::Buddy => self.arena().buddy_release_raw(u.to, u.size),
                PieceKind::Run { .. } if u.front_at_destination(&self.arena().geometry).is_some() => {
                    self.arena().fronted_release_raw(u.to, u.size)
                }
                PieceKind::Run { chunks } => {
                    self.arena().run_release_sized(self.arena().geometry.chunk_of(u.to), *chunks, u.size)
                }
                PieceKind::Slab { .. } => self.arena().buddy_release_raw(u.to, u.extent),
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
            let u = &pieces[i];
            let r = match &u.kind {
                PieceKind::Buddy | PieceKind::Run { .. } if self.has_front(u) => {
                    self.arena().fronted_reserve_at(u.from, u.size, &mut journal.swept)
                }
                PieceKind::SlabObject { from_slab, .. } => {
                    self.arena().slabs.claim_at(*from_slab, u.from).map_err(String::from)
                }
                PieceKind::Buddy => self.arena().buddy_reserve_at(u.from, u.size, &mut journal.swept),
                PieceKind::Run { chunks } => self.arena().run_reserve_sized(
                    self.arena().geometry.chunk_of(u.from),
                    *chunks,
                    u.size,
                    &mut journal.swept,
                ),
                PieceKind::Slab { .. } => self.arena().buddy_reserve_at(u.from, u.extent, &mut journal.swept),
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

/// Empty buffers with room for the source of every transfer that `steps` saves (the others get
/// none), or `Error::HostMemory` when the host refuses one (failpoint `host.vec`).
fn bounce_buffers(transfers: &[Transfer], steps: &[Step]) -> Result<Vec<Vec<u8>>> {
    let mut buffers: Vec<Vec<u8>> = try_vec(transfers.len(), "a compaction's bounce buffers")?;
    buffers.resize_with(transfers.len(), Vec::new);
    for &step in steps {
        if let Step::Save(i) = step {
            let len = transfers[i].len;
            let room = try_vec(len, "a compaction's bounce buffer")?;
            buffers[i] = room;
        }
    }
    Ok(buffers)
}

/// The message a panic carried (`panic!` with a string or a format), or a stand-in.
fn panic_text(payload: &(dyn Any + Send)) -> &str {
    payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

/// Undo host-memory copy steps `done` (a prefix of a batch's order), last first: each copy
/// copies its destination back to its source (the destination holds the source's bytes: no
/// later step wrote there), and a bounced transfer restores its source from the bounce buffer,
/// which keeps the bytes it saved. Destinations keep what they got: they were free, or a
/// source of the batch, restored in turn.
///
/// # Safety
/// As for the steps themselves: every range inside the arena at `base`, nobody else touching
/// them; `bounce[i]` holds the bytes saved for every `Save(i)` in `done`.
unsafe fn undo_host_steps(base: *mut u8, transfers: &[Transfer], done: &[Step], bounce: &[Vec<u8>]) {
    for &step in done.iter().rev() {
        // SAFETY: the caller's contract.
        unsafe {
            match step {
                Step::Copy(i) => {
                    let t = transfers[i];
                    super::copy::copy(base.add(t.dst), base.add(t.src), t.len);
                }
                Step::Restore(_) => {}
                Step::Save(i) => {
                    let t = transfers[i];
                    std::ptr::copy_nonoverlapping(bounce[i].as_ptr(), base.add(t.src), t.len);
                }
            }
        }
    }
}
