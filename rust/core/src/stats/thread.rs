//! Per-thread counter blocks: every counter the allocation and free paths move.
//!
//! A shared counter costs a locked read-modify-write (as much again as a slab allocation's one
//! CAS) and makes threads fight over its cache line. So each thread counts in a block of its own,
//! with plain (single-writer) stores, and a snapshot sums the blocks of every thread that ever
//! used the pool. A block holds, per slab class, the objects allocated and freed and their
//! requested bytes; per core pool, the buddy and run allocations, those served outside the
//! caller's core, and the frees; and the bytes and requested bytes of the buddy blocks and runs
//! this thread allocated minus those it freed (wrapping: a thread that frees others' blocks goes
//! negative), with their values at the block's last publication (`counters.rs`).
//!
//! A block also holds the thread's cache of free handle slots of the pool
//! (`handle/table.rs`, `util/index_cache.rs`), which needs the same single owner.
//!
//! A thread's block is released for reuse when the thread exits: its counts stay (they are
//! cumulative and additive) and the next thread to take it goes on from them (and from its
//! cached slots). Taking and releasing a block is the only handover: the release (`in_use` back
//! to 0, Release) orders the last owner's stores before the next owner's (Acquire), so every
//! block has one writer at a time.

use std::sync::Arc;

use crate::config::ClassTable;
use crate::util::index_cache::IndexCache;
use crate::util::sync::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// One thread's counters of one size class.
#[derive(Default)]
pub(crate) struct ClassCounters {
    pub(crate) allocs: AtomicU64,
    pub(crate) frees: AtomicU64,
    /// Requested bytes of the objects allocated minus those freed (wrapping).
    pub(crate) requested: AtomicU64,
}

/// One thread's counts of one core pool.
#[derive(Default)]
pub(crate) struct CoreCounts {
    /// Allocations served by the core pool's buddy trees (the caller's or, with overflow, another's).
    pub(crate) core_allocs: AtomicU64,
    /// Allocations served by the global pool (chunk runs).
    pub(crate) global_allocs: AtomicU64,
    /// Allocations served outside the caller's own core pool.
    pub(crate) overflow_allocs: AtomicU64,
    /// Frees of buddy blocks and runs of this core.
    pub(crate) frees: AtomicU64,
}

/// One thread's counters for one pool.
pub(crate) struct ThreadCounters {
    in_use: AtomicUsize,
    pub(crate) classes: Box<[ClassCounters]>,
    pub(crate) cores: Box<[CoreCounts]>,
    /// Bytes of buddy blocks and runs allocated minus freed (wrapping).
    pub(crate) bytes: AtomicU64,
    /// Their requested bytes, same convention.
    pub(crate) requested: AtomicU64,
    /// `bytes` at the block's last publication.
    pub(crate) published: AtomicU64,
    /// `requested` at the block's last publication.
    pub(crate) published_requested: AtomicU64,
    /// Bytes (their classes' sizes) of the slab objects freed through this block (wrapping),
    /// and its values when the slab objects' bytes and their requested bytes were last
    /// sampled (written by the sampling thread: `Counters::mark_slab_sample`).
    pub(crate) slab_freed: AtomicU64,
    pub(crate) slab_freed_at_sample: AtomicU64,
    pub(crate) slab_freed_at_requested_sample: AtomicU64,
    /// What the thread last read of the shared totals (`counters.rs`).
    pub(crate) view: SharedView,
    /// The thread's free handle slots of the pool.
    pub(crate) slots: IndexCache,
}

