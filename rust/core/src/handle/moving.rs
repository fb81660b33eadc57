//! Moving a block's slot (compaction, issue 5): the `MOVING` flag of the slot state word.
//!
//! A relocation marks each block it moves with one CAS that succeeds only while the slot is
//! live, matches the handle and has no pins, so no pin or free can slip in between the check and
//! the move. While the flag is set, `pin` and `remove` wait (the non-waiting [`try_pin`] says
//! [`Error::Moving`] instead, for callers holding a lock the mover may need: the GIL), and `get`
//! may read the old or the new offset. The relocation stores the new offset, then clears the
//! flag with a release store: whoever pins after that sees the new offset.
//!
//! [`try_pin`]: HandleTable::try_pin

#[cfg(test)]
use super::LIVE;
use super::{HandleTable, SlotInfo, GENERATION_MASK, MAX_PINS, MOVING, PIN_ONE, PIN_SHIFT};
use crate::error::{Error, HandleFault, Result};
use crate::handle::Handle;
use crate::sync::Ordering;

impl HandleTable {
    /// Mark a live, unpinned block as moving; returns what its slot records. Refused (and
    /// nothing changes) for a freed or foreign handle, a pinned block, or one already moving.
    pub(crate) fn begin_move(&self, handle: Handle) -> Result<SlotInfo> {
        let slot = self.live_slot(handle)?;
        let mut state = slot.state.load(Ordering::Acquire);
        loop {
            if !Self::matches(state, handle) {
                return Err(Error::InvalidHandle(HandleFault::Freed));
            }
            let pins = (state >> PIN_SHIFT) as u32;
            if pins > 0 {
                return Err(Error::Pinned { pins });
            }
            if state & MOVING != 0 {
                return Err(Error::InvalidMove { reason: "the block is named twice in the batch".into() });
            }
            match slot.state.compare_exchange_weak(state, state | MOVING, Ordering::AcqRel, Ordering::Acquire) {
                // Moving and unpinned: the slot's fields cannot change under us now.
                Ok(_) => return Ok(Self::read_info(slot, state)),
                Err(seen) => state = seen,
            }
        }
    }

    /// Point a moving block's slot at `offset` (its bytes are there already).
    pub(crate) fn set_moved_offset(&self, handle: Handle, offset: usize) {
        let slot = self.slot(handle.slot());
        debug_assert!(slot.state.load(Ordering::Relaxed) & MOVING != 0, "only a moving slot is re-pointed");
        slot.offset.store(offset as u64, Ordering::Release);
    }

    /// The move of `handle` is over (done or undone): pins and frees may go on.
    pub(crate) fn end_move(&self, handle: Handle) {
        let slot = self.slot(handle.slot());
        let before = slot.state.fetch_and(!MOVING, Ordering::AcqRel);
        debug_assert!(before & MOVING != 0 && before & GENERATION_MASK == handle.generation() as u64);
    }

    /// Add a pin without waiting: [`Error::Moving`] while the block is being moved.
    pub(crate) fn try_pin(&self, handle: Handle) -> Result<u32> {
        let slot = self.live_slot(handle)?;
        let mut state = slot.state.load(Ordering::Acquire);
        loop {
            if !Self::matches(state, handle) {
                return Err(Error::InvalidHandle(HandleFault::Freed));
            }
            if state & MOVING != 0 {
                return Err(Error::Moving);
            }
            let pins = state >> PIN_SHIFT;
            if pins >= MAX_PINS {
                return Err(Error::Pinned { pins: pins as u32 });
            }
            match slot.state.compare_exchange_weak(state, state + PIN_ONE, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(pins as u32 + 1),
                Err(seen) => state = seen,
            }
        }
    }

