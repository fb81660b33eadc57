//! A fixed table of published pointers: each slot holds null or a pointer to an object that was
//! fully built before it was published, and a replacement hands the previous pointer to exactly
//! one caller, who then owns it (to release what it holds).
//!
//! Protocol: `publish` is one `swap` with acquire-release ordering, so the object's contents
//! happen before any load that sees the pointer (release), and the previous pointer comes back
//! with the writes of whoever published it (acquire). `current` is one acquire load. Racing
//! replacements on one slot are ordered by the swap: each gets a distinct previous pointer, and
//! every pointer ever published is returned exactly once, by a later `publish`, or stays in the
//! slot. What the table does not do is keep an object alive for a reader that loaded its pointer
//! before it was replaced: callers replace a slot only when no reader uses its object (the
//! C ABI's PyTorch allocator documents this for its per-device pools). The loom model below
//! checks both properties on every interleaving.

use crate::util::sync::{AtomicPtr, Ordering};

/// `N` slots of pointers to `T`, null until published.
pub struct PublishedSlots<T, const N: usize> {
    slots: [AtomicPtr<T>; N],
}

impl<T, const N: usize> PublishedSlots<T, N> {
    /// Every slot null (usable in a `static`).
    #[cfg(not(loom))]
    pub const fn new() -> Self {
        PublishedSlots { slots: [const { AtomicPtr::new(std::ptr::null_mut()) }; N] }
    }

    /// Every slot null.
    #[cfg(loom)]
    pub fn new() -> Self {
        PublishedSlots { slots: std::array::from_fn(|_| AtomicPtr::new(std::ptr::null_mut())) }
    }

    /// The number of slots.
    pub const fn len(&self) -> usize {
        N
    }

    /// Whether the table has no slots.
    pub const fn is_empty(&self) -> bool {
        N == 0
    }

    /// Publish `object` (null: empty the slot) in slot `index`, and return the pointer it
    /// replaces, which the caller now owns. `None` for an index out of range.
    #[inline]
    pub fn publish(&self, index: usize, object: *mut T) -> Option<*mut T> {
        self.slots.get(index).map(|slot| slot.swap(object, Ordering::AcqRel))
    }

    /// The object published in slot `index` (null when none or out of range).
    #[inline]
    pub fn current(&self, index: usize) -> *mut T {
        self.slots.get(index).map_or(std::ptr::null_mut(), |slot| slot.load(Ordering::Acquire))
    }
}

impl<T, const N: usize> Default for PublishedSlots<T, N> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn publish_returns_what_it_replaces() {
        let table: PublishedSlots<u32, 2> = PublishedSlots::new();
        let (a, b) = (Box::into_raw(Box::new(1)), Box::into_raw(Box::new(2)));
        assert_eq!(table.publish(0, a), Some(std::ptr::null_mut()));
        assert_eq!(table.current(0), a);
        assert_eq!(table.publish(0, b), Some(a));
        assert_eq!(table.publish(2, b), None);
        assert!(table.current(2).is_null() && table.current(1).is_null());
        assert_eq!(table.publish(0, std::ptr::null_mut()), Some(b));
        // SAFETY: both came from Box::into_raw and left the table.
        unsafe {
            drop(Box::from_raw(a));
            drop(Box::from_raw(b));
        }
    }
}

#[cfg(loom)]
mod loom_models {
    use super::*;
    use loom::cell::UnsafeCell;
    use loom::sync::Arc;
    use loom::thread;

    struct Object {
        id: u32,
        /// Written before publication and read by readers: loom reports a race if the
        /// publication does not order it.
        payload: UnsafeCell<u64>,
    }

    fn make(id: u32, payload: u64) -> *mut Object {
        let object = Box::new(Object { id, payload: UnsafeCell::new(0) });
        // SAFETY: the object is not published yet: this thread is its only user.
        object.payload.with_mut(|p| unsafe { *p = payload });
        Box::into_raw(object)
    }

    fn release(object: *mut Object) -> Option<u32> {
        if object.is_null() {
            return None;
        }
        // SAFETY: every pointer of these models comes from `make` and is released once (the
        // models assert it).
        let object = unsafe { Box::from_raw(object) };
        Some(object.id)
    }

    /// A reader on another thread that sees a published object sees it whole.
    #[test]
    fn a_reader_sees_published_objects_whole() {
        loom::model(|| {
            let table: Arc<PublishedSlots<Object, 2>> = Arc::new(PublishedSlots::new());
            let t2 = table.clone();
            let reader = thread::spawn(move || {
                let seen = t2.current(1);
                if !seen.is_null() {
                    // SAFETY: the slot is not replaced while this thread runs (the contract).
                    let payload = unsafe { (*seen).payload.with(|p| *p) };
                    assert_eq!(payload, 7, "a published object was seen half-built");
                }
            });
            assert_eq!(table.publish(1, make(1, 7)), Some(std::ptr::null_mut()));
            reader.join().unwrap();
            assert!(table.current(0).is_null());
            assert_eq!(release(table.publish(1, std::ptr::null_mut()).unwrap()), Some(1));
        });
    }

    /// Two threads replace one slot at once: every object ever published is handed back
    /// exactly once (by a replacement, or left in the slot), with its contents.
    #[test]
    fn racing_replacements_hand_back_each_object_once() {
        loom::model(|| {
            let table: Arc<PublishedSlots<Object, 1>> = Arc::new(PublishedSlots::new());
            table.publish(0, make(0, 100));
            let spawn = |id: u32| {
                let t = table.clone();
                thread::spawn(move || {
                    let old = t.publish(0, make(id, 100 + id as u64)).unwrap();
                    // SAFETY: `old` is this thread's now; it was built before it was published.
                    let payload = unsafe { (*old).payload.with(|p| *p) };
                    // SAFETY: as above, `old` is this thread's alone.
                    assert_eq!(payload, 100 + unsafe { (*old).id } as u64);
                    release(old)
                })
            };
            let (a, b) = (spawn(1), spawn(2));
            let mut ids: Vec<u32> = [a.join().unwrap(), b.join().unwrap()].into_iter().flatten().collect();
            ids.extend(release(table.publish(0, std::ptr::null_mut()).unwrap()));
            ids.sort_unstable();
            assert_eq!(ids, vec![0, 1, 2], "an object was lost or handed back twice");
        });
    }
}
