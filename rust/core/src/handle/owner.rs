//! The state of one owner of a handle (a Python `npumem.Block`): whether it owns the block, and
//! how, and the user pins it took. One atomic word, the ownership in the low byte and the pins
//! above it, so that counting a pin, handing the block on and ending the ownership agree when
//! threads race. Every change is one read-modify-write that never waits.
//!
//! The pins themselves live in the handle's slot (`table.rs`); the word counts those its owner
//! took, so that they can be dropped or handed on with the block. The owner takes a pin in the
//! slot first and then counts it here ([`OwnerWord::count_pin`]); it uncounts a pin here first
//! and then drops it in the slot ([`OwnerWord::uncount_pin`]). So the word never counts a pin the
//! slot does not hold.
//!
//! **Free at the last unpin.** An owner whose free was refused for pins (a `with` block's exit
//! while an exception is in flight) marks itself ([`OwnerWord::free_at_last_unpin`]) and checks
//! once; whoever drops a pin checks too ([`OwnerWord::frees_at_this_unpin`]). The marking and
//! the drop of a pin may race on two threads (a DLPack consumer drops its pin without the GIL):
//! each side writes its own word (the owner word, the slot) and then reads the other's, the
//! store-buffer pattern, so a sequentially consistent fence separates the write from the read on
//! both sides, and at least one of them sees the other's write and frees. The slot's free lets
//! only one of them succeed.

use crate::util::sync::{fence, AtomicU64, Ordering};

/// The ownership of an [`OwnerWord`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Ownership {
    /// Owned.
    Owned = 0,
    /// Owned; its free was refused for pins: the unpin that drops the last pin frees it.
    FreeAtLastUnpin = 1,
    /// Freed through this owner.
    Freed = 2,
    /// Its free is queued: unusable, freed at the flush.
    Deferred = 3,
    /// Handed on (detached): unusable through this owner.
    Detached = 4,
    /// A free through this owner is under way (it may wait for a pause): unusable meanwhile,
    /// then freed, or owned again if the free fails.
    Freeing = 5,
}

impl Ownership {
    fn of(word: u64) -> Ownership {
        match word & OWNER_BITS {
            0 => Ownership::Owned,
            1 => Ownership::FreeAtLastUnpin,
            2 => Ownership::Freed,
            3 => Ownership::Deferred,
            4 => Ownership::Detached,
            _ => Ownership::Freeing,
        }
    }

    /// Whether the owner still owns its block (owned, or owned until its last unpin).
    pub fn owning(self) -> bool {
        matches!(self, Ownership::Owned | Ownership::FreeAtLastUnpin)
    }
}

/// The ownership bits of the word; the pins are counted above them.
const OWNER_BITS: u64 = 0xff;
/// One pin, in the word.
const ONE_PIN: u64 = 1 << 8;

fn pins_of(word: u64) -> u32 {
    (word >> 8) as u32
}

/// One owner's state: see the module documentation.
#[derive(Debug)]
pub struct OwnerWord {
    word: AtomicU64,
}

impl Default for OwnerWord {
    fn default() -> Self {
        OwnerWord::adopted(0)
    }
}

impl OwnerWord {
    /// Owned, holding `pins` pins (those a block handed on by [`OwnerWord::detach`] brought).
    pub fn adopted(pins: u32) -> OwnerWord {
        OwnerWord { word: AtomicU64::new(u64::from(pins) * ONE_PIN) }
    }

    /// The ownership and the pins now.
    #[inline]
    pub fn load(&self) -> (Ownership, u32) {
        let word = self.word.load(Ordering::Acquire);
        (Ownership::of(word), pins_of(word))
    }

    /// The ownership now.
    #[inline]
    pub fn ownership(&self) -> Ownership {
        self.load().0
    }

    /// Apply `change` to the word while it returns a new one; the word before, or the word
    /// that `change` refused.
    fn update(&self, change: impl FnMut(u64) -> Option<u64>) -> Result<u64, u64> {
        self.word.fetch_update(Ordering::AcqRel, Ordering::Acquire, change)
    }