/// What a thread last read of the shared totals, so that its allocations need not read the
/// line that other threads' publications write (`counters.rs`). Written by the block's owner
/// only, like the counters.
pub(crate) struct SharedView {
    /// How far the bytes' peak was above the published total and the slab objects' bytes, as
    /// read (an `i64`; negative or [`SharedView::UNKNOWN`]: read again).
    pub(crate) room: AtomicU64,
    /// How far the untagged peak was above the published requested total and the slab
    /// objects' requested bytes, as read (same convention).
    pub(crate) untagged_room: AtomicU64,
    /// The count of resets and samples (`Counters::resets`) when the rooms were read.
    pub(crate) resets: AtomicU64,
    /// The published total as last read.
    pub(crate) total: AtomicU64,
    /// Estimates of the bytes in use left before the published total is read again.
    pub(crate) reads_left: AtomicU64,
}

impl SharedView {
    /// A room that sends the next allocation to the shared totals.
    pub(crate) const UNKNOWN: u64 = i64::MIN as u64;

    fn new() -> SharedView {
        SharedView {
            room: AtomicU64::new(Self::UNKNOWN),
            untagged_room: AtomicU64::new(Self::UNKNOWN),
            resets: AtomicU64::new(u64::MAX),
            total: AtomicU64::new(0),
            reads_left: AtomicU64::new(0),
        }
    }

    /// Forget what was read: the next allocation and estimate read the shared totals again.
    pub(crate) fn forget(&self) {
        self.room.store(Self::UNKNOWN, Ordering::Relaxed);
        self.untagged_room.store(Self::UNKNOWN, Ordering::Relaxed);
        self.reads_left.store(0, Ordering::Relaxed);
    }
}

impl ThreadCounters {
    /// The pool's `index`-th block (counted from 0).
    fn new(classes: usize, cores: usize, index: usize) -> ThreadCounters {
        ThreadCounters {
            in_use: AtomicUsize::new(1),
            classes: (0..classes).map(|_| ClassCounters::default()).collect(),
            cores: (0..cores).map(|_| CoreCounts::default()).collect(),
            bytes: AtomicU64::new(0),
            requested: AtomicU64::new(0),
            published: AtomicU64::new(0),
            published_requested: AtomicU64::new(0),
            slab_freed: AtomicU64::new(0),
            slab_freed_at_sample: AtomicU64::new(0),
            slab_freed_at_requested_sample: AtomicU64::new(0),
            view: SharedView::new(),
            slots: IndexCache::numbered(index),
        }
    }

    /// Add `by` (wrapping) to a counter of this block and return the new value: only the owning
    /// thread writes, so a load and a store make an exact increment.
    #[inline]
    pub(crate) fn bump(cell: &AtomicU64, by: u64) -> u64 {
        let value = cell.load(Ordering::Relaxed).wrapping_add(by);
        cell.store(value, Ordering::Relaxed);
        value
    }
}

struct Node {
    counters: Arc<ThreadCounters>,
    next: *mut Node,
}

/// Every thread's counters for one pool.
pub(crate) struct ThreadStats {
    id: u64,
    classes: usize,
    cores: usize,
    head: AtomicPtr<Node>,
    /// Blocks in the list (of threads running or gone).
    blocks: AtomicUsize,
    /// How far a block's running byte count may move before its thread publishes it
    /// (`counters.rs`): `whole x cores / max(cores, blocks)`, so that all the blocks together
    /// leave at most `cores x whole` bytes unpublished however many threads use the pool.
    slack: AtomicU64,
    whole: u64,
}

// SAFETY: the list nodes are only created, read and freed through atomics and `Drop`; the
// counters they hold are atomics behind an `Arc`.
unsafe impl Send for ThreadStats {}
// SAFETY: as above.
unsafe impl Sync for ThreadStats {}

#[cfg(not(loom))]
mod local {
    use std::cell::{Cell, RefCell};
    use std::sync::Arc;

    use super::ThreadCounters;
    use crate::util::sync::Ordering;

    /// The blocks this thread holds, one per pool it used (by the pool's counters id).
    pub(super) struct Local(pub(super) Vec<(u64, Arc<ThreadCounters>)>);

    impl Drop for Local {
        fn drop(&mut self) {
            let _ = LAST.try_with(|last| last.set((0, std::ptr::null())));
            for (_, counters) in self.0.drain(..) {
                counters.in_use.store(0, Ordering::Release);
            }
        }
    }