    /// Visit every live slot of a paused pool as `(handle, info, claimed)`: each unpinned block
    /// is marked moving on the way (`claimed`; the caller clears every mark), pinned ones are
    /// only reported. One pass, one CAS per block.
    pub(crate) fn claim_live(&self, f: &mut dyn FnMut(Handle, SlotInfo, bool)) {
        let fresh = self.fresh.load(Ordering::Acquire).min(self.max_slots());
        for index in 0..fresh {
            let Some(slot) = self.existing_slot(index) else {
                continue;
            };
            let mut state = slot.state.load(Ordering::Acquire);
            loop {
                if state & super::LIVE == 0 || state & MOVING != 0 {
                    break;
                }
                let handle = Handle { pool: self.pool, slot: index, generation: state as u32 };
                if state >> PIN_SHIFT != 0 {
                    f(handle, Self::read_info(slot, state), false);
                    break;
                }
                match slot.state.compare_exchange_weak(state, state | MOVING, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => {
                        f(handle, Self::read_info(slot, state), true);
                        break;
                    }
                    Err(seen) => state = seen,
                }
            }
        }
    }

    /// Whether `handle`'s block is live and being moved now.
    #[cfg(test)]
    pub(crate) fn is_moving(&self, handle: Handle) -> bool {
        self.live_slot(handle).is_ok_and(|slot| {
            let state = slot.state.load(Ordering::Acquire);
            Self::matches(state, handle) && state & MOVING != 0 && state & LIVE != 0
        })
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_moving_block_refuses_pins_and_second_moves_until_it_lands() {
        let table = HandleTable::new(1, 8, 1);
        let h = table.insert(0, 4096, 100, 6, 0).unwrap();
        let info = table.begin_move(h).unwrap();
        assert_eq!(info.offset, 4096);
        assert!(table.is_moving(h));
        assert_eq!(table.try_pin(h), Err(Error::Moving));
        assert!(matches!(table.begin_move(h), Err(Error::InvalidMove { .. })));
        table.set_moved_offset(h, 8192);
        table.end_move(h);
        assert!(!table.is_moving(h));
        assert_eq!(table.try_pin(h), Ok(1));
        assert_eq!(table.get(h).unwrap().offset, 8192);
        assert_eq!(table.begin_move(h), Err(Error::Pinned { pins: 1 }));
        table.unpin(h).unwrap();
        table.remove(h).unwrap();
        assert_eq!(table.begin_move(h), Err(Error::InvalidHandle(HandleFault::Freed)));
    }
}

#[cfg(all(test, loom))]
mod loom_models {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// A relocation moves a block while another thread pins it, reads its offset twice and
    /// unpins: the offset never changes under a pin, and a pin taken after the move sees the
    /// new offset.
    #[test]
    fn a_pin_never_sees_a_block_move_under_it() {
        loom::model(|| {
            let table = Arc::new(HandleTable::new(1, 4, 1));
            let h = table.insert(0, 100, 8, 0, 0).unwrap();
            let t2 = table.clone();
            let pinner = thread::spawn(move || {
                t2.pin(h).unwrap(); // waits while moving
                let first = t2.get(h).unwrap().offset;
                let second = t2.get(h).unwrap().offset;
                t2.unpin(h).unwrap();
                (first, second)
            });
            let moved = match table.begin_move(h) {
                Ok(_) => {
                    table.set_moved_offset(h, 200);
                    table.end_move(h);
                    true
                }
                Err(Error::Pinned { .. }) => false,
                Err(other) => panic!("unexpected {other:?}"),
            };
            let (first, second) = pinner.join().unwrap();
            assert_eq!(first, second, "the block moved under a pin");
            if !moved {
                assert_eq!(first, 100, "nothing moved, the offset is the old one");
            }
            assert_eq!(table.get(h).unwrap().offset, if moved { 200 } else { 100 });
        });
    }

    /// A free races a move: the free waits for the move to land (or the move sees the block
    /// freed), and the slot is never re-pointed after it was freed.
    #[test]
    fn a_free_and_a_move_never_overlap() {
        loom::model(|| {
            let table = Arc::new(HandleTable::new(1, 4, 1));
            let h = table.insert(0, 100, 8, 0, 0).unwrap();
            let t2 = table.clone();
            let freer = thread::spawn(move || t2.remove(h).map(|info| info.offset));
            let moved = table.begin_move(h).is_ok();
            if moved {
                table.set_moved_offset(h, 200);
                table.end_move(h);
            }
            let freed_at = freer.join().unwrap().expect("the free succeeds, after the move if any");
            assert_eq!(freed_at, if moved { 200 } else { 100 }, "the free saw a half-done move");
        });
    }
}