    /// Count a pin the caller took in the slot: the pins now, or the ownership that ended
    /// meanwhile (the caller then drops the slot's pin again, as it is not this owner's).
    pub fn count_pin(&self) -> Result<u32, Ownership> {
        self.update(|w| Ownership::of(w).owning().then_some(w + ONE_PIN))
            .map(|before| pins_of(before) + 1)
            .map_err(Ownership::of)
    }

    /// Uncount a pin the caller then drops in the slot: the pins left; `Err(None)` when the
    /// owner holds no pin, `Err(Some(ownership))` when its ownership ended.
    pub fn uncount_pin(&self) -> Result<u32, Option<Ownership>> {
        self.update(|w| (Ownership::of(w).owning() && pins_of(w) > 0).then(|| w - ONE_PIN))
            .map(|before| pins_of(before) - 1)
            .map_err(|w| (!Ownership::of(w).owning()).then(|| Ownership::of(w)))
    }

    /// Hand the block on: the pins that go with it, or the ownership that ended before.
    pub fn detach(&self) -> Result<u32, Ownership> {
        self.update(|w| Ownership::of(w).owning().then_some(Ownership::Detached as u64))
            .map(pins_of)
            .map_err(Ownership::of)
    }

    /// Mark the free queued, when owned without pins: the word before (for
    /// [`OwnerWord::undo_defer`]), else the ownership and pins that refused it.
    pub fn defer(&self) -> Result<u64, (Ownership, u32)> {
        self.update(|w| (Ownership::of(w).owning() && pins_of(w) == 0).then_some(Ownership::Deferred as u64))
            .map_err(|w| (Ownership::of(w), pins_of(w)))
    }

    /// Undo [`OwnerWord::defer`] (a batch that could not queue every block).
    pub fn undo_defer(&self, before: u64) {
        self.word.store(before, Ordering::Release);
    }

    /// Begin a free through this owner, when it owns the block without pins: the word before
    /// (for [`OwnerWord::undo_free`]), else the ownership and pins that refused it. Until the
    /// free ends, nothing else can hand the block on, queue its free, pin it through this
    /// owner or free it at its last unpin: a free that waits for a pause leaves the block to
    /// no other call.
    pub fn begin_free(&self) -> Result<u64, (Ownership, u32)> {
        self.update(|w| (Ownership::of(w).owning() && pins_of(w) == 0).then_some(Ownership::Freeing as u64))
            .map_err(|w| (Ownership::of(w), pins_of(w)))
    }

    /// The free that [`OwnerWord::begin_free`] began failed: owned again as `before`. (Nothing
    /// but that free's end changes the word meanwhile; a compare-and-swap all the same.)
    pub fn undo_free(&self, before: u64) {
        let _ = self.word.compare_exchange(Ownership::Freeing as u64, before, Ordering::AcqRel, Ordering::Acquire);
    }

    /// The block was freed through this owner (no pin of it is left).
    pub fn set_freed(&self) {
        self.word.store(Ownership::Freed as u64, Ordering::Release);
    }

    /// A free was refused for pins: free at the last unpin (an owned block keeps its pins).
    /// Then the caller checks [`OwnerWord::frees_at_this_unpin`] once, as the last pin may
    /// have gone meanwhile. Whether the block was owned.
    pub fn free_at_last_unpin(&self) -> bool {
        let marked = self
            .update(|w| {
                (Ownership::of(w) == Ownership::Owned).then_some((w & !OWNER_BITS) | Ownership::FreeAtLastUnpin as u64)
            })
            .is_ok();
        // The store-buffer pattern of the module documentation: the mark, then the slot's pins.
        fence(Ordering::SeqCst);
        marked
    }

    /// After a pin of the block went from its slot (or after [`OwnerWord::free_at_last_unpin`]):
    /// whether the caller should now try to free the block (marked, and no pin of this owner
    /// left). The slot decides whether the free succeeds (no pin of anyone left, freed once).
    pub fn frees_at_this_unpin(&self) -> bool {
        // The store-buffer pattern of the module documentation: the slot's unpin, then the mark.
        fence(Ordering::SeqCst);
        let (ownership, pins) = self.load();
        ownership == Ownership::FreeAtLastUnpin && pins == 0
    }