    thread_local! {
        pub(super) static LOCAL: RefCell<Local> = const { RefCell::new(Local(Vec::new())) };
        /// The registry this thread used last and its block there: a shortcut past `LOCAL`. The
        /// block stays alive while `LOCAL` holds it, and `LOCAL`'s drop clears the shortcut.
        pub(super) static LAST: Cell<(u64, *const ThreadCounters)> = const { Cell::new((0, std::ptr::null())) };
    }
}

/// Ids of registries (never 0, never reused). Not part of any protocol: a plain `std` atomic.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl ThreadStats {
    /// A registry whose blocks publish past `slack` bytes while there are at most `cores` of
    /// them (see [`ThreadStats::slack`]).
    pub(crate) fn new(classes: usize, cores: usize, slack: u64) -> ThreadStats {
        ThreadStats {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            classes,
            cores,
            head: AtomicPtr::new(std::ptr::null_mut()),
            blocks: AtomicUsize::new(0),
            slack: AtomicU64::new(slack),
            whole: slack,
        }
    }

    /// How far a block's running byte count may move before its thread publishes it: the
    /// whole slack while there are at most as many blocks as cores, a share of `cores` of them
    /// beyond (a load of a line written only when a block is added).
    #[inline]
    pub(crate) fn slack(&self) -> u64 {
        self.slack.load(Ordering::Relaxed)
    }

    /// A block for the calling thread: an idle one reused, or a new one pushed.
    pub(crate) fn acquire(&self) -> Arc<ThreadCounters> {
        let mut at = self.head.load(Ordering::Acquire);
        while !at.is_null() {
            // SAFETY: nodes live until `self` drops; we hold `&self`.
            let node = unsafe { &*at };
            if node.counters.in_use.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
                // What the last owner read may be old by now.
                node.counters.view.forget();
                return node.counters.clone();
            }
            at = node.next;
        }
        // The count is taken first, so that every block has an index of its own.
        let index = self.blocks.fetch_add(1, Ordering::Relaxed);
        let counters = Arc::new(ThreadCounters::new(self.classes, self.cores, index));
        let node = Box::into_raw(Box::new(Node { counters: counters.clone(), next: std::ptr::null_mut() }));
        let mut head = self.head.load(Ordering::Acquire);
        loop {
            // SAFETY: `node` is ours until published by the CAS below.
            unsafe { (*node).next = head };
            match self.head.compare_exchange_weak(head, node, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    let blocks = index as u64 + 1;
                    let cores = self.cores.max(1) as u64;
                    // Relaxed: a block that publishes against the older slack misses at most
                    // that slack, once.
                    self.slack.fetch_min(self.whole * cores / blocks.max(cores), Ordering::Relaxed);
                    return counters;
                }
                Err(seen) => head = seen,
            }
        }
    }

    /// Give a block taken with [`ThreadStats::acquire`] back for another thread to take.
    pub(crate) fn release(counters: &ThreadCounters) {
        counters.in_use.store(0, Ordering::Release);
    }

    /// Run `f` on the calling thread's block.
    #[cfg(not(loom))]
    #[inline(always)]
    pub(crate) fn with<R>(&self, f: impl FnOnce(&ThreadCounters) -> R) -> R {
        if let Ok((id, counters)) = local::LAST.try_with(std::cell::Cell::get) {
            if id == self.id {
                // SAFETY: `LAST` names a block `LOCAL` still holds (see `LAST`).
                return f(unsafe { &*counters });
            }
        }
        self.with_slow(f)
    }

    #[cfg(not(loom))]
    #[cold]
    fn with_slow<R>(&self, f: impl FnOnce(&ThreadCounters) -> R) -> R {
        let mut f = Some(f);
        let hit = local::LOCAL.try_with(|local| {
            let local = local.borrow();
            let (_, counters) = local.0.iter().find(|(id, _)| *id == self.id)?;
            let _ = local::LAST.try_with(|last| last.set((self.id, Arc::as_ptr(counters))));
            Some((f.take().expect("called once"))(counters))
        });
        let f = match hit {
            Ok(Some(out)) => return out,
            _ => f.take().expect("not called yet"),
        };
        let counters = self.acquire();
        let out = f(&counters);
        let kept = local::LOCAL.try_with(|local| {
            let mut local = local.borrow_mut();
            // Forget blocks of pools that are gone (only we hold them now).
            local.0.retain(|(_, c)| Arc::strong_count(c) > 1);
            local.0.push((self.id, counters.clone()));
            let _ = local::LAST.try_with(|last| last.set((self.id, Arc::as_ptr(&counters))));
        });
        if kept.is_err() {
            // The thread is exiting (its local storage is gone): release the block at once.
            ThreadStats::release(&counters);
        }
        out
    }

    /// Call `f` on every block (of threads running or gone).
    pub(crate) fn for_each(&self, mut f: impl FnMut(&ThreadCounters)) {
        let mut at = self.head.load(Ordering::Acquire);
        while !at.is_null() {
            // SAFETY: nodes live until `self` drops; we hold `&self`.
            let node = unsafe { &*at };
            f(&node.counters);
            at = node.next;
        }
    }

    /// The slab counters summed over every thread, per class.
    pub(crate) fn class_totals(&self) -> ClassTable<ClassTotals> {
        let mut totals = ClassTable::from_elem(ClassTotals::default(), self.classes);
        self.for_each(|block| {
            for (t, c) in totals.iter_mut().zip(block.classes.iter()) {
                t.allocs += c.allocs.load(Ordering::Relaxed);
                t.frees += c.frees.load(Ordering::Relaxed);
                t.requested = t.requested.wrapping_add(c.requested.load(Ordering::Relaxed) as i64);
            }
        });
        totals
    }
}