    /// Turn a free at the last unpin into a queued one (the slot refused the free for a pause):
    /// whether this call did (another may have freed or queued it first).
    pub fn queue_free_at_last_unpin(&self) -> bool {
        self.word
            .compare_exchange(
                Ownership::FreeAtLastUnpin as u64,
                Ownership::Deferred as u64,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn pins_are_counted_handed_on_and_refused_once_the_ownership_ends() {
        let w = OwnerWord::default();
        assert_eq!(w.uncount_pin(), Err(None));
        assert_eq!((w.count_pin(), w.count_pin()), (Ok(1), Ok(2)));
        assert_eq!(w.defer(), Err((Ownership::Owned, 2)));
        assert_eq!(w.uncount_pin(), Ok(1));
        assert_eq!(w.detach(), Ok(1));
        assert_eq!(w.load(), (Ownership::Detached, 0));
        assert_eq!(w.count_pin(), Err(Ownership::Detached));
        assert_eq!(w.uncount_pin(), Err(Some(Ownership::Detached)));
        let adopted = OwnerWord::adopted(1);
        assert_eq!(adopted.load(), (Ownership::Owned, 1));
    }

    #[test]
    fn a_free_under_way_refuses_every_other_change_and_ends_freed_or_owned_again() {
        let w = OwnerWord::default();
        let before = w.begin_free().unwrap();
        assert_eq!(w.load(), (Ownership::Freeing, 0));
        assert_eq!(w.detach(), Err(Ownership::Freeing));
        assert_eq!(w.defer(), Err((Ownership::Freeing, 0)));
        assert_eq!(w.count_pin(), Err(Ownership::Freeing));
        assert_eq!(w.begin_free(), Err((Ownership::Freeing, 0)));
        assert!(!w.free_at_last_unpin() && !w.frees_at_this_unpin());
        w.undo_free(before);
        assert_eq!(w.load(), (Ownership::Owned, 0));
        assert_eq!(w.count_pin(), Ok(1));
        assert_eq!(w.begin_free(), Err((Ownership::Owned, 1)), "a pinned block is not freed");
        assert_eq!(w.uncount_pin(), Ok(0));
        w.begin_free().unwrap();
        w.set_freed();
        w.undo_free(before);
        assert_eq!(w.load(), (Ownership::Freed, 0), "a free that ended is not undone");
    }

    #[test]
    fn a_free_at_the_last_unpin_waits_for_the_owners_pins() {
        let w = OwnerWord::adopted(1);
        assert!(w.free_at_last_unpin());
        assert!(!w.frees_at_this_unpin(), "its own pin is still counted");
        assert_eq!(w.uncount_pin(), Ok(0));
        assert!(w.frees_at_this_unpin());
        assert!(w.queue_free_at_last_unpin());
        assert!(!w.queue_free_at_last_unpin());
        assert_eq!(w.ownership(), Ownership::Deferred);
        let owned = OwnerWord::default();
        let before = owned.defer().unwrap();
        assert!(!owned.free_at_last_unpin());
        owned.undo_defer(before);
        assert_eq!(owned.load(), (Ownership::Owned, 0));
        owned.set_freed();
        assert!(!owned.ownership().owning());
    }
}

#[cfg(loom)]
mod loom_models {
    use super::*;
    use crate::util::sync::AtomicU32;
    use loom::sync::Arc;
    use loom::thread;

    /// The slot's side, as far as these models need it: its pins, and a free that succeeds
    /// once, only without pins (one word, as in `table.rs`).
    struct Slot {
        /// Pins in the low bits, `FREED` once freed.
        state: AtomicU32,
    }

    const FREED: u32 = 1 << 31;

    impl Slot {
        fn with_pins(pins: u32) -> Slot {
            Slot { state: AtomicU32::new(pins) }
        }

        fn pin(&self) {
            self.state.fetch_add(1, Ordering::AcqRel);
        }

        fn unpin(&self) {
            self.state.fetch_sub(1, Ordering::AcqRel);
        }

        fn try_free(&self) -> bool {
            self.state.compare_exchange(0, FREED, Ordering::AcqRel, Ordering::Acquire).is_ok()
        }
    }

    /// A pin counted while another thread hands the block on: either it goes with the block,
    /// or its owner learns in time to drop it. No pin is left that no owner counts.
    #[test]
    fn a_pin_and_a_detach_leave_no_orphan_pin() {
        loom::model(|| {
            let word = Arc::new(OwnerWord::default());
            let slot = Arc::new(Slot::with_pins(0));
            let (w, s) = (Arc::clone(&word), Arc::clone(&slot));
            let pinner = thread::spawn(move || {
                s.pin();
                if w.count_pin().is_err() {
                    s.unpin();
                }
            });
            let handed = word.detach().expect("owned until this detach");
            pinner.join().unwrap();
            assert_eq!(slot.state.load(Ordering::Acquire), handed, "the slot's pins are the handed pins");
        });
    }

    /// An unpin racing a deferral: the deferral succeeds only once the word counts no pin, and
    /// the slot never holds fewer pins than the word counts.
    #[test]
    fn an_unpin_and_a_deferral_agree() {
        loom::model(|| {
            let word = Arc::new(OwnerWord::adopted(1));
            let slot = Arc::new(Slot::with_pins(1));
            let (w, s) = (Arc::clone(&word), Arc::clone(&slot));
            let unpinner = thread::spawn(move || {
                if w.uncount_pin().is_ok() {
                    s.unpin();
                }
            });
            let deferred = word.defer().is_ok();
            // The slot first: a pin leaves the word before it leaves the slot, so what the word
            // counts afterwards is at most what the slot held before.
            let held = slot.state.load(Ordering::Acquire);
            let (_, counted) = word.load();
            assert!(held >= counted, "the word counts {counted} pins, the slot held {held}");
            unpinner.join().unwrap();
            assert_eq!(slot.state.load(Ordering::Acquire), 0, "the unpin dropped the pin either way");
            assert_eq!(word.ownership(), if deferred { Ownership::Deferred } else { Ownership::Owned });
        });
    }

    /// A free through the owner (which may wait for a pause, without the GIL) races a detach
    /// or a deferral on another thread: exactly one of them takes the block. A free that only
    /// checked the word before freeing the slot, and set it after, freed a block whose handle
    /// the detach had handed on, or whose free the deferral had queued.
    #[test]
    fn a_free_and_a_detach_or_a_deferral_take_the_block_once() {
        for deferral in [false, true] {
            loom::model(move || {
                let word = Arc::new(OwnerWord::default());
                let slot = Arc::new(Slot::with_pins(0));
                let (w, s) = (Arc::clone(&word), Arc::clone(&slot));
                let freer = thread::spawn(move || match w.begin_free() {
                    Ok(_) if s.try_free() => {
                        w.set_freed();
                        true
                    }
                    Ok(before) => {
                        w.undo_free(before);
                        false
                    }
                    Err(_) => false,
                });
                let taken = if deferral { word.defer().is_ok() } else { word.detach().is_ok() };
                let freed = freer.join().unwrap();
                assert!(taken != freed, "taken by the other call {taken}, freed {freed}");
                assert_eq!(slot.state.load(Ordering::Acquire) == FREED, freed);
                let other = if deferral { Ownership::Deferred } else { Ownership::Detached };
                assert_eq!(word.ownership(), if freed { Ownership::Freed } else { other });
            });
        }
    }

    /// The last pin goes on one thread (a DLPack consumer, without the GIL) while the owner
    /// marks the block to be freed at its last unpin on another: one of them frees it, once.
    /// Without the fences both may read the other's word before its write, and the block
    /// stays allocated.
    #[test]
    fn the_last_unpin_and_the_mark_free_the_block_once() {
        loom::model(|| {
            let word = Arc::new(OwnerWord::default());
            let slot = Arc::new(Slot::with_pins(1));
            let frees = Arc::new(AtomicU32::new(0));
            let (w, s, f) = (Arc::clone(&word), Arc::clone(&slot), Arc::clone(&frees));
            let consumer = thread::spawn(move || {
                s.unpin();
                if w.frees_at_this_unpin() && s.try_free() {
                    f.fetch_add(1, Ordering::AcqRel);
                }
            });
            assert!(word.free_at_last_unpin());
            if word.frees_at_this_unpin() && slot.try_free() {
                frees.fetch_add(1, Ordering::AcqRel);
            }
            consumer.join().unwrap();
            assert_eq!(frees.load(Ordering::Acquire), 1, "freed exactly once");
        });
    }
}