impl Drop for ThreadStats {
    fn drop(&mut self) {
        let mut at = self.head.load(Ordering::Acquire);
        while !at.is_null() {
            // SAFETY: every node came from Box::into_raw in `acquire` and is freed once, here.
            let node = unsafe { Box::from_raw(at) };
            at = node.next;
        }
    }
}

/// The slab counters of one class, summed over every thread: allocations, frees, and requested
/// bytes of the live objects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ClassTotals {
    pub(crate) allocs: u64,
    pub(crate) frees: u64,
    pub(crate) requested: i64,
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn count(stats: &ThreadStats, class: usize, requested: i64) {
        stats.with(|block| {
            let c = &block.classes[class];
            ThreadCounters::bump(if requested > 0 { &c.allocs } else { &c.frees }, 1);
            ThreadCounters::bump(&c.requested, requested as u64);
        });
    }

    #[test]
    fn counts_from_many_threads_add_up_and_blocks_are_reused() {
        let stats = Arc::new(ThreadStats::new(3, 2, 1 << 20));
        for round in 0..3 {
            let threads: Vec<_> = (0..4)
                .map(|t| {
                    let stats = stats.clone();
                    std::thread::spawn(move || {
                        for i in 0..1000 {
                            count(&stats, t % 3, 100 + i % 7);
                        }
                        for i in 0..1000 {
                            count(&stats, t % 3, -(100 + i % 7));
                        }
                    })
                })
                .collect();
            for th in threads {
                th.join().unwrap();
            }
            let totals = stats.class_totals();
            let allocs: u64 = totals.iter().map(|t| t.allocs).sum();
            assert_eq!(allocs, 4000 * (round + 1));
            assert!(totals.iter().all(|t| t.requested == 0));
        }
        let mut blocks = 0;
        stats.for_each(|_| blocks += 1);
        assert!(blocks <= 8, "exited threads' blocks are reused ({blocks} blocks)");
    }
}
